"""The planner's choices and the kernel layer's per-config facts, pinned.

A refactor of the kernel layer (e.g. the kernel-family registry) must not change which plan the
planner picks, nor any candidate's score, rejection reason, launch spec or kernel name. This
file compares them with a snapshot (``plan_snapshot.json`` beside it) made with the code before
the refactor, for a fixed list of problems on both datasheet arch specs (sm_80: the mma.sync
kernel only; sm_90: the Hopper kernel too), with the backend chosen ('auto') and forced to our
kernels ('tensorcore').

The snapshot changes only when a plan is meant to change: regenerate it with
``python tests/test_plan_snapshot.py --write`` and say why in the commit.
"""
import hashlib
import json
import sys
from pathlib import Path

import pytest

from pyblasgemm.kernels.config import (SHIPPED_CONFIGS, SM90_CONFIGS, SM90_MMA_SYNC_CONFIGS,
                                       KernelConfig)
from pyblasgemm.kernels.geometry import launch_geometry
from pyblasgemm.kernels.grouped import GROUPED_CONFIGS
from pyblasgemm.kernels.jit import _names
from pyblasgemm.kernels.launch import fusable
from pyblasgemm.kernels.problem import ELEM_BYTES, KernelProblem
from pyblasgemm.kernels.spec import launch_spec
from pyblasgemm.planner import FAMILIES, make_desc, model, plan_for

SNAPSHOT = Path(__file__).resolve().with_name("plan_snapshot.json")
ARCHS = ("sm_80", "sm_90")
BACKENDS = (None, "tensorcore")

#: (id, make_desc arguments): every kernel kind, tiny/thin/odd/prime/tile+-1/huge sizes, every
#: transpose pair, batches (strided and broadcast), unaligned leading dimensions (packing,
#: the scalar path) and pointers
CASES = [
    ("f16_64cube", dict(m=64, n=64, k=64, dtype="f16")),
    ("f16_4096cube", dict(m=4096, n=4096, k=4096, dtype="f16")),
    ("f16_8192cube_TN", dict(m=8192, n=8192, k=8192, dtype="f16", transa="T")),
    ("f16_decode_1", dict(m=1, n=4096, k=4096, dtype="f16", transa="T")),
    ("f16_decode_16", dict(m=16, n=14336, k=4096, dtype="f16", transa="T")),
    ("f16_prefill_333", dict(m=333, n=4096, k=4096, dtype="f16", transa="T")),
    ("f16_longk", dict(m=256, n=256, k=65536, dtype="f16")),
    ("f16_longk_TN", dict(m=512, n=512, k=32768, dtype="f16", transa="T")),
    ("f16_shortk", dict(m=4096, n=4096, k=128, dtype="f16")),
    ("f16_odd", dict(m=4095, n=4097, k=1023, dtype="f16", transa="T")),
    ("f16_prime", dict(m=127, n=131, k=137, dtype="f16", transb="T")),
    ("f16_tile_pm1", dict(m=129, n=127, k=257, dtype="f16", transa="T", transb="T")),
    ("f16_3072cube", dict(m=3072, n=3072, k=3072, dtype="f16")),
    ("f16_5000cube", dict(m=5000, n=5000, k=5000, dtype="f16")),
    ("f16_batch8", dict(m=512, n=512, k=512, dtype="f16", batch=8)),
    ("f16_batch_bcast", dict(m=256, n=1024, k=1024, dtype="f16", batch=32, stride_b=0)),
    ("f16_lda_unaligned", dict(m=1024, n=1024, k=1024, dtype="f16", lda=1025)),
    ("f16_align2", dict(m=1000, n=1000, k=1000, dtype="f16", align=2)),
    ("bf16_1000cube", dict(m=1000, n=1000, k=1000, dtype="bf16")),
    ("bf16_2048_NT", dict(m=2048, n=2048, k=2048, dtype="bf16", transb="T")),
    ("bf16_thin", dict(m=128, n=14336, k=4096, dtype="bf16", transa="T")),
    ("bf16_pack", dict(m=6453, n=738, k=9058, dtype="bf16", lda=6455)),
    ("i8_4096_TN", dict(m=4096, n=4096, k=4096, dtype="i8", transa="T")),
    ("i8_4096_NN", dict(m=4096, n=4096, k=4096, dtype="i8")),
    ("i8_thin", dict(m=64, n=4096, k=4096, dtype="i8", transa="T")),
    ("i8_longk", dict(m=256, n=256, k=65536, dtype="i8", transa="T")),
    ("i8_odd", dict(m=1001, n=999, k=1004, dtype="i8", transa="T")),
    ("tf32_2048", dict(m=2048, n=2048, k=2048, dtype="tf32")),
    ("tf32_odd_NT", dict(m=777, n=555, k=333, dtype="tf32", transb="T")),
    ("tf32_batch", dict(m=256, n=256, k=1024, dtype="tf32", batch=16)),
    ("3xtf32_8192", dict(m=8192, n=8192, k=8192, dtype="3xtf32")),
    ("3xtf32_3000", dict(m=3000, n=2600, k=1800, dtype="3xtf32")),
    ("3xtf32_small", dict(m=100, n=50, k=70, dtype="3xtf32", transa="T")),
    ("3xtf32_longk", dict(m=128, n=128, k=65536, dtype="3xtf32")),
    ("f16_out32_4096", dict(m=4096, n=4096, k=4096, dtype="f16_out32")),
    ("f16_out32_odd", dict(m=333, n=4096, k=1000, dtype="f16_out32", transa="T")),
    ("bf16_out32_2048", dict(m=2048, n=2048, k=2048, dtype="bf16_out32", transb="T")),
    ("bf16_out32_batch", dict(m=128, n=128, k=4096, dtype="bf16_out32", batch=64)),
    ("f32_fp32", dict(m=1024, n=1024, k=1024, dtype="f32", compute="fp32")),
    ("f16_huge_batch", dict(m=64, n=64, k=64, dtype="f16", batch=70000)),
]


def _num(x):
    """Floats to 12 significant digits (the snapshot's JSON round trip must compare equal)."""
    if isinstance(x, float):
        return float(f"{x:.12g}")
    if isinstance(x, (tuple, list)):
        return [_num(v) for v in x]
    return x


def _digest(lines) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]


def _launch_lines(spec) -> list:
    if spec is None:
        return ["none"]
    if hasattr(spec, "kernel_name") and hasattr(spec, "split"):      # the decode route's GemvSpec
        return [f"{spec.kernel_name} split={spec.split} ctas={spec.ctas} threads={spec.threads} smem={spec.smem} "
                f"blocks={spec.row_tiles} steps={spec.csteps} sms={spec.sm_count} occ={spec.occupancy}"]
    out = [f"{spec.config.name} sms={spec.sm_count} occ={spec.occupancy} smem={spec.smem} "
           f"block={spec.block}", "geometry " + repr(sorted(dict(spec.geometry).items()))]
    out.append("args " + repr(sorted(dict(spec.args).items())))
    out.append("red " + repr(None if spec.red_args is None else sorted(dict(spec.red_args).items())))
    return out


def _plan_record(p) -> dict:
    return {"backend": p.backend, "config": p.config.name if p.config is not None else None,
            "decomposition": p.decomposition, "splits": p.splits, "grid": list(p.grid),
            "workspace_bytes": p.workspace_bytes, "pack": list(p.pack), "source": p.source,
            "predicted_s": _num(p.predicted_s), "launch": _digest(_launch_lines(p.launch))}


def _candidate_lines(cands) -> list:
    out = []
    for c in cands:
        if c.score is None:
            out.append(f"{c.label} rejected: {c.rejected}")
        else:
            out.append(f"{c.label} cal={c.calibrated} " + repr(_num(list(c.score))))
    return out


def plan_snapshot(cases=CASES) -> dict:
    plans, cands = {}, {}
    for case, kw in cases:
        desc = make_desc(**kw)
        for arch in ARCHS:
            where = f"{case}@{arch}"
            for backend in BACKENDS:
                try:
                    p = plan_for(desc, backend, arch=FAMILIES[arch])
                except NotImplementedError as e:     # forced onto kernels that cannot run it
                    plans[f"{where}/{backend}"] = {"refused": str(e)}
                    continue
                plans[f"{where}/{backend or 'auto'}"] = _plan_record(p)
                if backend is None:
                    cands[where] = _digest(_candidate_lines(p.candidates))
    return {"plans": plans, "candidates": cands}


#: the shipped configs of every set, with the kinds each is compiled for
def _config_sets():
    yield "shipped", [(k, c) for k, cs in SHIPPED_CONFIGS.items() for c in cs]
    yield "sm90", [(k, c) for k, cs in SM90_CONFIGS.items() for c in cs]
    yield "sm90_mma_sync", [(k, c) for k, cs in SM90_MMA_SYNC_CONFIGS.items() for c in cs]
    yield "grouped", list(GROUPED_CONFIGS.items())


def _problem(kind, ta, tb, m, n, k, batch=1):
    lda = m if ta == "N" else k
    ldb = k if tb == "N" else n
    return KernelProblem(kind, ta, tb, m, n, k, lda, ldb, m, 256, 256, 256, batch=batch,
                         stride_a=lda * (k if ta == "N" else m) if batch > 1 else 0,
                         stride_b=ldb * (n if tb == "N" else k) if batch > 1 else 0,
                         stride_c=m * n if batch > 1 else 0)


def _config_lines(kind: str, c: KernelConfig) -> list:
    cal = model.load_calibration()
    out = [f"{kind} {c.name} threads={c.threads} mode={c.mode} smem={c.smem_bytes(kind)} "
           f"valid={c.validate(kind=kind)} key={model.tile_key(c, kind)} "
           f"eff={_num(model.tile_efficiency(c, kind, cal))} "
           f"fusable={fusable(kind, c)},{fusable(kind, c, dequantize=True)} "
           f"occ={[model.occupancy(c, kind, FAMILIES[a]) for a in ARCHS]}"]
    for ta in "NT":
        for tb in "NT":
            for epi in (0, 8):
                try:
                    out.append(repr(_names(c, kind, ta, tb, None, True, epi)))
                except ValueError as e:
                    out.append(f"names refused: {e}")
    if c.decomposition == "grouped":
        return out
    for shape in ((1000, 999, 1001, 1), (4096, 4096, 4096, 1), (64, 64, 8192, 1), (300, 200, 100, 5)):
        p = _problem(kind, "T", "N", *shape)
        ok, why = c.validate(p)
        out.append(f"{shape} valid={ok} {why}")
        for arch in ARCHS:
            a = FAMILIES[arch]
            out.append(f"{arch} check={model.check(c, p, a)}")
            if ok:
                occ = model.occupancy(c, kind, a)
                out.append(repr(sorted(launch_geometry(p, c, a.sm_count, occ).items())))
                out += _launch_lines(launch_spec(p, c, a.sm_count, occ))
                out.append(repr(_num(list(model.score_ours(c, p, a, cal, occ)))))
    return out


def kernel_snapshot() -> dict:
    out = {}
    for name, pairs in _config_sets():
        for kind in sorted({k for k, _ in pairs}):
            lines = []
            for k, c in pairs:
                if k == kind:
                    lines += _config_lines(kind, c)
            out[f"{name}/{kind}"] = _digest(lines)
    names = [c.name for _, pairs in _config_sets() for _, c in pairs]
    out["names"] = _digest(names)
    out["parsed"] = _digest(repr(model.parse_config_name(n)) for n in names if "grouped" not in n)
    out["candidate_configs"] = _digest(
        f"{kind} {arch} " + " ".join(c.name for c in model.candidate_configs(kind, model.load_calibration(),
                                                                              FAMILIES[arch]))
        for kind in ELEM_BYTES for arch in ARCHS)
    return out


def snapshot() -> dict:
    return {**plan_snapshot(), "kernels": kernel_snapshot()}


pytestmark = pytest.mark.usefixtures("fresh_planner")   # tests/conftest.py


@pytest.fixture(scope="module")
def stored():
    return json.loads(SNAPSHOT.read_text())


def test_snapshot_covers_every_case(stored):
    want = {f"{c}@{a}/{b or 'auto'}" for c, _ in CASES for a in ARCHS for b in BACKENDS}
    assert set(stored["plans"]) == want
    # the list exercises both of our kernels and cuBLAS, and every decomposition family
    chosen = [r for r in stored["plans"].values() if "refused" not in r]
    assert {r["backend"] for r in chosen} == {"tensorcore", "cublas"}
    names = {r["config"] for r in chosen if r["config"]}
    assert any(n.startswith("sm90a_") for n in names) and any(not n.startswith("sm90a_") for n in names)
    assert {r["decomposition"] for r in chosen} >= {"sliced", "splitk_parallel", "splitk_serial"}
    assert any(r["pack"] for r in chosen)


@pytest.mark.parametrize("case", CASES, ids=[c for c, _ in CASES])
def test_plans_unchanged(case, stored):
    planned = plan_snapshot([case])
    case = case[0]
    for arch in ARCHS:
        for backend in BACKENDS:
            key = f"{case}@{arch}/{backend or 'auto'}"
            assert planned["plans"][key] == stored["plans"][key], key
        where = f"{case}@{arch}"
        assert planned["candidates"][where] == stored["candidates"][where], \
            f"{where}: a candidate's score, rejection or label changed"


def test_kernel_layer_unchanged(stored):
    now = kernel_snapshot()
    changed = sorted(k for k in stored["kernels"] if now.get(k) != stored["kernels"][k])
    assert not changed, f"per-config facts changed for {changed}"
    assert set(now) == set(stored["kernels"])


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_plan_snapshot.py --write   (only when a plan is meant to change)")
    import os
    import tempfile

    for var in [v for v in os.environ if v.startswith("PYBLASGEMM_")]:
        del os.environ[var]
    os.environ["PYBLASGEMM_CACHE_DIR"] = tempfile.mkdtemp()    # no autotuned winner of this machine
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
