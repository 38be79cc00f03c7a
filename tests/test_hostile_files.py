"""A FIFO, a link to /dev/zero, a directory or an oversized file where a reader expects a
cache entry or a JSON document (issue #30, items 6 and 7). CPU only.

Before the fix a FIFO in an autotune entry's place blocked ``plan()`` forever in ``open``, a
link to /dev/zero was read until memory ran out, and the bench CLI's ``--table`` did the same
or ended in a traceback. Every reader now opens regular files only and reads at most a stated
bound (``pyblasgemm._files.read_regular``); anything else is an unreadable entry, handled as
each reader already handled one: one warning naming the file and the reason (the autotune and
kernel caches, the measured-choice table), a ValueError naming the file (the calibration), or
``error: ...`` and exit code 2 (``bench --table``, the plot script).

The FIFO and /dev/zero cases run in one child process, each case under an alarm and all under
a memory limit, so a reader that blocks or reads without bound fails its test instead of
blocking the suite or exhausting the machine; directories and oversized (sparse) files are
safe to try in-process.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest

from pyblasgemm._files import CACHE_ENTRY_BYTES, CUBIN_BYTES, DOCUMENT_BYTES

SHAPE = (3072, 3072, 3072)
FAKE_ID = {"device": "fake-timer", "cc": "0.0", "driver": 0, "nvrtc": "0"}
NAMES = ["pyblasgemm::sm90_gemm_kernel<A>", "pyblasgemm::sm90_splitk_reduce<B>"]
CUBIN = b"\x7fELF" + bytes(range(256)) * 8

#: kind of hostile file -> the reason every reader must give (``{bound}``: the reader's bound)
KINDS = {
    "fifo": "not a regular file (a FIFO)",
    "dev-zero-link": "not a regular file (a character device)",
    "directory": "not a regular file (a directory)",
    "oversized": "larger than {bound} bytes",
}
#: kinds that hung or read without bound before the fix: tried only in a child process
DANGEROUS = ("fifo", "dev-zero-link")
#: seconds one case may take in the child before it counts as blocked (a read takes ~0.1 s)
CASE_TIMEOUT_S = 10
#: memory the child may add after its imports before a read fails with MemoryError
CHILD_HEADROOM_BYTES = 1 << 30


class Blocked(BaseException):
    """Raised by the child's alarm: not an OSError, so no reader can take it for a bad file."""


def make_hostile(path: Path, kind: str, bound: int) -> None:
    """Put a file of ``kind`` at ``path`` (the oversized one sparse: no disk is used)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        os.symlink("/dev/zero", path)
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as f:
            f.truncate(bound + 1)


# --- the readers: each puts the hostile file in place, reads, and returns what happened --------

def _record(fn) -> dict:
    """Run ``fn``: its value (repr), warnings (category, message), exception, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    result = {"value": None, "raised": None}
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        try:
            result["value"] = repr(fn())
        except Exception as exc:           # MemoryError included: an unbounded read
            result["raised"] = f"{type(exc).__name__}: {exc}"
        except (SystemExit, Blocked) as exc:
            result["raised"] = f"{type(exc).__name__}: {exc}"
    result["warnings"] = [[w.category.__name__, str(w.message)] for w in caught]
    result.update(stdout=out.getvalue(), stderr=err.getvalue())
    return result


def read_autotune_entry(tmp: Path, kind: str) -> tuple[Path, int, dict]:
    """``plan()`` with the hostile file as the problem's autotune cache entry."""
    import pyblasgemm
    from pyblasgemm.planner import autotune as AT
    from pyblasgemm.planner import make_desc

    env = {"PYBLASGEMM_CACHE_DIR": str(tmp / "tune"), "PYBLASGEMM_ARCH": "sm_90"}
    with mock.patch.dict(os.environ, env), \
            mock.patch.object(AT, "identity_provider", lambda device: FAKE_ID), \
            mock.patch.object(AT, "_no_gpu", set()):
        path = AT.TuneCache().path(FAKE_ID, AT._fingerprint(),
                                   AT.problem_key(make_desc(*SHAPE, "f16", transa="T")))
        make_hostile(path, kind, CACHE_ENTRY_BYTES)
        pyblasgemm.clear_plan_cache()
        got = _record(lambda: pyblasgemm.plan(*SHAPE, "f16", transa="T").source)
        pyblasgemm.clear_plan_cache()
    return path, CACHE_ENTRY_BYTES, got


def _kernel_entry(tmp: Path, kind: str, hostile: str) -> tuple[Path, int, dict]:
    import hashlib

    from pyblasgemm.kernels import jit

    cub, meta = tmp / "kernels" / "k.cubin", tmp / "kernels" / "k.json"
    cub.parent.mkdir(parents=True)
    cub.write_bytes(CUBIN)
    meta.write_text(json.dumps({"lowered": {n: f"_Z{i}" for i, n in enumerate(NAMES)},
                                "size": len(CUBIN), "sha256": hashlib.sha256(CUBIN).hexdigest()}))
    path, bound = (meta, CACHE_ENTRY_BYTES) if hostile == "meta" else (cub, CUBIN_BYTES)
    path.unlink()
    make_hostile(path, kind, bound)
    return path, bound, _record(lambda: jit._read_cached_cubin(cub, meta, NAMES))


def read_kernel_metadata(tmp, kind):
    """The sm_90a kernel cache with the hostile file as an entry's metadata."""
    return _kernel_entry(tmp, kind, "meta")


def read_kernel_cubin(tmp, kind):
    """The sm_90a kernel cache with the hostile file as an entry's cubin."""
    return _kernel_entry(tmp, kind, "cubin")


def read_choices(tmp, kind):
    """``load_choices`` of the hostile file (a measured-choice table passed by path)."""
    from pyblasgemm.planner import measured

    path = tmp / "choices.json"
    make_hostile(path, kind, DOCUMENT_BYTES)
    return path, DOCUMENT_BYTES, _record(lambda: measured.load_choices(str(path)))


def read_calibration(tmp, kind):
    """``load_calibration`` of the hostile file (a calibration passed by path)."""
    from pyblasgemm.planner import model

    path = tmp / "calibration.json"
    make_hostile(path, kind, DOCUMENT_BYTES)
    return path, DOCUMENT_BYTES, _record(lambda: model.load_calibration(str(path)))


def read_bench_table(tmp, kind):
    """``python -m pyblasgemm bench --table`` of the hostile file."""
    from pyblasgemm.__main__ import main

    path = tmp / "results.json"
    make_hostile(path, kind, DOCUMENT_BYTES)
    return path, DOCUMENT_BYTES, _record(lambda: main(["bench", "--table", str(path)]))


def read_plot(tmp, kind):
    """``python bench/plot.py`` of the hostile file."""
    from pyblasgemm.benchmarks import plot

    path = tmp / "results.json"
    make_hostile(path, kind, DOCUMENT_BYTES)
    return path, DOCUMENT_BYTES, _record(lambda: plot.main([str(path), "--out", str(tmp / "plots")]))


#: reader -> (function, how it must answer: 'warns <Category>', 'raises' or 'exit 2')
READERS = {
    "autotune-plan": (read_autotune_entry, "warns CacheWarning"),
    "kernel-metadata": (read_kernel_metadata, "warns KernelCacheWarning"),
    "kernel-cubin": (read_kernel_cubin, "warns KernelCacheWarning"),
    "choices": (read_choices, "warns ChoicesWarning"),
    "calibration": (read_calibration, "raises"),
    "bench-table": (read_bench_table, "exit 2"),
    "plot": (read_plot, "exit 2"),
}


def _child(tmp: str) -> None:
    """The child process: every reader on every dangerous kind, each case under an alarm, all
    under a memory cap; prints {"reader/kind": [path, bound, outcome]} as JSON."""
    import pyblasgemm.__main__  # noqa: F401
    import pyblasgemm.benchmarks.plot  # noqa: F401
    import pyblasgemm.planner.autotune  # noqa: F401

    def alarm(signum, frame):      # interrupts a blocking open() or read() (EINTR)
        raise Blocked(f"blocked for {CASE_TIMEOUT_S} s")

    signal.signal(signal.SIGALRM, alarm)
    with open("/proc/self/status") as f:      # cap what the reads may add, not the imports
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + CHILD_HEADROOM_BYTES, resource.RLIM_INFINITY))
    out = {}
    for reader, (fn, _) in READERS.items():
        for kind in DANGEROUS:
            signal.alarm(CASE_TIMEOUT_S)
            try:
                path, bound, got = fn(Path(tmp) / f"{reader}-{kind}", kind)
            finally:
                signal.alarm(0)
            out[f"{reader}/{kind}"] = [str(path), bound, got]
    print(json.dumps(out))


@pytest.fixture(scope="module")
def dangerous_outcomes(tmp_path_factory):
    """What every reader did with a FIFO and a link to /dev/zero, in one child process."""
    tmp = tmp_path_factory.mktemp("hostile")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYBLASGEMM_")}
    env["OPENBLAS_NUM_THREADS"] = "1"
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('hostile', {__file__!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "m._child(sys.argv[1])\n")
    budget = 60 + CASE_TIMEOUT_S * len(READERS) * len(DANGEROUS)     # a backstop: never hang
    proc = subprocess.run([sys.executable, "-c", code, str(tmp)], env=env, capture_output=True,
                          text=True, timeout=budget)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reader", READERS)
def test_reader_refuses_a_hostile_file(fresh_planner, tmp_path, request, reader, kind):
    fn, answer = READERS[reader]
    if kind in DANGEROUS:
        path, bound, got = request.getfixturevalue("dangerous_outcomes")[f"{reader}/{kind}"]
        path = Path(path)
    else:
        path, bound, got = fn(tmp_path, kind)
    reason = KINDS[kind].format(bound=bound)
    if answer.startswith("warns"):
        assert got["raised"] is None, got
        mine = [m for c, m in got["warnings"] if c == answer.split()[1]]
        assert len(mine) == 1 and str(path) in mine[0] and reason in mine[0], got
        assert got["value"] in ("None", "'heuristic'", "'measured'"), got   # ignored, not used
    elif answer == "raises":
        assert got["raised"] and got["raised"].startswith("ValueError: "), got
        assert str(path) in got["raised"] and reason in got["raised"], got
    else:
        assert got["raised"] is None and got["value"] == "2", got
        (line,) = got["stderr"].splitlines()
        assert line.startswith("error: ") and str(path) in line and reason in line, got
        assert got["stdout"] == ""
    if kind == "fifo":
        assert path.is_fifo()          # left as it was: never opened for writing, never replaced
