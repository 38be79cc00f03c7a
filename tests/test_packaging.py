"""The package as shipped (issue 35): one version source, the SPDX license, the classifiers CI
backs, the CuPy bounds and extras, a complete sdist, SciPy optional (the GELU's erf without it)."""
import math
import pathlib
import re
import sys

import numpy as np
import pytest

try:
    import tomllib
except ImportError:                     # Python 3.10: pytest brings tomli there
    import tomli as tomllib

import pyblasgemm
from pyblasgemm import _erf, epilogue

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


# ---- one version source ------------------------------------------------------------------

def test_version_is_written_once():
    literal = re.compile(r"""["']""" + re.escape(pyblasgemm.__version__) + r"""["']""")
    files = [ROOT / "pyproject.toml", *sorted((ROOT / "pyblasgemm").rglob("*.py"))]
    places = [f"{p.relative_to(ROOT)}:{i}" for p in files
              for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert places == ["pyblasgemm/_version.py:" + places[0].split(":")[1]], places
    assert "version" in PROJECT.get("dynamic", []) and "version" not in PROJECT
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pyblasgemm._version.__version__"}


def test_kernel_cache_key_reads_the_version():
    from pyblasgemm.kernels import jit

    assert jit.PACKAGE_VERSION is pyblasgemm.__version__


# ---- license, classifiers, dependencies --------------------------------------------------

def test_spdx_license():
    assert PROJECT["license"] == "Apache-2.0"            # a string: PEP 639's SPDX expression
    assert PROJECT["license-files"] == ["LICENSE"] and (ROOT / "LICENSE").is_file()
    # the license classifier is deprecated beside an SPDX expression (setuptools refuses both)
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]
    setuptools_req = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert setuptools_req == ["setuptools>=77"]          # the first to read license-files


def _versions_classified():
    return sorted((tuple(map(int, c.rsplit(" ", 1)[1].split("."))) for c in PROJECT["classifiers"]
                   if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)))


def test_python_classifiers_are_the_tested_range():
    versions = _versions_classified()
    assert versions == [(3, 10), (3, 11), (3, 12), (3, 13)]
    assert PROJECT["requires-python"] == ">=%d.%d" % versions[0]
    ci = (ROOT / ".ci" / "run").read_text()
    for v in (versions[0], versions[-1]):          # CI runs the host tests on the oldest and newest
        assert re.search(r"\b%d\.%d\.\d+\b" % v, ci), f"{v} not in .ci/run"


def test_cupy_is_bounded_and_the_gpu_extras_are_whole():
    extras = PROJECT["optional-dependencies"]
    cupy = [(name, r) for name, reqs in extras.items() for r in reqs if r.startswith("cupy")]
    assert {name for name, _ in cupy} == {"cuda13", "cuda12", "cuda13-lean", "cuda12-lean"}
    for name, req in cupy:
        assert re.search(r">=14\.0,<15$", req), (name, req)      # v15 is untested
        assert ("[ctk]" in req) == (not name.endswith("-lean")), (name, req)


def test_scipy_is_optional():
    assert not [r for r in PROJECT["dependencies"] if r.startswith("scipy")]
    extras = PROJECT["optional-dependencies"]
    assert "scipy>=1.11" in extras["scipy"] and "scipy>=1.11" in extras["test"]


def test_sdist_manifest_carries_what_the_tests_read():
    manifest = (ROOT / "MANIFEST.in").read_text().split("\n")
    for d in ("tests", "docs", "bench", "tools", ".ci", "pyblasgemm"):
        assert f"graft {d}" in manifest, d
    include = next(line for line in manifest if line.startswith("include "))
    for f in ("README.md", "CHANGELOG.md", "LICENSE"):
        assert f in include.split(), f


def _setuptools_for_the_sdist():
    """setuptools' own build_sdist, in this Python, where it is new enough (77: license-files):
    the ``test`` extra brings it (a fresh venv has none on 3.12+, 65 on 3.10-3.11); without
    it, skip."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 (the build's requirement)")


def test_the_sdist_holds_the_tracked_tree_and_its_tests_run_from_it(tmp_path):
    """Issue 35 item 3: the sdist lacked tests/conftest.py, the test helpers, docs/ and the
    changelog, so its tests could not run. Build it (the build backend pip calls), compare it
    with the checkout's tracked files, and run a sample of the tests from the unpacked sdist
    (the README, packaging, docs and observability tests: they read README.md, CHANGELOG.md,
    docs/, bench/, tools/ and .ci/)."""
    import os
    import subprocess
    import tarfile

    _setuptools_for_the_sdist()
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
         "print(b.build_sdist(sys.argv[1]))", str(tmp_path / "dist")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    name = build.stdout.split()[-1]
    assert name == f"pyblasgemm-{pyblasgemm.__version__}.tar.gz"
    with tarfile.open(tmp_path / "dist" / name) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
        if sys.version_info >= (3, 12):
            tar.extractall(tmp_path, filter="data")
        else:
            tar.extractall(tmp_path)
    for f in ("tests/conftest.py", "tests/_ref.py", "tests/emulator.py", "docs/conf.py",
              "CHANGELOG.md", "README.md", "LICENSE", ".ci/run", "pyblasgemm/py.typed"):
        assert f in members, f
    if (ROOT / ".git").exists():      # a checkout (not this test run from an sdist)
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split()
        missing = sorted(set(tracked) - members - {".gitignore"})
        assert missing == [], missing[:20]
    tree = tmp_path / name[:-len(".tar.gz")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYBLASGEMM_"))}
    env["PYTHONPATH"] = str(tree)
    where = subprocess.run([sys.executable, "-c", "import pyblasgemm; print(pyblasgemm.__file__)"],
                           cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip() == str(tree / "pyblasgemm" / "__init__.py"), where
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not sdist",
         "tests/test_readme.py", "tests/test_packaging.py", "tests/test_docs.py",
         "tests/test_observability.py"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\b\d+ passed", run.stdout) and " failed" not in run.stdout


# ---- erf without SciPy ---------------------------------------------------------------------

def _ulps(a, b):
    """Distance in float64 steps (a monotone integer view of the bits; -0.0 == +0.0)."""
    ia, ib = a.view(np.int64), b.view(np.int64)
    lo = np.int64(-2 ** 63)
    ia = np.where(ia < 0, lo - ia, ia)
    ib = np.where(ib < 0, lo - ib, ib)
    return np.abs(ia - ib)


def _grid():
    finite = np.concatenate([
        np.linspace(-7.0, 7.0, 140_001),                       # every regime, both signs
        np.geomspace(5e-324, 10.0, 20_000),                     # subnormals to the tail
        -np.geomspace(5e-324, 10.0, 20_000),
        [0.84375, 2.5, 6.0, 1e300, -1e300, np.finfo(np.float64).max],
    ])
    edges = np.array([0.84375, 2.5, 6.0])                       # the regime boundaries, ±1 step
    return np.concatenate([finite, np.nextafter(edges, 0), np.nextafter(edges, 10)])


def test_erf_numpy_within_2_ulp_of_math_erf():
    x = _grid()
    got = _erf.erf_numpy(x)
    want = np.array([math.erf(v) for v in x.tolist()])
    assert got.dtype == np.float64
    u = _ulps(got, want)
    assert u.max() <= 2, (x[u.argmax()], got[u.argmax()], want[u.argmax()])


def test_erf_numpy_special_values():
    got = _erf.erf_numpy(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0]))
    assert np.isnan(got[0])
    assert got[1:3].tolist() == [1.0, -1.0]
    assert got[3] == 0 and np.signbit(got[3]) and not np.signbit(got[4])
    assert _erf.erf_numpy(np.float64(-0.0)).shape == ()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_erf_numpy_keeps_the_type(dtype):
    x = np.linspace(-4, 4, 101).astype(dtype)
    got = _erf.erf_numpy(x)
    assert got.dtype == dtype
    want = np.array([math.erf(v) for v in x.astype(np.float64).tolist()]).astype(dtype)
    np.testing.assert_array_equal(got, want)             # float64-accurate, rounded once


def test_gelu_runs_without_scipy(monkeypatch):
    # no SciPy: the NumPy erf; and the same GELU as with SciPy where SciPy is here
    monkeypatch.setitem(sys.modules, "scipy.special", None)   # makes the import fail
    monkeypatch.setattr(_erf, "_ERF", [])
    x = np.linspace(-5, 5, 2001)
    got = epilogue._gelu(x)
    assert _erf._ERF == [_erf.erf_numpy]
    want = np.array([v * 0.5 * (1 + math.erf(v * epilogue._SQRT_HALF)) for v in x.tolist()])
    # absolute: 1 + erf cancels in the negative tail, where both are ~1e-16 of x
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)
