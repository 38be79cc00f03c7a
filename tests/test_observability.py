"""Issue 35 item 5: the logger on cold paths only, one warning base, a short repr(Plan),
pyblasgemm.explain(a, b) (host-only: no GPU needed)."""
import logging
import warnings

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.kernels.jit import KernelCacheWarning
from pyblasgemm.planner.autotune import CacheWarning
from pyblasgemm.planner.measured import ChoicesWarning


def _records(caplog):
    return [r for r in caplog.records if r.name.startswith("pyblasgemm")]


def test_first_call_logs_its_plan_and_a_repeated_call_logs_nothing(caplog):
    pyblasgemm.clear_plan_cache()
    a = np.ones((24, 40), np.float64)
    b = np.ones((40, 8), np.float64)
    with caplog.at_level(logging.DEBUG, logger="pyblasgemm"):
        pyblasgemm.matmul(a, b, backend="host")
        first = _records(caplog)
        caplog.clear()
        for _ in range(3):
            pyblasgemm.matmul(a, b, backend="host")
        repeated = _records(caplog)
    assert len(first) == 1 and first[0].levelno == logging.DEBUG
    assert "plan Plan(host)" in first[0].getMessage()
    assert "m=8 n=24 k=40" in first[0].getMessage()     # the column-major problem
    assert repeated == []


def test_no_hot_path_function_logs_before_its_memoized_return():
    """Item 5: the logger on cold paths only, read from the source: in the functions every
    repeated call runs (tests/test_imports.py's HOT_PATHS), a log, print or warn call comes only
    after the function's first ``return`` (plan_for's memoized plan), i.e. on a miss."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_hot",
                                                  Path(__file__).with_name("test_imports.py"))
    hot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hot)
    seen, early = 0, []
    for relpath, names in hot.HOT_PATHS.items():
        tree = ast.parse((hot.PACKAGE / relpath).read_text())
        for fn in ast.walk(tree):
            if not (isinstance(fn, ast.FunctionDef) and fn.name in names):
                continue
            returns = [x.lineno for x in ast.walk(fn) if isinstance(x, ast.Return)]
            first = min(returns, default=fn.end_lineno)
            for x in ast.walk(fn):
                if isinstance(x, ast.Call):
                    name = ast.unparse(x.func)
                    if name.split(".")[0] in ("log", "logging", "logger") or name in (
                            "print", "warnings.warn"):
                        seen += 1
                        if x.lineno <= first:
                            early.append(f"{relpath}:{fn.name}:{x.lineno} {name}")
    assert early == []
    assert seen >= 1            # plan_for's, after its memoized return: the check reads them


def test_the_logger_is_silent_by_default(capsys):
    # DEBUG/INFO records never reach logging's last-resort handler (WARNING and up)
    pyblasgemm.clear_plan_cache()
    pyblasgemm.matmul(np.ones((5, 6)), np.ones((6, 7)), backend="host")
    assert capsys.readouterr().err == ""


def _package_warnings():
    """The warning classes the package's source defines (module, name) and the category of
    each ``warnings.warn`` call in it (path:line, name; None when the call names none, i.e.
    UserWarning), read with ``ast``: a new module's class or call counts without a list here."""
    import ast
    from pathlib import Path

    root = Path(pyblasgemm.__file__).resolve().parent
    classes, calls = [], []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("Warning")
                                                      for b in node.bases):
                classes.append((module, node.name))
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "warnings.warn":
                given = node.args[1:2] + [k.value for k in node.keywords if k.arg == "category"]
                where = f"{path.relative_to(root.parent)}:{node.lineno}"
                calls.append((where, ast.unparse(given[0]) if given else None))
    return classes, calls


#: NumPy's own floating-point warnings, raised where NumPy would raise them (the host backend
#: reports a product's overflow as numpy.matmul does): not pyblasgemm's to rename
NUMPY_WARNINGS = {("pyblasgemm/backends/host.py", "RuntimeWarning")}


def test_every_warning_the_package_raises_is_a_pyblasgemm_warning():
    """Issue 35 item 5: one base. The test named three classes and missed the fourth
    (CublasLtWarning, item 1's); it now reads every class and every warn call from the source."""
    import importlib

    classes, calls = _package_warnings()
    found = {name: getattr(importlib.import_module(module), name) for module, name in classes}
    assert {"PyblasgemmWarning", "CacheWarning", "ChoicesWarning", "KernelCacheWarning",
            "CublasLtWarning"} <= set(found)
    for name, cls in found.items():
        assert issubclass(cls, pyblasgemm.PyblasgemmWarning), name
    assert len(calls) >= 5           # (the caches warn through one helper each)
    for where, category in calls:
        if (where.split(":")[0], category) not in NUMPY_WARNINGS:
            assert category in found, (where, category)


@pytest.mark.parametrize("cls", [CacheWarning, ChoicesWarning, KernelCacheWarning])
def test_every_warning_class_derives_from_the_one_base(cls):
    assert issubclass(cls, pyblasgemm.PyblasgemmWarning)
    assert issubclass(pyblasgemm.PyblasgemmWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pyblasgemm.PyblasgemmWarning)
        with pytest.raises(cls):
            warnings.warn("x", cls)


def test_plan_repr_is_one_short_line():
    p = pyblasgemm.plan(8192, 8192, 8192, "f32", compute="3xtf32")
    r = repr(p)
    assert r.startswith("Plan(backend='tensorcore', config=") and "\n" not in r
    assert len(r) < 160 and "arch=" not in r and "reason=" not in r
    assert f"source={p.source!r}" in r
    assert str(pyblasgemm.plan(64, 64, 64, "f64", backend="cublas")) == "Plan(cublas)"


def test_explain_describes_the_row_major_call_with_m_and_n_swapped():
    a = np.ones((300, 40), np.float32)
    b = np.ones((40, 100), np.float32)
    text = pyblasgemm.explain(a, b, compute="tf32")
    assert text.splitlines()[0] == ("matmul: a (300, 40) float32 @ b (40, 100) float32 -> "
                                    "(300, 100) float32")
    assert "m=100 n=300 k=40" in text
    assert "plan: backend 'host'" in text
    # the plain NumPy call takes matmul's direct branch: no plan at all
    assert "no plan" in pyblasgemm.explain(a, b)


def test_explain_batched_and_transposed_views():
    a = np.ones((3, 40, 64), np.float16).swapaxes(1, 2)     # (3, 64, 40), column-major slices
    b = np.ones((40, 16), np.float16)
    text = pyblasgemm.explain(a, b, backend="host")
    assert "(3, 64, 16) float16" in text and "batch 3" in text
    assert "NT m=16 n=64 k=40 lda=16 ldb=64 ldc=16" in text     # A read transposed in place


def test_explain_runs_nothing(monkeypatch):
    from pyblasgemm import execute

    def boom(*a, **k):
        raise AssertionError("explain ran the product")
    monkeypatch.setattr(execute, "execute", boom)
    pyblasgemm.explain(np.ones((8, 8)), np.ones((8, 8)), backend="host")


@pytest.mark.parametrize("args, kw, exc, words", [
    (([[1.0]], np.ones((1, 1))), {}, TypeError, "NumPy or both CuPy"),
    ((np.ones((2, 3)), np.ones((4, 2))), {}, ValueError, "inner dimensions 3 and 4"),
    ((np.ones((2, 2, 3)), np.ones((3, 3, 2))), {}, ValueError, "do not broadcast"),
    ((np.ones(()), np.ones(3)), {}, ValueError, "a.ndim=0"),
    ((np.ones((2, 2)), np.ones((2, 2))), {"limit": -1}, ValueError, "limit=-1"),
    ((np.ones((2, 2)), np.ones((2, 2))), {"backend": "gpu"}, ValueError, "gpu"),
])
def test_explain_refusals(args, kw, exc, words):
    with pytest.raises(exc, match=words):
        pyblasgemm.explain(*args, **kw)


# ---------------------------------------------------------------------------------------------
# The disk caches: XDG locations, sizes, the cap, `cache info|clear`, `info --json`
# ---------------------------------------------------------------------------------------------

import json
import os

from pyblasgemm import _files
from pyblasgemm.__main__ import main


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("PYBLASGEMM_CACHE_DIR", raising=False)
    monkeypatch.delenv("PYBLASGEMM_RESULTS_DIR", raising=False)
    monkeypatch.delenv("PYBLASGEMM_CACHE_MAX_MB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


def _fill(d, name, size, age):
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_bytes(b"x" * size)
    t = 1_700_000_000 + age
    os.utime(p, (t, t))
    return p


def test_caches_and_results_follow_xdg(xdg, monkeypatch):
    from pyblasgemm.benchmarks.suite import results_dir
    from pyblasgemm.kernels.jit import kernel_cache_dir
    from pyblasgemm.planner.autotune import cache_dir

    assert cache_dir() == xdg / "cache" / "pyblasgemm"
    assert kernel_cache_dir() == xdg / "cache" / "pyblasgemm" / "kernels"
    assert results_dir() == xdg / "data" / "pyblasgemm" / "bench"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")      # invalid per the spec: ignored
    assert cache_dir().parts[-2:] == (".cache", "pyblasgemm")
    monkeypatch.setenv("PYBLASGEMM_CACHE_DIR", str(xdg / "mine"))
    assert cache_dir() == xdg / "mine"


@pytest.mark.parametrize("platform, local, cache, data", [
    ("darwin", None, "home/Library/Caches/pyblasgemm",
     "home/Library/Application Support/pyblasgemm"),
    ("win32", "local", "local/pyblasgemm/Cache", "local/pyblasgemm"),
    ("win32", None, "home/AppData/Local/pyblasgemm/Cache", "home/AppData/Local/pyblasgemm"),
    ("linux", "local", "home/.cache/pyblasgemm", "home/.local/share/pyblasgemm")])
def test_caches_and_results_in_the_platforms_folders(xdg, monkeypatch, platform, local, cache,
                                                     data):
    """Item 5's "XDG/platformdirs locations": without XDG variables, macOS and Windows get their
    own cache and data folders (they got Linux's ~/.cache and ~/.local/share); an absolute XDG
    variable still wins there, as the user asked for it."""
    import sys
    from pathlib import Path

    from pyblasgemm.benchmarks.suite import results_dir
    from pyblasgemm.kernels.jit import kernel_cache_dir

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: xdg / "home"))
    if local is None:
        monkeypatch.delenv("LOCALAPPDATA", raising=False)
    else:
        monkeypatch.setenv("LOCALAPPDATA", str(xdg / local))
    monkeypatch.setattr(sys, "platform", platform)
    assert _files.cache_home() == xdg / cache
    assert kernel_cache_dir() == xdg / cache / "kernels"
    assert _files.data_home() == xdg / data and results_dir() == xdg / data / "bench"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg / "mine"))
    assert _files.cache_home() == xdg / "mine" / "pyblasgemm"


def test_trim_cache_drops_the_oldest_entries_whole(xdg):
    k = xdg / "cache" / "pyblasgemm" / "kernels"
    for i, age in enumerate((10, 30, 20)):
        _fill(k, f"key{i}.cubin", 1000, age)
        _fill(k, f"key{i}.json", 100, age)
    assert _files.trim_cache("kernels", 2500) == 1100            # key0, the oldest, went
    assert sorted(p.name for p in k.iterdir()) == ["key1.cubin", "key1.json", "key2.cubin",
                                                   "key2.json"]
    assert _files.trim_cache("kernels", 2200) == 0


def test_a_tune_write_enforces_the_cap(xdg, monkeypatch):
    from pyblasgemm.planner.autotune import TuneCache

    d = xdg / "cache" / "pyblasgemm"
    old = _fill(d, "tune-old.json", 1 << 20, 0)
    monkeypatch.setenv("PYBLASGEMM_CACHE_MAX_MB", "1")
    path = TuneCache().put({"device": "X"}, "fp", ["h"], {"backend": "cublas", "time_s": 1e-4})
    assert path.exists() and not old.exists()


def test_cache_info_and_clear_commands(xdg, capsys):
    d = xdg / "cache" / "pyblasgemm"
    _fill(d, "tune-a.json", 10, 0)
    _fill(d, "unrelated.txt", 10, 0)
    _fill(d / "kernels", "k.cubin", 30, 0)
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tune"] == {"path": str(d), "files": 1, "bytes": 10}
    assert info["kernels"] == {"path": str(d / "kernels"), "files": 1, "bytes": 30}
    assert info["max_bytes"] == 1024 << 20
    assert main(["cache", "clear", "--only", "tune"]) == 0
    assert not (d / "tune-a.json").exists() and (d / "kernels" / "k.cubin").exists()
    assert main(["cache", "clear"]) == 0
    assert not (d / "kernels" / "k.cubin").exists() and (d / "unrelated.txt").exists()
    assert "removed 1 files" in capsys.readouterr().out


def test_info_json_without_a_gpu(xdg, capsys):
    assert main(["info", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["versions"]) >= {"pyblasgemm", "python", "numpy", "cupy", "cuda_runtime",
                                    "cuda_driver", "cublas", "nvrtc", "ml_dtypes", "tqdm", "scipy",
                                    "torch", "jax", "jaxlib", "dask", "distributed"}
    assert doc["versions"]["pyblasgemm"] == pyblasgemm.__version__
    # the integrations' versions from their metadata (none imported: torch takes seconds)
    from importlib import metadata

    for dist in ("tqdm", "torch", "jax", "dask"):
        try:
            want = metadata.version(dist)
        except metadata.PackageNotFoundError:
            want = None
        assert doc["versions"][dist] == want, dist
    assert doc["caches"]["tune"]["path"] == str(xdg / "cache" / "pyblasgemm")
    # each cache's location and size, and the cap (item 5: "cache locations and sizes")
    _fill(xdg / "cache" / "pyblasgemm" / "kernels", "k.cubin", 30, 0)
    assert main(["info", "--json"]) == 0
    caches = json.loads(capsys.readouterr().out)["caches"]
    assert caches["kernels"] == {"path": str(xdg / "cache" / "pyblasgemm" / "kernels"),
                                 "files": 1, "bytes": 30}
    assert caches["tune"]["files"] == 0 and caches["max_bytes"] == 1024 << 20
    assert doc["results_dir"] == str(xdg / "data" / "pyblasgemm" / "bench")
    assert isinstance(doc["device"]["gpu"], bool) and doc["device"]["name"]


def test_cache_cap_setting_is_checked(monkeypatch):
    from pyblasgemm import settings

    monkeypatch.setenv("PYBLASGEMM_CACHE_MAX_MB", "-1")
    with pytest.raises(settings.SettingError, match="PYBLASGEMM_CACHE_MAX_MB"):
        _files.max_cache_bytes()


# ---------------------------------------------------------------------------------------------
# Benchmarks: plots outside the package, results that say how they were made
# ---------------------------------------------------------------------------------------------

def test_plots_default_outside_the_package(xdg):
    from pathlib import Path

    from pyblasgemm.benchmarks import plot

    package = Path(pyblasgemm.__file__).resolve().parent
    assert plot.default_out() == xdg / "data" / "pyblasgemm" / "plots"
    assert package not in plot.default_out().resolve().parents
    assert plot.IMPL_LABELS["cublas"] == "cuBLAS (cuBLASLt)"


def test_route_of_names_the_plan_of_pyblasgemm_rows():
    from pyblasgemm.benchmarks import suite

    p = suite.Problem("square", 4096, 4096, 4096)
    forced = suite.route_of(p, suite.DTYPES["fp16"], "NN", "tensorcore", "gpu")
    want = pyblasgemm.plan(4096, 4096, 4096, "f16", backend="tensorcore")
    assert forced == f"tensorcore {want.config.name} {want.decomposition}"
    assert suite.route_of(p, suite.DTYPES["fp16"], "NN", "cublas", "gpu") == "cublas"
    auto = suite.route_of(p, suite.DTYPES["3xtf32"], "NN", "auto", "gpu")
    assert auto.startswith("tensorcore ")        # cuBLAS has no 3xTF32 mode
    assert suite.route_of(p, suite.DTYPES["fp16"], "NN", "torch", "gpu") is None
    assert suite.route_of(p, suite.DTYPES["fp16"], "NN", "auto", "host") == "host"


def test_bench_json_records_route_settings_seed_and_nvrtc(tmp_path, monkeypatch):
    from pyblasgemm.benchmarks import suite

    monkeypatch.setenv("PYBLASGEMM_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("PYBLASGEMM_PLAN_CACHE_SIZE", "512")
    assert main(["bench", "--device", "host", "--quick", "--no-progress"]) == 0
    (path,) = tmp_path.glob("suite_*.json")
    doc = json.loads(path.read_text())
    suite.validate_results(doc)
    assert doc["seed"] == 0
    assert doc["settings"]["PYBLASGEMM_PLAN_CACHE_SIZE"] == "512"
    assert "nvrtc" in doc["versions"]
    assert "cuBLASLt" in doc["method"]["cublas_yardstick"]
    routes = {(r["impl"], r["route"]) for r in doc["results"]}
    assert routes == {("auto", "host"), ("numpy", None)}


# ---------------------------------------------------------------------------------------------
# precompile()
# ---------------------------------------------------------------------------------------------

def test_precompile_compiles_each_kernel_of_our_plans_once(capsys):
    seen = []
    plans = pyblasgemm.precompile(
        [(8192, 8192, 8192, "3xtf32"), {"m": 8192, "n": 8192, "k": 8192, "dtype": "3xtf32"},
         {"m": 64, "n": 64, "k": 64, "dtype": "f16", "backend": "cublas"}],
        compiler=seen.append, workers=1)
    assert [p.backend for p in plans] == ["tensorcore", "tensorcore", "cublas"]
    assert len(seen) == 1 and seen[0][0] == plans[0].config     # deduplicated, cuBLAS: none
    assert "compiling kernels" in capsys.readouterr().err        # the progress bar
    pyblasgemm.precompile([(8192, 8192, 8192, "3xtf32")], compiler=seen.append, progress=False)
    assert capsys.readouterr().err == ""


def test_precompile_without_a_gpu_or_with_bad_arguments_refuses_before_work():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        has_gpu = True
    except Exception:
        has_gpu = False
    if not has_gpu:
        with pytest.raises(RuntimeError, match="needs CuPy and a GPU"):
            pyblasgemm.precompile([(64, 64, 64, "f16")])
    seen = []
    with pytest.raises(TypeError, match="problems="):
        pyblasgemm.precompile("f16", compiler=seen.append)
    with pytest.raises(TypeError, match=r"problems\[1\]"):
        pyblasgemm.precompile([(8192, 8192, 8192, "3xtf32"), (1, 2)], compiler=seen.append)
    with pytest.raises(ValueError, match="workers=0"):
        pyblasgemm.precompile([], workers=0, compiler=seen.append)
    assert seen == []                   # every problem is planned before the first compile


def test_the_first_compile_of_a_process_says_so_once(monkeypatch, capsys, caplog):
    from pyblasgemm.kernels import jit

    monkeypatch.setattr(jit, "_noticed", [])
    jit._first_compile_notice()
    jit._first_compile_notice()
    assert capsys.readouterr().err.count("compiling GPU kernels on first use") == 1
    monkeypatch.setattr(jit, "_noticed", [])
    with caplog.at_level(logging.INFO, logger="pyblasgemm"):
        jit._first_compile_notice()
    assert capsys.readouterr().err == ""
    assert any("precompile()" in r.getMessage() for r in caplog.records)
