"""Float8 products in the description and the plan (docs/design/fp8-in-the-plan.md, steps 1-2) on
the host: the description of each scale layout, transpose and output type (the swap to
c^T = b^T a^T for a row-major result), one key per distinct call, the planner's float8 route
(pyblasgemm/planner/fp8.py) against the rules as they stood in kernels/fp8.py before the move
over a grid of every input the rules read (digests of their outcomes, recorded while a frozen
copy of the old rules, 2ff281c's, agreed with the moved ones field for field), and ``plan_for``
with ``explain()`` on FAMILIES['sm_90'] / ['sm_89']."""
from __future__ import annotations

import hashlib
import itertools
import random

import ml_dtypes
import numpy as np
import pytest

from pyblasgemm.desc import describe_fp8
from pyblasgemm.kernels import fp8 as gpu_fp8
from pyblasgemm.planner import fp8 as planner_fp8
from pyblasgemm.planner import clear_plan_cache, plan_for
from pyblasgemm.planner.arch import FAMILIES

E4, E5 = "float8_e4m3fn", "float8_e5m2"
V13 = 130100
SCALES_A, SCALES_B = ("tensor", "rows", "blocks"), ("tensor", "cols", "blocks")


def _layout(order, rows, cols, pad=0):
    """``(order, ld)`` of an (rows x cols) operand held row- or column-major with ``pad`` spare elements."""
    return (order, cols + pad) if order == "row" else (order, rows + pad)


def _desc(m=16, n=4096, k=4096, a=E4, b=E4, oa="row", ob="col", target="row", layouts=("tensor", "tensor"),
          out="bfloat16", activation=None, bias_axis=None, pre=False, pointers=(256,), ldc=None):
    ldc = ldc if ldc is not None else (n if target == "row" else m)
    return describe_fp8("t", a, b, _layout(oa, m, k), _layout(ob, k, n), target, m, n, k, ldc, layouts, out,
                        activation, bias_axis, pre, "cupy", 0, pointers, 1.0, 0.0)


# ---- step 1: the description --------------------------------------------------------------------

@pytest.mark.parametrize("sa, sb", list(itertools.product(SCALES_A, SCALES_B)))
@pytest.mark.parametrize("target", ["row", "col"])
def test_each_scale_layout_is_described_on_its_side(sa, sb, target):
    d = _desc(layouts=(sa, sb), target=target)
    # the described m side is the call's a for a column-major result, b for a row-major one (swap)
    mode_a = {"tensor": "tensor", "rows": "vector", "blocks": "a_blocks"}[sa]
    mode_b = {"tensor": "tensor", "cols": "vector", "blocks": "b_blocks"}[sb]
    sides = (mode_b, mode_a) if target == "row" else (mode_a, mode_b)
    if "blocks" in (sa, sb):        # the mainloop's, the store scales nothing
        assert d.block_scales == sides and d.epilogue.scales == ()
    else:
        assert d.block_scales == "" and d.epilogue.scales == sides
    assert d.swap == (target == "row")
    assert planner_fp8.call_terms(d)["layouts"] == (sa, sb)


@pytest.mark.parametrize("oa, ob", list(itertools.product(("row", "col"), repeat=2)))
@pytest.mark.parametrize("target", ["row", "col"])
def test_each_transpose_and_the_swap(oa, ob, target):
    m, n, k = 24, 40, 64
    d = _desc(m, n, k, E4, E5, oa, ob, target, bias_axis="cols")
    if target == "row":     # c^T (n x m) = b^T a^T: A is b, its dtype first, its rows c's columns
        assert (d.prefix, d.m, d.n) == ("e5m2_e4m3", n, m)
        assert d.transa == ("T" if ob == "col" else "N") and d.transb == ("N" if oa == "row" else "T")
        assert (d.lda, d.ldb) == (_layout(ob, k, n)[1], _layout(oa, m, k)[1]) and d.epilogue.bias == "m"
    else:
        assert (d.prefix, d.m, d.n) == ("e4m3_e5m2", m, n)
        assert d.transa == ("T" if oa == "row" else "N") and d.transb == ("N" if ob == "col" else "T")
        assert (d.lda, d.ldb) == (_layout(oa, m, k)[1], _layout(ob, k, n)[1]) and d.epilogue.bias == "n"
    t = planner_fp8.call_terms(d)
    assert (t["la"], t["lb"], t["target"], t["bias_axis"]) == (_layout(oa, m, k), _layout(ob, k, n), target, "cols")
    assert (t["a_dtype"], t["b_dtype"], t["m"], t["n"]) == (E4, E5, m, n)


@pytest.mark.parametrize("out, size", [("float32", 4), ("float16", 2), ("bfloat16", 2),
                                       (np.dtype(np.float16), 2), (np.dtype(ml_dtypes.bfloat16), 2)])
def test_each_output_type_is_the_epilogue_s_and_counts_in_the_alignment(out, size):
    d = _desc(m=16, n=4, k=64, target="row", out=out, ldc=4, pointers=(256, 512, 1024))
    assert d.epilogue.dequantize == np.dtype(out).name if not isinstance(out, str) else out
    assert d.row.c_dtype == np.float32 and d.compute == "fp32"    # accumulated in float32
    assert d.align == 4 * size and d.ptr_align == 16                  # ldc = 4 elements of the result type


def test_the_rows_are_the_kernels_kinds_and_stay_out_of_gemm_s_tables():
    from pyblasgemm._types import BLAS_ROWS, ROW_BY_DTYPE, ROW_BY_DTYPES, TYPE_ROWS
    from pyblasgemm.kinds import FP8_KINDS

    rows = {p: r for p, r in TYPE_ROWS.items() if r.b_dtype is not None}
    assert {(r.ab_dtype.name, r.b_dtype.name): p for p, r in rows.items()} == FP8_KINDS
    assert all(r not in ROW_BY_DTYPE.values() and r not in ROW_BY_DTYPES.values() for r in rows.values())
    assert set(BLAS_ROWS) == set(TYPE_ROWS) - set(rows)      # (the BLAS routines: one type each)


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="float8_e4m3fn or float8_e5m2 each; got float16 @ float8_e4m3fn"):
        _desc(a="float16")
    with pytest.raises(ValueError, match="scale_a layout 'cols' must be one of 'tensor', 'rows', 'blocks'"):
        _desc(layouts=("cols", "tensor"))
    with pytest.raises(ValueError, match="target='C' must be 'row'"):
        _desc(target="C")
    with pytest.raises(TypeError, match="result is float32, float16, bfloat16; got int8"):
        _desc(out="int8")


def _distinct_calls():
    """Calls that differ in one fact the plan may read each (shape, types, orders, result order,
    scales, output, epilogue, alignment)."""
    base = dict(m=64, n=96, k=128, a=E4, b=E4, oa="row", ob="col", target="row", layouts=("tensor", "tensor"),
                out="bfloat16", activation=None, bias_axis=None, pre=False, pointers=(256,))
    variants = dict(m=(1, 65), n=(1, 4096), k=(16, 130), a=(E5,), b=(E5,), oa=("col",), ob=("row",), target=("col",),
                    layouts=[(x, y) for x in SCALES_A for y in SCALES_B][1:], out=("float32", "float16"),
                    activation=("relu", "gelu_tanh"), bias_axis=("cols", "rows"), pre=(True,), pointers=((8,),))
    out = [base]
    for field, values in variants.items():
        out += [dict(base, **{field: v}) for v in values]
    return out


def test_one_key_per_distinct_call():
    cases = _distinct_calls()
    keys = {_desc(**c).key for c in cases}
    assert len(keys) == len(cases)
    # a result's order swaps the description: a call and its transpose are two keys, never one
    assert _desc(target="row").key != _desc(m=4096, n=16, oa="col", ob="row", target="col").key


# ---- step 2: the planner's float8 route against the rules as they stood --------------------------

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (65, 4096, 4096), (4096, 16, 4096),
          (4096, 4096, 4096), (512, 512, 512), (8192, 8192, 8192), (128, 256, 200), (96, 48, 4104)]
PAIRS = [(E4, E4), (E4, E5), (E5, E4), (E5, E5)]
OUTS = ["bfloat16", "float16", "float32"]
EPILOGUES = [(0, None, False), (0, None, False), (0, None, False), (1, "cols", False), (3, None, False),
             (3, "rows", True), (4, None, False), (0, "cols", False), (0, "rows", False), (2, "rows", False)]


def _outcome(fn):
    try:
        return fn()
    except Exception as e:              # the same refusals, word for word
        return (type(e).__name__, str(e))


def _grid():
    """Every product of the brief's grid (shapes, scale layout pairs, operand orders, result
    orders, cc, FAMILY, ROUTE, lt_version, aligned), the other inputs (types, output, epilogue,
    backend=, a padded ld) drawn for each from a seeded generator (not cycled: a cycle would
    lock to the inner loops' period)."""
    draw = random.Random(36)
    for (m, n, k), layouts, oa, ob, target, cc, family, route, ltv, aligned in itertools.product(
            SHAPES, list(itertools.product(SCALES_A, SCALES_B)), ("row", "col"), ("row", "col"), ("row", "col"),
            ((8, 9), (9, 0)), (None, "sm80", "sm90a"), (None, "ours", "cublaslt"), (None, V13), (True, False)):
        a_dtype, b_dtype = draw.choice(PAIRS)
        out = draw.choice(OUTS)
        act, axis, pre = draw.choice(EPILOGUES)
        backend = draw.choice((None, None, None, "auto", "tensorcore", "cublas"))
        pad = draw.choice((0, 0, 0, 16, 3))
        ldc = n if target == "row" else m
        yield (m, n, k, a_dtype, b_dtype, _layout(oa, m, k, pad), _layout(ob, k, n), target, ldc, layouts, out, act,
               axis, 132, cc), dict(lt_version=ltv, backend=backend, aligned=aligned, has_pre=pre), family, route


def _lt_grid():
    """The cases cuBLASLt may take (TN, aligned, cuBLASLt 13.1, nothing forced) over every shape,
    scale layout pair, result order, cc, FAMILY, operand types, output and epilogue: the decode
    rule, the block-scale rule and every refusal past the TN form."""
    for (m, n, k), layouts, target, cc, family, (a_dtype, b_dtype), out, (act, axis, pre) in itertools.product(
            SHAPES, list(itertools.product(SCALES_A, SCALES_B)), ("row", "col"), ((8, 9), (9, 0)),
            (None, "sm80", "sm90a"), PAIRS, OUTS, EPILOGUES):
        ldc = n if target == "row" else m
        yield (m, n, k, a_dtype, b_dtype, ("row", k), ("col", k), target, ldc, layouts, out, act, axis, 132,
               cc), dict(lt_version=V13, has_pre=pre), family, None


#: sha256 (first 16 hex digits) of ``repr((args, kw, outcome))`` over the two grids, per
#: ``FAMILY/ROUTE``: recorded at 2ff281c's rules, when kernels/fp8.py's frozen copy and the moved
#: planner gave the same outcome for every input (95,040 of them). A change of route, config,
#: EPI code, reason text or refusal changes the bucket's digest: re-record it only for a change
#: meant to move the plans, and say so in the commit.
PLAN_DIGESTS = {
    "None/None": "25b8633793f74076", "None/cublaslt": "ba0ca70c8baf8cb8", "None/ours": "aa289fccb5274205",
    "sm80/None": "893f498c15abbdc0", "sm80/cublaslt": "ad07dcf07a410f4d", "sm80/ours": "45581985abd45c06",
    "sm90a/None": "1cb18905ff49076f", "sm90a/cublaslt": "7fd6e66da3ebef7a", "sm90a/ours": "9a2db2d23d5fa12f",
}
#: the same for lt_refusal, choose_route and sm90_config over test_the_moved_functions_keep_their_results' cases
MOVED_DIGESTS = {(8, 9): "b6e470c76c52befe", (9, 0): "0bff45264c7c042d"}


def test_the_planner_makes_the_recorded_choices_for_every_input(monkeypatch):
    """planner.fp8.plan (the description planned by plan_fp8, read as the kernel's problem) gives the recorded outcome
    (swap, kind, transposes, sizes, leading dimensions, config, EPI code, bias axis, route and
    why, or the same exception) for every input of the grid: :data:`PLAN_DIGESTS`."""
    buckets, routes, checked = {}, set(), 0
    for args, kw, family, route in itertools.chain(_grid(), _lt_grid()):
        monkeypatch.setattr(gpu_fp8, "FAMILY", family)
        monkeypatch.setattr(gpu_fp8, "ROUTE", route)
        got = _outcome(lambda: tuple(planner_fp8.plan(*args, **kw)))
        checked += 1
        if isinstance(got[0], bool):        # a plan (not a refusal): its why
            routes.add(got[-1])
        buckets.setdefault(f"{family}/{route}", hashlib.sha256()).update(repr((args, kw, got)).encode())
    assert checked == 10 * 9 * 8 * 2 * 3 * 3 * 2 * 2 + 10 * 9 * 2 * 2 * 3 * 4 * 3 * 10
    digests = {key: h.hexdigest()[:16] for key, h in buckets.items()}
    moved = sorted(key for key in PLAN_DIGESTS if digests.get(key) != PLAN_DIGESTS[key])
    assert not moved, f"the float8 plans changed for FAMILY/ROUTE {moved}"
    assert {planner_fp8._LT_FASTER, planner_fp8._LT_BLOCKS_FASTER, planner_fp8._OURS_FOR_DECODE} <= routes


@pytest.mark.parametrize("cc", [(8, 9), (9, 0)])
def test_the_moved_functions_keep_their_results(cc, monkeypatch):
    """lt_refusal and sm90_config, and choose_route (under kernels.fp8.ROUTE), give the recorded answers (:data:`MOVED_DIGESTS`) for the cases
    tests/test_fp8_lt.py names."""
    h = hashlib.sha256()
    for la, lb, layouts, ltv, aligned in itertools.product(
            (("row", 4096), ("col", 16)), (("col", 4096), ("row", 64)), list(itertools.product(SCALES_A, SCALES_B)),
            (None, 120800, V13), (True, False)):
        h.update(repr(planner_fp8.lt_refusal(E4, E5, la, lb, "row", 4096, 4096, "bfloat16", layouts, 3, "cols", False,
                                         aligned, cc, ltv)).encode())
    refusals = (None, "cuBLASLt has no e5m2 x e5m2 FP8 GEMM")
    for route, backend, refusal, rows in itertools.product((None, "ours", "cublaslt", "cublas"),
                                                           (None, "auto", "cublas", "tensorcore"), refusals,
                                                           (None, 16, 65)):
        monkeypatch.setattr(gpu_fp8, "ROUTE", route)
        for layouts in (("tensor", "tensor"), ("blocks", "blocks")):
            h.update(repr(_outcome(lambda: planner_fp8.choose_route(refusal, layouts, backend, rows, gpu_fp8.ROUTE))).encode())
    monkeypatch.setattr(gpu_fp8, "ROUTE", None)
    for kind, (m, n, k) in itertools.product(("e4m3", "e5m2_e4m3"), SHAPES):
        h.update(repr(planner_fp8.sm90_config(kind, m, n, k, 132)).encode())
    assert h.hexdigest()[:16] == MOVED_DIGESTS[cc]


# ---- plan_for and explain() ------------------------------------------------------------------------

def test_plan_for_sends_a_float8_description_to_its_route_memoized_and_explained():
    clear_plan_cache()
    d = _desc(m=256, layouts=("rows", "cols"))
    p = plan_for(d, arch=FAMILIES["sm_90"], lt_version=V13)
    assert p.backend == "cublas" and p.config is None and p.reason == f"cublaslt: {planner_fp8._LT_FASTER}"
    assert plan_for(d, arch=FAMILIES["sm_90"], lt_version=V13) is p            # memoized
    text = p.explain()
    assert "plan: backend 'cublas'" in text and f"why: cublaslt: {planner_fp8._LT_FASTER}" in text
    assert "float8 scales vector x vector in the store, to bfloat16" in text
    assert p.candidates[0].config.family == "sm90a"                             # the fallback: ours
    q = plan_for(d, arch=FAMILIES["sm_90"], lt_version=None)                    # cuBLASLt not loaded
    assert q.backend == "tensorcore" and "could not be loaded" in q.explain() and q.config.family == "sm90a"
    assert q.epilogue.code == planner_fp8.plan(256, 4096, 4096, E4, E4, ("row", 4096), ("col", 4096), "row", 4096,
                                           ("rows", "cols"), "bfloat16", 0, None, 132, (9, 0)).epi
    assert plan_for(d, "tensorcore", arch=FAMILIES["sm_90"], lt_version=V13).reason == (
        "ours: forced by backend='tensorcore'")


def test_plan_for_keys_the_float8_settings(monkeypatch):
    """FAMILY and ROUTE (kernels.fp8's settings) are part of the memo key: setting one replans."""
    clear_plan_cache()
    d = _desc(m=16, layouts=("blocks", "blocks"))
    assert plan_for(d, arch=FAMILIES["sm_90"], lt_version=V13).config.family == "sm90a"     # block-scaled decode
    monkeypatch.setattr(gpu_fp8, "FAMILY", "sm80")
    assert plan_for(d, arch=FAMILIES["sm_90"], lt_version=V13).config.family == "sm80"
    monkeypatch.setattr(gpu_fp8, "ROUTE", "cublaslt")
    assert plan_for(d, arch=FAMILIES["sm_90"], lt_version=V13).backend == "cublas"


def test_plan_for_a_host_float8_description_is_the_host_s():
    d = describe_fp8("t", E4, E4, ("row", 64), ("col", 64), "row", 4, 8, 64, 8, ("tensor", "tensor"), "float32",
                     None, None, False, "numpy", -1, (16,), 1.0, 0.0)
    assert plan_for(d, lt_version=V13).backend == "host"


ROUTES_ON = [  # (family, shape m n k, call, expected backend, config family or None, words of why)
    ("sm_90", (4096, 4096, 4096), {}, "cublas", None, "1.20-1.35x our kernels"),
    ("sm_90", (16, 4096, 4096), {}, "tensorcore", "sm90a", "decode"),
    ("sm_90", (4096, 4096, 4096), dict(layouts=("blocks", "blocks")), "cublas", None, "block scales"),
    ("sm_90", (16, 4096, 4096), dict(layouts=("blocks", "blocks")), "tensorcore", "sm90a", "decode"),
    ("sm_90", (4096, 4096, 4096), dict(ob="row"), "tensorcore", "sm80", "TN form"),
    ("sm_90", (4096, 4096, 4096), dict(a=E5, b=E5), "tensorcore", "sm90a", "e5m2 x e5m2"),
    ("sm_89", (4096, 4096, 4096), {}, "cublas", None, "1.20-1.35x our kernels"),
    ("sm_89", (4096, 4096, 4096), dict(layouts=("rows", "cols")), "tensorcore", "sm80", "need sm_90"),
    ("sm_89", (16, 4096, 4096), {}, "tensorcore", "sm80", "decode"),
    ("sm_89", (4096, 4096, 4096), dict(layouts=("blocks", "blocks")), "tensorcore", "sm80", "128-block"),
]


@pytest.mark.parametrize("family, shape, call, backend, config_family, words", ROUTES_ON)
def test_the_planner_s_choices_on_hopper_and_ada(family, shape, call, backend, config_family, words):
    m, n, k = shape
    p = planner_fp8.plan_fp8(_desc(m, n, k, **call), FAMILIES[family], V13)
    assert p.backend == backend and words in p.reason, p.reason
    if config_family is not None:
        assert p.config.family == config_family
    else:
        assert p.config is None and p.candidates[0].backend == "tensorcore"
