"""CPU-only NVRTC checks of the float8 kinds (mma/sm80_kinds.cuh ``KindFp8F32``, the mma.sync
kernel's FP8_CONFIGS): every config in every operand layout for e4m3, every operand-type pair on
the workhorse tile, each with the dequantizing store the GPU route launches (per-tensor and
per-row / per-column scales, each output type, activations), and the block-scaled variants
(the mainloop's per-128-k promotion) on their tiles, for sm_89 and sm_90: no register spill,
no local memory; and sm_80 refuses the float8 atom at compile time."""
from __future__ import annotations

import pytest

import nvrtc_under_test

nvrtc_under_test.choose()
pytest.importorskip("cupy")

from pyblasgemm.kernels import jit  # noqa: E402
from pyblasgemm.kernels.config import DEQUANT_KINDS, FP8_CONFIGS, FP8_KINDS, fp8_config  # noqa: E402
from pyblasgemm.kinds import FP8_KINDS as PAIRS, KERNEL_KINDS  # noqa: E402

NVRTC = nvrtc_under_test.label()
OUTS = tuple(jit.DEQUANT_OUT)


def _specs():
    """(arch, config name, kind, layout, vec, epi): e4m3 on every config, layouts TN (the
    ldmatrix path) and NN / TT / NT (byte gathers), vectorized and scalar; the other pairs on the
    workhorse in TN and NN; EPI rotating over activations, output types and scale layouts; the
    block-scaled variants (the mainloop's promotion) on the tiles block scales take."""
    out, i = [], 0
    for arch in ("sm_89", "sm_90"):
        for name in FP8_CONFIGS:
            for lay, vec in (("TN", True), ("NN", True), ("TT", False), ("NT", True)):
                if not name.startswith("block"):
                    out.append((arch, name, "e4m3", lay, vec, _epi(i)))
                if name.startswith(("block", "small")):
                    out.append((arch, name, "e4m3", lay, vec, _block_epi(i)))
                i += 1
        for kind in FP8_KINDS[1:]:
            for lay in ("TN", "NN"):
                out.append((arch, "medium", kind, lay, True, _epi(i)))
                out.append((arch, "block", kind, lay, True, _block_epi(i)))
                i += 1
    return out


def _epi(i: int) -> int:
    return jit.epilogue_code(i % 6, OUTS[i % 3], scale_m_one=bool(i & 1), scale_n_one=bool(i & 2))


#: (C rows' mode, C columns' mode) of block-scaled products: a's 1 x 128 and b's 128 x 128 in
#: both orientations, and either beside a per-tensor or per-row / per-column scale
BLOCK_PAIRS = [(4, 3), (3, 4), (3, 1), (2, 4), (1, 3), (4, 2)]


def _block_epi(i: int) -> int:
    bm, bn = BLOCK_PAIRS[i % len(BLOCK_PAIRS)]
    return jit.epilogue_code(i % 6, OUTS[(i + 1) % 3], block_m=bm, block_n=bn)


_results: dict = {}


def _compile(arch: str, name: str):
    """{(kind, layout, vec, epi): ptxas resources} of one NVRTC program per (arch, config)."""
    key = (arch, name)
    if key not in _results:
        cfg = FP8_CONFIGS[name]
        specs = [s for s in _specs() if s[0] == arch and s[1] == name]
        names = {}
        for _, _, kind, lay, vec, epi in specs:
            for n in jit._names(cfg, kind, lay[0], lay[1], None, vec, epi):
                names[n] = (kind, lay, vec, epi)
        binary, log, lowered = jit._nvrtc(list(names), cfg, arch)
        res = jit.ptxas_resources(log)
        _results[key] = {names[n]: res.get(lowered[n]) for n in names}
    return _results[key]


@pytest.mark.parametrize("spec", _specs(), ids=[f"{NVRTC}-{a}-{k}-{n}-{lay}-{'vec' if v else 'scalar'}-epi{e}"
                                                for a, n, k, lay, v, e in _specs()])
def test_fp8_instantiations_compile_without_spills(spec):
    arch, name, kind, lay, vec, epi = spec
    r = _compile(arch, name)[(kind, lay, vec, epi)]
    assert r is not None, "no ptxas report"
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, r
    assert r["registers"] <= 255


def test_sm80_refuses_the_float8_atom():
    cfg = FP8_CONFIGS["medium"]
    with pytest.raises(jit.KernelCompileError, match="sm_89"):
        jit.compile_offline(cfg, "e4m3", "T", "N", arch="sm_80", epi=jit.epilogue_code(0, "float32"))


def test_the_kinds_rows_and_tables_agree():
    assert set(PAIRS.values()) == set(FP8_KINDS) and set(FP8_KINDS) <= set(DEQUANT_KINDS)
    for (ta, tb), kind in PAIRS.items():
        row = KERNEL_KINDS[kind]
        assert (row.ab_dtype, row.b_dtype or row.ab_dtype) == (ta, tb)
        assert row.elem_bytes == 1 and row.c_dtype == "float32" and row.sm90_struct.startswith("Sm90Kind")
    for cfg in FP8_CONFIGS.values():
        assert 128 % cfg.bk == 0, "a BK step never straddles a 128-wide scale block"
        assert cfg.validate(kind="e4m3")[0]
    # decode (the kernel's n is the token count) takes the small tile with split-k
    c = fp8_config(14336, 16, 4096, 132)
    assert (c.bm, c.bn) == (64, 64)
    assert fp8_config(4096, 4096, 4096, 132) == FP8_CONFIGS["medium"]
    assert fp8_config(4096, 4096, 4096, 132, block=True) == FP8_CONFIGS["block"]
    assert fp8_config(1024, 256, 8192, 132, block=True).decomposition == "splitk_serial"


def test_epilogue_code_scale_bits():
    assert jit.epilogue_code(1, "float16", scale_m_one=True) == jit.epilogue_code(1, "float16") | jit.EPI_SCALE_M_ONE
    with pytest.raises(ValueError, match="per-tensor and block scales"):
        jit.epilogue_code(0, None, scale_n_one=True)
    with pytest.raises(ValueError, match="block scale modes"):
        jit.epilogue_code(0, "float32", block_m=5, block_n=1)
    code = jit.epilogue_code(3, "float16", block_m=4, block_n=3)
    assert (code >> jit.EPI_BLOCK_SHIFT) & 7 == 4 and (code >> (jit.EPI_BLOCK_SHIFT + 3)) & 7 == 3
    with pytest.raises(ValueError, match="dequantization is fused for the s8, e4m3"):
        jit._names(FP8_CONFIGS["medium"], "f16", "N", "N", None, True, jit.epilogue_code(0, "float32"))
