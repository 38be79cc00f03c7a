"""GPU tests of the composite routes: float64 / complex128 through int8 tensor-core products
(compute='int8-ozaki', the Ozaki scheme II) and complex64 on our tf32 / 3xTF32 kernels.

The Ozaki route must give the host backend's bits (the same algorithm, pyblasgemm.ozaki), be
at least as accurate as native DGEMM against a long-double reference, fall back where the
scaling cannot hold the data, and be bitwise deterministic.
"""
import numpy as np
import pytest

import pyblasgemm
from _ref import TOLERANCE, op
from pyblasgemm import ozaki
from pyblasgemm.composite import last_route

cupy = pytest.importorskip("cupy")
try:
    _HAS_GPU = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # pragma: no cover - no driver
    _HAS_GPU = False
# marked gpu too: `pytest -m gpu` (the device runs) selected none of this file's tests before
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _HAS_GPU, reason="needs CuPy and a CUDA device")]

TRANS = [("N", "N"), ("N", "T"), ("T", "N"), ("T", "T")]
CTRANS = TRANS + [("C", "N"), ("N", "C"), ("C", "T"), ("C", "C")]
SIZES = [(1, 1, 1), (7, 5, 3), (33, 17, 64), (130, 70, 257), (64, 300, 1000)]


def _mat(rng, rows, cols, dtype, ld=None, spread=0.0):
    """A column-major rows x cols matrix in a buffer with leading dimension ld (padding
    poisoned), as the 2-D F-ordered view gemm takes."""
    ld = ld or rows
    shape = (ld, cols)
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-spread, spread, shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape) * 10.0 ** rng.uniform(-spread, spread, shape)
    buf = np.asfortranarray(x.astype(dtype))
    buf[rows:] = np.nan
    return buf[:rows]


def _both(transa, transb, a, b, c, alpha, beta, compute, backend="tensorcore"):
    """(GPU result, host result) of the same gemm call on the same bytes."""
    out_d = cupy.asarray(c, order="F")
    pyblasgemm.gemm(transa, transb, cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), out_d,
                    alpha, beta, compute=compute, backend=backend)
    out_h = np.array(c, order="F")
    pyblasgemm.gemm(transa, transb, a, b, out_h, alpha, beta, compute=compute)
    return cupy.asnumpy(out_d), out_h


def _shapes(transa, transb, m, n, k):
    return (m, k) if transa == "N" else (k, m), (k, n) if transb == "N" else (n, k)


@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("transa,transb", TRANS)
def test_dgemm_ozaki_has_the_host_bits(m, n, k, transa, transb):
    """Every transpose pair and size: the GPU's result is the host algorithm's, bit for bit,
    with alpha and beta, and with beta = 0 over a NaN-filled C."""
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    sa, sb = _shapes(transa, transb, m, n, k)
    a, b = _mat(rng, *sa, np.float64), _mat(rng, *sb, np.float64)
    c = _mat(rng, m, n, np.float64)
    gpu, host = _both(transa, transb, a, b, c, 1.5, -0.5, "int8-ozaki")
    if k <= 4:
        # the guard proves nothing at k <= 4: native DGEMM on the GPU, the host BLAS on the host
        assert last_route().startswith("native: the guard"), last_route()
        scale = 1.5 * np.abs(op(a, transa)) @ np.abs(op(b, transb)) + 0.5 * np.abs(c)
        assert np.all(np.abs(gpu - host) <= 4 * (k + 2) * 2.0**-53 * scale)
        return
    np.testing.assert_array_equal(gpu, host)
    assert last_route().startswith("pyblasgemm Ozaki II")
    nan_c = np.full((m, n), np.nan, order="F")
    gpu, host = _both(transa, transb, a, b, nan_c, 1.0, 0.0, "int8-ozaki")
    np.testing.assert_array_equal(gpu, host)
    assert np.isfinite(gpu).all()


def test_dgemm_ozaki_padded_leading_dimensions_and_dial():
    """Leading dimensions larger than the rows (the padding holds NaN), and the precision
    dial: fewer bits, fewer moduli, still the host's bits; with the 'fast' scaling too."""
    rng = np.random.default_rng(3)
    buf_a = np.full((50, 40), np.nan, order="F")
    buf_a[:37] = rng.standard_normal((37, 40))
    buf_b = np.full((45, 23), np.nan, order="F")
    buf_b[:40] = rng.standard_normal((40, 23))
    c = np.asfortranarray(rng.standard_normal((37, 23)))
    for compute in ("int8-ozaki", "int8-ozaki-40", "int8-ozaki-20", "int8-ozaki-fast", "int8-ozaki-40-fast",
                    "int8-ozaki-20-fast"):
        out_d = cupy.asarray(c, order="F")
        pyblasgemm.dgemm("N", "N", 37, 23, 40, 2.0, cupy.asarray(buf_a).ravel(order="F"), 50,
                         cupy.asarray(buf_b).ravel(order="F"), 45, 0.5, out_d.ravel(order="F"), 37,
                         compute=compute, backend="tensorcore")
        out_h = np.array(c, order="F")
        pyblasgemm.dgemm("N", "N", 37, 23, 40, 2.0, buf_a.ravel(order="F"), 50, buf_b.ravel(order="F"),
                         45, 0.5, out_h.ravel(order="F"), 37, compute=compute)
        np.testing.assert_array_equal(cupy.asnumpy(out_d), out_h, err_msg=compute)


def _longdouble_error(result, a, b):
    """Max relative error (normwise per element: against |A| @ |B|) vs a long-double product."""
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    scale = np.abs(a).astype(np.longdouble) @ np.abs(b).astype(np.longdouble)
    return float(np.max(np.abs(result.astype(np.longdouble) - ref) / scale))


@pytest.mark.parametrize("case", ["normal", "row scales 1e-30..1e30", "elements 1e-30..1e30"])
def test_dgemm_ozaki_at_least_as_accurate_as_native(case):
    """Against a long-double reference, the default's error is at most native DGEMM's: on
    random normal data, and on rows / columns whose scales spread over 1e-30..1e30 (the
    per-line power-of-two scaling holds them). Where single elements spread that far, no
    scaling holds a line: those rows and columns run natively (whole lines of cuBLAS DGEMM on
    a subset, whose rounding may differ from one full DGEMM call's: held to 2x)."""
    rng = np.random.default_rng(11)
    m, n, k = 96, 80, 2048
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    if case.startswith("row"):
        a *= 10.0 ** rng.uniform(-30, 30, (m, 1))
        b *= 10.0 ** rng.uniform(-30, 30, (1, n))
    elif case.startswith("elements"):
        a *= 10.0 ** rng.uniform(-30, 30, (m, k))
        b *= 10.0 ** rng.uniform(-30, 30, (k, n))
    da, db = cupy.asarray(a), cupy.asarray(b)
    emulated = cupy.asnumpy(pyblasgemm.matmul(da, db, compute="int8-ozaki", backend="tensorcore"))
    route = last_route()
    native = cupy.asnumpy(da @ db)
    err_e, err_n = _longdouble_error(emulated, a, b), _longdouble_error(native, a, b)
    bound = 2 * err_n if case.startswith("elements") else err_n
    assert err_e <= bound, (case, err_e, err_n, route)
    assert ("natively" in route) == case.startswith("elements"), route


@pytest.mark.parametrize("compute", ["int8-ozaki", "int8-ozaki-fast"])
def test_dgemm_ozaki_lines_the_scaling_cannot_hold_run_natively(compute):
    """One row of A and one column of B hold an element 1e-300 next to O(1) ones: those lines
    run natively after the rest (with alpha and beta as the rest), the others through int8,
    with the host's bits (either scaling)."""
    from pyblasgemm.kinds import ozaki_scaling

    rng = np.random.default_rng(12)
    a, b, c = rng.standard_normal((40, 70)), rng.standard_normal((70, 30)), rng.standard_normal((40, 30))
    a[3, 5], b[9, 2] = 1e-300, 1e-300
    out = cupy.asarray(c, order="F")
    pyblasgemm.gemm("N", "N", cupy.asarray(a), cupy.asarray(b), out, 1.5, -0.5, compute=compute,
                    backend="tensorcore")
    route = last_route()
    assert "1 rows and 1 columns natively" in route, route
    # the record states the bound the emulated elements keep (issue 34, item 4)
    bound = ozaki.setting(70, scaling=ozaki_scaling(compute)).bound()
    assert route.endswith("; error of the emulated elements: " + bound), route
    ref = 1.5 * (a @ b) - 0.5 * c
    scale = 1.5 * np.abs(a) @ np.abs(b) + 0.5 * np.abs(c)
    got = cupy.asnumpy(out)
    assert np.all(np.abs(got - ref) <= 1e-15 * scale)
    host = np.array(c, order="F")
    pyblasgemm.gemm("N", "N", a, b, host, 1.5, -0.5, compute=compute)
    keep = np.ones((40, 30), bool)
    keep[3, :], keep[:, 2] = False, False
    np.testing.assert_array_equal(got[keep], host[keep])


@pytest.mark.parametrize("compute", ["int8-ozaki", "int8-ozaki-fast"])
def test_dgemm_ozaki_inf_and_nan_fall_back_to_native(compute):
    """Inf or NaN in an operand: the whole product runs natively (IEEE propagation as DGEMM's)."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((20, 30)), rng.standard_normal((30, 10))
    a[3, 4], b[7, 2] = np.inf, np.nan
    da, db = cupy.asarray(a), cupy.asarray(b)
    got = cupy.asnumpy(pyblasgemm.matmul(da, db, compute=compute, backend="tensorcore"))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(a @ b))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(a @ b))
    assert last_route().startswith("native")


@pytest.mark.parametrize("compute", ["int8-ozaki", "int8-ozaki-fast"])
def test_dgemm_ozaki_is_deterministic_and_batched(compute):
    """Two runs give the same bits; a batched matmul gives each entry's own product."""
    rng = np.random.default_rng(8)
    a, b = cupy.asarray(rng.standard_normal((3, 65, 129))), cupy.asarray(rng.standard_normal((3, 129, 33)))
    first = pyblasgemm.matmul(a, b, compute=compute, backend="tensorcore")
    second = pyblasgemm.matmul(a, b, compute=compute, backend="tensorcore")
    assert bool((first == second).all())
    for i in range(3):
        host = pyblasgemm.matmul(cupy.asnumpy(a[i]), cupy.asnumpy(b[i]), compute=compute)
        np.testing.assert_array_equal(cupy.asnumpy(first[i]), host)


#: the digit store's two tiles on Hopper (kernels.jit.residue_store_fits): forced, so that the
#: store runs whatever the planner would pick at these small sizes
DIGIT_TILES = ("sm90a_sliced_128x128x128_w2x1_s6_g8", "sm90a_sliced_256x128x128_w2x1_s4_g8")


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
@pytest.mark.parametrize("m,n,k,config", [(256, 256, 512, DIGIT_TILES[1]), (520, 264, 1024, DIGIT_TILES[0]),
                                          (520, 264, 1024, DIGIT_TILES[1]), (512, 300, 1024, DIGIT_TILES[0]),
                                          (520, 264, 1000, DIGIT_TILES[0]), (520, 264, 1000, None),
                                          (512, 300, 1024, None)])
def test_ozaki_digit_store_has_the_int32_planes_bits(monkeypatch, dtype, m, n, k, config):
    """On a Hopper GPU the moduli's GEMM writes each product's CRT digit (the plan's
    ``digits``, kernels.jit.EPI_RESIDUE): the same C as the int32 planes (the planner's DIGITS
    off) and as the host, byte for byte, with alpha and beta. With a digit tile forced it must
    run (m % 16 == 0: the TMA boxes; m = 520: the edge tiles' byte stores; k = 1000: planes
    padded to 1008); with the planner's own choice (config None) it runs where the plan says.
    Elsewhere (no sm_90a kernel) the int32 planes run."""
    from pyblasgemm import composite
    from pyblasgemm.planner import composite as planned

    used = []
    real = composite._digit_launch

    def spy(moduli, plan):
        launch = real(moduli, plan)
        used.append(launch is not None)
        return launch
    monkeypatch.setattr(composite, "_digit_launch", spy)
    hopper = cupy.cuda.Device().compute_capability == "90"
    if config is not None:
        if not hopper:
            pytest.skip(f"{config} is a Hopper (sm_90a) kernel")
        monkeypatch.setenv("PYBLASGEMM_CONFIG", config)
    rng = np.random.default_rng(m + n + k)
    a = _mat(rng, m, k, dtype)
    b = _mat(rng, k, n, dtype)
    c = _mat(rng, m, n, dtype)
    runs = {}
    try:
        for digits in (True, False):
            monkeypatch.setattr(planned, "DIGITS", digits)
            pyblasgemm.clear_plan_cache()           # (a cached plan keeps the choice it was made with)
            runs[digits] = _both("N", "N", a, b, c, 1.5, -0.5, "int8-ozaki")
    finally:
        monkeypatch.delenv("PYBLASGEMM_CONFIG", raising=False)
        pyblasgemm.clear_plan_cache()
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    np.testing.assert_array_equal(runs[True][0], runs[True][1])          # the host's bits
    if config is not None:
        assert used[0], "the digit store should run on an sm_90 GPU with a digit tile"
    assert not used[-1]


@pytest.mark.parametrize("m,n,k", SIZES[:4])
@pytest.mark.parametrize("transa,transb", CTRANS)
def test_zgemm_ozaki_has_the_host_bits(m, n, k, transa, transb):
    """Complex through the same machinery (4M with shared scales): the host's bits with real
    alpha and beta; complex alpha and beta within ZGEMM's tolerance of the host."""
    rng = np.random.default_rng(m + 11 * n + 5 * k)
    sa, sb = _shapes(transa, transb, m, n, k)
    a, b = _mat(rng, *sa, np.complex128), _mat(rng, *sb, np.complex128)
    c = _mat(rng, m, n, np.complex128)
    gpu, host = _both(transa, transb, a, b, c, 1.0, 0.0, "int8-ozaki")
    if k <= 4:
        # the guard proves nothing at k <= 4: native ZGEMM on the GPU, the host BLAS on the host
        assert last_route().startswith("native: the guard"), last_route()
        scale = np.abs(op(a, transa)) @ np.abs(op(b, transb))
        assert np.all(np.abs(gpu - host) <= 4 * k * 2.0**-53 * scale)
        return
    np.testing.assert_array_equal(gpu, host)
    gpu, host = _both(transa, transb, a, b, c, 0.5 - 2j, 1 + 0.25j, "int8-ozaki")
    scale = np.abs(op(a, transa)) @ np.abs(op(b, transb)) * 2.1 + np.abs(c) * 1.1
    assert np.all(np.abs(gpu - host) <= 1e-15 * scale)


@pytest.mark.parametrize("compute", ["tf32", "3xtf32"])
@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("transa,transb", CTRANS)
def test_cgemm_on_tensor_cores(compute, m, n, k, transa, transb):
    """complex64 with compute='tf32' / '3xtf32' on our kernels: within the mode's tolerance
    of a float64 reference, every transpose pair (conjugation included), beta = 0 over NaN."""
    rng = np.random.default_rng(m * 5 + n + k * 3)
    sa, sb = _shapes(transa, transb, m, n, k)
    a, b = _mat(rng, *sa, np.complex64), _mat(rng, *sb, np.complex64)
    c = _mat(rng, m, n, np.complex64)
    alpha, beta = 1.25 - 0.5j, 0.5 + 1j
    out = cupy.asarray(c, order="F")
    pyblasgemm.gemm(transa, transb, cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), out,
                    alpha, beta, compute=compute, backend="tensorcore")
    assert last_route().startswith("pyblasgemm complex")
    oa, ob = op(a.astype(np.complex128), transa), op(b.astype(np.complex128), transb)
    ref = alpha * (oa @ ob) + beta * c.astype(np.complex128)
    scale = abs(alpha) * (np.abs(oa) @ np.abs(ob)) + abs(beta) * np.abs(c)
    rtol = TOLERANCE[("c", compute)]
    assert np.all(np.abs(cupy.asnumpy(out) - ref) <= 2 * rtol * scale + 1e-30)
    nan_c = cupy.full((m, n), np.nan, np.complex64, order="F")
    pyblasgemm.gemm(transa, transb, cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), nan_c,
                    1, 0, compute=compute, backend="tensorcore")
    got = cupy.asnumpy(nan_c)
    assert np.all(np.abs(got - oa @ ob) <= 2 * rtol * (np.abs(oa) @ np.abs(ob)) + 1e-30)


def test_composite_routes_plan_and_explain_on_the_device():
    """The planner's choice on the device: a small product runs natively, a large one through
    the composition, and explain() says which and why."""
    small = pyblasgemm.plan(64, 64, 64, "float64", compute="int8-ozaki")
    assert small.backend == "cublas" and "native DGEMM" in small.reason
    large = pyblasgemm.plan(8192, 8192, 8192, "float64", compute="int8-ozaki")
    text = large.explain()
    assert "Ozaki II" in text and "inner GEMM" in text, text


# --------------------------------------------------------------------------- frameworks (#34 item 5)

#: (dtype, compute) of the framework tests: the default and a dial of float64, complex128's
#: default (the stacked real product), float32's FP32-accurate mode
FRAMEWORK_CASES = [("float64", "int8-ozaki"), ("float64", "int8-ozaki-40"), ("complex128", "int8-ozaki"),
                   ("float32", "int8-ozaki")]


def _operands(dtype, seed, m=96, n=80, k=1024):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    if dtype == "complex128":
        a, b = a + 1j * rng.standard_normal((m, k)), b + 1j * rng.standard_normal((k, n))
    return a.astype(dtype), b.astype(dtype)


def _stacked(a, b, c):
    """A complex product as the real one the composition runs: [Ar Ai] @ [[Br, Bi], [-Bi, Br]]
    = [Cr Ci] (a real product is itself)."""
    if not np.iscomplexobj(a):
        return a, b, c
    return (np.hstack([a.real, a.imag]), np.block([[b.real, b.imag], [-b.imag, b.real]]),
            np.hstack([c.real, c.imag]))


def _within_the_bound(got, a, b, compute):
    """``got`` against the exact product (long double: exact enough here) within the plan's
    bound (pyblasgemm.ozaki.error_bound: the truncation to its bits plus the roundings) and, at
    the default, within native arithmetic's gamma_k * |A| @ |B| (the guard)."""
    from pyblasgemm.ozaki import error_bound

    m, k = a.shape
    setting = pyblasgemm.plan(m, b.shape[1], k, a.dtype, compute=compute, backend="tensorcore").launch.setting
    a2, b2, c2 = _stacked(a, b, got)
    ld = np.longdouble
    err = np.abs(c2.astype(ld) - a2.astype(ld) @ b2.astype(ld)).astype(np.float64)
    assert np.all(err <= error_bound(a2, b2, c2, setting)), (compute, float(err.max()))
    if compute == "int8-ozaki":
        u = 2.0**-24 if a.dtype == np.float32 else 2.0**-53
        kk = a2.shape[1]
        assert np.all(err <= kk * u / (1 - kk * u) * (np.abs(a2).astype(np.float64) @ np.abs(b2)))


def _cupy_result(a, b, compute):
    """The CuPy call's result (host copy) and its route: what the framework calls must equal."""
    got = pyblasgemm.matmul(cupy.asarray(a), cupy.asarray(b), compute=compute, backend="tensorcore")
    route = last_route()
    assert route.startswith("pyblasgemm Ozaki II"), route
    return cupy.asnumpy(got), route


@pytest.mark.parametrize("dtype,compute", FRAMEWORK_CASES)
def test_ozaki_on_torch_cuda_tensors_has_the_cupy_bits_within_the_bound(dtype, compute):
    """compute='int8-ozaki' on CUDA tensors: a CUDA tensor of the type back, the CuPy call's
    bits (the same composition on views of the tensors' memory), within the bound."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    a, b = _operands(dtype, 41)
    want, route = _cupy_result(a, b, compute)
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    got = pyblasgemm.matmul(ta, tb, compute=compute, backend="tensorcore")
    assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == ta.dtype
    assert last_route() == route
    host = got.cpu().numpy()
    np.testing.assert_array_equal(host, want)
    _within_the_bound(host, a, b, compute)
    again = pyblasgemm.matmul(ta, tb, compute=compute, backend="tensorcore")     # the replayed call
    assert torch.equal(again, got)


def _x64(jax):
    """JAX's 64-bit types on, for a ``with`` block (``jax.enable_x64(True)``; older JAX:
    ``jax.experimental.enable_x64()``)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64

    return enable_x64()


@pytest.mark.parametrize("dtype,compute", FRAMEWORK_CASES)
def test_ozaki_on_jax_gpu_arrays_has_the_cupy_bits_within_the_bound(dtype, compute):
    """The same on JAX arrays on the GPU (float64 / complex128 with JAX's 64-bit types on)."""
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX without a GPU")
    a, b = _operands(dtype, 43)
    want, route = _cupy_result(a, b, compute)
    with _x64(jax):
        ja, jb = jax.device_put(a, gpu), jax.device_put(b, gpu)
        assert ja.dtype == a.dtype
        got = pyblasgemm.matmul(ja, jb, compute=compute, backend="tensorcore")
        assert isinstance(got, jax.Array) and got.dtype == a.dtype and gpu in got.devices()
        host = np.asarray(got)
    assert last_route() == route
    np.testing.assert_array_equal(host, want)
    _within_the_bound(host, a, b, compute)
