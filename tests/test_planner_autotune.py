"""Autotuning on the CPU: a fake timer stands in for the GPU; the disk cache is real.

Covers: the measuring protocol (warm-ups, repeats, shuffled order, median), persistence and its
key, corrupt and stale files (ignored with a warning), atomic writes, concurrent writers, the
planner serving stored winners, the knobs, and the no-GPU error.
"""
import json
import multiprocessing as mp
import os
import warnings

import pytest

import pyblasgemm
from pyblasgemm.planner import autotune as AT
from pyblasgemm.planner import make_desc

FAKE_ID = {"device": "fake-timer", "cc": "0.0", "driver": 0, "nvrtc": "0"}


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path):
    d = tmp_path / "cache"
    monkeypatch.setenv("PYBLASGEMM_CACHE_DIR", str(d))
    monkeypatch.delenv("PYBLASGEMM_NO_TUNE_CACHE", raising=False)
    monkeypatch.setenv("PYBLASGEMM_ARCH", "sm_90")
    pyblasgemm.clear_plan_cache()
    yield d
    monkeypatch.undo()
    pyblasgemm.clear_plan_cache()


class FakeTimer:
    """Times from a table (label -> seconds, default from the model), with a call log."""

    def __init__(self, table=None, jitter=()):
        self.table = table or {}
        self.calls = []
        self.jitter = list(jitter)

    def __call__(self, cand, desc):
        self.calls.append(cand.label)
        t = self.table.get(cand.label, cand.time * 10)   # unlisted: much slower than listed
        return t * (1 + (self.jitter.pop() if self.jitter else 0))


def _tune(timer, **kw):
    kw.setdefault("progress", False)
    return pyblasgemm.tune(3072, 3072, 3072, "f16", transa="T", timer=timer, **kw)


def _labels(top: int):
    """The labels ``tune(..., top=top)`` measures, in the order it picks them (best-scored first,
    at most half of one decomposition)."""
    p = pyblasgemm.plan(3072, 3072, 3072, "f16", transa="T", backend="tensorcore")
    ranked = sorted((c for c in p.candidates if c.score is not None and c.backend == "tensorcore"),
                    key=lambda c: c.time)
    return [c.label for c in AT._diverse_top(ranked, top)]


def test_protocol_warmup_repeats_shuffle_median(cache_dir):
    labels = _labels(6)
    slow_favourite = labels[0]           # the model's favourite turns out slow
    fast = labels[3]
    timer = FakeTimer({slow_favourite: 5e-4, fast: 1e-4, "cublas": 3e-4})
    p = _tune(timer, top=6, repeats=7, warmup=2)
    assert p.source == "autotune" and p.config.name == fast and p.backend == "tensorcore"
    picked = set(timer.calls)
    assert len(picked) == 7 and "cublas" in picked          # top 6 of ours + cuBLAS
    assert all(timer.calls.count(x) == 9 for x in picked)   # 2 warm-ups + 7 timed
    rounds = [tuple(timer.calls[14 + 7 * r: 21 + 7 * r]) for r in range(7)]
    assert len(set(rounds)) > 1                             # the order is reshuffled
    assert "measured fastest" in p.reason and p.predicted_s == pytest.approx(1e-4)


def test_median_not_mean():
    labels = _labels(2)
    # one huge outlier on the true winner must not hide it
    jitter = [0.0] * 200
    timer = FakeTimer({labels[1]: 1e-4, labels[0]: 1.5e-4, "cublas": 2e-4}, jitter)
    timer.jitter[-5] = 100.0
    p = _tune(timer, top=2, repeats=9, warmup=0, cache=False)
    assert p.config.name == labels[1]


def test_winner_persisted_and_reused(cache_dir):
    labels = _labels(4)
    _tune(FakeTimer({labels[2]: 1e-5}), top=4, repeats=3)
    files = list(cache_dir.glob("tune-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["key"]["identity"] == FAKE_ID and data["winner"]["config"] == labels[2]
    from pyblasgemm.kernels.jit import header_fingerprint
    assert data["key"]["kernels"] == header_fingerprint()
    assert data["key"]["problem"][:4] == ["h", "fp32", "T", "N"]

    def must_not_time(cand, desc):
        raise AssertionError("served from the cache, nothing is timed")

    p = _tune(must_not_time, top=4, repeats=3)
    assert p.config.name == labels[2] and "autotune cache" in p.reason


def test_planner_serves_stored_winner(monkeypatch):
    labels = _labels(8)
    _tune(FakeTimer({labels[5]: 1e-5}), top=8, repeats=2)
    monkeypatch.setattr(AT, "identity_provider", lambda device: FAKE_ID)
    AT._no_gpu.clear()
    pyblasgemm.clear_plan_cache()
    p = pyblasgemm.plan(3072, 3072, 3072, "f16", transa="T")
    assert p.source == "autotune" and p.config.name == labels[5]
    # another device (identity) does not see it
    monkeypatch.setattr(AT, "identity_provider", lambda device: dict(FAKE_ID, device="other"))
    pyblasgemm.clear_plan_cache()
    # (the shipped measured-choice table may answer instead of the model: not the stored winner)
    assert pyblasgemm.plan(3072, 3072, 3072, "f16", transa="T").source in ("heuristic", "measured")


def test_cublas_can_win(monkeypatch):
    p = _tune(FakeTimer({"cublas": 1e-6}), top=3, repeats=2)
    assert p.backend == "cublas" and p.config is None and "cuBLAS measured fastest" in p.reason


def test_corrupt_file_ignored_with_warning(cache_dir):
    labels = _labels(2)
    _tune(FakeTimer({labels[0]: 1e-5}), top=2, repeats=2)
    (path,) = cache_dir.glob("tune-*.json")
    path.write_text("{ not json")
    with pytest.warns(AT.CacheWarning, match="corrupt"):
        p = _tune(FakeTimer({labels[1]: 1e-6}), top=2, repeats=2)
    assert p.config.name == labels[1]                       # re-tuned
    assert json.loads(path.read_text())["winner"]["config"] == labels[1]   # and rewritten


def test_stale_file_ignored_with_warning(cache_dir):
    store = AT.TuneCache(cache_dir)
    d = make_desc(3072, 3072, 3072, "f16", transa="T")
    key = AT.problem_key(d)
    from pyblasgemm.kernels.jit import header_fingerprint
    path = store.put(FAKE_ID, "old-kernel-sources", key, {"backend": "cublas", "config": None})
    # a file at the right name whose stored key is for other kernel sources (e.g. copied over)
    os.replace(path, store.path(FAKE_ID, header_fingerprint(), key))
    with pytest.warns(AT.CacheWarning, match="stale"):
        assert store.get(FAKE_ID, header_fingerprint(), key) is None


def test_stale_config_ignored_with_warning(cache_dir):
    labels = _labels(2)
    _tune(FakeTimer({labels[0]: 1e-5}), top=2, repeats=2)
    (path,) = cache_dir.glob("tune-*.json")
    data = json.loads(path.read_text())
    data["winner"]["config"] = "sliced_256x256x32_w2x2_s9_g8"      # no longer valid
    path.write_text(json.dumps(data))
    with pytest.warns(AT.CacheWarning, match="stale autotune winner"):
        p = _tune(FakeTimer({labels[1]: 1e-6}), top=2, repeats=2)
    assert p.config.name == labels[1]


def test_atomic_write_leaves_no_temporaries(cache_dir):
    store = AT.TuneCache(cache_dir)
    for i in range(20):
        store.put(FAKE_ID, "fp", [i], {"backend": "cublas", "config": None, "time_s": i})
    assert sorted(p.name.startswith("tune-") for p in cache_dir.iterdir()) == [True] * 20


def _writer(directory, worker, n):
    store = AT.TuneCache(directory)
    for i in range(n):
        store.put(FAKE_ID, "fp", [i % 5], {"backend": "cublas", "config": None, "time_s": worker,
                                           "pad": "x" * 20000})


def test_concurrent_processes_do_not_corrupt(cache_dir):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(cache_dir), w, 30)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = AT.TuneCache(cache_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(5):
            win = store.get(FAKE_ID, "fp", [i])
            assert win["time_s"] in range(6) and len(win["pad"]) == 20000
    assert len(list(cache_dir.iterdir())) == 5


def test_no_tune_cache_knob(cache_dir, monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_NO_TUNE_CACHE", "1")
    _tune(FakeTimer(), top=2, repeats=2)
    assert not cache_dir.exists() or not list(cache_dir.iterdir())


def test_default_cache_dir(monkeypatch):
    monkeypatch.delenv("PYBLASGEMM_CACHE_DIR")
    assert str(AT.cache_dir()).endswith(os.path.join(".cache", "pyblasgemm"))


def test_progress_bar_runs(capsys):
    _tune(FakeTimer(), top=2, repeats=2, progress=True, cache=False)


def test_tune_without_gpu_is_a_clear_error():
    from tests.conftest import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        pyblasgemm.tune(256, 256, 256, "f16")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        pyblasgemm.plan(256, 256, 256, "f16", autotune=True)


def test_tune_forced_ours_only():
    labels = _labels(3)
    timer = FakeTimer({labels[0]: 1e-5})
    p = _tune(timer, top=3, repeats=2, include_cublas=False)
    assert "cublas" not in timer.calls and p.backend == "tensorcore"


def test_tuning_a_problem_forgets_its_memoized_plans_of_every_epilogue_and_invariance():
    """After tune(), no memoized plan of the problem survives: the plain one, one with an
    epilogue, the invariant one (the fields after the problem's own close the key); another
    problem's plan stays."""
    from pyblasgemm.plancache import get_plan_cache

    shape = (3072, 3072, 3072)
    plain = pyblasgemm.plan(*shape, "f16", transa="T")
    pyblasgemm.plan(*shape, "f16", transa="T", activation="relu", bias="m")
    pyblasgemm.plan(*shape, "f16", transa="T", invariant=True)
    other = pyblasgemm.plan(2048, 2048, 2048, "f16", transa="T")

    def plans_of(m):
        seen = []
        get_plan_cache().discard_where(lambda k: seen.append(k) and False)   # reads the keys
        return [k for k in seen if k[0] == "plan" and k[1][5] == m]
    assert len(plans_of(3072)) >= 3 and plans_of(2048)
    _tune(FakeTimer(), top=2, repeats=1, warmup=0)
    assert [k for k in plans_of(3072) if k[1][-1] == "m" or k[1][-3] is not None] == []
    assert plans_of(2048) and pyblasgemm.plan(2048, 2048, 2048, "f16", transa="T") is other
    assert plain.problem.m == 3072
