"""The package's import graph has no cycle, counting the imports inside functions too (an
import deferred into a function is still a dependency: it only hides the cycle from the
interpreter), and the hot path imports nothing per call.

The graph: every ``import pyblasgemm...`` / relative import of every module, at any depth,
except under ``if TYPE_CHECKING:`` (types only, never executed), and every module loaded by
name (a ``"pyblasgemm..."`` string literal naming a module: ``importlib.import_module``, a
table of modules to load): loading by name is an import all the same. The integrations above
the forms (PyTorch, JAX) are registered by the package's ``__init__`` (which imports every
layer), so no form names a module above it.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

import pyblasgemm

PACKAGE = pathlib.Path(pyblasgemm.__file__).parent


def _modules() -> dict:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def _type_checking_nodes(tree) -> set:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                for child in node.body:
                    skip.update(id(x) for x in ast.walk(child))
    return skip


def import_graph() -> tuple[dict, dict]:
    """(module -> the package modules it imports, module -> those imported inside functions)."""
    modules = _modules()
    edges: dict = {name: set() for name in modules}
    in_functions: dict = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        inside = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inside.update(id(x) for x in ast.walk(node))
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "pyblasgemm"]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").split(".")[0] == "pyblasgemm":
                    module = node.module
                else:
                    continue
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                           for a in node.names]
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules \
                    and node.value.startswith("pyblasgemm."):
                targets = [node.value]       # loaded by name
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target in modules and target != name:
                    edges[name].add(target)
                    if id(node) in inside:
                        in_functions[name].add(target)
    return edges, in_functions


def find_cycle(edges: dict) -> list | None:
    """One cycle of the graph as a list of modules (first == last), or None."""
    state: dict = {}
    stack: list = []

    def visit(v):
        state[v] = "open"
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == "open":
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[v] = "done"
        return None

    for v in sorted(edges):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_the_graph_is_read_whole():
    """The walk sees module-level and in-function imports (so a pass below means something)."""
    edges, in_functions = import_graph()
    assert sum(map(len, edges.values())) > 200 and sum(map(len, in_functions.values())) > 30
    assert "pyblasgemm.execute" in edges["pyblasgemm._strided"]              # module level
    assert "pyblasgemm.kernels.launch" in in_functions["pyblasgemm.constraints"]   # in a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_counting_imports_inside_functions():
    edges, _ = import_graph()
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


#: the functions every repeated call runs (the signature fast paths, the launch, the stream and
#: array-module lookups, the epilogue's and the group's routes): an import statement there costs
#: ~0.3-0.4 µs per call even when the module is loaded (the host budget is a few µs)
HOT_PATHS = {
    "blas.py": ["xgemm"], "gemm.py": ["gemm", "_with_epilogue"],
    "matmul.py": ["matmul", "_core", "_with_epilogue", "_epilogue_signature", "_signature", "_foreign_epilogue",
                  "_fp8_words"],
    "fp8.py": ["replay", "torch_fp8_dtypes", "_on_gpu"],
    "calls.py": ["key", "get", "overlaps"], "arrays.py": ["torch_replay"],
    "execute.py": ["execute", "launch_for", "execute_epilogue", "execute_group", "execute_mlp", "execute_fp8",
                   "_lt_block_scaled"],
    "_strided.py": ["strided_gemm", "_fast_desc", "epilogue_gemm", "dequant_gemm", "_int32_shadow"],
    "streams.py": ["handle", "on"], "_arrays.py": ["xp_of", "as_strided_bytes", "strided_view"],
    "epilogue_pass.py": ["apply", "run_unfused"], "grouped.py": ["grouped_matmul", "_replay"],
    "mlp.py": ["fused_mlp"], "stateful.py": ["_execute_native"],
    "kernels/epilogue_ops.py": ["apply_device"], "planner/core.py": ["plan_for"],
    "backends/tensorcore.py": ["run"],
}


@pytest.mark.parametrize("relpath", sorted(HOT_PATHS))
def test_no_import_inside_a_hot_path_function(relpath):
    tree = ast.parse((PACKAGE / relpath).read_text())
    found, seen = [], set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in HOT_PATHS[relpath]:
            seen.add(node.name)
            found += [f"{node.name}:{x.lineno}" for x in ast.walk(node)
                      if isinstance(x, (ast.Import, ast.ImportFrom))]
    assert seen == set(HOT_PATHS[relpath]), f"{relpath}: not found {set(HOT_PATHS[relpath]) - seen}"
    assert found == [], f"{relpath}: imports in hot-path functions at {found}"


#: the layers above the kernels (docs/design/flow.md: describe -> plan -> execute -> backends ->
#: kernels): a kernels module that imports one of them reaches back up the flow
ABOVE_THE_KERNELS = ("pyblasgemm.planner", "pyblasgemm.backends", "pyblasgemm.execute", "pyblasgemm.desc",
                     "pyblasgemm.constraints", "pyblasgemm.calls", "pyblasgemm.fp8", "pyblasgemm.matmul",
                     "pyblasgemm.gemm", "pyblasgemm.blas", "pyblasgemm.grouped", "pyblasgemm.mlp",
                     "pyblasgemm.stateful", "pyblasgemm.arrays", "pyblasgemm.torch", "pyblasgemm.jax")


def test_the_kernels_import_no_layer_above_them():
    """The kernels build and launch; they never plan, bind through a backend or read a
    description's module (the float8 route once planned inside kernels/fp8.py and bound
    cuBLASLt's launch there: kernels -> planner and kernels -> backends)."""
    edges, _ = import_graph()
    up = sorted(f"{mod} -> {target}" for mod, targets in edges.items() if mod.startswith("pyblasgemm.kernels")
                for target in targets if target.startswith(ABOVE_THE_KERNELS))
    assert up == [], up


def test_no_import_inside_a_function_rebinds_a_module_level_name():
    """``from .x import f`` inside a function makes ``f`` local to the whole function: a module-
    level ``f`` used on another branch of it then raises UnboundLocalError (a float8 branch's
    ``kernel_problem`` did this to every other product in backends/tensorcore.bind, found only
    on a GPU). So an import in a function never takes a name the module defines."""
    import ast

    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        top = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                top.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                top.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign):
                top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    offenders += [f"{path.relative_to(PACKAGE)}:{node.lineno} {fn.name}: {name}"
                                  for name in ((a.asname or a.name).split(".")[0] for a in node.names)
                                  if name in top]
    assert offenders == []


def test_the_package_attribute_of_a_submodule_is_that_submodule():
    """``from pyblasgemm import _arrays`` (and ``from . import _arrays`` in a module imported
    after the package) gives the ``_arrays`` submodule: the package's own names never take a
    submodule's (``from . import arrays as _arrays`` in __init__ once made a lazily imported
    module get the array door instead)."""
    import importlib

    # (public names may be a module's function on purpose: pyblasgemm.gemm, pyblasgemm.matmul;
    # a private one is only ever the module)
    for path in sorted(PACKAGE.glob("_*.py")):
        name = path.stem
        if name in ("__init__", "__main__"):
            continue
        module = importlib.import_module(f"pyblasgemm.{name}")
        assert getattr(pyblasgemm, name, module) is module, name
