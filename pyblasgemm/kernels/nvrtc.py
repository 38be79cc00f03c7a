"""NVRTC for the kernels compiled here (the sm_90a GEMM, the fused MLP, the Ozaki kernels and
the offline compile checks), through NVIDIA's public ``cuda.bindings.nvrtc``.

The bindings find libnvrtc with cuda-pathfinder: the copy already loaded in the process when
there is one (CuPy's, or the one a test loaded first: tests/nvrtc_under_test.py), else the
``nvidia-cuda-nvrtc`` wheel's, else the system's. The functions keep NVRTC's own names (less
the ``nvrtc`` prefix) and take and return Python values: str source and names, str options,
str logs and lowered names, bytes PTX and cubins. Errors raise :class:`NvrtcError`.

Example (no GPU needed)::

    prog = createProgram('extern "C" __global__ void k(float* x) { x[0] = 1; }', "k.cu", [], [])
    try:
        compileProgram(prog, ["--gpu-architecture=sm_90"])
        cubin = getCUBIN(prog)           # bytes of an ELF file
    finally:
        destroyProgram(prog)
"""
from __future__ import annotations

__all__ = ["NvrtcError", "getVersion", "createProgram", "addNameExpression", "compileProgram",
           "getProgramLog", "getPTX", "getCUBIN", "getLoweredName", "destroyProgram"]

_NV = None


class NvrtcError(RuntimeError):
    """An NVRTC call failed: ``status`` is its nvrtcResult (an int), ``call`` its name.

    >>> str(NvrtcError("nvrtcCompileProgram", 6, "NVRTC_ERROR_COMPILATION"))
    'nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION (6)'
    """

    def __init__(self, call: str, status: int, name: str = ""):
        super().__init__(f"{call} failed: {name or 'nvrtcResult'} ({status})")
        self.call, self.status = call, status


def _import_bindings():
    """cuda.bindings.nvrtc, or :class:`~pyblasgemm.kernels.driver.BindingsMissing` saying what to install."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        from .driver import BindingsMissing

        raise BindingsMissing("compiling kernels needs NVIDIA's cuda-bindings (cuda.bindings.nvrtc), which is "
                              "not installed: pip install 'pyblasgemm[cuda13]' (or cuda-bindings 13.x)") from e
    return nvrtc


def _bindings():
    global _NV
    if _NV is None:
        _NV = _import_bindings()
    return _NV


def _check(result, call: str):
    err = result[0]
    if err:
        raise NvrtcError(call, int(err), getattr(err, "name", ""))
    return result[1] if len(result) == 2 else result[1:]


def getVersion() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC.

    >>> major, minor = getVersion(); major >= 12        # doctest: +SKIP
    True
    """
    major, minor = _check(_bindings().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


def createProgram(source: str, name: str, headers=(), include_names=()):
    """A program of ``source`` (``headers``: sources of the ``include_names`` it includes)."""
    nv = _bindings()
    return _check(nv.nvrtcCreateProgram(source.encode(), name.encode(), len(headers),
                                        [h.encode() for h in headers], [n.encode() for n in include_names]),
                  "nvrtcCreateProgram")


def addNameExpression(prog, expression: str) -> None:
    """Ask for ``expression``'s instantiation and lowered name (:func:`getLoweredName`)."""
    _check(_bindings().nvrtcAddNameExpression(prog, expression.encode()), "nvrtcAddNameExpression")


def compileProgram(prog, options) -> None:
    """Compile with ``options`` (str); :class:`NvrtcError` when it fails (the reason is in
    :func:`getProgramLog`)."""
    opts = [o.encode() for o in options]
    _check(_bindings().nvrtcCompileProgram(prog, len(opts), opts), "nvrtcCompileProgram")


def _read(prog, size_fn, read_fn, call: str) -> bytes:
    size = int(_check(size_fn(prog), call + "Size"))
    # a fresh writable buffer: ``b" " * size`` is an immutable bytes object, and for size 1
    # (an empty log: its NUL alone) CPython's shared b" " itself, which NVRTC then overwrote
    # with the NUL, turning every one-byte b" " of the process into b"\x00" (print's separators,
    # torch's schema strings: ``import torch`` failed after such a compile)
    buf = bytearray(size)
    _check(read_fn(prog, buf), call)
    return bytes(buf)


def getProgramLog(prog) -> str:
    """The compile log (ptxas's resource report with ``--ptxas-options=-v``)."""
    nv = _bindings()
    return _read(prog, nv.nvrtcGetProgramLogSize, nv.nvrtcGetProgramLog, "nvrtcGetProgramLog") \
        .rstrip(b"\0").decode(errors="replace")


def getPTX(prog) -> bytes:
    """The program's PTX (compiled for a ``compute_XX`` architecture), without the final NUL."""
    nv = _bindings()
    return _read(prog, nv.nvrtcGetPTXSize, nv.nvrtcGetPTX, "nvrtcGetPTX").rstrip(b"\0")


def getCUBIN(prog) -> bytes:
    """The program's cubin (compiled for an ``sm_XX`` architecture): every byte of the ELF file
    (CuPy 14.2's ``getCUBIN`` dropped the last one, which truncated the program headers)."""
    nv = _bindings()
    return _read(prog, nv.nvrtcGetCUBINSize, nv.nvrtcGetCUBIN, "nvrtcGetCUBIN")


def getLoweredName(prog, expression: str) -> str:
    """The mangled name of an instantiation asked for with :func:`addNameExpression`."""
    name = _check(_bindings().nvrtcGetLoweredName(prog, expression.encode()), "nvrtcGetLoweredName")
    return name.decode() if isinstance(name, bytes) else str(name)


def destroyProgram(prog) -> None:
    _check(_bindings().nvrtcDestroyProgram(prog), "nvrtcDestroyProgram")
