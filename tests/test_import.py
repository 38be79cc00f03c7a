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
    # cuCtxGetCurrent answers CUDA_ERROR_NOT_INITIALIZED when nothing has even initialised the
    # driver, which is a stronger "no context" than a null context
    code = ("import pyblasgemm, cupy, numpy as np\n"
            "from cupy.cuda import driver\n"
            "a = np.ones((8, 8), np.float16); pyblasgemm.matmul(a, a)\n"
            "try:\n"
            "    print(int(driver.ctxGetCurrent()))\n"
            "except driver.CUDADriverError as e:\n"
            "    print(0 if 'NOT_INITIALIZED' in str(e) else e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0"
