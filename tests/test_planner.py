"""The planner: Plan fields, routing, decomposition choice, explain(), constraints, cache, knobs.

All on the CPU: without a GPU the planner uses the default H100 spec (sm_90 datasheet).
"""
import dataclasses
import json
import timeit
from pathlib import Path

import pathlib
import sys

import pytest

import pyblasgemm
from pyblasgemm.kernels.launch import launch_geometry
from pyblasgemm.planner import FAMILIES, Plan, make_desc, model, plan, plan_for
from pyblasgemm.planner.core import kernel_problem_for
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools"))
import calibrate  # noqa: E402  (the offline calibration tool, tools/calibrate.py)

ROOT = Path(__file__).resolve().parents[1]
H100 = FAMILIES["sm_90"]
SUITE = ([(s, s, s) for s in (1024, 2048, 4096, 8192)]
         + [(3072,) * 3, (5000,) * 3, (256, 256, 65536), (512, 512, 32768)]
         + [(m, n, 4096) for m in (16, 64, 128) for n in (4096, 14336)]
         + [(4096, 4096, 128), (1000, 1000, 1000), (4095, 4097, 1023)])


pytestmark = pytest.mark.usefixtures("fresh_planner")   # tests/conftest.py


def test_plan_is_frozen_and_complete():
    p = plan(3000, 2600, 1800, "f32", compute="3xtf32", arch="sm_90")   # no measured entry near
    assert isinstance(p, Plan) and p.source == "heuristic"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.backend = "cublas"
    assert p.backend == "tensorcore" and p.config is not None
    assert p.decomposition == p.config.decomposition
    assert p.grid and p.predicted_s > 0 and p.workspace_bytes >= 0 and p.splits >= 1
    assert "predicted faster than cuBLAS" in p.reason      # its SGEMM: 3xTF32's cuBLAS route


#: A planner run on the H100 with the Hopper kernel (bench/bench_planner.py): each problem of the
#: public suite ("TN"), every sampled candidate of ours and cuBLAS, timed in one run.
PLANNER_RUN = ROOT / "bench" / "results" / "planner_sm90_h100_2026-11-22_run4.json"
#: The sets below describe the cost MODEL (the measured-choice table, which overrides it on the
#: suite's shapes on an H100, is off in that test; tests/test_planner_measured.py covers it).
#: the model sends these to our kernels although cuBLAS measured faster: its cuBLAS estimate has
#: no split-K for few-tile long-K problems and prices 128 x 14336 too high
KNOWN_WRONG_OURS = {("f16", 256, 256, 65536), ("bf16", 256, 256, 65536), ("bf16", 128, 14336, 4096),
                    # the margin covers only the GPU part (core.beyond_margin): ours' 5.6 µs of
                    # host time less decides it here, which this run (GPU time only) cannot see
                    ("i8", 256, 256, 65536)}
#: and keeps cuBLAS on these although one of ours measured >= 1.3x faster (small squares and thin
#: int8, where the model prices our kernels' pipeline fill and epilogue too high; the datasheet
#: spec this test plans with is a little slower than the device the run read, which took the
#: int8 16/64 x 4096 x 4096 wins; 1000^3 takes the mma.sync path)
KNOWN_MISSED_WINS = {("f16", 1024, 1024, 1024), ("bf16", 1024, 1024, 1024), ("i8", 1024, 1024, 1024),
                     ("i8", 2048, 2048, 2048), ("f16", 1000, 1000, 1000), ("bf16", 1000, 1000, 1000),
                     ("f16", 128, 4096, 4096), ("i8", 16, 4096, 4096), ("i8", 64, 4096, 4096)}

#: K-major operands with k = 1023 or 5000 (int8: 5000 bytes): pitches TMA cannot describe, so
#: the model packs them (kernels/pack.py), a route the planner run did not time
PACKED_UNMEASURED = {("f16", 4095, 4097, 1023), ("bf16", 4095, 4097, 1023), ("i8", 4095, 4097, 1023),
                     ("i8", 5000, 5000, 5000)}


def _measured():
    return json.loads(PLANNER_RUN.read_text())["results"]


@pytest.mark.parametrize("r", _measured(), ids=lambda r: f"{r['dtype']}-{r['m']}x{r['n']}x{r['k']}")
def test_planner_choice_against_measurements(r, monkeypatch):
    """The shipped model's choice (datasheet H100 spec, measured-choice table off) against the
    measured times: when it picks our kernels, that config measured within 10% of cuBLAS or
    better; when it keeps cuBLAS, none of ours measured 1.3x faster. The exceptions are the
    model's known misses, listed above."""
    monkeypatch.setenv("PYBLASGEMM_NO_MEASURED_CHOICES", "1")     # the model alone
    pyblasgemm.clear_plan_cache()
    key = (r["dtype"], r["m"], r["n"], r["k"])
    p = plan(r["m"], r["n"], r["k"], r["dtype"], transa="T", arch="sm_90")
    assert p.source == "heuristic"
    measured = {c["config"]: c["measured_s"] for c in r["candidates"] if c.get("measured_s")}
    if p.pack:
        # the run timed our kernels on the unpacked operands only; the packed route is timed
        # on the device by tests/test_pack.py and bench/heldout.py
        assert key in PACKED_UNMEASURED, f"{key}: a packed plan the planner run has no time for"
        return
    assert key not in PACKED_UNMEASURED, f"{key} no longer packs: move it out of PACKED_UNMEASURED"
    if p.backend == "tensorcore":
        t = measured.get(p.config.name)
        assert t is not None, f"{p.config.name} was not among the measured candidates: re-run the planner bench"
        if key in KNOWN_WRONG_OURS:
            assert t > 1.1 * r["cublas_s"], f"{key} is no longer a miss: drop it from KNOWN_WRONG_OURS"
        else:
            assert t <= 1.1 * r["cublas_s"], (t, r["cublas_s"], p.explain())
    else:
        assert p.backend == "cublas"
        assert "cuBLAS predicted faster" in p.reason or "cuBLAS kept" in p.reason
        best = min(measured.values())
        if key in KNOWN_MISSED_WINS:
            assert best * 1.3 <= r["cublas_s"], f"{key} is no longer a missed win: drop it from KNOWN_MISSED_WINS"
        else:
            assert best * 1.3 > r["cublas_s"], (best, r["cublas_s"], p.explain())


def test_int8_where_cublas_must_copy_is_decided_by_prediction():
    # measured (backends JSON): int8 1000x1000x1001 "TN", ours 1.05x cuBLAS with its copies
    p = plan(1000, 1000, 1001, "i8", transa="T", arch="sm_90")
    ours = min(c.time for c in p.candidates if c.backend == "tensorcore" and c.score)
    theirs = next(c for c in p.candidates if c.backend == "cublas")
    assert "rearranged" in theirs.score.note
    assert p.backend == ("tensorcore" if ours < theirs.time else "cublas")
    assert "predicted faster" in p.reason
    # the same problem with k a multiple of 4 needs no copies: cuBLAS
    assert plan(1000, 1000, 1000, "i8", transa="T", arch="sm_90").backend == "cublas"


@pytest.mark.parametrize("shape", SUITE, ids=lambda s: "x".join(map(str, s)))
def test_3xtf32_runs_ours(shape):
    p = plan(*shape, "3xtf32", arch="sm_90")
    assert p.backend == "tensorcore" and p.config.validate(kernel_problem_for(p.problem))[0]


@pytest.mark.parametrize("dtype", ["f64", "c64", "c128"])
def test_types_without_our_kernels_go_to_cublas(dtype):
    p = plan(300, 200, 100, dtype, arch="sm_90")
    assert p.backend == "cublas" and "our kernels do not run it" in p.reason


def test_float32_runs_on_our_fma_kernel_where_the_host_decides():
    """float32 (SGEMM's arithmetic) has our FP32 FMA kind: a small product runs on it (cuBLASLt's
    host work is most of such a call), a large one on cuBLAS (its SGEMM ran 1.4-2x ours at
    >= 2048^3, bench/results/simt_f32_h100_2026-11-27_035de94.json); never the Hopper kernel."""
    small = plan(64, 64, 64, "f32", arch="sm_90")
    assert small.backend == "tensorcore" and small.config.family == "sm80", small.explain()
    assert "predicted faster than cuBLAS" in small.reason
    assert plan(4096, 4096, 4096, "f32", arch="sm_90").backend == "cublas"
    forced = plan(4096, 4096, 4096, "f32", arch="sm_90", backend="tensorcore")
    assert forced.config.family == "sm80" and forced.config.bk == 16


def test_alignment_unsupported_by_our_kernels():
    p = plan(256, 256, 256, "f16", align=1, arch="sm_90")
    assert p.backend == "cublas" and "aligned" in p.reason
    with pytest.raises(NotImplementedError, match="aligned"):
        plan(256, 256, 256, "f16", align=1, arch="sm_90", backend="tensorcore")
    # 3xTF32 on unaligned pointers: ours cannot, cuBLAS's SGEMM (float32 accuracy) can
    q = plan(256, 256, 256, "3xtf32", lda=257, align=2, arch="sm_90")
    assert q.backend == "cublas" and "aligned" in q.reason


def test_unaligned_operands_predicted_slower():
    fast = plan(2048, 2048, 2048, "3xtf32", arch="sm_80")
    slow = plan(2048, 2048, 2048, "3xtf32", lda=2049, arch="sm_80")   # mma.sync's scalar copy path
    assert slow.predicted_s > fast.predicted_s


def test_fp32_on_hopper_reads_any_alignment_through_the_prep_kernel():
    """On sm_90 3xTF32 runs the wgmma kernel on prepared K-major copies: an odd lda costs nothing."""
    fast = plan(2560, 2560, 2560, "3xtf32", arch="sm_90")       # (no measured entry near: the model)
    odd = plan(2560, 2560, 2560, "3xtf32", lda=2561, arch="sm_90")
    assert fast.config.family == odd.config.family == "sm90a" and fast.source == odd.source == "heuristic"
    assert odd.predicted_s == pytest.approx(fast.predicted_s, rel=1e-6)
    assert fast.workspace_bytes >= 2 * 2560 * 2 * 2560 * 4     # the prepared [big | small] operands


def test_arch_before_sm80_unsupported():
    volta = dataclasses.replace(H100, family="sm_70", cc=(7, 0), name="V100")
    p = plan(1024, 1024, 1024, "f16", arch=volta)
    assert p.backend == "cublas" and "sm_80" in p.reason
    q = plan(1024, 1024, 1024, "3xtf32", arch=volta)       # SGEMM: 3xTF32's accuracy
    assert q.backend == "cublas" and "sm_80" in q.reason


# --- decomposition choice (our kernels forced) -----------------------------------------------

def _ours(m, n, k, dtype="f16", **kw):
    return plan(m, n, k, dtype, transa="T", backend="tensorcore", arch="sm_90", **kw)


def test_mma_sync_consumers_are_never_candidates_and_scored_slower_when_forced():
    """The Hopper kernel's mma.sync consumers run only when forced: the model scores them at
    MMA_SYNC_CONSUMER_FACTOR of the wgmma consumers' rate on the same tile."""
    from pyblasgemm.kernels.config import SM90_CONFIGS_BY_TILE

    cal = model.load_calibration()
    assert all(c.consumer == "wgmma" for c in model.candidate_configs("f16", cal, H100))
    wg = SM90_CONFIGS_BY_TILE["f16"][256]
    sync = dataclasses.replace(wg, consumer="mma.sync")
    eff_wg, _ = model.tile_efficiency(wg, "f16", cal)
    eff_sync, calibrated = model.tile_efficiency(sync, "f16", cal)
    assert not calibrated and eff_sync == pytest.approx(eff_wg * model.MMA_SYNC_CONSUMER_FACTOR)
    prob = kernel_problem_for(make_desc(4096, 4096, 4096, "f16", transa="T"))
    t_wg = model.score_ours(wg, prob, H100, cal).compute
    t_sync = model.score_ours(sync, prob, H100, cal).compute
    assert t_sync == pytest.approx(t_wg / model.MMA_SYNC_CONSUMER_FACTOR, rel=1e-6)


@pytest.mark.parametrize("dtype", ["f16", "3xtf32"])
def test_full_waves_choose_sliced(dtype):
    p = _ours(4096, 4096, 4096, dtype) if dtype == "f16" else _ours(128 * 12, 128 * 22, 2048, dtype)
    assert p.decomposition == "sliced", p.explain()
    assert "sliced-k" in p.reason


@pytest.mark.parametrize("shape", [(512, 512, 32768), (256, 256, 65536), (128, 128, 16384)])
def test_few_tiles_long_k_choose_splitk(shape):
    p = _ours(*shape)
    assert p.decomposition.startswith("splitk") and p.splits >= 2, p.explain()
    assert "split-k" in p.reason


@pytest.mark.parametrize("shape", [(3072, 3072, 3072), (5000, 5000, 5000)])
def test_badly_quantized_last_wave_chooses_streamk_or_hybrid(shape):
    """A tail-wave shape: the planner evens the last wave out with stream-k / hybrid, or picks a
    tile shape whose waves come out (nearly) full (on Hopper, 3072^3 in 128x192 tiles: 2.9
    waves; measured 1.06x cuBLAS, sm90_h100_2026-11-22_run5.json)."""
    p = _ours(*shape)
    if p.decomposition == "sliced":
        score = next(c.score for c in p.candidates if c.config == p.config)
        assert score.last_wave_util >= 0.85 and "sliced-k" in p.reason, p.explain()
    else:
        assert p.decomposition in ("streamk", "hybrid"), p.explain()
        assert "last wave" in p.reason


def test_plan_geometry_is_the_launchers():
    for shape in [(3072, 3072, 3072), (512, 512, 32768), (4096, 4096, 4096)]:
        p = _ours(*shape)
        g = launch_geometry(kernel_problem_for(p.problem), p.config, p.arch.sm_count,
                            model.occupancy(p.config, "f16", p.arch))
        assert tuple(g["grid"]) == p.grid and g["splits"] == p.splits


# --- explain ---------------------------------------------------------------------------------

def test_explain_lists_candidates_scores_and_reasons():
    p = plan(3072, 3072, 3072, "f16", arch="sm_86", backend="tensorcore")
    text = p.explain(limit=0)
    assert "waves" in text and "last" in text and "predicted" in text and "why:" in text
    # sm_86 has 99 KB per CTA: the 128x256 tiles (135 KB epilogue staging) are rejected
    assert "rejected" in text and "shared memory" in text
    scored = [c for c in p.candidates if c.score is not None]
    assert len(scored) > 10 and text.count("\n") > len(scored)
    auto = plan(3072, 3072, 3072, "f16", arch="sm_90")      # from the measured-choice table
    assert "measured fastest" in auto.explain() and "* cublas" in auto.explain()
    model_only = plan(3072, 3072, 3072, "f16", arch="sm_90", batch=2)   # no table: the model
    assert "cuBLAS predicted faster" in model_only.explain() and "* cublas" in model_only.explain()


def test_one_constraint_predicate():
    """Every rejection is KernelConfig.validate's verdict with the arch's shared memory."""
    p = plan(2000, 3000, 1000, "f16", arch="sm_86", backend="tensorcore")
    prob = kernel_problem_for(p.problem)
    for c in p.candidates:
        if c.backend != "tensorcore":
            continue
        ok, why = c.config.validate(prob, max_smem=p.arch.smem_per_block_optin)
        assert ok == (c.score is not None) and why == c.rejected


def test_host_arrays_plan_host():
    d = make_desc(8, 8, 8, "f64", xp="numpy")
    assert plan_for(d).backend == "host" and "host" in plan_for(d).explain()


def test_other_families_scale():
    a100 = plan(3072, 3072, 3072, "3xtf32", arch="sm_80")
    h100 = plan(3072, 3072, 3072, "3xtf32", arch="sm_90")
    assert a100.arch.sm_count == 108 and a100.predicted_s > h100.predicted_s


# --- cache -----------------------------------------------------------------------------------

def test_repeated_plan_costs_about_a_microsecond():
    d = make_desc(1024, 1024, 1024, "f16")
    first = plan_for(d)
    assert plan_for(d) is first
    n = 200_000
    per_call = min(timeit.repeat(lambda: plan_for(d), number=n, repeat=3)) / n
    print(f"cached plan_for: {per_call * 1e9:.0f} ns")
    # ~0.5-1 us alone (an LRU lookup: OrderedDict get + move_to_end); 5.2 us was seen on an
    # H100 host with 16 pytest workers and GPU tests beside it, hence the margin
    assert per_call < 10e-6


def test_cache_key_ignores_alpha_beta_but_not_shape():
    d = make_desc(512, 512, 512, "f16")
    assert plan_for(d) is plan_for(d._replace(alpha=3.0, beta=1.0))
    assert plan_for(d) is not plan_for(make_desc(512, 512, 513, "f16"))


# --- environment knobs -----------------------------------------------------------------------

def test_env_force_decomposition(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_DECOMPOSITION", "splitk_parallel")
    monkeypatch.setenv("PYBLASGEMM_SPLITS", "6")
    pyblasgemm.clear_plan_cache()
    p = _ours(4096, 4096, 4096)
    assert p.decomposition == "splitk_parallel" and p.splits == 6
    assert all(c.config.decomposition == "splitk_parallel" for c in p.candidates
               if c.backend == "tensorcore")


def test_env_force_config(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_CONFIG", "hybrid_128x128x32_w2x2_s4_g8")
    pyblasgemm.clear_plan_cache()
    assert _ours(1000, 1000, 1000).config.name == "hybrid_128x128x32_w2x2_s4_g8"


def test_env_force_backend_and_bad_values(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_BACKEND", "tensorcore")
    pyblasgemm.clear_plan_cache()
    assert plan(1024, 1024, 1024, "f16", arch="sm_90").backend == "tensorcore"
    monkeypatch.setenv("PYBLASGEMM_DECOMPOSITION", "diagonal")
    pyblasgemm.clear_plan_cache()            # variables are read on first use, not here
    with pytest.raises(ValueError, match="PYBLASGEMM_DECOMPOSITION='diagonal'.*'sliced'"):
        plan(1024, 1024, 1024, "f16", arch="sm_90")


def test_env_print_plans_and_no_cache(monkeypatch, capsys):
    monkeypatch.setenv("PYBLASGEMM_PRINT_PLANS", "1")
    monkeypatch.setenv("PYBLASGEMM_NO_PLAN_CACHE", "1")
    pyblasgemm.clear_plan_cache()
    d = make_desc(640, 640, 640, "f16")
    assert plan_for(d) is not plan_for(d)
    assert "candidates" in capsys.readouterr().err


def test_env_arch(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_ARCH", "sm_80")
    pyblasgemm.clear_plan_cache()
    assert plan(2048, 2048, 2048, "3xtf32").arch.family == "sm_80"


def test_knobs_documented():
    doc = pyblasgemm.planner.__doc__
    for var in ("PYBLASGEMM_BACKEND", "PYBLASGEMM_DECOMPOSITION", "PYBLASGEMM_SPLITS",
                "PYBLASGEMM_CONFIG", "PYBLASGEMM_PRINT_PLANS", "PYBLASGEMM_NO_PLAN_CACHE",
                "PYBLASGEMM_AUTOTUNE", "PYBLASGEMM_CACHE_DIR", "PYBLASGEMM_NO_TUNE_CACHE",
                "PYBLASGEMM_ARCH", "PYBLASGEMM_FP32_COMPUTE", "PYBLASGEMM_NO_MEASURED_CHOICES"):
        assert var in doc


# --- calibration -----------------------------------------------------------------------------

def test_shipped_calibration_is_derived_from_bench_results():
    shipped = model.load_calibration()
    results = ROOT / "bench" / "results"
    changed = [n for n, sha in shipped["source_sha256"].items()
               if not (results / n).exists() or calibrate.file_sha256(results / n) != sha]
    if changed:
        pytest.skip(f"results files changed since the calibration ({', '.join(changed)}): "
                    f"re-derive with python tools/calibrate.py bench/results")
    again = json.loads(json.dumps(calibrate.derive(str(ROOT / "bench" / "results"),
                                                   shipped["sources"]), sort_keys=True))
    shipped = {k: v for k, v in shipped.items() if k != "sm90"}  # the Hopper part: next test
    assert again == shipped, "run: python tools/calibrate.py bench/results"


def test_shipped_sm90_calibration_is_derived_from_bench_results():
    shipped = json.loads(model.CALIBRATION_SM90_FILE.read_text())
    results = ROOT / "bench" / "results"
    paths = [results / n for n in shipped["sources"]]
    for path in paths:
        assert path.exists() and calibrate.file_sha256(path) == shipped["sources"][path.name], (
            f"{path.name} changed: python tools/calibrate.py --sm90 <its results>")
    again = json.loads(json.dumps(calibrate.derive_sm90([str(p) for p in paths]), sort_keys=True))
    assert again == shipped
    # every shipped Hopper tile the planner scores is calibrated for f16 and s8
    from pyblasgemm.kernels.config import SM90_CONFIGS_BY_TILE
    for kind in ("f16", "s8"):
        for cfg in SM90_CONFIGS_BY_TILE[kind].values():
            assert model.tile_key(cfg, kind) in shipped[kind]["tiles"], (kind, cfg.name)


def test_calibration_fits_the_measurements():
    cal = model.load_calibration()
    assert cal["median_abs_log_error"] < 0.1
    for p in cal["points"]:
        assert 0.5 < p["predicted_s"] / p["measured_s"] < 2.5, p
    # the public-suite run (17 shapes x 4 dtypes, GPU time) as a check of the whole model
    for name, v in cal["suite_validation"].items():
        assert 0.8 < v["median_pred_over_measured"] < 1.25, name
        if name.startswith("tensorcore"):
            assert v["within_25pct"] >= 0.8, name


# --- CLI -------------------------------------------------------------------------------------

def test_cli_plan(capsys):
    from pyblasgemm.__main__ import main
    from tests.conftest import gpu_available

    assert main(["plan", "4096", "4096", "4096", "--dtype", "f16", "--trans", "NT"]) == 0
    out = capsys.readouterr().out
    assert "why:" in out and "candidates" in out
    if not gpu_available():
        assert "no GPU found" in out and "H100" in out and "backend 'cublas'" in out
    assert main(["plan", "512", "512", "32768", "--trans", "TN", "--arch", "sm_80",
                 "--backend", "tensorcore", "--all"]) == 0
    out = capsys.readouterr().out
    assert "A100" in out and "splitk" in out.split("why:")[0]
    assert main(["plan", "8", "8", "8", "--dtype", "nope"]) == 2


def test_cli_speaks_in_its_own_terms(capsys):
    """--version; bad numbers and choices refused by argparse naming the option; size-0
    problems explained as quick returns; --backend host says what runs; aligned columns."""
    from pyblasgemm.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"pyblasgemm {pyblasgemm.__version__}"
    for argv, words in ((["plan", "4", "4", "-3"], "argument k: -3 is below the smallest allowed, 0"),
                        (["plan", "4", "4", "x"], "argument k: 'x' is not an integer"),
                        (["plan", "4", "4", "4", "--backend", "gpu"], "argument --backend: invalid choice"),
                        (["demo", "--size", "0"], "argument --size: 0 is below the smallest allowed, 1")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and words in capsys.readouterr().err
    assert main(["plan", "0", "4096", "4096"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("quick return (m = 0)") and "C is empty" in out and "Traceback" not in out
    assert main(["plan", "64", "64", "0"]) == 0
    assert "C = beta * C" in capsys.readouterr().out
    assert main(["plan", "64", "64", "64", "--backend", "host"]) == 0
    assert "NumPy's own BLAS" in capsys.readouterr().out
    # a packed candidate's long name does not shift the columns
    assert main(["plan", "6453", "738", "9058", "--dtype", "bf16", "--lda", "6455", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, ln in enumerate(out) if ln.lstrip().startswith("candidate "))
    end = out[head].index("predicted") + len("predicted")
    rows = [ln for ln in out[head + 1:head + 13] if not ln.lstrip().startswith("...")]
    assert any("+pack_ab" in r for r in rows)
    assert all(r[end - 1] == "u" and r[end - 2].isdigit() for r in rows), rows


def test_cli_tune_needs_gpu(capsys):
    from pyblasgemm.__main__ import main
    from tests.conftest import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    assert main(["tune", "256", "256", "256"]) == 2
    assert "GPU" in capsys.readouterr().err


def test_bench_planner_plans_its_suite_on_the_cpu():
    """bench/bench_planner.py's planning half (no GPU): every problem gets a plan and a
    subsample of forced candidates that includes every decomposition the model scored."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_planner", ROOT / "bench" / "bench_planner.py")
    bp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bp)
    assert len(bp.SHAPES) == 17 and set(bp.DTYPES) == {"f16", "bf16", "i8", "3xtf32"}
    for dt in bp.DTYPES:
        for shape in bp.SHAPES:
            d = make_desc(*shape, dt, transa="T", transb="N")
            forced = plan_for(d, "tensorcore", arch=H100)
            picked = bp.pick_candidates(forced, d)
            assert 4 <= len(picked) <= 10
            scored = {c.config.decomposition for c in forced.candidates
                      if c.backend == "tensorcore" and c.score is not None}
            assert scored <= {c.config.decomposition for c in picked}


def test_env_forced_split_count_outside_the_usual_choices(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_DECOMPOSITION", "splitk_serial")
    monkeypatch.setenv("PYBLASGEMM_SPLITS", "11")
    pyblasgemm.clear_plan_cache()
    p = _ours(1024, 1024, 8192)
    assert p.decomposition == "splitk_serial" and p.splits == 11 and p.grid[1] == 11


def test_margin_decides_between_close_predictions(monkeypatch):
    """Our kernels replace cuBLAS only when predicted faster beyond CUBLAS_MARGIN: a case where
    ours is predicted faster but within the margin stays on cuBLAS, and a margin below that
    advantage flips it to our kernels."""
    from pyblasgemm.planner import core

    monkeypatch.setenv("PYBLASGEMM_NO_MEASURED_CHOICES", "1")
    close = None
    for m in (512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192):
        pyblasgemm.clear_plan_cache()
        p = plan(m, m, m, "f16", transa="T", arch="sm_90")
        best = min((c for c in p.candidates if c.backend == "tensorcore" and c.score),
                   key=lambda c: c.time)
        theirs = next(c for c in p.candidates if c.backend == "cublas")
        o, c = best.score, theirs.score
        if (core._waited_and_streamed(o.host, o.gpu) < core._waited_and_streamed(c.host, c.gpu)
                and not core.beyond_margin(best, theirs)):
            close = (m, best, theirs, p)
            break
    assert close is not None, "no square f16 problem predicted within the margin"
    m, best, theirs, p = close
    assert p.backend == "cublas" and "cuBLAS kept" in p.reason
    # without a margin the prediction alone decides: ours, predicted faster
    monkeypatch.setattr(core, "CUBLAS_MARGIN", 0.0)
    pyblasgemm.clear_plan_cache()
    flipped = plan(m, m, m, "f16", transa="T", arch="sm_90")
    assert flipped.backend == "tensorcore" and "the model's margin" in flipped.reason


def test_host_bound_calls_go_to_our_kernels_and_large_ones_do_not(monkeypatch):
    """A 64³ call is decided by host work (our launch 5-9 µs, cuBLAS's 10-15 µs measured in
    host_cost_*.json): ours even with its GPU time taken 2.6x the prediction, both waited for
    (host + GPU) and back to back (the larger of the two). From 256³
    float16 on the model decides as before; a forced config turns the rule off."""
    from pyblasgemm.planner.core import MODEL_MISS, rule_host_us

    CALL_HOST_US = rule_host_us(model.load_calibration())

    monkeypatch.setenv("PYBLASGEMM_NO_MEASURED_CHOICES", "1")
    pyblasgemm.clear_plan_cache()
    small = plan(64, 64, 64, "f16", arch="sm_90")
    assert small.backend == "tensorcore" and small.reason.startswith("host-bound")
    assert small.config.family != "sm90a"            # the Hopper launchers cost ~15 µs
    ours = next(c for c in small.candidates if c.config == small.config)
    cublas = next(c for c in small.candidates if c.backend == "cublas")
    latency = 3e-6
    worst = latency + MODEL_MISS * (ours.score.gpu - latency)
    assert worst <= CALL_HOST_US["cublas"] * 1e-6          # back to back: hidden by cuBLAS's host
    assert CALL_HOST_US["tensorcore"] * 1e-6 + worst < CALL_HOST_US["cublas"] * 1e-6 + cublas.score.gpu
    assert "waited for" in small.reason and "back to back" in small.reason
    for big in (plan(256, 256, 256, "f16", arch="sm_90"), plan(4096, 4096, 4096, "f16", arch="sm_90")):
        assert not big.reason.startswith("host-bound")
    monkeypatch.setenv("PYBLASGEMM_CONFIG", small.config.name)
    pyblasgemm.clear_plan_cache()
    assert not plan(64, 64, 64, "f16", arch="sm_90").reason.startswith("host-bound")
    monkeypatch.delenv("PYBLASGEMM_CONFIG")
    pyblasgemm.clear_plan_cache()


def test_extra_launches_cost_host_time_only_beyond_the_gpu_time():
    """A call's prep, reduce and memset launches cost host time (call_host_us.launch, measured
    by bench/launch_primitives.py) where the GPU has finished the earlier kernels: a 64³ tf32
    call takes the one-launch mma.sync kernel rather than the Hopper kernel with its two prep
    launches; at 4096³ the prep launches hide behind the GEMM and the Hopper kernel wins."""
    from pyblasgemm.kernels.geometry import launch_geometry
    from pyblasgemm.planner.candidates import kernel_problem_for

    cal = model.load_calibration()
    assert cal["call_host_us"]["launch"] > 0
    small = plan(64, 64, 64, "f32", compute="tf32", backend="tensorcore", arch="sm_90")
    big = plan(4096, 4096, 4096, "f32", compute="tf32", backend="tensorcore", arch="sm_90")
    assert small.config.family != "sm90a" and big.config.family == "sm90a"
    for p, hidden in ((small, False), (big, True)):
        prob = kernel_problem_for(p.problem)
        sm90 = [c for c in p.candidates if c.score and c.config is not None and c.config.family == "sm90a"]
        c = min(sm90, key=lambda c: c.time)
        g = launch_geometry(prob, c.config, p.arch.sm_count, 1)
        assert model.extra_launches(c.config, prob, g) >= 2        # the two prep kernels
        base = model.call_host_s(cal, "tensorcore", "sm90")
        assert (c.score.host == base) is hidden
