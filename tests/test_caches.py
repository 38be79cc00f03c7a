"""Caches and shipped tables are untrusted input (CPU only; no GPU, NVRTC only where marked).

Every read of the autotune cache (planner/autotune.py), the sm_90a kernel cache (cubin +
metadata, kernels/jit.py) and the planner's JSON tables (measured choices, calibration) is
checked for shape and type. Covers:

* autotune: winners of the wrong shape (a string, a list, null, an unknown backend, a config
  that is null or a number, timings that are not numbers, time_s NaN / negative / a bool /
  missing) are ignored with one ``CacheWarning`` by ``TuneCache.get``, ``plan()`` and
  ``tune_desc`` (which tunes again and rewrites a good entry); a cache directory that is a file,
  an entry that is a directory, no permission, a full disk: ``get`` returns None and ``put``
  warns instead of raising, leaving no temporary file; ``tune_desc`` still returns its plan;
* kernel cache: garbage, empty, truncated and altered cubins, and metadata that is a list,
  null, not JSON, of the old format, for other names or mistyped are never returned
  (``_read_cached_cubin``: None and one ``KernelCacheWarning``); a written entry reads back;
  a cache that cannot be written does not raise; ``_cached_cubin`` recompiles and overwrites a
  bad entry; ``raw_function`` compiles once per (device, headers, source, name);
  ``cached_program`` compiles an entry once across threads and processes (one compiles, the
  others wait and read) and turns NVRTC's failure into ``KernelCompileError``, writing nothing;
* tables: a measured-choice table that is unreadable, not JSON or of the wrong shape is ignored
  with one ``ChoicesWarning`` and planning still works; a malformed calibration raises a
  ValueError naming the file.
"""
from __future__ import annotations

import copy
import errno
import hashlib
import json
import math
import re
import sys
import threading
import types
import warnings

import pytest

import pyblasgemm
from pyblasgemm.kernels import jit
from pyblasgemm.planner import autotune as AT
from pyblasgemm.planner import make_desc, measured, model

FAKE_ID = {"device": "fake-timer", "cc": "0.0", "driver": 0, "nvrtc": "0"}
SHAPE = (3072, 3072, 3072)


@pytest.fixture(autouse=True)
def planner_env(fresh_planner, monkeypatch):   # fresh_planner: tests/conftest.py
    monkeypatch.setenv("PYBLASGEMM_ARCH", "sm_90")
    monkeypatch.delenv("PYBLASGEMM_NO_KERNEL_CACHE", raising=False)
    pyblasgemm.clear_plan_cache()


def _only(caught, category):
    """The one warning of ``category`` among ``caught`` (fails if there are none or several)."""
    mine = [w for w in caught if issubclass(w.category, category)]
    assert len(mine) == 1, [str(w.message) for w in mine]
    return str(mine[0].message)


def _model_timer(cand, desc):
    """A fake GPU: every candidate takes the model's predicted time."""
    return cand.time


def _tune(timer=_model_timer, **kw):
    kw.setdefault("progress", False)
    return pyblasgemm.tune(*SHAPE, "f16", transa="T", timer=timer, top=2, repeats=2, warmup=0, **kw)


# --- autotune cache: the winner's shape ----------------------------------------------------------

GOOD = {"backend": "cublas", "config": None, "time_s": 1e-4, "timings": {"cublas": 1e-4}}

#: id -> (stored winner, what the warning must say)
BAD_WINNERS = {
    "winner-string": ("cublas", "winner is the string"),
    "winner-list": (["cublas", None], "winner is a list"),
    "winner-null": (None, "winner is null"),
    "backend-unknown": (dict(GOOD, backend="rocblas"), "backend is the string 'rocblas'"),
    "backend-missing": ({"config": None, "time_s": 1e-4}, "backend is null"),
    "tensorcore-config-null": ({"backend": "tensorcore", "config": None, "time_s": 1e-4},
                               "config is null"),
    "tensorcore-config-number": ({"backend": "tensorcore", "config": 3, "time_s": 1e-4},
                                 "config is the number 3"),
    "cublas-config-list": (dict(GOOD, config=["x"]), "config is a list"),
    "timings-not-numbers": (dict(GOOD, timings={"cublas": "fast"}), r"timings\['cublas'\] is the string"),
    "timings-a-list": (dict(GOOD, timings=[1e-4]), "timings is a list"),
    "time_s-nan": (dict(GOOD, time_s=math.nan), "time_s is the number nan"),
    "time_s-inf": (dict(GOOD, time_s=math.inf), "time_s is the number inf"),
    "time_s-negative": (dict(GOOD, time_s=-1e-4), "time_s is the number -0.0001"),
    "time_s-bool": (dict(GOOD, time_s=True), "time_s is the boolean true"),
    "time_s-string": (dict(GOOD, time_s="1e-4"), "time_s is the string"),
    "time_s-missing": ({"backend": "cublas", "config": None}, "time_s is null"),
}


def _store_winner(path, winner):
    """Replace the winner of the cache file at ``path`` (its key stays right)."""
    data = json.loads(path.read_text())
    data["winner"] = winner
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("winner, reason", BAD_WINNERS.values(), ids=BAD_WINNERS)
def test_get_ignores_wrong_shaped_winner(tmp_path, winner, reason):
    store = AT.TuneCache(tmp_path)
    path = store.put(FAKE_ID, "fp", ["h"], GOOD)
    assert store.get(FAKE_ID, "fp", ["h"]) == GOOD
    _store_winner(path, winner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.get(FAKE_ID, "fp", ["h"]) is None
    message = _only(caught, AT.CacheWarning)
    assert str(path) in message and re.search(reason, message), message


def _must_not_time(cand, desc):
    raise AssertionError("a good entry is served from the cache: nothing is timed")


@pytest.mark.parametrize("winner, reason", BAD_WINNERS.values(), ids=BAD_WINNERS)
def test_tune_retunes_over_wrong_shaped_winner_and_rewrites_it(winner, reason):
    first = _tune()
    (path,) = AT.cache_dir().glob("tune-*.json")
    _store_winner(path, winner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = _tune()
    assert re.search(reason, _only(caught, AT.CacheWarning))
    assert p.source == "autotune" and "autotuned" in p.reason    # tuned again, not served
    assert (p.backend, p.config) == (first.backend, first.config)
    rewritten = json.loads(path.read_text())["winner"]
    assert AT._why_invalid_winner(rewritten) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "autotune cache" in _tune(timer=_must_not_time).reason


def test_tuning_a_miss_and_a_corrupt_entry_are_logged_and_a_served_entry_is_not(caplog):
    """Issue 35 item 5: cache misses and corruption on the ``pyblasgemm`` logger (the autotune
    cache's only warned; its misses said nothing), a stored winner served in silence."""
    import logging

    def said():
        words = [r.getMessage() for r in caplog.records if r.name.startswith("pyblasgemm")]
        caplog.clear()
        return words

    with caplog.at_level(logging.INFO, logger="pyblasgemm"):
        _tune()
        timing, won = said()
        assert timing.startswith("autotune: timing 3 candidates for float16 TN m=3072 n=3072 k=3072 ")
        assert "(no usable stored winner)" in timing
        (path,) = AT.cache_dir().glob("tune-*.json")
        assert won.startswith("autotune: ") and f"stored in {path}" in won
        _tune(timer=_must_not_time)
        assert said() == []
        path.write_text("{not json")
        with pytest.warns(AT.CacheWarning, match="corrupt"):
            _tune()
        corrupt, timing, won = said()
    assert corrupt.startswith(f"autotune cache: ignoring corrupt autotune cache file {path}")
    assert "timing 3 candidates" in timing and "stored in" in won


@pytest.mark.parametrize("name", ["winner-string", "winner-list", "tensorcore-config-null",
                                  "tensorcore-config-number", "timings-not-numbers", "time_s-nan"])
def test_plan_with_a_wrong_shaped_entry_does_not_raise(monkeypatch, name):
    _tune()
    (path,) = AT.cache_dir().glob("tune-*.json")
    _store_winner(path, BAD_WINNERS[name][0])
    monkeypatch.setattr(AT, "identity_provider", lambda device: FAKE_ID)   # the tuned identity
    monkeypatch.setattr(AT, "_no_gpu", set())
    pyblasgemm.clear_plan_cache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = pyblasgemm.plan(*SHAPE, "f16", transa="T")
    assert str(path) in _only(caught, AT.CacheWarning)
    assert p.source in ("heuristic", "measured")


def test_fmt_never_raises():
    assert AT._fmt({"timings": {"a": "slow", "b": 2e-6, "c": None, "d": 1e-6}}) == "d 1.0 us, b 2.0 us"
    for win in ("cublas", None, [1], {"timings": [1e-6]}, {"timings": None}, {"timings": {"a": math.nan}}):
        assert AT._fmt(win) == "no timings stored"


# --- autotune cache: the file system --------------------------------------------------------------

def _no_temporaries(directory):
    return not [p for p in directory.rglob("*") if p.name.endswith(".tmp")]


def test_cache_dir_is_a_file(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    store = AT.TuneCache(blocker)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.put(FAKE_ID, "fp", ["h"], GOOD) is None
    assert "cannot write autotune cache file" in _only(caught, AT.CacheWarning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.get(FAKE_ID, "fp", ["h"]) is None
    assert str(blocker) in _only(caught, AT.CacheWarning)
    assert blocker.read_text() == "not a directory"


def test_entry_path_is_a_directory(tmp_path):
    store = AT.TuneCache(tmp_path)
    store.path(FAKE_ID, "fp", ["h"]).mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.get(FAKE_ID, "fp", ["h"]) is None
        assert store.put(FAKE_ID, "fp", ["h"], GOOD) is None     # the same cache: warned already
    assert "unreadable autotune cache file" in _only(caught, AT.CacheWarning)
    with pytest.warns(AT.CacheWarning, match="cannot write autotune cache file"):
        assert AT.TuneCache(tmp_path).put(FAKE_ID, "fp", ["h"], GOOD) is None
    assert _no_temporaries(tmp_path)


def test_put_on_a_full_disk_or_without_permission_warns_and_cleans_up(tmp_path, monkeypatch):
    store = AT.TuneCache(tmp_path)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(AT.os, "fsync", full)
    with pytest.warns(AT.CacheWarning, match="No space left"):
        assert store.put(FAKE_ID, "fp", ["h"], GOOD) is None
    assert list(tmp_path.iterdir()) == []                   # the temporary file is gone

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(AT.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):                   # only OSError is swallowed
        store.put(FAKE_ID, "fp", ["h"], GOOD)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    def denied(**kw):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(AT.tempfile, "mkstemp", denied)
    with pytest.warns(AT.CacheWarning, match="Permission denied"):
        assert store.put(FAKE_ID, "fp", ["h"], GOOD) is None


def test_tune_with_an_unusable_cache_dir_still_returns_its_plan(monkeypatch, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("PYBLASGEMM_CACHE_DIR", str(blocker))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = _tune()
    assert p.source == "autotune"
    assert "unreadable autotune cache file" in _only(caught, AT.CacheWarning)   # one, not two


# --- the sm_90a kernel cache ---------------------------------------------------------------------

NAMES = ["pyblasgemm::sm90_gemm_kernel<A>", "pyblasgemm::sm90_splitk_reduce<B>"]
LOWERED = {NAMES[0]: "_Z4gemmv", NAMES[1]: "_Z6reducev"}
CUBIN = b"\x7fELF" + bytes(range(256)) * 8          # fabricated: only the ELF magic matters here


def _meta(cubin=CUBIN, lowered=LOWERED):
    return {"lowered": lowered, "size": len(cubin), "sha256": hashlib.sha256(cubin).hexdigest()}


def _entry(tmp_path, cubin=CUBIN, meta=None, meta_text=None):
    cub, meta_path = tmp_path / "k.cubin", tmp_path / "k.json"
    cub.write_bytes(cubin)
    meta_path.write_text(meta_text if meta_text is not None else json.dumps(_meta() if meta is None else meta))
    return cub, meta_path


#: id -> (cubin bytes, metadata (None: right for CUBIN) or raw text, the file blamed, reason)
BAD_KERNEL_ENTRIES = {
    "garbage-cubin": (b"garbage" * 100, _meta(b"garbage" * 100), "cubin", "not an ELF file"),
    "empty-cubin": (b"", _meta(b""), "cubin", "not an ELF file"),
    "empty-cubin-full-metadata": (b"", None, "cubin", "0 bytes"),
    "truncated-cubin": (CUBIN[:-300], None, "cubin", "truncated"),
    "altered-cubin": (CUBIN[:-1] + b"\x00", None, "cubin", "sha256"),
    "metadata-list": (CUBIN, [LOWERED], "json", "holds a list"),
    "metadata-null": (CUBIN, "null", "json", "holds null"),
    "metadata-not-json": (CUBIN, "{ not json", "json", "not JSON"),
    "metadata-empty": (CUBIN, "", "json", "not JSON"),
    "metadata-no-lowered": (CUBIN, {"size": len(CUBIN)}, "json", "'lowered'"),
    "lowered-a-list": (CUBIN, dict(_meta(), lowered=NAMES), "json", "'lowered'"),
    "lowered-values-not-strings": (CUBIN, dict(_meta(), lowered={n: 1 for n in NAMES}), "json", "'lowered'"),
    "lowered-other-names": (CUBIN, _meta(lowered={NAMES[0]: "_Z4gemmv"}), "json", "other instantiations"),
    "old-format": (CUBIN, {"lowered": LOWERED}, "json", "older format"),
    "size-a-string": (CUBIN, dict(_meta(), size=str(len(CUBIN))), "json", "'size'"),
    "size-a-bool": (CUBIN, dict(_meta(), size=True), "json", "'size'"),
    "sha256-a-number": (CUBIN, dict(_meta(), sha256=0), "json", "'sha256'"),
}


@pytest.mark.parametrize("cubin, meta, blamed, reason", BAD_KERNEL_ENTRIES.values(), ids=BAD_KERNEL_ENTRIES)
def test_read_cached_cubin_rejects_bad_entries(tmp_path, cubin, meta, blamed, reason):
    text = meta if isinstance(meta, str) else None
    cub, meta_path = _entry(tmp_path, cubin, None if text is not None else meta, text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert jit._read_cached_cubin(cub, meta_path, NAMES) is None
    message = _only(caught, jit.KernelCacheWarning)
    assert str(cub if blamed == "cubin" else meta_path) in message and reason in message, message


def test_read_cached_cubin_missing_or_unreadable(tmp_path):
    cub, meta_path = tmp_path / "k.cubin", tmp_path / "k.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jit._read_cached_cubin(cub, meta_path, NAMES) is None    # not cached: silent
        meta_path.write_text(json.dumps(_meta()))
        assert jit._read_cached_cubin(cub, meta_path, NAMES) is None    # half written: silent
    cub.mkdir()
    with pytest.warns(jit.KernelCacheWarning, match="unreadable kernel cache file .*k.cubin"):
        assert jit._read_cached_cubin(cub, meta_path, NAMES) is None


def test_written_entry_reads_back(tmp_path):
    cub, meta_path = tmp_path / "kernels" / "k.cubin", tmp_path / "kernels" / "k.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jit._write_cached_cubin(cub, meta_path, CUBIN, LOWERED) is True
        assert jit._read_cached_cubin(cub, meta_path, list(reversed(NAMES))) == (CUBIN, LOWERED)
    assert json.loads(meta_path.read_text()) == _meta()
    assert _no_temporaries(tmp_path)


def test_write_into_a_cache_dir_that_is_a_file_does_not_raise(tmp_path, monkeypatch):
    monkeypatch.setattr(jit, "_unwritable_dirs", set())
    blocker = tmp_path / "kernels"
    blocker.write_text("")
    with pytest.warns(jit.KernelCacheWarning, match="cannot write the kernel cache"):
        assert jit._write_cached_cubin(blocker / "k.cubin", blocker / "k.json", CUBIN, LOWERED) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # once per directory, not per kernel
        assert jit._write_cached_cubin(blocker / "j.cubin", blocker / "j.json", CUBIN, LOWERED) is False
    # the metadata's place taken by a directory: the cubin is written, no temporary is left
    d = tmp_path / "other"
    (d / "k.json").mkdir(parents=True)
    with pytest.warns(jit.KernelCacheWarning):
        assert jit._write_cached_cubin(d / "k.cubin", d / "k.json", CUBIN, LOWERED) is False
    assert _no_temporaries(d)


class FakeNvrtc:
    """Stands in for ``jit._nvrtc``: counts compiles, returns a fabricated ELF cubin."""

    def __init__(self):
        self.compiles = 0

    def __call__(self, names, config, arch, ptx=False, verbose=True):
        self.compiles += 1
        return CUBIN, "", {n: f"_lowered_{i}" for i, n in enumerate(names)}


def test_a_patch_of_this_thread_leaves_other_threads_the_original(patch_this_thread):
    module = types.SimpleNamespace(compile=lambda: "original")
    patch_this_thread(module, "compile", lambda: "stand-in")
    seen: list = []
    other = threading.Thread(target=lambda: seen.append(module.compile()))
    other.start()
    other.join()
    assert module.compile() == "stand-in" and seen == ["original"]


def _sm90_config():
    from pyblasgemm.kernels.config import SM90_CONFIGS_BY_TILE

    return SM90_CONFIGS_BY_TILE["f16"][64]


def test_sm90_cubin_recompiles_and_overwrites_a_bad_entry(patch_this_thread):
    pytest.importorskip("cupy")           # the cache key holds the NVRTC version
    fake = FakeNvrtc()
    patch_this_thread(jit, "_nvrtc", fake)
    cfg = _sm90_config()
    cubin, lowered = jit._cached_cubin(cfg, "f16", "T", "N")
    (cub,) = jit.kernel_cache_dir().glob("*.cubin")
    meta_path = cub.with_suffix(".json")
    assert fake.compiles == 1
    assert json.loads(meta_path.read_text())["sha256"] == hashlib.sha256(cubin).hexdigest()
    assert jit._cached_cubin(cfg, "f16", "T", "N") == (cubin, lowered) and fake.compiles == 1
    for damage in (lambda: cub.write_bytes(b"garbage"), lambda: cub.write_bytes(cubin[:100]),
                   lambda: meta_path.write_text(json.dumps({"lowered": lowered})),   # old format
                   lambda: meta_path.write_text("[]")):
        damage()
        with pytest.warns(jit.KernelCacheWarning, match="ignoring kernel cache file"):
            assert jit._cached_cubin(cfg, "f16", "T", "N") == (cubin, lowered)
        with warnings.catch_warnings():
            warnings.simplefilter("error")            # overwritten: served again, silently
            assert jit._cached_cubin(cfg, "f16", "T", "N") == (cubin, lowered)
    assert fake.compiles == 5


def _fake_loader(monkeypatch, compiled: list):
    """``cached_program`` counting its calls and ``_load`` handing out stand-in kernels (no GPU)."""
    def cached_program(source, names, target):
        compiled.append((source, tuple(names), target))
        return CUBIN, {n: f"_lowered_{i}" for i, n in enumerate(names)}

    monkeypatch.setattr(jit, "cached_program", cached_program)
    monkeypatch.setattr(jit, "_load", lambda cubin, lowered, names, device:
                        {n: types.SimpleNamespace(ptr=len(compiled)) for n in names})
    monkeypatch.setattr(jit, "device_target", lambda device: "sm_90")
    monkeypatch.setattr(jit, "_raw", {})
    monkeypatch.setattr(jit, "_loaded", {})


def test_raw_function_compiles_once_per_device_source_and_name(monkeypatch):
    from pyblasgemm.kernels import driver

    compiled: list = []
    _fake_loader(monkeypatch, compiled)
    monkeypatch.setattr(driver, "function", lambda ptr: ("CUfunction", ptr))
    src = "#include <pyblasgemm/impls/grouped_offsets.cuh>\n"
    name = "pyblasgemm::grouped_offsets_kernel<int>"
    fn = jit.raw_function(src, name, 0)
    assert fn == ("CUfunction", 1) and jit.raw_function(src, name, 0) is fn
    assert compiled == [(src, (name,), "sm_90")]
    assert jit.raw_function(src, name, 1) is not fn                        # another device
    assert jit.raw_function(src, name.replace("int", "long long"), 0) is not fn
    assert len(compiled) == 3


def _counting_compile(calls, delay=0.0):
    """A stand-in for NVRTC: counts its compiles (a list, or a shared counter across processes)."""
    import time

    def compile():
        time.sleep(delay)               # long enough for the other callers to arrive meanwhile
        if isinstance(calls, list):
            calls.append(1)
        else:
            with calls.get_lock():
                calls.value += 1
        return CUBIN, "", {"k<float>": "_lowered_0"}
    return compile


@pytest.fixture
def any_nvrtc(monkeypatch):
    """The key's NVRTC version without NVRTC (the tests below compile with a stand-in)."""
    from pyblasgemm.kernels import nvrtc

    monkeypatch.setattr(nvrtc, "getVersion", lambda: (13, 0))


def test_cached_program_logs_the_compile_pair_once(caplog, any_nvrtc):
    calls: list = []
    with caplog.at_level("INFO", logger="pyblasgemm"):
        for _ in range(2):
            assert jit.cached_program("// k\n", ["k<float>"], "sm_90",
                                      compile=_counting_compile(calls)) == (CUBIN, {"k<float>": "_lowered_0"})
    assert len(calls) == 1                                                # the second call read the disk
    assert [r.getMessage().split(" in ")[0] for r in caplog.records if "k<float>" in r.getMessage()] == [
        "compiling k<float> for sm_90 (kernel cache miss)", "compiled k<float>"]   # the observability guide's pair


def test_a_kernel_compile_enforces_the_cap(any_nvrtc, monkeypatch):
    """Issue 35 item 5's size cap on the kernel cache's own write (the tune cache's write and
    ``trim_cache`` were tested alone): a compile's new entry pushes the oldest one out."""
    import os

    d = jit.kernel_cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    old = d / "old.cubin"
    old.write_bytes(b"x" * (1 << 20))
    os.utime(old, (1_700_000_000, 1_700_000_000))
    monkeypatch.setenv("PYBLASGEMM_CACHE_MAX_MB", "1")
    calls: list = []
    assert jit.cached_program("// cap\n", ["cap<float>"], "sm_90",
                              compile=_counting_compile(calls))[0] == CUBIN
    assert len(calls) == 1 and not old.exists()
    assert [p.suffix for p in d.glob("*.cubin")] == [".cubin"]        # the new entry stays


def test_cached_program_compiles_an_entry_once_across_threads(any_nvrtc):
    """Callers that want the same entry at once wait on its compile lock and read what the
    first one wrote (flock: separate descriptors exclude each other, also in one process)."""
    pytest.importorskip("fcntl")
    import threading

    calls: list = []
    got = []
    threads = [threading.Thread(target=lambda: got.append(jit.cached_program(
        "// k\n", ["k<float>"], "sm_90", compile=_counting_compile(calls, delay=0.3)))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and got == [(CUBIN, {"k<float>": "_lowered_0"})] * 4


def _compile_in_child(barrier, calls, cache_home):
    import os

    os.environ["XDG_CACHE_HOME"] = cache_home
    barrier.wait(10)
    jit.cached_program("// k\n", ["k<float>"], "sm_90", compile=_counting_compile(calls, delay=0.3))


def test_cached_program_compiles_an_entry_once_across_processes(tmp_path, any_nvrtc):
    """Four processes (pytest-xdist's workers, a job's ranks) asking for one kernel at the same
    moment: one compiles, three read its entry."""
    pytest.importorskip("fcntl")
    import multiprocessing

    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:
        pytest.skip("no fork on this platform")
    barrier, calls = ctx.Barrier(4), ctx.Value("i", 0)
    children = [ctx.Process(target=_compile_in_child, args=(barrier, calls, str(tmp_path))) for _ in range(4)]
    for c in children:
        c.start()
    for c in children:
        c.join(20)
    assert [c.exitcode for c in children] == [0] * 4
    assert calls.value == 1


def test_cached_program_compile_failure_names_the_kernel_and_writes_nothing():
    try:
        from pyblasgemm.kernels import nvrtc
        nvrtc.getVersion()
    except (ImportError, OSError, RuntimeError) as exc:
        pytest.skip(f"NVRTC unavailable: {exc}")
    with pytest.raises(jit.KernelCompileError, match=r"NVRTC failed to compile k<float> for sm_90") as info:
        jit.cached_program("template <typename T> __global__ void k(T* x) { x[0] = undeclared; }\n",
                           ["k<float>"], "sm_90")
    assert "undeclared" in info.value.log
    assert list(jit.kernel_cache_dir().glob("*.cubin")) == []


def _no_compile(*args, **kwargs):
    raise AssertionError("compiled: the cubin on disk was not served")


def test_sm90_cubin_real_compile_round_trip(patch_this_thread):
    pytest.importorskip("cupy")
    cfg = _sm90_config()
    try:
        cubin, lowered = jit._cached_cubin(cfg, "f16", "T", "N")     # NVRTC, no GPU needed (~0.5 s)
    except (ImportError, OSError, RuntimeError) as exc:
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert cubin.startswith(jit.ELF_MAGIC)
    (cub,) = jit.kernel_cache_dir().glob("*.cubin")
    assert json.loads(cub.with_suffix(".json").read_text())["size"] == len(cubin)
    patch_this_thread(jit, "_nvrtc", _no_compile)   # served from disk: no compile
    assert jit._cached_cubin(cfg, "f16", "T", "N") == (cubin, lowered)


# --- the measured-choice table -------------------------------------------------------------------

def _shipped_choices():
    return json.loads(measured.CHOICES_FILE.read_text())


def _mutated(edit):
    t = _shipped_choices()
    edit(t)
    return json.dumps(t)


#: id -> (file text, what the warning must say)
BAD_TABLES = {
    "not-json": ("{ not json", "not JSON"),
    "empty": ("", "not JSON"),
    "a-list": ("[]", "the table is a list"),
    "no-device": (_mutated(lambda t: t.pop("device")), "no 'device'"),
    "no-entries": (_mutated(lambda t: t.pop("entries")), "no 'entries'"),
    "no-layout": (_mutated(lambda t: t.pop("layout")), "no 'layout'"),
    "no-sources": (_mutated(lambda t: t.pop("sources")), "no 'sources'"),
    "device-a-list": (_mutated(lambda t: t.update(device=[])), "device is a list"),
    "cc-a-number": (_mutated(lambda t: t["device"].update(cc=9.0)), "device cc"),
    "sm_count-a-string": (_mutated(lambda t: t["device"].update(sm_count="132")), "sm_count"),
    "layout-null": (_mutated(lambda t: t.update(layout=None)), "layout is null"),
    "sources-a-string": (_mutated(lambda t: t.update(sources="run3.json")), "sources"),
    "tolerance-a-string": (_mutated(lambda t: t.update(cublas_tolerance="2%")), "cublas_tolerance"),
    "entries-an-object": (_mutated(lambda t: t.update(entries={})), "entries is an object"),
    "entry-a-string": (_mutated(lambda t: t["entries"].__setitem__(0, "x")),
                       r"entries\[0\]: it is the string"),
    "entry-m-a-string": (_mutated(lambda t: t["entries"][3].update(m="1024")), r"entries\[3\]: m is"),
    "entry-k-zero": (_mutated(lambda t: t["entries"][0].update(k=0)), "k is the number 0"),
    "entry-no-impl": (_mutated(lambda t: t["entries"][0].pop("impl")), "impl is null"),
    "entry-time-negative": (_mutated(lambda t: t["entries"][0].update(time_s=-1.0)), "time_s"),
    "entry-runner-up-time-null": (_mutated(lambda t: t["entries"][0].update(runner_up_s=None)), "runner_up_s"),
    "entry-times-empty": (_mutated(lambda t: t["entries"][0].update(times={})), "times is empty"),
    "entry-times-a-list": (_mutated(lambda t: t["entries"][0].update(times=[1.0])), "times is a list"),
}


@pytest.mark.parametrize("text, reason", BAD_TABLES.values(), ids=BAD_TABLES)
def test_bad_choices_file_is_ignored_with_one_warning(tmp_path, text, reason, caplog):
    import logging

    path = tmp_path / "choices.json"
    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught, \
            caplog.at_level(logging.INFO, logger="pyblasgemm"):
        warnings.simplefilter("always")
        assert measured.load_choices(path) is None
        assert measured.load_choices(path) is None        # read once: no second warning
    message = _only(caught, measured.ChoicesWarning)
    assert str(path) in message and re.search(reason, message), message
    # and once on the logger, in the warning's words (issue 35 item 5: corruption is logged)
    assert [r.getMessage() for r in caplog.records] == [message.removeprefix("pyblasgemm: ")]


def test_unreadable_choices_file_is_ignored(tmp_path):
    with pytest.warns(measured.ChoicesWarning, match="cannot read it"):
        assert measured.load_choices(tmp_path) is None    # a directory


def test_shipped_choices_pass_the_checks():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measured.load_choices() == _shipped_choices()


#: tables the planner would trip over without the checks (TypeError, ValueError), or use silently
BAD_FOR_PLANNING = {
    "a-list": BAD_TABLES["a-list"][0],
    "not-json": BAD_TABLES["not-json"][0],
    "device-a-list": BAD_TABLES["device-a-list"][0],
    "entry-m-a-string": BAD_TABLES["entry-m-a-string"][0],
    "all-times-empty": _mutated(lambda t: [e.update(times={}) for e in t["entries"]]),
}


@pytest.mark.parametrize("text", BAD_FOR_PLANNING.values(), ids=BAD_FOR_PLANNING)
def test_planning_works_with_a_bad_shipped_choices_file(tmp_path, monkeypatch, text):
    # 128x4096x4096 f16 TN is an entry of the shipped table (tests/test_planner_measured.py)
    assert pyblasgemm.plan(128, 4096, 4096, "f16", transa="T", arch="sm_90").source == "measured"
    path = tmp_path / "choices.json"
    path.write_text(text)
    monkeypatch.setattr(measured, "CHOICES_FILE", path)
    pyblasgemm.clear_plan_cache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = pyblasgemm.plan(128, 4096, 4096, "f16", transa="T", arch="sm_90")
    assert str(path) in _only(caught, measured.ChoicesWarning)
    assert p.source == "heuristic"                          # the model decides


# --- the calibration -----------------------------------------------------------------------------

@pytest.fixture
def fresh_calibration():
    model.load_calibration.cache_clear()
    yield
    model.load_calibration.cache_clear()


def _shipped_calibration():
    return json.loads(model.CALIBRATION_FILE.read_text())


def _cal_text(edit):
    c = _shipped_calibration()
    edit(c)
    return json.dumps(c)


#: id -> (file text, what the error must say)
BAD_CALIBRATIONS = {
    "not-json": ("{ not json", "not JSON"),
    "a-list": ("[1, 2]", "the file is a list"),
    "no-host_us": (_cal_text(lambda c: c.pop("host_us")), "host_us is null"),
    "host_us-no-cublas": (_cal_text(lambda c: c["host_us"].pop("cublas")), r"host_us\['cublas'\]"),
    "lone_cta_eff-a-string": (_cal_text(lambda c: c.update(lone_cta_eff="0.7")), "lone_cta_eff"),
    "lone_cta_eff-zero": (_cal_text(lambda c: c.update(lone_cta_eff=0)), "lone_cta_eff is the number 0"),
    "kernel_latency-missing": (_cal_text(lambda c: c.pop("kernel_latency_us")), "kernel_latency_us"),
    "ours-a-list": (_cal_text(lambda c: c.update(ours=[])), "ours is a list"),
    "ours-no-f16": (_cal_text(lambda c: c["ours"].pop("f16")), "'f16'"),
    "ours-tiles-null": (_cal_text(lambda c: c["ours"]["s8"].update(tiles=None)), r"ours\['s8'\]\['tiles'\]"),
    "ours-tile-key-bad": (_cal_text(lambda c: c["ours"]["f16"]["tiles"].update(big=0.5)), "not a tile key"),
    "ours-layout-not-numbers": (_cal_text(lambda c: c["ours"]["f16"]["layout"].update(TN="1")), "layout"),
    "cublas-eff-null": (_cal_text(lambda c: c["cublas"]["eff"].update({"h/fp32": None})), "cublas"),
    "cublas-no-int8-copy": (_cal_text(lambda c: c["cublas"].pop("int8_copy")), "int8_copy"),
    "sm90-tiles-a-list": (_cal_text(lambda c: c.update(sm90={"f16": {"tiles": [0.5]}})), r"sm90\['f16'\]"),
}


@pytest.mark.parametrize("text, reason", BAD_CALIBRATIONS.values(), ids=BAD_CALIBRATIONS)
def test_malformed_calibration_path_raises_naming_the_file(tmp_path, fresh_calibration, text, reason):
    path = tmp_path / "calibration.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(path))) as info:
        model.load_calibration(str(path))
    assert re.search(reason, str(info.value)), str(info.value)


def test_unreadable_calibration_raises_naming_the_file(tmp_path, fresh_calibration):
    with pytest.raises(ValueError, match=f"cannot read calibration file {re.escape(str(tmp_path))}"):
        model.load_calibration(str(tmp_path))              # a directory


def test_malformed_shipped_calibration_raises(tmp_path, monkeypatch, fresh_calibration):
    bad = tmp_path / "calibration_h100.json"
    bad.write_text(BAD_CALIBRATIONS["ours-no-f16"][0])
    monkeypatch.setattr(model, "CALIBRATION_FILE", bad)
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        model.load_calibration()
    monkeypatch.undo()
    model.load_calibration.cache_clear()
    sm90 = tmp_path / "calibration_sm90_h100.json"
    sm90.write_text(json.dumps({"f16": {"tiles": {"sm90a_128x128x128B_w2x1_s6": "fast"}}}))
    monkeypatch.setattr(model, "CALIBRATION_SM90_FILE", sm90)
    with pytest.raises(ValueError, match=re.escape(str(sm90))):
        model.load_calibration()


def test_valid_calibration_path_loads(tmp_path, fresh_calibration):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(_shipped_calibration()))
    cal = model.load_calibration(str(path))
    assert cal["sm90"] == json.loads(model.CALIBRATION_SM90_FILE.read_text())
    assert copy.deepcopy(model.load_calibration()) == cal


def test_a_kernel_cache_read_waits_for_a_writer_of_the_same_entry(tmp_path):
    """The entry's two files are written under an exclusive lock and read under a shared one,
    so a reader never pairs one process's cubin with another's metadata."""
    pytest.importorskip("fcntl")
    import threading

    cub, meta_path = _entry(tmp_path)
    got = []
    with jit._entry_lock(meta_path, exclusive=True):
        reader = threading.Thread(target=lambda: got.append(jit._read_cached_cubin(cub, meta_path, NAMES)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not got           # blocked behind the writer
    reader.join(5)
    assert got == [(CUBIN, LOWERED)]
    with jit._entry_lock(meta_path, exclusive=False):  # readers share it
        assert jit._read_cached_cubin(cub, meta_path, NAMES) == (CUBIN, LOWERED)
