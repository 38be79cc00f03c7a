"""The fused epilogue in the mma.sync kernel's store (every shipped config, so every
decomposition, forced by name), int8 dequantization in that store, and the grouped persistent
launch: float64 references on fresh random data, poisoned outputs, NaN like the unfused
sequence, bitwise repeatable. GPU only (sm_80 and newer; the H100 runs these kernels too)."""
import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.epilogue import ACTIVATIONS
from pyblasgemm.kernels.config import SHIPPED_CONFIGS
from conftest import to_host
from epilogue_ref import REF, assert_nan_and_inf_like_unfused, residual_case
from epilogue_ref import UNIT as UNIT_OF_TYPE

pytestmark = pytest.mark.gpu

UNIT = {np.dtype(t): u for t, u in UNIT_OF_TYPE.items()}


@pytest.fixture(autouse=True)
def _gpu():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("needs a CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("needs a CUDA device")
    yield
    pyblasgemm.clear_plan_cache()


def _data(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _check(got, v64, act, scale, what):
    """|got - act(v64)| within two roundings to the output type (the pre-activation value, then
    the result) plus the float32 arithmetic before them: the accumulation (k <= 1032 terms:
    <= 2^-14 of ``scale``, the sum of |terms|) and the epilogue's few roundings, carried
    through the activation (slope <= 1.13)."""
    host = to_host(got)
    unit = UNIT[np.dtype(host.dtype)]
    got = np.asarray(host, np.float64)
    want = REF[act](v64)
    tol = 2 * unit * np.abs(want) + 1.13 * 2.0**-14 * scale + 1e-30
    bad = ~(np.abs(got - want) <= tol)
    assert not bad.any(), (what, int(bad.sum()), got[bad][:4], want[bad][:4])


#: (m, n, k): 1, 7, 33, 1000 and sizes no multiple of a tile
SHAPES = [(1, 8, 8), (7, 40, 64), (33, 136, 72), (1000, 264, 520), (257, 392, 1032)]
#: operand dtype, result dtype -> the kernel kind whose shipped configs run it
KINDS = [(np.float16, np.float16, "f16"), (ml_dtypes.bfloat16, ml_dtypes.bfloat16, "bf16"),
         (ml_dtypes.bfloat16, np.float32, "bf16_out32"), (np.float16, np.float32, "f16_out32"),
         (np.float32, np.float32, "f32")]


@pytest.mark.parametrize("dtype,out_dtype,kind", KINDS, ids=[k for *_, k in KINDS])
def test_fused_mma_sync_store_every_shipped_config(monkeypatch, dtype, out_dtype, kind):
    """Each shipped mma.sync config forced by name: every activation, both bias axes, the
    pre-activation, residual through beta with transposed, padded operands; NaN-poisoned
    outputs; bitwise repeatable; the route says the kernel fused it."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(abs(hash(kind)) % 2**32)
    for ci, cfg in enumerate(SHIPPED_CONFIGS[kind]):
        monkeypatch.setenv("PYBLASGEMM_BACKEND", "tensorcore")
        monkeypatch.setenv("PYBLASGEMM_CONFIG", cfg.name)
        pyblasgemm.clear_plan_cache()
        fused = 0
        for si, (m, n, k) in enumerate(SHAPES):
            if (si + ci) % 2 and si not in (0, 3):
                continue                       # every config: 1, 1000 and one or two more
            x, w = _data(rng, (m, k), dtype), _data(rng, (k, n), dtype)
            gx, gw = cupy.asarray(x), cupy.asarray(w)
            scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + 1
            act, axis = [("gelu", "cols"), ("silu", "rows"), ("relu", None), ("gelu_tanh", "cols"),
                         (None, "rows")][(si + ci) % 5]
            bias = {None: None, "cols": _data(rng, (n,), out_dtype), "rows": _data(rng, (m, 1), out_dtype)}[axis]
            v64 = x.astype(np.float64) @ w.astype(np.float64) + (0 if bias is None else bias.astype(np.float64))
            pre = cupy.full((m, n), np.nan, out_dtype)
            kw = dict(activation=act, preactivation_out=pre, bias=None if bias is None else cupy.asarray(bias))
            try:
                y = pyblasgemm.gemm("N", "N", gx, gw, cupy.full((m, n), np.nan, out_dtype), **kw)
            except NotImplementedError as e:   # the forced config cannot run this shape
                assert str(e).split(": ")[-1], e
                continue
            route = last_route()
            fused += route.startswith("pyblasgemm kernel")
            _check(y, v64, act, scale, (cfg.name, m, n, k, act, axis, route, out_dtype))
            _check(pre, v64, None, scale, (cfg.name, m, n, k, "pre", route, out_dtype))
            again = pyblasgemm.gemm("N", "N", gx, gw, cupy.full((m, n), np.nan, out_dtype), **kw)
            assert cupy.array_equal(again, y), (cfg.name, m, n, k, "not bitwise repeatable")
            # residual through beta; transposed operands with padded leading dimensions
            out, v, scale = residual_case(rng, dtype, out_dtype, m, n, k)
            _check(out, v, "gelu", scale, (cfg.name, m, n, k, "beta", last_route(), out_dtype))
        assert fused >= 2, f"{cfg.name}: only {fused} calls took the fused kernel"


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_fused_mma_sync_store_propagates_nan_and_inf(monkeypatch, act):
    monkeypatch.setenv("PYBLASGEMM_CONFIG", SHIPPED_CONFIGS["f16"][0].name)
    pyblasgemm.clear_plan_cache()
    assert_nan_and_inf_like_unfused(act, "pyblasgemm kernel sliced")


def _int8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


@pytest.mark.parametrize("out_dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_int8_dequantized_in_the_mma_sync_store_every_s8_config(monkeypatch, out_dtype):
    """scale_a / scale_b, bias on either axis, every activation, the pre-activation and
    residual through beta, in each shipped s8 config's store: against float64 (the int32
    product is exact), the route says so, repeatable bit for bit."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(31)
    acts = [None, *ACTIVATIONS]
    for ci, cfg in enumerate(SHIPPED_CONFIGS["s8"]):
        monkeypatch.setenv("PYBLASGEMM_BACKEND", "tensorcore")
        monkeypatch.setenv("PYBLASGEMM_CONFIG", cfg.name)
        pyblasgemm.clear_plan_cache()
        for m, n, k in [(7, 40, 64), (333, 264, 1000), (1, 8, 16)][: 3 if ci % 2 else 2]:
            a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
            sa = rng.uniform(1e-3, 1e-2, m).astype(np.float32)
            sb = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
            act = acts[(ci + m) % 5]
            rows = (ci + n) % 2 == 1
            bias = _data(rng, (m, 1) if rows else (n,), out_dtype)
            exact = a.astype(np.float64) @ b.astype(np.float64)
            v64 = sa[:, None].astype(np.float64) * sb.astype(np.float64) * exact + bias.astype(np.float64)
            pre = cupy.full((m, n), np.nan, out_dtype)
            kw = dict(scale_a=cupy.asarray(sa), scale_b=cupy.asarray(sb), bias=cupy.asarray(bias),
                      activation=act, preactivation_out=pre)
            try:
                got = pyblasgemm.gemm("N", "N", cupy.asarray(a), cupy.asarray(b),
                                      cupy.full((m, n), np.nan, out_dtype), **kw)
            except NotImplementedError as e:
                assert str(e).split(": ")[-1], e
                continue
            route = last_route()
            if "int8 dequantized in its store" not in route:
                # only for a one-row result (described with leading dimension 1: no 16-byte
                # columns for the fused store) or where the planner does not run the forced
                # config (the int8 product's description is the transposed one: outᵀ = bᵀ aᵀ)
                planned = pyblasgemm.plan(n, m, k, "int8", backend="tensorcore")
                assert m == 1 or planned.config != cfg, (cfg.name, m, n, k, route, planned.explain())
            scale = np.abs(v64) + 1
            _check(got, v64, act, scale, (cfg.name, m, n, k, act, rows, out_dtype))
            _check(pre, v64, None, scale, (cfg.name, m, n, k, "pre", out_dtype))
            again = pyblasgemm.gemm("N", "N", cupy.asarray(a), cupy.asarray(b), cupy.empty((m, n), out_dtype), **kw)
            assert cupy.array_equal(again, got), (cfg.name, "not repeatable")
            # residual through beta with alpha, on transposed (K-contiguous) operands
            at, bt = cupy.asarray(np.ascontiguousarray(a.T)), cupy.asarray(np.ascontiguousarray(b.T))
            c0 = _data(rng, (m, n), out_dtype)
            out = cupy.asarray(c0)
            pyblasgemm.gemm("T", "T", at, bt, out, alpha=2, beta=-1, scale_a=cupy.asarray(sa),
                            scale_b=cupy.asarray(sb))
            v = 2 * sa[:, None].astype(np.float64) * sb * exact - c0.astype(np.float64)
            _check(out, v, None, np.abs(v) + 1, (cfg.name, "beta", last_route(), out_dtype))


def _expert_case(rng, dtype, sizes, k, n, out_dtype=None):
    rows = sum(sizes)
    if dtype == np.int8:
        a, b = _int8(rng, (rows, k)), _int8(rng, (len(sizes), k, n))
    else:
        a, b = _data(rng, (rows, k), dtype), _data(rng, (len(sizes), k, n), dtype)
    return a, b, np.cumsum(sizes).tolist()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("act", [None, "gelu", "silu"])
def test_grouped_expert_form_is_one_persistent_launch(dtype, act):
    """Ragged experts (0 rows, 1, 7, 200, 1000), bias and activation fused, NaN-poisoned
    output: every group against float64, one launch (the route), repeatable."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(41)
    sizes = [0, 1, 7, 200, 0, 1000, 33]
    k, n = 264, 136
    a, b, ends = _expert_case(rng, dtype, sizes, k, n)
    bias = _data(rng, (len(sizes), n), dtype) if act else None
    out = cupy.full((a.shape[0], n), np.nan, dtype)
    kw = dict(offsets=ends, out=out, activation=act, bias=None if bias is None else cupy.asarray(bias),
              backend="tensorcore")
    y = pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), **kw)
    assert "grouped kernel" in last_route() and "one persistent launch" in last_route(), last_route()
    start = 0
    for g, end in enumerate(ends):
        x64, w64 = a[start:end].astype(np.float64), b[g].astype(np.float64)
        v = x64 @ w64 + (0 if bias is None else bias[g].astype(np.float64))
        _check(to_host(y)[start:end], v, act, np.abs(x64) @ np.abs(w64) + 1, (g, act, dtype))
        start = end
    again = pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), **dict(kw, out=None))
    assert cupy.array_equal(again, y)


@pytest.mark.parametrize("dtype,act,offsets_type", [
    (np.float16, "gelu", "cupy-int32"), (ml_dtypes.bfloat16, None, "cupy-int64"),
    (np.float16, "silu", "torch-int64"), (np.int8, None, "cupy-int64"), (np.int8, "gelu", "torch-int32")])
def test_grouped_offsets_on_the_gpu_give_the_host_offsets_bits(dtype, act, offsets_type):
    """End offsets that live on the GPU (CuPy, or a CUDA tensor as torch._grouped_mm's offs):
    the table is built on the device and the GEMM reads its tile count there; the result has
    the bits of the same call with the offsets on the host (every tile computes alike), for
    ragged and empty groups, with the epilogue and int8 dequantization fused."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(44)
    sizes = [0, 1, 7, 200, 0, 1000, 33, 0]
    k, n = 264, 136
    a, b, ends = _expert_case(rng, dtype, sizes, k, n)
    kw = dict(activation=act, backend="tensorcore")
    if dtype == np.int8 and act:
        kw.update(scale_a=cupy.asarray(rng.uniform(1e-3, 1e-2, a.shape[0]).astype(np.float32)),
                  scale_b=cupy.asarray(rng.uniform(1e-3, 1e-2, (len(sizes), n)).astype(np.float32)),
                  dtype=np.float16)
    elif act:
        kw.update(bias=cupy.asarray(_data(rng, (len(sizes), n), dtype)))
    ga, gb = cupy.asarray(a), cupy.asarray(b)
    want = pyblasgemm.grouped_matmul(ga, gb, offsets=ends, **kw)
    framework, width = offsets_type.split("-")
    if framework == "torch":
        torch = pytest.importorskip("torch")
        dev_ends = torch.tensor(ends, dtype=getattr(torch, width), device="cuda")
    else:
        dev_ends = cupy.asarray(ends, dtype=width)
    got = pyblasgemm.grouped_matmul(ga, gb, offsets=dev_ends, **kw)
    assert "one persistent launch" in last_route(), last_route()
    assert got.dtype == want.dtype and cupy.array_equal(got, want), (dtype, act, offsets_type)


def test_grouped_offsets_on_the_gpu_replay_in_a_cuda_graph_with_new_sizes():
    """One CUDA graph of the expert call with device offsets, replayed after the offsets (and
    the tokens) change in place: each replay gives the host-offsets call's bits for its sizes;
    offsets past the tokens are clamped (no read or write outside them), and rows past the last
    offset are left as they were."""
    import cupy

    rng = np.random.default_rng(45)
    rows, k, n, groups = 600, 128, 200, 6
    a = cupy.asarray(_data(rng, (rows, k), np.float16))
    b = cupy.asarray(_data(rng, (groups, k, n), np.float16))
    offsets = cupy.zeros(groups, np.int64)
    out = cupy.zeros((rows, n), np.float16)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        offsets[...] = cupy.asarray([100, 100, 350, 351, 599, 600])
        pyblasgemm.grouped_matmul(a, b, offsets=offsets, out=out, backend="tensorcore")   # compiled, planned
        stream.begin_capture()
        pyblasgemm.grouped_matmul(a, b, offsets=offsets, out=out, backend="tensorcore")
        graph = stream.end_capture()
    for ends in ([0, 0, 0, 0, 0, 600], [600] * 6, [1, 2, 3, 4, 5, 600], [10, 300, 290, 400, 500, 600],
                 [50, 60, 70, 80, 90, 590]):
        with stream:        # a non-blocking stream does not wait for writes on the legacy one
            out[...] = 0
            offsets[...] = cupy.asarray(ends)
            a[...] = cupy.asarray(_data(rng, (rows, k), np.float16))
            graph.launch(stream)
            stream.synchronize()
        host = [min(max(e, 0), rows) for e in ends]
        for g in range(1, groups):
            host[g] = max(host[g], host[g - 1])      # a decreasing offset: an empty group
        want = cupy.zeros((rows, n), np.float16)
        pyblasgemm.grouped_matmul(a[:host[-1]], b, offsets=host, out=want[:host[-1]], backend="tensorcore")
        assert cupy.array_equal(out, want), ends


@pytest.mark.parametrize("dtype,act,k,n", [(ml_dtypes.bfloat16, None, 1024, 1024), (np.float16, "gelu", 264, 136),
                                           (ml_dtypes.bfloat16, "silu", 72, 200), (np.float16, None, 37, 50)])
def test_grouped_small_groups_run_the_small_tile(dtype, act, k, n):
    """Experts of few tokens (0, 1, odd counts, 64, 65, 129: a mean under SMALL_GROUP_ROWS) take
    the 64-wide tile (GROUPED_SMALL_CONFIGS): NaN-poisoned output against float64 with the
    offsets on the host, the same bits with them on the GPU, repeatable. n = 136, 200 and 50
    leave warps wholly past the m edge (they run no MMAs), k = 72 a partial last K step, k = 37
    rows that are no 16-byte multiple (the scalar operand path)."""
    import cupy

    from pyblasgemm.epilogue import last_route
    from pyblasgemm.kernels.grouped import GROUPED_SMALL_CONFIGS

    tile = GROUPED_SMALL_CONFIGS["f16" if dtype == np.float16 else "bf16"].name
    rng = np.random.default_rng(46)
    sizes = [0, 1, 3, 64, 0, 17, 33, 65, 2, 0, 129, 31, 5, 1, 0, 40]
    a, b, ends = _expert_case(rng, dtype, sizes, k, n)
    bias = _data(rng, (len(sizes), n), dtype) if act else None
    kw = dict(activation=act, bias=None if bias is None else cupy.asarray(bias), backend="tensorcore")
    ga, gb = cupy.asarray(a), cupy.asarray(b)
    out = cupy.full((a.shape[0], n), np.nan, dtype)
    y = pyblasgemm.grouped_matmul(ga, gb, offsets=ends, out=out, **kw)
    assert tile in last_route() and "one persistent launch" in last_route(), last_route()
    start = 0
    for g, end in enumerate(ends):
        x64, w64 = a[start:end].astype(np.float64), b[g].astype(np.float64)
        v = x64 @ w64 + (0 if bias is None else bias[g].astype(np.float64))
        _check(to_host(y)[start:end], v, act, np.abs(x64) @ np.abs(w64) + 1, (g, act, dtype, k, n))
        start = end
    dev = cupy.full((a.shape[0], n), np.nan, dtype)
    pyblasgemm.grouped_matmul(ga, gb, offsets=cupy.asarray(ends, dtype=np.int32), out=dev, **kw)
    assert tile in last_route(), last_route()
    assert cupy.array_equal(dev, y), "device offsets differ from host offsets"
    assert cupy.array_equal(pyblasgemm.grouped_matmul(ga, gb, offsets=ends, **kw), y), "not repeatable"


def test_grouped_small_groups_replay_in_a_cuda_graph_with_new_sizes():
    """The small tile in one CUDA graph (16 experts over 256 tokens: a mean of 16 rows),
    replayed with new sizes: all tokens in one expert (four 64-row tiles), empty experts,
    decreasing and out-of-range offsets; each replay gives the host-offsets call's bits, and
    rows past the last offset keep their poison."""
    import cupy

    from pyblasgemm.epilogue import last_route
    from pyblasgemm.kernels.grouped import GROUPED_SMALL_CONFIGS

    rng = np.random.default_rng(47)
    rows, k, n, groups = 256, 136, 264, 16
    a = cupy.asarray(_data(rng, (rows, k), np.float16))
    b = cupy.asarray(_data(rng, (groups, k, n), np.float16))
    offsets = cupy.asarray(np.arange(1, groups + 1) * (rows // groups), np.int32)
    out = cupy.zeros((rows, n), np.float16)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        pyblasgemm.grouped_matmul(a, b, offsets=offsets, out=out, backend="tensorcore")   # compiled, planned
        assert GROUPED_SMALL_CONFIGS["f16"].name in last_route(), last_route()
        stream.begin_capture()
        pyblasgemm.grouped_matmul(a, b, offsets=offsets, out=out, backend="tensorcore")
        graph = stream.end_capture()
    cases = [[0] * (groups - 1) + [rows], [rows] * groups, list(range(1, groups)) + [rows],
             sorted(rng.integers(0, rows + 1, groups).tolist()),
             [7, 3, 70, 69, 140, 141, 141, 200, 199, 210, 211, 212, 230, 231, 250, 300],
             [5 * (g + 1) for g in range(groups)]]
    for ends in cases:
        with stream:        # a non-blocking stream does not wait for writes on the legacy one
            out[...] = cupy.nan
            offsets[...] = cupy.asarray(ends, np.int32)
            a[...] = cupy.asarray(_data(rng, (rows, k), np.float16))
            graph.launch(stream)
            stream.synchronize()
        host = [min(max(e, 0), rows) for e in ends]
        for g in range(1, groups):
            host[g] = max(host[g], host[g - 1])      # a decreasing offset: an empty group
        want = cupy.full((rows, n), np.nan, np.float16)
        if host[-1]:
            pyblasgemm.grouped_matmul(a[:host[-1]], b, offsets=host, out=want[:host[-1]], backend="tensorcore")
        assert cupy.array_equal(out, want, equal_nan=True), ends


def test_grouped_list_form_sizes_alignments_and_k_zero():
    """Problems of different shapes in one launch: 1 x 1, prime sizes, a K whose rows are not
    16-byte multiples (the scalar operand path for the launch), K = 0 (bias alone), an empty
    problem; against float64."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(42)
    shapes = [(1, 1, 1), (13, 36, 17), (129, 100, 257), (0, 5, 8), (31, 0, 8), (300, 520, 72)]
    xs = [_data(rng, (m, k), np.float16) for m, k, n in shapes]
    ws = [_data(rng, (k, n), np.float16) for m, k, n in shapes]
    bs = [_data(rng, (n,), np.float16) for m, k, n in shapes]
    outs = [cupy.full((m, n), np.nan, np.float16) for m, k, n in shapes]
    got = pyblasgemm.grouped_matmul([cupy.asarray(x) for x in xs], [cupy.asarray(w) for w in ws],
                                    bias=[cupy.asarray(v) for v in bs], activation="relu", out=outs,
                                    backend="tensorcore")
    assert "grouped kernel" in last_route(), last_route()
    for (m, k, n), x, w, bv, y in zip(shapes, xs, ws, bs, got):
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        _check(y, x64 @ w64 + bv.astype(np.float64), "relu", np.abs(x64) @ np.abs(w64) + 1, (m, k, n))


def test_grouped_int8_exact_and_dequantized():
    """int8 experts: the int32 products exactly; and dequantized to bfloat16 with scales and
    bias fused, against float64."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(43)
    sizes, k, n = [5, 0, 64, 300], 128, 72
    a, b, ends = _expert_case(rng, np.int8, sizes, k, n)
    y = pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), offsets=ends, backend="tensorcore")
    assert "grouped kernel" in last_route() and y.dtype == np.int32, last_route()
    start = 0
    for g, end in enumerate(ends):
        np.testing.assert_array_equal(to_host(y)[start:end],
                                      a[start:end].astype(np.int64) @ b[g].astype(np.int64))
        start = end
    sa = rng.uniform(1e-3, 1e-2, a.shape[0]).astype(np.float32)
    sb = rng.uniform(1e-3, 1e-2, (len(sizes), n)).astype(np.float32)
    bias = _data(rng, (len(sizes), n), ml_dtypes.bfloat16)
    y = pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), offsets=ends, scale_a=cupy.asarray(sa),
                                  scale_b=cupy.asarray(sb), bias=cupy.asarray(bias), activation="gelu",
                                  dtype=ml_dtypes.bfloat16, backend="tensorcore")
    assert "grouped kernel" in last_route() and "fused" in last_route(), last_route()
    start = 0
    for g, end in enumerate(ends):
        exact = a[start:end].astype(np.float64) @ b[g].astype(np.float64)
        v = sa[start:end, None].astype(np.float64) * sb[g].astype(np.float64) * exact + bias[g].astype(np.float64)
        _check(to_host(y)[start:end], v, "gelu", np.abs(v) + 1, (g, "dequant"))
        start = end


@pytest.mark.parametrize("out_dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_int8_dequantized_in_the_hopper_store(monkeypatch, out_dtype):
    """The Hopper int8 kernel's dequantizing store (K-major operands: op(b) = bt.T), each
    fusable config forced by name: scales, bias on either axis, every activation, the
    pre-activation, residual through beta; against float64 (the int32 product is exact)."""
    import cupy

    from pyblasgemm.epilogue import last_route
    from pyblasgemm.kernels.config import SM90_CONFIGS
    from pyblasgemm.kernels.launch import fusable

    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("the Hopper (sm_90a) kernel")
    rng = np.random.default_rng(45)
    acts = [None, *ACTIVATIONS]
    configs = [c for c in SM90_CONFIGS["s8"] if fusable("s8", c, dequantize=True)]
    for ci, cfg in enumerate(configs):
        monkeypatch.setenv("PYBLASGEMM_BACKEND", "tensorcore")
        monkeypatch.setenv("PYBLASGEMM_CONFIG", cfg.name)
        pyblasgemm.clear_plan_cache()
        m, n, k = [(7, 40, 128), (333, 264, 1024), (64, 136, 256)][ci % 3]
        a, bt = _int8(rng, (m, k)), _int8(rng, (n, k))
        sa = rng.uniform(1e-3, 1e-2, m).astype(np.float32)
        sb = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
        act, rows = acts[ci % 5], ci % 2 == 1
        bias = _data(rng, (m, 1) if rows else (n,), out_dtype)
        exact = a.astype(np.float64) @ bt.astype(np.float64).T
        v64 = sa[:, None].astype(np.float64) * sb.astype(np.float64) * exact + bias.astype(np.float64)
        pre = cupy.full((m, n), np.nan, out_dtype)
        c0 = _data(rng, (m, n), out_dtype)
        out = cupy.asarray(c0)
        try:
            pyblasgemm.gemm("N", "T", cupy.asarray(a), cupy.asarray(bt), out, alpha=2, beta=-1,
                            scale_a=cupy.asarray(sa), scale_b=cupy.asarray(sb), bias=cupy.asarray(bias),
                            activation=act, preactivation_out=pre)
        except NotImplementedError as e:
            assert str(e).split(": ")[-1], e
            continue
        route = last_route()
        assert route == f"pyblasgemm kernel {cfg.name}, int8 dequantized in its store", (cfg.name, route)
        v = 2 * (v64 - bias.astype(np.float64)) - c0.astype(np.float64) + bias.astype(np.float64)
        scale = np.abs(v) + 1
        _check(out, v, act, scale, (cfg.name, m, n, k, act, rows, out_dtype))
        _check(pre, v, None, scale, (cfg.name, "pre", out_dtype))


def test_repeated_expert_calls_replay_with_each_calls_own_arrays():
    """A repeated expert-form call (same signature) re-launches its table with the new arrays'
    addresses: each result matches its own float64 reference, with the same route."""
    import cupy

    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(44)
    sizes, k, n = [3, 0, 64, 17], 72, 136
    routes = []
    for _ in range(3):
        a, b, ends = _expert_case(rng, np.float16, sizes, k, n)
        bias = _data(rng, (len(sizes), n), np.float16)
        y = pyblasgemm.grouped_matmul(cupy.asarray(a), cupy.asarray(b), offsets=ends, bias=cupy.asarray(bias),
                                      activation="gelu", backend="tensorcore")
        routes.append(last_route())
        start = 0
        for g, end in enumerate(ends):
            x64, w64 = a[start:end].astype(np.float64), b[g].astype(np.float64)
            _check(to_host(y)[start:end], x64 @ w64 + bias[g].astype(np.float64), "gelu",
                   np.abs(x64) @ np.abs(w64) + 1, (g, "replay"))
            start = end
    assert routes[0] == routes[1] == routes[2] and "grouped kernel" in routes[0], routes
