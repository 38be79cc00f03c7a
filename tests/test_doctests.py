"""The examples in the public docstrings run (on the host backend) and print what they say."""
import doctest
import importlib
import importlib.util

import pytest

MODULES = ["pyblasgemm.blas", "pyblasgemm.gemm", "pyblasgemm.matmul", "pyblasgemm._types",
           "pyblasgemm.planner.measured", "pyblasgemm.kernels.config", "pyblasgemm.settings",
           "pyblasgemm.desc", "pyblasgemm.plancache", "pyblasgemm.streams", "pyblasgemm.arrays",
           "pyblasgemm.constraints", "pyblasgemm.kinds", "pyblasgemm.kernels.spec",
           "pyblasgemm.planner.candidates", "pyblasgemm.kernels.pack", "pyblasgemm.scipy",
           "pyblasgemm.ozaki", "pyblasgemm.epilogue", "pyblasgemm.mlp", "pyblasgemm.grouped",
           "pyblasgemm.kernels.jit", "pyblasgemm.kernels.launch", "pyblasgemm.kernels.grouped",
           "pyblasgemm.kernels.mlp_kernel", "pyblasgemm.kernels.ozaki_kernels", "pyblasgemm.planner.composite",
           "pyblasgemm.composite", "pyblasgemm._files", "pyblasgemm.benchmarks.suite",
           "pyblasgemm.benchmarks.plot", "pyblasgemm.__main__",
           # PyTorch is optional (not in the `test` extra): its module's examples need it
           pytest.param("pyblasgemm.torch", marks=pytest.mark.skipif(
               importlib.util.find_spec("torch") is None, reason="needs PyTorch"))]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    # the BLAS functions are made by a factory: collect them explicitly
    extra = {f.__name__: f for f in vars(module).values()
             if callable(f) and getattr(f, "__module__", "") == "pyblasgemm" and f.__doc__}
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(module)
    for fname, f in extra.items():
        tests += finder.find(f, name=f"{name}.{fname}", module=False, globs={})
    ran = 0
    for test in tests:
        if test.examples:
            runner.run(test)
            ran += len(test.examples)
    assert ran > 0, f"{name} has no examples"
    assert runner.failures == 0, f"{runner.failures} doctest failures in {name}"
