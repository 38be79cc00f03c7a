"""The held-out shape corpus (bench/corpus.py) and its GPU harness (bench/heldout.py) without a
GPU: the committed file is its own regeneration, keeps its classes' rules and shares no shape
with what the planner was calibrated on; the harness's plan, summary math and the whole
per-entry machinery (on NumPy stand-ins for CuPy) work."""
import json
import math
import pathlib
import sys
import time
import types

import ml_dtypes
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import corpus, heldout  # noqa: E402


@pytest.fixture(scope="module")
def doc():
    return corpus.load()


# --- the corpus ----------------------------------------------------------------------------------

def test_committed_corpus_equals_its_regeneration_and_is_held_out():
    assert corpus.check() == []


def test_sizes_classes_dtypes_and_layouts(doc):
    entries = doc["entries"]
    assert len(entries) >= 160
    assert len({e["id"] for e in entries}) == len(entries)
    by_class = {c: [e for e in entries if e["class"] == c] for c in corpus.CLASSES}
    assert set(by_class) == {"general", "decode", "longk", "odd", "batched", "small_square",
                             "large_square"}
    assert all(len(v) >= 15 for v in by_class.values()), {c: len(v) for c, v in by_class.items()}
    dtypes = [e["dtype"] for e in entries]
    assert set(dtypes) <= set(corpus.DTYPES)
    assert dtypes.count("int8") >= 24 and dtypes.count("float32_3xtf32") >= 16
    assert dtypes.count("float16") + dtypes.count("bfloat16") > len(entries) / 2
    assert all(e["transa"] in "NT" and e["transb"] in "NT" for e in entries)
    assert {e["transa"] + e["transb"] for e in entries if e["dtype"] == "int8"} == \
        set(corpus.LAYOUTS)
    assert doc["counts"] == corpus.counts(entries)
    assert "redrawn" in doc["how"] and "seed" in doc


def test_every_entry_keeps_its_class_rules(doc):
    for e in doc["entries"]:
        m, n, k, b, c = e["m"], e["n"], e["k"], e["batch"], e["class"]
        assert min(m, n, k, b) >= 1, e
        assert b == 1 or c == "batched", e
        if c == "general":
            assert 16 <= min(m, n, k) and max(m, n, k) <= 16384 and m * n * k <= 2**37
            assert max(m * k, k * n, m * n) <= 2**28
        elif c == "decode":
            assert 1 <= m <= 128 and 1024 <= min(n, k) and max(n, k) <= 16384 and n * k >= 8 * m
        elif c == "longk":
            assert m * n <= 1_000_000 and 16 <= min(m, n) and 16384 <= k <= 65536
        elif c == "odd":
            assert all(x % 2 == 1 and 17 <= x <= 9100 for x in (m, n, k)) and m * n * k <= 2**37
        elif c == "batched":
            assert 4 <= b <= 64 and 16 <= min(m, n, k) and max(m, n, k) <= 1024
        elif c == "small_square":
            assert m == n == k and 64 <= m <= 1024
        elif c == "large_square":
            assert 2048 - 64 <= min(m, n, k) and max(m, n, k) <= 8192 + 64
            assert len({m, n, k}) <= 2          # a square, or a square with one tail
        if e["dtype"] == "int8" and c != "odd":    # so that torch._int_mm can be the yardstick
            assert m > 16 and k % 8 == 0 and n % 8 == 0, e


def test_odd_class_has_primes_and_no_multiple_of_8(doc):
    odd = [x for e in doc["entries"] if e["class"] == "odd" for x in (e["m"], e["n"], e["k"])]
    assert all(x % 8 for x in odd)
    assert any(corpus._is_prime(x) for x in odd) and not all(corpus._is_prime(x) for x in odd)


def test_excluded_shapes_are_read_from_every_source():
    missing = []
    ex = corpus.excluded_shapes(missing)
    assert missing == []                      # the tables' source runs are all in the checkout
    assert (4095, 4097, 1023) in ex           # the suite
    assert (17024, 256, 4096) in ex           # an sm90 run the calibration was derived from
    assert (1000, 1000, 1001) in ex           # calibration_h100.json's points
    assert any("choices_sm90_h100.json" in w for w in ex[(16, 4096, 4096)])
    assert (1693, 1712, 29) in ex             # the older held-out set
    # table triples are found however they are stored
    found = corpus.shapes_in_json({"a": [{"m": 1, "n": 2, "k": 3}], "shape": [4, 5, 6],
                                   "problem": "7x8x9", "config": "sliced_128x128x32"})
    assert found == {(1, 2, 3), (4, 5, 6), (7, 8, 9)}


def test_disjoint_both_orientations(doc):
    e = doc["entries"][0]
    assert not corpus.is_disjoint_from({(e["m"], e["n"], e["k"])})
    assert not corpus.is_disjoint_from({(e["n"], e["m"], e["k"])})      # Cᵀ: the same GEMM
    assert corpus.is_disjoint_from(set(corpus.excluded_shapes()))
    old = {tuple(s) for v in corpus.load(corpus.OLD_HELDOUT)["shapes"].values() for s in v}
    assert corpus.overlaps(old) == {}


def test_a_colliding_draw_is_redrawn_and_recorded(doc):
    first = doc["entries"][0]
    mnk = (first["m"], first["n"], first["k"])
    again = corpus.generate(set(corpus.excluded_shapes()) | {mnk})
    assert all((e["m"], e["n"], e["k"]) != mnk for e in again["entries"])
    assert {"class": first["class"], "m": mnk[0], "n": mnk[1], "k": mnk[2],
            "why": "excluded"} in again["redrawn"]
    assert len(again["entries"]) == len(doc["entries"])


def test_cli_check(capsys):
    assert corpus.main(["--check"]) == 0
    assert "equals its regeneration" in capsys.readouterr().out


# --- the harness: plan, estimate, summary ----------------------------------------------------

def _entry(i, cls, dtype, m, n, k, batch=1, lay="NN"):
    return {"id": f"t-{i}", "class": cls, "m": m, "n": n, "k": k, "batch": batch, "dtype": dtype,
            "transa": lay[0], "transb": lay[1]}


def test_yardsticks_and_calls():
    y = heldout.yardstick_calls(_entry(0, "general", "int8", 17, 16, 24))
    assert y["torch"] == "torch._int_mm(A, B)" and y["cupy"] is None
    for bad in (_entry(1, "decode", "int8", 16, 16, 24), _entry(2, "odd", "int8", 17, 17, 24),
                _entry(3, "odd", "int8", 17, 16, 25), _entry(4, "batched", "int8", 32, 16, 24, 4)):
        assert heldout.yardstick_calls(bad)["torch"] is None, bad
    why = heldout.yardstick_calls(_entry(1, "decode", "int8", 16, 16, 24))["torch_why"]
    assert "m <= 16" in why
    # int8 also in cuBLASLt's own arrangement, unless the stored layout already is it ('NT')
    assert heldout.yardstick_calls(_entry(0, "general", "int8", 17, 16, 24, lay="TT"))["torch_tn"]
    assert heldout.yardstick_calls(_entry(0, "general", "int8", 17, 16, 24, lay="NT"))[
        "torch_tn"] is None
    assert heldout.yardstick_calls(_entry(0, "general", "float16", 17, 16, 24))["torch_tn"] is None
    assert heldout.yardstick_calls(_entry(5, "general", "bfloat16", 8, 8, 8))["cupy"] is None
    assert "SGEMM" in heldout.yardstick_calls(_entry(6, "odd", "float32_3xtf32", 9, 9, 9))["torch"]
    e3 = _entry(7, "odd", "float32_3xtf32", 9, 9, 9)
    assert heldout.ours_kwargs(e3, "auto") == {"compute": "3xtf32"}
    assert heldout.ours_kwargs(e3, "cublas") == {"backend": "cublas", "compute": "3xtf32"}
    assert heldout.planner_candidates(e3) == ("tensorcore", "cublas")   # SGEMM is its route
    assert heldout.ours_kwargs(_entry(8, "general", "int8", 32, 8, 8), "tensorcore") == \
        {"backend": "tensorcore", "dtype": np.int32}
    assert heldout.ours_call(_entry(8, "general", "int8", 32, 8, 8), "auto") == \
        "pyblasgemm.matmul(A, B, dtype=numpy.int32)"
    assert heldout.ours_kwargs(_entry(9, "general", "float16", 8, 8, 8), "auto") == {}


def test_select_interleaves_and_filters(doc):
    got = heldout.select(doc["entries"], limit=len(corpus.CLASSES))
    assert [e["class"] for e in got] == list(corpus.CLASSES)      # one of each class first
    got = heldout.select(doc["entries"], classes={"odd"}, dtypes=heldout._dtype_list("i8"),
                         order="corpus")
    assert got and all(e["class"] == "odd" and e["dtype"] == "int8" for e in got)
    assert len(heldout.select(doc["entries"], ids={"decode-03", "odd-00"})) == 2


def test_dry_run_needs_no_gpu(capsys):
    before = set(sys.modules)
    assert heldout.main(["--dry-run", "--classes", "decode,odd", "--limit", "6"]) == 0
    out = capsys.readouterr().out
    assert "decode-00" in out and "odd-00" in out and "6 entries" in out
    assert "estimated seconds" in out and "total" in out
    assert not {"cupy", "torch"} & (set(sys.modules) - before)     # imported neither
    per_class = heldout.dry_run(corpus.load()["entries"], out=open("/dev/null", "w"))
    assert set(per_class) == set(corpus.CLASSES) and all(s > 0 for s in per_class.values())
    big = heldout.estimate_s(_entry(0, "large_square", "float32_3xtf32", 8192, 8192, 8192))
    assert big > heldout.estimate_s(_entry(1, "large_square", "float16", 8192, 8192, 8192))


def _row(i, cls, dtype, auto, tc, cublas, within=(True, True), yard=True):
    sp = {n: {"steady": v, "single": v} for n, v in (("auto", auto), ("tensorcore", tc),
                                                     ("cublas", cublas))}
    return {"id": f"r{i}", "class": cls, "dtype": dtype, "speedup": sp if yard else {},
            "yardstick": {"steady": {"name": "torch", "s": 1.0}} if yard else None,
            "planner": {"within_5pct": {"steady": within[0], "single": within[1]}},
            "contenders": {"auto": {"check": {"ok": True}, "error": None}}}


def test_summary_math():
    rows = [_row(0, "general", "float16", 2.0, 1.0, 1.0),
            _row(1, "general", "bfloat16", 0.5, 0.8, 1.0, within=(False, True)),
            _row(2, "odd", "float16", 4.0, 4.0, 1.0, within=(None, False)),
            _row(3, "odd", "int8", 0.85, 0.95, 1.0, yard=False),
            _row(4, "large_square", "float32_3xtf32", 1.5, 1.5, 3.0)]
    rows[1]["contenders"]["tensorcore"] = {"check": {"ok": False}, "error": None}
    rows[2]["contenders"]["cublas"] = {"check": None, "error": "RuntimeError: boom"}
    s = heldout.summarize(rows)
    fp = s["fp16/bf16"]
    g = fp["by_class"]["general"]["auto"]["steady"]
    assert g["n"] == 2 and g["geomean"] == pytest.approx(1.0) and g["below_0.9"] == 1
    assert g["min"] == 0.5 and g["max"] == 2.0
    o = fp["overall"]["auto"]["single"]
    assert o["n"] == 3 and o["geomean"] == pytest.approx(4 ** (1 / 3))
    assert fp["overall"]["tensorcore"]["steady"]["below_0.9"] == 1
    p = fp["overall"]["planner_within_5pct"]
    assert p["steady"] == {"n": 2, "count": 1, "pct": 50.0}
    assert p["single"]["count"] == 2 and p["single"]["pct"] == pytest.approx(200 / 3)
    # int8 without a yardstick: no ratios, but its planner verdict counts
    i8 = s["int8"]["overall"]
    assert i8["auto"]["steady"]["n"] == 0 and i8["auto"]["steady"]["geomean"] is None
    assert i8["planner_within_5pct"]["steady"]["n"] == 1
    assert s["3xtf32"]["overall"]["cublas"]["steady"]["geomean"] == pytest.approx(3.0)
    assert s["all"]["overall"]["rows"] == 5 and s["all"]["overall"]["auto"]["steady"]["n"] == 4
    assert s["no_yardstick"] == ["r3"]
    assert s["failed_checks"] == ["r1 tensorcore"]
    assert s["errors"] == ["r2 cublas: RuntimeError: boom"]
    text = heldout.format_summary(s)
    assert "== fp16/bf16" in text and "general" in text and "no_yardstick: 1" in text


def test_verdicts_planner_within_5pct():
    def res(auto, tc, cublas, torch=1.0):
        c = {"torch": {"steady_s": torch, "single_s": torch}, "cupy": {"skipped": "n/a"}}
        for n, t in (("auto", auto), ("tensorcore", tc), ("cublas", cublas)):
            c[n] = {"steady_s": t, "single_s": t, "check": {"ok": t is not None}}
        return c

    e = _entry(0, "general", "float16", 64, 64, 64)
    row = {"contenders": res(1.04, 1.0, 1.2), "plan": {"auto": {"backend": "tensorcore"}}}
    heldout._verdicts(row, e)
    assert row["planner"]["within_5pct"] == {"steady": True, "single": True}
    assert row["planner"]["picked_best"]["steady"] is True
    assert row["speedup"]["auto"]["steady"] == pytest.approx(1 / 1.04)
    assert row["yardstick"]["steady"]["name"] == "torch" and row["status"] == "ok"
    row = {"contenders": res(1.06, 1.2, 1.0), "plan": {"auto": {"backend": "tensorcore"}}}
    heldout._verdicts(row, e)
    assert row["planner"]["within_5pct"]["steady"] is False
    assert row["planner"]["best_forced"]["steady"] == "cublas"
    # 3xtf32: auto chooses between ours and cuBLAS's SGEMM (its cuBLAS route)
    row = {"contenders": res(1.04, 1.0, 0.5), "plan": {}}
    heldout._verdicts(row, _entry(1, "odd", "float32_3xtf32", 9, 9, 9))
    assert row["planner"]["within_5pct"]["steady"] is False
    assert row["planner"]["best_forced"]["steady"] == "cublas"
    # a failed check marks the row; no yardstick is said why
    c = res(1.0, None, 1.0)
    c["torch"] = {"skipped": "torch._int_mm needs m <= 16"}
    row = {"contenders": c, "plan": {}}
    heldout._verdicts(row, e)
    assert row["status"] == "check_failed" and row["yardstick"] is None
    assert "m <= 16" in row["yardstick_none_why"]


# --- the whole machinery on NumPy stand-ins for CuPy -----------------------------------------

class _Arr(np.ndarray):
    """A NumPy array with CuPy's .get()."""

    def get(self):
        return np.asarray(self)


def _fa(x):
    return np.asarray(x).view(_Arr)


class _RandomState:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def uniform(self, lo, hi, size, dtype):
        return _fa(self.rng.uniform(lo, hi, size).astype(dtype))

    def randint(self, lo, hi, size, dtype):
        return _fa(self.rng.integers(lo, hi, size).astype(dtype))


_NOOP = types.SimpleNamespace(free_all_blocks=lambda: None)
FAKE_CP = types.SimpleNamespace(
    ndarray=_Arr, asarray=_fa, ascontiguousarray=lambda x: _fa(np.ascontiguousarray(x)),
    empty=lambda n, dtype: _fa(np.empty(n, dtype)),
    matmul=lambda a, b: _fa(np.matmul(np.asarray(a), np.asarray(b))),
    random=types.SimpleNamespace(RandomState=_RandomState),
    cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None)),
    get_default_memory_pool=lambda: _NOOP, get_default_pinned_memory_pool=lambda: _NOOP)


def _paired_single_us(fns, calls=5, warmup=1):
    out = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        t = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e6)
        out[name] = float(np.median(t))
    return out


def _fake_pb():
    """pyblasgemm's planner and plan cache (real, CPU), a NumPy matmul that is wrong when
    forced onto 'tensorcore' for bfloat16 and raises for forced 'cublas' on int8."""
    import pyblasgemm

    def matmul(a, b, dtype=None, backend=None, compute=None):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == np.int8:
            if backend == "cublas":
                raise RuntimeError("cublas refused")
            return _fa(np.matmul(a.astype(np.int32), b.astype(np.int32)))
        wide = np.matmul(a.astype(np.float64), b.astype(np.float64))
        if a.dtype == ml_dtypes.bfloat16 and backend == "tensorcore":
            wide = wide + 1.0
        return _fa(wide.astype(a.dtype))

    return types.SimpleNamespace(matmul=matmul, plan=pyblasgemm.plan,
                                 get_plan_cache=pyblasgemm.get_plan_cache,
                                 clear_plan_cache=pyblasgemm.clear_plan_cache)


class _FakeGpu(heldout.Gpu):
    def meta(self):
        return {"device": {"name": "NumPy stand-in"}, "git_sha": "test"}


@pytest.fixture
def fake_gpu():
    return _FakeGpu(cp=FAKE_CP, pb=_fake_pb(), torch=None,
                    timing=types.SimpleNamespace(paired_single_us=_paired_single_us))


SMALL = [_entry(0, "general", "float16", 20, 24, 32, lay="TN"),
         _entry(1, "decode", "bfloat16", 1, 40, 24, lay="NT"),
         _entry(2, "batched", "bfloat16", 5, 6, 7, batch=3, lay="TT"),
         _entry(3, "odd", "float32_3xtf32", 9, 11, 13, lay="TN"),
         _entry(4, "small_square", "int8", 24, 24, 24, lay="TT")]


def test_harness_runs_end_to_end_on_stand_ins(tmp_path, fake_gpu, capsys):
    cpath = tmp_path / "corpus.json"
    cpath.write_text(json.dumps({"entries": SMALL}))
    out = tmp_path / "res.json"
    argv = ["--corpus", str(cpath), "--out", str(out), "--no-progress", "--order", "corpus"]
    assert heldout.main(argv + ["--limit", "3"], gpu=fake_gpu) == 0
    doc = json.loads(out.read_text())
    assert [r["id"] for r in doc["rows"]] == ["t-0", "t-1", "t-2"]
    assert heldout.main(argv, gpu=fake_gpu) == 2            # never overwrites a results file
    capsys.readouterr()
    assert heldout.main(argv[:2] + ["--resume", str(out), "--no-progress"], gpu=fake_gpu) == 0
    doc = json.loads(out.read_text())
    rows = {r["id"]: r for r in doc["rows"]}
    assert list(rows) == ["t-0", "t-1", "t-2", "t-3", "t-4"] and len(doc["sessions"]) == 2
    assert doc["schema"] == heldout.SCHEMA and doc["method"]["rounds"] == 3
    fp16 = rows["t-0"]
    assert fp16["status"] == "ok" and fp16["yardstick"]["steady"]["name"] == "cupy"
    for name in heldout.OURS:
        c = fp16["contenders"][name]
        assert c["check"]["ok"] and c["steady_s"] > 0 and c["single_s"] > 0
        assert fp16["speedup"][name]["steady"] > 0
    # the route each of ours ran, as the suite writes it (cuBLAS forced: no plan kept)
    assert fp16["contenders"]["auto"]["route"] == heldout.route_of_plan(fp16["plan"]["auto"])
    assert fp16["contenders"]["tensorcore"]["route"].startswith("tensorcore ")
    assert fp16["contenders"]["cublas"]["route"] == "cublas"
    assert "route" not in fp16["contenders"]["cupy"]
    # the plan of matmul's problem Cᵀ = Bᵀ Aᵀ: m and n swapped, transa/transb swapped
    plan = fp16["plan"]["auto"]
    assert plan["how_found"] == "pyblasgemm.plan()" and plan["backend"] in ("tensorcore", "cublas")
    assert "NT m=24 n=20 k=32" in plan["problem"]
    assert rows["t-2"]["plan"]["auto"]["problem"].endswith("batch=3 align=2")
    assert fp16["planner"]["within_5pct"]["steady"] is not None
    # bfloat16: no CuPy yardstick and no torch here -> no yardstick; forced tensorcore is wrong
    bf = rows["t-1"]
    assert bf["yardstick"] is None and bf["status"] == "check_failed"
    assert bf["contenders"]["tensorcore"]["check"]["ok"] is False
    assert bf["contenders"]["tensorcore"]["steady_s"] is None        # a wrong result is not timed
    assert rows["t-2"]["contenders"]["auto"]["check"]["ok"]          # batched, transposed
    f32 = rows["t-3"]
    assert f32["contenders"]["auto"]["call"] == "pyblasgemm.matmul(A, B, compute='3xtf32')"
    from pyblasgemm.benchmarks.suite import DTYPES, tolerance
    assert f32["contenders"]["auto"]["check"]["tol"] == tolerance(DTYPES["3xtf32"], 13)
    assert f32["contenders"]["cublas"]["check"]["tol"] == tolerance(DTYPES["fp32"], 13)   # SGEMM
    i8 = rows["t-4"]
    assert i8["contenders"]["auto"]["check"] == {**i8["contenders"]["auto"]["check"],
                                                 "ok": True, "max_rel_err": 0.0, "tol": 0.0}
    assert "cublas refused" in i8["contenders"]["cublas"]["error"] and i8["status"] == "error"
    assert i8["yardstick"] is None                 # torch._int_mm would apply, but no torch here
    s = doc["summary"]
    assert set(s["no_yardstick"]) == {"t-1", "t-2", "t-4"}
    assert s["failed_checks"] == ["t-1 tensorcore", "t-2 tensorcore"]
    assert s["fp16/bf16"]["overall"]["auto"]["steady"]["n"] == 1
    assert math.isfinite(s["3xtf32"]["overall"]["auto"]["steady"]["geomean"])
    assert heldout.main(["--summary", str(out)]) == 0
    assert "== all" in capsys.readouterr().out


def test_meta_records_the_seed_the_settings_and_nvrtc(monkeypatch):
    """Issue 35 item 5: what decides the numbers besides the code, in every held-out file (and
    in those of the scripts that take heldout.meta); it lacked the settings and NVRTC."""
    from pyblasgemm.benchmarks import suite

    monkeypatch.setattr(suite, "_Env", lambda device: types.SimpleNamespace(
        info=lambda: {"device": {"name": "stand-in"}, "versions": {}}))
    monkeypatch.setattr(suite, "_nvrtc_version", lambda: "13.5")
    monkeypatch.setenv("PYBLASGEMM_PLAN_CACHE_SIZE", "77")
    got = heldout.meta(types.SimpleNamespace(torch=None))
    assert got["seed"] == heldout.ROW_SEED
    assert got["settings"] == {"PYBLASGEMM_PLAN_CACHE_SIZE": "77"}
    assert got["nvrtc"] == got["versions"]["nvrtc"] == "13.5"
    assert heldout.meta(types.SimpleNamespace(torch=None), seed=7)["seed"] == 7


def test_every_bench_results_json_records_its_provenance():
    """Every script that writes a results JSON takes suite.provenance (the seed, the
    PYBLASGEMM_* settings, NVRTC): itself, through heldout.meta, or through grouped_fused's
    run_cases (which passes heldout.meta its seed)."""
    scripts = [p for p in sorted((ROOT / "bench").glob("*.py"))
               if "json.dump" in p.read_text()
               and p.name not in ("corpus.py", "model_corpus.py")]   # (the corpora: inputs)
    assert len(scripts) >= 15
    runner = (ROOT / "bench" / "grouped_fused.py").read_text()
    assert "def run_cases(" in runner and "**meta(" in runner and "seed=" in runner
    lacking = [p.name for p in scripts
               if "run_cases(" not in p.read_text() and (
                   "provenance(" not in p.read_text() and "meta(" not in p.read_text()
                   or "meta(" in p.read_text() and "seed=" not in p.read_text())]
    assert lacking == []


def test_max_seconds_stops_cleanly(tmp_path, fake_gpu, capsys):
    cpath = tmp_path / "corpus.json"
    cpath.write_text(json.dumps({"entries": SMALL}))
    out = tmp_path / "res.json"
    assert heldout.main(["--corpus", str(cpath), "--out", str(out), "--no-progress",
                         "--max-seconds", "1"], gpu=fake_gpu) == 0
    doc = json.loads(out.read_text())
    assert doc["rows"] == [] and "max-seconds" in doc["sessions"][0]["stopped"]
    assert "--resume" in capsys.readouterr().err


def test_readme_heldout_table_is_the_named_results_files():
    """The README's held-out table is computed from the two result files it names (H100 and
    H200), not typed in; both files ran the committed corpus on the device they name."""
    import re

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"bench/results/(heldout_(h100|h200)_[\w.-]+\.json)", section)
    files = {gpu.upper(): name for name, gpu in dict.fromkeys(names)}
    assert set(files) == {"H100", "H200"}, names
    docs = {g: json.loads((ROOT / "bench" / "results" / n).read_text()) for g, n in files.items()}
    assert heldout.readme_table(docs) in section
    corpus = json.loads((ROOT / "bench" / "heldout_corpus_2026-11-24.json").read_text())
    for gpu, doc in docs.items():
        assert gpu in doc["meta"]["device"]["name"] and doc["meta"]["device"]["name"] in section
        assert len(doc["rows"]) == len(corpus["entries"]) == 168
        assert doc["meta"]["git_sha"][:7] in section


def test_performance_page_quotes_the_2026_11_28_h200_heldout_run():
    """docs/performance.rst's paragraph on the 2026-11-28 H200 run of the whole corpus quotes
    that file's summary: overall and per class (fp16/bf16), shapes below 0.9x, planner within 5 %."""
    name = "heldout_h200_2026-11-28_239103c.json"
    doc = json.loads((ROOT / "bench" / "results" / name).read_text())
    page = " ".join((ROOT / "docs" / "performance.rst").read_text().split())     # lines wrapped anywhere
    assert f"bench/results/{name}" in page and doc["meta"]["device"]["name"] == "NVIDIA H200"
    assert len(doc["rows"]) == 168 and not doc["summary"]["failed_checks"]
    every = doc["summary"]["all"]["overall"]
    auto, ours, planner = every["auto"], every["tensorcore"], every["planner_within_5pct"]
    assert f"**{auto['steady']['geomean']:.2f}x steady, {auto['single']['geomean']:.2f}x single**" in page
    assert f"our kernels forced {ours['steady']['geomean']:.2f}x / {ours['single']['geomean']:.2f}x" in page
    assert f"{auto['steady']['below_0.9']} / {auto['single']['below_0.9']} shapes below 0.9x" in page
    assert (f"**planner within 5 % of the best forced route on {planner['steady']['pct']:.0f} % (steady) / "
            f"{planner['single']['pct']:.0f} % (single)**") in page
    half = doc["summary"]["fp16/bf16"]
    names = {"general": "general", "decode": "decode", "longk": "long K", "odd": "odd", "batched": "batched",
             "small_square": "small squares", "large_square": "large squares"}
    for cls, words in names.items():
        a = half["by_class"][cls]["auto"]
        assert f"{words} {a['steady']['geomean']:.2f} / {a['single']['geomean']:.2f}" in page, cls


# ---------------------------------------------------------------------------------------------
# the model-layer corpus (bench/model_corpus.py)


def test_model_corpus_is_its_generators_and_marks_the_planners_shapes():
    """The committed model-layer corpus equals its regeneration (a planner table that gains one
    of its shapes changes ``in_planner_data`` and fails this: a leak is seen, not hidden), and
    every layer is the product its configuration gives."""
    from bench import model_corpus as mc

    doc = mc.load()
    assert doc == json.loads(mc.dumps(mc.generate()))
    entries = doc["entries"]
    assert len({e["id"] for e in entries}) == len(entries)
    assert {e["model"] for e in entries} == set(mc.MODELS) and len(mc.MODELS) >= 8
    assert {e["m"] for e in entries if e["class"] == "decode"} == set(mc.DECODE)
    pre = [e["m"] for e in entries if e["class"] == "prefill"]
    # entries of bench/corpus.py's form: bench/heldout.py runs them
    assert all((e["batch"], e["transa"], e["transb"], e["dtype"]) == (1, "N", "T", "bfloat16")
               for e in entries)
    assert min(pre) >= mc.PREFILL_RANGE[0] and max(pre) <= mc.PREFILL_RANGE[1] and any(m % 2 for m in pre)
    # Llama-3-8B: q 4096 + k, v 8 x 128 each; gate/up 14336; Gemma-2-9B: 16 heads of 256
    layer = {(e["model"], e["layer"]): (e["k"], e["n"]) for e in entries}
    assert layer["llama-3-8b", "qkv"] == (4096, 6144) and layer["llama-3-8b", "down"] == (14336, 4096)
    assert layer["gemma-2-9b", "qkv"] == (3584, 8192) and layer["gemma-2-9b", "o"] == (4096, 3584)
    assert layer["falcon-7b", "qkv"] == (4544, 4672) and layer["phi-3-mini", "gate_up"] == (3072, 16384)
    assert any(e["in_planner_data"] for e in entries) and not all(e["in_planner_data"] for e in entries)
