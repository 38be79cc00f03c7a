"""The CPU emulator of the kernels' decompositions: exact coverage, fixup order, geometry.

Hypothesis draws shapes (including 1, primes, non-multiples of the tile), tile configs, SM
counts, occupancies, split counts and raster groups; every decomposition must compute each
(tile, k-step) MAC iteration exactly once, write each tile once, and match float64 NumPy.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyblasgemm.kernels import KernelConfig, KernelProblem
from pyblasgemm.kernels.config import DECOMPOSITIONS
from pyblasgemm.kernels.launch import launch_geometry
import emulator as E   # tests/emulator.py: the test oracle

TILES = [dict(bm=64, bn=64, bk=16), dict(bm=64, bn=128, bk=32), dict(bm=128, bn=64, bk=16),
         dict(bm=128, bn=128, bk=32)]

dims = st.one_of(st.integers(1, 300), st.sampled_from([1, 2, 63, 64, 65, 127, 128, 129, 131, 257]))


@st.composite
def cases(draw, decomps=DECOMPOSITIONS):
    d = draw(st.sampled_from(decomps))
    tile = draw(st.sampled_from(TILES))
    splits = draw(st.sampled_from([0, 2, 3, 4, 7, 16])) if d.startswith("splitk") else 0
    cfg = KernelConfig(decomposition=d, splits=splits, group_m=draw(st.integers(1, 9)), **tile)
    return (cfg, draw(dims), draw(dims), draw(st.one_of(st.integers(1, 400), st.just(1))),
            draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.integers(1, 3)))


def _operands(seed, batch, m, n, k):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, m, k)), rng.standard_normal((batch, k, n))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 2**31))
def test_every_mac_iteration_exactly_once_and_matches_float64(case, seed):
    cfg, m, n, k, batch, sms, occ = case
    a, b = _operands(seed, batch, m, n, k)
    r = E.emulate(a, b, cfg, sm_count=sms, occupancy=occ)
    assert r.coverage.min() == 1 and r.coverage.max() == 1, cfg.name
    assert (r.finishes == 1).all(), cfg.name
    np.testing.assert_allclose(r.c, a @ b, rtol=1e-12, atol=1e-12 * max(1, k))


@settings(max_examples=60, deadline=None)
@given(cases(), st.integers(0, 2**31), st.floats(-2, 2), st.floats(-2, 2))
def test_alpha_beta_applied_once(case, seed, alpha, beta):
    cfg, m, n, k, batch, sms, occ = case
    a, b = _operands(seed, batch, m, n, k)
    c0 = np.random.default_rng(seed + 1).standard_normal((batch, m, n))
    r = E.emulate(a, b, cfg, sm_count=sms, occupancy=occ, alpha=alpha, beta=beta, c=c0)
    want = alpha * (a @ b) + (beta * c0 if beta != 0 else 0)
    np.testing.assert_allclose(r.c, want, rtol=1e-11, atol=1e-11 * max(1, k))


@settings(max_examples=300, deadline=None)
@given(cases(), st.sampled_from(["N", "T"]), st.sampled_from(["N", "T"]))
def test_geometry_matches_launch_geometry(case, ta, tb):
    cfg, m, n, k, batch, sms, occ = case
    p = KernelProblem("f16", ta, tb, m, n, k, k if ta == "T" else m, n if tb == "T" else k, m,
                      0, 0, 0, batch=batch)
    assert E.geometry(m, n, k, batch, cfg, sms, occ) == launch_geometry(p, cfg, sms, occ)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 9), st.integers(1, 4))
def test_grouped_raster_is_a_bijection(tiles_m, tiles_n, group, batch):
    seen = {E.coord(t, group, tiles_m, tiles_n) for t in range(tiles_m * tiles_n * batch)}
    assert seen == {(b, i, j) for b in range(batch) for i in range(tiles_m) for j in range(tiles_n)}


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 600))
def test_sk_cta_of_inverts_sk_begin(total, ctas):
    ctas = min(ctas, total)
    for it in {0, total - 1, total // 2, total // 3}:
        c = E.sk_cta_of(it, total, ctas)
        assert E.sk_begin(c, total, ctas) <= it < E.sk_begin(c + 1, total, ctas)


def test_streamk_fixup_order_is_cta_order():
    """The owner of a tile adds the later CTAs' partials in increasing CTA order."""
    cfg = KernelConfig(bm=64, bn=64, bk=16, decomposition="streamk")
    a, b = _operands(0, 1, 64, 64, 16 * 10)
    r = E.emulate(a, b, cfg, sm_count=4)
    owner = [w for w in r.work if w.action == "finish"]
    assert len(owner) == 1 and owner[0].cta == 0 and owner[0].consumes == (1, 2, 3)
    assert sorted(w.cta for w in r.work if w.action == "publish") == [1, 2, 3]


def test_hybrid_runs_full_waves_data_parallel():
    cfg = KernelConfig(bm=64, bn=64, bk=16, decomposition="hybrid")
    a, b = _operands(1, 1, 64 * 9, 64 * 3, 64)     # 27 tiles on 4 CTAs: 5 waves + 3
    r = E.emulate(a, b, cfg, sm_count=4)
    assert r.geometry["dp_tiles"] == 20 and r.geometry["sk_tiles"] == 7
    dp_items = [w for w in r.work if w.tile < 20]
    assert all(w.kb0 == 0 and w.kb1 == r.geometry["kt"] and not w.consumes for w in dp_items)
    np.testing.assert_allclose(r.c, a @ b, rtol=1e-12, atol=1e-12)


def test_serial_splitk_chain_order():
    cfg = KernelConfig(bm=64, bn=64, bk=16, decomposition="splitk_serial", splits=4)
    a, b = _operands(2, 1, 64, 64, 16 * 8)
    r = E.emulate(a, b, cfg, sm_count=4)
    chain = [(w.kb0, w.action, w.consumes) for w in r.work]
    assert chain == [(0, "chain", ()), (2, "chain", (0,)), (4, "chain", (1,)), (6, "finish", (2,))]


@pytest.mark.parametrize("d", DECOMPOSITIONS)
def test_plan_decomposition_emulates(d):
    """A plan's own config, emulated on a small problem, is exact."""
    import pyblasgemm

    p = pyblasgemm.plan(200, 136, 700, "f16", backend="tensorcore")
    cfg = p.config.__class__(**{**p.config.__dict__, "decomposition": d,
                                "splits": 3 if d.startswith("splitk") else 0})
    a, b = _operands(3, 1, 200, 136, 700)
    r = E.emulate(a, b, cfg, sm_count=p.arch.sm_count, occupancy=2)
    assert r.coverage.min() == r.coverage.max() == 1
    np.testing.assert_allclose(r.c, a @ b, rtol=1e-12, atol=1e-10)


# ---- the Hopper kernel's persistent scheduler (impls/sm90_gemm.cuh) -------------------------

@st.composite
def sm90_cases(draw):
    from dataclasses import replace

    from pyblasgemm.kernels.config import SM90_CONFIGS

    cfg = draw(st.sampled_from([c for v in SM90_CONFIGS.values() for c in v]))
    if cfg.decomposition == "splitk_parallel":
        cfg = replace(cfg, splits=draw(st.sampled_from([0, 2, 3, 7, 16])))
    cfg = replace(cfg, group_m=draw(st.integers(1, 9)))
    return (cfg, draw(dims), draw(st.one_of(dims, st.integers(129, 700))), draw(st.integers(1, 600)),
            draw(st.integers(1, 3)), draw(st.integers(2, 20)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sm90_cases(), st.integers(0, 2**31), st.sampled_from([(1.0, 0.0), (0.5, -2.0)]))
def test_sm90_schedule_covers_each_iteration_once(case, seed, ab):
    """Persistent data-parallel (with 2-CTA clusters too), split-k units and stream-k on the
    Hopper kernel's grid: each MAC iteration once, each tile written once, float64 result."""
    cfg, m, n, k, batch, sms = case
    alpha, beta = ab
    a, b = _operands(seed, batch, m, n, k)
    c0 = np.random.default_rng(seed + 1).standard_normal((batch, m, n))
    r = E.emulate(a, b, cfg, sm_count=sms, alpha=alpha, beta=beta, c=c0)
    assert r.coverage.min() == 1 and r.coverage.max() == 1, cfg.name
    assert (r.finishes == 1).all(), cfg.name
    assert r.geometry["grid"][0] <= sms
    want = alpha * (a @ b) + (beta * c0 if beta != 0 else 0)
    np.testing.assert_allclose(r.c, want, rtol=1e-11, atol=1e-11 * max(1, k))
    # the emulator's geometry is an independent derivation of the launcher's
    p = KernelProblem("f16", "T", "N", m, n, k, k, k, m, 256, 256, 256, batch=batch,
                      stride_a=m * k, stride_b=k * n, stride_c=m * n)
    assert E.geometry(m, n, k, batch, cfg, sms) == launch_geometry(p, cfg, sms)
