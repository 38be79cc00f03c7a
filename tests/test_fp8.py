"""Float8 products with scales (pyblasgemm/fp8.py) on the host: every scale layout against exact
rational products, both float8 types and their mix, the extremes of each type, the epilogue,
the forms (matmul, gemm with flags, alpha and beta), PyTorch and JAX CPU arrays, and every
refusal named before any work."""
from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import fp8

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
gpu = pytest.mark.gpu


def _fp8(rng, shape, dtype, spread=4):
    """Random float8 values over ``spread`` binades either side of 1 (subnormals included for
    wide spreads), of both signs."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, shape))
    return x.astype(dtype)


def _scale_values(scale, is_a, k, n_or_m):
    """The scale of each element of a (is_a: (m, k)) or b ((k, n)) as Fractions."""
    s = np.asarray(scale, np.float64)
    def at(i, j):           # i: row of the operand, j: its column
        if s.ndim == 2:
            return Fraction(float(s[i, j // 128] if is_a else s[i // 128, j // 128]))
        if s.size == 1:
            return Fraction(float(s.reshape(-1)[0]))
        return Fraction(float(s[i] if is_a else s[j]))
    return at


def exact(a, b, scale_a, scale_b, cols):
    """{(i, j): (sum_k scale_a(i, k) a[i, k] scale_b(k, j) b[k, j], the sum of the terms'
    magnitudes)} as Fractions, for the columns ``cols``."""
    m, k = a.shape
    n = b.shape[1]
    sa, sb = _scale_values(scale_a, True, k, m), _scale_values(scale_b, False, k, n)
    fa = [[Fraction(float(v)) for v in row] for row in a.astype(np.float64)]
    fb = [[Fraction(float(v)) for v in row] for row in b.astype(np.float64)]
    out = {}
    for i in range(m):
        for j in cols:
            terms = [sa(i, h) * fa[i][h] * sb(h, j) * fb[h][j] for h in range(k)]
            out[i, j] = sum(terms), sum(abs(t) for t in terms)
    return out


LAYOUTS_A = {"tensor": lambda m, kb: np.float32(1.5), "tensor1": lambda m, kb: np.array([0.75], np.float32),
             "rows": lambda m, kb: np.linspace(0.5, 2, m, dtype=np.float32),
             "blocks": lambda m, kb: np.linspace(0.25, 4, m * kb, dtype=np.float32).reshape(m, kb)}
LAYOUTS_B = {"tensor": lambda n, kb, nb: np.float32(2.0),
             "cols": lambda n, kb, nb: np.linspace(0.5, 3, n, dtype=np.float32),
             "blocks": lambda n, kb, nb: np.linspace(0.125, 8, kb * nb, dtype=np.float32).reshape(kb, nb)}


@pytest.mark.parametrize("types", [(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2)], ids=["e4m3", "e5m2", "mixed"])
@pytest.mark.parametrize("la", list(LAYOUTS_A))
@pytest.mark.parametrize("lb", list(LAYOUTS_B))
def test_every_scale_layout_against_the_exact_product(types, la, lb):
    """k = 300 (three K blocks, the last partial), n = 130 (two N blocks, the last partial):
    the float64 product's error is a few roundings of the scaled block sums (each block sum
    itself exact): within 8 * 2^-53 of the terms' magnitudes; the float32 result is it
    rounded (half an ulp, and what that float64 error adds)."""
    rng = np.random.default_rng(hash((la, lb, types[1].__name__)) % 2**32)
    m, k, n = 3, 300, 130
    a, b = _fp8(rng, (m, k), types[0]), _fp8(rng, (k, n), types[1])
    sa, sb = LAYOUTS_A[la](m, 3), LAYOUTS_B[lb](n, 3, 2)
    assert fp8.check_scales("t", sa, sb, m, n, k)[0] == {"tensor1": "tensor"}.get(la, la)
    got64 = fp8.scaled_product(a, b, sa, sb)
    got = pyblasgemm.matmul(a, b, scale_a=sa, scale_b=sb)
    cols = list(range(0, n, 13)) + [n - 1]
    for (i, j), (w, mag) in exact(a, b, sa, sb, cols).items():
        err64 = abs(Fraction(float(got64[i, j])) - w)
        assert err64 <= mag * Fraction(8, 2**53), (i, j, float(err64), float(mag))
        ulp = float(np.spacing(np.float32(abs(float(w)))))
        assert abs(float(got[i, j]) - float(w)) <= 0.5 * ulp + float(err64) * 2, (i, j)


def test_the_extremes_of_each_type():
    """e5m2's largest values over k = 256 (products past 2^63 units: the halves), the smallest
    subnormals of both types (2^-9, 2^-16), and e4m3's 448."""
    big = fp8.scaled_product(np.full((1, 256), 57344, E5M2), np.full((256, 1), -57344, E5M2),
                             np.float32(1), np.float32(1))
    assert big[0, 0] == -256 * 57344.0**2
    tiny = fp8.scaled_product(np.full((1, 200), 2.0**-16, E5M2), np.full((200, 1), 2.0**-9, E4M3),
                              np.float32(1), np.float32(1))
    assert tiny[0, 0] == 200 * 2.0**-25
    top = fp8.scaled_product(np.array([[448, -448]], E4M3), np.array([[448], [2.0**-9]], E4M3),
                             np.float32(1), np.float32(1))
    assert top[0, 0] == 448.0**2 - 448 * 2.0**-9


def test_nan_takes_part_where_it_multiplies():
    a = np.array([[1, np.nan], [1, 1]], E4M3)
    b = np.array([[1, 2], [3, 4]], E4M3)
    got = pyblasgemm.matmul(a, b, scale_a=np.float32(1), scale_b=np.float32(1))
    assert np.isnan(got[0]).all() and got[1].tolist() == [4.0, 6.0]


def test_output_types_and_the_epilogue():
    rng = np.random.default_rng(5)
    a, b = _fp8(rng, (4, 200), E4M3), _fp8(rng, (200, 6), E4M3)
    sa, sb = np.linspace(1, 2, 4, dtype=np.float32), np.float32(0.5)
    v = fp8.scaled_product(a, b, sa, sb) + np.linspace(-1, 1, 6)
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        pre = np.empty((4, 6), dtype)
        got = pyblasgemm.matmul(a, b, scale_a=sa, scale_b=sb, dtype=dtype,
                                bias=np.linspace(-1, 1, 6).astype(np.float32), activation="relu",
                                preactivation_out=pre)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(pre, v.astype(dtype))
        np.testing.assert_array_equal(got, np.maximum(v, 0).astype(dtype))


def test_gemm_flags_alpha_and_beta():
    rng = np.random.default_rng(6)
    a, b = _fp8(rng, (5, 130), E5M2), _fp8(rng, (130, 4), E4M3)
    sa, sb = np.linspace(1, 2, 5, dtype=np.float32), np.linspace(1, 3, 4, dtype=np.float32)
    want = fp8.scaled_product(a, b, sa, sb)
    got = pyblasgemm.gemm("T", "C", np.ascontiguousarray(a.T), np.ascontiguousarray(b.T),
                          scale_a=sa, scale_b=sb)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    out = np.full((5, 4), 3, np.float32)
    pyblasgemm.gemm("N", "N", a, b, out=out, alpha=2.0, beta=-1.0, scale_a=sa, scale_b=sb)
    np.testing.assert_array_equal(out, (2 * want - 3).astype(np.float32))


def test_rows_are_batch_invariant_on_the_host():
    rng = np.random.default_rng(7)
    a, b = _fp8(rng, (40, 260), E4M3, spread=5), _fp8(rng, (260, 9), E5M2, spread=9)
    sa = np.linspace(0.5, 1, 40 * 3, dtype=np.float32).reshape(40, 3)
    whole = pyblasgemm.matmul(a, b, scale_a=sa, scale_b=np.float32(1), invariant=True)
    for i in range(40):
        part = pyblasgemm.matmul(a[i:i + 1], b, scale_a=sa[i:i + 1], scale_b=np.float32(1))
        assert np.array_equal(part, whole[i:i + 1])


def test_refusals_name_the_argument_before_any_work():
    a, b = np.ones((3, 200), E4M3), np.ones((200, 5), E4M3)
    one = np.float32(1)
    out = np.full((3, 5), -7, np.float32)
    with pytest.raises(ValueError, match="needs both scale_a and scale_b"):
        pyblasgemm.matmul(a, b, scale_a=one)
    with pytest.raises(ValueError, match=r"scale_b has shape \(5, 5\); for b of 200 x 5 it must be"):
        pyblasgemm.matmul(a, b, scale_a=one, scale_b=np.ones((5, 5), np.float32))
    with pytest.raises(TypeError, match="scale_a must be a float32 array or scalar, got float64"):
        pyblasgemm.matmul(a, b, scale_a=np.ones(3), scale_b=one)
    with pytest.raises(TypeError, match="is float32, float16, bfloat16, not int32"):
        pyblasgemm.matmul(a, b, scale_a=one, scale_b=one, dtype=np.int32)
    with pytest.raises(TypeError, match="2-D float8"):
        pyblasgemm.matmul(np.ones((2, 3, 200), E4M3), b, scale_a=one, scale_b=one)
    with pytest.raises(TypeError, match="b is 2-D float16"):
        pyblasgemm.matmul(a, b.astype(np.float16), scale_a=one, scale_b=one)
    with pytest.raises(ValueError, match="backend='cublas' runs float8 products on CuPy arrays .* cuBLASLt.* "
                                         "but the operands are NumPy arrays"):
        pyblasgemm.matmul(a, b, scale_a=one, scale_b=one, backend="cublas")
    with pytest.raises(ValueError, match="backend='tensorcore' runs float8 products on CuPy arrays .* "
                                         "but the operands are NumPy arrays"):
        pyblasgemm.matmul(a, b, scale_a=one, scale_b=one, backend="tensorcore")
    with pytest.raises(ValueError, match=r"out has shape \(5, 3\) and dtype float32; the result is \(3, 5\)"):
        pyblasgemm.gemm("N", "N", a, b, out=np.empty((5, 3), np.float32), scale_a=one, scale_b=one)
    with pytest.raises(ValueError, match="activation='bogus' is not one of"):
        pyblasgemm.matmul(a, b, scale_a=one, scale_b=one, activation="bogus")
    pyblasgemm.gemm("N", "N", a, b, out=out, scale_a=one, scale_b=np.ones(5, np.float32))
    assert (out == 200).all()


def test_pytorch_and_jax_cpu_arrays():
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((64, 3)).astype(np.float32)
    torch = pytest.importorskip("torch")
    ta, tb = torch.from_numpy(x).to(torch.float8_e4m3fn), torch.from_numpy(w).to(torch.float8_e5m2)
    got = pyblasgemm.matmul(ta, tb, scale_a=torch.full((4,), 0.5), scale_b=torch.tensor(2.0))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    want = fp8.scaled_product(x.astype(E4M3), w.astype(E5M2), np.float32(0.5), np.float32(2))
    np.testing.assert_array_equal(got.numpy(), want.astype(np.float32))
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    got = pyblasgemm.matmul(jnp.asarray(x).astype(jnp.float8_e4m3fn), jnp.asarray(w).astype(jnp.float8_e5m2),
                            scale_a=jnp.float32(0.5), scale_b=jnp.float32(2))
    assert isinstance(got, jax.Array)
    np.testing.assert_array_equal(np.asarray(got), want.astype(np.float32))


def test_a_framework_dtype_names_the_output_type():
    """``dtype=torch.bfloat16`` (``torch._scaled_mm``'s ``out_dtype`` habit) is the output
    type of that name; a framework dtype of no output type is refused, naming it."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((4, 64)), rng.standard_normal((64, 3))
    a, b = torch.from_numpy(x).to(torch.float8_e4m3fn), torch.from_numpy(w).to(torch.float8_e4m3fn)
    got = pyblasgemm.matmul(a, b, scale_a=torch.tensor(0.5), scale_b=torch.ones(3), dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    want = fp8.scaled_product(x.astype(E4M3), w.astype(E4M3), np.float32(0.5), np.float32(1))
    np.testing.assert_array_equal(got.float().numpy(), want.astype(ml_dtypes.bfloat16).astype(np.float32))
    # (torch.int8 is read as NumPy's int8, which is no output type of a float8 product)
    with pytest.raises(TypeError, match="a float8 product is float32, float16, bfloat16, not int8"):
        pyblasgemm.matmul(a, b, scale_a=torch.tensor(0.5), scale_b=torch.ones(3), dtype=torch.int8)


def test_fp8_guide_quotes_the_h200_run():
    """docs/guide/fp8.rst's measured ranges are bench/results/fp8_h200_2026-11-29_e1f052c.json's
    (one H200, every contender on the same bytes in the same run)."""
    import json
    import math
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    doc = json.loads((root / "bench/results/fp8_h200_2026-11-29_e1f052c.json").read_text())
    assert doc["device"]["name"] == "NVIDIA H200" and doc["git_sha"] == "e1f052c"
    guide = " ".join((root / "docs/guide/fp8.rst").read_text().split())
    rows = [r for r in doc["rows"] if "failure" not in r]
    square = [r for r in rows if r["shape"].startswith("square") and r["scales"] != "blocks"]
    decode = [r for r in rows if "decode" in r["shape"]]

    def span(values, digits=2):
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}x"

    def geomean(values):
        return math.exp(sum(map(math.log, values)) / len(values))

    assert f"(cuBLASLt) {span([r['speedup_vs_scaled_mm_cupy_steady'] for r in square])} on CuPy arrays" in guide
    assert f"and {span([r['speedup_vs_scaled_mm_steady'] for r in square])} on torch tensors" in guide
    assert f"our wgmma kernel alone {span([r['speedup_vs_scaled_mm_ours_steady'] for r in square])}" in guide
    assert f"ran in {span([1 / r['lt_over_ours_steady'] for r in square])} our kernels' time" in guide
    for mode, word in (("tensor", "per-tensor scales"), ("rowwise", "row-wise")):
        got = geomean([r["speedup_vs_scaled_mm_cupy_steady"] for r in decode if r["scales"] == mode])
        assert f"{got:.2f}x" in guide, (mode, got)
    plain = [r["lt_over_ours_steady"] for r in decode if r["scales"] != "blocks" and "lt_over_ours_steady" in r]
    assert f"our kernels ran in {span(plain)} its time" in guide
    blocks = [r for r in rows if r["scales"] == "blocks"]
    big = [r["lt_over_ours_steady"] for r in blocks if r["shape"].startswith("square")]
    assert f"the Hopper kernel ran {span(big)} cuBLASLt's time" in guide
    small = [r["lt_over_hopper_steady"] for r in blocks if "decode" in r["shape"] and "lt_over_hopper_steady" in r]
    assert f"and {span(small)} at decode" in guide
    host = [h for h in doc["host"] if "speedup_vs_scaled_mm_host" in h]
    assert f"{span([h['speedup_vs_scaled_mm_host'] for h in host])} ``torch._scaled_mm``'s speed" in guide
    readme = " ".join((root / "README.md").read_text().split())
    assert f"runs at {span([r['speedup_vs_scaled_mm_cupy_steady'] for r in square])} `torch._scaled_mm`" in readme
    per_layer = [r["speedup_vs_scaled_mm_cupy_steady"] for r in decode if r["scales"] != "blocks"]
    assert f"geomean, {span(per_layer)} per layer" in readme
