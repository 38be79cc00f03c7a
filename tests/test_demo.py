"""The demo teaches: the three forms with their code and a checked result, what ran and why,
and without a GPU the reason in one sentence."""
from pyblasgemm.__main__ import main

from conftest import gpu_available


def test_demo_shows_the_three_forms(capsys):
    assert main(["demo", "--size", "64"]) == 0
    out = capsys.readouterr().out
    for code in (">>> C = pyblasgemm.matmul(A, B)", ">>> C = pyblasgemm.gemm('N', 'T', A, B)",
                 ">>> pyblasgemm.hgemm('N', 'N', n, n, n, 1.0, A, n, B, n, 0.0, C, n)"):
        assert code in out
    errors = [float(ln.split(", error ")[1].split()[0].rstrip(";"))
              for ln in out.splitlines() if ", error " in ln]
    assert len(errors) == 3 and all(0 <= e < 1e-2 for e in errors)     # float16, k = 64
    if gpu_available():
        assert "ran tensorcore" in out or "ran cublas" in out
    else:
        (line,) = [ln for ln in out.splitlines() if ln.startswith("no GPU: ")]
        assert line.endswith("everything below runs on the host (NumPy arrays).")
        assert "ran on the host" in out
    assert "sgemm    fp32     host" in out or gpu_available()
