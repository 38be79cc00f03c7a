"""Operands packed into 16-byte pitched storage (kernels/pack.py): which problems pack, what the
planner prices, and on a GPU that the packed route computes the same GEMM as the float64 oracle
for every layout, odd sizes, beta != 0, dense batches, and under CUDA-graph capture."""
from types import SimpleNamespace

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import constraints
from pyblasgemm.kernels.pack import PackStep, pack_steps
from pyblasgemm.kernels.problem import KernelProblem
from pyblasgemm.planner import make_desc

from _ref import check_close, col_major, expected, random_array

gpu = pytest.mark.gpu


# --------------------------------------------------------------------------------------------
# Host: which operands pack, the packed description, the planner's choice
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,want", [
    (dict(m=1024, n=1024, k=1024), ()),                                  # all pitches aligned
    (dict(m=1024, n=1024, k=1024, lda=1025), ("a",)),                    # A: 2050-byte pitch
    (dict(m=1024, n=1024, k=1023), ("b",)),                              # NN: B's pitch is k
    (dict(m=1024, n=1024, k=1023, transa="T"), ("a", "b")),              # TN: both K-major
    (dict(m=1023, n=1024, k=1024, lda=1024, ldc=1023), ()),              # only C: no pack
    (dict(m=1024, n=1024, k=1024, lda=1025, align=8), ()),               # a pointer itself
    (dict(m=64, n=64, k=63, batch=4), ("b",)),                           # dense batch
    (dict(m=64, n=64, k=63, batch=4, stride_b=0), ()),                   # broadcast B
    (dict(m=64, n=64, k=63, batch=4, stride_b=63 * 64 + 5), ()),         # gaps between entries
])
def test_packable(kw, want):
    m, n, k = kw.pop("m"), kw.pop("n"), kw.pop("k")
    assert constraints.packable(make_desc(m, n, k, "f16", **kw)) == want


def test_packable_int8_pitch_and_layout():
    """int8 packs by pitch in the TN layout, and transposes an M-/N-major operand."""
    assert constraints.packable(make_desc(5000, 5000, 5000, "i8", transa="T")) == ("a", "b")
    assert constraints.packable(make_desc(5008, 5008, 5008, "i8", transa="T")) == ()
    assert constraints.packable(make_desc(64, 64, 64, "i8")) == ("at",)
    assert constraints.packable(make_desc(64, 64, 64, "i8", transa="T", transb="T")) == ("bt",)
    assert constraints.packable(make_desc(64, 64, 63, "i8", transb="T")) == ("at", "bt")
    assert constraints.packable(make_desc(64, 64, 64, "i8", batch=2, stride_a=0)) == ()


def test_transposed_desc_and_steps_agree():
    d = make_desc(300, 200, 1001, "i8", transb="T", batch=2)
    p = constraints.packed_desc(d, ("at", "bt"))
    assert (p.transa, p.transb, p.lda, p.ldb) == ("T", "N", 1008, 1008)
    assert (p.stride_a, p.stride_b, p.align) == (1008 * 300, 1008 * 200, 16)   # C: 1200-byte pitch
    steps = pack_steps(constraints.kernel_problem(d), ("at", "bt"))
    assert steps[0] == PackStep("at", 300, 1001, 2, 300, 300 * 1001, 1008, 1008 * 300, 1, True)
    assert steps[1] == PackStep("bt", 200, 1001, 2, 200, 200 * 1001, 1008, 1008 * 200, 1, True)
    assert steps[0].nbytes == 1008 * 300 * 2
    with pytest.raises(ValueError, match="moves bytes"):
        pack_steps(constraints.kernel_problem(make_desc(64, 64, 64, "f16")), ("at",))


def test_packed_desc_and_steps_agree():
    """The planner's packed description and the launch's copies describe the same storage."""
    d = make_desc(301, 77, 1023, "bf16", transa="T", batch=3)
    ops = constraints.packable(d)
    assert ops == ("a", "b")
    p = constraints.packed_desc(d, ops)
    assert (p.lda, p.ldb, p.ldc) == (1024, 1024, 301)
    assert (p.stride_a, p.stride_b) == (1024 * 301, 1024 * 77)
    assert p.align == 2 and p.ptr_align == 16       # ldc = 301 halves: C stays unaligned ...
    kp = constraints.kernel_problem(p)
    assert kp.operands_vectorizable() and not kp.c_vectorizable()   # ... A and B do not
    steps = pack_steps(constraints.kernel_problem(d), ops)
    assert steps == (PackStep("a", 1023, 301, 3, 1023, 1023 * 301, 1024, 1024 * 301, 2),
                     PackStep("b", 1023, 77, 3, 1023, 1023 * 77, 1024, 1024 * 77, 2))
    assert steps[0].nbytes == 1024 * 301 * 3 * 2


def test_pack_steps_refuse_gapped_batches():
    prob = KernelProblem("f16", "N", "N", 64, 64, 63, 64, 63, 64, 16, 16, 16, batch=2,
                         stride_a=64 * 63, stride_b=63 * 64 + 5, stride_c=64 * 64)
    with pytest.raises(ValueError, match="not one pitched block"):
        pack_steps(prob, ("b",))
    with pytest.raises(ValueError, match="'c' is not 'a', 'b'"):
        pack_steps(prob, ("c",))


def test_odd_ldc_keeps_operand_vectors():
    """C's pitch decides C's stores only: A and B keep their 16-byte loads."""
    kp = constraints.kernel_problem(make_desc(1023, 1024, 1024, "f16", lda=1024, ldc=1023))
    assert kp.operands_vectorizable() and not kp.c_vectorizable()


def test_planner_packs_a_large_odd_problem():
    """6453 x 738 x 9058 bf16 (issue 14: our scalar path 54 TFLOP/s, cuBLAS 196): the copies
    (~84 µs) buy the wgmma kernel; the plan's launch spec is the packed problem's."""
    p = pyblasgemm.plan(6453, 738, 9058, "bfloat16", lda=6455, arch="sm_90")
    assert p.backend == "tensorcore" and p.config.family == "sm90a" and p.pack == ("a", "b")
    cls = p.launch.problem_class
    assert cls[7:9] == (6456, 9064)                  # lda, ldb rounded up to 8 halves
    assert "packs A and B" in p.explain()
    best = min((c for c in p.candidates if c.score is not None), key=lambda c: c.time)
    assert best.pack == ("a", "b") and "copies A and B" in best.score.note
    unpacked = [c for c in p.candidates if c.score is not None and not c.pack and c.backend == "tensorcore"]
    assert unpacked and all(c.config.family != "sm90a" for c in unpacked)


def test_planner_does_not_pack_when_the_copy_costs_more():
    """A small problem: a copy's launch outweighs the faster kernel."""
    p = pyblasgemm.plan(64, 64, 63, "float16", arch="sm_90", backend="tensorcore")
    assert p.pack == ()


# --------------------------------------------------------------------------------------------
# GPU: the packed route against the oracle
# --------------------------------------------------------------------------------------------

def _hopper():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0 and cupy.cuda.Device().compute_capability == "90"
    except Exception:
        return False


hopper = pytest.mark.skipif(not _hopper(), reason="the wgmma/TMA kernels need compute capability 9.0")

_RAW = {"h": "hgemm", "b": "bgemm", "i": "igemm"}
_SM90_TILE = {"h": "sm90a_sliced_128x128x64_w2x1_s6_g8", "b": "sm90a_streamk_128x128x64_w2x1_s6_g8",
              "i": "sm90a_sliced_128x128x128_w2x1_s6_g8"}


def _raw_case(prefix, ta, tb, m, n, k, pad, beta, seed):
    import cupy

    rng = np.random.default_rng(seed)
    ar, ac = (m, k) if ta == "N" else (k, m)
    br, bc = (k, n) if tb == "N" else (n, k)
    lda, ldb, ldc = ar + pad, br + pad, m + 1
    a = random_array(rng, prefix, lda * ac)
    b = random_array(rng, prefix, ldb * bc)
    c = random_array(rng, prefix, ldc * n, c=True)
    alpha = 3 if prefix == "i" else 0.75
    if beta is None:
        if prefix != "i":
            c[:] = np.nan                           # beta = 0 must not read C
        beta = 0
    ref, scale = expected(alpha, col_major(a, ar, ac, lda) if ta == "N" else col_major(a, ar, ac, lda).T,
                          col_major(b, br, bc, ldb) if tb == "N" else col_major(b, br, bc, ldb).T,
                          beta, col_major(c, m, n, ldc))
    dev = [cupy.asarray(x) for x in (a, b, c)]
    return dev, (lda, ldb, ldc), alpha, beta, ref, scale, c


def _fresh(monkeypatch, config=None):
    if config:
        monkeypatch.setenv("PYBLASGEMM_CONFIG", config)
    else:
        monkeypatch.delenv("PYBLASGEMM_CONFIG", raising=False)
    pyblasgemm.clear_plan_cache()


@gpu
@hopper
@pytest.mark.parametrize("prefix,layout", [("h", "NN"), ("h", "NT"), ("h", "TN"), ("h", "TT"),
                                           ("b", "NN"), ("b", "TT"),
                                           ("i", "TN"), ("i", "NN"), ("i", "NT"), ("i", "TT")])
@pytest.mark.parametrize("shape", [(257, 130, 77), (31, 129, 1001), (1, 9, 1)])
@pytest.mark.parametrize("beta", [None, 0.5])
def test_packed_raw_form_matches_oracle(prefix, layout, shape, beta, monkeypatch):
    """A forced wgmma config on odd leading dimensions (and int8 not in "TN") runs only because
    the planner packs (int8: transposes to K-major)."""
    m, n, k = shape
    ta, tb = layout
    if prefix == "i":
        beta = None if beta is None else 2
    (a, b, c), (lda, ldb, ldc), alpha, beta, ref, scale, c_host = _raw_case(prefix, ta, tb, m, n, k, 1, beta, 7)
    _fresh(monkeypatch, _SM90_TILE[prefix])
    try:
        fn = getattr(pyblasgemm, _RAW[prefix])
        p = pyblasgemm.plan(m, n, k, {"h": "f16", "b": "bf16", "i": "i8"}[prefix], transa=ta,
                            transb=tb, lda=lda, ldb=ldb, ldc=ldc, backend="tensorcore")
        assert p.pack and p.config.family == "sm90a", p.explain()
        fn(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, backend="tensorcore")
        got = col_major(c.get(), m, n, ldc)
        check_close(got, ref, scale, prefix, "int32" if prefix == "i" else "fp32", f"{layout} {shape}")
        # C's padding rows (ldc = m + 1) are untouched
        pad = c.get().reshape(n, ldc)[:, m:]
        np.testing.assert_array_equal(pad.view(f"u{pad.itemsize}"),     # bits: NaN == NaN
                                      c_host.reshape(n, ldc)[:, m:].view(f"u{pad.itemsize}"))
    finally:
        _fresh(monkeypatch)


@gpu
@pytest.mark.parametrize("prefix,layout,config", [
    ("h", "NN", "sliced_128x128x64_w2x2_s3_g8"), ("b", "TN", "splitk_parallel_128x128x64_w2x2_s3_k2_g8"),
    ("i", "NT", "sliced_128x128x64_w2x4_s4_g8")])
def test_packed_mma_sync_launch(prefix, layout, config):
    """The tensor-core backend's bind with a plan that packs, on the mma.sync kernel (any sm_80+)."""
    import cupy

    from pyblasgemm.backends import tensorcore
    from pyblasgemm.kernels.pack import PackedLaunch
    from pyblasgemm.planner.model import parse_config_name

    m, n, k = 200, 136, 523
    ta, tb = layout
    (a, b, c), (lda, ldb, ldc), alpha, beta, ref, scale, c_host = _raw_case(prefix, ta, tb, m, n, k, 3, 0.5 if prefix != "i" else 2, 11)
    name = {"h": "f16", "b": "bf16", "i": "i8"}[prefix]
    desc = make_desc(m, n, k, name, transa=ta, transb=tb, lda=lda, ldb=ldb, ldc=ldc)
    desc = desc._replace(alpha=alpha, beta=beta)
    ops = constraints.packable(desc)
    assert ops
    cfg = parse_config_name(config)
    launch = tensorcore.bind(desc, SimpleNamespace(config=cfg, launch=None, pack=ops))
    assert isinstance(launch, PackedLaunch) and launch.inner.problem.operands_vectorizable()
    launch(a.data.ptr, b.data.ptr, c.data.ptr, alpha, beta, cupy.cuda.get_current_stream().ptr)
    assert launch.workspace_nbytes >= sum(s.nbytes for s in launch.steps) > 0   # made on first use
    got = col_major(c.get(), m, n, ldc)
    check_close(got, ref, scale, prefix, "int32" if prefix == "i" else "fp32", layout)


@gpu
@hopper
def test_packed_dense_batch_through_matmul(monkeypatch):
    """numpy.matmul on row-major views with an odd row pitch: one pitched copy per operand
    covers every batch entry."""
    import cupy

    rng = np.random.default_rng(3)
    base_a = random_array(rng, "h", (5, 130, 78))
    base_b = random_array(rng, "h", (5, 77, 67))
    a_h, b_h = base_a[:, :, :77], base_b[:, :, :65]          # pitches 156 and 134 bytes
    a, b = cupy.asarray(base_a)[:, :, :77], cupy.asarray(base_b)[:, :, :65]
    _fresh(monkeypatch, _SM90_TILE["h"])
    try:
        out = pyblasgemm.matmul(a, b, backend="tensorcore")
        ref = np.matmul(a_h.astype(np.float64), b_h.astype(np.float64))
        scale = np.matmul(np.abs(a_h.astype(np.float64)), np.abs(b_h.astype(np.float64)))
        for z in range(5):
            check_close(out[z].get(), ref[z], scale[z], "h", "fp32", f"entry {z}")
    finally:
        _fresh(monkeypatch)


@gpu
@hopper
def test_packed_route_under_graph_capture(monkeypatch):
    """The copies are stream-ordered kernel launches: a captured call replays the eager bits."""
    import cupy

    (a, b, c), (lda, ldb, ldc), alpha, beta, ref, scale, c_host = _raw_case("h", "T", "N", 300, 200, 999, 1, 0.5, 5)
    c0 = c.copy()
    _fresh(monkeypatch, _SM90_TILE["h"])
    try:
        pyblasgemm.hgemm("T", "N", 300, 200, 999, alpha, a, lda, b, ldb, beta, c, ldc, backend="tensorcore")
        eager = c.get()
        c[...] = c0
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            # warm on this stream (its packed storage is made outside capture), then capture
            pyblasgemm.hgemm("T", "N", 300, 200, 999, alpha, a, lda, b, ldb, beta, c, ldc, backend="tensorcore")
            c[...] = c0
            s.begin_capture()
            pyblasgemm.hgemm("T", "N", 300, 200, 999, alpha, a, lda, b, ldb, beta, c, ldc, backend="tensorcore")
            graph = s.end_capture()
            graph.launch(s)
        s.synchronize()
        np.testing.assert_array_equal(c.get(), eager)
    finally:
        _fresh(monkeypatch)


@gpu
def test_auto_plan_packs_a_large_odd_problem():
    """Unforced: the planner packs a 3001 x 2999 x 5001 bf16 product on a Hopper GPU (odd k:
    both row pitches odd; ours predicted 0.70x cuBLAS's cost with the margin), and the result
    matches the oracle on sampled entries."""
    import cupy

    rng = np.random.default_rng(1)
    m, n, k = 3001, 2999, 5001
    a_h = random_array(rng, "b", (m, k))
    b_h = random_array(rng, "b", (k, n))
    a, b = cupy.asarray(a_h), cupy.asarray(b_h)
    pyblasgemm.clear_plan_cache()
    if _hopper():     # row-major A @ B is column-major B^T A^T: ld 2999 and 5001 halves, both odd
        assert pyblasgemm.plan(n, m, k, "bf16").pack == ("a", "b")
    out = pyblasgemm.matmul(a, b).get()
    rows, cols = rng.integers(0, m, 64), rng.integers(0, n, 64)
    a64, b64 = a_h.astype(np.float64), b_h.astype(np.float64)
    ref = np.einsum("ik,ki->i", a64[rows], b64[:, cols])
    scale = np.einsum("ik,ki->i", np.abs(a64[rows]), np.abs(b64[:, cols]))
    check_close(out[rows, cols], ref, scale, "b", "fp32")


@gpu
@hopper
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_int8_batched_layouts_through_matmul(ta, tb, monkeypatch):
    """int8 batches in every arrangement: the transposing copy runs over all entries (grid z)."""
    import cupy

    rng = np.random.default_rng(9)
    z, m, n, k = 3, 200, 136, 300
    a_h = random_array(rng, "i", (z, k, m) if ta else (z, m, k))
    b_h = random_array(rng, "i", (z, n, k) if tb else (z, k, n))
    a = cupy.asarray(a_h)
    b = cupy.asarray(b_h)
    if ta:
        a, a_h = a.transpose(0, 2, 1), a_h.transpose(0, 2, 1)
    if tb:
        b, b_h = b.transpose(0, 2, 1), b_h.transpose(0, 2, 1)
    _fresh(monkeypatch, _SM90_TILE["i"])
    try:
        out = pyblasgemm.matmul(a, b, backend="tensorcore").get()
    finally:
        _fresh(monkeypatch)
    # numpy.matmul's int8 product is int8, wrapping (the kernel's int32 sum, cast once)
    want = np.matmul(a_h.astype(np.int64), b_h.astype(np.int64)).astype(np.int8)
    np.testing.assert_array_equal(out, want)


def test_copy_kernels_compile_without_spills():
    """The package's own NVRTC compile (the one the launcher loads through, jit.load_kernels)
    builds the packing copies on the host (sm_80 and sm_90): no local memory."""
    pytest.importorskip("cupy")          # (as the GEMM kernels' compile tests: the CUDA extras)
    from pyblasgemm.kernels.jit import compile_program
    from pyblasgemm.kernels.pack import COPY_KERNELS, PACK_SOURCE

    for arch in ("sm_80", "sm_90"):
        _, log, lowered = compile_program(PACK_SOURCE.read_text(), "pack_copies.cu", COPY_KERNELS, arch)
        assert set(lowered) == set(COPY_KERNELS)
        for name in COPY_KERNELS:
            assert name in log, log
        assert "spill stores" in log and all(
            "0 bytes spill stores" in ln for ln in log.splitlines() if "spill stores" in ln), log
