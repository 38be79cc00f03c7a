"""The examples in the docstrings of every pyblasgemm module run (on the host backend) and print
what they say.

The modules are found, not listed: every module of the package is imported and each one whose
docstrings hold examples runs, so a new module's examples run without an edit here. One that
needs an optional dependency which is missing is skipped with its name, never dropped;
test_every_module_with_examples_is_discovered checks the list against the sources' ``>>>``.
This is the one place the package's docstrings run (one runner, one set of flags): the module
doctests tests/test_dask.py, test_planner.py and test_planner_measured.py ran are left to it.
"""
from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import sys

import pytest

import pyblasgemm

#: optional dependencies: a module that cannot be imported without one, or whose examples
#: import one, is skipped while it is missing
OPTIONAL = ("cupy", "torch", "jax", "dask", "distributed")
PACKAGE_DIR = pathlib.Path(pyblasgemm.__file__).parent


def _missing_optional(error: BaseException, optional) -> str | None:
    """The optional module whose absence caused ``error``, if that is the cause.

    pyblasgemm.torch re-raises a missing torch as an ImportError that says what to install, so
    the chain of causes is followed down to the ModuleNotFoundError."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError):
            root = (error.name or "").partition(".")[0]
            if root in optional:
                return root
        error = error.__cause__ or error.__context__
    return None


def _imported_roots(test: doctest.DocTest) -> set:
    """Top-level names of the modules the examples import (``import dask.array as da`` ->
    dask)."""
    roots = set()
    for example in test.examples:
        try:
            tree = ast.parse(example.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                roots.add(node.module.partition(".")[0])
    return roots


def _home(f) -> str:
    """The module a function's code is in (for a functools.wraps wrapper, the wrapped one's)."""
    return inspect.unwrap(f).__globals__.get("__name__", "")


def module_doctests(module) -> list:
    """The DocTests with examples of ``module``'s docstrings.

    DocTestFinder takes a function for the module its ``__module__`` names. The BLAS functions
    are made by a factory in pyblasgemm.blas and named pyblasgemm.sgemm etc., so the finder
    gives them to the package and none to blas: they are collected here where they are made,
    and dropped from the package's own, so that each runs once."""
    finder = doctest.DocTestFinder()
    name, own = module.__name__, vars(module)
    tests = [t for t in finder.find(module)
             if not (inspect.isfunction(f := own.get(t.name[len(name) + 1:]))
                     and _home(f) != name)]
    for fname, f in own.items():
        if inspect.isfunction(f) and f.__module__ != name and _home(f) == name and f.__doc__:
            tests += finder.find(f, name=f"{name}.{fname}", module=False, globs={})
    return [t for t in tests if t.examples]


def discover(package=pyblasgemm, optional=OPTIONAL) -> tuple[dict, dict]:
    """({module name: its runnable DocTests} for every module with examples, {module or
    docstring name: why it is skipped} for every module that cannot be imported without a
    missing optional dependency and every docstring whose examples import one). Any other
    import error is raised: a module that cannot be imported is a failure, not a skip."""
    found, skipped = {}, {}

    def visit(name):
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            dep = _missing_optional(e, optional)
            if dep is None:
                raise
            skipped[name] = f"{name} needs {dep}, which is not installed"
            return
        runnable = []
        for test in module_doctests(module):
            # one docstring's examples at a time: sgemm's torch example must not take the
            # other eight BLAS functions' examples down with it on a machine without torch
            missing = sorted(r for r in _imported_roots(test)
                             if r in optional and importlib.util.find_spec(r) is None)
            if missing:
                skipped[test.name] = f"{test.name}'s examples need {missing[0]}, which is not installed"
            else:
                runnable.append(test)
        if runnable:
            found[name] = runnable

    visit(package.__name__)
    # walk_packages imports a package to list its modules, after yielding it, and swallows an
    # ImportError there: visit has met that error first and raised it or given a reason
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        visit(info.name)
    return found, skipped


FOUND, SKIPPED = discover()


@pytest.mark.parametrize("name", sorted(FOUND) + [
    pytest.param(name, marks=pytest.mark.skip(reason=why)) for name, why in sorted(SKIPPED.items())])
def test_docstring_examples(name):
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for test in FOUND[name]:
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} doctest failures in {name}"


def _module_name(path: pathlib.Path, package_dir=PACKAGE_DIR, package="pyblasgemm") -> str:
    parts = path.relative_to(package_dir).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((package, *parts))


def _sources_with_examples(package_dir=PACKAGE_DIR, package="pyblasgemm") -> set:
    return {_module_name(p, package_dir, package) for p in package_dir.rglob("*.py")
            if ">>>" in p.read_text(encoding="utf-8")}


def _uncovered(expected, found, skipped) -> set:
    """The modules of ``expected`` neither run nor skipped (themselves, a package above, or
    their docstrings one by one)."""
    def parents(name):
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in expected if m not in found and not parents(m) & set(skipped)
            and not any(s.startswith(m + ".") for s in skipped)}


def test_every_module_with_examples_is_discovered():
    """Each module whose source holds ``>>>`` runs its examples or is skipped with a reason."""
    expected = _sources_with_examples()
    assert {"pyblasgemm.blas", "pyblasgemm.dask", "pyblasgemm.torch"} <= expected
    assert _uncovered(expected, FOUND, SKIPPED) == set()


def test_the_blas_examples_run_once():
    """The factory-made BLAS functions' examples are blas's, and not the package's as well."""
    names = [t.name for tests in FOUND.values() for t in tests]
    assert len(names) == len(set(names))
    # sgemm's examples use torch: without it they are skipped by name, the others still run
    assert ({t.name for t in FOUND["pyblasgemm.blas"]} | set(SKIPPED)
            >= {"pyblasgemm.blas.sgemm", "pyblasgemm.blas.zgemm"})
    assert "pyblasgemm.blas.zgemm" in {t.name for t in FOUND["pyblasgemm.blas"]}
    assert not any(t.name == "pyblasgemm.sgemm" for t in FOUND.get("pyblasgemm", ()))


def test_discovery_on_a_made_up_package(tmp_path, monkeypatch):
    """What discover finds, skips and raises, on a package written here: a module with an
    example, one without, one that needs a missing optional module at import, one whose
    examples import it, a subpackage; and a broken import, which fails rather than skips."""
    pkg = tmp_path / "pbg_fake"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text('"""\n>>> 1 + 1\n2\n"""\n')
    (pkg / "plain.py").write_text('"""No examples."""\n')
    (pkg / "ex.py").write_text('def f():\n    """\n    >>> f()\n    3\n    """\n    return 3\n')
    (pkg / "needs_at_import.py").write_text(
        "try:\n    import pbg_absent_dep.core\nexcept ImportError as e:\n"
        "    raise ImportError('install pbg_absent_dep') from e\n")
    (pkg / "needs_in_examples.py").write_text('"""\n>>> import pbg_absent_dep as d\n"""\n')
    (pkg / "mixed.py").write_text(                          # one docstring runs, one is skipped
        'def f():\n    """\n    >>> 2\n    2\n    """\n\n\n'
        'def g():\n    """\n    >>> import pbg_absent_dep\n    """\n')
    (pkg / "needs_pkg" / "inner").mkdir(parents=True)       # a package skipped whole
    (pkg / "needs_pkg" / "__init__.py").write_text("import pbg_absent_dep\n")
    (pkg / "needs_pkg" / "inner" / "__init__.py").write_text('"""\n>>> 0\n0\n"""\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        _check_made_up_package(pkg)
    finally:            # its modules go with the test: a rerun imports the files it writes
        for name in [m for m in sys.modules if m.partition(".")[0] == "pbg_fake"]:
            del sys.modules[name]


def _check_made_up_package(pkg):
    package = importlib.import_module("pbg_fake")
    found, skipped = discover(package, optional=("pbg_absent_dep",))
    assert sorted(found) == ["pbg_fake.ex", "pbg_fake.mixed", "pbg_fake.sub"]
    assert [t.name for t in found["pbg_fake.mixed"]] == ["pbg_fake.mixed.f"]
    assert skipped == {
        "pbg_fake.mixed.g": "pbg_fake.mixed.g's examples need pbg_absent_dep, which is not installed",
        "pbg_fake.needs_at_import": "pbg_fake.needs_at_import needs pbg_absent_dep, which is not installed",
        "pbg_fake.needs_in_examples": "pbg_fake.needs_in_examples's examples need pbg_absent_dep, "
                                      "which is not installed",
        "pbg_fake.needs_pkg": "pbg_fake.needs_pkg needs pbg_absent_dep, which is not installed"}
    assert _sources_with_examples(pkg, "pbg_fake") == {"pbg_fake.sub", "pbg_fake.ex", "pbg_fake.mixed",
                                                       "pbg_fake.needs_in_examples",
                                                       "pbg_fake.needs_pkg.inner"}
    assert _uncovered(_sources_with_examples(pkg, "pbg_fake"), found, skipped) == set()
    assert _uncovered({"pbg_fake.new"}, found, skipped) == {"pbg_fake.new"}
    (pkg / "broken.py").write_text("import pbg_not_optional_either\n")
    importlib.invalidate_caches()      # the finders list a folder once: show them the new file
    with pytest.raises(ModuleNotFoundError, match="pbg_not_optional_either"):
        discover(package, optional=("pbg_absent_dep",))
