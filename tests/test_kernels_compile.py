"""CPU-only NVRTC tests of the kernel headers (no GPU, no CUDA context).

* every header compiles on its own (a TU that includes just it);
* the tensor-core headers refuse a too-old arch loudly;
* every SHIPPED instantiation (kind x accumulate x config x transpose pair x operand path)
  compiles for sm_80 with no register spill and no local memory; sm_90 compiles a
  representative subset (one layout per instantiation), all of it with PYBLASGEMM_COMPILE_ALL=1.
"""
from __future__ import annotations

import itertools
import os

import pytest

pytest.importorskip("cupy")
from cupy.cuda import nvrtc  # noqa: E402

from pyblasgemm.kernels import jit  # noqa: E402
from pyblasgemm.kernels.config import SHIPPED_CONFIGS, KernelConfig  # noqa: E402
from pyblasgemm.kernels.launch import launch_geometry  # noqa: E402
from pyblasgemm.kernels.problem import ACCUMULATE, KernelProblem  # noqa: E402

ALL = os.environ.get("PYBLASGEMM_COMPILE_ALL", "") not in ("", "0")
LAYOUTS = ("NN", "NT", "TN", "TT")


def _specs(arch):
    out = []
    for kind, cfgs in SHIPPED_CONFIGS.items():
        for acc in ACCUMULATE[kind]:
            for ci, cfg in enumerate(cfgs):
                for li, lay in enumerate(LAYOUTS):
                    for vec in (True, False):
                        # sm_90 subset: rotate the layout with the config so every layout and
                        # both operand paths are still covered across the set.
                        if arch == "sm_90" and not ALL and (li != (ci + vec) % 4):
                            continue
                        out.append(pytest.param(cfg, kind, acc, lay, vec, arch,
                                                id=f"{arch}-{kind}-{acc}-{cfg.name}-{lay}-{'vec' if vec else 'scalar'}"))
    return out


@pytest.mark.parametrize("cfg,kind,acc,lay,vec,arch", _specs("sm_80") + _specs("sm_90"))
def test_shipped_instantiation_compiles_without_spills(cfg, kind, acc, lay, vec, arch):
    ok, why = cfg.validate(kind=kind)
    assert ok, why
    binary, log = jit.compile_offline(cfg, kind, lay[0], lay[1], arch, accumulate=acc, vec=vec)
    assert binary, log
    res = jit.ptxas_resources(log)
    assert res, f"no ptxas report in log:\n{log}"
    for name, r in res.items():
        assert r.get("spill_stores", 0) == 0 and r.get("spill_loads", 0) == 0, f"spill in {name}:\n{log}"
        assert r.get("stack", 0) == 0, f"local memory (stack frame) in {name}:\n{log}"
        assert r.get("registers", 0) <= 255


HEADERS = [str(p.relative_to(jit.INCLUDE_DIR)) for p in jit.all_headers()]


@pytest.mark.parametrize("header", HEADERS)
def test_each_header_compiles_alone(header):
    src = f'#include "{header}"\n__global__ void pbg_header_probe() {{}}\n'
    prog = nvrtc.createProgram(src, "probe.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, ["--gpu-architecture=sm_80", "-std=c++17", "-I" + str(jit.INCLUDE_DIR)])
        except Exception as e:
            pytest.fail(f"{header} does not compile alone: {e}\n{nvrtc.getProgramLog(prog)}")
    finally:
        nvrtc.destroyProgram(prog)


@pytest.mark.parametrize("header", ["pyblasgemm/ptx/sm80_mma.cuh", "pyblasgemm/impls/sm80_gemm.cuh"])
def test_wrong_arch_fails_loudly(header):
    prog = nvrtc.createProgram(f'#include "{header}"\n', "probe.cu", [], [])
    try:
        with pytest.raises(Exception):
            nvrtc.compileProgram(prog, ["--gpu-architecture=sm_75", "-std=c++17", "-I" + str(jit.INCLUDE_DIR)])
        assert "compute capability 8.0" in nvrtc.getProgramLog(prog) or "sm_80" in nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def test_compile_error_carries_log():
    bad = KernelConfig(bm=64, bn=64, bk=32, warps_m=2, warps_n=2, stages=4)
    # kind/accumulate pair with no kernel is a ValueError before NVRTC
    with pytest.raises(ValueError):
        jit.kernel_name(bad, "s8", "N", "N", accumulate="f32")
    err = jit.KernelCompileError("boom", "line 1: error", "inst")
    assert isinstance(err, RuntimeError) and err.log == "line 1: error" and "line 1" in str(err)


def test_fingerprint_covers_headers_and_is_in_source(tmp_path):
    fp = jit.header_fingerprint()
    assert len(fp) == 64 and fp in jit._source()
    assert len(jit.all_headers()) >= 10


def test_ptxas_resource_parser():
    log = ("ptxas info    : Function properties for _Zfoo\n"
           "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 128 registers, used 1 barriers, 8 bytes cumulative stack size\n")
    assert jit.ptxas_resources(log) == {"_Zfoo": {"stack": 8, "spill_stores": 4, "spill_loads": 8, "registers": 128}}


def _p(m, n, k, kind="f16", batch=1):
    return KernelProblem(kind, "N", "N", m, n, k, m, k, m, 0, 0, 0, batch=batch)


def test_validate_reasons():
    p = _p(100, 100, 100)
    assert KernelConfig().validate(p) == (True, "")
    for bad, word in [(KernelConfig(bm=96), "bm"), (KernelConfig(stages=2), "stages"),
                      (KernelConfig(bk=48), "bk"), (KernelConfig(decomposition="x"), "decomposition"),
                      (KernelConfig(decomposition="splitk_serial", splits=1), "splits")]:
        ok, why = bad.validate(p)
        assert not ok and word in why, (bad, why)
    assert not KernelConfig(bk=64, stages=5, bm=256, bn=256, warps_m=4, warps_n=2).validate(p)[0]


@pytest.mark.parametrize("m,n,k,sms,occ", [(3072, 3072, 3072, 132, 2), (100, 100, 5000, 7, 1), (1, 1, 1, 132, 2),
                                           (1000, 1000, 1000, 3, 2), (129, 7, 31, 5, 3)])
def test_streamk_geometry_invariants(m, n, k, sms, occ):
    for d in ("streamk", "hybrid"):
        cfg = KernelConfig(decomposition=d)
        g = launch_geometry(_p(m, n, k), cfg, sms, occ)
        ctas = g["grid"][0]
        assert g["dp_tiles"] + g["sk_tiles"] == g["tiles"]
        assert g["dp_tiles"] % ctas == 0
        total = g["sk_tiles"] * g["kt"]
        assert total == 0 or ctas <= total  # every stream-k CTA gets >= 1 MAC iteration
        assert ctas <= sms * occ
        # mirror of the device's sk_cta_of: largest c with begin(c) <= it
        for it in range(0, total, max(1, total // 50)):
            c = ((it + 1) * ctas + total - 1) // total - 1
            assert c * total // ctas <= it < (c + 1) * total // ctas


def test_splitk_geometry_has_no_empty_split():
    for k in (32, 33, 1000, 32768):
        for s in (2, 3, 7, 64):
            g = launch_geometry(_p(512, 512, k), KernelConfig(decomposition="splitk_parallel", splits=s), 132)
            assert (g["splits"] - 1) * g["kt_per_split"] < g["kt"] <= g["splits"] * g["kt_per_split"]


def test_import_creates_no_cuda_context():
    import subprocess
    import sys

    code = ("import pyblasgemm.kernels, pyblasgemm.kernels.launch, pyblasgemm.kernels.jit;"
            "import sys; print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("True", "False")
