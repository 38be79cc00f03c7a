"""Float8 products on the GPU (pyblasgemm/kernels/fp8.py: the mma.sync kernel's float8 kinds,
sm_89+) against the exact float64 product (fp8.scaled_product) on fresh random data: sizes 1,
7, 33, 257 and a tile ± 1, both operand types and their mixes, the per-tensor and per-row /
per-column scales, every operand and result layout, bias and every activation, alpha and beta,
beta = 0 over NaN, poisoned outputs, bitwise repeats, CuPy / torch / JAX inputs,
``torch._scaled_mm``'s results where its semantics apply; block scales (1 x 128 of a,
128 x 128 of b, promoted per 128-wide K block in the mainloop) alone and beside the others.

The distinct kernel instantiations stay few (a cold NVRTC cache compiles each once: ~1-2 s):
sizes and layouts run on one epilogue, the epilogue cases on the K-major layout.
"""
from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from conftest import gpu_cupy
from pyblasgemm import fp8
from pyblasgemm.kernels import fp8 as gpu_fp8
from pyblasgemm.planner.fp8 import warm_specs
from pyblasgemm.epilogue import ACTIVATIONS, last_route

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
BF16 = ml_dtypes.bfloat16
pytestmark = pytest.mark.gpu

#: |got - exact| <= RTOL[out] * (the sum of |terms| + |beta·out| + |bias|) + the output's
#: rounding of |exact|: float32 sums of exact float8 products (k32 steps in the tensor core,
#: then round-to-nearest adds), so far below these bounds for a correct kernel; a wrong
#: element, row or scale is off by O(1) of the scale.
RTOL = {"float32": 2.0**-12, "float16": 2.0**-12, "bfloat16": 2.0**-12}
#: the wgmma/TMA kernel's bound: sm_90's float8 tensor core adds each k32 step's products into
#: its accumulator with ~14 bits kept (DeepSeek-V3 report, sec. 3.3.2), not round-to-nearest
#: fp32; the kernel promotes every 128-wide K stage into fresh fp32 registers (as cuBLASLt's
#: non-fast-accumulation mode and DeepGEMM do), so the error is a few 2^-14 of each stage's
#: sum of |terms|. Measured on an H100 (2026-11-28): at most 3.4 x 2^-12 of the sum of |terms|.
RTOL_WGMMA = 2.0**-9
ROUND = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    """These tests are our kernels' (the rule sends K-major products to cuBLASLt:
    tests/test_fp8_lt_gpu.py tests that route)."""
    monkeypatch.setattr(gpu_fp8, "ROUTE", "ours")


@pytest.fixture(scope="module")
def cp():
    cupy = gpu_cupy()
    cc = cupy.cuda.Device().compute_capability
    if (int(cc[:-1]), int(cc[-1])) < (8, 9):
        pytest.skip(f"float8 mma.sync needs sm_89+ (device: sm_{cc})")
    return cupy


def _cases():
    """The float8 products these tests launch, as planner.fp8.warm_specs describes them (most
    of them: a missed one compiles when its test runs)."""
    e4, e5 = "float8_e4m3fn", "float8_e5m2"
    out = [(m, n, k, e4, e4, "C", "F", "C", ("tensor", "cols"), "float32", 0, None) for m, n, k in SIZES]
    for i, (ta, tb) in enumerate(PAIRS):
        out.append((77, 130, 300, np.dtype(ta).name, np.dtype(tb).name, "C", "C", "C", SCALES[i], OUTS[i], 0, None))
    for oa, ob, oc in LAYOUTS:
        out.append((45, 70, 200, e4, e5, oa, ob, "C" if oc == "strided" else oc, ("rows", "cols"), "float32", 0,
                    None))
    for act, axis, out_name, _, _ in EPI_CASES:
        code = 0 if act is None else ACTIVATIONS[act].code
        out.append((65, 129, 256, e4, e4, "C", "F", "C", ("rows", "tensor"), out_name, code, axis))
    for la, lb, m, n, k, oa, ob, oc, out_name in BLOCK_CASES:
        out.append((m, n, k, e4, e4 if lb != "tensor" else e5, oa, ob, oc, (la, lb), out_name, 0, None))
    for la, lb, m, n, k, oc in HOPPER_BLOCK_CASES:
        out.append((m, n, k, e4, e4, "C", "F", oc, (la, lb), "float32", 0, None))
    out += [(100, 200, 1000, e4, e4, "C", "F", "C", ("rows", "cols"), "float32", 0, None),
            (16, 4096, 4096, e4, e4, "C", "F", "C", ("tensor", "cols"), "bfloat16", 0, None),
            (96, 160, 512, e4, e4, "C", "F", "C", ("tensor", "tensor"), "bfloat16", 0, None),
            (96, 160, 512, e4, e4, "C", "F", "C", ("rows", "cols"), "bfloat16", 0, None),
            (96, 200, 384, e4, e4, "C", "F", "C", ("blocks", "blocks"), "float32", ACTIVATIONS["gelu"].code, "cols")]
    return out


@pytest.fixture(scope="module", autouse=True)
def _warm(cp):
    """Compile the tests' kernels in parallel first (a cold cache: ~1-2 s each for mma.sync,
    several for the Hopper kernel, one after another otherwise)."""
    import time

    from pyblasgemm.kernels import jit

    dev = cp.cuda.Device()
    cc = (int(dev.compute_capability[:-1]), int(dev.compute_capability[-1]))
    sms = dev.attributes["MultiProcessorCount"]
    specs = warm_specs(_cases(), sms, cc, dev.id)
    old = gpu_fp8.FAMILY
    try:
        gpu_fp8.FAMILY = "sm80"
        specs += warm_specs([c for c in _cases()[:len(SIZES)]], sms, cc, dev.id)
    finally:
        gpu_fp8.FAMILY = old
    t0 = time.perf_counter()
    jit.warm(list(dict.fromkeys(specs)))
    print(f"\nwarmed {len(set(specs))} float8 kernels in {time.perf_counter() - t0:.1f} s")


def _fp8(rng, shape, dtype, spread=3):
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    return x.astype(dtype)


def dev(cp, x, order="C"):
    """A CuPy copy of host array ``x`` in ``order`` (float8 / bfloat16 moved as their bits)."""
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    y = cp.asarray(np.ascontiguousarray(x).view(bits))
    if order == "F":
        y = cp.asfortranarray(y)
    return y.view(x.dtype)


def host(cp, x):
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    return cp.asnumpy(x.view(bits)).view(x.dtype)


def _scales(rng, layout, count):
    """A float32 scale of ``layout`` ('tensor' or a vector of ``count``), powers of two and
    non-powers alike."""
    if layout == "tensor":
        return np.float32(rng.uniform(0.25, 2.0))
    return rng.uniform(0.1, 3.0, count).astype(np.float32)


def reference(a, b, sa, sb, alpha=1.0, beta=0.0, out=None, bias=None, bias_axis="cols", activation=None):
    """(exact float64 pre-activation value, the activated value, the error scale)."""
    t = fp8.scaled_product(a, b, sa, sb)
    mag = fp8.scaled_product(np.abs(a.astype(np.float64)).astype(a.dtype), np.abs(b.astype(np.float64)).astype(b.dtype),
                             np.abs(np.asarray(sa)), np.abs(np.asarray(sb)))
    v, s = alpha * t, abs(alpha) * mag
    if beta != 0:
        v = v + beta * out.astype(np.float64)
        s = s + abs(beta * out.astype(np.float64))
    if bias is not None:
        bb = bias.astype(np.float64)
        bb = bb.reshape(-1, 1) if bias_axis == "rows" else bb.reshape(1, -1)
        v, s = v + bb, s + abs(bb)
    y = v if activation is None else ACTIVATIONS[activation].host(v)
    return v, y, s


def check(got, want, scale, out_name):
    """``got`` within the bound of the route that computed it (the last route: the wgmma
    kernel's and cuBLASLt's float8 sums on sm_90 are looser than mma.sync's, :data:`RTOL_WGMMA`)."""
    g = got.astype(np.float64)
    err = np.abs(g - want)
    route = last_route()
    rtol = RTOL_WGMMA if "wgmma" in route or route.startswith("cuBLASLt") else RTOL[out_name]
    bound = rtol * scale + ROUND[out_name] * np.abs(want) + 1e-30
    bad = ~(err <= bound)
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off; worst {np.nanmax(err / bound):.3g}x "
                           f"the bound at {np.unravel_index(np.nanargmax(err / bound), err.shape)}")


#: (m, n, k): 1, 7, 33, 257, a 64 / 128 tile ± 1, long K (serial split-k), decode shapes
SIZES = [(1, 1, 1), (7, 33, 257), (33, 7, 31), (257, 129, 127), (63, 65, 129), (127, 129, 255),
         (129, 257, 64), (16, 512, 2048), (1, 384, 4096), (200, 300, 1000)]


@pytest.mark.parametrize("family", [None, "sm80"], ids=["auto", "mma.sync"])
@pytest.mark.parametrize("m, n, k", SIZES, ids=[f"{m}x{n}x{k}" for m, n, k in SIZES])
def test_sizes_k_major(cp, monkeypatch, m, n, k, family):
    """a row-major, b column-major (torch._scaled_mm's layout): on sm_90 the Hopper kernel
    (wgmma; mma.sync where its TMA rules refuse the leading dimensions), and mma.sync
    (ldmatrix fragments) forced; per-tensor scale_a, per-column scale_b; the output poisoned
    first."""
    monkeypatch.setattr(gpu_fp8, "FAMILY", family)
    rng = np.random.default_rng(m * 1000003 + n * 1009 + k)
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (k, n), E4M3)
    sa, sb = _scales(rng, "tensor", m), _scales(rng, "cols", n)
    out = cp.full((m, n), np.nan, np.float32)
    got = pyblasgemm.matmul(dev(cp, a), dev(cp, b, "F"), out=out, scale_a=cp.asarray(sa),
                            scale_b=cp.asarray(sb))
    assert got is out
    _, want, scale = reference(a, b, sa, sb)
    check(cp.asnumpy(got), want, scale, "float32")
    route = last_route()
    assert route.startswith("ours: float8 on the"), route
    if family == "sm80":
        assert "mma.sync" in route, route


PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)]
OUTS = ["float32", "float16", "bfloat16", "float32"]
SCALES = [("rows", "cols"), ("tensor", "tensor"), ("rows", "tensor"), ("tensor", "cols")]


@pytest.mark.parametrize("i", range(4), ids=[f"{np.dtype(p[0]).name}-{np.dtype(p[1]).name}" for p in PAIRS])
def test_operand_types_scales_and_outputs(cp, i):
    """Every operand pair (the kernel's kinds, A and B swapped by the row-major result), each
    scale layout, each output type; NumPy's default layout (both row-major: b's byte gathers)."""
    ta, tb = PAIRS[i]
    out_name = OUTS[i]
    la, lb = SCALES[i]
    rng = np.random.default_rng(100 + i)
    m, n, k = 77, 130, 300
    a, b = _fp8(rng, (m, k), ta), _fp8(rng, (k, n), tb)
    sa, sb = _scales(rng, la, m), _scales(rng, lb, n)
    dt = BF16 if out_name == "bfloat16" else np.dtype(out_name)
    got = pyblasgemm.matmul(dev(cp, a), dev(cp, b), scale_a=cp.asarray(sa), scale_b=cp.asarray(sb), dtype=dt)
    assert got.dtype.name == out_name and got.shape == (m, n)
    _, want, scale = reference(a, b, sa, sb)
    check(host(cp, got), want, scale, out_name)


LAYOUTS = [("C", "C", "C"), ("F", "C", "C"), ("C", "F", "F"), ("F", "F", "F"), ("C", "F", "strided")]


@pytest.mark.parametrize("oa, ob, oc", LAYOUTS, ids=["-".join(x) for x in LAYOUTS])
def test_every_operand_and_result_layout(cp, oa, ob, oc):
    """a and b in either order (K-contiguous or not: no copy, no refusal), the result C- or
    F-ordered (the swap or not), or a strided view (computed into a temporary, copied)."""
    rng = np.random.default_rng(7)
    m, n, k = 45, 70, 200
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (k, n), E5M2)
    sa, sb = _scales(rng, "rows", m), _scales(rng, "cols", n)
    if oc == "strided":
        big = cp.full((m, 2 * n), np.nan, np.float32)
        out = big[:, ::2]
    else:
        out = cp.full((m, n), np.nan, np.float32, order=oc)
    got = pyblasgemm.matmul(dev(cp, a, oa), dev(cp, b, ob), out=out, scale_a=cp.asarray(sa), scale_b=cp.asarray(sb))
    assert got is out
    _, want, scale = reference(a, b, sa, sb)
    check(cp.asnumpy(got), want, scale, "float32")
    if oc == "strided":
        assert cp.isnan(big[:, 1::2]).all()          # the gaps are untouched


EPI_CASES = [  # (activation, bias axis or None, out dtype, alpha, beta)
    (None, "cols", "float32", 1.0, 0.0),
    ("relu", "cols", "float16", 2.0, 0.0),
    ("gelu", "rows", "bfloat16", 1.0, 0.5),
    ("gelu_tanh", None, "float32", -0.75, 1.0),
    ("silu", "cols", "bfloat16", 1.0, 0.0),
    ("sigmoid", "rows", "float16", 0.5, -1.0),
]


@pytest.mark.parametrize("act, axis, out_name, alpha, beta", EPI_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-a{c[3]}-b{c[4]}" for c in EPI_CASES])
def test_epilogue_bias_activation_alpha_beta(cp, act, axis, out_name, alpha, beta):
    """act(alpha·product + beta·out + bias) in scaled_matmul's order, the pre-activation too;
    gemm's form for alpha / beta."""
    rng = np.random.default_rng(zlib.crc32(f"{act}-{axis}-{out_name}".encode()))
    m, n, k = 65, 129, 256
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (n, k), E4M3).T      # b K-contiguous
    sa, sb = _scales(rng, "rows", m), _scales(rng, "tensor", n)
    dt = BF16 if out_name == "bfloat16" else np.dtype(out_name)
    old = rng.standard_normal((m, n)).astype(dt)
    bias = None if axis is None else rng.standard_normal(n if axis == "cols" else (m, 1)).astype(dt)
    out, pre = dev(cp, old), cp.empty((m, n), dt)
    got = pyblasgemm.gemm("N", "N", dev(cp, a), dev(cp, np.ascontiguousarray(b.T)).T, alpha=alpha, beta=beta,
                          out=out, bias=None if bias is None else dev(cp, bias), activation=act,
                          preactivation_out=pre, scale_a=cp.asarray(sa), scale_b=cp.asarray(sb))
    v, want, scale = reference(a, b, sa, sb, alpha, beta, old, bias, axis or "cols", act)
    check(host(cp, got), want, scale, out_name)
    check(host(cp, pre), v, scale, out_name)


def test_beta_zero_ignores_nan_and_bits_repeat(cp):
    rng = np.random.default_rng(11)
    m, n, k = 100, 200, 1000
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (k, n), E4M3)
    sa, sb = _scales(rng, "rows", m), _scales(rng, "cols", n)
    da, db = dev(cp, a), dev(cp, b, "F")
    out = cp.full((m, n), np.nan, np.float32)
    kw = dict(scale_a=cp.asarray(sa), scale_b=cp.asarray(sb))
    got = pyblasgemm.gemm("N", "N", da, db, alpha=1.0, beta=0.0, out=out, **kw)
    assert not cp.isnan(got).any()
    first = cp.asnumpy(got).copy()
    for _ in range(3):
        again = pyblasgemm.matmul(da, db, **kw)
        assert np.array_equal(cp.asnumpy(again).view(np.uint32), first.view(np.uint32))


def test_split_k_is_bitwise_repeatable_and_exact_enough(cp):
    """Decode: m = 16 tokens over a 4096 x 4096 layer (serial split-k, summed in split order)."""
    rng = np.random.default_rng(12)
    m, n, k = 16, 4096, 4096
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (n, k), E4M3).T
    sa, sb = np.float32(0.75), _scales(rng, "cols", n)
    da, db = dev(cp, a), dev(cp, np.ascontiguousarray(b.T)).T
    kw = dict(scale_a=cp.asarray(sa), scale_b=cp.asarray(sb), dtype=BF16)
    got = [host(cp, pyblasgemm.matmul(da, db, **kw)) for _ in range(3)]
    assert all(np.array_equal(g.view(np.uint16), got[0].view(np.uint16)) for g in got)
    _, want, scale = reference(a, b, sa, sb)
    check(got[0], want, scale, "bfloat16")


def test_per_tensor_scale_is_read_on_the_device(cp):
    """The per-tensor scale is a pointer the kernel reads: rewriting the array on the device
    changes the next result (what a captured CUDA graph relies on)."""
    rng = np.random.default_rng(13)
    a, b = _fp8(rng, (32, 64), E4M3), _fp8(rng, (64, 48), E4M3)
    da, db = dev(cp, a), dev(cp, b, "F")
    sa, sb = cp.asarray(np.float32(1.0)), cp.asarray(np.ones(1, np.float32))
    one = cp.asnumpy(pyblasgemm.matmul(da, db, scale_a=sa, scale_b=sb))
    sa[...] = 4.0
    sb[...] = 0.5
    two = cp.asnumpy(pyblasgemm.matmul(da, db, scale_a=sa, scale_b=sb))
    np.testing.assert_array_equal(two, 2 * one)


def test_nan_operand_and_degenerate_shapes(cp):
    rng = np.random.default_rng(14)
    a, b = _fp8(rng, (9, 40), E4M3), _fp8(rng, (40, 5), E4M3)
    a[3, 7] = np.nan
    got = cp.asnumpy(pyblasgemm.matmul(dev(cp, a), dev(cp, b), scale_a=cp.float32(1), scale_b=cp.float32(1)))
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, axis=0)).any()
    one = cp.asarray(np.float32(1))
    empty = pyblasgemm.matmul(dev(cp, a[:, :0]), dev(cp, b[:0]), scale_a=one, scale_b=one,
                              bias=cp.ones(5, cp.float32), activation="relu")
    np.testing.assert_array_equal(cp.asnumpy(empty), np.ones((9, 5), np.float32))
    assert pyblasgemm.matmul(dev(cp, a[:0]), dev(cp, b), scale_a=one, scale_b=one).shape == (0, 5)


BLOCK_CASES = [  # (scale_a layout, scale_b layout, m, n, k, a order, b order, out order, out dtype)
    ("blocks", "blocks", 129, 257, 300, "C", "F", "C", "bfloat16"),      # DeepGEMM's pair, K-major
    ("blocks", "blocks", 200, 130, 1000, "C", "C", "F", "float32"),      # not K-major b, no swap
    ("blocks", "tensor", 33, 65, 129, "F", "F", "C", "float16"),
    ("rows", "blocks", 64, 128, 256, "C", "F", "C", "float32"),
    ("tensor", "blocks", 7, 300, 127, "C", "C", "C", "float32"),
    ("blocks", "cols", 16, 4096, 4096, "C", "F", "C", "bfloat16"),      # decode: serial split-k
]


@pytest.mark.parametrize("la, lb, m, n, k, oa, ob, oc, out_name", BLOCK_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}x{c[3]}x{c[4]}-{c[5]}{c[6]}{c[7]}-{c[8]}" for c in BLOCK_CASES])
def test_block_scales(cp, la, lb, m, n, k, oa, ob, oc, out_name):
    """1 x 128 blocks of a and 128 x 128 blocks of b (DeepGEMM's), alone or beside the other
    layouts: every 128-wide K block promoted into the accumulator with its scales (k not a
    multiple of 128 included: the last block is partial), in both orientations; bitwise
    repeatable."""
    rng = np.random.default_rng(zlib.crc32(f"{la}{lb}{m}{n}{k}".encode()))
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (k, n), E4M3 if lb != "tensor" else E5M2)
    kb, nb = -(-k // 128), -(-n // 128)
    # block scales over two decades: a product where the blocks' scales did not apply per
    # block would be far off
    sa = (np.exp2(rng.integers(-4, 5, (m, kb))).astype(np.float32) if la == "blocks" else _scales(rng, la, m))
    sb = (np.exp2(rng.integers(-4, 5, (kb, nb))).astype(np.float32) * rng.uniform(0.5, 1.5, (kb, nb)).astype(np.float32)
          if lb == "blocks" else _scales(rng, lb, n))
    dt = BF16 if out_name == "bfloat16" else np.dtype(out_name)
    out = cp.full((m, n), np.nan, dt, order=oc) if out_name != "bfloat16" else None
    kw = dict(scale_a=cp.asarray(sa), scale_b=cp.asarray(sb))
    got = pyblasgemm.matmul(dev(cp, a, oa), dev(cp, b, ob), out=out, dtype=None if out is not None else dt, **kw)
    _, want, scale = reference(a, b, sa, sb)
    first = host(cp, got)
    check(first, want, scale, out_name)
    out2 = None if out is None else cp.full((m, n), np.nan, dt, order=oc)     # the same orientation
    again = host(cp, pyblasgemm.matmul(dev(cp, a, oa), dev(cp, b, ob), out=out2,
                                       dtype=None if out2 is not None else dt, **kw))
    bits = {4: np.uint32, 2: np.uint16}[first.dtype.itemsize]
    assert np.array_equal(np.ascontiguousarray(again).view(bits), np.ascontiguousarray(first).view(bits))


#: K-major block-scaled products on the Hopper kernel (sm90_fold_block_scaled): sizes 1, odd,
#: prime, a 64 / 128 tile ± 1, K not a multiple of 128 (a partial last block), long K (parallel
#: split-k: the partials are scaled, the sum is not); C row-major (the kernel's m side holds b's
#: scales) and column-major (a's: a 1 x 128 scale per column of the tile). K not a multiple of
#: 16 (1, 257, 127, 129, 300) takes mma.sync's block tile: TMA rows are whole 16 bytes.
HOPPER_BLOCK_CASES = [  # (scale_a layout, scale_b layout, m, n, k, out order)
    ("blocks", "blocks", 1, 1, 1, "C"), ("blocks", "blocks", 7, 33, 257, "C"),
    ("blocks", "blocks", 7, 33, 272, "C"), ("blocks", "blocks", 129, 257, 300, "F"),
    ("blocks", "blocks", 257, 129, 144, "C"), ("blocks", "blocks", 127, 65, 384, "F"),
    ("rows", "blocks", 64, 128, 256, "C"), ("blocks", "cols", 200, 300, 1008, "F"),
    ("tensor", "blocks", 33, 129, 640, "C"), ("blocks", "tensor", 130, 64, 129, "C"),
    ("blocks", "blocks", 16, 4096, 4096, "C"), ("blocks", "blocks", 520, 1032, 2048, "C"),
    ("blocks", "blocks", 1024, 640, 1536, "F"),
]


@pytest.mark.parametrize("la, lb, m, n, k, oc", HOPPER_BLOCK_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}x{c[3]}x{c[4]}-{c[5]}" for c in HOPPER_BLOCK_CASES])
def test_block_scales_on_the_hopper_kernel(cp, monkeypatch, la, lb, m, n, k, oc):
    """Both operands K-major (torch._scaled_mm's and DeepGEMM's layout) with block scales, on
    each kernel on the same bytes: the Hopper kernel (the rule, FAMILY None: wherever TMA takes
    the rows; its promotion scales each 128-wide stage) and mma.sync (FAMILY = 'sm80'), each
    within its bound of the float64 reference, the output poisoned first, bitwise repeatable."""
    on_hopper = cp.cuda.Device().compute_capability == "90"
    rng = np.random.default_rng(zlib.crc32(f"hopper{la}{lb}{m}{n}{k}{oc}".encode()))
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (k, n), E4M3)
    kb, nb = -(-k // 128), -(-n // 128)
    sa = (np.exp2(rng.integers(-4, 5, (m, kb))).astype(np.float32) * rng.uniform(0.5, 1.5, (m, kb)).astype(np.float32)
          if la == "blocks" else _scales(rng, la, m))
    sb = (np.exp2(rng.integers(-4, 5, (kb, nb))).astype(np.float32) * rng.uniform(0.5, 1.5, (kb, nb)).astype(np.float32)
          if lb == "blocks" else _scales(rng, lb, n))
    kw = dict(scale_a=cp.asarray(sa), scale_b=cp.asarray(sb))
    _, want, scale = reference(a, b, sa, sb)
    tma = k % 16 == 0       # TMA rows are whole 16 bytes: else mma.sync's block tile
    for family, wgmma in ((None, on_hopper and tma), ("sm80", False)):
        monkeypatch.setattr(gpu_fp8, "FAMILY", family)
        runs = []
        for _ in range(2):
            out = cp.full((m, n), np.nan, np.float32, order=oc)
            assert pyblasgemm.matmul(dev(cp, a), dev(cp, b, "F"), out=out, **kw) is out
            route = last_route()
            runs.append(cp.asnumpy(out))
            check(runs[-1], want, scale, "float32")
        assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32)), family
        assert ("wgmma" in route) == wgmma and ("mma.sync" in route) != wgmma, (family, route)


def test_block_scales_with_the_epilogue(cp):
    """Block scales and bias, GELU, alpha, beta, the pre-activation, through gemm's form."""
    rng = np.random.default_rng(21)
    m, n, k = 96, 200, 384
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (k, n), E4M3)
    sa = rng.uniform(0.1, 2, (m, 3)).astype(np.float32)
    sb = rng.uniform(0.1, 2, (3, 2)).astype(np.float32)
    old = rng.standard_normal((m, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    out, pre = cp.asarray(old), cp.empty((m, n), np.float32)
    pyblasgemm.gemm("N", "N", dev(cp, a), dev(cp, b, "F"), alpha=0.5, beta=2.0, out=out, bias=cp.asarray(bias),
                    activation="gelu", preactivation_out=pre, scale_a=cp.asarray(sa), scale_b=cp.asarray(sb))
    v, want, scale = reference(a, b, sa, sb, 0.5, 2.0, old, bias, "cols", "gelu")
    check(cp.asnumpy(out), want, scale, "float32")
    check(cp.asnumpy(pre), v, scale, "float32")


def test_backend_refusals_on_gpu_arrays(cp):
    a, b = dev(cp, np.ones((4, 300), E4M3)), dev(cp, np.ones((300, 8), E4M3))
    one = cp.asarray(np.float32(1))
    with pytest.raises(ValueError, match="backend='host' runs"):
        pyblasgemm.matmul(a, b, scale_a=one, scale_b=one, backend="host")
    with pytest.raises(ValueError, match="backend='cublas' cannot run this float8 product: .*TN form"):
        pyblasgemm.matmul(a, b, scale_a=one, scale_b=one, backend="cublas")      # b row-major
    got = pyblasgemm.matmul(a, b, scale_a=one, scale_b=one, backend="tensorcore")
    assert (cp.asnumpy(got) == 300).all()
    assert last_route().startswith("ours: float8 on the")


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def test_torch_cuda_tensors_and_scaled_mm(cp):
    """CUDA tensors through the array door (the result a tensor), and agreement with
    torch._scaled_mm (cuBLASLt) for per-tensor and row-wise scales, e4m3, bfloat16 output: both
    within the bound of the exact product."""
    torch = _torch_cuda()
    rng = np.random.default_rng(15)
    m, n, k = 96, 160, 512
    a, b = _fp8(rng, (m, k), E4M3), _fp8(rng, (n, k), E4M3).T
    ta = torch.from_numpy(a.view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    tb = torch.from_numpy(np.ascontiguousarray(b.T).view(np.uint8)).cuda().view(torch.float8_e4m3fn).t()
    for rowwise in (False, True):
        if rowwise:
            sa, sb = _scales(rng, "rows", m), _scales(rng, "cols", n)
            tsa, tsb = torch.from_numpy(sa).cuda().view(m, 1), torch.from_numpy(sb).cuda().view(1, n)
        else:
            sa, sb = np.float32(0.5), np.float32(1.5)
            tsa, tsb = torch.tensor(0.5, device="cuda"), torch.tensor(1.5, device="cuda")
        got = pyblasgemm.matmul(ta, tb, scale_a=tsa.reshape(-1), scale_b=tsb.reshape(-1), dtype=torch.bfloat16)
        assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.bfloat16
        theirs = torch._scaled_mm(ta, tb, tsa, tsb, out_dtype=torch.bfloat16)
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs      # (torch < 2.4: (out, amax))
        _, want, scale = reference(a, b, sa, sb)
        mine = got.float().cpu().numpy()
        check(mine, want, scale, "bfloat16")
        check(theirs.float().cpu().numpy(), want, scale, "bfloat16")
        # both round the same float32-ish sum once to bfloat16: at most one bfloat16 step apart
        diff = np.abs(mine.astype(np.float64) - theirs.float().cpu().numpy())
        assert (diff <= 2.0**-7 * np.abs(want) + RTOL["bfloat16"] * scale).all()


def test_jax_gpu_arrays(cp):
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX without a GPU")
    jnp = jax.numpy
    rng = np.random.default_rng(16)
    a, b = _fp8(rng, (8, 64), E4M3), _fp8(rng, (64, 24), E5M2)
    ja = jax.device_put(jnp.asarray(a), gpus[0])
    jb = jax.device_put(jnp.asarray(b), gpus[0])
    got = pyblasgemm.matmul(ja, jb, scale_a=jax.device_put(jnp.float32(0.5), gpus[0]),
                            scale_b=jax.device_put(jnp.float32(2.0), gpus[0]))
    _, want, scale = reference(a, b, np.float32(0.5), np.float32(2.0))
    check(np.asarray(got), want, scale, "float32")


def test_invariant_float8_products_on_the_gpu_are_refused_before_any_work(monkeypatch):
    """invariant=True (the keyword or PYBLASGEMM_INVARIANT) on GPU float8 operands: refused,
    naming why, with ``out`` untouched (cuBLASLt or our kernels are chosen per shape, so a row's
    bits could change with the batch); the host's exact products stay invariant."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(31)
    a = rng.standard_normal((8, 64)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal((64, 16)).astype(ml_dtypes.float8_e4m3fn)
    s = cp.asarray(np.float32(1))
    out = cp.full((8, 16), 5, np.float32)
    for call in (lambda **kw: pyblasgemm.matmul(dev(cp, a), dev(cp, b), out=out, scale_a=s, scale_b=s, **kw),
                 lambda **kw: pyblasgemm.gemm("N", "N", dev(cp, a), dev(cp, b), out, scale_a=s, scale_b=s, **kw)):
        with pytest.raises(NotImplementedError, match="invariant=True is not available for float8"):
            call(invariant=True)
        monkeypatch.setenv("PYBLASGEMM_INVARIANT", "1")
        pyblasgemm.clear_plan_cache()
        with pytest.raises(NotImplementedError, match="invariant=True is not available for float8"):
            call()
        monkeypatch.delenv("PYBLASGEMM_INVARIANT")
        pyblasgemm.clear_plan_cache()
        assert bool((out == 5).all())
    host = pyblasgemm.matmul(a, b, scale_a=np.float32(1), scale_b=np.float32(1), invariant=True)
    assert np.array_equal(host[3:4], pyblasgemm.matmul(a[3:4], b, scale_a=np.float32(1), scale_b=np.float32(1),
                                                       invariant=True))
