"""The benchmark suite without a GPU: suite definitions, argument parsing, the results schema
(on a host smoke run of the real machinery), and the plot script on a synthetic JSON."""
import copy
import json
import pathlib

import pytest

import pyblasgemm.__main__ as cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


from pyblasgemm.benchmarks import plot, suite   # noqa: E402  (in the package: wheels run them)


# --- suite definitions -------------------------------------------------------------------------

def test_public_suite_is_the_documented_one():
    shapes = {(p.m, p.n, p.k) for p in suite.SUITES["public"]}
    want = {(s, s, s) for s in (1024, 2048, 4096, 8192, 3072, 5000, 1000)}
    want |= {(256, 256, 65536), (512, 512, 32768), (4096, 4096, 128), (4095, 4097, 1023)}
    want |= {(m, n, 4096) for m in (16, 64, 128) for n in (4096, 14336)}
    assert shapes == want
    assert len(suite.SUITES["public"]) == len(want)          # no duplicates
    groups = {p.group for p in suite.SUITES["public"]}
    assert groups == {"square", "tail-wave", "long-K", "decode", "small-K", "odd"}


def test_every_suite_is_made_of_problems():
    for name, problems in suite.SUITES.items():
        assert problems, name
        for p in problems:
            assert min(p.m, p.n, p.k) >= 1 and p.label == f"{p.m}x{p.n}x{p.k}"


def test_default_dtypes_and_type_table():
    assert suite.DEFAULT_DTYPES == ("fp16", "bf16", "int8", "3xtf32")
    import pyblasgemm
    for dt in suite.DTYPES.values():
        assert hasattr(pyblasgemm, dt.routine)
        assert dt.trans in ("NN", "NT", "TN", "TT")
    assert suite.DTYPES["int8"].trans == "TN"          # cuBLAS's native int8 arrangement
    assert suite.DTYPES["3xtf32"].cublas_compute == "fp32"


def test_tolerances_are_tight_enough_to_catch_a_wrong_element():
    for dt in suite.DTYPES.values():
        # fp16 accumulation loses ~sqrt(k) half-precision units: only short K is tight
        for k in ((1, 16) if dt.name == "fp16acc" else (1, 1000, 65536)):
            assert suite.tolerance(dt, k) < 0.05, (dt.name, k)
    assert suite.tolerance(suite.DTYPES["int8"], 4096) == 0.0
    assert suite.tolerance(suite.DTYPES["3xtf32"], 8192) < 1e-4


def test_flops_and_bytes():
    p = suite.Problem("user", 2, 3, 4)
    assert suite.flops(p) == 48
    assert suite.min_bytes(p, suite.DTYPES["fp16"]) == 2 * (8 + 12 + 6)
    assert suite.min_bytes(p, suite.DTYPES["int8"]) == 8 + 12 + 4 * 6


# --- argument parsing --------------------------------------------------------------------------

def test_parse_shapes():
    got = suite.parse_shapes("4096x4096x4096, 16X14336x4096,1*2*3")
    assert [(p.m, p.n, p.k) for p in got] == [(4096, 4096, 4096), (16, 14336, 4096), (1, 2, 3)]
    assert {p.group for p in got} == {"user"}
    for bad in ("4096x4096", "axbxc", "0x1x1", "", "1x2x3x4"):
        with pytest.raises(ValueError):
            suite.parse_shapes(bad)


def test_parse_dtypes():
    assert suite.parse_dtypes("fp16, int8") == ("fp16", "int8")
    with pytest.raises(ValueError, match="choose from"):
        suite.parse_dtypes("fp8")


def _resolve(*argv):
    return suite.resolve(suite.parser().parse_args(list(argv)))


def test_resolve_suite_and_shapes():
    probs, dtypes, impls = _resolve()
    assert probs == suite.SUITES["public"] and dtypes == suite.DEFAULT_DTYPES
    assert impls == suite.GPU_IMPLS
    probs, _, _ = _resolve("--shapes", "8x8x8")
    assert [(p.m, p.n, p.k) for p in probs] == [(8, 8, 8)]           # shapes alone
    probs, _, _ = _resolve("--suite", "tail", "--shapes", "8x8x8")
    assert len(probs) == 3                                          # suite plus shapes
    _, _, impls = _resolve("--device", "host")
    assert impls == suite.HOST_IMPLS
    with pytest.raises(ValueError, match="--impls"):
        _resolve("--impls", "numpy")                                 # not a GPU implementation
    with pytest.raises(SystemExit):
        suite.parser().parse_args(["--suite", "nope"])


def test_cli_list_and_dry_run(capsys):
    assert cli.main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "public" in out and "4095x4097x1023" in out
    assert cli.main(["bench", "--dry-run", "--suite", "long-k", "--dtype", "fp16,int8"]) == 0
    out = capsys.readouterr().out
    assert "256x256x65536" in out and "4 cases x 5 implementations" in out


def test_cli_errors(capsys):
    assert cli.main(["bench", "--dry-run", "--shapes", "12x12"]) == 2
    assert "MxNxK" in capsys.readouterr().err
    assert cli.main(["bench", "--dry-run", "--dtype", "fp8"]) == 2
    with pytest.raises(SystemExit):
        cli.main(["bench", "--bogus"])


def test_quick_host_run_is_quick_writes_to_the_user_directory_and_shows_every_column(
        tmp_path, monkeypatch, capsys):
    """The first-hour promise: ``bench --quick`` on the host ends in under a minute, writes
    into the user's data directory (not the source tree) and tables every implementation."""
    import time

    monkeypatch.setenv("PYBLASGEMM_RESULTS_DIR", str(tmp_path))
    t0 = time.perf_counter()
    assert cli.main(["bench", "--device", "host", "--quick", "--no-progress"]) == 0
    assert time.perf_counter() - t0 < 60
    (path,) = tmp_path.glob("suite_*.json")
    doc = json.loads(path.read_text())
    suite.validate_results(doc)
    assert doc["suite"] == "host"
    assert {r["problem"] for r in doc["results"]} == {p.label for p in suite.SUITES["host"]}
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("dtype"))
    assert all(i in head for i in suite.HOST_IMPLS) and "auto/best peer" in head
    rows = [line for line in out.splitlines() if line.startswith(("fp16 ", "int8 "))]
    assert len(rows) == 2 * len(suite.SUITES["host"])
    for line in rows:   # a time for auto and numpy, then the ratio
        assert len([float(x) for x in line.split()[2:]]) == len(suite.HOST_IMPLS) + 1, line


def test_results_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("PYBLASGEMM_RESULTS_DIR", raising=False)
    assert suite.results_dir() == pathlib.Path.home() / ".local/share/pyblasgemm/bench"
    monkeypatch.setenv("PYBLASGEMM_RESULTS_DIR", str(tmp_path))
    assert suite.results_dir() == tmp_path
    with pytest.raises(ValueError, match="--quick"):
        suite.resolve(suite.parser().parse_args(["--quick", "--suite", "tiny"]))


def test_cli_help_lists_bench(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "bench" in capsys.readouterr().out


# --- a host smoke run and the schema -----------------------------------------------------------

@pytest.fixture(scope="module")
def host_doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "host.json"
    rc = cli.main(["bench", "--device", "host", "--shapes", "17x33x65,8x8x200", "--dtype",
                   "fp16,bf16,int8,3xtf32,tf32", "--out", str(out), "--no-progress"])
    assert rc == 0
    return json.loads(out.read_text())


def test_host_run_is_checked_and_valid(host_doc):
    suite.validate_results(host_doc)
    assert host_doc["schema"] == suite.SCHEMA and host_doc["suite"] == "user"
    assert host_doc["device"]["kind"] == "host"
    recs = host_doc["results"]
    assert len(recs) == 2 * 5 * len(suite.HOST_IMPLS)
    for r in recs:
        assert r["check"]["ok"], r                  # every implementation computed correctly
        assert r["seconds"] > 0 and r["timing"] == "perf_counter"


def test_schema_rejects_broken_documents(host_doc):
    suite.validate_results(copy.deepcopy(host_doc))
    for breaker, msg in [
        (lambda d: d.pop("device"), "device"),
        (lambda d: d.update(schema="other/9"), "schema"),
        (lambda d: d["results"][0].pop("m"), r"results\[0\]\.m"),
        (lambda d: d["results"][0].update(dtype="fp8"), "unknown"),
        (lambda d: d["results"][0]["check"].update(ok=False), "did not pass"),
        (lambda d: d["results"][0].update(seconds=None, error=None), "neither"),
    ]:
        doc = copy.deepcopy(host_doc)
        breaker(doc)
        with pytest.raises(ValueError, match=msg):
            suite.validate_results(doc)


def test_committed_suite_results_are_valid():
    paths = sorted((ROOT / "bench" / "results").glob("suite_*.json"))
    for path in paths:
        suite.validate_results(json.loads(path.read_text()))


# --- plots -------------------------------------------------------------------------------------

def _synthetic():
    recs = []
    for (m, n, k), ours, theirs in [((4096, 4096, 4096), 330.0, 740.0), ((256, 256, 65536),
                                                                          180.0, 270.0)]:
        for impl, tf in (("auto", theirs), ("tensorcore", ours), ("cublas", theirs)):
            f = 2 * m * n * k
            recs.append({"group": "user", "problem": f"{m}x{n}x{k}", "m": m, "n": n, "k": k,
                         "dtype": "fp16", "compute": "default", "trans": "NN", "impl": impl,
                         "flops": f, "min_bytes": 2 * (m * k + k * n + m * n),
                         "rotated_copies": 1, "seconds": f / tf / 1e12, "tflops": tf,
                         "timing": "events", "check": {"ok": True, "max_rel_err": 1e-5,
                                                       "tol": 1e-3, "sampled": 256},
                         "error": None})
    recs.append(dict(recs[0], impl="cupy", seconds=None, tflops=None, check=None,
                     error="not run"))
    return {"schema": suite.SCHEMA, "date": "2026-11-22T04:00:00+00:00",
            "device": {"name": "Synthetic GPU", "kind": "gpu"}, "versions": {}, "method": {},
            "ceilings": {"copy_GBps": 3000.0, "fp16_cublas_tflops": 750.0}, "results": recs}


def test_plot_script_on_synthetic_json(tmp_path):
    pytest.importorskip("matplotlib")
    doc = _synthetic()
    suite.validate_results(doc)
    src = tmp_path / "synthetic.json"
    src.write_text(json.dumps(doc))
    res = plot.load(src)
    assert res.title == "Synthetic GPU, 2026-11-22" and res.kind == "suite"
    ratios = dict(plot.ratios(res)["tensorcore"])
    assert ratios["fp16 4096x4096x4096"] == pytest.approx(330 / 740)
    assert plot.main([str(src), "--out", str(tmp_path / "png")]) == 0
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert names == ["synthetic_ratio.png", "synthetic_roofline.png", "synthetic_tflops.png"]
    for p in (tmp_path / "png").iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_plot_reads_every_committed_results_file(tmp_path):
    pytest.importorskip("matplotlib")
    results = ROOT / "bench" / "results"
    paths = sorted(results.glob("suite_*.json")) + [
        results / name for name in ("backends_h100_2026-11-22.json", "kernels_2026-11-22.json",
                                    "foundation_h100_2026-11-22_run1.json")]
    for path in paths:
        res = plot.load(path)
        assert res.records, path.name
        assert "H100" in res.title
    made = plot.make_plots(ROOT / "bench" / "results" / "kernels_2026-11-22.json", tmp_path)
    assert {p.name for p in made} >= {"kernels_2026-11-22_configs.png",
                                      "kernels_2026-11-22_tflops.png"}


def test_plot_mma_sync_files(tmp_path):
    """bench_mma_sync.py's files (burst / sustained ratios) get their own figure."""
    pytest.importorskip("matplotlib")
    for name in ("mma_sync_h100_2026-11-22.json", "mma_sync_h200_2026-11-22.json"):
        made = plot.make_plots(ROOT / "bench" / "results" / name, tmp_path)
        assert [p.name for p in made] == [name.replace(".json", "_mma_sync.png")]
        assert made[0].stat().st_size > 10_000


def test_plot_rejects_unknown_json(tmp_path):
    src = tmp_path / "x.json"
    src.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a results file"):
        plot.load(src)


def test_readme_performance_table_is_the_named_results_file():
    """The README's headline numbers are computed from the JSON it names, not typed in."""
    import re
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
    (name,) = set(re.findall(r"bench/results/(suite_[\w.-]+\.json)", section))
    doc = json.loads((ROOT / "bench" / "results" / name).read_text())
    assert suite.readme_table(doc) in section
    assert doc["device"]["name"] in section


def test_table_cli(capsys):
    path = ROOT / "bench" / "results" / "suite_h100_2026-11-22.json"
    assert cli.main(["bench", "--table", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| type |") and "| fp16 |" in out


def test_mma_sync_table_in_the_docs_is_the_results_file():
    """docs/performance.rst's mma.sync table (burst / sustained ratios to cuBLAS) shows exactly
    bench/results/mma_sync_h100_2026-11-22.json, rounded to two places."""
    res = json.loads((ROOT / "bench" / "results" / "mma_sync_h100_2026-11-22.json").read_text())
    text = (ROOT / "docs" / "performance.rst").read_text()
    assert "bench/results/mma_sync_h100_2026-11-22.json" in text
    rows = {"mma.sync, cp.async ring": "mma.sync cp.async 128x256x64 s3",
            "mma.sync fed by TMA": "mma.sync TMA 256x128 s4",
            "wgmma (the Hopper kernel)": "wgmma 256x128 s4"}
    cols = [(4096, "TN"), (4096, "NN"), (8192, "TN"), (8192, "NN")]
    for label, impl in rows.items():
        (line,) = [ln for ln in text.splitlines() if ln.startswith(label)]
        want = []
        for size, lay in cols:
            b, s = (next(r["ratio_vs_cublas"] for r in res[part]
                         if r["impl"] == impl and r["size"] == size and r["layout"] == lay)
                    for part in ("burst", "sustained"))
            want.append(f"{b:.2f} / {s:.2f}")
        assert line.split()[-len(want) * 3:] == " ".join(want).split(), (label, line, want)


def test_the_callpath_guide_quotes_its_torch_callpath_run():
    """docs/guide/callpath.rst's JAX-replay and bound-unfused-route numbers are the rounded
    values of the run it names (one H200, same run for each ratio)."""
    root = ROOT
    name = "bench/results/torch_callpath_h200_2026-11-27_228422c.json"
    guide = (root / "docs/guide/callpath.rst").read_text()
    assert name in guide
    doc = json.loads((root / name).read_text())
    assert doc["device"]["name"] == "NVIDIA H200" and doc["git_sha"] == "228422c"
    jax16 = next(r for r in doc["jax"] if r.get("dtype") == "float16")
    fused32 = next(r for r in doc["host"] if r.get("dtype") == "float32" and r["form"] == "fused bias+gelu")
    said = {"jax": round(jax16["jax arrays_us"]), "jnp": round(jax16["jnp.matmul_us"]),
            "ratio": f"{jax16['speedup_vs_jnp']:.2f}", "cupy": round(fused32["cupy arrays_us"]),
            "torch": round(fused32["torch tensors_us"]), "addmm": round(fused32["torch.matmul_us"])}
    assert f"from 96 to {said['jax']} µs a call, against ``jnp.matmul``'s {said['jnp']} µs ({said['ratio']}x)" \
        in " ".join(guide.split()), said
    assert f"{said['cupy']} µs on CuPy arrays and {said['torch']} µs on tensors" in " ".join(guide.split())
    assert f"``gelu``'s {said['addmm']} µs" in " ".join(guide.split())
