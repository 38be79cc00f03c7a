"""CPU-only NVRTC tests of the Hopper kernel (impls/sm90_gemm.cuh, sm_90a; no GPU, no CUDA context).

* the SHIPPED sm_90a instantiations (each kind's ``SM90_CONFIGS`` x every layout the config
  accepts; configs that share a template instantiation, e.g. hybrid/streamk, compile once)
  compile with no error, no warning, no register spill, no stack frame and no local memory.
  By default a cover: every instantiation's config in at least one layout, and every (tile,
  cluster, consumer) of each kind in every layout it accepts -- about half of the ~350 (each
  takes ~1.2 s of CPU; the layout only changes wgmma's transpose immediates and the TMA box,
  not the register budget). ``PYBLASGEMM_COMPILE_ALL=1`` compiles every one (the GPU
  machine's run sets it);
* its SASS (``cuobjdump -sass``, from the ``nvidia-cuda-cuobjdump`` wheel of the ``test`` extra)
  holds the fast path: HGMMA/IGMMA of the tile's shape, TMA loads (UTMALDG) and the producer /
  consumer register reallocation (USETMAXREG). cuobjdump takes ~0.6 s a cubin, so CI
  disassembles a cover of the features the SASS shows (every tile, consumer, cluster, bk,
  decomposition and layout of each kind at least once); PYBLASGEMM_COMPILE_ALL=1 disassembles
  all of them;
* the generated ``ptx/sm90_wgmma.cuh`` is what ``tools/gen_sm90_wgmma.py`` renders;
* the sm90 headers compile alone for sm_90a and refuse any other target loudly.

Each instantiation compiles once per run, on every core, beside the other tests, and only those
whose tests were selected (compile_pool.py).

Every compile test's id starts with the NVRTC it ran under (``nvrtc13.5-f16-NN-...``): ptxas is
NVRTC's, and releases differ (:data:`NVRTC_13_0_SPILLS`). ``PYBLASGEMM_TEST_NVRTC`` runs the
module under another NVRTC, e.g. 13.0 as PyTorch pins it (nvrtc_under_test.py).
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import compile_pool
import nvrtc_under_test

nvrtc_under_test.choose()   # PYBLASGEMM_TEST_NVRTC: before anything loads an NVRTC

from pyblasgemm.kernels import jit  # noqa: E402
from pyblasgemm.kinds import KERNEL_KINDS  # noqa: E402
from pyblasgemm.kernels.config import (SHIPPED_CONFIGS, SM90_CONFIGS, SM90_GROUPED_CONFIGS, SM90_KINDS,  # noqa: E402
                                       SM90_MMA_SYNC_CONFIGS)
from pyblasgemm.kernels.problem import BASE_KIND, KernelProblem  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: PYBLASGEMM_COMPILE_ALL=1: compile and disassemble every instantiation (default: covers)
ALL = os.environ.get("PYBLASGEMM_COMPILE_ALL", "") not in ("", "0")
LAYOUTS = ("NN", "NT", "TN", "TT")
#: what the kernel supports (s8 wgmma has no transpose: both operands K-major = 'TN')
EXPECTED_LAYOUTS = {"f16": set(LAYOUTS), "bf16": set(LAYOUTS), "s8": {"TN"},
                    "f16_out32": set(LAYOUTS), "bf16_out32": set(LAYOUTS),
                    # fp32: the prep kernel hands over K-major operands in every layout
                    "tf32": set(LAYOUTS), "3xtf32": set(LAYOUTS),
                    # float8: wgmma has no transpose for 8-bit types
                    "e4m3": {"TN"}, "e4m3_e5m2": {"TN"}, "e5m2_e4m3": {"TN"}, "e5m2": {"TN"}}
SM90_HEADERS = ("pyblasgemm/impls/sm90_gemm.cuh", "pyblasgemm/ptx/sm90_tma.cuh", "pyblasgemm/ptx/sm90_wgmma.cuh",
                "pyblasgemm/impls/sm90_tf32_prep.cuh")
def max_regs(threads: int) -> int:
    """Registers per thread at launch: the block (producer + 1 or 2 consumer warpgroups) must fit
    the SM's 64K registers, in units of 8, at most 255."""
    return min(255, 65536 // threads // 8 * 8)


def _nvrtc():
    pytest.importorskip("cupy")
    from cupy.cuda import nvrtc

    return nvrtc


def _aligned_problem(kind: str, lay: str) -> KernelProblem:
    """A 16-byte aligned problem in layout ``lay``: asks validate() which layouts a config takes."""
    m, n, k = 320, 192, 256
    ta, tb = lay
    return KernelProblem(kind, ta, tb, m, n, k, m if ta == "N" else k, k if tb == "N" else n, m,
                         1 << 20, 2 << 20, 3 << 20)


def _layouts(cfg, kind) -> list[str]:
    return [lay for lay in LAYOUTS if cfg.validate(_aligned_problem(kind, lay))[0]]


def _specs():
    """One (kind, config, layout) per distinct instantiation (its NVRTC name expressions)."""
    seen, out = set(), []
    for kind in SM90_CONFIGS:
        for cfg in SM90_CONFIGS[kind] + SM90_MMA_SYNC_CONFIGS.get(kind, ()):
            for lay in _layouts(cfg, kind):
                names = tuple(jit._names(cfg, kind, lay[0], lay[1], None, True))
                if names in seen:
                    continue
                seen.add(names)
                out.append((kind, cfg, lay))
    return out


def _compile_features(spec) -> set:
    """What compiling one instantiation checks: its config's template instance (the register
    budget, which the layout does not change), and its layout on its tile shape."""
    kind, cfg, lay = spec
    instance = tuple(jit._names(cfg, kind, *_layouts(cfg, kind)[0], None, True))
    return {(kind, "instance", instance),
            (kind, "tile-layout", cfg.bm, cfg.bn, cfg.consumer, getattr(cfg, "cluster", 1), lay)}


def _sass_features(spec) -> set:
    """What the disassembly of one instantiation shows of its kind: the MMA instruction's shape
    (tile bm, consumer, the cluster's multicast loads, bk), the decomposition's kernels (the
    split-k reduction) and the layout's operand path."""
    kind, cfg, lay = spec
    return {(kind, "tile", cfg.bm, cfg.consumer, getattr(cfg, "cluster", 1)), (kind, "bk", cfg.bk),
            (kind, "decomposition", cfg.decomposition), (kind, "layout", lay)}


def _sass_specs(specs):
    """The specs to disassemble: all with PYBLASGEMM_COMPILE_ALL=1; otherwise a cover in which
    every feature of :func:`_sass_features` appears at least once (about 50: cuobjdump takes
    ~0.6 s per cubin, 0.3 s of CPU saved per spec left out)."""
    return list(specs) if ALL else compile_pool.greedy_cover(specs, _sass_features)


def _fused_specs():
    """(kind, config, layout, EPI) of the fused-epilogue instantiations compiled: with
    PYBLASGEMM_COMPILE_ALL=1 every wgmma config of every fused kind with every EPI (one layout
    each, rotating); otherwise each (kind, decomposition) once, and for f16 also each tile
    width (bn 64: one consumer warpgroup, 232 registers) and the 2-CTA cluster, the EPI (every
    activation, and bias / pre-activation alone) and the layout rotating. A fused instance
    costs 2-7 s of CPU (one inlined activation per accumulator register)."""
    from pyblasgemm.kernels.launch import FUSED_KINDS, fusable

    codes = [jit.epilogue_code(c) for c in range(5)]        # none (bias/pre only), relu, gelu, gelu_tanh, silu
    out, seen, i = [], set(), 0
    for kind in FUSED_KINDS:
        for cfg in [c for c in SM90_CONFIGS.get(kind, ()) if fusable(kind, c)]:   # (f32: mma.sync only)
            key = (kind, cfg.decomposition) + ((cfg.bn, cfg.cluster) if kind == "f16" else ()) if not ALL \
                else (kind, cfg)
            if key in seen or (cfg.decomposition == "hybrid" and not ALL):
                continue
            seen.add(key)
            lays = _layouts(cfg, kind)
            for epi in (codes if ALL else [codes[i % len(codes)]]):
                out.append((kind, cfg, lays[i % len(lays)], epi))
                i += 1
    # int8 dequantized in the store: every output type and decomposition, the widest and the
    # narrowest tiles (~5-16 s of CPU each: 4 by default)
    picks = [("sliced", 256, 128, "float16", 2), ("splitk_parallel", 128, 128, "bfloat16", 1),
             ("streamk", 128, 128, "float32", 4), ("sliced", 64, 64, "float16", 0)]
    for cfg in SM90_CONFIGS["s8"]:
        if not fusable("s8", cfg, dequantize=True) or cfg.cluster != 1:
            continue
        for d, bm, bn, out_type, act in picks:
            if ALL or (cfg.decomposition, cfg.bm, cfg.bn) == (d, bm, bn):
                out.append(("s8", cfg, "TN", jit.epilogue_code(act, out_type)))
    # the Ozaki moduli GEMM's digit store: every s8 config that takes it (1-3 s of CPU each)
    out += [("s8", cfg, "TN", jit.EPI_RESIDUE) for cfg in SM90_CONFIGS["s8"] if jit.residue_store_fits(cfg, "s8")]
    # float8 scaled in the store (the route always dequantizes): every config of e4m3, one of
    # each other pair; the output type, activation and per-tensor bits rotating
    from pyblasgemm.kernels.config import FP8_KINDS
    for j, (kind, cfg) in enumerate([("e4m3", c) for c in SM90_CONFIGS["e4m3"]]
                                    + [(k, SM90_CONFIGS[k][0]) for k in FP8_KINDS[1:]]):
        out.append((kind, cfg, "TN", jit.epilogue_code(j % 5, tuple(jit.DEQUANT_OUT)[j % 3], scale_m_one=bool(j & 1),
                                                       scale_n_one=bool(j & 2))))
    # float8 with block scales, promoted every stage (sm90_fold_block_scaled): every e4m3 config,
    # with torch's layout (C row-major: the kernel's m side holds b's 128 x 128 blocks, its n side
    # a's 1 x 128), the column-major one (a's 1 x 128 on the m side: a scale per column), and a
    # per-tensor / per-row side beside blocks; one other pair
    modes = jit.BLOCK_MODE
    pairs = [(modes["b_blocks"], modes["a_blocks"]), (modes["a_blocks"], modes["b_blocks"]),
             (modes["tensor"], modes["a_blocks"]), (modes["b_blocks"], modes["vector"])]
    for j, cfg in enumerate(SM90_CONFIGS["e4m3"]):
        for i, (bm, bn) in enumerate(pairs if ALL or j == 0 else pairs[j % len(pairs):][:1]):
            out.append(("e4m3", cfg, "TN", jit.epilogue_code((i + j) % 5, tuple(jit.DEQUANT_OUT)[(i + j) % 3],
                                                            block_m=bm, block_n=bn)))
    out.append(("e5m2_e4m3", SM90_CONFIGS["e5m2_e4m3"][0], "TN",
                jit.epilogue_code(0, "bfloat16", block_m=modes["b_blocks"], block_n=modes["a_blocks"])))
    return out


#: (kind, config name, layout, EPI) of instantiations that spilled 8-20 bytes (and took a stack
#: frame) under NVRTC 13.0.88, the one PyTorch pins, while 13.5 compiled them clean: values
#: computed before the roles' setmaxnreg and live across it (issue #30; sm90_gemm.cuh's
#: sm90_grid). Every run compiles them, whatever the cover picks. Stream-k 256 x 128 spilled in
#: every layout, the cluster pair in NT only; hybrid shares the stream-k kernels.
NVRTC_13_0_SPILLS = (
    ("f16", "sm90a_streamk_256x128x64_w2x1_s4_mmasync_g8", "NN", 0),
    ("bf16", "sm90a_streamk_256x128x64_w2x1_s4_mmasync_g8", "TT", 0),
    ("f16", "sm90a_sliced_256x128x64_w2x1_s4_c2_mmasync_g8", "NT", 0),
    ("bf16", "sm90a_sliced_256x128x64_w2x1_s4_c2_mmasync_g8", "NT", 0),
    # int8 dequantized to float16 + GELU, bfloat16 + ReLU, float32 + SiLU, float16 alone
    ("s8", "sm90a_streamk_192x128x128_w2x1_s4_g8", "TN", 58),
    ("s8", "sm90a_streamk_192x128x128_w2x1_s4_g8", "TN", 89),
    ("s8", "sm90a_streamk_192x128x128_w2x1_s4_g8", "TN", 28),
    ("s8", "sm90a_streamk_192x128x128_w2x1_s4_g8", "TN", 56),
)


def _spec_named(kind: str, name: str, lay: str, epi: int) -> tuple:
    cfgs = [c for c in SM90_CONFIGS[kind] + SM90_MMA_SYNC_CONFIGS.get(kind, ()) if c.name == name]
    if not cfgs:
        raise LookupError(f"NVRTC_13_0_SPILLS names {name} ({kind}), which is not shipped: update the list")
    return (kind, cfgs[0], lay) + ((epi,) if epi else ())


def _with(specs: list, extra) -> list:
    return specs + [s for s in extra if s not in specs]


_KNOWN = [_spec_named(*s) for s in NVRTC_13_0_SPILLS]
#: every distinct shipped instantiation
ALL_SPECS = _specs()
#: those compiled in this run (all with PYBLASGEMM_COMPILE_ALL=1, else the cover, and always
#: the known NVRTC 13.0 spills)
SPECS = ALL_SPECS if ALL else _with(compile_pool.greedy_cover(ALL_SPECS, _compile_features),
                                    [s for s in _KNOWN if len(s) == 3])
SASS_SPECS = _sass_specs(SPECS)
FUSED_SPECS = _with(_fused_specs(), [s for s in _KNOWN if len(s) == 4])
#: the NVRTC CuPy compiles with in this run, as test ids show it (``nvrtc13.5``)
NVRTC = nvrtc_under_test.label()


def _param(s):
    return pytest.param(s, id=f"{NVRTC}-{s[0]}-{s[2]}-{s[1].name}" + (f"-epi{s[3]}" if len(s) > 3 else ""))


def find_cuobjdump() -> Path | None:
    """cuobjdump of the nvidia-cuda-cuobjdump wheel (nvidia/cu13/bin, or nvidia/cuda_cuobjdump/bin
    for the CUDA 12 wheel), or None."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None:
        return None
    for root in spec.submodule_search_locations or ():
        for exe in sorted(Path(root).glob("*/bin/cuobjdump*")):
            if exe.name in ("cuobjdump", "cuobjdump.exe") and os.access(exe, os.X_OK):
                return exe
    return None


CUOBJDUMP = find_cuobjdump()
NO_CUOBJDUMP = ("cuobjdump not found under the 'nvidia' package: install the test extra "
                "(pip install -e '.[test]', which brings nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm)")


def _build(spec, sass: bool):
    """Compile one instantiation (``spec``: kind, config, layout[, fused EPI]); disassemble it
    when asked and cuobjdump is there."""
    kind, cfg, lay = spec[:3]
    epi = spec[3] if len(spec) > 3 else 0
    out = {"names": jit._names(cfg, kind, lay[0], lay[1], None, True, epi)}
    try:
        binary, out["log"] = jit.compile_offline(cfg, kind, lay[0], lay[1], arch="sm_90a", epi=epi)
    except Exception as e:  # KernelCompileError carries the NVRTC log in its message
        out["error"] = e
        return out
    out["elf_magic"] = binary[:4]
    if sass and CUOBJDUMP is not None:
        with tempfile.TemporaryDirectory(prefix="pbg_sm90_") as workdir:
            path = Path(workdir) / "kernel.cubin"
            path.write_bytes(binary)
            # cuobjdump -sass runs nvdisasm (the nvidia-cuda-nvdisasm wheel, same bin folder)
            env = dict(os.environ, PATH=f"{CUOBJDUMP.parent}{os.pathsep}{os.environ.get('PATH', '')}",
                       NVDISASM_PATH=str(CUOBJDUMP.parent))
            r = subprocess.run([str(CUOBJDUMP), "-sass", str(path)], capture_output=True, text=True, env=env)
        out["sass"] = r.stdout if r.returncode == 0 else None
        out["sass_error"] = f"cuobjdump exit {r.returncode}:\n{r.stderr}"
    return out


def compile_jobs(items) -> dict:
    """{spec: job} for every spec a selected test of this module asks for, disassembled where a
    selected SASS test asks for it (see compile_pool.py)."""
    wanted: dict = {}
    for item in items:
        cs = getattr(item, "callspec", None)
        if cs is not None and getattr(item, "module", None) is sys.modules[__name__] and "spec" in cs.params:
            spec = cs.params["spec"]
            wanted[spec] = wanted.get(spec, False) or item.originalname == "test_sass_has_the_fast_path"
    return {("sm_90a", spec): (lambda spec=spec, sass=sass: _build(spec, sass)) for spec, sass in wanted.items()}


def _result(spec):
    _nvrtc()
    r = compile_pool.result(("sm_90a", spec), lambda: _build(spec, True))
    if "error" in r:
        pytest.fail(f"{spec[1].name} {spec[0]} {spec[2]} failed to compile for sm_90a:\n{r['error']}")
    return r


# --- the shipped set ----------------------------------------------------------------------------

def test_shipped_set_covers_every_kind_and_layout():
    assert set(SM90_CONFIGS) == set(SM90_KINDS) == set(EXPECTED_LAYOUTS)
    for kind, cfgs in SM90_CONFIGS.items():
        assert cfgs, kind
        for cfg in cfgs:
            ok, why = cfg.validate(kind=kind)
            assert ok, f"shipped {cfg.name} ({kind}) is invalid: {why}"
            assert cfg.family == "sm90a"
            assert set(_layouts(cfg, kind)) == EXPECTED_LAYOUTS[kind], (kind, cfg.name)
    # hybrid shares streamk's kernel (same template MODE): compiled once
    for kind, cfgs in SM90_CONFIGS.items():
        by = {(c.bm, c.stages, getattr(c, "cluster", 1), c.decomposition): c for c in cfgs}
        for (bm, st, cl, d), c in by.items():
            if d == "hybrid" and (bm, st, cl, "streamk") in by:
                assert jit._names(c, kind, "T", "N", None, True) == jit._names(
                    by[(bm, st, cl, "streamk")], kind, "T", "N", None, True)


def test_compiled_set_covers_every_instance_and_tile_layout():
    """The default run compiles each template instance in some layout and each tile shape in
    every layout its kind accepts (a spec left out shares both with specs compiled)."""
    compiled = {(k, c, lay) for k, c, lay in SPECS}
    assert compiled <= set(ALL_SPECS)
    covered = set().union(*(_compile_features(s) for s in SPECS))
    for spec in ALL_SPECS:
        assert _compile_features(spec) <= covered, spec
    instances = {f for s in SPECS for f in _compile_features(s) if f[1] == "instance"}
    assert len(instances) == len({f for s in ALL_SPECS for f in _compile_features(s) if f[1] == "instance"})
    if not ALL:
        assert len(SPECS) < 0.6 * len(ALL_SPECS), (len(SPECS), len(ALL_SPECS))


def test_known_nvrtc_13_0_spills_are_compiled_in_every_run():
    """The instantiations NVRTC 13.0 spilled are shipped, valid in their layout, and compiled
    by the clean-compile tests whatever the cover picks."""
    from pyblasgemm.kernels.launch import fusable

    for kind, cfg, lay, *epi in _KNOWN:
        assert lay in _layouts(cfg, kind), (kind, cfg.name, lay)
        if epi:
            assert fusable(kind, cfg, dequantize=bool(epi[0] & jit.EPI_DEQUANT)), (kind, cfg.name)
            assert (kind, cfg, lay, epi[0]) in FUSED_SPECS
        else:
            assert (kind, cfg, lay) in SPECS and (kind, cfg, lay) in ALL_SPECS
    assert {k for k, *_ in _KNOWN} == {"f16", "bf16", "s8"}


@pytest.mark.parametrize("nvrtc", [NVRTC])
def test_runs_under_the_chosen_nvrtc(nvrtc):
    """The id names the NVRTC that compiled this run; with PYBLASGEMM_TEST_NVRTC, it is the one
    named there and no other is loaded."""
    _nvrtc()
    lib = nvrtc_under_test.choose()
    maj, mnr = nvrtc_under_test.version()
    assert nvrtc == f"nvrtc{maj}.{mnr}"
    if lib is not None:
        assert nvrtc_under_test.loaded() == [lib], (lib, nvrtc_under_test.loaded())


_WARN = re.compile(r"warning|Potential Performance Loss", re.I)
_LMEM = re.compile(r"(\d+) bytes lmem")
_CUM_STACK = re.compile(r"(\d+) bytes cumulative stack size")


@pytest.mark.parametrize("spec", [_param(s) for s in SPECS])
def test_instantiation_compiles_clean(spec):
    _assert_clean(spec, _result(spec))


@pytest.mark.parametrize("spec", [_param(s) for s in FUSED_SPECS])
def test_fused_epilogue_instantiation_compiles_clean(spec):
    """The fused-epilogue variants (EPI != 0) meet the same bar: no warning, spill, stack or
    local memory, registers within the block's budget."""
    r = _result(spec)
    _assert_clean(spec, r)
    lowered = list(jit.ptxas_resources(r["log"]))
    assert any(f"ELi{spec[3]}EEEv" in n for n in lowered if "sm90_gemm_kernel" in n), lowered


def test_fused_epilogue_names_and_rules():
    """EPI 0 keeps the plain kernels' names (their compiled caches stay valid); a fused
    variant adds its code; stream-k / hybrid on 256-wide tiles and mma.sync consumers take none."""
    from pyblasgemm.kernels.config import SM90_CONFIGS_BY_TILE
    from pyblasgemm.kernels.launch import fusable

    cfg = SM90_CONFIGS_BY_TILE["f16"][256]
    plain = jit.sm90_kernel_name(cfg, "f16", "N", "N")
    assert jit.sm90_kernel_name(cfg, "f16", "N", "N", 0) == plain and plain.endswith("false>")
    assert jit.sm90_kernel_name(cfg, "f16", "N", "N", jit.epilogue_code(2)) == plain[:-1] + ", 10>"
    assert [jit.epilogue_code(c) for c in range(5)] == [8, 9, 10, 11, 12]
    header = (jit.INCLUDE_DIR / "pyblasgemm/epilogue/activation.cuh").read_text()
    for flag, value in (("kEpiOn", jit.EPI_ON), ("kEpiDequant", jit.EPI_DEQUANT),
                        ("kEpiOutShift", jit.EPI_OUT_SHIFT), ("kEpiScaleMOne", jit.EPI_SCALE_M_ONE),
                        ("kEpiScaleNOne", jit.EPI_SCALE_N_ONE), ("kEpiBlockShift", jit.EPI_BLOCK_SHIFT),
                        ("kEpiResidue", jit.EPI_RESIDUE)):
        assert f"constexpr int {flag} = {value};" in header      # one flag, two languages
    with pytest.raises(ValueError, match="activation code"):
        jit.epilogue_code(8)
    with pytest.raises(ValueError, match="dequantize_to"):
        jit.epilogue_code(1, "int32")
    dq = jit.epilogue_code(0, "float16")
    assert jit._names(SM90_CONFIGS_BY_TILE["s8"][256], "s8", "T", "N", None, True, dq)[0].endswith(f", {dq}>")
    with pytest.raises(ValueError, match="fused for the s8, e4m3, .* kinds only"):
        jit._names(SHIPPED_CONFIGS["f16"][0], "f16", "N", "N", None, True, dq)
    assert jit._names(SHIPPED_CONFIGS["f16"][0], "f16", "N", "N", None, True, 9)[0].endswith("true, 9>")
    assert fusable("f16", cfg) and fusable("bf16_out32", SM90_CONFIGS["bf16_out32"][0])
    assert not fusable("s8", SM90_CONFIGS_BY_TILE["s8"][256]) and not fusable("tf32", SM90_CONFIGS["tf32"][0])
    assert fusable("s8", SM90_CONFIGS_BY_TILE["s8"][256], dequantize=True)
    assert not fusable("f16", cfg, dequantize=True)
    streamk = [c for c in SM90_CONFIGS["f16"] if c.decomposition in ("streamk", "hybrid")]
    assert {c.bm for c in streamk if not fusable("f16", c)} == {256}
    assert not any(fusable("f16", c) for c in SM90_MMA_SYNC_CONFIGS["f16"])


def test_digit_store_rules():
    """The Ozaki digit store (EPI_RESIDUE) is compiled for the sliced s8 wgmma configs of whole
    128-byte boxes only (the 64-wide tile, split-k, stream-k, mma.sync consumers and other kinds
    are refused with the rule's words, before NVRTC runs); its table has the kernel's width."""
    from pyblasgemm.kernels.config import SM90_CONFIGS_BY_TILE
    from pyblasgemm.kernels.ozaki_kernels import DIGIT_WORDS

    fits = [c.name for c in SM90_CONFIGS["s8"] if jit.residue_store_fits(c, "s8")]
    assert SM90_CONFIGS_BY_TILE["s8"][256].name in fits and SM90_CONFIGS_BY_TILE["s8"][128].name in fits
    assert all("sliced" in name for name in fits)
    assert not jit.residue_store_fits(SM90_CONFIGS_BY_TILE["s8"][64], "s8")
    assert not jit.residue_store_fits(SM90_CONFIGS_BY_TILE["f16"][256], "f16")
    for cfg in [c for c in SM90_CONFIGS["s8"] if c.decomposition != "sliced"][:2] + [SHIPPED_CONFIGS["s8"][0]]:
        with pytest.raises(ValueError, match="digit store .* sliced s8 configs"):
            jit._names(cfg, "s8", "T", "N", None, True, jit.EPI_RESIDUE)
    header = (jit.INCLUDE_DIR / "pyblasgemm/epilogue/sm80_smem_epilogue.cuh").read_text()
    assert f"constexpr int kResidueWords = {DIGIT_WORDS};" in header


def test_fused_specs_cover_every_kind_decomposition_and_activation():
    from pyblasgemm.kernels.launch import FUSED_KINDS

    assert {(k, c.decomposition) for k, c, _, _ in FUSED_SPECS} >= {
        (k, d) for k in FUSED_KINDS if k in SM90_CONFIGS for d in ("sliced", "streamk", "splitk_parallel")}
    assert {e for k, *_, e in FUSED_SPECS if k in FUSED_KINDS} == {jit.epilogue_code(c) for c in range(5)}
    dq = {(c.decomposition, e >> jit.EPI_OUT_SHIFT) for k, c, _, e in FUSED_SPECS if k == "s8" and e & jit.EPI_DEQUANT}
    assert {d for d, _ in dq} >= {"sliced", "streamk", "splitk_parallel"} and {o for _, o in dq} == {0, 1, 2}
    digits = [c for k, c, _, e in FUSED_SPECS if e == jit.EPI_RESIDUE]
    assert {c.bm for c in digits} == {128, 256} and {c.cluster for c in digits} == {1, 2}


def _assert_clean(spec, r):
    log = r["log"]
    assert r["elf_magic"] == b"\x7fELF", "not a cubin"
    bad = [ln for ln in log.splitlines() if _WARN.search(ln)]
    assert not bad, "compiler warnings:\n" + "\n".join(bad) + f"\n--- log ---\n{log}"
    res = jit.ptxas_resources(log)
    assert len(res) == len(r["names"]), f"expected a ptxas report per kernel ({len(r['names'])}):\n{log}"
    for name, rr in res.items():
        assert "stack" in rr and "registers" in rr, f"incomplete ptxas report for {name}:\n{log}"
        assert rr["spill_stores"] == 0 and rr["spill_loads"] == 0, f"register spill in {name}:\n{log}"
        assert rr["stack"] == 0, f"stack frame (local memory) in {name}:\n{log}"
        if "sm90_gemm_kernel" in name:
            threads = spec[1].threads
            assert rr["registers"] <= max_regs(threads), (
                f"{name}: {rr['registers']} registers x {threads} threads:\n{log}")
    for pat in (_LMEM, _CUM_STACK):
        for mm in pat.finditer(log):
            assert int(mm.group(1)) == 0, f"local memory: {mm.group(0)}\n{log}"
    assert sum("sm90_gemm_kernel" in n for n in res) == 1, log
    assert sum("sm90_splitk_reduce" in n for n in res) == (spec[1].decomposition == "splitk_parallel"), log


def _sass_functions(sass: str) -> dict[str, str]:
    parts = re.split(r"^\s*Function : (\S+)\s*$", sass, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_cuobjdump_is_installed():
    assert CUOBJDUMP is not None, NO_CUOBJDUMP
    # cuobjdump -sass hands the disassembly to nvidia-cuda-nvdisasm's nvdisasm
    assert any((CUOBJDUMP.parent / n).exists() for n in ("nvdisasm", "nvdisasm.exe")), NO_CUOBJDUMP


#: the Hopper grouped walk (MODE kGrouped): every tile of both 16-bit kinds in the expert
#: form's layout ("NN": the tokens K-major, the weights MN-major), and bfloat16's with the
#: fused bias + GELU store (each compiled in every run: 9 instantiations)
GROUPED_SPECS = [(kind, cfg, "NN") for kind, tiles in SM90_GROUPED_CONFIGS.items() for cfg in tiles.values()]
GROUPED_FUSED_SPECS = [("bf16", cfg, "NN", jit.epilogue_code(2)) for cfg in SM90_GROUPED_CONFIGS["bf16"].values()]


@pytest.mark.parametrize("spec", [_param(s) for s in GROUPED_SPECS + GROUPED_FUSED_SPECS])
def test_grouped_walk_instantiation_compiles_clean(spec):
    """The grouped walk's instantiations: no warning, spill, stack or local memory, registers
    within the block's budget, and its shared memory (ring, group table, the scan's static
    arrays) under the 227 KB an SM gives a block."""
    r = _result(spec)
    _assert_clean(spec, r)
    kind, cfg = spec[:2]
    assert cfg.validate(kind=kind) == (True, "")
    static = [int(x) for x in re.findall(r"(\d+) bytes smem", r["log"])]
    assert all(cfg.smem_bytes(kind) + x <= 232448 for x in static), (static, cfg.smem_bytes(kind))


def test_grouped_walk_configs_and_refusals():
    """Only 16-bit wgmma tiles without clusters take the grouped walk; a tile whose ring leaves
    no room for the group table is refused with the bytes it needs."""
    from dataclasses import replace

    for kind, tiles in SM90_GROUPED_CONFIGS.items():
        for cfg in tiles.values():
            assert cfg.validate(kind=kind) == (True, "") and cfg.mode == 4
            assert jit.sm90_kernel_name(cfg, kind, "N", "N").endswith(", 4, 1, %d, false>" % cfg.warps_m)
    big = SM90_GROUPED_CONFIGS["bf16"]["large"]
    ok, why = replace(big, stages=4).validate(kind="bf16")
    assert not ok and "shared memory" in why, why
    assert "f16 and bf16" in big.validate(kind="s8")[1]
    assert "without clusters" in replace(big, cluster=2).validate(kind="bf16")[1]


@pytest.mark.parametrize("spec", [_param(s) for s in SASS_SPECS + GROUPED_SPECS])
def test_sass_has_the_fast_path(spec):
    """The cubin runs wgmma (HGMMA/IGMMA of the config's tile; mma.sync consumers: HMMA and
    ldmatrix), TMA loads and setmaxnreg."""
    assert CUOBJDUMP is not None, NO_CUOBJDUMP
    kind, cfg, lay = spec
    r = _result(spec)
    assert r["sass"] is not None, r["sass_error"]
    assert re.search(r"^\s*\.target\s+sm_90a\s*$", r["sass"], re.M), r["sass"][:500]
    funcs = _sass_functions(r["sass"])
    gemm = [n for n in funcs if "sm90_gemm_kernel" in n]
    assert len(gemm) == 1, list(funcs)
    name, text = gemm[0], funcs[gemm[0]]
    # the instance is this config's: ... BNT=bm, STAGES, MODE ... in the mangled name
    assert f"ELi{cfg.bm}ELi{cfg.stages}ELi{cfg.mode}E" in name, name
    if cfg.consumer == "mma.sync":
        # mma.sync consumers: HMMA m16n8k16 (fp32 accumulators), fragments by ldmatrix, no wgmma
        hmma = r"HMMA\.16816\.F32\.BF16\b" if kind == "bf16" else r"HMMA\.16816\.F32(?!\.BF16)\b"
        assert re.search(hmma, text) and "LDSM" in text, f"no {hmma} / LDSM in {name}"
        assert not re.search(r"\b[HI]GMMA\.", text), f"wgmma in the mma.sync-consumer kernel {name}"
    else:
        # float8: QGMMA with the wgmma's operand types, B's first (its A is P = op(B)^T)
        row = KERNEL_KINDS[kind]
        f8 = {"float8_e4m3fn": "E4M3", "float8_e5m2": "E5M2"}
        fp8 = (rf"QGMMA\.64x{cfg.bm}x32\.F32\.{f8[row.b_dtype or row.ab_dtype]}\.{f8[row.ab_dtype]}\b"
               if row.ab_dtype in f8 else None)
        mma = {"f16": rf"HGMMA\.64x{cfg.bm}x16\.F32(?!\.BF16)\b",
               "bf16": rf"HGMMA\.64x{cfg.bm}x16\.F32\.BF16\b",
               "s8": rf"IGMMA\.64x{cfg.bm}x32\.S8\.S8\b",
               "tf32": rf"HGMMA\.64x{cfg.bm}x8\.F32\.TF32\b",
               "3xtf32": rf"HGMMA\.64x{cfg.bm}x8\.F32\.TF32\b"}.get(BASE_KIND[kind], fp8)
        found = sorted(set(re.findall(r"\b[HIQ]GMMA\.\S+", text)))
        assert re.search(mma, text), f"no {mma} in {name} (found {found})"
        other = [f for f in found if not re.fullmatch(mma.replace(r"\b", ""), f.rstrip(" ,;"))]
        assert not other, f"unexpected MMA shapes in {name}: {other}"
    for ins in ("UTMALDG", "USETMAXREG.DEALLOC", "USETMAXREG.TRY_ALLOC"):
        assert ins in text, f"no {ins} in {name}"
    if getattr(cfg, "cluster", 1) > 1:
        assert "UTMALDG.3D.MULTICAST" in text, f"cluster config without multicast TMA: {name}"
    local = re.findall(r"\b(?:LDL|STL)(?:\.\S+)?\s", text)
    assert not local, f"local memory traffic in {name}: {local[:5]}"
    if cfg.decomposition == "splitk_parallel":
        assert any("sm90_splitk_reduce" in n for n in funcs), list(funcs)


# --- generated header, headers alone, wrong targets ----------------------------------------------

def _load_generator():
    path = REPO / "tools" / "gen_sm90_wgmma.py"
    spec = importlib.util.spec_from_file_location("pbg_gen_sm90_wgmma", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_wgmma_header_is_up_to_date():
    gen = _load_generator()
    committed = jit.INCLUDE_DIR / "pyblasgemm" / "ptx" / "sm90_wgmma.cuh"
    assert Path(gen.OUT).resolve() == committed.resolve()
    want, have = gen.render(), committed.read_text()
    if want != have:
        diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                 "committed", "render()"))[:60])
        pytest.fail(f"{committed.name} is stale: run `python tools/gen_sm90_wgmma.py`\n{diff}")
    # every wgmma N the kernel instantiates has its wrapper
    for kind, cfgs in SM90_CONFIGS.items():
        for c in cfgs:
            assert c.bm in gen.NS, (kind, c.name)


def _compile_src(nvrtc, src: str, arch: str):
    """(ok, log) of an NVRTC compile of ``src`` for ``arch``."""
    prog = nvrtc.createProgram(src, "probe.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", *jit.BASE_OPTIONS, "-I" + str(jit.INCLUDE_DIR)])
            return True, nvrtc.getProgramLog(prog)
        except Exception as e:
            return False, f"{e}\n{nvrtc.getProgramLog(prog)}"
    finally:
        nvrtc.destroyProgram(prog)


@pytest.mark.parametrize("header", SM90_HEADERS)
def test_sm90_header_compiles_alone(header):
    nvrtc = _nvrtc()
    ok, log = _compile_src(nvrtc, f'#include "{header}"\n__global__ void pbg_header_probe() {{}}\n', "sm_90a")
    assert ok, f"{header} does not compile alone for sm_90a:\n{log}"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("header", [h for h in SM90_HEADERS if "prep" not in h])  # prep: plain sm_80 code
def test_sm90_header_refuses_other_targets(header, arch):
    nvrtc = _nvrtc()
    ok, log = _compile_src(nvrtc, f'#include "{header}"\n__global__ void pbg_header_probe() {{}}\n', arch)
    assert not ok, f"{header} compiled for {arch}: it needs sm_90a"
    assert "sm_90a" in log, log


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100a"])
def test_compile_offline_refuses_non_sm90a(arch):
    _nvrtc()
    kind = "f16"
    cfg = SM90_CONFIGS[kind][0]
    with pytest.raises(ValueError, match="sm_90a"):
        jit.compile_offline(cfg, kind, "N", "N", arch=arch)


def test_sm90_argument_blocks_match_kernel_signatures():
    """sm90.Sm90Launch packs arguments by hand: after the three tensor maps, _FIELDS must match
    sm90_gemm_kernel's parameters in order and width, and _RED_FIELDS sm90_splitk_reduce's."""
    import ctypes as ct
    import re

    from pyblasgemm.kernels import sm90

    src = (jit.INCLUDE_DIR / "pyblasgemm/impls/sm90_gemm.cuh").read_text()
    width = {ct.c_uint64: "u64", ct.c_int32: "i32", ct.c_int64: "i64", ct.c_float: "f32"}

    def params(name):
        decls = re.search(r"\b" + name + r"\(([^)]*)\)", src, re.S).group(1).split(",")
        out = []
        for decl in (" ".join(d.split()) for d in decls):
            typ = decl.rsplit(" ", 1)[0].replace("const ", "")
            if "TmaDesc" in typ:
                continue
            out.append("u64" if "*" in typ else {"int": "i32", "long long": "i64", "float": "f32"}[typ])
        return out

    assert [width[t] for _, t in sm90._FIELDS] == params("sm90_gemm_kernel")
    assert [width[t] for _, t in sm90._RED_FIELDS] == params("sm90_splitk_reduce")
