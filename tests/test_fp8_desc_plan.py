"""Float8 products in the description (docs/design/fp8-in-the-plan.md, step 1) on the host: the
description of each scale layout, transpose and output type (the swap to c^T = b^T a^T for a
row-major result), and one key per distinct call."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from pyblasgemm.desc import describe_fp8

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


@pytest.mark.parametrize("out, size", [("float32", 4), ("float16", 2), ("bfloat16", 2),
                                       (np.dtype(np.float16), 2), (np.dtype(ml_dtypes.bfloat16), 2)])
def test_each_output_type_is_the_epilogue_s_and_counts_in_the_alignment(out, size):
    d = _desc(m=16, n=4, k=64, target="row", out=out, ldc=4, pointers=(256, 512, 1024))
    assert d.epilogue.dequantize == np.dtype(out).name if not isinstance(out, str) else out
    assert d.row.c_dtype == np.float32 and d.compute == "fp32"    # accumulated in float32
    assert d.align == 4 * size and d.ptr_align == 16                  # ldc = 4 elements of the result type


def test_the_rows_are_the_kernels_kinds_and_stay_out_of_gemm_s_tables():
    from pyblasgemm._types import ROW_BY_DTYPE, ROW_BY_DTYPES, TYPE_ROWS
    from pyblasgemm.kinds import FP8_KINDS

    rows = {p: r for p, r in TYPE_ROWS.items() if r.b_dtype is not None}
    assert {(r.ab_dtype.name, r.b_dtype.name): p for p, r in rows.items()} == FP8_KINDS
    assert all(r not in ROW_BY_DTYPE.values() and r not in ROW_BY_DTYPES.values() for r in rows.values())


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
