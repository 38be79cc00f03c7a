"""Run the GPU suite (the tests marked ``gpu``) in parts that each fit a time budget, and say
what is left.

A cold GPU suite takes longer than one call on a lent machine (an H200, 2026-11-28: ~2,900
tests, 474 s for the first 2,678 with 14 workers), so it runs in parts: each part stops at its
budget with SIGINT (pytest then writes its JUnit XML and prints the summary), and the next part
runs only the tests no earlier part's XML holds::

    python tools/gpu_suite.py --budget 470 --junit $OUT/part1.xml
    python tools/gpu_suite.py --budget 470 --junit $OUT/part2.xml --after part1.xml
    python tools/gpu_suite.py --summary results.json part1.xml part2.xml   # the counts, per file

The kernel cache (``XDG_CACHE_HOME``) carried from one part to the next saves the compiles;
pyblasgemm's compile lock already makes the workers compile each kernel once.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def junit_key(node_id: str) -> tuple[str, str]:
    """(classname, name) that pytest's JUnit XML gives the test ``node_id``, as pytest makes
    them: split at ``::`` up to the first ``[``, the path's ``/`` as ``.`` without ``.py``:
    ``tests/peer/test_x.py::TestA::test_b[p]`` -> ``('tests.peer.test_x.TestA', 'test_b[p]')``.

    >>> junit_key("tests/test_gemm.py::test_gemm_layouts[cupy-C-s]")
    ('tests.test_gemm', 'test_gemm_layouts[cupy-C-s]')
    >>> junit_key("tests/peer/test_p.py::TestM_param_0_{a=((2,), (2,))}::test_m")
    ('tests.peer.test_p.TestM_param_0_{a=((2,), (2,))}', 'test_m')
    >>> junit_key("tests/p.py::TestA_param_0_{a=[(1, 2)]}::test_m")      # a '[' in the class
    ('tests.p', 'TestA_param_0_{a=[(1, 2)]}::test_m')
    """
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".")
    if names[0].endswith(".py"):
        names[0] = names[0][:-3]
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def finished(junit_files) -> set:
    """The (classname, name) of every test the XML files record (passed, failed, skipped)."""
    done = set()
    for f in junit_files:
        for case in ET.parse(f).getroot().iter("testcase"):
            done.add((case.get("classname") or "", case.get("name") or ""))
    return done


def collect(marker: str, paths) -> list[str]:
    """The node ids pytest collects for ``-m marker`` under ``paths`` (one per line: an id can
    hold spaces)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-m", marker,
                          *paths], cwd=ROOT, capture_output=True, text=True)
    ids = [line for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if out.returncode not in (0, 5) or not ids and out.returncode == 0:
        raise SystemExit(f"collection failed (exit {out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return ids


def run_part(ids, budget_s: float, workers: int, junit: str) -> int:
    """pytest on ``ids`` with ``workers`` xdist workers, interrupted (SIGINT) after ``budget_s``."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--durations=20",
           f"--junitxml={junit}", *(["-n", str(workers)] if workers > 1 else []), *ids]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    try:
        return proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)        # pytest stops, then writes the XML and the summary
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def summary(junit_files) -> dict:
    """Counts per test file and in all ({'passed', 'failed', 'skipped'}), the failures' ids, and
    each part's wall time, from the XML files; a test recorded by several parts counts once,
    with the last part's outcome (a re-run after a fix)."""
    outcomes: dict = {}         # (classname, name) -> (module, outcome): a later part's run wins
    parts = []
    for f in junit_files:
        root = ET.parse(f).getroot()
        for suite in root.iter("testsuite"):
            parts.append({"file": Path(f).name, "tests": int(suite.get("tests", 0)),
                          "time_s": float(suite.get("time", 0)), "timestamp": suite.get("timestamp")})
        for case in root.iter("testcase"):
            cls = case.get("classname") or ""
            module = cls.split(".{")[0]
            while module.count(".") > 1 and not (ROOT / (module.replace(".", "/") + ".py")).exists():
                module = module.rpartition(".")[0]
            outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                       else "skipped" if case.find("skipped") is not None else "passed")
            outcomes[(cls, case.get("name") or "")] = (module, outcome)
    per_file: dict = collections.defaultdict(collections.Counter)
    for module, outcome in outcomes.values():
        per_file[module][outcome] += 1
    failures = [f"{cls}::{name}" for (cls, name), (_, outcome) in outcomes.items() if outcome == "failed"]
    total = sum(per_file.values(), collections.Counter())
    return {"total": dict(total), "per_file": {k: dict(v) for k, v in sorted(per_file.items())},
            "failures": failures, "parts": parts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=470, help="seconds before the part is interrupted")
    ap.add_argument("--workers", type=int, default=14, help="pytest-xdist workers (1: none)")
    ap.add_argument("--junit", help="the part's JUnit XML (where it is written)")
    ap.add_argument("--after", nargs="*", default=[], help="earlier parts' XML: their tests are not run again")
    ap.add_argument("--marker", default="gpu")
    ap.add_argument("--paths", nargs="*", default=["tests"])
    ap.add_argument("--summary", help="write the counts of the XML files given as arguments to this JSON file")
    ap.add_argument("xml", nargs="*", help="with --summary: the parts' XML files")
    args = ap.parse_args(argv)
    if args.summary:
        doc = {"date": datetime.date.today().isoformat(), **summary(args.xml)}
        Path(args.summary).write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(doc["total"]), len(doc["failures"]), "failed")
        return 0
    if not args.junit:
        ap.error("--junit is required to run a part")
    if args.budget <= 0 or args.workers < 1:
        ap.error(f"--budget must be > 0 s and --workers >= 1 (got {args.budget}, {args.workers})")
    done = finished(args.after)
    ids = [i for i in collect(args.marker, args.paths) if junit_key(i) not in done]
    print(f"{len(ids)} tests to run ({len(done)} recorded by earlier parts)", flush=True)
    if not ids:
        return 0
    t0 = time.monotonic()
    rc = run_part(ids, args.budget, args.workers, args.junit)
    print(f"part: exit {rc}, {time.monotonic() - t0:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
