"""The masked layout of ``grouped_matmul`` on a GPU (``a`` (groups, max_m, k), ``masked_m`` the
valid rows of each group): one launch whose CTAs read the counts on the device (the fused
walk up to 512 groups, the table kernel past it), against a float64 reference with
NaN-poisoned outputs (rows at and past a count keep their poison), counts of 1, 7, 33, 257 and
0 with both grouped tiles, 16-byte and unaligned rows, the fused epilogue, int8 dequantization,
counts out of range clamped on the device, bitwise repeats and the host counts' bits, a CUDA
graph replayed with new counts, torch tensors (and ``torch._grouped_mm`` on the packed valid
rows), and a layout off the kernel. GPU only."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from epilogue_ref import REF
from epilogue_ref import UNIT as UNIT_OF_TYPE

pytestmark = pytest.mark.gpu        # (conftest skips it, with the reason, where CuPy sees no GPU)

UNIT = {np.dtype(t): u for t, u in UNIT_OF_TYPE.items()}


def _data(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _bits(x):
    """An array's bytes as unsigned words (NaN poison compares equal to itself)."""
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _check(got, a, b, counts, bias=None, act=None):
    """Each group's valid rows within two roundings to the result type plus the float32
    accumulation (2^-14 of the sum of |terms|) of the float64 product; every other row still
    NaN (the poison the output was filled with)."""
    host = got.get() if hasattr(got, "get") else got
    unit = UNIT[np.dtype(host.dtype)]
    y = host.astype(np.float64)
    for g, c in enumerate(counts):
        x64, w64 = a[g, :c].astype(np.float64), b[g].astype(np.float64)
        want = REF[act](x64 @ w64 + (0 if bias is None else bias[g].astype(np.float64)))
        scale = np.abs(x64) @ np.abs(w64) + 1
        err = np.abs(y[g, :c] - want)
        assert np.all(err <= 2 * unit * np.abs(want) + 1.13 * 2.0 ** -14 * scale + 1e-30), (g, c, float(err.max()))
        assert np.all(np.isnan(y[g, c:])), (g, c, "a row past the count was written")


def _tile_expected(kind, counts):
    """An expected_m whose tile is the one the host counts' plan takes (their mean rows), so
    the device-counts call and the host-counts call run the same tile and give the same bits."""
    from pyblasgemm.kernels.grouped import SMALL_GROUP_ROWS

    return min(SMALL_GROUP_ROWS, max(counts)) if np.mean(counts) <= SMALL_GROUP_ROWS else max(counts)


def _route():
    from pyblasgemm.epilogue import last_route

    return last_route()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("counts,max_m,k,n", [
    ([1, 7, 33, 257, 0, 260], 260, 264, 136),        # the large tile (mean 93 rows); K tail of 8
    ([1, 7, 0, 33, 64, 2, 0, 5], 64, 72, 200),       # the small tile (mean 14 rows)
    ([3, 0, 17, 9], 17, 37, 50),                     # rows of 74 bytes: the unaligned operand path
])
def test_device_counts_one_launch_float64_poison_and_bits(dtype, counts, max_m, k, n):
    import cupy

    rng = np.random.default_rng(len(counts) * 1000 + k)
    groups = len(counts)
    a, b = _data(rng, (groups, max_m, k), dtype), _data(rng, (groups, k, n), dtype) / 8
    ga, gb = cupy.asarray(a), cupy.asarray(b)
    kind = "f16" if dtype == np.float16 else "bf16"
    expected = _tile_expected(kind, counts)
    kw = dict(backend="tensorcore")
    for itype in (np.int32, np.int64) if k == 264 else (np.int32,):     # (int64: one case's compile)
        dev_counts = cupy.asarray(counts, itype)
        out = cupy.full((groups, max_m, n), np.nan, dtype)
        got = pyblasgemm.grouped_matmul(ga, gb, masked_m=dev_counts, expected_m=expected, out=out, **kw)
        assert got is out
        assert "one persistent launch" in _route(), _route()
        _check(out, a, b, counts)
        again = cupy.full((groups, max_m, n), np.nan, dtype)      # the call signature's replay
        pyblasgemm.grouped_matmul(ga, gb, masked_m=dev_counts, expected_m=expected, out=again, **kw)
        assert cupy.array_equal(_bits(again), _bits(out)), "not repeatable"
    host = cupy.full((groups, max_m, n), np.nan, dtype)           # the packed table's path
    pyblasgemm.grouped_matmul(ga, gb, masked_m=counts, out=host, **kw)
    assert "one persistent launch" in _route(), _route()
    assert cupy.array_equal(_bits(host), _bits(out)), "host counts differ from device counts"


@pytest.mark.parametrize("act", ["relu", "silu"])
def test_bias_and_activation_fused_in_the_store(act):
    import cupy

    rng = np.random.default_rng(31)
    counts, max_m, k, n = [5, 0, 64, 33], 64, 136, 72
    dtype = ml_dtypes.bfloat16
    a, b = _data(rng, (4, max_m, k), dtype), _data(rng, (4, k, n), dtype) / 8
    bias = _data(rng, (4, n), dtype)
    out = cupy.full((4, max_m, n), np.nan, dtype)
    pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), masked_m=cupy.asarray(counts, np.int32),
                              bias=cupy.asarray(bias), activation=act, out=out, backend="tensorcore")
    assert "one persistent launch" in _route() and "epilogue fused" in _route(), _route()
    _check(out, a, b, counts, bias, act)


def test_int8_dequantized_rows_and_columns():
    import cupy

    rng = np.random.default_rng(32)
    counts, max_m, k, n = [9, 0, 16, 1], 16, 64, 40
    a = rng.integers(-127, 128, (4, max_m, k)).astype(np.int8)
    b = rng.integers(-127, 128, (4, k, n)).astype(np.int8)
    sa = rng.uniform(0.5, 2, (4, max_m)).astype(np.float32)
    sb = rng.uniform(0.5, 2, (4, n)).astype(np.float32)
    out = cupy.full((4, max_m, n), np.nan, np.float32)
    pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), masked_m=cupy.asarray(counts, np.int32),
                              scale_a=cupy.asarray(sa), scale_b=cupy.asarray(sb), out=out, backend="tensorcore")
    y = out.get()
    for g, c in enumerate(counts):
        exact = (a[g, :c].astype(np.int64) @ b[g].astype(np.int64)).astype(np.float64)
        want = exact * sa[g, :c, None] * sb[g][None, :]
        assert np.allclose(y[g, :c], want, rtol=4 * 2.0 ** -24, atol=0), g
        assert np.all(np.isnan(y[g, c:])), g


def test_counts_out_of_range_are_clamped_on_the_device():
    """Device counts are not read on the host: below 0 is 0, above max_m is max_m, and no row
    of another group's block is read or written."""
    import cupy

    rng = np.random.default_rng(33)
    max_m, k, n = 16, 64, 24
    raw = [-5, 300, 3, 2**31 - 1, 0]
    clamped = [min(max(c, 0), max_m) for c in raw]
    dtype = np.float16
    a, b = _data(rng, (5, max_m, k), dtype), _data(rng, (5, k, n), dtype) / 8
    ga, gb = cupy.asarray(a), cupy.asarray(b)
    out = cupy.full((5, max_m, n), np.nan, dtype)
    pyblasgemm.grouped_matmul(ga, gb, masked_m=cupy.asarray(raw, np.int32), out=out, backend="tensorcore",
                              expected_m=_tile_expected("f16", clamped))
    _check(out, a, b, clamped)
    host = cupy.full((5, max_m, n), np.nan, dtype)
    pyblasgemm.grouped_matmul(ga, gb, masked_m=clamped, out=host, backend="tensorcore")
    assert cupy.array_equal(_bits(host), _bits(out))
    with pytest.raises(ValueError, match=r"masked_m\[0\]=-5 is below 0"):
        pyblasgemm.grouped_matmul(ga, gb, masked_m=raw, out=host)     # host counts: refused
    with pytest.raises(ValueError, match=r"masked_m\[1\]=300 is above max_m=16"):
        pyblasgemm.grouped_matmul(ga, gb, masked_m=[0] + raw[1:], out=host)


def test_more_groups_than_the_fused_scan_take_the_table_kernel():
    """600 groups (> FUSED_MAX_GROUPS = 512): the table kernel writes the problems from the
    device counts, then the grouped GEMM; the bits of the host counts' table."""
    import cupy

    from pyblasgemm.kernels.grouped import FUSED_MAX_GROUPS

    rng = np.random.default_rng(34)
    groups, max_m, k, n = 600, 9, 64, 32
    assert groups > FUSED_MAX_GROUPS
    counts = rng.integers(0, max_m + 1, groups).tolist()
    dtype = ml_dtypes.bfloat16
    a, b = _data(rng, (groups, max_m, k), dtype), _data(rng, (groups, k, n), dtype) / 8
    ga, gb = cupy.asarray(a), cupy.asarray(b)
    out = cupy.full((groups, max_m, n), np.nan, dtype)
    pyblasgemm.grouped_matmul(ga, gb, masked_m=cupy.asarray(counts, np.int64), out=out, backend="tensorcore",
                              expected_m=_tile_expected("bf16", counts))
    _check(out, a, b, counts)
    host = cupy.full((groups, max_m, n), np.nan, dtype)
    pyblasgemm.grouped_matmul(ga, gb, masked_m=counts, out=host, backend="tensorcore")
    assert cupy.array_equal(_bits(host), _bits(out))


def test_a_cuda_graph_replays_new_counts():
    """One captured call with the counts on the device, replayed after the counts (and the
    tokens) change in place: each replay gives the eager call's bits for its counts, and rows
    past each count keep the poison written before the replay."""
    import cupy

    rng = np.random.default_rng(35)
    groups, max_m, k, n = 8, 96, 128, 136
    dtype = np.float16
    a = cupy.asarray(_data(rng, (groups, max_m, k), dtype))
    b = cupy.asarray(_data(rng, (groups, k, n), dtype) / 8)
    counts = cupy.asarray([max_m] * groups, np.int32)
    out = cupy.zeros((groups, max_m, n), dtype)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        pyblasgemm.grouped_matmul(a, b, masked_m=counts, out=out, backend="tensorcore", expected_m=32)
        stream.begin_capture()
        pyblasgemm.grouped_matmul(a, b, masked_m=counts, out=out, backend="tensorcore", expected_m=32)
        graph = stream.end_capture()
    for new in ([0] * groups, [max_m] * groups, [1, 7, 33, 0, 96, 2, 64, 65], rng.integers(0, 97, groups).tolist(),
                [-1, 200, 5, 5, 5, 5, 5, 96]):
        with stream:        # a non-blocking stream does not wait for writes on the legacy one
            out[...] = np.nan
            counts[...] = cupy.asarray(new, np.int32)
            a[...] = cupy.asarray(_data(rng, (groups, max_m, k), dtype))
            graph.launch(stream)
            stream.synchronize()
        clamped = [min(max(c, 0), max_m) for c in new]
        _check(out, a.get(), b.get(), clamped)
        want = cupy.full((groups, max_m, n), np.nan, dtype)
        pyblasgemm.grouped_matmul(a, b, masked_m=cupy.asarray(clamped, np.int32), out=want, backend="tensorcore",
                                  expected_m=32)
        assert cupy.array_equal(_bits(out), _bits(want)), new


def test_torch_tensors_and_grouped_mm_on_the_packed_rows():
    """CUDA tensors in, a tensor out, the CuPy call's bits; within bf16 rounding of
    ``torch._grouped_mm`` over the valid rows packed expert after expert (torch has no masked
    form: the same products on the same bytes)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import cupy

    rng = np.random.default_rng(36)
    counts, max_m, k, n = [1, 7, 33, 0, 64, 40], 64, 256, 128
    a, b = _data(rng, (6, max_m, k), ml_dtypes.bfloat16), _data(rng, (6, k, n), ml_dtypes.bfloat16) / 8
    ta = torch.from_numpy(a.view(np.uint16).astype(np.int16)).view(torch.bfloat16).cuda()
    tb = torch.from_numpy(b.view(np.uint16).astype(np.int16)).view(torch.bfloat16).cuda()
    tcounts = torch.tensor(counts, dtype=torch.int32, device="cuda")
    got = pyblasgemm.grouped_matmul(ta, tb, masked_m=tcounts)
    assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.bfloat16
    assert tuple(got.shape) == (6, max_m, n)
    out = cupy.full((6, max_m, n), np.nan, ml_dtypes.bfloat16)
    pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), masked_m=cupy.asarray(counts, np.int32), out=out)
    mine = out.get()
    theirs = got.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    for g, c in enumerate(counts):
        assert np.array_equal(_bits(theirs[g, :c]), _bits(mine[g, :c])), g
    tout = torch.full((6, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    pyblasgemm.grouped_matmul(ta, tb, masked_m=tcounts, out=tout)
    assert torch.isnan(tout[0, 1:]).all() and torch.isnan(tout[3]).all()
    packed = torch.cat([ta[g, :c] for g, c in enumerate(counts)])
    offs = torch.tensor(np.cumsum(counts), dtype=torch.int32, device="cuda")
    try:
        ref = torch._grouped_mm(packed, tb, offs=offs).float()
    except (RuntimeError, AttributeError) as e:     # (torch's own refusal is not ours to test)
        pytest.skip(f"torch._grouped_mm: {e}")
    ours = torch.cat([tout[g, :c] for g, c in enumerate(counts)]).float()
    assert ((ours - ref).abs() <= 2 * 2.0 ** -8 * ref.abs() + 2.0 ** -10).all()


def test_a_layout_off_the_kernel_runs_the_loop(monkeypatch):
    """Blocks that are no whole rows of one stride (a slice of a longer block) cannot be the
    kernel's rows: the counts are read back and each group runs its GEMM; same values."""
    import cupy

    import pyblasgemm.grouped

    def no_launch(*args, **kw):
        raise AssertionError("the masked layout off the kernel reached the one launch")

    monkeypatch.setattr(pyblasgemm.grouped, "_masked_launch", no_launch)

    rng = np.random.default_rng(37)
    counts, max_m, k, n = [3, 0, 8], 8, 64, 16
    dtype = np.float16
    big = _data(rng, (3, max_m + 3, k), dtype)
    b = _data(rng, (3, k, n), dtype) / 8
    ga = cupy.asarray(big)[:, :max_m]
    out = cupy.full((3, max_m, n), np.nan, dtype)
    pyblasgemm.grouped_matmul(ga, cupy.asarray(b), masked_m=cupy.asarray(counts, np.int32), out=out)
    _check(out, big[:, :max_m], b, counts)


def _jax_gpu():
    """(jax, its first GPU device), or the test skipped."""
    jax = pytest.importorskip("jax")
    try:
        return jax, jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX without a GPU")


def test_jax_gpu_counts_are_read_on_the_device(monkeypatch):
    """JAX arrays on the GPU with the counts a JAX GPU array too: the counts cross the door as
    a device view and the launch's scan reads them there (no host read: the host check is
    made to fail), with the bits of the same call on CuPy arrays; the result is a JAX array."""
    import cupy

    jax, gpu = _jax_gpu()
    rng = np.random.default_rng(36)
    groups, max_m, k, n = 5, 40, 64, 72
    counts = [40, 0, 7, 33, 1]
    a = _data(rng, (groups, max_m, k), np.float16)
    b = _data(rng, (groups, k, n), np.float16) / 8
    want = pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), masked_m=cupy.asarray(counts, np.int32),
                                     out=cupy.zeros((groups, max_m, n), np.float16), backend="tensorcore",
                                     expected_m=16)
    from pyblasgemm import grouped

    def host_read(*args):
        raise AssertionError("the JAX counts were read on the host")
    monkeypatch.setattr(grouped, "_check_masked_m", host_read)
    got = pyblasgemm.grouped_matmul(jax.device_put(a, gpu), jax.device_put(b, gpu),
                                    masked_m=jax.device_put(np.asarray(counts, np.int32), gpu),
                                    backend="tensorcore", expected_m=16)
    assert isinstance(got, jax.Array) and gpu in got.devices()
    host, ours = np.asarray(got), want.get()
    for g, c in enumerate(counts):
        assert np.array_equal(_bits(host[g, :c]), _bits(ours[g, :c])), g


def test_jax_gpu_offsets_are_read_on_the_device(monkeypatch):
    """The expert form's offsets as a JAX GPU array: read by the launch's scan on the device
    (the host check made to fail), the CuPy call's bits."""
    import cupy

    jax, gpu = _jax_gpu()
    rng = np.random.default_rng(37)
    k, n, ends = 64, 72, [5, 5, 40, 41, 90]
    a = _data(rng, (ends[-1], k), np.float16)
    b = _data(rng, (len(ends), k, n), np.float16) / 8
    want = pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), offsets=cupy.asarray(ends, np.int32),
                                     backend="tensorcore")
    from pyblasgemm import grouped

    def host_read(*args, **kwargs):
        raise AssertionError("the JAX offsets were read on the host")
    monkeypatch.setattr(grouped, "_check_offsets", host_read)
    got = pyblasgemm.grouped_matmul(jax.device_put(a, gpu), jax.device_put(b, gpu),
                                    offsets=jax.device_put(np.asarray(ends, np.int32), gpu), backend="tensorcore")
    assert isinstance(got, jax.Array) and gpu in got.devices()
    assert np.array_equal(_bits(np.asarray(got)), _bits(want.get()))
