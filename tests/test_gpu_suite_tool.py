"""tools/gpu_suite.py: the JUnit keys of pytest's node ids, the tests a part still has to run,
and the counts of several parts (a re-run wins). CPU only."""
from __future__ import annotations

import doctest
import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "gpu_suite.py"
spec = importlib.util.spec_from_file_location("gpu_suite", TOOL)
gpu_suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_suite)

PART1 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3" time="12.5"
timestamp="2026-11-28T11:30:52"><testcase classname="tests.test_a" name="test_x[1]" time="1"/>
<testcase classname="tests.test_a" name="test_y" time="1"><failure message="boom"/></testcase>
<testcase classname="tests.peer.test_p" name="TestM_param_0_{a=[(1, 2)]}::test_m" time="1"><skipped message="s"/></testcase>
</testsuite></testsuites>"""
PART2 = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="1" time="2.0"
timestamp="2026-11-28T11:50:00"><testcase classname="tests.test_a" name="test_y" time="1"/></testsuite></testsuites>"""


def test_doctests():
    assert doctest.testmod(gpu_suite).failed == 0


def test_a_later_part_runs_what_the_earlier_ones_did_not_record(tmp_path):
    (tmp_path / "p1.xml").write_text(PART1)
    done = gpu_suite.finished([tmp_path / "p1.xml"])
    ids = ["tests/test_a.py::test_x[1]", "tests/test_a.py::test_x[2]", "tests/test_a.py::test_y",
           "tests/peer/test_p.py::TestM_param_0_{a=[(1, 2)]}::test_m"]
    assert [i for i in ids if gpu_suite.junit_key(i) not in done] == ["tests/test_a.py::test_x[2]"]


def test_summary_counts_each_test_once_with_its_last_outcome(tmp_path):
    (tmp_path / "p1.xml").write_text(PART1)
    (tmp_path / "p2.xml").write_text(PART2)
    s = gpu_suite.summary([tmp_path / "p1.xml", tmp_path / "p2.xml"])
    assert s["total"] == {"passed": 2, "skipped": 1}          # test_y failed, then passed
    assert s["failures"] == [] and [p["tests"] for p in s["parts"]] == [3, 1]
    s1 = gpu_suite.summary([tmp_path / "p1.xml"])
    assert s1["failures"] == ["tests.test_a::test_y"] and s1["total"]["failed"] == 1
