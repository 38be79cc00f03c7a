"""The README's quick start is what CI runs: exactly two command lines, the second in .ci/run."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _quick_start_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_readme_has_exactly_two_commands():
    cmds = _quick_start_commands()
    assert len(cmds) == 2 and all("\n" not in c for c in cmds)
    assert cmds[0].endswith("python -m pyblasgemm demo")
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _quick_start_commands()[1] in ci
