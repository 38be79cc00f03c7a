"""The masked layout of ``grouped_matmul`` (DeepGEMM's ``m_grouped_*_masked``: ``a`` (groups,
max_m, k), ``b`` (groups, k, n), ``masked_m`` the valid rows of each group) on the host: every
group's valid rows have the bits of ``pyblasgemm.gemm`` on that slice (the reference every
backend is held to), the rows at and past ``masked_m[g]`` keep what ``out`` held, every edge
(counts 0 and max_m, one group, odd sizes, an empty layout), the fused epilogue and int8
dequantization, torch and JAX arrays, and every refusal, raised before any group is written."""
from __future__ import annotations

import numpy as np
import pytest

import pyblasgemm

POISON = -7.0


def _operands(rng, groups, max_m, k, n, dtype=np.float32):
    a = rng.standard_normal((groups, max_m, k)).astype(dtype)
    b = rng.standard_normal((groups, k, n)).astype(dtype)
    return a, b


def _reference(a, b, counts, out, **epilogue):
    """``out`` with each group's valid rows replaced by gemm's product of that slice."""
    want = out.copy()
    for g, c in enumerate(counts):
        if c:
            kw = {name: (v[g, :c] if name == "scale_a" else v[g]) for name, v in epilogue.items()
                  if name in ("bias", "scale_a", "scale_b") and v is not None}
            kw.update({name: v for name, v in epilogue.items() if name in ("activation", "dtype")})
            dtype = kw.pop("dtype", None)
            target = np.empty((c, b.shape[2]), want.dtype if dtype is None else dtype)
            want[g, :c] = pyblasgemm.gemm("N", "N", a[g, :c], b[g], target, **kw)
    return want


@pytest.mark.parametrize("groups,max_m,k,n,counts", [
    (3, 5, 4, 6, [0, 5, 2]),            # an empty group, a full one
    (1, 7, 5, 3, [7]),                  # one group, full
    (1, 7, 5, 3, [0]),                  # one group, empty
    (4, 33, 17, 9, [33, 1, 0, 32]),     # odd sizes
    (2, 1, 3, 2, [1, 0]),               # one-row blocks
    (5, 8, 1, 1, [8, 3, 0, 1, 8]),      # k = n = 1
])
def test_valid_rows_have_gemms_bits_and_the_rest_keep_out(groups, max_m, k, n, counts):
    rng = np.random.default_rng(groups * 100 + max_m)
    a, b = _operands(rng, groups, max_m, k, n)
    out = np.full((groups, max_m, n), POISON, np.float32)
    want = _reference(a, b, counts, out)
    got = pyblasgemm.grouped_matmul(a, b, masked_m=counts, out=out)
    assert got is out
    assert np.array_equal(got, want)
    for g, c in enumerate(counts):
        assert np.all(got[g, c:] == POISON)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int8])
def test_types_and_a_new_result(dtype):
    """Integer-valued operands: every product exact, so the result is checked against NumPy's
    float64 product too; the allocated result's rows past the counts are not looked at."""
    rng = np.random.default_rng(3)
    a = rng.integers(-3, 4, (3, 6, 8)).astype(dtype)
    b = rng.integers(-3, 4, (3, 8, 5)).astype(dtype)
    counts = np.array([6, 0, 4], np.int32)
    got = pyblasgemm.grouped_matmul(a, b, masked_m=counts)
    assert got.shape == (3, 6, 5)
    assert got.dtype == (np.int32 if dtype == np.int8 else dtype)
    for g, c in enumerate(counts):
        exact = a[g, :c].astype(np.float64) @ b[g].astype(np.float64)
        assert np.array_equal(got[g, :c].astype(np.float64), exact)


def test_bias_and_activation_are_gemms_epilogue():
    rng = np.random.default_rng(4)
    a, b = _operands(rng, 3, 9, 7, 5)
    bias = rng.standard_normal((3, 5)).astype(np.float32)
    counts = [9, 4, 0]
    for act in ("relu", "gelu", "silu"):
        out = np.full((3, 9, 5), POISON, np.float32)
        want = _reference(a, b, counts, out, bias=bias, activation=act)
        got = pyblasgemm.grouped_matmul(a, b, masked_m=counts, out=out, bias=bias, activation=act)
        assert np.array_equal(got, want), act


def test_int8_dequantized_with_row_and_column_scales():
    rng = np.random.default_rng(5)
    a = rng.integers(-127, 128, (2, 6, 16)).astype(np.int8)
    b = rng.integers(-127, 128, (2, 16, 4)).astype(np.int8)
    scale_a = rng.uniform(0.5, 2, (2, 6)).astype(np.float32)
    scale_b = rng.uniform(0.5, 2, (2, 4)).astype(np.float32)
    out = np.full((2, 6, 4), POISON, np.float32)
    want = _reference(a, b, [3, 6], out, scale_a=scale_a, scale_b=scale_b)
    got = pyblasgemm.grouped_matmul(a, b, masked_m=[3, 6], out=out, scale_a=scale_a, scale_b=scale_b)
    assert np.array_equal(got, want)
    assert np.all(got[0, 3:] == POISON)


def test_same_bits_as_the_contiguous_form_on_the_packed_rows():
    """The layouts are two views of one problem: the masked call and the contiguous call on
    the valid rows packed expert after expert give the same bits."""
    rng = np.random.default_rng(6)
    a, b = _operands(rng, 4, 10, 12, 6)
    counts = [10, 0, 3, 7]
    masked = pyblasgemm.grouped_matmul(a, b, masked_m=counts)
    packed = np.concatenate([a[g, :c] for g, c in enumerate(counts)])
    contiguous = pyblasgemm.grouped_matmul(packed, b, offsets=np.cumsum(counts))
    assert np.array_equal(np.concatenate([masked[g, :c] for g, c in enumerate(counts)]), contiguous)


def test_expected_m_changes_no_bits_and_invariant_rows_are_gemms_alone():
    rng = np.random.default_rng(7)
    a, b = _operands(rng, 3, 8, 6, 4)
    counts = [8, 2, 5]
    base = pyblasgemm.grouped_matmul(a, b, masked_m=counts, out=np.zeros((3, 8, 4), np.float32))
    for kw in (dict(expected_m=0), dict(expected_m=8)):
        got = pyblasgemm.grouped_matmul(a, b, masked_m=counts, out=np.zeros((3, 8, 4), np.float32), **kw)
        assert np.array_equal(got, base), kw
    got = pyblasgemm.grouped_matmul(a, b, masked_m=counts, invariant=True)
    for g, c in enumerate(counts):
        for r in range(c):      # each row has the bits gemm gives it alone
            alone = pyblasgemm.gemm("N", "N", a[g, r:r + 1], b[g], np.empty((1, 4), np.float32), invariant=True)
            assert np.array_equal(got[g, r:r + 1], alone), (g, r)


def test_empty_layouts():
    assert pyblasgemm.grouped_matmul(np.ones((0, 4, 3), np.float32), np.ones((0, 3, 2), np.float32),
                                     masked_m=[]).shape == (0, 4, 2)
    out = np.full((2, 0, 2), POISON, np.float32)
    assert pyblasgemm.grouped_matmul(np.ones((2, 0, 3), np.float32), np.ones((2, 3, 2), np.float32),
                                     masked_m=[0, 0], out=out) is out
    got = pyblasgemm.grouped_matmul(np.ones((2, 3, 0), np.float32), np.ones((2, 0, 2), np.float32),
                                    masked_m=[3, 1], out=np.full((2, 3, 2), POISON, np.float32))
    assert np.all(got[0] == 0) and np.all(got[1, :1] == 0) and np.all(got[1, 1:] == POISON)


def test_torch_and_jax_arrays_answer_in_their_type():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    a, b = _operands(rng, 3, 5, 4, 2)
    counts = [5, 1, 0]
    want = pyblasgemm.grouped_matmul(a, b, masked_m=counts, out=np.zeros((3, 5, 2), np.float32))
    out = torch.zeros(3, 5, 2)
    got = pyblasgemm.grouped_matmul(torch.from_numpy(a), torch.from_numpy(b),
                                    masked_m=torch.tensor(counts, dtype=torch.int32), out=out)
    assert got is out and np.array_equal(out.numpy(), want)
    jnp = pytest.importorskip("jax.numpy")
    got = pyblasgemm.grouped_matmul(jnp.asarray(a), jnp.asarray(b), masked_m=jnp.asarray(counts))
    assert type(got).__module__.startswith("jax")
    for g, c in enumerate(counts):
        assert np.array_equal(np.asarray(got)[g, :c], want[g, :c])


def _refused(exc, match, **kw):
    """The call raises ``exc`` naming ``match``, and ``out`` (poisoned) is untouched: every
    check comes before any group runs."""
    rng = np.random.default_rng(9)
    a, b = _operands(rng, 3, 4, 5, 2)
    args = dict(a=a, b=b, masked_m=[4, 2, 1], out=np.full((3, 4, 2), POISON, np.float32))
    poisoned = args["out"]
    args.update(kw)
    with pytest.raises(exc, match=match):
        pyblasgemm.grouped_matmul(args.pop("a"), args.pop("b"), **args)
    assert np.all(poisoned == POISON)


@pytest.mark.parametrize("exc,match,kw", [
    (ValueError, r"masked_m\[2\]=5 is above max_m=4 \(a.shape\[1\]\)", dict(masked_m=[4, 2, 5])),
    (ValueError, r"masked_m\[1\]=-1 is below 0", dict(masked_m=np.array([4, -1, 0]))),
    (ValueError, r"masked_m has 2 entries; b holds 3 groups", dict(masked_m=[1, 1])),
    (TypeError, r"masked_m\[0\]=1.5 is not an int", dict(masked_m=[1.5, 1, 1])),
    (TypeError, r"masked_m\[0\]=True is not an int", dict(masked_m=[True, 1, 1])),
    (TypeError, r"masked_m must be a sequence of ints", dict(masked_m=3)),
    (ValueError, r"expected_m=5 is outside \[0, max_m=4\]", dict(expected_m=5)),
    (ValueError, r"expected_m=-1 is outside", dict(expected_m=-1)),
    (TypeError, r"expected_m=2.0 is not an int", dict(expected_m=2.0)),
    (TypeError, r"give masked_m= \(the masked layout\) or offsets=", dict(offsets=[1, 2, 3])),
    (TypeError, r"give masked_m= \(the masked layout\) or offsets=", dict(group_sizes=[1, 1, 1])),
    (TypeError, r"expected_m= is a hint of the masked layout", dict(masked_m=None, expected_m=2)),
    (ValueError, r"needs a \(groups, max_m, k\) and b \(groups, k, n\); got \(3, 4\)",
     dict(a=np.ones((3, 4), np.float32))),
    (ValueError, r"got \(3, 4, 5\) and \(2, 5, 2\)", dict(b=np.ones((2, 5, 2), np.float32))),
    (ValueError, r"got \(3, 4, 5\) and \(3, 6, 2\)", dict(b=np.ones((3, 6, 2), np.float32))),
    (ValueError, r"out has shape \(3, 5, 2\) and dtype float32; the result is \(3, 4, 2\) float32",
     dict(out=np.zeros((3, 5, 2), np.float32))),
    (ValueError, r"out has shape \(3, 4, 2\) and dtype float64", dict(out=np.zeros((3, 4, 2)))),
    (TypeError, r"out must be a NumPy or CuPy array, not list", dict(out=[0])),
    (ValueError, r"bias has shape \(3, 3\); the masked layout needs \(3, 2\)",
     dict(bias=np.zeros((3, 3), np.float32))),
    (ValueError, r"scale_a has shape \(3, 5\); the masked layout needs \(3, 4\)",
     dict(scale_a=np.ones((3, 5), np.float32))),
    (TypeError, r"bias must be one numpy array of shape \(3, 2\) in the masked layout, not list",
     dict(bias=[np.zeros(2, np.float32)] * 3)),
    (ValueError, r"activation", dict(activation="swish")),
])
def test_refusals_name_the_argument_and_come_first(exc, match, kw):
    _refused(exc, match, **kw)


def test_read_only_out_is_refused():
    out = np.zeros((3, 4, 2), np.float32)
    out.flags.writeable = False
    _refused(ValueError, "out is read-only", out=out)


def test_the_guide_quotes_the_measured_run():
    """docs/guide/fusion.rst's masked-layout table and ratios are the H200 run's numbers."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    name = "grouped_masked_h200_2026-11-28_04c671f.json"
    doc = json.loads((root / "bench/results" / name).read_text())
    guide = (root / "docs/guide/fusion.rst").read_text()
    assert name in guide and doc["git_sha"] == "04c671f" and doc["device"]["name"] == "NVIDIA H200"
    for case in doc["cases"]:
        assert case["max_rel_err_vs_torch_grouped_mm"] == 0.0 and case["padding_rows_untouched"]
        us = case["us"]
        cells = [us["pyblasgemm masked (public call, masked_m on the GPU)"], us["torch._grouped_mm on the packed rows"],
                 us["pyblasgemm masked, graph"], us["torch._grouped_mm on the packed rows, graph"]]
        line = next(x for x in guide.splitlines() if x.startswith(f"{case['experts']} experts, blocks of {case['max_m']}"))
        assert line.split()[-8::2] == [f"{v:.1f}" for v in cells], line
    graph = [c["ratios"]["masked vs torch._grouped_mm, both in CUDA graphs"] for c in doc["cases"]]
    eager = [c["ratios"]["masked vs torch._grouped_mm (packed rows)"] for c in doc["cases"]]
    assert f"{graph[0]:.2f}x and {graph[1]:.2f}x" in guide and f"({eager[0]:.2f}x)" in guide
    assert f"at {eager[2]:.2f}x" in guide
