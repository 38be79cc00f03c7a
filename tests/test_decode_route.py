"""The planner's decode route (pyblasgemm/planner/decode.py) on the CPU: exactly the range the H100
run measured it winning (bench/results/gemv_rows_h100_*_2026-11-28_*) goes to the GEMV kernel's
row-block split; everything next to that range keeps the ordinary planner."""
from __future__ import annotations

import dataclasses

import pytest

from pyblasgemm.kernels import gemv
from pyblasgemm.planner import clear_plan_cache, decode, plan
from pyblasgemm.planner.arch import FAMILIES
from pyblasgemm.planner.problem import make_desc

H100 = FAMILIES["sm_90"]


@pytest.fixture(autouse=True)
def _route_on(monkeypatch):
    """The rule as it ships (decode.ENABLED), whatever another test set."""
    monkeypatch.setattr(decode, "ENABLED", True)
    clear_plan_cache()          # (plans are memoized: none made under the other setting is reused)
    yield
    clear_plan_cache()
#: (K, N) of the seven projections measured (Llama-3-8B, Qwen2-7B)
LAYERS = [(4096, 6144), (4096, 4096), (4096, 14336), (14336, 4096), (3584, 4608), (3584, 18944), (18944, 3584)]


def _linear(tokens, k, n, dtype="bf16", **kw):
    """y = x @ W.T (W n x k as torch.nn.Linear holds it), column-major: m = n, n = tokens, transa='T'."""
    return make_desc(n, tokens, k, dtype, transa="T", **kw)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("tokens", [1, 2, 4, 7, 8])
def test_measured_range_takes_the_row_block_split(dtype, tokens):
    for k, n in LAYERS:
        p = plan(n, tokens, k, dtype, transa="T", arch="sm_90")
        assert p.backend == "tensorcore" and p.decomposition == "gemv", p.explain()
        spec = p.launch
        assert spec.split == "rows" and spec.T == tokens and spec.R == n and spec.K == k
        assert spec.ctas == spec.row_tiles and spec.workspace_bytes == 0
        assert p.reason.startswith("decode:")
        # predicted: the fit's rate and fixed cost
        assert p.predicted_s == pytest.approx(n * k * 2 / (decode.STREAM_FRACTION * H100.dram_bw) + decode.FIXED_S)
        # the token side as m (C with `tokens` rows, X = op(A), W = op(B)ᵀ K-contiguous): the same
        # canonical problem
        q = plan(tokens, n, k, dtype, transa="T", transb="N", arch="sm_90")
        assert q.decomposition == "gemv" and gemv.canonical(q.problem).orient == "m", q.explain()
        assert q.launch.split == "rows" and (q.launch.R, q.launch.T) == (n, tokens)


def test_outside_the_range_keeps_the_ordinary_planner():
    k, n = 4096, 4096
    outside = {
        "16 tokens": dict(m=n, n=16, k=k, dtype="bf16", transa="T"),
        "9 tokens": dict(m=n, n=9, k=k, dtype="bf16", transa="T"),
        "float32": dict(m=n, n=1, k=k, dtype="f32", transa="T"),
        "a small weight": dict(m=2048, n=1, k=4096, dtype="bf16", transa="T"),            # 16 MiB
        "an R-contiguous weight": dict(m=n, n=1, k=k, dtype="bf16", transa="N"),
        "an odd K (element loads)": dict(m=n, n=1, k=k + 3, dtype="bf16", transa="T"),
        "a batch": dict(m=n, n=1, k=k, dtype="bf16", transa="T", batch=2),
    }
    for what, kw in outside.items():
        m_, n_, k_, dt = kw.pop("m"), kw.pop("n"), kw.pop("k"), kw.pop("dtype")
        p = plan(m_, n_, k_, dt, arch="sm_90", **kw)
        assert p.decomposition != "gemv", (what, p.explain())
    # more row blocks than resident CTAs (grid-stride): not measured, not taken
    spec, why = decode.decode_rule(_linear(1, 4096, 128256 * 4), 132)
    assert spec is None and "grid-stride" in why
    # other devices: an A100, and an sm_90 with memory faster than the H200's (not measured);
    # H200 memory takes the route (measured there too)
    assert plan(n, 1, k, "bf16", transa="T", arch="sm_80").decomposition != "gemv"
    h200 = dataclasses.replace(H100, name="H200 (test)", dram_bw=4.8e12)
    assert plan(n, 1, k, "bf16", transa="T", arch=h200).decomposition == "gemv"
    faster = dataclasses.replace(H100, name="sm_90 with 6 TB/s (test)", dram_bw=6e12)
    assert plan(n, 1, k, "bf16", transa="T", arch=faster).decomposition != "gemv"
    # host arrays, a forced backend
    assert plan(n, 1, k, "bf16", transa="T", arch="sm_90", backend="cublas").backend == "cublas"


def test_rule_reasons_name_the_limit():
    assert decode.decode_rule(_linear(16, 4096, 4096), 132)[1] == "16 tokens: the decode route takes at most 8"
    spec, why = decode.decode_rule(_linear(1, 4096, 2048), 132)
    assert spec is None and "MiB weight: below the route's 30 MiB" in why
    spec, why = decode.decode_rule(_linear(1, 4096, 4096, "f32"), 132)
    assert spec is None and "hgemm / bgemm" in why
    spec, why = decode.decode_rule(_linear(4, 3584, 4608), 132)      # the smallest layer measured: taken
    assert spec is not None and spec.split == "rows" and spec.weight_bytes >= decode.MIN_WEIGHT_BYTES


def test_matmuls_one_row_view_takes_the_route():
    """pyblasgemm.matmul(x, W.T) with x of one row is planned column-major as given: NN, m = 1,
    lda = 1 (the device run of e428603 found the route refused there: the unit token stride
    denied the activations their vectors). One token reads no stride: the route takes it."""
    p = plan(1, 7168, 4608, "f16", arch="sm_90")
    assert p.problem.lda == 1 and p.decomposition == "gemv", p.explain()
    assert p.launch.split == "rows" and p.launch.T == 1 and p.launch.R == 7168


def test_route_off_keeps_the_ordinary_planner(monkeypatch):
    """decode.ENABLED False (the switch that gives these shapes back to cuBLAS): the measured range
    plans as before, never on the GEMV kernel."""
    monkeypatch.setattr(decode, "ENABLED", False)
    clear_plan_cache()
    for tokens in (1, 8):
        p = plan(4096, tokens, 4096, "bf16", transa="T", arch="sm_90")
        assert p.decomposition != "gemv" and not p.reason.startswith("decode:"), p.explain()


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_the_band_past_the_decode_route_keeps_cublas(arch):
    """x @ W.T with 9-64 tokens and a measured-size weight runs cuBLAS under 'auto' (our tile
    kernels measured 0.45-0.92x there), says so, and still runs ours when forced; outside the
    band (65 tokens, a small weight, the other orientation, an epilogue-free batch) the model
    decides as before."""
    lo, hi = decode.CUBLAS_BAND_TOKENS
    for t in (lo, 16, hi):
        p = plan(14336, t, 4096, "bf16", transa="T", arch=arch)
        assert p.backend == "cublas" and f"{t} tokens" in p.reason, p.explain()
        forced = plan(14336, t, 4096, "bf16", transa="T", arch=arch, backend="tensorcore")
        assert forced.backend == "tensorcore"
    outside = [dict(m=14336, n=hi + 1, k=4096, transa="T"),      # past the band
               dict(m=2048, n=16, k=4096, transa="T"),           # 16 MiB weight
               dict(m=16, n=14336, k=4096, transa="T"),          # the other orientation
               dict(m=14336, n=16, k=4096, transa="N")]          # an R-contiguous weight
    for kw in outside:
        m_, n_, k_ = kw.pop("m"), kw.pop("n"), kw.pop("k")
        assert decode.cublas_band_reason(make_desc(m_, n_, k_, "bf16", **kw)) is None, (m_, n_, k_, kw)
