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


def test_the_first_command_is_the_host_only_install():
    """Issue 35 item 2: a machine without a GPU must not get 1-2 GB of CUDA wheels from the
    first command (it installed ``.[cuda13,test]`` before); the installation guide's quick start
    is the same line."""
    first = _quick_start_commands()[0]
    assert "pip install -e . &&" in first and "[" not in first, first     # no extras
    guide = (ROOT / "docs" / "installation.rst").read_text()
    quick = guide.split("Quick start\n-----------", 1)[1]
    assert first in quick.split("installs the host-only package", 1)[0]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _quick_start_commands()[1] in ci


def test_readme_example_runs_on_the_host(capsys):
    """The "Three forms" example runs as written on NumPy arrays, with the results it claims."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Three forms", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)\n```", section, flags=re.S)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    np = scope["np"]
    assert scope["z"].shape == (8, 3, 5)
    np.testing.assert_allclose(scope["z"], np.matmul(scope["x"], scope["y"]))
    np.testing.assert_allclose(scope["out"], scope["a"].T @ scope["b"], rtol=1e-5)
    m, n, k = scope["m"], scope["n"], scope["k"]
    want = (scope["A"].reshape(k, m).T.astype(np.float64) @ scope["B"].reshape(k, n).astype(np.float64))
    np.testing.assert_allclose(scope["C"].reshape(n, m).T, want, rtol=1e-2, atol=1e-2)
    assert scope["c"].flags.f_contiguous and scope["c"].shape == (32, 16)
    assert capsys.readouterr().out.startswith("plan: backend")


def test_the_dask_scaling_sentence_is_the_named_results_file():
    """The README's Dask ratios on 2 and 4 GPUs are the named results file's (4 H200, every run
    started by the engines), not typed in."""
    import json

    readme = (ROOT / "README.md").read_text()
    name = "dask_scaling_h200x4_2026-11-28_27c52ef.json"
    assert f"bench/results/{name}" in readme
    doc = json.loads((ROOT / "bench" / "results" / name).read_text())
    ratio = {(c["case"], c["gpus"], c["schedule"]): c["pyblasgemm.dask.matmul"]["speedup_vs_one_call"]
             for c in doc["cases"]}
    text = " ".join(readme.split())
    fp16, fp64 = "32768^3 float16", "16384^3 float64"
    assert (f"32768³ float16 runs at {ratio[(fp16, 2, 'start')]:.3f}x one `pyblasgemm.matmul` call on one GPU "
            f"on 2 GPUs and {ratio[(fp16, 4, 'start')]:.3f}x on 4") in text
    assert f"16384³ float64 at {ratio[(fp64, 2, 'start')]:.3f}x and {ratio[(fp64, 4, 'start')]:.3f}x" in text
