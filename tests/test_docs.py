"""The documentation is tested like code: every ``>>>`` example in docs/**/*.rst runs on the
host backend and prints what the page says; every ``python`` code block (the GPU examples,
which CI cannot run) at least compiles; the API page covers ``pyblasgemm.__all__``; every
``PYBLASGEMM_*`` environment variable the package reads is documented; every figure exists."""
import doctest
import pathlib
import re
import textwrap

import numpy as np
import pytest

import pyblasgemm

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.rst") if "_build" not in p.parts)
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


def _rel(p):
    return str(p.relative_to(DOCS))


def test_the_site_has_its_pages():
    names = {_rel(p) for p in PAGES}
    assert names >= {"index.rst", "installation.rst", "guide/blas.rst", "guide/matmul.rst",
                     "guide/precision.rst", "guide/planner.rst", "performance.rst", "api.rst",
                     "changelog.rst"}


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_page_examples_run(page, monkeypatch):
    """Every page's examples, planned for the H100 datasheet spec the pages describe (as on a
    host without a GPU), whatever GPU runs the tests: an H200's own spec plans otherwise."""
    monkeypatch.setenv("PYBLASGEMM_ARCH", "sm_90")
    pyblasgemm.clear_plan_cache()
    text = page.read_text()
    test = doctest.DocTestParser().get_doctest(text, {"__name__": "docs"}, _rel(page),
                                               str(page), 0)
    if "guide" in page.parts:
        assert len(test.examples) >= 5, f"{_rel(page)}: a guide without runnable examples"
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    pyblasgemm.set_default_compute("fp32")
    try:
        runner.run(test)
    finally:
        pyblasgemm.set_default_compute("fp32")
        pyblasgemm.clear_plan_cache()
    assert runner.failures == 0, f"{runner.failures} failing example(s) in {_rel(page)}"


_CODE = re.compile(r"^( *)\.\. code-block:: python\n((?:\1   .*\n|\s*\n)+)", re.M)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_python_blocks_compile(page):
    for m in _CODE.finditer(page.read_text()):
        src = textwrap.dedent(m.group(2))
        compile(src, f"{_rel(page)} (code block)", "exec")


def test_api_page_covers_all_public_names():
    api = (DOCS / "api.rst").read_text()
    missing = [n for n in pyblasgemm.__all__ if n != "__version__"
               and not re.search(rf"pyblasgemm\.{re.escape(n)}\b", api)]
    assert not missing, f"docs/api.rst does not document {missing}"


def test_every_environment_variable_is_documented():
    used = set()
    for path in (ROOT / "pyblasgemm").rglob("*.py"):
        used |= set(re.findall(r"PYBLASGEMM_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    documented = (DOCS / "guide" / "planner.rst").read_text()
    missing = sorted(v for v in used if v not in documented)
    assert not missing, f"docs/guide/planner.rst does not document {missing}"


def test_figures_exist():
    for page in PAGES:
        for ref in re.findall(r"\.\. (?:image|figure):: (\S+)", page.read_text()):
            target = (DOCS / ref.lstrip("/")) if ref.startswith("/") else page.parent / ref
            assert target.is_file(), f"{_rel(page)} shows {ref}, which does not exist"


def test_error_messages_quoted_in_the_blas_guide_are_real():
    """The guide's table quotes messages; the doctests there raise them for real."""
    text = (DOCS / "guide" / "blas.rst").read_text()
    assert "hgemm: parameter 8 (lda=3) must be >= max(1, m) = 5" in text
    with pytest.raises(pyblasgemm.BlasArgumentError,
                       match=re.escape("hgemm: parameter 8 (lda=3) must be >= max(1, m) = 5")):
        buf = np.zeros(64, dtype=np.float16)
        pyblasgemm.hgemm("N", "N", 5, 2, 2, 1.0, buf, 3, buf[:4], 2, 0.0, buf[32:], 5)


def test_performance_page_numbers_are_the_named_results_file():
    """The performance page's table is generated from the suite JSON the page names."""
    import json
    from pyblasgemm.benchmarks import suite
    text = (DOCS / "performance.rst").read_text()
    (name,) = set(re.findall(r"bench/results/(suite_[\w.-]+\.json)", text))
    doc = json.loads((ROOT / "bench" / "results" / name).read_text())
    assert suite.rst_table(doc) in text
    stem = name[:-len(".json")]
    for kind in ("ratio", "tflops", "roofline"):
        assert f"_static/perf/{stem}_{kind}.png" in text
