"""The constraints: may a backend, our kernels, a kernel config run a problem? -> (ok, reason).

One module answers for everyone: the backends' ``supports`` are these predicates, and the
planner and autotune ask them and nothing else. The kernels check the same rules again for
themselves when they are called directly (``kernels.launch.supports``, ``KernelConfig.validate``,
the single sources this module reads).

Example
-------
>>> from pyblasgemm import constraints
>>> from pyblasgemm.planner import make_desc
>>> constraints.backend_supports("tensorcore", make_desc(64, 64, 64, "f64"))
(False, "no tensor-core kernel for float64 with compute='fp64'")
>>> constraints.backend_supports("cublas", make_desc(64, 64, 64, "c64"))
(True, '')
"""
from __future__ import annotations

from .desc import GemmDesc, alignment
from .kernels.config import KERNEL_FAMILIES
from .kernels.pack import PACK_ALIGN, packed_ld
from .kinds import route_of

__all__ = ["backend_supports", "config_valid", "kernel_problem", "packable", "packed_desc", "BACKENDS"]

#: our kernels' batch runs along gridDim.z, whose hardware limit is 65535
MAX_KERNEL_BATCH = 65535


def kernel_problem(desc: GemmDesc, a_ptr: int | None = None, b_ptr: int | None = None,
                   c_ptr: int | None = None):
    """Our kernels' ``KernelProblem`` for ``desc`` (same column-major convention). Without
    pointers, addresses with exactly each operand's alignment (its leading dimension, batch
    stride and ``desc.ptr_align``; C at least its element size, as any element-aligned int32 C
    of int8 operands is): the kernels' vector-path and alignment rules then see the alignment
    every caller's pointers have."""
    from .kernels.problem import KernelProblem

    route = route_of(desc.prefix, desc.compute)
    if a_ptr is None:
        # each operand's own class: an odd ldc must not take A's and B's 16-byte loads away
        isz, csz = desc.row.ab_dtype.itemsize, desc.row.c_dtype.itemsize
        a_ptr = alignment(desc.ptr_align, desc.lda * isz, desc.stride_a * isz)
        b_ptr = alignment(desc.ptr_align, desc.ldb * isz, desc.stride_b * isz)
        c_ptr = max(alignment(desc.ptr_align, desc.ldc * csz, desc.stride_c * csz), csz)
    return KernelProblem(route.kernel_kind, desc.transa, desc.transb, desc.m, desc.n, desc.k,
                         desc.lda, desc.ldb, desc.ldc, a_ptr, b_ptr, c_ptr, desc.alpha, desc.beta,
                         route.accumulator, desc.batch, desc.stride_a, desc.stride_b,
                         desc.stride_c)


def _host(desc: GemmDesc):
    if desc.xp != "numpy":
        return False, "the host backend runs on NumPy arrays only"
    return True, ""


def _cublas(desc: GemmDesc):
    if desc.xp != "cupy":
        return False, "cuBLAS runs on CuPy arrays only"
    if route_of(desc.prefix, desc.compute).cublas_compute is None:
        return False, f"cuBLAS has no compute={desc.compute!r} mode for {desc.row.ab_dtype.name}"
    return True, ""


def _tensorcore(desc: GemmDesc):
    if desc.xp != "cupy":
        return False, "our kernels run on CuPy arrays only"
    route = route_of(desc.prefix, desc.compute)
    if route.composite is not None:
        return _composite(desc, route)
    if route.kernel_kind is None:
        return False, (f"no tensor-core kernel for {desc.row.ab_dtype.name} with "
                       f"compute={desc.compute!r}")
    if desc.transa == "C" or desc.transb == "C":
        return False, "conjugate transposition is for complex data, which our kernels lack"
    if desc.batch > MAX_KERNEL_BATCH:
        return False, (f"batch={desc.batch} exceeds the kernels' grid limit of "
                       f"{MAX_KERNEL_BATCH}")
    from .kernels.launch import supports as kernel_rules

    return kernel_rules(kernel_problem(desc))


#: int8 residue products stay exact in int32 while K * 128^2 < 2^31 (a residue is at most 128
#: in magnitude): the emulated float64 modes' inner dimension (2k for complex) is below this
OZAKI_MAX_K = 2**31 // 128**2


def _composite(desc: GemmDesc, route):
    """Our kernels run a composite route (pyblasgemm.composite) through its real GEMMs."""
    if route.composite == "ozaki":
        inner_k = desc.k * (2 if desc.row.is_complex else 1)
        if inner_k >= OZAKI_MAX_K:
            return False, (f"k={desc.k}: the int8 residue products ({inner_k} terms"
                           f"{', the real and imaginary parts stacked' if desc.row.is_complex else ''}) "
                           f"stay exact in int32 only below {OZAKI_MAX_K} terms")
    return True, ""


#: backend name -> its predicate
BACKENDS = {"host": _host, "cublas": _cublas, "tensorcore": _tensorcore}


def backend_supports(name: str, desc: GemmDesc):
    """(ok, reason): may backend ``name`` run ``desc``?

    Example
    -------
    >>> from pyblasgemm.planner import make_desc
    >>> backend_supports("host", make_desc(8, 8, 8, "f32", xp="numpy"))
    (True, '')
    """
    return BACKENDS[name](desc)


def config_valid(cfg, problem, arch):
    """(ok, reason): may kernel config ``cfg`` run ``problem`` (a ``KernelProblem``) on ``arch``?

    The kernels' own rules (``KernelConfig.validate``, the single source of kernel constraints)
    with the device's opt-in shared memory, plus what the arch adds: our kernels need sm_80+,
    and each family runs on its own archs (``KernelFamily.why_not_on``: the wgmma/TMA kernel on
    compute capability 9.0 only).

    Example
    -------
    >>> import pyblasgemm
    >>> from pyblasgemm.planner import FAMILIES
    >>> p = pyblasgemm.plan(4096, 4096, 4096, "f16", backend="tensorcore", arch="sm_90")
    >>> config_valid(p.config, kernel_problem(p.problem), FAMILIES["sm_90"])
    (True, '')
    """
    if arch.cc < (8, 0):
        return False, f"our mma.sync kernels need sm_80 or newer (device is sm_{arch.cc[0]}{arch.cc[1]})"
    family = KERNEL_FAMILIES.get(cfg.family)        # an unknown family: validate() says so
    why = family.why_not_on(arch.cc) if family is not None else ""
    if why:
        return False, why
    return cfg.validate(problem, max_smem=arch.smem_per_block_optin)


def packable(desc: GemmDesc) -> tuple:
    """The copies that would put our kernels' fast paths back within reach: 'a' / 'b' for an
    operand whose leading dimension or batch stride keeps it off TMA and 16-byte cp.async (a
    pitched copy into aligned storage), 'at' / 'bt' for an int8 operand that is not K-major (a
    transposing copy: the Hopper int8 kernel reads K-major operands only). () when there is
    none, or when packing cannot help: a pointer itself is unaligned, a batch whose entries are
    not one pitched block (pitched copies) or are broadcast.

    Example
    -------
    >>> from pyblasgemm.planner import make_desc
    >>> packable(make_desc(1024, 1024, 1024, "f16", lda=1025))    # A's pitch: 2050 bytes
    ('a',)
    >>> packable(make_desc(4095, 4097, 1023, "f16", transa="T"))  # lda = ldb = k = 1023
    ('a', 'b')
    >>> packable(make_desc(4096, 4096, 4096, "i8"))               # int8 'N', 'N': A is M-major
    ('at',)
    """
    if desc.xp != "cupy" or desc.ptr_align < PACK_ALIGN:
        return ()
    isz = desc.row.ab_dtype.itemsize
    int8 = isz == 1 and desc.row.c_dtype.itemsize == 4
    out = []
    for name, ld, stride, (rows, cols), k_major in (
            ("a", desc.lda, desc.stride_a, desc.a_shape(), desc.transa == "T"),
            ("b", desc.ldb, desc.stride_b, desc.b_shape(), desc.transb == "N")):
        if int8 and not k_major:
            if desc.batch > 1 and stride == 0:
                return ()
            out.append(name + "t")
            continue
        if alignment(ld * isz, stride * isz) >= PACK_ALIGN:
            continue
        if desc.batch > 1 and stride != ld * cols:
            return ()          # not one pitched block: a copy per entry would cost a launch each
        out.append(name)
    return tuple(out)


def packed_desc(desc: GemmDesc, operands: tuple) -> GemmDesc:
    """``desc`` as our kernels see it after ``operands`` (:func:`packable`'s names) are copied
    into aligned storage: leading dimensions rounded up to 16 bytes, batch strides dense,
    transposed operands K-major ('at': transa 'T', 'bt': transb 'N'), pointers 256-byte
    aligned. ``operands = ()`` returns ``desc`` itself."""
    if not operands:
        return desc
    isz, csz = desc.row.ab_dtype.itemsize, desc.row.c_dtype.itemsize
    fields = {}
    for name in operands:
        which = name[0]
        rows, cols = desc.a_shape() if which == "a" else desc.b_shape()
        if name.endswith("t"):
            rows, cols = cols, rows
            fields["trans" + which] = "T" if which == "a" else "N"
        ld = packed_ld(rows, isz)
        fields["ld" + which] = ld
        fields["stride_" + which] = ld * cols if desc.batch > 1 else 0
    d = desc._replace(**fields)
    values = (d.lda * isz, d.ldb * isz, d.ldc * csz, d.stride_a * isz, d.stride_b * isz,
              d.stride_c * csz)
    return d._replace(align=alignment(d.ptr_align, *values))
