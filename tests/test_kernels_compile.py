"""CPU-only NVRTC tests of the kernel headers (no GPU, no CUDA context).

* every header compiles on its own (a TU that includes just it);
* the tensor-core headers refuse a too-old arch loudly;
* the SHIPPED instantiations (kind x accumulate x config x transpose pair x operand path)
  compile for sm_80 with no register spill and no local memory: by default a cover (every
  config's template instance, every tile shape in every layout and operand path: about half),
  all of them with PYBLASGEMM_COMPILE_ALL=1 (the GPU machine's run sets it); sm_90 compiles a
  representative subset (one config per tile shape, one layout and operand path each, all
  decompositions and all eight layout/path pairs across the set), all of it with
  PYBLASGEMM_COMPILE_ALL=1.
  Each distinct compile happens once, on every core, beside the other tests (compile_pool.py).

The instantiation tests' ids start with the NVRTC they ran under (``nvrtc13.5-sm_80-...``);
``PYBLASGEMM_TEST_NVRTC`` runs them under another one (nvrtc_under_test.py).
"""
from __future__ import annotations

import os
import sys
from typing import NamedTuple

import numpy as np
import pytest

import compile_pool
import nvrtc_under_test

nvrtc_under_test.choose()   # PYBLASGEMM_TEST_NVRTC: before anything loads an NVRTC
pytest.importorskip("cupy")
from cupy.cuda import nvrtc  # noqa: E402

from pyblasgemm.kernels import jit  # noqa: E402
from pyblasgemm.kernels.config import FP8_KINDS, SHIPPED_CONFIGS, KernelConfig  # noqa: E402
from pyblasgemm.kernels.launch import launch_geometry  # noqa: E402
from pyblasgemm.kernels.problem import ACCUMULATE, KernelProblem  # noqa: E402

ALL = os.environ.get("PYBLASGEMM_COMPILE_ALL", "") not in ("", "0")
#: the NVRTC of this run, as the test ids show it (``nvrtc13.5``)
NVRTC = nvrtc_under_test.label()
LAYOUTS = ("NN", "NT", "TN", "TT")


class Spec(NamedTuple):
    """One shipped instantiation compiled for one arch."""

    arch: str
    kind: str
    acc: str
    cfg: KernelConfig
    lay: str
    vec: bool
    epi: int = 0        # a fused epilogue (jit.epilogue_code), 0: the plain kernel

    @property
    def names(self) -> list[str]:
        """Its NVRTC name expressions: configs that differ only in a decomposition the template
        does not see (stream-k and hybrid) have the same ones, and share one compile."""
        return jit._names(self.cfg, self.kind, self.lay[0], self.lay[1], accumulate=self.acc, vec=self.vec,
                          epi=self.epi)


def _compile(arch: str, cfg: KernelConfig, names: list[str]) -> dict:
    """{name expression: its ptxas resources} from one NVRTC program holding every name (the
    layouts and operand paths of one config share the parse: ~10 % less CPU than one program
    each); ``{"error": ...}`` when it does not compile."""
    try:
        binary, log, lowered = jit._nvrtc(names, cfg, arch)
    except jit.KernelCompileError as e:
        return {"error": f"{e}\n{e.log}"}
    res = jit.ptxas_resources(log)
    return {n: res.get(lowered[n]) for n in names} | {"log": log, "binary": bool(binary)}


#: (arch, name expression) -> the compile_pool key of the group that compiles it
_GROUP_OF: dict = {}


def compile_jobs(items) -> dict:
    """{group: job}: one NVRTC program per (arch, kind, accumulator, config) with the distinct
    names of its selected instantiation tests (see compile_pool.py)."""
    groups: dict = {}
    for item in items:
        if getattr(item, "module", None) is sys.modules[__name__] and \
                item.originalname == "test_shipped_instantiation_compiles_without_spills":
            spec = item.callspec.params["spec"]
            key = ("mma.sync", spec.arch, spec.kind, spec.acc, spec.cfg)
            for name in spec.names:
                if (spec.arch, name) not in _GROUP_OF:
                    _GROUP_OF[(spec.arch, name)] = key
                    groups.setdefault(key, (spec.cfg, []))[1].append(name)
    return {key: (lambda arch=key[1], cfg=cfg, names=names: _compile(arch, cfg, names))
            for key, (cfg, names) in groups.items()}


def _sm90_subset(kind: str, ki: int, cfgs) -> dict:
    """{config index: (layout index, vec)} of the sm_90 representative subset: per tile shape
    one config, its decomposition rotating with the kind, and one (layout, operand path),
    rotating so that all eight appear across the set (the sm_80 set compiles every one)."""
    by_tile: dict = {}
    for ci, cfg in enumerate(cfgs):
        by_tile.setdefault((cfg.bm, cfg.bn, cfg.bk, cfg.warps_m, cfg.warps_n, cfg.stages), []).append(ci)
    pick = {}
    for ti, members in enumerate(by_tile.values()):
        r = ki + ti
        pick[members[r % len(members)]] = (r % 4, r // 4 % 2 == 0)
    return pick


def _features(spec: Spec) -> set:
    """What compiling one sm_80 instantiation checks: its config's template instance (the
    decomposition's code on that tile), and its tile shape in its layout and operand path (the
    ldmatrix/.trans fragments and the scalar path's staging registers)."""
    c = spec.cfg
    instance = tuple(jit._names(c, spec.kind, "N", "N", accumulate=spec.acc, vec=True))
    return {(spec.kind, spec.acc, "instance", instance),
            (spec.kind, spec.acc, "tile-layout-path", c.bm, c.bn, c.bk, c.warps_m, c.warps_n, c.stages,
             spec.lay, spec.vec)}


def _all_specs(arch: str) -> list:
    return [Spec(arch, kind, acc, cfg, lay, vec) for kind, cfgs in SHIPPED_CONFIGS.items()
            for acc in ACCUMULATE[kind] for cfg in cfgs for lay in LAYOUTS for vec in (True, False)]


def _selected(arch: str) -> list:
    """sm_80: every instantiation with PYBLASGEMM_COMPILE_ALL=1, else the cover (every config's
    instance, every tile shape in every layout and path: half the ~420); sm_90: the subset of
    :func:`_sm90_subset` (all of them with PYBLASGEMM_COMPILE_ALL=1)."""
    specs = _all_specs(arch)
    if ALL:
        return specs
    if arch == "sm_80":
        return sorted(compile_pool.greedy_cover(specs, _features), key=specs.index)
    out = []
    for ki, (kind, cfgs) in enumerate(SHIPPED_CONFIGS.items()):
        subset = _sm90_subset(kind, ki, cfgs)
        out += [s for s in specs if s.kind == kind and
                subset.get(cfgs.index(s.cfg)) == (LAYOUTS.index(s.lay), s.vec)]
    return out


def _fused_specs() -> list:
    """The fused-epilogue variants of the mma.sync kernel (sm_80), always compiled: every
    shipped config of every fused kind once (activation and layout rotating, so every
    activation and layout appears), every s8 config dequantizing (output type rotating), and
    the grouped launch's configs (both tiles) plain and fused (~46 compiles, ~40 CPU-s)."""
    from pyblasgemm.kernels.grouped import GROUPED_CONFIGS, GROUPED_SMALL_CONFIGS
    from pyblasgemm.kernels.launch import FUSED_KINDS

    out, i = [], 0
    for kind in FUSED_KINDS:
        for cfg in SHIPPED_CONFIGS[kind]:
            out.append(Spec("sm_80", kind, ACCUMULATE[kind][0], cfg, LAYOUTS[i % 4], i % 3 != 2,
                            jit.epilogue_code(i % 5)))
            i += 1
    for j, cfg in enumerate(SHIPPED_CONFIGS["s8"]):
        out.append(Spec("sm_80", "s8", "s32", cfg, LAYOUTS[j % 4], True,
                        jit.epilogue_code(j % 5, tuple(jit.DEQUANT_OUT)[j % 3])))
    for kind, cfg in list(GROUPED_CONFIGS.items()) + list(GROUPED_SMALL_CONFIGS.items()):
        if kind in FP8_KINDS:
            continue                # sm_89+: _fp8_grouped_specs
        fused = jit.epilogue_code(2, "float16") if kind == "s8" else jit.epilogue_code(2)
        out += [Spec("sm_80", kind, ACCUMULATE[kind][0], cfg, "NN", vec, epi)
                for vec, epi in ((True, 0), (True, fused), (False, fused))]
    return out


def _fp8_grouped_specs() -> list:
    """The grouped launch's float8 kinds (sm_89+), always dequantizing: one of each operand
    order, the float32 store and a fused float16 one, vector and scalar paths."""
    from pyblasgemm.kernels.grouped import GROUPED_CONFIGS

    return [Spec("sm_90", kind, ACCUMULATE[kind][0], GROUPED_CONFIGS[kind], "NN", vec, epi)
            for kind in ("e4m3", "e5m2_e4m3")
            for vec, epi in ((True, jit.epilogue_code(0, "float32")), (False, jit.epilogue_code(2, "float16")))]


def _specs(arch):
    specs = _selected(arch) + (_fused_specs() if arch == "sm_80" else []) + (
        _fp8_grouped_specs() if arch == "sm_90" else [])
    return [pytest.param(s, id=f"{NVRTC}-{arch}-{s.kind}-{s.acc}-{s.cfg.name}-{s.lay}-"
                         f"{'vec' if s.vec else 'scalar'}" + (f"-epi{s.epi}" if s.epi else ""))
            for s in specs]


def test_fused_specs_cover_kinds_activations_layouts_and_decompositions():
    from pyblasgemm.kernels.launch import FUSED_KINDS

    specs = _fused_specs()
    assert {(s.kind, s.cfg) for s in specs if s.cfg.decomposition != "grouped"} == {
        (k, c) for k in FUSED_KINDS + ("s8",) for c in SHIPPED_CONFIGS[k]}
    assert {s.epi & 7 for s in specs} == set(range(5)) and {s.lay for s in specs} == set(LAYOUTS)
    assert {s.epi >> jit.EPI_OUT_SHIFT for s in specs if s.epi & jit.EPI_DEQUANT} == {0, 1, 2}
    assert {s.kind for s in specs if s.cfg.decomposition == "grouped"} == {"f16", "bf16", "s8"}


def test_sm80_cover_compiles_every_instance_and_tile_layout_path():
    every, chosen = _all_specs("sm_80"), _selected("sm_80")
    covered = set().union(*(_features(s) for s in chosen))
    assert all(_features(s) <= covered for s in every)
    if not ALL:
        assert len(chosen) < 0.6 * len(every), (len(chosen), len(every))


@pytest.mark.parametrize("spec", _specs("sm_80") + _specs("sm_90"))
def test_shipped_instantiation_compiles_without_spills(spec):
    ok, why = spec.cfg.validate(kind=spec.kind)
    assert ok, why
    for name in spec.names:
        key = _GROUP_OF.get((spec.arch, name))
        out = compile_pool.result(key, lambda: _compile(spec.arch, spec.cfg, spec.names)) if key \
            else _compile(spec.arch, spec.cfg, spec.names)   # nothing queued (pytest-xdist)
        assert "error" not in out, out.get("error")
        r, log = out[name], out["log"]
        assert out["binary"] and r, f"no cubin or no ptxas report for {name}:\n{log}"
        assert r.get("spill_stores", 0) == 0 and r.get("spill_loads", 0) == 0, f"spill in {name}:\n{log}"
        assert r.get("stack", 0) == 0, f"local memory (stack frame) in {name}:\n{log}"
        assert r.get("registers", 0) <= 255


# the sm_90a headers refuse sm_80 on purpose; tests/test_sm90_compile.py compiles them for sm_90a
HEADERS = [str(p.relative_to(jit.INCLUDE_DIR)) for p in jit.all_headers() if "sm90" not in p.name]


@pytest.mark.parametrize("header", HEADERS)
def test_each_header_compiles_alone(header):
    # the Ozaki passes are compiled per moduli count, after that count's generated tables
    prelude = ""
    if header == "pyblasgemm/ozaki/ozaki.cuh":
        from pyblasgemm.kernels.ozaki_kernels import tables_source
        prelude = tables_source(3)
    src = prelude + f'#include "{header}"\n__global__ void pbg_header_probe() {{}}\n'
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


# --- host mirrors of device index arithmetic (no GPU) ---------------------------------------

def _swz_chunk(cpr, row, chunk):
    """Mirror of copy/smem_swizzle.cuh swz_chunk (byte offset)."""
    if cpr >= 8:
        return row * cpr * 16 + (((chunk & ~7) | ((chunk ^ row) & 7)) << 4)
    lin = row * cpr + chunk
    line = lin >> 3
    return (line << 7) + (((lin ^ line) & 7) << 4)


def _legal_shapes():
    for eb in (1, 2):
        for bkb in (64, 128):
            for mn in (64, 128, 256):
                for warps in (1, 2, 4, 8):
                    wt = mn // warps
                    if mn % warps or wt < 16 or wt > 64:
                        continue
                    for kcontig in (True, False):
                        if eb == 1 and not kcontig:
                            continue
                        cpr = bkb // 16 if kcontig else mn * eb // 16
                        if cpr in (2, 4, 8, 16, 32):
                            yield bkb, mn, warps, wt, kcontig, cpr


def test_ldmatrix_address_identity():
    """WarpMma::load_frag derives every ldmatrix address from the lane's atom-0/k-step-0 offset:
    K-contiguous (off0 ^ (ks << 5)) + idx*16*row_bytes; M/N-contiguous (off0 ^ (idx << 5)) +
    ks*16*row_bytes. Check it against swz_chunk for every legal shape, warp and lane."""
    n = 0
    for bkb, mn, warps, wt, kcontig, cpr in _legal_shapes():
        rowb, ksteps = cpr * 16, bkb // 32
        for w in range(warps):
            w0 = w * wt
            for lane in range(32):
                j, r = lane >> 3, lane & 7
                for op in ("A", "B"):
                    nidx = wt // 16 if op == "A" else max(1, wt // 16)

                    def real(idx, ks):
                        b = w0 + 16 * idx
                        if op == "A":
                            if kcontig:
                                return _swz_chunk(cpr, b + (lane & 15), 2 * ks + (lane >> 4))
                            return _swz_chunk(cpr, 16 * ks + r + 8 * (j >> 1), b // 8 + (j & 1))
                        if kcontig:
                            return _swz_chunk(cpr, b + r + 8 * (j >> 1), 2 * ks + (j & 1))
                        return _swz_chunk(cpr, 16 * ks + r + 8 * (j & 1), b // 8 + (j >> 1))

                    off0 = real(0, 0)
                    for idx in range(nidx):
                        for ks in range(ksteps):
                            want = ((off0 ^ (ks << 5)) + idx * 16 * rowb) if kcontig else \
                                ((off0 ^ (idx << 5)) + ks * 16 * rowb)
                            assert want == real(idx, ks), (bkb, mn, warps, kcontig, op, lane, idx, ks)
                            n += 1
    assert n > 10000


@pytest.mark.parametrize("bkb", [64, 128])
@pytest.mark.parametrize("both_k", [True, False])
def test_tf32_k_mapping_bijective_and_conflict_free(bkb, both_k):
    """WarpMma::tf32_k: each BK tile's columns are read exactly once over (k-step, t, h); with
    both operands K-contiguous every 16-lane phase of a 64-bit fragment load hits 8 distinct
    16-byte bank groups."""
    ksteps, ke = bkb // 32, 8

    def k_of(ks, t, h):
        if both_k:
            return 4 * (ks + ksteps * (t >> 1)) + 2 * (t & 1) + h
        return ke * ks + 2 * t + h

    cols = sorted(k_of(ks, t, h) for ks in range(ksteps) for t in range(4) for h in range(2))
    assert cols == list(range(bkb // 4))
    if both_k:
        cpr = bkb // 16
        for ks in range(ksteps):
            for base in (0, 8, 16, 48):  # rows g (+8, +16i): phases of lanes 0-15 and 16-31
                for half in (0, 1):
                    slots = set()
                    for lane in range(16 * half, 16 * half + 16):
                        g, t = lane >> 2, lane & 3
                        byte = _swz_chunk(cpr, base + g, k_of(ks, t, 0) // 4) + (k_of(ks, t, 0) % 4) * 4
                        slots.add((byte % 128) // 16)
                    assert len(slots) == 8, (bkb, ks, base, half, slots)


def _kernel_params(src: str, name: str):
    import re

    m = re.search(name + r"\(([^)]*)\)", src, re.S)
    assert m, name
    out = []
    for decl in m.group(1).split(","):
        decl = " ".join(decl.split())
        typ = decl.rsplit(" ", 1)[0]
        out.append("u64" if "*" in typ else {"int": "i32", "long long": "i64", "float": "f32"}[typ.replace("const ", "")])
    return out


def test_bound_launch_argument_blocks_match_kernel_signatures():
    """mma_sync.BoundLaunch packs arguments by hand for cuLaunchKernel: their order and widths
    must match gemm_kernel's and splitk_reduce_kernel's parameter lists exactly."""
    import ctypes as ct

    from pyblasgemm.kernels import mma_sync as launch

    width = {ct.c_uint64: "u64", ct.c_int32: "i32", ct.c_int64: "i64", ct.c_float: "f32"}
    gemm_src = (jit.INCLUDE_DIR / "pyblasgemm/impls/sm80_gemm.cuh").read_text()
    red_src = (jit.INCLUDE_DIR / "pyblasgemm/epilogue/splitk_reduce.cuh").read_text()
    assert [width[t] for _, t in launch._arg_ctypes()] == _kernel_params(gemm_src, r"gemm_kernel")
    assert [width[t] for _, t in launch._red_ctypes()] == _kernel_params(red_src, r"splitk_reduce_kernel")


def test_grouped_problem_row_matches_the_header_struct():
    """kernels/grouped.py packs params.cuh's GroupedProblem by hand: same fields, same order,
    naturally aligned offsets, 128 bytes (the header static_asserts its size)."""
    import re

    from pyblasgemm.kernels.grouped import PROBLEM_ROW

    src = (jit.INCLUDE_DIR / "pyblasgemm/params.cuh").read_text()
    body = re.search(r"struct alignas\(16\) GroupedProblem \{(.*?)\};", src, re.S).group(1)
    fields, offset = [], 0
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        typ, names = re.match(r"((?:const )?\w+\*?)\s+(.*)", decl).groups()
        size = 8 if typ.endswith("*") or typ == "i64" else 4
        for name in (x.strip().lstrip("*") for x in names.split(",")):
            fields.append((name, offset))
            offset += size
    assert offset == 128 == PROBLEM_ROW.itemsize
    assert fields == [(n, PROBLEM_ROW.fields[n][1]) for n in PROBLEM_ROW.names]
    row = np.zeros(2, PROBLEM_ROW)
    assert row.copy().tobytes() == row.tobytes()          # no byte outside a field


def test_one_compile_for_every_family_names_what_failed_with_nvrtcs_log():
    """jit.compile_program (the GEMM kernels', the GEMV's, the Ozaki passes' and the on-chip
    MLP's compile): the binary, the log with ptxas's report and the lowered names; a source
    that does not compile raises KernelCompileError naming ``what`` and carrying NVRTC's log."""
    from pyblasgemm.kernels import jit

    src = 'template <int N> __global__ void k(float* x) { x[0] = N; }\n'
    cubin, log, lowered = jit.compile_program(src, "k.cu", ["k<3>"], "sm_80")
    assert cubin[:4] == b"\x7fELF" and "registers" in log and lowered["k<3>"].startswith("_Z")
    with pytest.raises(jit.KernelCompileError, match="NVRTC failed to compile the test kernel for sm_80") as info:
        jit.compile_program(src.replace("x[0]", "y[0]"), "k.cu", ["k<3>"], "sm_80", what="the test kernel")
    assert 'identifier "y" is undefined' in info.value.log


def test_a_compile_with_an_empty_log_leaves_pythons_bytes_alone():
    """NVRTC writes its log into the buffer it is given. An empty log is one byte (its NUL):
    the buffer used to be ``b" " * size``, which for size 1 is CPython's shared one-byte b" ",
    and the compile turned every b" " of the process into b"\\x00" (``import torch`` then
    failed, print wrote NULs). Each read must fill a buffer of its own."""
    from pyblasgemm.kernels import nvrtc as ours

    src = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }'
    prog = ours.createProgram(src, "k.cu")
    try:
        ours.compileProgram(prog, ["--gpu-architecture=sm_80"])     # no -v: nothing to log
        assert ours.getProgramLog(prog) == ""
        cubin = ours.getCUBIN(prog)
    finally:
        ours.destroyProgram(prog)
    assert cubin[:4] == b"\x7fELF"
    # the byte values themselves (a comparison with a b" " literal compares the object with
    # itself: the shared one, corrupted or not)
    assert bytes([32])[0] == 32 and " ".encode()[0] == 32 and list(b" ") == [32]
    # the same through the one compile every kernel family shares, without the resource report
    binary, log, _ = jit.compile_program(src, "k.cu", ["k"], "sm_80", verbose=False)
    assert log == "" and bytes([32])[0] == 32


def test_the_fp8_block_scale_relayout_compiles_without_spills():
    """backends.cublaslt.LtBlockScaled's relayout kernel (kernels.fp8.BLOCK_SCALES_SOURCE:
    cuBLASLt's block-scale layouts, the capturable block-scaled route) compiles for sm_90 with
    NVRTC and spills nothing."""
    from pyblasgemm.kernels import fp8 as gpu_fp8

    name = "pyblasgemm_fp8_lt_block_scales"
    cubin, log, _ = jit.compile_program(gpu_fp8.BLOCK_SCALES_SOURCE, "relayout.cu", [name], "sm_90")
    assert cubin[:4] == b"\x7fELF" and "registers" in log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
