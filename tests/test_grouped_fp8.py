"""Grouped float8 products (grouped_matmul on float8_e4m3fn / float8_e5m2 with scales): each
group's result against the exact scaled product of its dequantized operands (float64, from
exact block sums: pyblasgemm.fp8.scaled_product), in the three forms, on the host, through
PyTorch and JAX arrays, and on the GPU (CuPy arrays and CUDA tensors); bad arguments refused
before any group runs."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.fp8 import scaled_product

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
gpu = pytest.mark.gpu
TYPES = [(E4M3, E4M3), (E5M2, E4M3), (E5M2, E5M2)]


def _draw(rng, shape, dtype):
    """float8 values spread over magnitudes (so a dropped scale or a wrong group shows)."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-3, 4, shape))).astype(dtype)


def _dev(cp, x):
    """A CuPy copy of a float8 NumPy array (CuPy takes float8 as a view of its bytes)."""
    return cp.asarray(np.ascontiguousarray(x).view(np.uint8)).view(x.dtype)


def _reference(a, b, ends, sa, sb, out_dtype=np.float32):
    """The expert form's result, group by group, from the exact scaled products."""
    rows, start = [], 0
    for g, end in enumerate(ends):
        s_a = sa[start:end] if np.ndim(sa) == 1 and np.shape(sa)[0] == a.shape[0] else sa
        s_b = sb[g] if np.ndim(sb) >= 1 and np.shape(sb)[0] == b.shape[0] and np.shape(sb) != (1,) else sb
        rows.append(scaled_product(a[start:end], b[g], np.asarray(s_a, np.float32), np.asarray(s_b, np.float32)))
        start = end
    return np.concatenate(rows).astype(out_dtype) if rows else np.zeros((0, b.shape[2]), out_dtype)


@pytest.mark.parametrize("ta, tb", TYPES)
@pytest.mark.parametrize("ends", [[2, 2, 7], [0, 0, 7], [7, 7, 7], [1, 4, 7]])
@pytest.mark.parametrize("scales", ["token-column", "tensor-group", "tensor-tensor"])
def test_expert_form_is_each_groups_exact_scaled_product(ta, tb, ends, scales):
    rng = np.random.default_rng(len(ends) + ends[0])
    a, b = _draw(rng, (7, 200), ta), _draw(rng, (3, 200, 33), tb)
    sa = {"token-column": rng.uniform(0.25, 4, 7).astype(np.float32)}.get(scales, np.float32(0.5))
    sb = {"token-column": rng.uniform(0.25, 4, (3, 33)).astype(np.float32),
          "tensor-group": np.array([1, 2, 0.25], np.float32)}.get(scales, np.float32(3))
    got = pyblasgemm.grouped_matmul(a, b, offsets=ends, scale_a=sa, scale_b=sb)
    assert got.dtype == np.float32 and got.shape == (7, 33)
    assert np.array_equal(got, _reference(a, b, ends, sa, sb))


def test_result_types_bias_and_activation_follow_the_float8_product():
    rng = np.random.default_rng(5)
    a, b = _draw(rng, (6, 64), E4M3), _draw(rng, (2, 64, 16), E4M3)
    sa, sb = rng.uniform(0.5, 2, 6).astype(np.float32), np.float32(1)
    bias = rng.standard_normal((2, 16)).astype(ml_dtypes.bfloat16)
    got = pyblasgemm.grouped_matmul(a, b, offsets=[4, 6], scale_a=sa, scale_b=sb, bias=bias,
                                    activation="relu", dtype=ml_dtypes.bfloat16)
    want = np.concatenate([pyblasgemm.matmul(a[:4], b[0], scale_a=sa[:4], scale_b=sb, bias=bias[0],
                                             activation="relu", dtype=ml_dtypes.bfloat16),
                           pyblasgemm.matmul(a[4:], b[1], scale_a=sa[4:], scale_b=sb, bias=bias[1],
                                             activation="relu", dtype=ml_dtypes.bfloat16)])
    assert got.dtype == ml_dtypes.bfloat16 and np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_list_form_and_masked_layout():
    rng = np.random.default_rng(6)
    a = [_draw(rng, (3, 40), E4M3), _draw(rng, (5, 17), E5M2), _draw(rng, (0, 8), E4M3)]
    b = [_draw(rng, (40, 9), E4M3), _draw(rng, (17, 4), E4M3), _draw(rng, (8, 2), E4M3)]
    sa = [np.float32(2), rng.uniform(1, 2, 5).astype(np.float32), np.float32(1)]
    sb = [rng.uniform(1, 2, 9).astype(np.float32), np.float32(0.5), np.float32(1)]
    got = pyblasgemm.grouped_matmul(a, b, scale_a=sa, scale_b=sb)
    for g in range(3):
        assert np.array_equal(got[g], scaled_product(a[g], b[g], sa[g], sb[g]).astype(np.float32))
    x = _draw(rng, (3, 4, 40), E4M3)
    w = _draw(rng, (3, 40, 8), E4M3)
    out = np.full((3, 4, 8), -7, np.float32)
    sx = rng.uniform(1, 2, (3, 4)).astype(np.float32)
    got = pyblasgemm.grouped_matmul(x, w, masked_m=[1, 0, 4], scale_a=sx, scale_b=np.float32(1), out=out)
    assert got is out
    for g, rows in enumerate([1, 0, 4]):
        assert np.array_equal(out[g, :rows], scaled_product(x[g, :rows], w[g], sx[g, :rows], np.float32(1))
                              .astype(np.float32))
        assert (out[g, rows:] == -7).all()          # rows past a count are not written


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(scale_a=np.float32(1)), ValueError, "need both scale_a and scale_b"),
    (dict(), ValueError, "need scale_a and scale_b"),
    (dict(scale_a=np.ones(6, np.float32), scale_b=np.float32(1)), ValueError, r"scale_a has shape \(6,\)"),
    (dict(scale_a=np.float32(1), scale_b=np.ones((2, 15), np.float32)), ValueError, r"scale_b has shape \(2, 15\)"),
    (dict(scale_a=np.float32(1), scale_b=np.ones((2, 16), np.float64)), TypeError, "float32"),
    (dict(scale_a=np.float32(1), scale_b=np.float32(1), dtype=np.int32), TypeError, "not int32"),
    (dict(scale_a=np.float32(1), scale_b=np.float32(1), compute="tf32"), ValueError, "compute='tf32'"),
    (dict(scale_a=np.float32(1), scale_b=np.float32(1), bias=np.ones((2, 3), np.float32)), ValueError,
     r"bias has shape \(2, 3\)"),
    (dict(scale_a=np.float32(1), scale_b=np.float32(1), out=np.full((6, 16), 5, np.float32)), ValueError,
     "out has shape"),
])
def test_bad_arguments_are_refused_before_any_group_runs(kwargs, error, match):
    rng = np.random.default_rng(7)
    a, b = _draw(rng, (7, 32), E4M3), _draw(rng, (2, 32, 16), E4M3)
    kwargs = dict(kwargs)
    out = kwargs.pop("out", np.full((7, 16), 5, np.float32))
    with pytest.raises(error, match=match):
        pyblasgemm.grouped_matmul(a, b, offsets=[3, 7], out=out, **kwargs)
    if out.dtype == np.float32:
        assert (out == 5).all()                     # nothing half-written


def test_a_bad_scale_of_a_late_group_is_refused_before_the_first_group_runs():
    rng = np.random.default_rng(8)
    a = [_draw(rng, (2, 16), E4M3), _draw(rng, (3, 16), E4M3)]
    b = [_draw(rng, (16, 4), E4M3), _draw(rng, (16, 4), E4M3)]
    out = [np.full((2, 4), 5, np.float32), np.full((3, 4), 5, np.float32)]
    with pytest.raises(ValueError, match=r"scale_a\[1\] has shape \(2,\)"):
        pyblasgemm.grouped_matmul(a, b, out=out, scale_a=[np.float32(1), np.ones(2, np.float32)],
                                  scale_b=[np.float32(1), np.float32(1)])
    assert (out[0] == 5).all() and (out[1] == 5).all()


def test_host_float8_groups_are_batch_invariant():
    """The host's float8 product is exact block sums per element: invariant=True holds (the
    GPU refuses it, see test_gpu_...)."""
    rng = np.random.default_rng(9)
    a, b = _draw(rng, (9, 300), E4M3), _draw(rng, (2, 300, 8), E4M3)
    s = np.float32(1)
    whole = pyblasgemm.grouped_matmul(a, b, offsets=[4, 9], scale_a=s, scale_b=s, invariant=True)
    assert np.array_equal(pyblasgemm.grouped_matmul(a[4:5], b[1:], offsets=[1], scale_a=s, scale_b=s,
                                                    invariant=True), whole[4:5])


def test_torch_and_jax_arrays_answer_in_their_type():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    a, b = _draw(rng, (7, 64), E4M3), _draw(rng, (3, 64, 16), E4M3)
    sa, sb = rng.uniform(1, 2, 7).astype(np.float32), rng.uniform(1, 2, (3, 16)).astype(np.float32)
    want = _reference(a, b, [2, 2, 7], sa, sb)
    ta = torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    tb = torch.from_numpy(b.view(np.uint8)).view(torch.float8_e4m3fn)
    got = pyblasgemm.grouped_matmul(ta, tb, offsets=torch.tensor([2, 2, 7]), scale_a=torch.from_numpy(sa),
                                    scale_b=torch.from_numpy(sb))
    assert isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), want)
    jnp = pytest.importorskip("jax.numpy")
    got = pyblasgemm.grouped_matmul(jnp.asarray(a), jnp.asarray(b), group_sizes=[2, 0, 5],
                                    scale_a=jnp.asarray(sa), scale_b=jnp.asarray(sb))
    assert type(got).__module__.startswith("jax") and np.array_equal(np.asarray(got), want)


def test_a_grouped_float8_description_takes_the_grouped_route():
    """A grouped description of a float8 pair is planned as a group (one launch of the grouped
    kernel's float8 kind, or the loop), not as one float8 product (whose plan reads the
    product's scale layouts: on the H200 that raised IndexError before the fix)."""
    from pyblasgemm._types import TYPE_ROWS
    from pyblasgemm.desc import GroupSpec, describe
    from pyblasgemm.epilogue import EpilogueSpec
    from pyblasgemm.planner import plan_for
    from pyblasgemm.planner.arch import FAMILIES

    sizes = tuple((96, rows, 256) for rows in (0, 1, 16, 0, 47))
    for kind in ("e4m3", "e5m2_e4m3"):
        desc = describe("grouped_matmul", TYPE_ROWS[kind], "fp32", "N", "N", 96, 47, 256, 96, 256, 96, 5, 0, 0,
                        0, "cupy", 0, (16,), 1.0, 0.0, epilogue=EpilogueSpec(None, None, 0, False, 0, "float32"),
                        group=GroupSpec("experts", sizes, 16, 16, ""))
        plan = plan_for(desc, arch=FAMILIES["sm_90"])
        assert plan.group is not None and plan.group.kind == "one launch", plan.reason
        assert f"grouped_{GROUPED_TILE}" in plan.group.line


GROUPED_TILE = "128x128x64_w2x4_s4_g8"      # the s8 kind's grouped tile, which float8 shares


# ---------------------------------------------------------------------------------------------
# the GPU


@gpu
@pytest.mark.parametrize("ta, tb", TYPES)
def test_gpu_expert_and_masked_forms_match_the_exact_products(ta, tb):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(11)
    groups, n, k = 5, 96, 256
    ends = [0, 1, 17, 17, 64]                          # empty, 1, 16, empty, 47 tokens
    a, b = _draw(rng, (64, k), ta), _draw(rng, (groups, k, n), tb)
    sa, sb = rng.uniform(0.25, 4, 64).astype(np.float32), rng.uniform(0.25, 4, (groups, n)).astype(np.float32)
    want = _reference(a, b, ends, sa, sb)
    scale = _reference(np.abs(a.astype(np.float32)).astype(ta), np.abs(b.astype(np.float32)).astype(tb), ends,
                       sa, sb)
    out = cp.full((64, n), np.nan, np.float32)          # poisoned: every row must be written
    for offsets in (ends, cp.asarray(ends, dtype=cp.int32)):
        got = pyblasgemm.grouped_matmul(_dev(cp, a), _dev(cp, b), offsets=offsets, scale_a=cp.asarray(sa),
                                        scale_b=cp.asarray(sb), out=out)
        err = np.abs(cp.asnumpy(got) - want) / np.maximum(scale, 1e-30)
        assert not np.isnan(cp.asnumpy(got)).any() and float(err.max()) < 2e-6
    x = _dev(cp, _draw(rng, (groups, 16, k), ta))
    poisoned = cp.full((groups, 16, n), -3, np.float32)
    counts = [16, 0, 3, 1, 9]
    pyblasgemm.grouped_matmul(x, _dev(cp, b), masked_m=cp.asarray(counts, dtype=cp.int32),
                              scale_a=cp.asarray(np.float32(2)), scale_b=cp.asarray(sb), out=poisoned)
    got, xh = cp.asnumpy(poisoned), cp.asnumpy(x.view(np.uint8)).view(ta)
    for g, rows in enumerate(counts):
        ref = scaled_product(xh[g, :rows], b[g], np.float32(2), sb[g])
        mag = scaled_product(np.abs(xh[g, :rows].astype(np.float32)).astype(ta),
                             np.abs(b[g].astype(np.float32)).astype(tb), np.float32(2), sb[g])
        assert float((np.abs(got[g, :rows] - ref) / np.maximum(mag, 1e-30)).max(initial=0)) < 2e-6
        assert (got[g, rows:] == -3).all()


@gpu
def test_gpu_cuda_tensors_answer_as_tensors_and_invariant_is_refused():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    a, b = _draw(rng, (40, 128), E4M3), _draw(rng, (4, 128, 64), E4M3)
    sa, sb = rng.uniform(1, 2, 40).astype(np.float32), rng.uniform(1, 2, (4, 64)).astype(np.float32)
    ta = torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn).cuda()
    tb = torch.from_numpy(b.view(np.uint8)).view(torch.float8_e4m3fn).cuda()
    offs = torch.tensor([10, 10, 33, 40], dtype=torch.int32, device="cuda")
    got = pyblasgemm.grouped_matmul(ta, tb, offsets=offs, scale_a=torch.from_numpy(sa).cuda(),
                                    scale_b=torch.from_numpy(sb).cuda(), dtype=torch.bfloat16)
    assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.bfloat16
    want = _reference(a, b, [10, 10, 33, 40], sa, sb)
    assert float((got.float().cpu().numpy() - want).__abs__().max()) <= float(np.abs(want).max()) * 2**-7
    with pytest.raises(NotImplementedError, match="invariant=True is not available for float8 groups"):
        pyblasgemm.grouped_matmul(ta, tb, offsets=offs, scale_a=torch.from_numpy(sa).cuda(),
                                  scale_b=torch.from_numpy(sb).cuda(), invariant=True)
