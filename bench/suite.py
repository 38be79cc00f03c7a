"""``python bench/suite.py ...`` from a source checkout: the suite lives in the package
(:mod:`pyblasgemm.benchmarks.suite`, also ``python -m pyblasgemm bench``)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from pyblasgemm.benchmarks.suite import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
