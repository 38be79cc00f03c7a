"""The Ozaki scheme's 'fast' scaling on the GPU (issue 34, 1c; ``compute='int8-ozaki-fast'``):
the passes must give the host's bits (pyblasgemm.ozaki.split_fast, line_bits, guard_planes,
guard_failures with per-line bits), and the composite route the host backend's result
(``emulated(..., scaling='fast')``) wherever nothing ran natively.

Mirrors the default scaling's GPU tests (test_composite_gpu.py, test_ozaki_guard.py,
test_ozaki_residues.py, test_ozaki_fp32.py) for the four types and the inputs where the two
scalings differ: graded elements 2^U(-30, 30), graded rows, one-hot-ish lines, normal and
uniform data. Every test needs a GPU (marked gpu; skipped without one).
"""
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import ozaki as oz
from conftest import gpu_cupy

pytestmark = pytest.mark.gpu

KINDS = ("normal", "uniform", "graded", "graded rows", "onehot")
DTYPES = (np.float64, np.float32, np.complex128, np.complex64)
#: 1, odd, prime, a 128-row tile's edges (127, 129), k = 1000 (the planes padded to 1008)
SIZES = [(1, 1, 1), (7, 5, 3), (33, 17, 64), (131, 67, 257), (127, 129, 129), (64, 48, 1000)]


def _lines(kind, rng, lines, k):
    """``lines`` x ``k`` values of one kind, one line per row (A's rows; B's columns transposed)."""
    if kind == "normal":
        return rng.standard_normal((lines, k))
    if kind == "uniform":
        return rng.uniform(-1.0, 1.0, (lines, k))
    if kind == "graded":                        # each element 2^U(-30, 30): 60 binades in a line
        return rng.standard_normal((lines, k)) * np.exp2(rng.uniform(-30, 30, (lines, k)))
    if kind == "graded rows":                   # each line scaled by 2^U(-30, 30)
        return rng.standard_normal((lines, k)) * np.exp2(rng.uniform(-30, 30, (lines, 1)))
    x = rng.standard_normal((lines, k)) * 2.0**-20          # one element ~1 per line, the rest ~2^-20
    x[np.arange(lines), rng.integers(0, k, lines)] = rng.uniform(1, 2, lines) * rng.choice([-1, 1], lines)
    return x


def _operands(kind, rng, m, n, k, dtype):
    a, b = _lines(kind, rng, m, k), _lines(kind, rng, n, k).T
    if np.dtype(dtype).kind == "c":
        a = a + 1j * _lines(kind, rng, m, k)
        b = b + 1j * _lines(kind, rng, n, k).T
    return np.asfortranarray(a.astype(dtype)), np.asfortranarray(b.astype(dtype))


def _compare(got, host, a, b, route, m, n):
    """The host's bits wherever the host ran nothing natively; else at most the native
    elements differ (cuBLAS's native products may round otherwise than the host BLAS's). The
    guard's verdict is the host's, element for element: the route counts as many."""
    _, how = oz.emulated(a, b, scaling="fast")
    if how is None or route.startswith("native"):
        return how
    assert "'fast' scaling" in route, route
    if how.native_elements:
        assert f"{how.native_elements} elements natively" in route, (route, how)
    native = how.native_elements + how.native_rows * n + how.native_cols * m
    if native == 0:
        np.testing.assert_array_equal(got, host)
    else:
        assert np.count_nonzero(got != host) <= native, (route, how)
    return how


def _gemm_both(a, b, c, alpha, beta, compute, transa="N", transb="N"):
    """(GPU result, host result, route) of one gemm call on the same bytes, ``a`` and ``b``
    the operands as op() gives them (stored transposed for 'T' / 'C')."""
    from test_ozaki_fp32 import _gpu_and_host

    sa = np.asfortranarray(a if transa == "N" else a.T)
    sb = np.asfortranarray(b if transb == "N" else b.T)
    return _gpu_and_host(transa, transb, sa, sb, c, alpha, beta, compute)


@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_fast_scaling_has_the_host_bits(dtype, kind, m, n, k):
    """Each type, kind and size: alpha and beta, then beta = 0 over a NaN-filled C (never
    read), the host backend's bits."""
    rng = np.random.default_rng(m * 7 + n * 3 + k + len(kind))
    a, b = _operands(kind, rng, m, n, k, dtype)
    c = np.asfortranarray(_lines("normal", rng, m, n).astype(dtype))
    cplx = np.dtype(dtype).kind == "c"
    alpha, beta = (0.5 - 2j, 1 + 0.25j) if cplx else (1.5, -0.5)
    got, host, route = _gemm_both(a, b, c, alpha, beta, "int8-ozaki-fast")
    _compare(got, host, a, b, route, m, n)
    nan_c = np.full((m, n), np.nan, dtype=dtype, order="F")
    got, host, route = _gemm_both(a, b, nan_c, 1.0, 0.0, "int8-ozaki-fast")
    how = _compare(got, host, a, b, route, m, n)
    if how is not None and not route.startswith("native"):
        assert not np.isnan(got).any(), route


@pytest.mark.parametrize("transa,transb", [("N", "T"), ("T", "N"), ("T", "T"), ("C", "N"), ("N", "C")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_fast_scaling_transposes(dtype, transa, transb):
    if np.dtype(dtype).kind != "c" and "C" in transa + transb:
        pytest.skip("conjugation is a complex case")
    rng = np.random.default_rng(41)
    a, b = _operands("onehot", rng, 37, 29, 300, dtype)
    c = np.asfortranarray(_lines("normal", rng, 37, 29).astype(dtype))
    got, host, route = _gemm_both(a, b, c, 2.0, 0.5, "int8-ozaki-fast", transa, transb)
    opa = a.conj() if transa == "C" else a
    opb = b.conj() if transb == "C" else b
    _compare(got, host, opa, opb, route, 37, 29)


def test_gpu_fast_route_says_the_scaling_bits_and_bound():
    """The route record: the 'fast' scaling, the least bits kept, its error bound
    (OzakiSetting.bound()); the plan's explain() the same."""
    cupy = gpu_cupy()
    from pyblasgemm.composite import last_route

    rng = np.random.default_rng(5)
    a, b = _operands("normal", rng, 64, 48, 512, np.float64)
    pyblasgemm.matmul(cupy.asarray(a), cupy.asarray(b), compute="int8-ozaki-fast", backend="tensorcore")
    route = last_route()
    how = oz.setting(512, scaling="fast")
    assert f"integers of at least {how.bits} bits" in route and "'fast' scaling" in route, route
    assert route.endswith("; error of the emulated elements: " + how.bound()), route
    text = pyblasgemm.plan(64, 48, 512, "f64", compute="int8-ozaki-fast", backend="tensorcore").explain()
    assert how.bound() in text and "'fast' scaling" in text, text


@pytest.mark.parametrize("dtype,binades", [(np.float64, 30), (np.complex128, 30), (np.float32, 16),
                                           (np.complex64, 16)])
def test_gpu_fast_guard_native_elements_are_the_hosts(dtype, binades):
    """Graded data the guard cannot prove (columns of A alternately x1 and x2^-binades, rows of
    B the reverse; float32 keeps 26 bits, so 16 binades: 30 would lose whole lines) in a third
    of A's rows, the others without the small columns: with per-line
    bits the GPU's guard fails exactly the host's elements (the route counts as many, fewer
    than half: no whole-native exit), and the others have the host's bits."""
    from test_ozaki_guard import graded

    rng = np.random.default_rng(34)
    m, n, k = 48, 40, 64

    def operands():
        a, b = graded(rng, m, k, n, binades)
        a[m // 3:] = rng.uniform(0.5, 1.0, (m - m // 3, k)) * rng.choice([-1, 1], (m - m // 3, k))
        return a, b
    a, b = operands()
    if np.dtype(dtype).kind == "c":
        a2, b2 = operands()
        a, b = a + 1j * a2, b + 1j * b2
    a, b = np.asfortranarray(a.astype(dtype)), np.asfortranarray(b.astype(dtype))
    c = np.zeros((m, n), dtype, order="F")
    got, host, route = _gemm_both(a, b, c, 1.0, 0.0, "int8-ozaki-fast")
    how = _compare(got, host, a, b, route, m, n)
    assert how is not None and how.native_elements > 0 and not how.whole_native, (how, route)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_gpu_fast_digit_store_has_the_int32_planes_bits(monkeypatch, dtype):
    """k = 1000 (planes padded to 1008) with and without the digit store: the same bytes, and
    the host's."""
    gpu_cupy()
    from pyblasgemm.planner import composite as planned

    rng = np.random.default_rng(1000)
    m, n, k = 520, 264, 1000
    a, b = _operands("onehot", rng, m, n, k, dtype)
    c = np.asfortranarray(_lines("normal", rng, m, n).astype(dtype))
    runs = {}
    try:
        for digits in (True, False):
            monkeypatch.setattr(planned, "DIGITS", digits)
            pyblasgemm.clear_plan_cache()
            runs[digits] = _gemm_both(a, b, c, 1.5, -0.5, "int8-ozaki-fast")
    finally:
        pyblasgemm.clear_plan_cache()
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    _compare(runs[True][0], runs[True][1], a, b, runs[True][2], m, n)


# --- the passes one by one: exponents, bits, guard planes and sums against the host's ------

def _strided(cp, vals, k_contig, pad):
    """``vals`` (lines x length) on the GPU, k-contiguous or line-contiguous, padded strides:
    (array, s_line, s_k)."""
    lines, length = vals.shape
    if k_contig:
        buf = np.zeros((lines, length + pad), vals.dtype)
        buf[:, :length] = vals
        return cp.asarray(buf.ravel()), length + pad, 1
    buf = np.zeros((length, lines + pad), vals.dtype)
    buf[:, :lines] = vals.T
    return cp.asarray(buf.ravel()), 1, lines + pad


@pytest.mark.parametrize("real", [np.float64, np.float32])
@pytest.mark.parametrize("k_contig", [True, False])
@pytest.mark.parametrize("count", [2, 8, 16, 20, 34])
@pytest.mark.parametrize("kind", KINDS + ("tiny",))
def test_gpu_scale_fast_has_split_fasts_exponents_and_bits(kind, count, k_contig, real):
    """ozaki_line_stats' W and ozaki_line_scale's j: split_fast's exponents and line_bits'
    bits, line for line; the lost lines the host's (a nonzero element truncating to 0); a zero
    line and subnormal elements (each counts 1 in W) included."""
    from pyblasgemm.kernels import ozaki_kernels as ok

    cp = gpu_cupy()
    rng = np.random.default_rng(count * 10 + len(kind))
    lines, length = 37, 700
    if kind == "tiny":                          # subnormals beside normal elements
        vals = rng.standard_normal((lines, length)) * np.exp2(-rng.integers(100, 160, (lines, length)))
        vals[:, ::5] = np.finfo(real).smallest_subnormal * rng.integers(1, 9, vals[:, ::5].shape)
    else:
        vals = _lines(kind, rng, lines, length)
    vals[1] = 0.0
    vals = vals.astype(real)
    try:
        oz.bits_for(count, length)
    except ValueError:
        pytest.skip(f"{count} moduli hold nothing at k={length}")
    x, s_line, s_k = _strided(cp, vals, k_contig, 3)
    passes = ok.OzakiPasses(count, None, ok.element_of(real))
    counts = cp.zeros(2, cp.int32)
    exps, lost, bits = passes.scale_fast(x, lines, length, s_line, s_k, counts)
    ints, e = oz.split_fast(vals.astype(np.float64), 1, count)
    assert cp.asnumpy(exps).tolist() == e.tolist()
    assert cp.asnumpy(bits).tolist() == oz.line_bits(vals.astype(np.float64), e, 1).tolist()
    host_lost = oz._lost(vals.astype(np.float64), ints, 1)
    assert cp.asnumpy(lost).astype(bool).tolist() == host_lost.tolist()
    assert cp.asnumpy(counts).tolist() == [0, int(host_lost.sum())]


@pytest.mark.parametrize("kernel", ["tile16-pipe", "tile8-pipe", "words"])
@pytest.mark.parametrize("real", [np.float64, np.float32])
def test_gpu_residues_take_each_lines_guard_shifts(kernel, real):
    """With per-line bits the guard's plane and line sums are guard_planes' with a bits
    array, and the moduli's planes the residues of split_fast's integers."""
    from pyblasgemm.kernels import ozaki_kernels as ok

    cp = gpu_cupy()
    rng = np.random.default_rng(7)
    lines, length, count = 45, 640, 16
    vals = np.concatenate([_lines("onehot", rng, 15, length), _lines("graded rows", rng, 15, length),
                           _lines("normal", rng, 15, length)]).astype(real)
    x, s_line, s_k = _strided(cp, vals, True, 0)
    passes = ok.OzakiPasses(count, None, ok.element_of(real))
    exps, _, bits = passes.scale_fast(x, lines, length, s_line, s_k, cp.zeros(2, cp.int32))
    out = cp.full((count + 1, lines, length), 77, cp.int8)
    sums = cp.zeros(lines, cp.uint64)
    passes.residues(x, lines, length, s_line, s_k, exps, out, 0, sums, kernel=kernel, line_bits=bits)
    ints, e = oz.split_fast(vals.astype(np.float64), 1, count)
    hi, na = oz.guard_planes(ints, 1, oz.line_bits(vals.astype(np.float64), e, 1))
    planes = cp.asnumpy(out)
    assert planes[count].tolist() == hi.tolist()
    assert cp.asnumpy(sums).tolist() == na.tolist()
    for l, p in enumerate(oz.MODULI[:count]):
        assert planes[l].tolist() == oz.residues(ints, p).tolist(), p


@pytest.mark.parametrize("cplx", [False, True])
@pytest.mark.parametrize("count", [9, 16, 34])
def test_gpu_per_line_guard_in_every_reconstruction_kernel(count, cplx):
    """The guard's per-line test (line_bits=) in ozaki_guard_count and every reconstruction
    kernel (int32 planes: elements, rows, rows-staged; digit planes: the same three) on random
    planes, sums and bits: each counts guard_failures(..., bits_a, bits_b)'s elements outside
    the lost lines, leaves exactly those elements of C alone, and all write the same bytes."""
    from pyblasgemm.kernels import ozaki_kernels as ok
    from test_ozaki_reconstruct import _case

    cp = gpu_cupy()
    rng = np.random.default_rng(count + 100 * cplx)
    m, n, k = 528, 5, 1024                     # m % 16 == 0: every kernel applies
    n_prod = 2 * n if cplx else n
    prod, ea, eb, lost_a, lost_b, buf, g = _case(cp, rng, count, m, n, cplx, True, np.float64, m, 0)
    prod[count] = cp.asarray(rng.integers(0, 2**20, (n_prod, m)).astype(np.int32))   # L >= 0
    sum_a, sum_b = g[0], g[1]
    bits_a = cp.asarray(rng.integers(8, 63, m).astype(np.int32))
    bits_b = cp.asarray(rng.integers(8, 63, n_prod).astype(np.int32))
    how = oz.setting(k)
    host = {name: cp.asnumpy(x) for name, x in (("na", sum_a), ("nb", sum_b), ("ba", bits_a), ("bb", bits_b),
                                                 ("low", prod[count]), ("lost_a", lost_a), ("lost_b", lost_b))}
    bad = np.zeros((m, n), bool)
    for part in range(2 if cplx else 1):
        cols = slice(part * n, (part + 1) * n)
        bad |= oz.guard_failures(host["na"], host["nb"][cols], host["low"][cols].T, how, k, host["ba"],
                                 host["bb"][cols])
    bad &= (host["lost_a"] == 0)[:, None] & (host["lost_b"] == 0)[None, :]
    want = int(bad.sum())
    assert 0 < want < m * n, want

    def guard():
        return (sum_a, sum_b, 0.0, oz.guard_unit(how, k), cp.zeros(1, cp.int32))
    g_count = guard()
    passes = ok.OzakiPasses(count)
    passes.guard_count(prod[count], m, n, cplx, lost_a, lost_b, g_count, (bits_a, bits_b))
    assert int(g_count[-1].get()[0]) == want
    digits = cp.asarray(ok.digits_host(cp.asnumpy(prod[:count]), count))
    parts = 2 if cplx else 1
    results = {}
    for planes, name in ((prod, "int32"), (digits, "digits")):
        for kernel in ok.RECONSTRUCT_KERNELS:
            c = cp.asarray(buf)
            g_run = guard()
            used = passes.reconstruct(planes, m, n, ea, eb, lost_a, lost_b, c, parts, parts * m, 1.5, 0.0, cplx,
                                      g_run, kernel=kernel, low=prod[count], line_bits=(bits_a, bits_b))
            assert used == kernel
            assert int(g_run[-1].get()[0]) == want, (name, kernel)
            results[name, kernel] = cp.asnumpy(c)
    first = next(iter(results.values()))
    for key, got in results.items():
        assert got.tobytes() == first.tobytes(), key
    untouched = buf[:parts * m * n].reshape(n, m, parts).transpose(1, 0, 2)
    written = first[:parts * m * n].reshape(n, m, parts).transpose(1, 0, 2)
    assert np.array_equal(written[bad], untouched[bad])
