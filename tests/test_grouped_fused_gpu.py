"""The one-launch expert form (impls/grouped_fused.cuh: every CTA scans the device-side end
offsets into shared memory) against the two-launch form it replaces (table kernel, then the
table-driven grouped GEMM) and a float64 reference: both grouped tiles, 16-bit kinds, ragged
groups of 1, 7, 33 and 257 rows between empty ones, NaN-poisoned outputs, bitwise repeats, the
scan's carry across its 256-group chunks, clamped and decreasing offsets, CUDA-graph replays
with new sizes, and the group cap. GPU only."""
import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _gpu():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("needs a CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("needs a CUDA device")


def _tile(which, kind):
    from pyblasgemm.kernels.grouped import GROUPED_CONFIGS, GROUPED_SMALL_CONFIGS

    return (GROUPED_SMALL_CONFIGS if which == "small" else GROUPED_CONFIGS)[kind]


class Case:
    """Tokens (rows x k), experts' weights (groups x k x n), an output, and the launch values of
    impls/grouped_offsets.cuh for them (column-major: out^T = W^T x^T, so m = n)."""

    def __init__(self, rng, dtype, rows, groups, k, n):
        import cupy

        self.dtype, self.rows, self.groups, self.k, self.n = dtype, rows, groups, k, n
        self.a = rng.standard_normal((rows, k)).astype(np.float32).astype(dtype)
        self.b = (rng.standard_normal((groups, k, n)) / 8).astype(np.float32).astype(dtype)
        self.ga, self.gb = cupy.asarray(self.a), cupy.asarray(self.b)

    def values(self, out):
        isz = np.dtype(self.dtype).itemsize
        return dict(weights=self.gb.data.ptr, tokens=self.ga.data.ptr, out=out.data.ptr, bias=0, scale_w=0,
                    scale_x=0, w_group_bytes=self.gb.strides[0], x_row_bytes=self.ga.strides[0],
                    out_row_bytes=out.strides[0], bias_group_bytes=0, scale_w_group_bytes=0, lda=self.n,
                    ldb=self.k, ldc=out.strides[0] // isz, rows=self.rows, m=self.n, k=self.k,
                    out_bytes=isz, alpha=1.0, beta=0.0, ialpha=0, ibeta=0, bias_mode=0)

    def run(self, launch, offsets, fused):
        """A NaN-poisoned output after one launch_offsets call with device ``offsets``."""
        import cupy

        out = cupy.full((self.rows, self.n), np.nan, self.dtype)
        launch.launch_offsets(self.groups, offsets.data.ptr, offsets.dtype.itemsize, self.values(out), fused=fused)
        cupy.cuda.get_current_stream().synchronize()
        return out


def _host_ends(ends, rows):
    """What the kernels make of device offsets: clamped to [0, rows], made non-decreasing."""
    host = [min(max(int(e), 0), rows) for e in ends]
    for g in range(1, len(host)):
        host[g] = max(host[g], host[g - 1])
    return host


def _check_against_float64(case, got, ends):
    """Every group's rows within bf16/fp16 rounding of the float64 product (k <= 1032 terms in
    float32: 2^-14 of the sum of |terms|, plus the result's rounding); rows past the last end
    keep their NaN poison."""
    y = got.get().astype(np.float64)
    unit = 2.0 ** -8 if case.dtype == ml_dtypes.bfloat16 else 2.0 ** -11
    start = 0
    for g, end in enumerate(_host_ends(ends, case.rows)):
        if end > start:
            x64, w64 = case.a[start:end].astype(np.float64), case.b[g].astype(np.float64)
            want, scale = x64 @ w64, np.abs(x64) @ np.abs(w64)
            err = np.abs(y[start:end] - want)
            assert np.all(err <= unit * np.abs(want) + 2.0 ** -14 * scale + 1e-30), (g, float(err.max()))
        start = end
    assert np.isnan(y[start:]).all(), "a row past the last offset was written"


@pytest.mark.parametrize("which,dtype,k,n", [("small", ml_dtypes.bfloat16, 1024, 1024),
                                             ("small", np.float16, 72, 200),
                                             ("large", ml_dtypes.bfloat16, 264, 136),
                                             ("large", np.float16, 40, 264)])
@pytest.mark.parametrize("offsets_type", [np.int32, np.int64])
def test_fused_launch_has_the_two_launch_bits_and_the_float64_values(which, dtype, k, n, offsets_type):
    """Groups of 0, 1, 7, 33, 257 rows (and a trailing empty group): the one launch and the two
    launches give the same bits, within rounding of float64, repeatable; n = 200 / 136 leave
    warps past the m edge, k = 72 / 40 a partial K step."""
    import cupy

    from pyblasgemm.kernels.grouped import GroupedLaunch

    kind = "f16" if dtype == np.float16 else "bf16"
    sizes = [0, 1, 7, 0, 33, 257, 1, 0, 7, 33, 0]
    rng = np.random.default_rng(360)
    case = Case(rng, dtype, sum(sizes), len(sizes), k, n)
    ends = np.cumsum(sizes)
    offsets = cupy.asarray(ends, offsets_type)
    launch = GroupedLaunch(kind, "N", "N", True, config=_tile(which, kind))
    fused = case.run(launch, offsets, True)
    two = case.run(launch, offsets, False)
    assert cupy.array_equal(fused.view(np.uint16), two.view(np.uint16)), "one launch differs from two"
    _check_against_float64(case, fused, ends)
    assert cupy.array_equal(case.run(launch, offsets, True).view(np.uint16), fused.view(np.uint16)), "not repeatable"


@pytest.mark.parametrize("which", ["small", "large"])
def test_fused_scan_carries_across_chunks_and_clamps_bad_offsets(which):
    """500 groups (two 256-group chunks of the scan, then a partial third for the 8-warp tile)
    of 0..3 rows with offsets that decrease, fall below zero and pass the row count: the same
    bits as the two launches (whose table kernel scans 1024 at a time), each group within
    rounding of float64 for the clamped, non-decreasing ends, no row past the last one written."""
    import cupy

    from pyblasgemm.kernels.grouped import FUSED_MAX_GROUPS, GroupedLaunch

    rng = np.random.default_rng(361)
    groups = 500
    assert groups <= FUSED_MAX_GROUPS
    sizes = rng.integers(0, 4, groups)
    rows = int(sizes.sum()) + 5
    ends = np.cumsum(sizes).astype(np.int64)
    ends[17] = ends[16] - 2           # decreasing: group 17 is empty, 18 starts at 16's end
    ends[40] = -3                     # below zero: clamped to 0, so empty
    ends[300] = rows + 1000           # past the rows: every later group is empty
    case = Case(rng, ml_dtypes.bfloat16, rows, groups, 96, 80)
    offsets = cupy.asarray(ends)
    launch = GroupedLaunch("bf16", "N", "N", True, config=_tile(which, "bf16"))
    fused = case.run(launch, offsets, True)
    two = case.run(launch, offsets, False)
    assert cupy.array_equal(fused.view(np.uint16), two.view(np.uint16))
    _check_against_float64(case, fused, ends)


def test_fused_launch_refuses_more_groups_than_its_cap_and_auto_takes_two_launches():
    """fused=True past FUSED_MAX_GROUPS is a ValueError naming the count, raised before any
    launch; the default then takes the two launches, which match float64."""
    import cupy

    from pyblasgemm.kernels.grouped import FUSED_MAX_GROUPS, GroupedLaunch

    rng = np.random.default_rng(362)
    groups = FUSED_MAX_GROUPS + 88
    sizes = rng.integers(0, 3, groups)
    case = Case(rng, np.float16, int(sizes.sum()), groups, 64, 72)
    ends = np.cumsum(sizes)
    offsets = cupy.asarray(ends, np.int32)
    launch = GroupedLaunch("f16", "N", "N", True, config=_tile("small", "f16"))
    out = cupy.full((case.rows, case.n), np.nan, np.float16)
    with pytest.raises(ValueError, match=f"at most {FUSED_MAX_GROUPS} groups, got {groups}"):
        launch.launch_offsets(groups, offsets.data.ptr, 4, case.values(out), fused=True)
    cupy.cuda.get_current_stream().synchronize()
    assert bool(cupy.isnan(out).all()), "a refused launch wrote"
    _check_against_float64(case, case.run(launch, offsets, None), ends)


@pytest.mark.parametrize("which", ["small", "large"])
def test_fused_launch_replays_in_a_cuda_graph_with_new_sizes(which):
    """One captured fused launch, replayed after the offsets and tokens change in place (all
    rows in one group, all groups empty but the last, 1 / 7 / 33 / 257-row groups, decreasing
    and past-the-end offsets): each replay gives a fresh two-launch call's bits."""
    import cupy

    from pyblasgemm.kernels.grouped import GroupedLaunch

    rng = np.random.default_rng(363)
    groups, rows = 8, 600
    case = Case(rng, ml_dtypes.bfloat16, rows, groups, 136, 200)
    offsets = cupy.asarray(np.linspace(rows // groups, rows, groups).astype(np.int32))
    launch = GroupedLaunch("bf16", "N", "N", True, config=_tile(which, "bf16"))
    out = cupy.full((rows, case.n), np.nan, ml_dtypes.bfloat16)
    values = case.values(out)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        launch.launch_offsets(groups, offsets.data.ptr, 4, values, fused=True)     # compiled
        stream.begin_capture()
        launch.launch_offsets(groups, offsets.data.ptr, 4, values, fused=True)
        graph = stream.end_capture()
    check_graph_replays(case, rng, graph, stream, offsets, out, lambda: case.run(launch, offsets, False),
                        ([rows] * groups, [0] * (groups - 1) + [rows], [1, 8, 41, 298, 299, 306, 339, 596],
                         [7, 3, 70, 69, 400, 401, 700, 800], [257, 257, 290, 291, 298, 555, 556, 600]))


def check_graph_replays(case, rng, graph, stream, offsets, out, fresh, ends_list):
    """For each of ``ends_list``: the offsets and tokens changed in place, the captured
    ``graph`` replayed on ``stream``; its output has the bits of ``fresh()`` (an uncaptured
    call) and float64's values, and rows past the last end keep their NaN."""
    import cupy

    for ends in ends_list:
        with stream:        # a non-blocking stream does not wait for writes on the legacy one
            out[...] = cupy.nan
            offsets[...] = cupy.asarray(ends, np.int32)
            case.ga[...] = cupy.asarray(rng.standard_normal((case.rows, case.k)).astype(np.float32)
                                        .astype(case.dtype))
            case.a = case.ga.get()
            graph.launch(stream)
            stream.synchronize()
        with stream:
            want = fresh()
        last = _host_ends(ends, case.rows)[-1]      # (rows past it keep their NaN: checked below)
        assert cupy.array_equal(out[:last].view(np.uint16), want[:last].view(np.uint16)), ends
        _check_against_float64(case, out, ends)
