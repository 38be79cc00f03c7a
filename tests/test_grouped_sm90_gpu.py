"""The Hopper grouped walk (impls/sm90_gemm.cuh, MODE kGrouped; kernels/sm90.py
Sm90GroupedLaunch) on an sm_90 GPU: every tile, float16 and bfloat16, int32 and int64 offsets,
groups of 0, 1, odd, prime and tile +- 1 rows, all groups empty, NaN-poisoned outputs (rows
outside the groups and C's padding columns untouched), bitwise repeats, the masked layout, the
fused bias + activation, CUDA-graph replays with new device offsets, the public call's route, and
the refusals. The float64 reference and the expert case are test_grouped_fused_gpu's."""
import ml_dtypes
import numpy as np
import pytest

from conftest import gpu_cupy
from test_grouped_fused_gpu import Case, _check_against_float64, _host_ends, check_graph_replays

pytestmark = pytest.mark.gpu

TILES = ("small", "medium", "large")


@pytest.fixture(autouse=True)
def _hopper():
    cupy = gpu_cupy()
    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("the Hopper grouped walk runs on sm_90")


def _launch(which, kind, epilogue=(0, None)):
    from pyblasgemm.kernels.config import SM90_GROUPED_CONFIGS
    from pyblasgemm.kernels.sm90 import Sm90GroupedLaunch

    return Sm90GroupedLaunch(kind, SM90_GROUPED_CONFIGS[kind][which], epilogue)


def _bits(x):
    return x.view(np.uint16)


def _sizes(which):
    """0, 1, odd and prime sizes, and the tile's row count (64 or 128) +- 1."""
    t = 64 if which == "small" else 128
    return [0, 1, 7, 0, t - 1, t, t + 1, 13, 0, 2 * t + 1, 31, 0]


@pytest.mark.parametrize("which", TILES)
@pytest.mark.parametrize("dtype,k,n", [(ml_dtypes.bfloat16, 1024, 1024), (np.float16, 72, 200),
                                       (ml_dtypes.bfloat16, 40, 264)])
@pytest.mark.parametrize("offsets_type", [np.int32, np.int64])
def test_walk_matches_float64_and_repeats(which, dtype, k, n, offsets_type):
    """Uneven groups (a trailing empty one too), k = 72 / 40 a partial K stage, n = 200 / 264
    a partial feature tile: within rounding of float64, rows past the last end still NaN,
    bitwise the same on a second call."""
    import cupy

    kind = "f16" if dtype == np.float16 else "bf16"
    sizes = _sizes(which)
    rng = np.random.default_rng(3690)
    case = Case(rng, dtype, sum(sizes) + 9, len(sizes), k, n)     # 9 rows past the last group
    ends = np.cumsum(sizes)
    offsets = cupy.asarray(ends, offsets_type)
    launch = _launch(which, kind)
    got = case.run(launch, offsets, None)
    _check_against_float64(case, got, ends)
    assert cupy.array_equal(_bits(case.run(launch, offsets, None)), _bits(got)), "not repeatable"


@pytest.mark.parametrize("which", TILES)
def test_all_groups_empty_writes_nothing(which):
    import cupy

    case = Case(np.random.default_rng(3691), ml_dtypes.bfloat16, 100, 5, 64, 128)
    got = case.run(_launch(which, "bf16"), cupy.zeros(5, np.int32), None)
    assert bool(cupy.isnan(got).all())


@pytest.mark.parametrize("which", ["small", "large"])
def test_padded_output_columns_and_unaligned_rows_stay_untouched(which):
    """C with ldc = n + 3 (no 16-byte boxes: the register store checks every element): the
    padding columns keep their poison, the groups' values are float64's."""
    import cupy

    sizes = [5, 0, 130, 64, 1]
    rng = np.random.default_rng(3692)
    case = Case(rng, np.float16, sum(sizes), len(sizes), 128, 136)
    ends = np.cumsum(sizes)
    launch = _launch(which, "f16")
    full = cupy.full((case.rows, case.n + 3), np.nan, np.float16)
    out = full[:, :case.n]
    launch.launch_offsets(case.groups, cupy.asarray(ends, np.int32).data.ptr, 4, case.values(out))
    cupy.cuda.get_current_stream().synchronize()
    assert bool(cupy.isnan(full[:, case.n:]).all()), "a padding column was written"
    _check_against_float64(case, out, ends)


def test_bad_offsets_are_clamped_as_the_table_walk_clamps_them():
    """Decreasing, negative and past-the-end offsets: the ends the device makes of them
    (clamped, non-decreasing), float64's values there, nothing past the last end written."""
    import cupy

    rng = np.random.default_rng(3693)
    groups = 300        # the scan's second chunk of 256 (one consumer warpgroup) too
    sizes = rng.integers(0, 9, groups)
    rows = int(sizes.sum()) + 5
    ends = np.cumsum(sizes).astype(np.int64)
    ends[17] = ends[16] - 2
    ends[40] = -3
    ends[280] = rows + 1000
    case = Case(rng, ml_dtypes.bfloat16, rows, groups, 96, 80)
    for which in ("small", "medium"):
        _check_against_float64(case, case.run(_launch(which, "bf16"), cupy.asarray(ends), None), ends)


def test_masked_layout_leaves_padding_rows():
    """group_rows > 0: group g's rows start at g * group_rows and `offsets` are the counts
    (clamped to [0, group_rows]); padding rows keep their poison."""
    import cupy

    groups, max_m, k, n = 6, 70, 64, 192
    counts = np.array([0, 70, 3, 69, 100, 1])
    rng = np.random.default_rng(3694)
    case = Case(rng, ml_dtypes.bfloat16, groups * max_m, groups, k, n)
    for which in TILES:
        out = cupy.full((case.rows, n), np.nan, ml_dtypes.bfloat16)
        values = dict(case.values(out), group_rows=max_m)
        _launch(which, "bf16").launch_offsets(groups, cupy.asarray(counts, np.int32).data.ptr, 4, values)
        y = out.get().astype(np.float64)
        unit = 2.0 ** -8
        for g in range(groups):
            c = min(max(int(counts[g]), 0), max_m)
            s0 = g * max_m
            x64, w64 = case.a[s0:s0 + c].astype(np.float64), case.b[g].astype(np.float64)
            want, scale = x64 @ w64, np.abs(x64) @ np.abs(w64)
            assert np.all(np.abs(y[s0:s0 + c] - want) <= unit * np.abs(want) + 2.0 ** -14 * scale + 1e-30), (which, g)
            assert np.isnan(y[s0 + c:s0 + max_m]).all(), (which, g, "a padding row was written")


@pytest.mark.parametrize("act", [None, "gelu"])
def test_bias_and_activation_in_the_store(act):
    """One bias row per group (the features), the activation on the sum; float64 reference of
    act(x @ w + bias) in the arithmetic of the fused store (bias added to the rounded-to-fp32
    product)."""
    import cupy

    from pyblasgemm.epilogue import ACTIVATIONS
    from pyblasgemm.kernels.jit import epilogue_code

    sizes = [3, 0, 129, 64, 17]
    rng = np.random.default_rng(3695)
    case = Case(rng, ml_dtypes.bfloat16, sum(sizes), len(sizes), 192, 256)
    bias = (rng.standard_normal((case.groups, case.n))).astype(np.float32).astype(ml_dtypes.bfloat16)
    gbias = cupy.asarray(bias)
    code = epilogue_code(0 if act is None else ACTIVATIONS[act].code)
    ends = np.cumsum(sizes)
    for which in TILES:
        out = cupy.full((case.rows, case.n), np.nan, ml_dtypes.bfloat16)
        values = dict(case.values(out), bias=gbias.data.ptr, bias_group_bytes=gbias.strides[0], bias_mode=1)
        _launch(which, "bf16", (code, "m")).launch_offsets(case.groups, cupy.asarray(ends, np.int32).data.ptr, 4,
                                                           values)
        y = out.get().astype(np.float64)
        start = 0
        for g, end in enumerate(ends):
            x64, w64 = case.a[start:end].astype(np.float64), case.b[g].astype(np.float64)
            z = x64 @ w64 + bias[g].astype(np.float64)
            want = z if act is None else ACTIVATIONS[act].host(z)
            scale = np.abs(x64) @ np.abs(w64) + np.abs(bias[g].astype(np.float64))
            err = np.abs(y[start:end] - want)
            assert np.all(err <= 2.0 ** -8 * np.abs(want) + 2.0 ** -12 * scale + 1e-6), (which, g, float(err.max()))
            start = end


@pytest.mark.parametrize("which", TILES)
def test_cuda_graph_replays_new_device_offsets(which):
    """One captured launch, replayed after the offsets and tokens change in place: every rows
    in one group, all groups empty but the last, tile +- 1 sizes, decreasing and past-the-end
    offsets; each replay gives a fresh call's bits and float64's values."""
    import cupy

    rng = np.random.default_rng(3696)
    groups, rows = 8, 600
    case = Case(rng, ml_dtypes.bfloat16, rows, groups, 136, 200)
    offsets = cupy.asarray(np.linspace(rows // groups, rows, groups).astype(np.int32))
    launch = _launch(which, "bf16")
    out = cupy.full((rows, case.n), np.nan, ml_dtypes.bfloat16)
    values = case.values(out)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        launch.launch_offsets(groups, offsets.data.ptr, 4, values)      # compiled, maps encoded
        stream.begin_capture()
        launch.launch_offsets(groups, offsets.data.ptr, 4, values)
        graph = stream.end_capture()
    check_graph_replays(case, rng, graph, stream, offsets, out, lambda: case.run(launch, offsets, None),
                        ([rows] * groups, [0] * (groups - 1) + [rows], [1, 64, 129, 256, 257, 386, 513, 600],
                         [7, 3, 70, 69, 400, 401, 700, 800], [127, 127, 255, 291, 298, 555, 556, 600]))


def test_public_call_takes_the_hopper_walk_and_says_so():
    """grouped_matmul with device offsets on sm_90: the route names the Hopper walk, the
    result is float64's; host offsets keep the table walk; explain() lists both walks."""
    import cupy

    import pyblasgemm
    from pyblasgemm.epilogue import last_route

    rng = np.random.default_rng(3697)
    sizes = [200, 0, 129, 300, 1, 250, 64, 190]
    case = Case(rng, ml_dtypes.bfloat16, sum(sizes), len(sizes), 256, 512)
    ends = np.cumsum(sizes)
    got = pyblasgemm.grouped_matmul(case.ga, case.gb, offsets=cupy.asarray(ends, np.int32))
    assert "Hopper grouped walk" in last_route(), last_route()
    _check_against_float64(case, got, ends)
    again = pyblasgemm.grouped_matmul(case.ga, case.gb, offsets=cupy.asarray(ends, np.int32))   # the replay
    assert cupy.array_equal(_bits(again), _bits(got))
    pyblasgemm.grouped_matmul(case.ga, case.gb, offsets=[int(e) for e in ends])
    assert "Hopper" not in last_route(), last_route()


def test_a_loop_plan_names_the_loop_and_its_replay_keeps_the_bits():
    """A grouped call the plan runs as the loop (backend='cublas' with device offsets) says so in
    last_route() (it used to leave the previous call's line); and the one launch's repeated
    call, looked up before the whole-call checks, gives the first call's bits."""
    import cupy

    import pyblasgemm
    from pyblasgemm.epilogue import last_route, note_route

    rng = np.random.default_rng(3699)
    sizes = [3, 0, 64, 17]
    case = Case(rng, ml_dtypes.bfloat16, sum(sizes), len(sizes), 128, 256)
    ends = cupy.asarray(np.cumsum(sizes), np.int32)
    note_route(None)
    looped = pyblasgemm.grouped_matmul(case.ga, case.gb, offsets=ends, backend="cublas")
    assert "loop" in last_route(), last_route()
    _check_against_float64(case, looped, np.cumsum(sizes))
    out = cupy.full(looped.shape, np.nan, looped.dtype)
    first = pyblasgemm.grouped_matmul(case.ga, case.gb, offsets=ends, out=out).copy()
    for _ in range(3):
        out.fill(np.nan)
        again = pyblasgemm.grouped_matmul(case.ga, case.gb, offsets=ends, out=out)
        assert again is out and cupy.array_equal(_bits(again), _bits(first))


def test_refusals_name_the_argument_before_any_work():
    import cupy

    case = Case(np.random.default_rng(3698), ml_dtypes.bfloat16, 40, 2, 64, 64)
    out = cupy.full((40, 64), np.nan, ml_dtypes.bfloat16)
    launch = _launch("small", "bf16")
    offs = cupy.asarray([20, 40], np.int32)
    with pytest.raises(ValueError, match="tokens' row stride"):
        launch.launch_offsets(2, offs.data.ptr, 4, dict(case.values(out), x_row_bytes=130))
    with pytest.raises(ValueError, match="offsets_bytes=2"):
        launch.launch_offsets(2, offs.data.ptr, 2, case.values(out))
    with pytest.raises(ValueError, match="513 groups > 512"):
        launch.launch_offsets(513, offs.data.ptr, 4, case.values(out))
    cupy.cuda.get_current_stream().synchronize()
    assert bool(cupy.isnan(out).all())


def test_cuda_tensors_replay_their_launch_without_conversion_and_in_a_graph(monkeypatch):
    """A repeated expert-form call on CUDA tensors with the sizes on the GPU replays the
    recorded launch pair on the tensors' pointers (no conversion: arrays.convert is made to
    fail after the first call), with new offset values, new tensors of the same layout, and
    inside a CUDA graph replayed with changed sizes; every result within float64's bound."""
    torch = pytest.importorskip("torch")
    import cupy

    import pyblasgemm
    from pyblasgemm import arrays

    rng = np.random.default_rng(3700)
    sizes = [5, 0, 70, 33, 1, 64]
    case = Case(rng, ml_dtypes.bfloat16, sum(sizes), len(sizes), 256, 192)
    ta = torch.as_tensor(case.ga.view(np.int16), device="cuda").view(torch.bfloat16)
    tb = torch.as_tensor(case.gb.view(np.int16), device="cuda").view(torch.bfloat16)
    ends = np.cumsum(sizes)
    offs = torch.as_tensor(ends.astype(np.int32), device="cuda")

    def check(got, host_ends):
        as_cupy = cupy.asarray(got.view(torch.int16)).view(ml_dtypes.bfloat16)
        padded = cupy.full((case.rows, case.n), np.nan, ml_dtypes.bfloat16)
        last = _host_ends(host_ends, case.rows)[-1]
        padded[:last] = as_cupy[:last]
        _check_against_float64(case, padded, host_ends)

    first = pyblasgemm.grouped_matmul(ta, tb, offsets=offs)
    assert isinstance(first, torch.Tensor) and first.dtype == torch.bfloat16
    check(first, ends)
    given = torch.full_like(first, float("nan"))
    assert pyblasgemm.grouped_matmul(ta, tb, offsets=offs, out=given) is given      # (recorded with out=)

    def no_conversion(*args, **kw):
        raise AssertionError("a repeated call converted its tensors")

    monkeypatch.setattr(arrays, "convert", no_conversion)
    again = pyblasgemm.grouped_matmul(ta, tb, offsets=offs)
    assert torch.equal(again.view(torch.int16), first.view(torch.int16))
    other = torch.full_like(first, float("nan"))           # another out of the same layout
    assert pyblasgemm.grouped_matmul(ta, tb, offsets=offs, out=other) is other
    assert torch.equal(other.view(torch.int16), first.view(torch.int16))
    moved = np.array([0, 10, 10, 100, 150, 173])
    offs.copy_(torch.as_tensor(moved.astype(np.int32), device="cuda"))
    check(pyblasgemm.grouped_matmul(ta, tb, offsets=offs), moved)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        pyblasgemm.grouped_matmul(ta, tb, offsets=offs)            # (warm-up on the capture stream)
        with torch.cuda.graph(graph, stream=stream):
            captured = pyblasgemm.grouped_matmul(ta, tb, offsets=offs)
    torch.cuda.current_stream().wait_stream(stream)
    for new in (ends, np.array([173, 173, 173, 173, 173, 173]), np.array([1, 2, 3, 4, 5, 6])):
        offs.copy_(torch.as_tensor(new.astype(np.int32), device="cuda"))
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(captured, new)
