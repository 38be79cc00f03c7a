"""Execute a composite plan (:mod:`pyblasgemm.planner.composite`) on CuPy arrays: the passes of
its own and its inner GEMM, run through ``run_inner`` (execute's own function, handed in: this
module does not reach back into the call layers).

* Ozaki (float64 / complex128 and float32 / complex64, ``compute='int8-ozaki'``; the passes
  read float32 operands as they are and round C once to float32), per batch entry: line statistics and
  exponents of op(A)'s rows and op(B)'s columns, one counter read (non-finite lines: the whole
  entry runs natively; lines the scaling cannot hold: those rows / columns run natively after
  the rest), int8 residues of both, one batched int8 GEMM over the moduli, the reconstruction
  (with alpha and beta) straight into C. With the guard (:mod:`pyblasgemm.ozaki`), one more
  plane, multiplied first: its count of the elements of C whose error bound it cannot prove
  (a second counter read) sends the whole product to native arithmetic when that is most of
  them; else the moduli's GEMMs and the reconstruction run, and those elements are taken
  from a native product. Complex operands are stacked first: ``[Ar Ai]`` and
  ``[[Br, Bi], [-Bi, Br]]`` (conjugated for 'C'), so each part of C is one integer product.
* Complex on tf32 / 3xTF32: the same stacking in float32, one real GEMM on our kernels, then
  ``C = alpha * (C2[:, :n] + i C2[:, n:]) + beta * C``.

The host backend computes the same algorithms (:mod:`pyblasgemm.ozaki`,
``backends.host.product``); on the GPU the Ozaki result has the host's bits.

The stacking, on one element (what the complex routes' one real product computes):

>>> import numpy as np
>>> a, b = np.array([[1 + 2j]]), np.array([[3 - 1j]])
>>> a2 = np.concatenate([a.real, a.imag], axis=1)                 # [Ar Ai]
>>> b2 = np.block([[b.real, b.imag], [-b.imag, b.real]])          # [[Br, Bi], [-Bi, Br]]
>>> c2 = a2 @ b2
>>> complex(c2[0, 0], c2[0, 1]), complex((a @ b)[0, 0])
((5+5j), (5+5j))
"""
from __future__ import annotations

from . import _arrays
from .desc import GemmDesc

__all__ = ["run", "last_route"]

_last = {"route": None}


def last_route() -> str | None:
    """What the last composite call did (for tests and the benchmarks): the composition with
    its native fix-ups, or the native route it fell back to, and why.

    Example (on a GPU)::

        pyblasgemm.matmul(a, b, compute="int8-ozaki", backend="tensorcore")
        last_route()   # 'pyblasgemm Ozaki II with 16 moduli: ...; 1 rows and 0 columns natively (...);
                       #  error of the emulated elements: |c_ij - exact| <= ... (the guard)'
    """
    return _last["route"]


def run(desc: GemmDesc, a, b, c, plan, run_inner) -> None:
    """Run ``desc`` by ``plan``'s composition; ``run_inner(desc, a, b, c, backend)`` runs one
    GEMM (execute's own function), on the backend the inner plan chose (execute plans it again
    from the cache: without the backend it would plan 'auto', which for the batched int8
    product is cuBLAS at 15.2 ms instead of our kernel's 11.8 ms, H100, 16 moduli at 8192).

    Example (what ``execute`` does with a composite plan)::

        plan = plan_for(desc)
        if isinstance(plan.launch, CompositeSpec):
            composite.run(desc, a, b, c, plan, execute)
    """
    spec = plan.launch
    for entry in range(desc.batch):
        pa = _at(a, entry * desc.stride_a)
        pb = _at(b, entry * desc.stride_b)
        pc = _at(c, entry * desc.stride_c)
        one = desc._replace(batch=1, stride_a=0, stride_b=0, stride_c=0)
        if spec.kind == "ozaki":
            _ozaki(one, pa, pb, pc, spec, run_inner)
        else:
            _complex(one, pa, pb, pc, spec, run_inner)


def _at(x, offset: int):
    """An array whose first element is ``x``'s element ``offset`` (``x``'s first element is
    the stored matrix's origin, as the backends receive it; the views taken from it are
    strided views that the call layer has already bounds-checked)."""
    import cupy

    if offset == 0:
        return x
    return cupy.ndarray((1,), x.dtype, memptr=x.data + offset * x.dtype.itemsize)


def _op_view(desc: GemmDesc, x, which: str):
    """op(A) (m x k) or op(B) (k x n) as a strided view, conjugation not applied."""
    trans, ld = (desc.transa, desc.lda) if which == "a" else (desc.transb, desc.ldb)
    rows, cols = (desc.m, desc.k) if which == "a" else (desc.k, desc.n)
    strides = (1, ld) if trans == "N" else (ld, 1)
    return _arrays.strided_view(x, (rows, cols), strides)


def _stack(desc: GemmDesc, a, b, real_dtype):
    """``A2 = [Re op(A), Im op(A)]`` (m x 2k) and ``B2 = [[Re, Im], [-Im, Re]]`` of op(B)
    (2k x 2n), C order, in ``real_dtype``; 'C' conjugates."""
    import cupy

    m, n, k = desc.m, desc.n, desc.k
    opa, opb = _op_view(desc, a, "a"), _op_view(desc, b, "b")
    a2 = cupy.empty((m, 2 * k), real_dtype)
    a2[:, :k] = opa.real
    a2[:, k:] = -opa.imag if desc.transa == "C" else opa.imag
    b2 = cupy.empty((2 * k, 2 * n), real_dtype)
    re = opb.real
    im = -opb.imag if desc.transb == "C" else opb.imag
    b2[:k, :n] = re
    b2[:k, n:] = im
    b2[k:, :n] = -im
    b2[k:, n:] = re
    return a2, b2


def _c_view(desc: GemmDesc, c):
    return _arrays.strided_view(c, (desc.m, desc.n), (1, desc.ldc))


def _finish(desc: GemmDesc, c_view, x) -> None:
    """``C = alpha * X + beta * C`` in the host backend's order (beta == 0: C not read)."""
    out = x * x.dtype.type(desc.alpha) if desc.alpha != 1 else x
    if desc.beta != 0:
        out = out + c_view.astype(x.dtype) * x.dtype.type(desc.beta)
    c_view[...] = out.astype(c_view.dtype, copy=False)


def _native_product(desc: GemmDesc, a, b, rows=None, cols=None):
    """op(A)[rows] @ op(B)[:, cols] in native arithmetic (CuPy's matmul: cuBLAS; float32 and
    complex64: its SGEMM / CGEMM, float32 sums, unless CUPY_TF32=1 asks CuPy for TF32)."""
    opa, opb = _op_view(desc, a, "a"), _op_view(desc, b, "b")
    if desc.transa == "C":
        opa = opa.conj()
    if desc.transb == "C":
        opb = opb.conj()
    if rows is not None:
        opa = opa[rows]
    if cols is not None:
        opb = opb[:, cols]
    return opa @ opb


def _ozaki(desc: GemmDesc, a, b, c, spec, run_inner) -> None:
    import cupy

    from .kernels.ozaki_kernels import OzakiPasses, element_of
    from .kinds import route_of

    setting = spec.setting
    m, n, k = desc.m, desc.n, desc.k
    cplx = desc.row.is_complex
    real = cupy.dtype(desc.row.c_dtype).char.lower()          # C's real type: 'd' or 'f'
    native = desc._replace(compute=route_of(desc.prefix, desc.compute).native)   # DGEMM ... CGEMM
    passes = OzakiPasses(setting.count, desc.device, element_of(real))
    if cplx:
        # the stacked copy in the operands' own real type (complex64: float32, which the passes
        # read; A2 holds A's bytes again, B2 twice B's)
        a2, b2 = _stack(desc, a, b, real)
        kk, nn = 2 * k, 2 * n
        a_lines, b_lines = (a2, 2 * k, 1), (b2, 1, 2 * n)
    else:
        kk, nn = k, n
        a_lines = (a, 1, desc.lda) if desc.transa == "N" else (a, desc.lda, 1)
        b_lines = (b, desc.ldb, 1) if desc.transb == "N" else (b, 1, desc.ldb)
    # one wait for every verdict the host acts on: the scaling's (non-finite and lost lines)
    # and the guard's (elements it cannot prove), after the residues and the guard's plane are
    # queued (a wait between them left the GPU idle while the host queued the passes; the
    # residues of an operand that then runs natively are the price of the rare early exit)
    counts = cupy.zeros(4, cupy.int32)     # non-finite lines, lost lines, guard failures, recount
    planes, row = setting.planes, spec.inner.k          # (row: kk rounded up to whole 16-byte lines)
    ares = cupy.empty((planes, m, row), cupy.int8)
    bres = cupy.empty((planes, nn, row), cupy.int8)
    sums = cupy.zeros(m + nn, cupy.uint64) if setting.guard else None
    sum_a, sum_b = (sums[:m], sums[m:]) if setting.guard else (None, None)
    fast = setting.scaling == "fast"
    # per operand: one pass where the plan gives it a shape (its lines held on chip between their
    # statistics and residues, the operand read once), else the statistics pass, then the
    # residues (both operands' statistics first, as before the one pass)
    operands = list(zip((a_lines, b_lines), (m, nn), (ares, bres), (sum_a, sum_b), spec.one_pass or (None, None)))
    scaled = []
    for (x, s_line, s_k), lines, res, line_sums, shape in operands:
        if shape is not None:
            scaled.append(passes.scale_residues(x, lines, kk, s_line, s_k, setting.bits, counts, res, shape,
                                                line_sums, row=row, fast=fast))
        elif fast:
            scaled.append(passes.scale_fast(x, lines, kk, s_line, s_k, counts))
        else:
            scaled.append((*passes.scale(x, lines, kk, s_line, s_k, setting.bits, counts), None))
    for ((x, s_line, s_k), lines, res, line_sums, shape), (exps, _, bits_of) in zip(operands, scaled):
        if shape is None:
            passes.residues(x, lines, kk, s_line, s_k, exps, res, setting.bits, line_sums, row=row,
                            line_bits=bits_of)
    (ea, lost_a, bits_a), (eb, lost_b, bits_b) = scaled
    line_bits = (bits_a, bits_b) if fast else None
    moduli = spec.inner._replace(batch=setting.count)
    digit_launch = _digit_launch(moduli, spec.digits)
    # the planes column-major m x nn: the moduli's int32 products and the guard's after them,
    # or (the digit store) only the guard's, the moduli's digits in bytes later
    prod = cupy.empty((planes if digit_launch is None else planes - setting.count, nn, m), cupy.int32)
    g = 0 if digit_launch is not None else setting.count      # the guard's plane in prod
    guard = low = None
    if setting.guard:
        from .ozaki import guard_constants, guard_unit

        # the guard's plane first (1/17 of the int8 work): its verdict decides whether the
        # moduli's GEMMs are worth running (graded data: most elements fail, and the emulation
        # followed by a native product took 2.2x native DGEMM, H200 8192³)
        gr = setting.count                                   # ... and its residues in ares / bres
        low = prod[g]
        run_inner(spec.inner._replace(batch=1), ares[gr:], bres[gr:], prod[g:g + 1],
                  spec.inner_plan.backend)
        # per line ('fast'): the test's unit in c_hi's place (ozaki.guard_failures' bits_a path)
        constants = (0.0, guard_unit(setting, k)) if line_bits is not None else guard_constants(setting, k)
        guard = (sum_a, sum_b, *constants, counts[2:3])
        passes.guard_count(low, m, n, cplx, lost_a, lost_b[:n], guard, line_bits)
    non_finite, lost, failed = (int(v) for v in counts[:3].get())
    if non_finite:
        _last["route"] = "native: an operand holds Inf or NaN, which the scaling cannot hold"
        run_inner(native, a, b, c)
        return
    if 2 * lost > m + nn:
        # most lines would run natively after the composition anyway (H100, 4096³ with every
        # line lost: 0.42x native DGEMM doing both): the whole call runs natively instead
        _last["route"] = (f"native: {lost} of the {m + nn} rows and columns hold a nonzero element "
                          f"{_reach(setting)} below their largest, which the scaling cannot hold "
                          f"(more than half: the whole product runs natively)")
        run_inner(native, a, b, c)
        return
    if setting.guard:
        if 2 * failed > m * n:
            _last["route"] = setting._replace(native_elements=failed, whole_native=True).describe()
            run_inner(native, a, b, c)
            return
        guard = (sum_a, sum_b, *guard[2:4], counts[3:])  # the reconstruction counts them again
    if digit_launch is None:
        run_inner(moduli, ares, bres, prod, spec.inner_plan.backend)
        products = prod
    else:
        from . import streams
        from .kernels.ozaki_kernels import digit_table

        products = cupy.empty((setting.count, nn, m), cupy.uint8)
        table = _device_table(digit_table, setting.count, desc.device)
        digit_launch(ares.data.ptr, bres.data.ptr, products.data.ptr, 1, 0, streams.current(),
                     bias=table.data.ptr)
    cv = cupy.ndarray((1,), real, memptr=c.data)      # the kernel takes C's address (its real type)
    scale = 2 if cplx else 1
    passes.reconstruct(products, m, n, ea, eb, lost_a, lost_b[:n], cv, scale, scale * desc.ldc,
                       desc.alpha, desc.beta, cplx, guard, low=low, line_bits=line_bits)
    route = f"pyblasgemm {setting.describe()}"
    if lost:
        rows, cols = _lost_lines(desc, lost_a, lost_b[:n])
        route += _native_fixup(desc, a, b, c, rows, cols, setting)
    if failed:
        route += _guard_fixup(desc, a, b, c, setting, low, sum_a, sum_b, lost_a, lost_b[:n], failed, line_bits)
    # the record states the bound the emulated elements keep (#34, item 4); the lines and
    # elements run natively keep native's
    _last["route"] = f"{route}; error of the emulated elements: {setting.bound()}"


def _digit_launch(moduli: GemmDesc, plan):
    """The moduli's batched int8 GEMM bound with the digit store (``kernels.jit.EPI_RESIDUE``)
    by its plan (the composite plan's ``digits``: None where the digits do not run), once per
    problem class and kept in the plan cache (which owns its workspace)."""
    if plan is None:
        return None
    from .constraints import kernel_problem
    from .kernels.jit import EPI_RESIDUE
    from .kernels.launch import bind
    from .plancache import get_plan_cache
    from .planner.overrides import current_settings

    config = plan.config
    cache = get_plan_cache()
    key = ("ozaki digits", moduli.key, config)
    launch = cache.get(key)
    if launch is None:
        launch = bind(kernel_problem(moduli), config, spec=plan.launch, epilogue=(EPI_RESIDUE, None))
        if current_settings().cache:
            cache.put(key, launch)
    return launch


#: (table maker, count, device) -> the table on that device: at most one per moduli count
#: (34) and device, 32 bytes a modulus
_tables: dict = {}


def _device_table(make, count: int, device: int):
    """``make(count)`` (a NumPy table) on the GPU, made once per device."""
    import cupy

    key = (make.__name__, count, device)
    table = _tables.get(key)
    if table is None:
        with cupy.cuda.Device(device):
            table = _tables[key] = cupy.asarray(make(count))
    return table


def _guard_fixup(desc: GemmDesc, a, b, c, setting, low, sum_a, sum_b, lost_a, lost_b, failed: int,
                 line_bits=None) -> str:
    """The elements the guard could not prove (the reconstruction left them alone), from one
    native product: the same test as the kernel's (:func:`pyblasgemm.ozaki.guard_failures`)
    on the guard's plane ``low`` (column-major m x n, 2n for complex: row j, column i) marks
    them again, outside the lines already run natively. ``line_bits``: the 'fast' scaling's
    bits of A's rows and B's 2n (n) columns, for the per-line test."""
    import cupy

    from .ozaki import guard_failures

    n = desc.n

    def lines(part):                            # the per-line test's bits for B's part (0: Re, 1: Im)
        return () if line_bits is None else (line_bits[0], line_bits[1][part * n:(part + 1) * n])

    bad = guard_failures(sum_a, sum_b[:n], low[:n].T, setting, desc.k, *lines(0))
    if desc.row.is_complex:
        bad |= guard_failures(sum_a, sum_b[n:], low[n:].T, setting, desc.k, *lines(1))
    bad &= (lost_a == 0)[:, None] & (lost_b == 0)[None, :]
    view = _c_view(desc, c)
    fixed = view.copy()
    _finish(desc, fixed, _native_product(desc, a, b))
    view[...] = cupy.where(bad, fixed, view)
    return (f"; {failed} elements natively (the guard could not prove native {setting.precision}'s error "
            f"bound for them)")


def _lost_lines(desc, lost_a, lost_b):
    import cupy

    return cupy.flatnonzero(lost_a), cupy.flatnonzero(lost_b)


def _reach(setting) -> str:
    """How far below its line's largest an element is lost, in words: the setting's bits, or
    ('fast') each line's own, at least those."""
    if setting.scaling == "fast":
        return f"more binades than its line keeps bits (at least {setting.bits})"
    return f"more than {setting.bits} binades"


def _native_fixup(desc: GemmDesc, a, b, c, rows, cols, setting) -> str:
    """Rows ``rows`` of C (all columns), then columns ``cols`` (the other rows), natively."""
    import cupy

    view = _c_view(desc, c)
    if rows.size:
        part = view[rows]
        _finish(desc, part, _native_product(desc, a, b, rows=rows))
        view[rows] = part
    if cols.size:
        keep = cupy.ones(desc.m, bool)
        keep[rows] = False
        kept = cupy.flatnonzero(keep)
        if kept.size:
            index = cupy.ix_(kept, cols)
            part = view[index]
            _finish(desc, part, _native_product(desc, a, b, rows=kept, cols=cols))
            view[index] = part
    return (f"; {int(rows.size)} rows and {int(cols.size)} columns natively (a nonzero element "
            f"{_reach(setting)} below its line's largest)")


def _complex(desc: GemmDesc, a, b, c, spec, run_inner) -> None:
    import cupy

    m, n = desc.m, desc.n
    a2, b2 = _stack(desc, a, b, cupy.float32)
    c2 = cupy.empty((2 * n, m), cupy.float32)                  # column-major m x 2n
    run_inner(spec.inner, a2, b2, c2, spec.inner_plan.backend)
    x = c2[:n].T + 1j * c2[n:].T
    _finish(desc, _c_view(desc, c), x.astype(cupy.complex64))
    _last["route"] = f"pyblasgemm complex {desc.compute}: one real product of the stacked parts"
