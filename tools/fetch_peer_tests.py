"""Fetch CuPy's own matmul and cuBLAS-gemm tests for the installed CuPy, for tests/peer/.

The peer suite (``tests/peer/test_cupy_peer.py``) runs CuPy's tests with ``cupy.matmul`` and
``cupy.cublas.gemm`` routed to pyblasgemm. Their files are not part of the CuPy wheel and are
not copied into this repository: this script puts the two files of the installed CuPy's
release tag into ``tests/peer/_upstream/cupy-<version>/`` (ignored by git), from GitHub or
from a local clone of https://github.com/cupy/cupy::

    python tools/fetch_peer_tests.py                      # download (needs the network)
    python tools/fetch_peer_tests.py --git ~/src/cupy     # from a clone that has the tag
    python tools/fetch_peer_tests.py --version 14.2.0     # another release than installed
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import urllib.request
from pathlib import Path

#: the upstream files the peer suite runs, by their path in CuPy's repository
FILES = ("tests/cupy_tests/math_tests/test_matmul.py", "tests/cupy_tests/test_cublas.py")
RAW_URL = "https://raw.githubusercontent.com/cupy/cupy/v{version}/{path}"
DEST_ROOT = Path(__file__).resolve().parent.parent / "tests" / "peer" / "_upstream"


def destination(version: str) -> Path:
    """Where the files of CuPy ``version`` are kept (tests/peer/test_cupy_peer.py looks here)."""
    return DEST_ROOT / f"cupy-{version}"


def fetch(version: str, git_dir: str | None = None) -> Path:
    """Write FILES of release ``version`` into :func:`destination` and return it."""
    dest = destination(version)
    dest.mkdir(parents=True, exist_ok=True)
    for path in FILES:
        if git_dir:
            text = subprocess.run(["git", "-C", git_dir, "show", f"v{version}:{path}"],
                                  check=True, capture_output=True).stdout
        else:
            with urllib.request.urlopen(RAW_URL.format(version=version, path=path),
                                        timeout=60) as response:
                text = response.read()
        (dest / Path(path).name).write_bytes(text)
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", help="CuPy release (default: the installed CuPy's)")
    parser.add_argument("--git", metavar="DIR", help="a local clone of cupy/cupy to read from")
    args = parser.parse_args(argv)
    version = args.version
    if version is None:
        import cupy
        version = cupy.__version__
    print(fetch(version, args.git))
    return 0


if __name__ == "__main__":
    sys.exit(main())
