"""The command line checks every path and size before any work (issue #30, item 5). CPU only.

Before the fix, ``bench --out <a directory | a path under a file | ''>`` and ``--plots <a
file>`` were found out only after the whole benchmark had run, in a traceback; ``--table`` of
a missing, non-JSON or wrong file, a huge ``--shapes`` and a huge ``demo --size`` ended in
tracebacks too. Each case here must now answer at once: exit code 2, one line ``error: ...``
on stderr naming the option, nothing on stdout, no file written, and nothing run (the
benchmark's ``run`` and the demo's body are replaced by functions that fail the test).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import pyblasgemm.__main__ as cli
from pyblasgemm.benchmarks import plot, suite

#: a host run that would take well under a second: the refusals must not even start it
RUN = ["bench", "--device", "host", "--shapes", "8x8x8", "--dtype", "fp16", "--no-progress"]
#: a results document of the right schema with no results in it
NO_RESULTS = {"schema": suite.SCHEMA, "date": "2026-01-01", "device": {"name": "x"},
              "versions": {}, "method": {}, "ceilings": {}, "results": []}

#: id -> (argv with {tmp} for the test's directory, environment, what the error line must say)
CASES = {
    # bench --out
    "out-a-directory": (RUN + ["--out", "{tmp}"], {}, "--out '{tmp}' is a directory"),
    "out-ends-in-a-slash": (RUN + ["--out", "{tmp}/new/"], {}, "is a directory"),
    "out-under-a-file": (RUN + ["--out", "{tmp}/afile/x.json"], {},
                         "'{tmp}/afile' is not a directory"),
    "out-empty": (RUN + ["--out", ""], {}, "--out '' is empty"),
    "results-dir-a-file": (RUN, {"PYBLASGEMM_RESULTS_DIR": "{tmp}/afile"}, "the results directory"),
    # bench --plots
    "plots-a-file": (RUN + ["--out", "{tmp}/r.json", "--plots", "{tmp}/afile"], {},
                     "--plots '{tmp}/afile': it is a file, not a directory"),
    "plots-under-a-file": (RUN + ["--out", "{tmp}/r.json", "--plots", "{tmp}/afile/p"], {},
                           "'{tmp}/afile' is not a directory"),
    "plots-empty": (RUN + ["--out", "{tmp}/r.json", "--plots", ""], {}, "--plots '' is empty"),
    "plots-without-matplotlib": (RUN + ["--out", "{tmp}/r.json", "--plots", "{tmp}/p"],
                                 {"matplotlib": None}, "--plots needs matplotlib"),
    # bench --table
    "table-missing": (["bench", "--table", "{tmp}/none.json"], {}, "no such file"),
    "table-not-json": (["bench", "--table", "{tmp}/afile"], {}, "not JSON"),
    "table-wrong-schema": (["bench", "--table", "{tmp}/other.json"], {},
                           f"not a {suite.SCHEMA} results file"),
    "table-no-results": (["bench", "--table", "{tmp}/empty.json"], {}, "holds no results"),
    "table-empty": (["bench", "--table", ""], {}, "--table '' is empty"),
    # sizes
    "shapes-too-big-for-memory": (RUN[:3] + ["--shapes", "1000000x1000000x1000000"] + RUN[5:], {},
                                  "needs about 43.7 TiB of host memory"),
    "shapes-over-int32": (RUN[:3] + ["--shapes", "3000000000x8x8"] + RUN[5:], {},
                          "must be <= 2147483647"),
    "demo-size-too-big": (["demo", "--size", "10000000"], {}, "demo --size 10000000 needs about"),
    # plan / tune: a bad --trans was a SystemExit with exit code 1 after the plan's preamble
    "plan-trans-three-letters": (["plan", "8", "8", "8", "--trans", "NTN"], {},
                                 "--trans 'NTN': give two letters"),
}


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    """The test's directory, with a regular file 'afile', a JSON file of another kind and a
    results file without results; the working directory for the test."""
    (tmp_path / "afile").write_text("a regular file, not JSON\n")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    (tmp_path / "empty.json").write_text(json.dumps(NO_RESULTS))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _nothing_may_run(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("a refused command line ran anyway")

    monkeypatch.setattr(suite, "run", must_not_run)
    monkeypatch.setattr(cli, "demo", must_not_run)


def _files(directory):
    return sorted(str(p) for p in directory.rglob("*"))


@pytest.mark.parametrize("argv, env, says", CASES.values(), ids=CASES)
def test_refused_before_any_work(tmp, monkeypatch, capsys, argv, env, says):
    _nothing_may_run(monkeypatch)
    for name, value in env.items():
        if name == "matplotlib":                     # as if it were not installed
            monkeypatch.setitem(sys.modules, "matplotlib", None)
        else:
            monkeypatch.setenv(name, value.format(tmp=tmp))
    argv = [a.format(tmp=tmp) for a in argv]
    before = _files(tmp)
    t0 = time.perf_counter()
    rc = cli.main(argv)
    elapsed = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    (line,) = err.splitlines()
    assert line.startswith("error: ") and says.format(tmp=tmp) in line, line
    assert out == ""
    assert elapsed < 1.0
    assert _files(tmp) == before                     # nothing written, no directory made


#: id -> (argv of the plot script, what the error line must say)
PLOT_CASES = {
    "missing-file": (["{tmp}/none.json", "--out", "{tmp}/p"], "'{tmp}/none.json': no such file"),
    "not-json": (["{tmp}/afile", "--out", "{tmp}/p"], "not JSON"),
    "unknown-format": (["{tmp}/other.json", "--out", "{tmp}/p"], "not a results file this script"),
    "out-a-file": (["{tmp}/empty.json", "--out", "{tmp}/afile"], "it is a file, not a directory"),
}


@pytest.mark.parametrize("argv, says", PLOT_CASES.values(), ids=PLOT_CASES)
def test_plot_script_refuses_before_drawing(tmp, capsys, argv, says):
    before = _files(tmp)
    assert plot.main([a.format(tmp=tmp) for a in argv]) == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith("error: ") and says.format(tmp=tmp) in line, line
    assert out == "" and _files(tmp) == before


def test_a_refusal_is_one_line_without_a_traceback_from_the_shell(tmp):
    """``python -m pyblasgemm bench --out <directory>``: what a user sees, exit code included."""
    before = _files(tmp)
    proc = subprocess.run([sys.executable, "-m", "pyblasgemm", *RUN, "--out", str(tmp)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == f"error: --out '{tmp}' is a directory: give a file in it, e.g. " \
                          f"'{tmp}/results.json'\n"
    assert proc.stdout == "" and _files(tmp) == before

