"""``python bench/plot.py ...`` from a source checkout: the plots live in the package
(:mod:`pyblasgemm.benchmarks.plot`)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from pyblasgemm.benchmarks.plot import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
