"""Batch invariance (``invariant=True``): a row of the result has the same bits whatever other
rows are computed with it, in every form (matmul, gemm, the BLAS form, grouped_matmul, the
epilogue), on the host and on the GPU; the planner keeps one configuration and no split of K
across the row count. The checker itself is shown to catch a product that is not invariant.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.backends import host
from pyblasgemm.planner import plan, plan_for
from pyblasgemm.planner.arch import FAMILIES
from pyblasgemm.planner.invariant import REFERENCE_SIZES, invariant_config
from pyblasgemm.planner.problem import make_desc

gpu = pytest.mark.gpu

ROWS = 300          # the "batches of every size 1..300"


def _data(xp, rows, k, n, dtype, seed=0):
    """Operands whose sums have many terms of mixed sign and magnitude (so a different summation
    order shows in the last bits)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)) * np.exp2(rng.integers(-6, 7, (rows, k)))
    w = rng.standard_normal((n, k)) * np.exp2(rng.integers(-6, 7, (n, k)))
    if np.dtype(dtype).kind == "i":
        x, w = rng.integers(-128, 128, (rows, k)), rng.integers(-128, 128, (n, k))
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal((rows, k))
        w = w + 1j * rng.standard_normal((n, k))
    return xp.asarray(x.astype(dtype)), xp.asarray(w.astype(dtype))


def batch_mismatches(product, x, sizes=range(1, ROWS + 1), seed=1) -> int:
    """Elements that differ between ``product`` of all of ``x``'s rows and ``product`` of a
    batch of ``size`` consecutive rows (a start drawn per size), over ``sizes``; and rows
    alone, each at its own address (a slice) and as a fresh array."""
    whole = _host(product(x))
    rng = np.random.default_rng(seed)
    bad = 0
    for size in sizes:
        start = int(rng.integers(0, x.shape[0] - size + 1))
        bad += int((_host(product(x[start:start + size])) != whole[start:start + size]).sum())
    for i in range(0, x.shape[0], 37):
        bad += int((_host(product(x[i:i + 1].copy())) != whole[i:i + 1]).sum())
    return bad


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def test_the_checker_catches_a_product_that_depends_on_the_batch():
    """A product whose rows change (in one last bit) when other rows join is caught: the
    bitwise tests below can fail."""
    x, w = _data(np, 40, 16, 8, np.float32)

    def shaky(rows):
        out = rows @ w.T
        return out if rows.shape[0] < 7 else np.nextafter(out, np.inf)
    assert batch_mismatches(shaky, x, sizes=range(1, 41)) > 0
    assert batch_mismatches(lambda rows: pyblasgemm.matmul(rows, w.T, invariant=True), x,
                            sizes=range(1, 41)) == 0


# ---------------------------------------------------------------------------------------------
# the host: every form, bitwise


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                                   np.complex64, np.int8])
def test_matmul_rows_alone_and_in_every_batch_size_have_one_set_of_bits(dtype):
    x, w = _data(np, ROWS, 96, 24, dtype)
    assert batch_mismatches(lambda rows: pyblasgemm.matmul(rows, w.T, invariant=True), x) == 0
    # and it is the product (float64 reference)
    got = pyblasgemm.matmul(x, w.T, invariant=True).astype(np.complex128)
    want = x.astype(np.complex128) @ w.T.astype(np.complex128)
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(got, ((want.real.astype(np.int64) + 128) % 256 - 128))
    else:
        tol = {2: 1e-2, 4: 1e-4, 8: 1e-12}[np.dtype(dtype).itemsize if np.dtype(dtype).kind != "c"
                                             else np.dtype(dtype).itemsize // 2]
        scale = np.abs(x.astype(np.complex128)) @ np.abs(w.T.astype(np.complex128))
        assert np.all(np.abs(got - want) <= tol * scale + 1e-30)


def test_vectors_batches_and_layouts_share_the_rows_bits():
    """A 1-D row, a 3-D batch of any composition, F-ordered and padded operands and an F-ordered
    out= give each row the bits it has alone."""
    x, w = _data(np, 60, 80, 20, np.float32)
    alone = np.stack([pyblasgemm.matmul(x[i], w.T, invariant=True) for i in range(60)])
    assert np.array_equal(pyblasgemm.matmul(x, w.T, invariant=True), alone)
    assert np.array_equal(pyblasgemm.matmul(x.reshape(3, 20, 80), w.T, invariant=True).reshape(60, 20), alone)
    assert np.array_equal(pyblasgemm.matmul(x.reshape(12, 5, 80), w.T, invariant=True).reshape(60, 20), alone)
    assert np.array_equal(pyblasgemm.matmul(np.asfortranarray(x), np.ascontiguousarray(w.T),
                                            invariant=True), alone)
    padded = np.zeros((60, 97), np.float32)
    padded[:, :80] = x
    assert np.array_equal(pyblasgemm.matmul(padded[:, :80], w.T, invariant=True), alone)
    out = np.empty((60, 20), np.float32, order="F")
    pyblasgemm.matmul(x, w.T, out=out, invariant=True)
    assert np.array_equal(out, alone)


@pytest.mark.parametrize("transa", ["N", "T", "C"])
def test_gemm_rows_of_op_a_are_invariant(transa):
    x, w = _data(np, 120, 64, 16, np.complex64)
    stored = x if transa == "N" else (x.T.copy() if transa == "T" else x.conj().T.copy())

    def rows_of(i, j):
        return stored[i:j] if transa == "N" else stored[:, i:j]
    whole = pyblasgemm.gemm(transa, "T", stored, w, invariant=True)
    for size in (1, 2, 7, 33, 64, 119):
        for start in (0, 120 - size):
            part = pyblasgemm.gemm(transa, "T", rows_of(start, start + size), w, invariant=True)
            assert np.array_equal(part, whole[start:start + size]), (size, start)


@pytest.mark.parametrize("routine, dtype", [("sgemm", np.float32), ("dgemm", np.float64),
                                            ("zgemm", np.complex128), ("hgemm", np.float16)])
def test_the_blas_form_rows_of_c_are_invariant(routine, dtype):
    """Column-major: a row of C is a row of op(A) against B, for any m and any lda."""
    f = getattr(pyblasgemm, routine)
    k, n, m = 50, 12, 90
    x, w = _data(np, m, k, n, dtype)
    b = np.asfortranarray(w.T)                      # k x n, column-major
    a = np.asfortranarray(x)                        # m x k, lda = m
    c = np.zeros((m, n), dtype, order="F")
    f("N", "N", m, n, k, 1, a.ravel(order="F"), m, b.ravel(order="F"), k, 0, c.ravel(order="F"), m,
      invariant=True)
    for rows in (1, 3, 17, 89):
        for start in (0, m - rows):
            part = np.asfortranarray(x[start:start + rows])
            got = np.zeros((rows, n), dtype, order="F")
            for _ in range(2):          # the second call takes the repeated-call path
                f("N", "N", rows, n, k, 1, part.ravel(order="F"), rows, b.ravel(order="F"), k, 0,
                  got.ravel(order="F"), rows, invariant=True)
                assert np.array_equal(got, c[start:start + rows]), (rows, start)


def test_grouped_rows_have_the_bits_of_gemm_alone():
    x, _ = _data(np, 90, 48, 8, ml_dtypes.bfloat16)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 48, 8)).astype(ml_dtypes.bfloat16)
    alone = {g: np.concatenate([pyblasgemm.gemm("N", "N", x[i:i + 1], w[g], invariant=True)
                                for i in range(90)]) for g in range(4)}
    for offsets in ([10, 40, 60, 90], [0, 89, 89, 90], [30, 30, 30, 90]):
        got = pyblasgemm.grouped_matmul(x, w, offsets=offsets, invariant=True)
        start = 0
        for g, end in enumerate(offsets):
            assert np.array_equal(got[start:end], alone[g][start:end]), (offsets, g)
            start = end
    lists = pyblasgemm.grouped_matmul([x[:5], x[5:60]], [w[1], w[1]], invariant=True)
    assert np.array_equal(np.concatenate(lists), alone[1][:60])


def test_the_epilogue_keeps_the_rows_bits():
    x, w = _data(np, 100, 64, 24, np.float32)
    bias = np.linspace(-1, 1, 24, dtype=np.float32)
    assert batch_mismatches(lambda rows: pyblasgemm.matmul(rows, w.T, bias=bias, activation="gelu",
                                                           invariant=True), x, sizes=range(1, 101)) == 0


def test_the_setting_turns_it_on_and_the_keyword_wins(monkeypatch):
    calls = []
    real = host.invariant_matmul

    def spy(a, b):
        calls.append(a.shape)
        return real(a, b)
    monkeypatch.setattr(host, "invariant_matmul", spy)
    x, w = _data(np, 8, 16, 4, np.float32)
    monkeypatch.setenv("PYBLASGEMM_INVARIANT", "1")
    pyblasgemm.clear_plan_cache()
    try:
        pyblasgemm.matmul(x, w.T)                              # the NumPy fast path steps aside
        pyblasgemm.gemm("N", "T", x, w)
        assert len(calls) == 2
        pyblasgemm.matmul(x, w.T, invariant=False)
        assert len(calls) == 2
        assert "invariant" in pyblasgemm.plan(8, 4, 16, "f16", arch="sm_90").reason
    finally:
        monkeypatch.delenv("PYBLASGEMM_INVARIANT")
        pyblasgemm.clear_plan_cache()
    pyblasgemm.matmul(x, w.T)
    assert len(calls) == 2


def test_bad_values_and_routes_it_cannot_promise_are_refused_before_any_work():
    x, w = _data(np, 4, 8, 4, np.float32)
    with pytest.raises(TypeError, match=r"matmul: invariant='yes' must be True, False or None"):
        pyblasgemm.matmul(x, w.T, invariant="yes")
    with pytest.raises(TypeError, match=r"gemm: invariant=1 must be True, False or None"):
        pyblasgemm.gemm("N", "T", x, w, invariant=1)
    # numpy.matmul's float product for a pair pyblasgemm does not compute
    with pytest.raises(NotImplementedError, match="would go to numpy.matmul"):
        pyblasgemm.matmul(x, w.T.astype(np.complex64), invariant=True)
    with pytest.raises(NotImplementedError, match="would go to numpy.matmul"):
        pyblasgemm.matmul(x, w.T, axes=[(-2, -1), (-2, -1), (-2, -1)], invariant=True)
    # integer products are exact: NumPy's own is invariant, and runs
    i32 = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert np.array_equal(pyblasgemm.matmul(i32, i32.T, invariant=True), i32 @ i32.T)
    d = np.ones((3, 3))
    with pytest.raises(NotImplementedError, match="composite route"):
        pyblasgemm.dgemm("N", "N", 3, 3, 3, 1.0, d.ravel(), 3, d.ravel(), 3, 0.0,
                         np.zeros(9), 3, compute="int8-ozaki", invariant=True)


def test_a_bad_flag_is_refused_even_after_a_good_call_was_remembered():
    """invariant=1 equals True and hashes as True: the repeated-call paths must not replay
    True's call for it (the raw form remembers NumPy calls); numpy's bool is True."""
    x = np.ones(16, np.float32)
    c = np.zeros(16, np.float32)
    for _ in range(2):
        pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, x, 4, x, 4, 0.0, c, 4, invariant=True)
    with pytest.raises(TypeError, match="sgemm: invariant=1 must be True, False or None"):
        pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, x, 4, x, 4, 0.0, c, 4, invariant=1)
    pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, x, 4, x, 4, 0.0, c, 4, invariant=np.True_)
    assert (c == 4).all()


def test_jax_cpu_arrays_run_invariant_on_the_host():
    jax = pytest.importorskip("jax")
    x, w = _data(np, 30, 40, 6, np.float32)
    jx, jw = jax.numpy.asarray(x), jax.numpy.asarray(w)
    whole = pyblasgemm.matmul(jx, jw.T, invariant=True)
    assert isinstance(whole, jax.Array)
    for i in range(30):
        assert np.array_equal(np.asarray(pyblasgemm.matmul(jx[i:i + 1], jw.T, invariant=True)),
                              np.asarray(whole)[i:i + 1])


def test_a_cpu_tensor_runs_invariant_on_the_host():
    torch = pytest.importorskip("torch")
    x, w = _data(np, 50, 32, 8, np.float32)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    whole = pyblasgemm.matmul(tx, tw.T, invariant=True)
    assert isinstance(whole, torch.Tensor)
    for i in range(50):
        assert torch.equal(pyblasgemm.matmul(tx[i:i + 1], tw.T, invariant=True), whole[i:i + 1])


# ---------------------------------------------------------------------------------------------
# the planner: one configuration, no split, never cuBLAS


@pytest.mark.parametrize("cls", ["family", "config"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype, n, k, transb", [  # (transb: the rows' flag, always N)
    ("bf16", 4096, 4096, "N"), ("f16", 14336, 4096, "N"),
                                                 ("f16", 3584, 18944, "N"), ("i8", 4096, 4096, "N"),
                                                 ("f32", 1024, 1024, "N"), ("bf16", 96, 65536, "N")])
def test_one_invariance_class_for_every_row_count(monkeypatch, cls, arch, dtype, n, k, transb):
    """The row-major forms' problem (x @ W.T described as Cᵀ = W xᵀ: the rows are n, op(B) the
    rows as the forms hand them over, tight: 'N' with ldb = K): every row count from 1 to 300
    (and prefill sizes) runs sliced-k on one kernel family and MMA consumer of ours (the
    default class: tile shapes sum alike, bench/results/invariance_families_h200_2026-11-27_619a84f.json),
    or, with the class 'config', one whole configuration; at either alignment of the weight."""
    from pyblasgemm.planner import invariant

    monkeypatch.setattr(invariant, "INVARIANCE_CLASS", cls)
    pyblasgemm.clear_plan_cache()
    compute = "tf32" if dtype == "f32" else None
    spec = FAMILIES[arch]
    try:
        for align in (16, 4):                   # the weight's alignment (the rows' is 16: the forms')
            classes = set()
            for rows in list(range(1, ROWS + 1, 7)) + [512, 2048, 8192]:
                d = make_desc(n, rows, k, dtype, compute=compute, transa="T", transb=transb,
                              align=align)._replace(invariant="n")
                p = plan_for(d, arch=spec)
                assert p.backend == "tensorcore" and p.decomposition == "sliced" and p.splits == 1, p.explain()
                assert "invariant along n" in p.reason
                classes.add(invariant.invariance_class(p.config))
            assert len(classes) == 1, (align, classes)
    finally:
        monkeypatch.undo()
        pyblasgemm.clear_plan_cache()


def test_the_family_class_keeps_the_family_and_frees_the_tile(monkeypatch):
    """INVARIANCE_CLASS = 'family' (the default since bench/invariance.py --families showed
    every sliced tile of a family summing alike: 48 configurations x problems, both families):
    every row count runs one family and consumer, sliced-k, each with its own best tile, never
    slower than the fixed configuration ('config') predicts."""
    from pyblasgemm.planner import invariant

    spec = FAMILIES["sm_90"]
    rows_list = (1, 64, 300, 4096)
    assert invariant.INVARIANCE_CLASS == "family"
    free = {rows: plan_for(make_desc(4096, rows, 4096, "bf16", transa="T")._replace(invariant="n"),
                           arch=spec) for rows in rows_list}
    monkeypatch.setattr(invariant, "INVARIANCE_CLASS", "config")
    pyblasgemm.clear_plan_cache()
    try:
        fixed = {rows: plan_for(make_desc(4096, rows, 4096, "bf16", transa="T")._replace(invariant="n"),
                                arch=spec) for rows in rows_list}
    finally:
        monkeypatch.undo()
        pyblasgemm.clear_plan_cache()
    assert len({p.config for p in fixed.values()}) == 1
    assert len({(p.config.family, p.config.consumer) for p in free.values()}) == 1
    assert all(p.decomposition == "sliced" and p.splits == 1 for p in free.values())
    assert all(free[r].predicted_s <= fixed[r].predicted_s * 1.0001 for r in fixed)
    assert "of the family" in free[1].reason


def test_the_configuration_ignores_the_row_count_but_not_the_weight():
    """invariant_config depends on the fixed dimension and K (the weight's shape), never on the
    row count; plan(invariant=True) describes a column-major problem (its rows are m)."""
    spec = FAMILIES["sm_90"]
    from pyblasgemm.planner import model
    cal = model.load_calibration()
    base = make_desc(4096, 1, 4096, "bf16", transa="T")._replace(invariant="n")
    first = invariant_config(base, spec, cal)
    assert first == invariant_config(base._replace(n=777), spec, cal)
    assert max(REFERENCE_SIZES) >= 4096 and min(REFERENCE_SIZES) == 1
    from pyblasgemm.planner.invariant import invariance_class

    assert {invariance_class(plan(m, 4096, 4096, "bf16", transa="T", invariant=True, arch="sm_90").config)
            for m in (1, 5, 300, 5000)} == {invariance_class(plan(64, 4096, 4096, "bf16", transa="T",
                                                                  invariant=True, arch="sm_90").config)}


def test_epilogue_routes_keep_the_invariant_configuration():
    for rows in (1, 64, 1000):
        p = plan(4096, rows, 4096, "f16", transa="T", activation="gelu", bias="m", arch="sm_90",
                 invariant=True)
        assert p.epilogue.kind in ("ours", "unfused")
        lt = next(o for o in p.epilogue.options if o.kind == "cublaslt")
        assert lt.time is None and "invariant" in lt.note
        assert not any(o.kind == "ours" and o.candidate is not None for o in p.epilogue.options)


def test_the_gpu_routes_it_cannot_promise_are_refused():
    with pytest.raises(ValueError, match="cannot run on backend='cublas'"):
        plan(64, 64, 64, "f16", invariant=True, arch="sm_90", backend="cublas")
    with pytest.raises(NotImplementedError, match="cannot promise batch invariance"):
        plan(64, 64, 64, "c64", invariant=True, arch="sm_90")
    with pytest.raises(NotImplementedError, match="cannot promise batch invariance"):
        plan(64, 64, 64, "f64", invariant=True, arch="sm_90")


def test_float32_is_invariant_on_the_fma_kind_with_one_configuration():
    """IEEE float32 (compute='fp32') plans onto the FP32 FMA kind, one sliced configuration for
    every row count (its lanes add K in ascending order whatever the tile)."""
    plans = [plan(m, 1024, 512, "f32", transa="T", invariant=True, arch="sm_90") for m in (1, 7, 300, 4096)]
    assert {p.config for p in plans} == {plans[0].config} and plans[0].decomposition == "sliced"
    assert plans[0].backend == "tensorcore" and plans[0].config.family == "sm80"


# ---------------------------------------------------------------------------------------------
# the GPU


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "float32"])
def test_gpu_rows_alone_and_in_every_batch_size_have_one_set_of_bits(dtype):
    cp = pytest.importorskip("cupy")
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x, w = _data(cp, ROWS, 1024, 512, dt)
    assert batch_mismatches(lambda rows: pyblasgemm.matmul(rows, w.T, invariant=True), x) == 0
    # another stream, and again: the same bits
    whole = pyblasgemm.matmul(x, w.T, invariant=True)
    with cp.cuda.Stream(non_blocking=True) as s:
        again = pyblasgemm.matmul(x, w.T, invariant=True)
        s.synchronize()
    assert bool((again == whole).all())


@gpu
def test_gpu_repeated_calls_on_rows_that_needed_a_copy_are_right():
    """An F-ordered or padded x is copied to the invariant layout: the launch ran on the copy,
    so the call signature must not replay it on x's own pointer (the second and third calls
    would read x as if it were tight)."""
    cp = pytest.importorskip("cupy")
    x, w = _data(cp, 70, 256, 96, np.float16)
    want = pyblasgemm.matmul(x, w.T, invariant=True)
    padded = cp.zeros((70, 264), np.float16)
    padded[:, :256] = x
    bias = cp.linspace(-1, 1, 96, dtype=np.float16)
    fused = pyblasgemm.matmul(x, w.T, bias=bias, activation="relu", invariant=True)
    for rows in (cp.asfortranarray(x), padded[:, :256]):
        for _ in range(3):
            assert bool((pyblasgemm.matmul(rows, w.T, invariant=True) == want).all())
            assert bool((pyblasgemm.matmul(rows, w.T, bias=bias, activation="relu", invariant=True)
                         == fused).all())


@gpu
def test_gpu_tf32_and_3xtf32_and_the_fused_epilogue_are_invariant():
    cp = pytest.importorskip("cupy")
    x, w = _data(cp, 200, 768, 256, np.float32)
    bias = cp.linspace(-1, 1, 256, dtype=np.float32)
    for compute in ("tf32", "3xtf32"):
        assert batch_mismatches(lambda rows: pyblasgemm.matmul(rows, w.T, compute=compute,
                                                               invariant=True), x, sizes=range(1, 201)) == 0
    x16, w16 = x.astype(np.float16), w.astype(np.float16)
    assert batch_mismatches(lambda rows: pyblasgemm.matmul(rows, w16.T, bias=bias.astype(np.float16),
                                                           activation="gelu", invariant=True),
                            x16, sizes=range(1, 201)) == 0


@gpu
def test_gpu_torch_tensors_and_grouped_calls_are_invariant():
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    x, w = _data(cp, 256, 512, 128, np.float16)
    tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
    whole = pyblasgemm.matmul(tx, tw.T, invariant=True)
    for size in (1, 3, 64, 255):
        assert torch.equal(pyblasgemm.matmul(tx[:size], tw.T, invariant=True), whole[:size])
    wg = cp.stack([w.T, w.T[:, ::-1].copy()])
    got = pyblasgemm.grouped_matmul(x, wg, offsets=[100, 256], invariant=True)
    assert bool((got[:100] == pyblasgemm.matmul(x[:100], wg[0], invariant=True)).all())
    assert bool((got[100:] == pyblasgemm.matmul(x[100:], wg[1], invariant=True)).all())
    assert bool((got[100:101] == pyblasgemm.matmul(x[100:101], wg[1], invariant=True)).all())


def test_the_guide_quotes_the_measured_cost_and_the_tile_experiment():
    """docs/guide/invariance.rst's cost (invariant vs auto, geomean, both classes) and the
    tile-shape experiment's count are the results files' (one H200 run)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = root / "bench" / "results"
    fam = json.loads((res / "invariance_family_h200_2026-11-27_619a84f.json").read_text())
    cfg = json.loads((res / "invariance_config_h200_2026-11-27_619a84f.json").read_text())
    shapes = json.loads((res / "invariance_families_h200_2026-11-27_619a84f.json").read_text())
    assert fam["invariance_class"] == "family" and cfg["invariance_class"] == "config"
    assert fam["summary"]["bits_hold_everywhere"] and len(fam["layers"]) == 33
    rows = shapes["families"]
    assert len(rows) == 48 and all(r["same_bits"] and r.get("same_bits_as_invariant_plan", True) for r in rows)
    guide = " ".join((root / "docs" / "guide" / "invariance.rst").read_text().split())
    assert f"at {fam['summary']['geomean_invariant_vs_auto']:.2f}x ``auto``'s time" in guide
    assert f"instead cost {cfg['summary']['geomean_invariant_vs_auto']:.2f}x" in guide
    assert "48 configurations of both families" in guide
    readme = " ".join((root / "README.md").read_text().split())
    assert (f"cost {fam['summary']['geomean_invariant_vs_auto']:.2f}x `auto`'s time on "
            f"{len(fam['layers'])} model-corpus layers") in readme
    # the latest run is quoted beside the one that chose the class, with its decode rows
    latest = json.loads((res / "invariance_h200_2026-11-28_c185bce.json").read_text())
    assert latest["summary"]["bits_hold_everywhere"]
    worst = [r["invariant_vs_auto"] for r in latest["layers"] if r["m"] <= 4 and r["invariant_vs_auto"] > 1.5]
    quoted = f"{latest['summary']['geomean_invariant_vs_auto']:.2f}x"
    assert f"took {quoted}" in guide and f"{quoted} in the latest run" in readme
    span = f"{min(worst):.1f}-{max(worst):.1f}x"
    assert f"took {span}" in guide and f"decode rows took {span}" in readme
    split = json.loads((res / "invariance_split_h200_2026-11-29_bc8faf6.json").read_text())
    assert split["corpus_with_split"]["summary"]["bits_hold_everywhere"] and len(split["sweep"]) == 42
