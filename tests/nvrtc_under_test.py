"""Which NVRTC the compile checks run under, and how to run them under another one.

NVRTC's ptxas is part of NVRTC: the same source can spill under one release and not under
another (13.0.88, which PyTorch pins, spilled 8-20 bytes in instantiations that 13.5 compiles
clean). The compile checks therefore name the NVRTC in every test id (``nvrtc13.5-...``) and
can run under any NVRTC the user may have:

``PYBLASGEMM_TEST_NVRTC``
    a ``libnvrtc.so.<major>`` file, or the folder holding it (an unpacked
    ``nvidia-cuda-nvrtc`` wheel's ``nvidia/cu13/lib``). The compile-check modules load it, and
    the ``libnvrtc-builtins`` beside it, before CuPy loads an NVRTC, so every compile of the run
    uses it (CuPy finds NVRTC through cuda-pathfinder, which takes a library already loaded;
    ``LD_LIBRARY_PATH`` does not override the wheel's). No network at test time::

        pip download --no-deps nvidia-cuda-nvrtc==13.0.88 -d /tmp/nvrtc130
        python -m zipfile -e /tmp/nvrtc130/nvidia_cuda_nvrtc-13.0.88-*.whl /tmp/nvrtc130
        PYBLASGEMM_TEST_NVRTC=/tmp/nvrtc130/nvidia/cu13/lib python -m pytest -q \\
            tests/test_sm90_compile.py tests/test_kernels_compile.py

If an NVRTC was loaded before the chosen one could be (a module compiled at import time),
:func:`choose` raises instead of testing another NVRTC than the one asked for.
"""
from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

ENV = "PYBLASGEMM_TEST_NVRTC"
#: libnvrtc.so.13 (not the builtins, not the .alt. variant, not CuPy's binding module)
_LIB = re.compile(r"^libnvrtc\.so\.\d+$")
_BUILTINS = re.compile(r"^libnvrtc-builtins\.so\.\d+\.\d+$")


def loaded() -> list[Path]:
    """The NVRTC libraries mapped into this process (Linux: /proc/self/maps; elsewhere [])."""
    try:
        with open("/proc/self/maps") as f:
            fields = [line.split(None, 5) for line in f]
    except OSError:
        return []
    paths = {f[5].strip() for f in fields if len(f) == 6}
    return sorted(Path(p) for p in paths if _LIB.match(Path(p).name))


def _library(value: str) -> Path:
    """The libnvrtc.so.N that ``value`` (a file or its folder) names."""
    path = Path(value)
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if _LIB.match(p.name))
        if len(found) != 1:
            raise ValueError(f"{ENV}={value!r}: expected one libnvrtc.so.<major> in the folder, found "
                             f"{[p.name for p in found] or 'none'}")
        return found[0]
    if not path.is_file() or not _LIB.match(path.name):
        raise ValueError(f"{ENV}={value!r} is not a libnvrtc.so.<major> file or a folder holding one")
    return path


def choose() -> Path | None:
    """Load the NVRTC named by ``PYBLASGEMM_TEST_NVRTC`` (None when it is unset). Idempotent."""
    value = os.environ.get(ENV, "")
    if not value:
        return None
    lib = _library(value).resolve()
    before = loaded()
    if before and not all(p.resolve() == lib for p in before):
        raise RuntimeError(f"{ENV}={value!r}: {[str(p) for p in before]} was loaded before the compile "
                           f"checks could load {lib}; the run would test another NVRTC")
    # the builtins first: libnvrtc looks for them by name, not beside itself
    for p in sorted(lib.parent.iterdir()):
        if _BUILTINS.match(p.name):
            ctypes.CDLL(str(p), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return lib


def version() -> tuple[int, int] | None:
    """(major, minor) of the NVRTC that CuPy compiles with, or None without CuPy."""
    try:
        from cupy.cuda import nvrtc
    except ImportError:
        return None
    return tuple(nvrtc.getVersion())


def label() -> str:
    """The NVRTC in a test id: ``nvrtc13.0``, or ``nvrtc-none`` without CuPy."""
    v = version()
    return "nvrtc-none" if v is None else f"nvrtc{v[0]}.{v[1]}"
