"""The kernel-family registry (pyblasgemm/kernels/families.py): every family-dependent decision
is its entry's, so a new family is one entry (and its header).

CPU tests: the registry's contents and order, that every shipped config reaches a registered
entry and round-trips its name, that no module outside the registry asks which family a config
is, and that a toy family registered at run time (the mma.sync kernel under another name) is
planned, named, compiled for, laid out and launched through its entry alone. GPU test: a plan of
every family the device runs computes an odd-sized product right over a poisoned output.
"""
from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.kernels import families, jit
from pyblasgemm.kernels.config import (KERNEL_FAMILIES, SHIPPED_CONFIGS, SM90_CONFIGS, SM90_MMA_SYNC_CONFIGS,
                                       KernelConfig, families_on)
from pyblasgemm.kernels.geometry import launch_geometry
from pyblasgemm.kernels.grouped import GROUPED_CONFIGS, GROUPED_SMALL_CONFIGS
from pyblasgemm.kernels.launch import fusable
from pyblasgemm.kernels.problem import KernelProblem
from pyblasgemm.kernels.spec import launch_spec
from pyblasgemm.planner import FAMILIES, make_desc, model, plan_for

PACKAGE = Path(pyblasgemm.__file__).resolve().parent

pytestmark = pytest.mark.usefixtures("fresh_planner")   # tests/conftest.py


def _all_shipped():
    for table in (SHIPPED_CONFIGS, SM90_CONFIGS, SM90_MMA_SYNC_CONFIGS):
        for kind, cfgs in table.items():
            for c in cfgs:
                yield kind, c
    yield from GROUPED_CONFIGS.items()
    yield from GROUPED_SMALL_CONFIGS.items()


def test_registry_holds_both_families_in_the_planners_order():
    assert list(KERNEL_FAMILIES) == ["sm90a", "sm80"]
    assert KERNEL_FAMILIES["sm80"] is families.MMA_SYNC and KERNEL_FAMILIES["sm90a"] is families.HOPPER
    assert len({f.name_prefix for f in KERNEL_FAMILIES.values()}) == len(KERNEL_FAMILIES)
    assert [f.name for f in families_on((8, 0))] == [f.name for f in families_on((8, 9))] == ["sm80"]
    assert [f.name for f in families_on((9, 0))] == ["sm90a", "sm80"]
    assert families_on((7, 5)) == [] and [f.name for f in families_on((10, 0))] == ["sm80"]
    for fam in KERNEL_FAMILIES.values():
        assert (jit.INCLUDE_DIR / fam.header).is_file(), fam.header
        assert fam.peak(FAMILIES["sm_90"], "f16") >= FAMILIES["sm_90"].mma_sync_peak("f16")
        assert set(fam.prep_kinds) <= set(fam.kinds)


def test_registering_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="'sm80' is registered already"):
        families.register(families.MmaSyncFamily())
    assert list(KERNEL_FAMILIES) == ["sm90a", "sm80"]


def test_every_shipped_config_reaches_its_entry_and_round_trips_its_name():
    seen = set()
    for kind, c in _all_shipped():
        fam = c.kernel_family
        seen.add(fam.name)
        assert c.name.startswith(fam.name_prefix)
        assert c.validate(kind=kind) == (True, ""), (kind, c.name)
        if c.decomposition != "grouped":
            assert model.parse_config_name(c.name) == c
            assert model.tile_key(c, kind).startswith(fam.name_prefix)
    assert seen == set(KERNEL_FAMILIES)


def test_an_unknown_family_is_refused_with_the_registered_names():
    bad = KernelConfig(family="sm100")
    assert bad.validate(kind="f16") == (False, "family 'sm100' must be 'sm80' or 'sm90a'")
    with pytest.raises(ValueError, match=r"family='sm100' is not a kernel family; registered: \('sm90a', 'sm80'\)"):
        bad.kernel_family
    assert bad.name.startswith("sm100_")               # named, never mistaken for the mma.sync one
    ok, why = model.check(bad, KernelProblem("f16", "N", "N", 8, 8, 8, 8, 8, 8, 16, 16, 16), FAMILIES["sm_90"])
    assert not ok and "sm100" in why


def test_each_family_refuses_the_archs_it_does_not_run_on():
    p = KernelProblem("f16", "T", "N", 256, 256, 256, 256, 256, 256, 256, 256, 256)
    hopper = SM90_CONFIGS["f16"][0]
    volta = replace(FAMILIES["sm_80"], cc=(7, 0))
    for arch, want_hopper in ((FAMILIES["sm_80"], "compute capability 9.0 only (device is sm_80)"),
                              (FAMILIES["sm_86"], "compute capability 9.0 only (device is sm_86)"),
                              (volta, "sm_80 or newer (device is sm_70)")):
        ok, why = model.check(hopper, p, arch)
        assert not ok and want_hopper in why, why
    ok, why = model.check(SHIPPED_CONFIGS["f16"][0], p, volta)
    assert not ok and why == "our mma.sync kernels need sm_80 or newer (device is sm_70)"
    assert model.check(hopper, p, FAMILIES["sm_90"]) == (True, "")


#: the registry: the one module that may say which family is which
_FAMILY_MODULES = {"kernels/families.py"}


def test_no_module_outside_the_registry_asks_which_family_a_config_is():
    """No `.is_sm90` and no comparison of `.family` with a family's name outside the registry
    (main had 35 such tests before the registry: 32 `is_sm90` and 3 `family == ...`)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in _FAMILY_MODULES:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "is_sm90":
                offenders.append(f"{rel}:{node.lineno} .is_sm90")
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
                if (any(isinstance(x, ast.Attribute) and x.attr == "family" for x in parts)
                        and any(isinstance(x, ast.Constant) and x.value in KERNEL_FAMILIES for x in parts)):
                    offenders.append(f"{rel}:{node.lineno} family compared with a name")
    assert offenders == []


class ToyFamily(families.MmaSyncFamily):
    """The mma.sync kernel under another name: what a new family's entry looks like when it
    reuses a header (a real one, e.g. GEMV, brings its own header and launcher)."""

    name = "toy"
    title = "the toy kernel"
    name_prefix = "toy_"
    min_cc = max_cc = (8, 6)
    _arch_refusal = families.KernelFamily._arch_refusal     # not the mma.sync kernel's words

    def candidate_tiles(self, kind):
        return [replace(c, family=self.name) for c in super().candidate_tiles(kind)[:1]]


@pytest.fixture
def toy():
    fam = ToyFamily()
    families.register(fam)
    pyblasgemm.clear_plan_cache()
    try:
        yield fam
    finally:
        del KERNEL_FAMILIES[fam.name]
        pyblasgemm.clear_plan_cache()


def test_a_new_family_is_one_entry(toy):
    """Registered at run time, the toy family is offered on its arch only, planned, parsed,
    validated, laid out, named for the compiler and given a launch spec through its entry."""
    assert [f.name for f in families_on((8, 6))] == ["sm80", "toy"]
    assert "toy" not in [f.name for f in families_on((8, 0))] + [f.name for f in families_on((9, 0))]
    desc = make_desc(333, 257, 1000, "f16", transa="T")
    sm86 = plan_for(desc, "tensorcore", arch=FAMILIES["sm_86"])
    toys = [c for c in sm86.candidates if c.config is not None and c.config.family == "toy"]
    assert toys and all(c.score is not None for c in toys), [c.rejected for c in toys]
    assert {c.config.decomposition for c in toys} >= {"sliced", "hybrid", "splitk_serial", "splitk_parallel"}
    assert not any(c.config is not None and c.config.family == "toy"
                   for c in plan_for(desc, "tensorcore", arch=FAMILIES["sm_80"]).candidates)
    cfg = toys[0].config
    assert cfg.name.startswith("toy_") and model.parse_config_name(cfg.name) == cfg
    assert model.tile_key(cfg, "f16").startswith("toy_")
    twin = replace(cfg, family="sm80")           # what the toy renames: the same arithmetic
    p = KernelProblem("f16", "T", "N", 333, 257, 1000, 1000, 1000, 333, 256, 256, 256)
    assert cfg.validate(p) == twin.validate(p) == (True, "")
    assert cfg.threads == twin.threads and cfg.smem_bytes("f16") == twin.smem_bytes("f16")
    assert launch_geometry(p, cfg, 72, 2) == launch_geometry(p, twin, 72, 2)
    assert dict(launch_spec(p, cfg, 72, 2).args) == dict(launch_spec(p, twin, 72, 2).args)
    assert jit._names(cfg, "f16", "T", "N", None, True) == jit._names(twin, "f16", "T", "N", None, True)
    assert fusable("f16", cfg) and model.occupancy(cfg, "f16", FAMILIES["sm_86"]) >= 1
    ok, why = model.check(cfg, p, FAMILIES["sm_80"])
    assert not ok and why == "the toy kernel runs on compute capability 8.6 only (device is sm_80)"


def test_cost_model_parameters_come_from_the_entry():
    """The per-family numbers the model reads: peak, layout factor, scalar path, occupancy,
    prep launches, calibration section (the snapshot test pins the resulting scores)."""
    h100, cal = FAMILIES["sm_90"], model.load_calibration()
    hopper, sync = SM90_CONFIGS["f16"][0], SHIPPED_CONFIGS["f16"][0]
    assert model.occupancy(hopper, "f16", h100) == families.HOPPER.ctas_per_sm == 1
    assert model.occupancy(sync, "f16", h100) > 1 and families.MMA_SYNC.ctas_per_sm is None
    # the Hopper kernel's efficiencies are fractions of the wgmma peak from its own section
    eff, calibrated = model.tile_efficiency(hopper, "f16", cal)
    assert calibrated and eff == cal["sm90"]["f16"]["tiles"][model.tile_key(hopper, "f16")]
    # a layout the calibration prices lower ('NN': 0.88 of 'TN') costs the mma.sync kernel only
    layout = cal["ours"]["f16"]["layout"]
    assert layout["NN"] < layout["TN"]
    nn = KernelProblem("f16", "N", "N", 4096, 4096, 4096, 4096, 4096, 4096, 256, 256, 256)
    tn = replace(nn, transa="T")
    for cfg, slower in ((sync, layout["TN"] / layout["NN"]), (hopper, 1.0)):
        t_nn, t_tn = (model.score_ours(cfg, q, h100, cal).compute for q in (nn, tn))
        assert t_nn / t_tn == pytest.approx(slower, rel=1e-12), cfg.name
    # fp32 operands: two prep launches on the Hopper kernel, none on mma.sync
    p32 = replace(nn, kind="3xtf32", accumulate="f32")
    for cfg, want in ((SM90_CONFIGS["3xtf32"][0], 2), (SHIPPED_CONFIGS["3xtf32"][0], 0)):
        g = launch_geometry(p32, cfg, 132, 1)
        assert model.extra_launches(cfg, p32, g) == want + (cfg.decomposition == "splitk_parallel") + (g["flags"] > 0)


# --- GPU ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kind,dtype,ta,tb,m,n,k", [
    ("f16", "float16", "T", "N", 131, 257, 520),      # K-major: only k must keep rows 16-byte aligned
    ("f16", "float16", "N", "T", 136, 264, 509),      # M/N-major: m and n keep them aligned
    ("s8", "int8", "T", "N", 127, 129, 528),
    ("3xtf32", "float32", "N", "N", 131, 257, 509)])  # any layout: the prep kernel rewrites it
def test_every_family_on_the_device_computes_through_its_entry(kind, dtype, ta, tb, m, n, k):
    """On the device's arch, for every family it runs: the best of that family's candidates
    for an odd-sized problem, bound and launched (its entry's launcher), against float64 (s8:
    exact) over a NaN / -12345 poisoned C."""
    import cupy as cp

    from pyblasgemm.kernels.launch import bind
    from pyblasgemm.planner.arch import arch_for_device

    arch = arch_for_device(0)
    rng = np.random.default_rng(7)

    def operand(shape):
        x = rng.integers(-8, 8, shape) if kind == "s8" else rng.standard_normal(shape)
        return x.astype(dtype)

    # stored matrices (column-major: Fortran-ordered on the device), ld = their row count
    a_h = operand((k, m) if ta == "T" else (m, k))
    b_h = operand((n, k) if tb == "T" else (k, n))
    a_d, b_d = cp.asfortranarray(cp.asarray(a_h)), cp.asfortranarray(cp.asarray(b_h))
    big = np.int64 if kind == "s8" else np.float64
    want = (a_h.T if ta == "T" else a_h).astype(big) @ (b_h.T if tb == "T" else b_h).astype(big)
    one, zero = (1, 0) if kind == "s8" else (1.0, 0.0)
    desc = make_desc(m, n, k, "3xtf32" if kind == "3xtf32" else dtype, transa=ta, transb=tb)
    cands = plan_for(desc, "tensorcore", arch=arch).candidates
    ran = set()
    for fam in families_on(arch.cc):
        mine = [c for c in cands if c.score is not None and not c.pack and c.config is not None
                and c.config.family == fam.name]      # (cuBLAS's candidate has no config)
        assert mine, f"{fam.title}: no candidate for {desc}"
        best = min(mine, key=lambda c: c.time)
        c_d = cp.full((m, n), -12345 if kind == "s8" else np.nan,
                      dtype=np.int32 if kind == "s8" else dtype, order="F")
        prob = KernelProblem(kind, ta, tb, m, n, k, a_h.shape[0], b_h.shape[0], m, a_d.data.ptr,
                             b_d.data.ptr, c_d.data.ptr, one, zero, "s32" if kind == "s8" else "f32")
        bind(prob, best.config)(a_d.data.ptr, b_d.data.ptr, c_d.data.ptr, one, zero)
        got = c_d.get()
        if kind == "s8":
            assert np.array_equal(got, want.astype(np.int32)), best.config.name
        else:
            err = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
            assert np.isfinite(got).all() and err < (1e-6 if kind == "3xtf32" else 2e-3), (best.config.name, err)
        ran.add(fam.name)
    assert ran == {f.name for f in families_on(arch.cc)} and ran
