"""CPU-only NVRTC checks of the one-launch expert kernel (impls/grouped_fused.cuh): it compiles
for sm_80 and sm_90 with every grouped tile, with and without a fused epilogue, for int32 and
int64 offsets, in the contiguous and the masked layout, with no spill; the 8-warp small tile stays within the 128 registers that two
CTAs per SM allow, and its shared arrays fit beside two rings on an SM; the host's argument
block and group cap match the header.
"""
from __future__ import annotations

import ctypes as ct
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("cupy")

from pyblasgemm.kernels import jit  # noqa: E402
from pyblasgemm.kernels.config import FP8_KINDS  # noqa: E402
from pyblasgemm.kernels.grouped import (FUSED_FIELDS, FUSED_MAX_GROUPS, GROUPED_CONFIGS,  # noqa: E402
                                        GROUPED_SMALL_CONFIGS, OFFSETS_FIELDS, _FUSED_SOURCE, fused_kernel_name)

HEADER = jit.INCLUDE_DIR / "pyblasgemm/impls/grouped_fused.cuh"
#: shared memory of one H100 SM (228 KB) less the 1 KB the driver keeps per CTA
SM_SMEM, PER_CTA_RESERVED = 228 * 1024, 1024


#: the float8 kinds compiled here: one of each operand order (the four share one template,
#: only the MMA's operand types differ), always with the dequantizing store
FP8_COMPILED = ("e4m3", "e5m2_e4m3")


def _tiles():
    return [(k, c) for k, c in GROUPED_CONFIGS.items() if k not in FP8_KINDS or k in FP8_COMPILED] + \
        list(GROUPED_SMALL_CONFIGS.items())


def _specs():
    out = []
    for kind, cfg in _tiles():
        fused = jit.epilogue_code(2, "float16") if kind == "s8" or kind in FP8_KINDS else jit.epilogue_code(2)
        plain = jit.epilogue_code(0, "float32") if kind in FP8_KINDS else 0
        # the masked layout with the other offsets' type and epilogue: all four pairs built
        for epi, off, masked in ((plain, 4, False), (fused, 8, False), (plain, 8, True), (fused, 4, True)):
            for arch in ("sm_90",) if kind in FP8_KINDS else ("sm_80", "sm_90"):
                out.append((arch, kind, cfg, epi, off, masked))
    return out


def _compile(spec):
    arch, kind, cfg, epi, off, masked = spec
    name = fused_kernel_name(cfg, kind, "N", "N", True, epi, off, masked)
    _, log, lowered = jit.compile_program(_FUSED_SOURCE, "grouped_fused.cu", [name], arch)
    return jit.ptxas_resources(log)[lowered[name]], log


@pytest.fixture(scope="module")
def compiled():
    specs = _specs()
    with ThreadPoolExecutor(4) as ex:
        return dict(zip(specs, ex.map(_compile, specs)))


def test_every_grouped_tile_compiles_without_spills(compiled):
    assert len(compiled) == 4 * 2 * (len(_tiles()) - len(FP8_COMPILED)) + 4 * len(FP8_COMPILED)
    for (arch, kind, cfg, epi, off, masked), (res, log) in compiled.items():
        where = f"{arch} {kind} {cfg.name} epi={epi} offsets={off} masked={masked}:\n{log}"
        assert res.get("spill_stores", 0) == 0 and res.get("spill_loads", 0) == 0, where
        assert res.get("stack", 0) == 0, where
        assert 0 < res["registers"] <= 255, where
        if cfg.warps_m * cfg.warps_n == 8 and cfg.bm * cfg.bn <= 128 * 64:
            assert res["registers"] <= 128, where     # two CTAs per SM: 65536 / (2 x 256 threads)


@pytest.mark.parametrize("masked", [False, True])
def test_the_small_tile_keeps_two_ctas_per_sm(masked):
    """The fused kernel's static arrays (the groups' ends and tile starts, the scan's scratch)
    plus the small tile's ring, twice, fit one SM's shared memory, in both layouts."""
    name = fused_kernel_name(GROUPED_SMALL_CONFIGS["bf16"], "bf16", "N", "N", True, 0, 4, masked)
    _, log, _ = jit.compile_program(_FUSED_SOURCE, "grouped_fused.cu", [name], "sm_90")
    static = int(re.search(r"(\d+) bytes smem", log).group(1))
    assert static >= 12 * FUSED_MAX_GROUPS
    ring = GROUPED_SMALL_CONFIGS["bf16"].smem_bytes("bf16")
    assert 2 * (ring + static + PER_CTA_RESERVED) <= SM_SMEM, (ring, static)


def test_argument_block_and_group_cap_match_the_header():
    src = HEADER.read_text()
    m = re.search(r"grouped_fused_kernel\(([^)]*)\)", src, re.S)
    names, widths = [], []
    for decl in m.group(1).split(","):
        decl = " ".join(decl.split())
        typ, name = decl.rsplit(" ", 1)
        names.append(name.lstrip("*"))
        widths.append(8 if "*" in typ + name or typ == "long long" else 4)
    size = {ct.c_void_p: 8, ct.c_longlong: 8, ct.c_int: 4, ct.c_float: 4}
    assert names == [n for n, _ in FUSED_FIELDS]
    assert widths == [size[t] for _, t in FUSED_FIELDS]
    # the table kernel's arguments, less the table and its count, then group_m
    assert FUSED_FIELDS[:-1] == [f for f in OFFSETS_FIELDS if f[0] not in ("table", "total")]
    assert int(re.search(r"kFusedMaxGroups = (\d+);", src).group(1)) == FUSED_MAX_GROUPS


@pytest.mark.parametrize("offsets_bytes", [4, 8])
def test_the_table_kernel_compiles_for_both_offset_types(offsets_bytes):
    """The two-launch form's table kernel (impls/grouped_offsets.cuh) for int32 and int64
    offsets: scan_groups is shared with the one-launch kernel and the Hopper walk, so a change
    to its template shows here without a GPU (a missed deduction once reached the device)."""
    from pyblasgemm.kernels.grouped import _OFFSETS_NAMES, _OFFSETS_SOURCE

    name = _OFFSETS_NAMES[offsets_bytes]
    _, log, lowered = jit.compile_program(_OFFSETS_SOURCE, "grouped_offsets.cu", [name], "sm_80")
    res = jit.ptxas_resources(log)
    assert lowered[name] in res and res[lowered[name]]["spill_stores"] == 0, log
