"""CPU checks of the on-chip MLP kernel (impls/sm80_fused_mlp.cuh, kernels/mlp_kernel.py): no GPU.

* the instantiations the library launches compile with no spill and no local memory: every
  activation for float16 on sm_80, two for bfloat16 on sm_90a (7 NVRTC compiles of ~0.5 s, run
  beside the other tests through compile_pool.py);
* the host's mirror of the kernel's constants agrees with the header (grepped);
* fits() / choose_n2_splits() / mlp_plan() decide and explain at their bounds;
* fused_mlp's method= errors come before any work; importing pyblasgemm compiles nothing.
"""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import compile_pool
import pyblasgemm
from pyblasgemm import mlp
from pyblasgemm.kernels import jit
from pyblasgemm.kernels import mlp_kernel as mk

#: (dtype, activation code, arch): what the library launches, covered in 7 compiles
COMPILES = [("float16", code, "sm_80") for code in mk.ACTIVATION_CODES] + \
           [("bfloat16", 2, "sm_90a"), ("bfloat16", 4, "sm_90a")]


def _compile(dtype, code, arch):
    try:
        _, log = mk.compile_offline(dtype, code, arch)
    except jit.KernelCompileError as e:
        return {"error": f"{e}\n{e.log}"}
    res = jit.ptxas_resources(log)
    return {"resources": res, "log": log}


def compile_jobs(items) -> dict:
    """{key: job} of the compiles the selected tests need (conftest queues them at collection)."""
    wanted = {item.callspec.params["case"] for item in items
              if item.module.__name__ == __name__ and hasattr(item, "callspec") and "case" in item.callspec.params}
    return {("mlp",) + case: (lambda c=case: _compile(*c)) for case in COMPILES if case in wanted}


@pytest.mark.parametrize("case", COMPILES, ids=[f"{d}-act{c}-{a}" for d, c, a in COMPILES])
def test_instantiation_compiles_without_spills(case):
    pytest.importorskip("cupy")
    out = compile_pool.result(("mlp",) + case, lambda: _compile(*case))
    assert "error" not in out, out.get("error")
    res = out["resources"]
    assert len(res) == 1, out["log"]                  # one kernel: the instantiation named
    (r,) = res.values()
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (case, r)
    assert r["stack"] == 0, (case, r)                 # no local memory at all
    assert r["registers"] <= 255, (case, r)           # __launch_bounds__(256, 1)


HEADER_TEXT = (jit.INCLUDE_DIR / mk.HEADER).read_text()


def _constexpr(name: str) -> int:
    m = re.search(rf"constexpr int {name} = (\d+);", HEADER_TEXT)
    assert m, f"{name} not found as a literal constexpr in {mk.HEADER}"
    return int(m.group(1))


def test_host_constants_mirror_the_header():
    assert _constexpr("kMlpBM") == mk.BM == mlp.ROWS_PER_CTA
    assert _constexpr("kMlpChunk") == mk.CHUNK
    assert _constexpr("kMlpBK") == mk.BK
    assert _constexpr("kMlpStages") == mk.STAGES
    assert _constexpr("kMlpWarpsM") == mk.WARPS_M and _constexpr("kMlpWarpsN") == mk.WARPS_N
    assert _constexpr("kMlpPad") == mk.PAD
    assert "kMlpThreads = 32 * kMlpWarpsM * kMlpWarpsN" in HEADER_TEXT and mk.THREADS == 256
    # the ring as the header builds it, and the number its comment quotes
    ring = mk.STAGES * (mk.BM * (mk.BK + mk.PAD) * 2 + mk.BK * (mk.CHUNK + mk.PAD) * 2)
    assert mk.RING_BYTES == ring == 41472 and "kMlpSlotBytes;     // 41472" in HEADER_TEXT
    assert mlp.ON_CHIP_BYTES == mk.SMEM_OPTIN["sm_90"] - mk.RING_BYTES
    # h's width: N1 rounded up to the K step, as mlp_h_width does
    assert "(n1 + kMlpBK - 1) / kMlpBK * kMlpBK" in HEADER_TEXT
    assert [mk.h_width(n) for n in (8, 32, 33, 200, 1024)] == [32, 32, 64, 224, 1024]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_fits_at_the_shared_memory_bound(arch):
    optin = mk.SMEM_OPTIN[arch]
    widest = mk.max_hidden(optin)
    assert widest == {"sm_80": 960, "sm_90": 1472}[arch]
    ok, why = mk.fits(1, 8, widest, 8, "float16", optin)
    assert ok and f"{mk.smem_bytes(widest)} B of shared memory" in why and mk.smem_bytes(widest) <= optin
    ok, why = mk.fits(1, 8, widest + 8, 8, "bfloat16", optin)
    assert not ok and mk.smem_bytes(widest + 8) > optin
    assert f"= {mk.smem_bytes(widest + 8)} B, more than the device's {optin} B" in why
    assert f"N1 <= {widest} fits" in why and f"({widest + 32} + 8)" in why


def test_fits_names_the_failing_bound():
    big = mk.SMEM_OPTIN["sm_90"]
    assert mk.fits(1, 8, 8, 8, "float32", big) == (False, "the on-chip kernel takes float16 or bfloat16 operands, not float32")
    assert mk.fits(0, 8, 8, 8, "float16", big) == (False, "M = 0: nothing for the on-chip kernel to do")
    for k1, n1, n2, bad in ((12, 8, 8, "K1 = 12"), (8, 100, 8, "N1 = 100"), (8, 8, 7, "N2 = 7")):
        ok, why = mk.fits(5, k1, n1, n2, "bfloat16", big)
        assert not ok and why == f"{bad} is not a multiple of 8 (the kernel copies rows in 16-byte pieces)"
    assert mk.fits(1, 8, 8, 8, np.float16, big)[0]             # dtypes as types, names or dtypes
    assert mk.fits(10**6 + 1, 8, 8, 8, np.dtype("float16"), big)[0]   # M is arbitrary


def test_n2_splits_fill_the_sms_without_empty_ctas():
    for sms in (108, 132):
        for m in (1, 64, 65, 1000, 4096, 100000):
            for n2 in (8, 136, 1024, 4096, 8000):
                s = mk.choose_n2_splits(m, n2, sms)
                chunks, grid_m = -(-n2 // mk.CHUNK), -(-m // mk.BM)
                assert 1 <= s <= chunks
                per = -(-chunks // s)
                assert (s - 1) * per < chunks             # the kernel's last split has work
                if grid_m < sms and chunks > 1:           # small M: more CTAs, never many more than SMs
                    assert grid_m * s <= max(sms, grid_m) and (s == chunks or grid_m * s > sms // 2)
                if grid_m >= sms:
                    assert s == 1


def test_mlp_plan_decisions_and_explanations():
    p = pyblasgemm.mlp_plan(16, 1024, 1024, 1024)
    assert p.on_chip_fits and p.kernel == "two GEMMs with fused epilogues" and "not the default" in p.reason
    assert p.smem_bytes == 173568 and p.n2_splits == 8
    assert "grid 1 x 8" in p.explain() and "173568 B of shared memory" in p.explain()
    # the same layer on an A100 (163 KB per block): h does not fit
    a100 = pyblasgemm.mlp_plan(16, 1024, 1024, 1024, max_smem=mk.SMEM_OPTIN["sm_80"], sm_count=108)
    assert not a100.on_chip_fits and a100.kernel == "two GEMMs with fused epilogues"
    assert "64 x 1024 x 2 B = 128 KB" in a100.reason and "(hidden <= 960 fits)" in a100.reason
    big_m = pyblasgemm.mlp_plan(8192, 512, 512, 512)
    assert big_m.on_chip_fits and big_m.n2_splits == 1 and "all 512 columns of y" in big_m.reason
    f32 = pyblasgemm.mlp_plan(64, 64, 64, 64, "float32")
    assert not f32.on_chip_fits and "float16 or bfloat16" in f32.reason
    odd = pyblasgemm.mlp_plan(64, 64, 100, 64, "bfloat16")
    assert not odd.on_chip_fits and "N1 = 100 is not a multiple of 8" in odd.reason


def test_fused_mlp_method_errors_come_first():
    x, w1, w2 = np.ones((2, 8), np.float16), np.ones((8, 8), np.float16), np.ones((8, 8), np.float16)
    with pytest.raises(ValueError, match=r"fused_mlp: method='on_chip' cannot run: x, w1, w2 not CuPy arrays"):
        pyblasgemm.fused_mlp(x, w1, w2, method="on_chip")
    with pytest.raises(ValueError, match=r"fused_mlp: method='fast' is not one of None, 'on_chip', 'two_gemms'"):
        pyblasgemm.fused_mlp(x, w1, w2, method="fast")
    with pytest.raises(ValueError, match=r"activation='tanh' is not one of"):
        pyblasgemm.fused_mlp(x, w1, w2, activation="tanh", method="two_gemms")
    y = pyblasgemm.fused_mlp(x, w1, w2, activation="relu", method="two_gemms")   # the host path
    assert y.dtype == np.float16 and np.all(y == 64)


def test_import_compiles_nothing():
    code = ("import sys, pyblasgemm; from pyblasgemm.kernels import mlp_kernel; "
            "assert 'cupy' not in sys.modules, 'cupy imported'; assert not mlp_kernel._cache")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
