"""Epilogues (bias, activations, pre-activation output, int8 dequantization) on gemm and matmul:
float64 references on fresh random data, every activation and bias axis, NaN/Inf like the
unfused sequence, errors before any work; NumPy everywhere, CuPy on a GPU (the ``xp`` fixture)."""
import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.epilogue import ACTIVATIONS
from conftest import to_host
from epilogue_ref import REF, UNIT, assert_nan_and_inf_like_unfused, residual_case


def test_every_activation_has_a_reference_and_a_device_code():
    assert set(ACTIVATIONS) == set(REF) - {None}
    codes = [a.code for a in ACTIVATIONS.values()]
    assert len(set(codes)) == len(codes) and 0 not in codes
    from pyblasgemm.kernels.jit import INCLUDE_DIR

    header = (INCLUDE_DIR / "pyblasgemm/epilogue/activation.cuh").read_text()
    for a in ACTIVATIONS.values():       # 'gelu_tanh' -> kActGeluTanh
        enum = "kAct" + "".join(part.capitalize() for part in a.name.split("_"))
        assert f"{enum} = {a.code}" in header, a.name
        assert f"case {enum}:" in header, a.name


def _data(rng, shape, dtype):
    return rng.uniform(-2, 2, size=shape).astype(dtype)


def _check(got, v64, act, dtype, scale, what=""):
    """got vs act(v64), within the output's rounding plus the accumulation's."""
    want = REF[act](v64)
    err = np.abs(np.asarray(to_host(got), dtype=np.float64) - want)
    tol = 4 * UNIT[dtype] * (np.abs(want) + scale) + 64 * 2.0**-24 * scale
    assert np.all(err <= tol), (what, float(np.max(err - tol)))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
@pytest.mark.parametrize("act", [None, *ACTIVATIONS])
@pytest.mark.parametrize("axis", [None, "cols", "rows"])
@pytest.mark.parametrize("mnk", [(1, 1, 1), (7, 33, 5), (33, 7, 65)])
def test_matmul_epilogue_matches_float64(xp, dtype, act, axis, mnk):
    m, n, k = mnk
    rng = np.random.default_rng(hash((m, n, k, str(act), axis)) % 2**32)
    x, w = _data(rng, (m, k), dtype), _data(rng, (k, n), dtype)
    out_dtype = np.float32 if dtype is ml_dtypes.bfloat16 else dtype     # NumPy's result type
    bias = {None: None, "cols": _data(rng, (n,), dtype), "rows": _data(rng, (m, 1), dtype)}[axis]
    pre = xp.full((m, n), np.nan, out_dtype)          # poisoned: every entry must be written
    got = pyblasgemm.matmul(xp.asarray(x), xp.asarray(w), activation=act, preactivation_out=pre,
                            bias=None if bias is None else xp.asarray(bias))
    assert got.dtype == out_dtype and got.shape == (m, n)
    v64 = x.astype(np.float64) @ w.astype(np.float64) + (0 if bias is None else bias.astype(np.float64))
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + 1
    _check(got, v64, act, out_dtype, scale, "y")
    _check(pre, v64, None, out_dtype, scale, "pre-activation")


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("ta,tb", [("N", "N"), ("N", "T"), ("T", "N"), ("T", "T")])
def test_gemm_epilogue_with_beta_and_every_transpose(xp, dtype, ta, tb):
    rng = np.random.default_rng(7)
    m, n, k = 13, 9, 17
    a = _data(rng, (m, k) if ta == "N" else (k, m), dtype)
    b = _data(rng, (k, n) if tb == "N" else (n, k), dtype)
    c0 = _data(rng, (m, n), dtype)
    bias = _data(rng, (n,), dtype)
    out = xp.array(c0, copy=True)          # (asarray would alias c0 on the host)
    res = pyblasgemm.gemm(ta, tb, xp.asarray(a), xp.asarray(b), out, alpha=0.5, beta=-1.5,
                          bias=xp.asarray(bias), activation="gelu")
    assert res is out
    op = (lambda z, t: z.astype(np.float64) if t == "N" else z.astype(np.float64).T)
    v64 = 0.5 * op(a, ta) @ op(b, tb) - 1.5 * c0.astype(np.float64) + bias.astype(np.float64)
    scale = 0.5 * np.abs(op(a, ta)) @ np.abs(op(b, tb)) + 1.5 * np.abs(c0) + 1
    _check(out, v64, "gelu", dtype, scale)


def test_gemm_epilogue_beta_zero_never_reads_nan_out(xp):
    rng = np.random.default_rng(8)
    a, b = _data(rng, (6, 4), np.float32), _data(rng, (4, 5), np.float32)
    out = xp.full((6, 5), np.nan, np.float32)
    pyblasgemm.gemm("N", "N", xp.asarray(a), xp.asarray(b), out, beta=0.0, activation="relu")
    assert not np.isnan(to_host(out)).any()


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_nan_and_inf_propagate_like_the_unfused_sequence(xp, act):
    x = np.ones((4, 3), np.float32)
    x[1, 0] = np.nan
    x[2, :] = np.inf                      # +inf row: inf·1 sums to +inf
    w = np.ones((3, 2), np.float32)
    y = to_host(pyblasgemm.matmul(xp.asarray(x), xp.asarray(w), activation=act))
    want = REF[act](x.astype(np.float64) @ w.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(want))


@pytest.mark.parametrize("out_dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("act", [None, "relu", "silu"])
def test_int8_dequantize_bias_activation(xp, out_dtype, act):
    rng = np.random.default_rng(9)
    m, n, k = 17, 12, 70
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    sa = rng.uniform(1e-3, 1e-2, m).astype(np.float32)
    sb = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    bias = _data(rng, (n,), np.float32).astype(out_dtype)
    got = pyblasgemm.matmul(xp.asarray(a), xp.asarray(b), scale_a=xp.asarray(sa), scale_b=xp.asarray(sb),
                            bias=xp.asarray(bias), activation=act, dtype=out_dtype)
    assert got.dtype == out_dtype
    exact = a.astype(np.float64) @ b.astype(np.float64)          # int32 holds it exactly here
    v64 = sa[:, None].astype(np.float64) * sb.astype(np.float64) * exact + bias.astype(np.float64)
    _check(got, v64, act, out_dtype, np.abs(v64) + 1)
    g = pyblasgemm.gemm("N", "N", xp.asarray(a), xp.asarray(b), scale_a=xp.asarray(sa),
                        scale_b=xp.asarray(sb), bias=xp.asarray(bias), activation=act,
                        out=xp.empty((m, n), out_dtype))
    np.testing.assert_array_equal(np.asarray(to_host(g), np.float64), np.asarray(to_host(got), np.float64))


def test_batched_and_vector_operands_broadcast_like_matmul(xp):
    rng = np.random.default_rng(10)
    x = _data(rng, (3, 5, 8), np.float32)
    w = _data(rng, (8, 4), np.float32)
    bias = _data(rng, (4,), np.float32)
    got = pyblasgemm.matmul(xp.asarray(x), xp.asarray(w), bias=xp.asarray(bias), activation="relu")
    want = REF["relu"](x.astype(np.float64) @ w.astype(np.float64) + bias)
    np.testing.assert_allclose(to_host(got), want, rtol=1e-5, atol=1e-5)
    v = _data(rng, (8,), np.float32)            # vector @ matrix: one row; bias per column
    got = pyblasgemm.matmul(xp.asarray(v), xp.asarray(w), bias=xp.asarray(bias), activation="gelu")
    assert got.shape == (4,)
    np.testing.assert_allclose(to_host(got), REF["gelu"](v.astype(np.float64) @ w + bias), rtol=1e-5, atol=1e-5)
    rows = _data(rng, (5, 1), np.float32)       # matrix @ vector: one column; bias per row
    got = pyblasgemm.matmul(xp.asarray(x[0]), xp.asarray(v), bias=xp.asarray(rows))
    assert got.shape == (5,)
    np.testing.assert_allclose(to_host(got), x[0].astype(np.float64) @ v + rows[:, 0], rtol=1e-5, atol=1e-5)


def test_epilogue_results_are_reproducible(xp):
    rng = np.random.default_rng(11)
    x, w = xp.asarray(_data(rng, (64, 300), np.float16)), xp.asarray(_data(rng, (300, 48), np.float16))
    bias = xp.asarray(_data(rng, (48,), np.float16))
    runs = [to_host(pyblasgemm.matmul(x, w, bias=bias, activation="gelu")) for _ in range(3)]
    for r in runs[1:]:
        np.testing.assert_array_equal(r.view(np.uint16), runs[0].view(np.uint16))


@pytest.mark.parametrize("kw,exc,words", [
    (dict(activation="tanh"), ValueError, ["activation='tanh'", "'gelu'"]),
    (dict(bias=np.ones(5, np.float32)), ValueError, ["bias has shape (5,)", "(3,)", "(4, 1)"]),
    (dict(bias=np.ones(3, np.float64)), TypeError, ["bias has dtype float64", "float32"]),
    (dict(bias=np.ones(3, np.float16)), TypeError, ["bias has dtype float16", "float32"]),
    (dict(preactivation_out=np.empty((3, 4), np.float32)), ValueError, ["preactivation_out", "(4, 3)"]),
    (dict(scale_a=np.ones(4, np.float32), scale_b=np.ones(3, np.float32)), TypeError, ["int8", "float32"]),
])
def test_bad_epilogue_arguments_raise_before_any_work(kw, exc, words):
    a, b = np.ones((4, 2), np.float32), np.ones((2, 3), np.float32)
    out = np.full((4, 3), 7.0, np.float32)
    with pytest.raises(exc) as e:
        pyblasgemm.matmul(a, b, out=out, **kw)
    for word in words:
        assert word in str(e.value), (word, str(e.value))
    assert (out == 7).all()                 # nothing half-written


def test_gemm_epilogue_checks_sizes_and_scalars_as_gemm_does():
    a, b = np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)
    with pytest.raises(ValueError, match="inner dimensions 3 and 4 must agree"):
        pyblasgemm.gemm("N", "N", a, b, bias=np.ones(5, np.float32))
    with pytest.raises(pyblasgemm.BlasArgumentError, match="parameter 6"):
        pyblasgemm.gemm("N", "N", a, np.ones((3, 5), np.float32), alpha=1e39, bias=np.ones(5, np.float32))


def test_int8_epilogue_rules():
    a = np.ones((4, 2), np.int8)
    with pytest.raises(ValueError, match="scale_b"):
        pyblasgemm.matmul(a, a.T, scale_a=np.ones(4, np.float32))
    with pytest.raises(TypeError, match="need dequantization"):
        pyblasgemm.matmul(a, a.T, activation="relu")
    with pytest.raises(TypeError, match="scale_a must be float32"):
        pyblasgemm.matmul(a, a.T, scale_a=np.ones(4, np.float64), scale_b=np.ones(4, np.float32))
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        pyblasgemm.matmul(a, a.T, scale_a=np.ones(4, np.float32), scale_b=np.ones(4, np.float32),
                          dtype=np.int32)
    c = np.ones((2, 2), np.complex64)
    with pytest.raises(TypeError, match="real outputs"):
        pyblasgemm.matmul(c, c, activation="relu")
    np.testing.assert_array_equal(pyblasgemm.matmul(c, c, bias=np.ones(2, np.complex64)),
                                  np.matmul(c, c) + 1)


def test_fusion_guide_numbers_are_the_measured_ones():
    """docs/guide/fusion.rst's table is read off the two committed fusion results files."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    text = (root / "docs/guide/fusion.rst").read_text()
    for gpu in ("h100", "h200"):
        name = f"fusion_{gpu}_2026-11-24_2e29ae9.json"
        assert name in text
        doc = json.loads((root / "bench/results" / name).read_text())
        assert doc["device"]["name"].startswith("NVIDIA " + gpu.upper())
        for case in doc["cases"]:
            if "ratio_steady" in case:
                assert f"{case['ratio_steady']:.2f}" in text, (gpu, case["case"], case.get("m"))
            if "overhead" in case:
                assert f"+{case['overhead'] * 100:.0f} %" in text, gpu
    assert "_static/perf/fusion_2026-11-24_2e29ae9.png" in text
    assert (root / "docs/_static/perf/fusion_2026-11-24_2e29ae9.png").stat().st_size > 10_000


def test_fusion_guide_session_11_numbers_are_the_measured_ones():
    """The second table and its paragraph quote bench/results/fusion_h100_2026-11-24_9c2145f.json."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    text = (root / "docs/guide/fusion.rst").read_text()
    name = "fusion_h100_2026-11-24_9c2145f.json"
    assert name in text
    doc = json.loads((root / "bench/results" / name).read_text())
    assert doc["device"]["name"].startswith("NVIDIA H100") and doc["git_sha"] == "9c2145f"
    section = text[text.index(name):]
    for case in doc["cases"]:
        if "ratio_steady" in case:
            assert f"{case['ratio_steady']:.2f}" in section, (case["case"], case.get("m"))
        if "overhead" in case:
            assert f"+{case['overhead'] * 100:.0f} %" in section
    small = [c for c in doc["cases"] if c["case"] == "grouped experts"][-1]
    us = {k: round(v["steady_s"] * 1e6) for k, v in small["contenders"].items()}
    assert small["route"].startswith("pyblasgemm grouped kernel")
    assert (f"{us['pyblasgemm grouped_matmul']} µs a call against\n{us['torch loop of matmul']} µs" in section
            and f"{us['torch._grouped_mm']} µs for ``_grouped_mm``" in section)


def _grouped_experts_run(sha):
    """(fusion guide text on one line, µs a call per contender) of the last small grouped-experts
    case of bench/results/fusion_h100_2026-11-24_<sha>.json, which ran our grouped kernel."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    text = " ".join((root / "docs/guide/fusion.rst").read_text().split())
    doc = json.loads((root / f"bench/results/fusion_h100_2026-11-24_{sha}.json").read_text())
    small = [c for c in doc["cases"] if c["case"] == "grouped experts"][-1]
    assert small["route"].startswith("pyblasgemm grouped kernel") and doc["git_sha"] == sha
    return text, {k: round(v["steady_s"] * 1e6) for k, v in small["contenders"].items()}


def test_fusion_guide_pinned_ring_numbers_are_the_measured_ones():
    """The grouped launch through pinned buffers: bench/results/fusion_h100_2026-11-24_844d8db.json."""
    text, us = _grouped_experts_run("844d8db")
    assert (f"``fusion_h100_2026-11-24_844d8db.json``) the call takes {us['pyblasgemm grouped_matmul']} µs "
            f"against {us['torch loop of matmul']} µs for PyTorch's loop and {us['torch._grouped_mm']} µs") in text


def test_fusion_guide_replay_numbers_are_the_measured_ones():
    """The expert form's call-signature replay: bench/results/fusion_h100_2026-11-24_ae44776.json."""
    text, us = _grouped_experts_run("ae44776")
    ratio = us["torch._grouped_mm"] / us["pyblasgemm grouped_matmul"]
    assert (f"``fusion_h100_2026-11-24_ae44776.json``): the call takes {us['pyblasgemm grouped_matmul']} µs "
            f"against {us['torch loop of matmul']} µs for PyTorch's loop and {us['torch._grouped_mm']} µs for "
            f"``_grouped_mm`` ({ratio:.2f}x of it)") in text


def test_fusion_guide_follow_up_numbers_are_the_measured_ones():
    """The H100-only follow-up paragraph quotes bench/results/fusion_h100_2026-11-24_d29ef8e.json."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    text = (root / "docs/guide/fusion.rst").read_text()
    para = text[text.index("fusion_h100_2026-11-24_d29ef8e.json"):]
    para = para[:para.index("The int8 rows")]
    doc = json.loads((root / "bench/results/fusion_h100_2026-11-24_d29ef8e.json").read_text())
    quoted = [c for c in doc["cases"] if c["case"] == "fused_mlp gelu"
              or (c["case"] == "bias+gelu" and c.get("dtype") == "bfloat16")]
    assert len(quoted) == 5
    for case in quoted:
        assert f"{case['ratio_steady']:.2f}" in para, (case["case"], case.get("m"))


def test_fusion_figure_is_drawn_from_the_results(tmp_path):
    pytest.importorskip("matplotlib")
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("pbg_bench_fusion", root / "bench/fusion.py")
    fusion = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fusion)
    out = tmp_path / "fusion.png"
    fusion.plot([root / f"bench/results/fusion_{g}_2026-11-24_2e29ae9.json" for g in ("h100", "h200")], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_stateful_matmul_with_an_epilogue(dtype):
    """Matmul(..., bias=, activation=, preactivation_out=): each execute is matmul's epilogue
    call, also on new operands of the same layout."""
    import cupy

    rng = np.random.default_rng(12)
    x, w = _data(rng, (2, 24, 40), dtype), _data(rng, (40, 16), dtype)
    bias = cupy.asarray(_data(rng, (16,), dtype))
    out_dtype = x.dtype                                     # the stateful form's C type
    out = cupy.full((2, 24, 16), np.nan, out_dtype)
    pre = cupy.full((2, 24, 16), np.nan, out_dtype)
    mm = pyblasgemm.Matmul(cupy.asarray(x), cupy.asarray(w), out=out, bias=bias, activation="silu",
                           preactivation_out=pre)
    for xs in (x, _data(rng, (2, 24, 40), dtype)):
        res = mm.execute(a=cupy.asarray(xs))
        assert res is out
        v64 = xs.astype(np.float64) @ w.astype(np.float64) + to_host(bias).astype(np.float64)
        scale = np.abs(xs.astype(np.float64)) @ np.abs(w.astype(np.float64)) + 1
        _check(out, v64, "silu", dtype if dtype is not ml_dtypes.bfloat16 else ml_dtypes.bfloat16, scale)
        _check(pre, v64, None, dtype, scale)
    with pytest.raises(ValueError, match="bias has shape"):
        pyblasgemm.Matmul(cupy.asarray(x), cupy.asarray(w), bias=cupy.ones(5, out_dtype))
    with pytest.raises(ValueError, match="out must have dtype"):
        pyblasgemm.Matmul(cupy.asarray(x), cupy.asarray(w), out=cupy.empty((2, 24, 15), out_dtype), bias=bias)


@pytest.mark.gpu
def test_a_forced_backend_keeps_the_cublaslt_route_off(monkeypatch):
    import cupy

    from pyblasgemm.epilogue import last_route

    x, w = cupy.ones((32, 16), np.float16), cupy.ones((16, 24), np.float16)
    monkeypatch.setenv("PYBLASGEMM_BACKEND", "tensorcore")
    pyblasgemm.clear_plan_cache()
    try:
        pyblasgemm.matmul(x, w, bias=cupy.ones(24, np.float16), activation="relu")
        assert not last_route().startswith("cuBLASLt"), last_route()
    finally:
        monkeypatch.delenv("PYBLASGEMM_BACKEND")
        pyblasgemm.clear_plan_cache()


def _needs_hopper():
    import cupy

    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("the fused epilogue runs in the Hopper (sm_90a) kernel")


#: (m, n, k) of the user's product: 1, 7, 33, 1000 and sizes that are no multiple of a tile; k
#: and n multiples of 8 (TMA reads rows of 16-byte multiples: others are planned elsewhere)
FUSED_SHAPES = [(1, 8, 8), (7, 40, 64), (33, 136, 72), (1000, 264, 520), (257, 392, 4104)]


@pytest.mark.gpu
@pytest.mark.parametrize("decomposition", ["sliced", "streamk", "hybrid", "splitk_parallel"])
@pytest.mark.parametrize("dtype,out_dtype", [(np.float16, np.float16), (ml_dtypes.bfloat16, ml_dtypes.bfloat16),
                                             (ml_dtypes.bfloat16, np.float32)])
def test_fused_hopper_kernel_every_decomposition(monkeypatch, decomposition, dtype, out_dtype):
    """Our Hopper kernel with the epilogue in its store (each decomposition forced; split-k
    applies it once, after the reduction): every activation, both bias axes, the
    pre-activation, residual through beta, padded leading dimensions and transposes, against
    float64; poisoned outputs; bitwise repeatable."""
    import cupy

    from pyblasgemm.epilogue import last_route

    _needs_hopper()
    monkeypatch.setenv("PYBLASGEMM_BACKEND", "tensorcore")
    monkeypatch.setenv("PYBLASGEMM_DECOMPOSITION", decomposition)
    pyblasgemm.clear_plan_cache()
    rng = np.random.default_rng(hash((decomposition, str(dtype), str(out_dtype))) % 2**32)
    fused = 0
    try:
        for m, n, k in FUSED_SHAPES:
            x, w = _data(rng, (m, k), dtype), _data(rng, (k, n), dtype)
            try:
                pyblasgemm.gemm("N", "N", cupy.asarray(x), cupy.asarray(w), cupy.empty((m, n), out_dtype))
            except NotImplementedError as e:      # no config of this decomposition fits (m = 1, short K)
                assert "no kernel config is valid" in str(e) and str(e).split(": ")[-1], (m, n, k, e)
                continue
            gx, gw = cupy.asarray(x), cupy.asarray(w)
            scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + 1
            for act, axis in (("gelu", "cols"), ("silu", "rows"), ("relu", None), ("gelu_tanh", "cols"), (None, "rows")):
                bias = {None: None, "cols": _data(rng, (n,), out_dtype), "rows": _data(rng, (m, 1), out_dtype)}[axis]
                v64 = x.astype(np.float64) @ w.astype(np.float64) + (0 if bias is None else bias.astype(np.float64))
                pre = cupy.full((m, n), np.nan, out_dtype)
                out = cupy.full((m, n), np.nan, out_dtype)
                kw = dict(activation=act, preactivation_out=pre, bias=None if bias is None else cupy.asarray(bias))
                y = pyblasgemm.gemm("N", "N", gx, gw, out, **kw)
                route = last_route()
                fused += route.startswith("pyblasgemm kernel")
                _check(y, v64, act, out_dtype, scale, (m, n, k, act, axis, route))
                _check(pre, v64, None, out_dtype, scale, (m, n, k, "pre", route))
                again = pyblasgemm.gemm("N", "N", gx, gw, cupy.full((m, n), np.nan, out_dtype), **kw)
                assert cupy.array_equal(again, y), (m, n, k, act, "not bitwise repeatable")
            # residual through beta, transposed operands with padded leading dimensions
            out, v64, scale = residual_case(rng, dtype, out_dtype, m, n, k)
            _check(out, v64, "gelu", out_dtype, scale, (m, n, k, "beta", last_route()))
    finally:
        monkeypatch.delenv("PYBLASGEMM_BACKEND")
        monkeypatch.delenv("PYBLASGEMM_DECOMPOSITION")
        pyblasgemm.clear_plan_cache()
    assert fused >= 5, f"only {fused} calls took the fused kernel ({decomposition})"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_repeated_fused_calls_take_each_calls_own_arrays(dtype):
    """A repeated fused matmul (same signature) replays the launch on the new call's operands,
    bias and result: each result matches its own float64 reference, and says the same route."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(21)
    out_dtype = np.float32 if dtype is ml_dtypes.bfloat16 else dtype
    routes = []
    for act in ("gelu", "gelu", "gelu", "silu"):
        x, w = _data(rng, (48, 64), dtype), _data(rng, (64, 40), dtype)
        b = _data(rng, (40,), out_dtype)
        y = pyblasgemm.matmul(cupy.asarray(x), cupy.asarray(w), bias=cupy.asarray(b), activation=act)
        routes.append(last_route())
        v64 = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
        _check(y, v64, act, out_dtype, np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + 1,
               (act, routes[-1]))
    assert routes[0] == routes[1] == routes[2], routes


@pytest.mark.gpu
def test_a_bfloat16_bias_on_a_float32_result_runs_fused():
    """bfloat16 operands give a float32 result (NumPy's type); a bias in the operands' type is
    widened exactly and the call still runs fused (first call and replayed ones)."""
    import cupy

    from pyblasgemm.epilogue import last_route

    _needs_hopper()
    rng = np.random.default_rng(22)
    dtype = ml_dtypes.bfloat16
    for _ in range(3):
        x, w = _data(rng, (1000, 520), dtype), _data(rng, (520, 264), dtype)
        b = _data(rng, (264,), dtype)
        y = pyblasgemm.matmul(cupy.asarray(x), cupy.asarray(w), bias=cupy.asarray(b), activation="gelu",
                              backend="tensorcore")
        assert y.dtype == np.float32 and last_route().startswith("pyblasgemm kernel"), last_route()
        v64 = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
        _check(y, v64, "gelu", np.float32, np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_fused_hopper_kernel_propagates_nan_and_inf(act):
    _needs_hopper()
    assert_nan_and_inf_like_unfused(act, "pyblasgemm kernel")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_cublaslt_fuses_relu_and_the_tanh_gelu_and_says_so(dtype):
    """Where cuBLASLt has the epilogue (relu, the tanh GELU; bias along D's rows; the GELU's
    pre-activation), the call is one fused cublasLtMatmul; elsewhere the unfused route."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(13)
    x, w = _data(rng, (64, 96), dtype), _data(rng, (96, 48), dtype)
    out_dtype = np.float32 if dtype is ml_dtypes.bfloat16 else dtype       # matmul's result type
    b = _data(rng, (48,), out_dtype)
    gx, gw, gb = cupy.asarray(x), cupy.asarray(w), cupy.asarray(b)
    pre = cupy.full((64, 48), np.nan, out_dtype)
    lt = dict(backend="cublas")      # (auto: our Hopper kernel's fused store where the plan picks it)
    y = pyblasgemm.matmul(gx, gw, bias=gb, activation="gelu_tanh", preactivation_out=pre, **lt)
    assert last_route() == "cuBLASLt epilogue GELU_AUX_BIAS (fused in the GEMM)"
    v64 = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + 1
    _check(y, v64, "gelu_tanh", out_dtype, scale)
    _check(pre, v64, None, out_dtype, scale)
    y = pyblasgemm.matmul(gx, gw, bias=gb, activation="relu", **lt)
    assert last_route() == "cuBLASLt epilogue RELU_BIAS (fused in the GEMM)"
    _check(y, v64, "relu", out_dtype, scale)
    c = cupy.asarray(_data(rng, (64, 48), out_dtype))
    g = pyblasgemm.gemm("N", "N", gx, gw, cupy.array(c, copy=True), alpha=0.5, beta=2.0, bias=gb, **lt)
    assert last_route() == "cuBLASLt epilogue BIAS (fused in the GEMM)"
    _check(g, 0.5 * (v64 - b) + 2.0 * to_host(c).astype(np.float64) + b, None, out_dtype, scale + 4 * np.abs(to_host(c)))
    strided = cupy.asarray(_data(rng, (96,), out_dtype))[::2]          # a bias with stride 2
    y = pyblasgemm.matmul(gx, gw, bias=strided, activation="relu", **lt)
    assert last_route().startswith("GPU: the planned GEMM")
    _check(y, v64 - b + to_host(strided).astype(np.float64), "relu", out_dtype, scale)
    unfused = [dict(activation="gelu"), dict(bias=cupy.asarray(_data(rng, (64, 1), out_dtype))),
               dict(activation="relu", preactivation_out=pre)]
    for kw in unfused:
        pyblasgemm.matmul(gx, gw, **kw, **lt)
        assert last_route().startswith("GPU: the planned GEMM"), (kw, last_route())
    if dtype is np.float16:                      # mixed operand dtypes: NumPy's promotion, unfused
        w32 = w.astype(np.float32)
        y = pyblasgemm.matmul(gx, cupy.asarray(w32), bias=cupy.asarray(b.astype(np.float32)), activation="relu")
        assert y.dtype == np.float32 and last_route().startswith("GPU: the planned GEMM")
        _check(y, v64, "relu", np.float32, scale)
    same = cupy.empty((64, 48), out_dtype)       # the pre-activation written into the result itself
    y = pyblasgemm.matmul(gx, gw, bias=gb, activation="gelu_tanh", preactivation_out=same, out=same, **lt)
    assert last_route().startswith("GPU: the planned GEMM") and y is same
    _check(same, v64, "gelu_tanh", out_dtype, scale)


@pytest.mark.parametrize("sa,sb", [((2, 3), (4, 5)), ((2, 2, 3), (3, 3, 4)), ((), (2, 2))])
def test_matmul_with_an_epilogue_refuses_shapes_in_numpys_words(sa, sb):
    a, b = np.ones(sa, np.float32), np.ones(sb, np.float32)
    with pytest.raises(ValueError) as want:
        np.matmul(a, b)
    with pytest.raises(ValueError) as got:
        pyblasgemm.matmul(a, b, activation="relu")
    assert str(got.value) == str(want.value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_the_unfused_route_bound_as_one_launch_gives_the_passes_bits(dtype, act):
    """Where C is the accumulation type (float32, float64) the unfused route runs as one bound
    launch (the planned product into C, then the pass in place: execute.ProductThenPass) and is
    replayed by the call signature: its bits are the product's, then the CuPy elementwise
    pass's, on the first call, on replays and with the pre-activation out; the route says
    'unfused'."""
    import cupy

    from pyblasgemm import execute
    from pyblasgemm.epilogue import last_route
    from pyblasgemm.kernels.epilogue_ops import apply_device
    from pyblasgemm.epilogue import Epilogue

    rng = np.random.default_rng(31)
    for m, n, k in ((64, 64, 64), (1, 7, 33), (257, 129, 100)):
        x, w = cupy.asarray(_data(rng, (m, k), dtype)), cupy.asarray(_data(rng, (k, n), dtype))
        b = cupy.asarray(_data(rng, (n,), dtype))
        calls = []
        real = execute.ProductThenPass.__call__

        def counted(self, *args, **kwargs):
            calls.append(1)
            return real(self, *args, **kwargs)
        execute.ProductThenPass.__call__ = counted
        try:
            got = [pyblasgemm.matmul(x, w, bias=b, activation=act) for _ in range(3)]
            route = last_route()
        finally:
            execute.ProductThenPass.__call__ = real
        if not route.startswith("unfused"):
            continue            # a fused route took it (cuBLASLt's relu): not this test's
        assert len(calls) == 3, (m, n, k, act, route)
        want = cupy.empty((m, n), dtype)
        t = pyblasgemm.matmul(x, w)
        apply_device(Epilogue("cols", ACTIVATIONS[act], False, False), t, None, None, None, b, None, None,
                     None, want)
        for y in got:
            assert y.dtype == dtype and bool((y == want).all()), (m, n, k, act)
        pre = cupy.full((m, n), np.nan, dtype)
        y = pyblasgemm.matmul(x, w, bias=b, activation=act, preactivation_out=pre)
        assert bool((y == want).all()) and bool((pre == t + b).all())
