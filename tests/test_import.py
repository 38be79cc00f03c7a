"""``import pyblasgemm`` imports no CuPy and creates no CUDA context."""
import subprocess
import sys

import pytest


def test_import_does_not_import_cupy():
    code = ("import sys, pyblasgemm; "
            "assert 'cupy' not in sys.modules, 'cupy imported'; "
            "pyblasgemm.hgemm; pyblasgemm.matmul; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_host_use_creates_no_cuda_context():
    """NumPy calls never touch CUDA even when CuPy is installed and imported."""
    code = ("import numpy as np, pyblasgemm; "
            "a = np.ones((4, 4), np.float16); pyblasgemm.matmul(a, a); "
            "import sys; print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_import_creates_no_cuda_context_on_gpu_machine():
    code = ("import pyblasgemm, cupy\n"
            "from cupy.cuda import driver\n"
            "driver.cuInit(0) if hasattr(driver, 'cuInit') else None\n"
            "ctx = driver.ctxGetCurrent()\n"
            "print(int(ctx))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0"
