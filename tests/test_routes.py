"""The epilogue and the group as data: GemmDesc carries them, the planner prices their routes
(fused in our kernel's store, cuBLASLt's epilogue, unfused; one grouped launch or a loop), the
Plan records the route and explain() prints every option. Planned for the H100 datasheet spec
(no GPU needed); the GPU runs of each route are in test_epilogue.py and
test_fused_mma_sync_gpu.py."""
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm._types import TYPE_ROWS
from pyblasgemm.desc import GroupSpec, describe
from pyblasgemm.epilogue import ACTIVATIONS, EpilogueSpec, last_route
from pyblasgemm.planner import model, plan_for
from pyblasgemm.planner.arch import FAMILIES

H100 = FAMILIES["sm_90"]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_ARCH", "sm_90")
    pyblasgemm.clear_plan_cache()
    yield
    pyblasgemm.clear_plan_cache()


def _plan(m, n, k, dtype="f16", **kw):
    return pyblasgemm.plan(m, n, k, dtype, arch="sm_90", **kw)


def test_the_epilogue_is_part_of_the_description_and_its_plan_key():
    plain = pyblasgemm.planner.make_desc(256, 256, 256)
    fused = pyblasgemm.planner.make_desc(256, 256, 256, activation="gelu", bias="n")
    assert plain.epilogue is None and plain.group is None
    assert fused.epilogue == EpilogueSpec("gelu", "n", 16, False, 0)
    assert fused.key != plain.key and fused.product == plain
    p, q = plan_for(plain), plan_for(fused)
    assert p.epilogue is None and q.epilogue is not None and q.problem is fused


@pytest.mark.parametrize("backend, act, bias, kind, line", [
    ("cublas", "relu", "m", "cublaslt", "cuBLASLt epilogue RELU_BIAS (fused in the GEMM)"),
    ("cublas", "gelu_tanh", None, "cublaslt", "cuBLASLt epilogue GELU (fused in the GEMM)"),
    ("cublas", None, "m", "cublaslt", "cuBLASLt epilogue BIAS (fused in the GEMM)"),
    ("cublas", "gelu", "m", "unfused", "GPU: the planned GEMM"),      # cuBLASLt's GELU is tanh's
    ("cublas", "relu", "n", "unfused", "GPU: the planned GEMM"),      # its bias runs along D's rows
    ("tensorcore", "silu", "n", "ours", "pyblasgemm kernel sm90a_"),
    ("tensorcore", "gelu_tanh", "m", "ours", "pyblasgemm kernel sm90a_"),
])
def test_each_route_where_the_model_and_the_rules_put_it(backend, act, bias, kind, line):
    p = _plan(4096, 4096, 4096, backend=backend, activation=act, bias=bias)
    assert p.epilogue.kind == kind and p.epilogue.line.startswith(line), p.explain()
    assert (p.backend == "cublas") == (kind == "cublaslt" or (kind == "unfused" and backend == "cublas"))
    if kind == "ours":
        assert p.config is not None and p.epilogue.line.endswith("the epilogue fused in its store")


def test_the_unfused_route_is_priced_as_the_gemm_plus_one_pass():
    p = _plan(4096, 4096, 4096, backend="cublas", activation="gelu", bias="m")
    base = plan_for(p.problem.product, "cublas")
    unfused = next(o for o in p.epilogue.options if o.kind == "unfused")
    want = base.predicted_s + model.unfused_pass_s(p.problem.product, H100)
    assert unfused.time == pytest.approx(want)
    # 4096² float16 C: 4 + 4 + 2 bytes per element at 3.35 TB/s, and one more launch
    assert model.unfused_pass_s(p.problem.product, H100) == pytest.approx(
        4096 * 4096 * 10 / H100.dram_bw + 5e-6)


def test_another_gemm_takes_the_epilogue_only_below_the_planned_one_plus_the_pass():
    """cuBLAS planned, an epilogue cuBLASLt lacks (the erf GELU): our fused store runs when its
    predicted time is below cuBLAS's plus the pass, else the unfused route; explain() says
    which, with every option priced or the reason it was refused."""
    for m, n, k in ((512, 4096, 4096), (4096, 4096, 4096), (64, 64, 64), (8192, 8192, 512)):
        p = _plan(m, n, k, activation="gelu", bias="m")
        opts = {o.kind: o for o in p.epilogue.options}
        assert opts["cublaslt"].time is None and "no such epilogue" in opts["cublaslt"].note
        base = plan_for(p.problem.product)
        if base.backend == "cublas":
            ours = opts.get("ours")
            if p.epilogue.kind == "ours":
                assert ours.time <= opts["unfused"].time
            else:
                assert p.epilogue.kind == "unfused"
                assert ours is None or ours.time is None or ours.time > opts["unfused"].time
        text = p.explain()
        assert "epilogue route: " + p.epilogue.line in text and "unfused: the planned GEMM" in text


def test_forced_backends_refuse_the_other_side():
    p = _plan(1024, 1024, 1024, backend="tensorcore", activation="relu", bias="m")
    lt = next(o for o in p.epilogue.options if o.kind == "cublaslt")
    assert lt.time is None and "backend='tensorcore'" in lt.note
    q = _plan(1024, 1024, 1024, backend="cublas", activation="silu", bias="m")
    ours = next(o for o in q.epilogue.options if o.kind == "ours")
    assert ours.time is None and "backend='cublas'" in ours.note and q.epilogue.kind == "unfused"


def test_a_misaligned_bias_or_an_array_blocker_keeps_the_fused_routes_off():
    d = pyblasgemm.planner.make_desc(1024, 1024, 1024, activation="relu", bias="m")
    odd = d._replace(epilogue=d.epilogue._replace(bias_align=2))     # a float16 bias at +2 bytes
    p = plan_for(odd, "tensorcore")
    assert p.epilogue.kind == "unfused" and "pairs of elements" in p.explain()
    blocked = d._replace(epilogue=d.epilogue._replace(blocker="the bias has stride 2"))
    q = plan_for(blocked)
    assert q.epilogue.kind == "unfused"
    assert all(o.time is None for o in q.epilogue.options if o.kind != "unfused")
    assert "the bias has stride 2" in q.explain()


def test_a_dequantizing_epilogue_is_ours_or_unfused():
    d = pyblasgemm.planner.make_desc(4096, 4096, 4096, "int8", transa="T", activation="relu", bias="m")
    d = d._replace(epilogue=d.epilogue._replace(dequantize="float16"))
    p = plan_for(d)
    assert p.epilogue.kind in ("ours", "unfused")
    lt = next(o for o in p.epilogue.options if o.kind == "cublaslt")
    assert lt.time is None and "dequantizing" in lt.note
    if p.epilogue.kind == "ours":
        assert p.epilogue.line.endswith("int8 dequantized in its store") and p.backend == "tensorcore"


def test_host_arrays_take_the_unfused_route_and_last_route_reads_it():
    a = np.ones((3, 4), np.float32)
    pyblasgemm.matmul(a, a.T, activation="relu")
    assert last_route() == "host: the product in the accumulation type, then the epilogue in NumPy"
    p = plan_for(pyblasgemm.planner.make_desc(3, 3, 4, "f32", xp="numpy", activation="relu"))
    assert p.backend == "host" and p.epilogue.line == last_route()


def _group(sizes, dtype="f16", blocker="", ab_align=16, epilogue=None, device_sizes=False):
    row = TYPE_ROWS[{"f16": "h", "i8": "i"}[dtype]]
    m, n, k = (max(s[i] for s in sizes) for i in range(3))
    one, zero = (1, 0) if row.prefix == "i" else (1.0, 0.0)
    return describe("grouped_matmul", row, "int32" if row.prefix == "i" else "fp32", "N", "N", m, n, k,
                    m, k, m, len(sizes), 0, 0, 0, "cupy", 0, (16,), one, zero, epilogue=epilogue,
                    group=GroupSpec("experts", tuple(sizes), ab_align, 16, blocker, device_sizes))


def test_a_group_is_one_launch_when_many_small_problems_make_the_loop_host_bound():
    many_small = _group([(128, 16, 256)] * 64)
    p = plan_for(many_small)
    one, loop = model.grouped_times(many_small.group.sizes, "f16", H100)
    assert one < loop and p.group.kind == "one launch" and p.backend == "tensorcore"
    assert p.group.line.startswith("pyblasgemm grouped kernel") and "64 problems in one persistent launch" in p.group.line
    few_large = _group([(4096, 4096, 4096)] * 4)
    q = plan_for(few_large)
    assert q.group.kind == "loop" and "loop" in q.explain()
    assert plan_for(few_large, "tensorcore").group.kind == "one launch"      # forced


def test_a_group_blocker_or_backend_keeps_it_a_loop_and_says_why():
    p = plan_for(_group([(128, 16, 256)] * 64, blocker="compute='fp32' asks for the GEMMs' arithmetic"))
    assert p.group.kind == "loop" and "compute='fp32'" in p.explain()
    q = plan_for(_group([(128, 16, 256)] * 64), "cublas")
    assert q.group.kind == "loop" and "backend='cublas'" in q.group.reason
    empty = plan_for(_group([(128, 0, 256)] * 3))
    assert empty.group.kind == "loop" and "nothing to compute" in empty.group.reason


def test_a_grouped_launch_is_keyed_by_its_class_not_its_sizes():
    """Routing changes every step: two groups of other sizes share one launch class (one bound
    launch), and group plans are not memoized (they would crowd the cache)."""
    epi = EpilogueSpec("gelu", "m", 16, False, 0)
    a = plan_for(_group([(128, 16, 256)] * 64, epilogue=epi))
    b = plan_for(_group([(128, 9, 256)] * 60 + [(128, 0, 256)] * 4, epilogue=epi))
    assert a.group.launch_key == b.group.launch_key and "fused in its store" in a.group.line
    assert plan_for(_group([(128, 16, 256)] * 64, ab_align=8)).group.launch_key != a.group.launch_key
    assert pyblasgemm.get_plan_cache().info()["by_kind"].get("plan", 0) == 0
    dq = EpilogueSpec(None, None, 0, False, 0, "bfloat16")
    c = plan_for(_group([(128, 16, 256)] * 64, "i8", epilogue=dq), "tensorcore")
    assert c.group.kind == "one launch" and c.group.code


def test_a_grouped_launch_takes_the_small_tile_when_its_groups_average_few_rows():
    """The tile follows the groups' mean rows (the kernel's n; all the host knows with the sizes
    on the device): 64-wide n tiles up to SMALL_GROUP_ROWS, the 128 x 128 tile above; each
    tile is its own launch class."""
    from pyblasgemm.kernels.grouped import GROUPED_CONFIGS, GROUPED_SMALL_CONFIGS, SMALL_GROUP_ROWS

    small = plan_for(_group([(1024, 0, 1024), (1024, 1, 1024), (1024, 127, 1024), (1024, 2, 1024)]))
    assert small.config == GROUPED_SMALL_CONFIGS["f16"] and small.config.name in small.group.line
    edge = plan_for(_group([(1024, SMALL_GROUP_ROWS, 1024)] * 8))
    large = plan_for(_group([(1024, SMALL_GROUP_ROWS + 1, 1024)] * 8))
    assert edge.config == GROUPED_SMALL_CONFIGS["f16"] and large.config == GROUPED_CONFIGS["f16"]
    assert small.group.launch_key == edge.group.launch_key != large.group.launch_key
    int8 = plan_for(_group([(128, 16, 256)] * 64, "i8"), "tensorcore")
    assert int8.config == GROUPED_CONFIGS["s8"]          # (no small tile for int8)


def test_device_sizes_on_sm90_take_the_hopper_walk_by_the_groups_mean_rows():
    """The expert form with its sizes on the GPU runs the Hopper grouped walk on sm_90 (the
    plan's config is a Hopper grouped tile, explain() names the walk and lists the mma.sync walk
    beside it); its tile follows the groups' mean rows; host sizes, another arch, misaligned
    operands, int8, more than SM90_MAX_GROUPS groups and a dequantizing store keep the mma.sync
    walk, each with its reason in explain()."""
    from pyblasgemm.kernels.config import SM90_GROUPED_CONFIGS, SM90_MAX_GROUPS
    from pyblasgemm.kernels.grouped import GROUPED_SMALL_CONFIGS, HOPPER_MEDIUM_ROWS, HOPPER_SMALL_ROWS

    tiles = SM90_GROUPED_CONFIGS["f16"]
    small = plan_for(_group([(1024, 31, 1024)] * 64, device_sizes=True))
    assert small.config == tiles["small"] and small.group.kind == "one launch" and small.backend == "tensorcore"
    assert "Hopper grouped walk" in small.group.line and tiles["small"].name in small.group.line
    text = small.explain()
    assert "Hopper grouped walk (wgmma + TMA)" in text and "the Hopper walk runs this group" in text
    medium = plan_for(_group([(2048, HOPPER_SMALL_ROWS + 1, 2048)] * 32, device_sizes=True))
    # 8 large experts (the H200 bench's layer): the loop would read the sizes back first
    large = plan_for(_group([(4096, 2154, 4096)] * 8, device_sizes=True))
    assert large.group.kind == "one launch" and HOPPER_MEDIUM_ROWS < 2154
    assert plan_for(_group([(4096, 2154, 4096)] * 8)).group.kind == "loop"       # host sizes: the loop
    assert medium.config == tiles["medium"] and large.config == tiles["large"]
    assert len({small.group.launch_key, medium.group.launch_key, large.group.launch_key}) == 3
    for why, plan in (("host", plan_for(_group([(1024, 31, 1024)] * 64))),
                      ("16-byte aligned", plan_for(_group([(1024, 31, 1024)] * 64, ab_align=8, device_sizes=True))),
                      ("groups >", plan_for(_group([(128, 3, 128)] * (SM90_MAX_GROUPS + 1), device_sizes=True))),
                      ("float16 and bfloat16", plan_for(_group([(128, 16, 256)] * 64, "i8", device_sizes=True),
                                                        "tensorcore"))):
        assert plan.config.family == "sm80" and "Hopper grouped walk" not in plan.group.line, why
        assert why in plan.explain(), (why, plan.explain())
    assert plan_for(_group([(1024, 31, 1024)] * 64)).config == GROUPED_SMALL_CONFIGS["f16"]
    ampere = plan_for(_group([(1024, 31, 1024)] * 64, device_sizes=True), arch=FAMILIES["sm_80"])
    assert ampere.config.family == "sm80" and "runs on sm_90" in ampere.explain()
    dq = EpilogueSpec(None, None, 0, False, 0, "bfloat16")
    q = plan_for(_group([(128, 16, 256)] * 64, "i8", epilogue=dq, device_sizes=True), "tensorcore")
    assert q.config.family == "sm80"


def test_every_activation_plans_a_route():
    for name in ACTIVATIONS:
        p = _plan(2048, 2048, 2048, activation=name, bias="m")
        assert p.epilogue.kind in ("ours", "cublaslt", "unfused") and p.epilogue.line


def test_the_fusion_guide_quotes_the_grouped_public_call_run():
    """docs/guide/fusion.rst's public-call ratios and host times are the H200 run's
    (bench/results/grouped_public_h200_2026-11-29_1401e78.json), layer by layer."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = json.loads((root / "bench/results/grouped_public_h200_2026-11-29_1401e78.json").read_text())
    assert run["device"]["name"] == "NVIDIA H200" and run["git_sha"] == "1401e78"
    rows = {r["experts"]: r for r in run["rows"]}
    guide = " ".join((root / "docs/guide/fusion.rst").read_text().split())
    torch_r = [rows[e]["ratio_vs_grouped_mm"]["pyblasgemm torch"] for e in (64, 128, 32)]
    cupy_r = [rows[e]["ratio_vs_grouped_mm"]["pyblasgemm cupy"] for e in (64, 128, 32)]
    assert (f"from CUDA tensors {torch_r[0]:.2f}x on the 64-expert layer, {torch_r[1]:.2f}x on the 128-expert "
            f"one and {torch_r[2]:.2f}x on 32 experts") in guide
    assert f"from CuPy arrays {cupy_r[0]:.2f}x, {cupy_r[1]:.2f}x and {cupy_r[2]:.2f}x" in guide
    readme = " ".join((root / "README.md").read_text().split())
    assert (f"from CUDA tensors {torch_r[0]:.2f}x `torch._grouped_mm` on 64 experts of at most 64 tokens and "
            f"{torch_r[1]:.2f}x on 128") in readme
    host = rows[64]["host_us"]
    assert (f"{host['pyblasgemm torch']:.0f} µs of host time a call, against {host['torch._grouped_mm']:.0f} µs "
            f"for ``_grouped_mm`` and {host['pyblasgemm torch (out=)']:.0f} µs for the converting call") in guide
