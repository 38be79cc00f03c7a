"""Float8 products on cuBLASLt's FP8 GEMM (pyblasgemm/backends/cublaslt.py ``LtFp8Launch``, the
route pyblasgemm/planner/fp8.py ``choose_route`` picks) against the exact float64 product of the
dequantized operands (fp8.scaled_product): per-tensor, per-row / per-column and block scales,
bfloat16 / float16 / float32 results, bias and relu / gelu_tanh, alpha, beta with C, poisoned
outputs, bitwise repeats, the route forced both ways, CUDA-graph replay with a changed per-tensor
scale, and the fallback to our kernels where cuBLASLt refuses the case.

Every case is ``torch._scaled_mm``'s layout (a row-major, b column-major: cuBLASLt's TN form).
Row / column and block scales need sm_90 and cuBLAS 12.9+: skipped elsewhere.
"""
from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from conftest import gpu_cupy
from pyblasgemm import fp8
from pyblasgemm.backends import cublaslt
from pyblasgemm.epilogue import last_route
from pyblasgemm.planner.fp8 import DECODE_ROWS
from test_fp8_gpu import BF16, E4M3, E5M2, _fp8, _scales, check, dev, host, reference

pytestmark = pytest.mark.gpu
OUT_TYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16}


@pytest.fixture(scope="module")
def cp():
    cupy = gpu_cupy()
    cc = cupy.cuda.Device().compute_capability
    if (int(cc[:-1]), int(cc[-1])) < (8, 9):
        pytest.skip(f"cuBLASLt's FP8 GEMM needs sm_89+ (device: sm_{cc})")
    if cublaslt.version() is None:
        pytest.skip(f"cuBLASLt could not be loaded: {cublaslt.status()['error']}")
    return cupy


def _needs_scale_modes(cp, layouts):
    if layouts[0] == "tensor":
        return
    cc = cp.cuda.Device().compute_capability
    if cc != "90" or cublaslt.version() < cublaslt.FP8_SCALE_MODES_VERSION:
        pytest.skip(f"cuBLASLt's {layouts} scales need sm_90 and cuBLAS 12.9+ (sm_{cc}, {cublaslt.version()})")


def _block_scales(rng, m, n, k):
    kb, nb = -(-k // 128), -(-n // 128)
    return (np.exp2(rng.integers(-4, 5, (m, kb))).astype(np.float32),
            (np.exp2(rng.integers(-4, 5, (kb, nb))) * rng.uniform(0.5, 1.5, (kb, nb))).astype(np.float32))


def _operands(rng, m, n, k, ta=E4M3, tb=E4M3):
    a, b = _fp8(rng, (m, k), ta), _fp8(rng, (n, k), tb).T       # b K-contiguous (column-major)
    return a, b


def _lt_call(cp, a, b, sa, sb, out_name="bfloat16", backend="cublas", **kw):
    """matmul on CuPy copies (a row-major, b column-major), the output poisoned first."""
    dt = OUT_TYPES[out_name]
    out = kw.pop("out", None)
    if out is None:
        out = dev(cp, np.full((a.shape[0], b.shape[1]), np.nan, dt))
    got = pyblasgemm.matmul(dev(cp, a), dev(cp, np.ascontiguousarray(b.T)).T, out=out, scale_a=cp.asarray(sa),
                            scale_b=cp.asarray(sb), backend=backend, **kw)
    assert got is out
    return got


CASES = [  # (scale layouts, m, n, k, out dtype, a type, b type)
    (("tensor", "tensor"), 128, 256, 512, "bfloat16", E4M3, E4M3),
    (("tensor", "tensor"), 1, 4096, 4096, "bfloat16", E4M3, E4M3),          # decode
    (("tensor", "tensor"), 33, 80, 160, "float16", E4M3, E5M2),
    (("tensor", "tensor"), 64, 96, 256, "float32", E5M2, E4M3),
    (("rows", "cols"), 16, 4096, 4096, "bfloat16", E4M3, E4M3),
    (("rows", "cols"), 200, 304, 1024, "float32", E4M3, E4M3),
    (("rows", "cols"), 77, 144, 320, "float16", E4M3, E5M2),
    (("blocks", "blocks"), 128, 256, 384, "bfloat16", E4M3, E4M3),
    (("blocks", "blocks"), 64, 384, 300 // 16 * 16, "float32", E4M3, E4M3),   # kb = 3: padded block rows
    (("blocks", "blocks"), 16, 4096, 4096, "bfloat16", E4M3, E4M3),
]


@pytest.mark.parametrize("layouts, m, n, k, out_name, ta, tb", CASES,
                         ids=[f"{c[0][0]}-{c[1]}x{c[2]}x{c[3]}-{c[4]}-{np.dtype(c[5]).name[8:]}{np.dtype(c[6]).name[8:]}"
                              for c in CASES])
def test_against_the_float64_reference(cp, layouts, m, n, k, out_name, ta, tb):
    _needs_scale_modes(cp, layouts)
    rng = np.random.default_rng(zlib.crc32(f"{layouts}{m}{n}{k}{out_name}".encode()))
    a, b = _operands(rng, m, n, k, ta, tb)
    if layouts[0] == "blocks":
        sa, sb = _block_scales(rng, m, n, k)
    else:
        sa, sb = _scales(rng, layouts[0], m), _scales(rng, layouts[1], n)
    got = _lt_call(cp, a, b, sa, sb, out_name)
    assert last_route().startswith("cuBLASLt: float8 TN"), last_route()
    _, want, scale = reference(a, b, sa, sb)
    first = host(cp, got)
    check(first, want, scale, out_name)
    again = host(cp, _lt_call(cp, a, b, sa, sb, out_name))
    bits = {4: np.uint32, 2: np.uint16}[first.dtype.itemsize]
    assert np.array_equal(again.view(bits), first.view(bits))


EPI_CASES = [  # (activation, bias?, out dtype, alpha, beta)
    (None, True, "bfloat16", 1.0, 0.0),
    ("relu", True, "float16", 2.0, 0.0),
    ("relu", False, "float32", 1.0, 0.5),
    ("gelu_tanh", True, "bfloat16", -0.75, 1.0),
    ("gelu_tanh", False, "float16", 0.5, -1.0),
]


@pytest.mark.parametrize("act, has_bias, out_name, alpha, beta", EPI_CASES,
                         ids=[f"{c[0]}-{'bias' if c[1] else 'nobias'}-{c[2]}-a{c[3]}-b{c[4]}" for c in EPI_CASES])
def test_bias_activation_alpha_beta(cp, act, has_bias, out_name, alpha, beta):
    """cuBLASLt's epilogues (BIAS, RELU, RELU_BIAS, GELU, GELU_BIAS) with alpha and beta·C,
    through gemm's form; C is the output's type."""
    rng = np.random.default_rng(zlib.crc32(f"{act}{has_bias}{out_name}".encode()))
    m, n, k = 96, 160, 512
    a, b = _operands(rng, m, n, k)
    sa, sb = _scales(rng, "tensor", m), _scales(rng, "tensor", n)
    dt = OUT_TYPES[out_name]
    old = rng.standard_normal((m, n)).astype(dt)
    bias = rng.standard_normal(n).astype(dt) if has_bias else None
    out = dev(cp, old)
    pyblasgemm.gemm("N", "N", dev(cp, a), dev(cp, np.ascontiguousarray(b.T)).T, alpha=alpha, beta=beta, out=out,
                    bias=None if bias is None else dev(cp, bias), activation=act, scale_a=cp.asarray(sa),
                    scale_b=cp.asarray(sb), backend="cublas")
    assert last_route().startswith("cuBLASLt"), last_route()
    assert ("BIAS" in last_route()) == has_bias
    _, want, scale = reference(a, b, sa, sb, alpha, beta, old, bias, "cols", act)
    check(host(cp, out), want, scale, out_name)


@pytest.mark.parametrize("layouts", [("tensor", "tensor"), ("rows", "cols"), ("blocks", "blocks")])
def test_both_routes_agree(cp, layouts):
    """backend='cublas' and backend='tensorcore' on the same bytes: both within the bound of the
    exact product, and within two output steps plus the bound of each other."""
    _needs_scale_modes(cp, layouts)
    rng = np.random.default_rng(31)
    m, n, k = 64, 512, 1024
    a, b = _operands(rng, m, n, k)
    sa, sb = (_block_scales(rng, m, n, k) if layouts[0] == "blocks"
              else (_scales(rng, layouts[0], m), _scales(rng, layouts[1], n)))
    _, want, scale = reference(a, b, sa, sb)
    got = {}
    for backend in ("cublas", "tensorcore"):
        got[backend] = host(cp, _lt_call(cp, a, b, sa, sb, "bfloat16", backend)).astype(np.float64)
        check(got[backend], want, scale, "bfloat16")
    assert last_route().startswith("ours"), last_route()
    diff = np.abs(got["cublas"] - got["tensorcore"])
    assert (diff <= 2.0**-7 * np.abs(want) + 2.0**-8 * scale).all()


def test_the_rule_sends_torch_s_layout_to_cublaslt_and_the_rest_to_ours(cp):
    rng = np.random.default_rng(32)
    a, b = _operands(rng, 96, 80, 128)      # more than DECODE_ROWS rows and columns
    one = np.float32(1)
    _lt_call(cp, a, b, one, one, backend=None)
    assert last_route().startswith("cuBLASLt"), last_route()
    # at most DECODE_ROWS rows (decode): our kernels, and the rule's reason
    _lt_call(cp, a[:DECODE_ROWS], b, one, one, backend=None)
    assert last_route().startswith("ours") and "decode" in last_route(), last_route()
    # b row-major: not the TN form -> our kernels, the reason in the route's line
    pyblasgemm.matmul(dev(cp, a), dev(cp, np.ascontiguousarray(b)), scale_a=cp.asarray(one), scale_b=cp.asarray(one))
    assert last_route().startswith("ours") and "TN form" in last_route(), last_route()
    with pytest.raises(ValueError, match="backend='cublas' cannot run this float8 product: .*e5m2 x e5m2"):
        _lt_call(cp, a.astype(np.float32).astype(E5M2), b.astype(np.float32).astype(E5M2), one, one)


def test_a_heuristic_refusal_falls_back_or_raises_when_forced(cp, monkeypatch):
    def refuse(desc, device):
        raise cublaslt.LtUnavailable("cuBLASLt refused it: cuBLASLt has no algorithm for this problem")
    monkeypatch.setattr(cublaslt, "fp8_launch", refuse)
    pyblasgemm.get_plan_cache().free()      # (no replay of an earlier test's recorded launch)
    rng = np.random.default_rng(33)
    a, b = _operands(rng, 96, 80, 128)      # past DECODE_ROWS: the rule would take cuBLASLt
    sa, sb = np.float32(0.5), np.float32(2)
    got = _lt_call(cp, a, b, sa, sb, backend=None)
    assert last_route().startswith("ours") and "no algorithm" in last_route(), last_route()
    _, want, scale = reference(a, b, sa, sb)
    check(host(cp, got), want, scale, "bfloat16")
    with pytest.raises(ValueError, match="backend='cublas' cannot run this float8 product: .*no algorithm"):
        _lt_call(cp, a, b, sa, sb)


def test_a_real_heuristic_refusal_of_block_scales(cp):
    """cuBLASLt 13.1 on an H100 has no block-scaled algorithm for 129 rows (seen in the first GPU
    run of this route, 2026-11-28): forced, it raises the refusal before any write (the
    poisoned output untouched); by default block scales run on our kernels, right."""
    _needs_scale_modes(cp, ("blocks", "blocks"))
    rng = np.random.default_rng(34)
    m, n, k = 129, 256, 384
    a, b = _operands(rng, m, n, k)
    sa, sb = _block_scales(rng, m, n, k)
    out = dev(cp, np.full((m, n), np.nan, BF16))
    try:
        _lt_call(cp, a, b, sa, sb, out=out)
    except ValueError as refused:
        assert "backend='cublas' cannot run this float8 product" in str(refused)
        assert np.isnan(host(cp, out).astype(np.float32)).all()
    else:           # a newer cuBLASLt may take it: then it must be right
        _, want, scale = reference(a, b, sa, sb)
        check(host(cp, out), want, scale, "bfloat16")
    got = _lt_call(cp, a, b, sa, sb, backend=None)      # the rule: cuBLASLt, or ours where it refuses
    assert last_route().startswith("cuBLASLt") or (
        last_route().startswith("ours") and "no algorithm" in last_route()), last_route()
    _, want, scale = reference(a, b, sa, sb)
    check(host(cp, got), want, scale, "bfloat16")


def _strided_block_scales(cp, sa, sb):
    """The block scales on the device, a's F-ordered and b's a strided view (the relayout
    reads any element strides in place)."""
    da = cp.asfortranarray(cp.asarray(sa))
    wide = cp.zeros((sb.shape[0], 2 * sb.shape[1]), np.float32)
    wide[:, ::2] = cp.asarray(sb)
    return da, wide[:, ::2]


def test_block_scales_on_cublaslt_replay_and_a_cuda_graph_reads_changed_scales(cp):
    """Block scales past DECODE_ROWS go to cuBLASLt (the rule), their relayout into the
    launch's own buffers (LtBlockScaled): a repeated call replays it on new scales' pointers,
    and a captured call reads what the scales hold at replay, on any element strides."""
    _needs_scale_modes(cp, ("blocks", "blocks"))
    rng = np.random.default_rng(35)
    m, n, k = 256, 384, 640                 # kb = 5: b's relayout rows padded to 8
    a, b = _operands(rng, m, n, k)
    sa, sb = _block_scales(rng, m, n, k)
    da, db = dev(cp, a), dev(cp, np.ascontiguousarray(b.T)).T
    csa, csb = _strided_block_scales(cp, sa, sb)
    out = cp.full((m, n), np.nan, np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    _, want, scale = reference(a, b, sa, sb)
    with stream:
        pyblasgemm.matmul(da, db, out=out, scale_a=csa, scale_b=csb)
        assert last_route().startswith("cuBLASLt: float8 TN") and "BLK128x128" in last_route(), last_route()
        assert isinstance(fp8.last_call().launch, cublaslt.LtBlockScaled)
        first = cp.asnumpy(out)
        check(first, want, scale, "float32")
        # a repeat on other scale arrays of the same layout: the replay, new pointers
        sa2, sb2 = sa * 2, sb * 0.25
        csa2, csb2 = _strided_block_scales(cp, sa2, sb2)
        out[...] = np.nan
        pyblasgemm.matmul(da, db, out=out, scale_a=csa2, scale_b=csb2)
        np.testing.assert_array_equal(cp.asnumpy(out), first * 0.5)
        stream.synchronize()
        stream.begin_capture()
        pyblasgemm.matmul(da, db, out=out, scale_a=csa, scale_b=csb)
        graph = stream.end_capture()
        # on the graph's own stream (it does not wait for the legacy default stream)
        csa[...] = cp.asarray(sa2)
        csb[...] = cp.asarray(sb2)
        out[...] = np.nan
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), first * 0.5)


def test_block_scaled_launch_keeps_one_buffer_pair_per_stream(cp):
    """Two streams never share the relayout's buffers (a call on one could overwrite the
    scales the other's GEMM is about to read)."""
    _needs_scale_modes(cp, ("blocks", "blocks"))
    rng = np.random.default_rng(36)
    m, n, k = 128, 256, 256
    a, b = _operands(rng, m, n, k)
    sa, sb = _block_scales(rng, m, n, k)
    da, db = dev(cp, a), dev(cp, np.ascontiguousarray(b.T)).T
    csa, csb = cp.asarray(sa), cp.asarray(sb)
    outs, streams = [], [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    launch = None
    for s in streams:
        with s:
            outs.append(pyblasgemm.matmul(da, db, scale_a=csa, scale_b=csb, dtype=np.float32))
            assert last_route().startswith("cuBLASLt"), last_route()
            launch = launch or fp8.last_call().launch      # (the second call may replay it)
            s.synchronize()
    assert isinstance(launch, cublaslt.LtBlockScaled)
    mine = [launch._buffers.get(s.ptr) for s in streams]
    assert None not in mine and mine[0][0].data.ptr != mine[1][0].data.ptr
    _, want, scale = reference(a, b, sa, sb)
    for got in outs:
        check(cp.asnumpy(got), want, scale, "float32")


def test_a_cuda_graph_replays_with_a_changed_per_tensor_scale(cp):
    """The scales are device pointers in the descriptor: a captured call reads whatever they
    hold at replay (a first call outside the capture allocates the workspace)."""
    rng = np.random.default_rng(34)
    m, n, k = 64, 256, 512
    a, b = _operands(rng, m, n, k)
    da, db = dev(cp, a), dev(cp, np.ascontiguousarray(b.T)).T
    sa, sb = cp.asarray(np.float32(1.0)), cp.asarray(np.ones(1, np.float32))
    out = cp.empty((m, n), np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        pyblasgemm.matmul(da, db, out=out, scale_a=sa, scale_b=sb, backend="cublas")
        stream.synchronize()
        one = cp.asnumpy(out)
        stream.begin_capture()
        pyblasgemm.matmul(da, db, out=out, scale_a=sa, scale_b=sb, backend="cublas")
        graph = stream.end_capture()
        assert last_route().startswith("cuBLASLt")
        # on the graph's own stream: a non-blocking stream does not wait for the legacy
        # default stream, where these writes raced the replay (an H200 run saw all NaN)
        sa[...] = 4.0
        sb[...] = 0.5
        out[...] = np.nan
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), 2 * one)
    _, want, scale = reference(a, b, np.float32(1), np.float32(1))
    check(one, want, scale, "float32")
