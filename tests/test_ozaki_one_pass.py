"""Scaling and residues in one pass (issue 34, item 1b): ``ozaki_scale_residues`` holds a group
of 8 lines on chip (one CTA, or on Hopper a cluster of up to 8 splitting the positions) between
their statistics and their residues, so each operand is read once. It must give the two
passes' outputs bit for bit: exponents, lost lines, the counters, the 'fast' scaling's line
bits, every residue plane, the guard's plane and the line sums. The host tests pin the shape
rule (which cluster and part of a line each CTA takes, where it does not fit) and the plan's
record; the GPU tests (marked gpu) compare the kernels' outputs byte for byte, and the whole
call with the one pass on and off.
"""
import numpy as np
import pytest

from pyblasgemm.kernels import ozaki_kernels as ok
from pyblasgemm.planner import FAMILIES
from conftest import gpu_cupy
from test_ozaki_residues import _operand, special_lines

HOPPER, AMPERE = FAMILIES["sm_90"], FAMILIES["sm_80"]


@pytest.mark.parametrize("arch", [HOPPER, AMPERE], ids=["sm_90", "sm_80"])
@pytest.mark.parametrize("itemsize", [8, 4])
@pytest.mark.parametrize("lines", [1, 9, 64, 8192])
@pytest.mark.parametrize("contiguous", [False, True], ids=["strided", "contiguous"])
def test_one_pass_shapes_hold_whole_lines_within_shared_memory(arch, itemsize, lines, contiguous):
    """Every row from 16 to 40,000: each shape the device runs covers the row with the fewest
    whole units a CTA and fits the opt-in shared memory, clusters only on Hopper; the list is
    empty exactly where even the largest cluster's CTAs cannot hold their part, never for a
    shorter row than a longer one that fits. The plan's pick is one of them that fits two CTAs
    an SM (strided lines: clusters of at most 4), or None where none does."""
    hopper = tuple(arch.cc) >= (9, 0)
    largest = max(ok.ONE_PASS_CLUSTERS) if hopper else 1
    per_cta = 1 if contiguous else ok.ONE_PASS_LINES
    unit = ok.one_pass_unit(per_cta, arch)
    seen_none = False
    for row in range(16, 40_000, 16 * 37):
        shapes = ok.one_pass_shapes(row, itemsize, arch, contiguous)
        part = -(-(-(-row // largest)) // unit) * unit
        fits = ok.one_pass_smem(part, itemsize, per_cta) <= arch.smem_per_block_optin - 2048
        assert bool(shapes) == fits, (row, shapes)
        assert not (shapes and seen_none), f"row={row} fits after a shorter row did not"
        seen_none = seen_none or not shapes
        for got_lines, q, chunk in shapes:
            assert got_lines == per_cta and q in ok.ONE_PASS_CLUSTERS and q <= largest
            assert chunk == -(-(-(-row // q)) // unit) * unit, (row, q, chunk)
            assert ok.one_pass_smem(chunk, itemsize, per_cta) <= arch.smem_per_block_optin - 2048
        pick = ok.one_pass_shape(lines, row, itemsize, arch, contiguous)
        good = [sh for sh in shapes if 2 * (ok.one_pass_smem(sh.chunk, itemsize, per_cta) + 2048) <= arch.smem_per_sm
                and (contiguous or sh.cluster <= ok.ONE_PASS_STRIDED_CLUSTER)]
        assert (pick is None) == (not good) and (pick is None or pick in good), (row, pick, good)


def test_one_pass_shape_keeps_what_measured_faster():
    """A contiguous line takes a CTA of its own while two fit an SM (8192 doubles), then the
    narrowest cluster that keeps two (16384: clusters of 2); strided lines go 8 to a CTA in
    clusters of at most 4 (4096: 4; 8192 would need 8, measured 0.97x the two passes: None);
    few CTAs take larger clusters while a CTA keeps two units."""
    def shape(*args):
        got = ok.one_pass_shape(*args)
        return None if got is None else tuple(got)

    assert shape(8192, 8192, 8, HOPPER, True) == (1, 1, 8192)
    assert shape(8192, 12288, 8, HOPPER, True) == (1, 1, 12288)
    assert shape(8192, 16384, 8, HOPPER, True) == (1, 2, 8192)
    assert shape(4096, 4096, 8, HOPPER) == (8, 4, 1024)
    assert shape(8192, 8192, 8, HOPPER) is None
    assert shape(8192, 2048, 8, HOPPER) == (8, 2, 1024)
    assert shape(8192, 8192, 4, HOPPER) == (8, 4, 2048)
    assert shape(64, 2048, 8, HOPPER) == (8, 4, 512)
    assert shape(16, 8192, 8, HOPPER, True) == (1, 8, 1024)
    assert shape(8192, 1536, 8, AMPERE) is None
    assert shape(8192, 1024, 8, AMPERE) == (8, 1, 1024)
    assert shape(8192, 4096, 8, AMPERE, True) == (1, 1, 4096)


def test_the_plan_records_the_pass_and_prices_one_read():
    """The plan carries the shapes (executed as they are: no layer asks again), explain() says
    which passes run, and the model prices one read of each operand instead of two."""
    import pyblasgemm
    from pyblasgemm.planner import composite as planned
    from pyblasgemm.planner import make_desc, plan_for

    d = make_desc(4096, 4096, 4096, "float64", compute="int8-ozaki")
    one = plan_for(d, "tensorcore", arch=HOPPER)
    assert [tuple(s) for s in one.launch.one_pass] == [(8, 4, 1024), (1, 1, 4096)]
    assert "scaling and residues: one pass over each operand (A: clusters of 4 CTAs of 8 lines x 1024 " \
           "positions; B: a CTA a line)" in one.explain()
    mixed = plan_for(make_desc(8192, 8192, 8192, "float64", compute="int8-ozaki"), arch=HOPPER)
    assert mixed.launch.one_pass[0] is None and tuple(mixed.launch.one_pass[1]) == (1, 1, 8192)
    assert "scaling and residues: A: a statistics pass, then the residues; B: one pass (a CTA a line)" \
           in mixed.explain()
    try:
        planned.ONE_PASS = False
        pyblasgemm.clear_plan_cache()
        two = plan_for(d, "tensorcore", arch=HOPPER)
    finally:
        planned.ONE_PASS = True
        pyblasgemm.clear_plan_cache()
    assert two.launch.one_pass is None
    assert "a statistics pass, then the residues (the one pass turned off" in two.explain()
    fast = plan_for(make_desc(8192, 8192, 8192, "float64", compute="int8-ozaki-fast"), arch=HOPPER)
    assert fast.launch.one_pass is None and "(the 'fast' scaling: measured 0.93x in one pass" in fast.explain()
    # one read of A and B fewer: 2 x 8 bytes x 4096^2 at the passes' share of the bandwidth
    saved = 2 * 8 * 4096**2 / (HOPPER.dram_bw * planned.PASS_DRAM_EFFICIENCY)
    assert two.launch.passes_s - one.launch.passes_s == pytest.approx(saved, rel=1e-9)
    far = plan_for(make_desc(256, 256, 120000, "float64", compute="int8-ozaki"), "tensorcore", arch=HOPPER)
    assert far.launch.one_pass is None and "or they do not fit on chip)" in far.explain()


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("transa,transb", [("N", "N"), ("N", "T"), ("T", "N"), ("T", "T")])
def test_contiguous_lines_are_the_lines_the_executor_hands_the_passes(dtype, transa, transb):
    """The plan's contiguity per operand is the kernel's own test (k_contig: position stride 1,
    line stride not 1) on the strides composite._ozaki passes, so a CTA of one line is planned
    exactly where the lines are contiguous."""
    from pyblasgemm.planner import make_desc
    from pyblasgemm.planner.composite import contiguous_lines

    d = make_desc(40, 30, 20, dtype, transa=transa, transb=transb)
    if d.row.is_complex:
        strides = ((2 * d.k, 1), (1, 2 * d.n))
    else:
        strides = ((1, d.lda) if transa == "N" else (d.lda, 1), (d.ldb, 1) if transb == "N" else (1, d.ldb))
    assert contiguous_lines(d) == tuple(s_k == 1 and s_line != 1 for s_line, s_k in strides)


# ---------------------------------------------------------------------------------------------
# GPU: the one pass against the two passes on the same operands

_cupy = gpu_cupy


def _two_passes(cp, passes, x, lines, length, row, s_line, s_k, bits, fast, guard):
    counts = cp.zeros(2, cp.int32)
    if fast:
        exps, lost, line_bits = passes.scale_fast(x, lines, length, s_line, s_k, counts)
    else:
        (exps, lost), line_bits = passes.scale(x, lines, length, s_line, s_k, bits, counts), None
    out = cp.full((passes.count + 1, lines, row), 77, cp.int8)
    sums = cp.zeros(lines, cp.uint64) if guard else None
    passes.residues(x, lines, length, s_line, s_k, exps, out, bits, sums, row=row, line_bits=line_bits)
    return _host(cp, passes, exps, lost, line_bits, counts, out, sums, guard)


def _one_pass(cp, passes, x, lines, length, row, s_line, s_k, bits, fast, guard, shape):
    counts = cp.zeros(2, cp.int32)
    out = cp.full((passes.count + 1, lines, row), 77, cp.int8)
    sums = cp.zeros(lines, cp.uint64) if guard else None
    exps, lost, line_bits = passes.scale_residues(x, lines, length, s_line, s_k, bits, counts, out, shape, sums,
                                                  row=row, fast=fast)
    return _host(cp, passes, exps, lost, line_bits, counts, out, sums, guard)


def _host(cp, passes, exps, lost, line_bits, counts, out, sums, guard):
    planes = out if guard else out[:passes.count]
    return {"exps": exps.get().tolist(), "lost": lost.get().tolist(), "counts": counts.get().tolist(),
            "line_bits": None if line_bits is None else line_bits.get().tolist(),
            "planes": cp.asnumpy(planes).tobytes(), "sums": None if sums is None else sums.get().tolist()}


def _shapes(cp, row: int, itemsize: int):
    """Every shape the device runs for both lines-a-CTA (ozaki_kernels.one_pass_shapes)."""
    from pyblasgemm.planner.arch import arch_for_device

    arch = arch_for_device(cp.cuda.Device().id)
    return [s for contiguous in (True, False) for s in ok.one_pass_shapes(row, itemsize, arch, contiguous)]


#: (lines, length, row): lines not a multiple of 8, rows padded past the length, lines of up
#: to 6 chunks of 128
CASES = [(5, 16, 16), (9, 128, 128), (37, 1000, 1008), (70, 272, 272), (20, 700, 704), (16, 2048, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("element", ["double", "float"])
@pytest.mark.parametrize("fast", [False, True], ids=["default", "fast"])
@pytest.mark.parametrize("count", [1, 9, 16, 34])
def test_gpu_one_pass_writes_the_two_passes_bytes(count, fast, element):
    """Every cluster size, both layouts (line- or position-contiguous, padded strides), with and
    without the guard: exponents, lost lines, counters, line bits, planes (over a buffer
    poisoned with 77, the padding's zeros included) and line sums identical to the two passes.
    The operands have wide exponent ranges per line, zeros, a zero line and subnormals (lost
    lines at 26 bits)."""
    cp = _cupy()
    real = np.float64 if element == "double" else np.float32
    passes = ok.OzakiPasses(count, None, element)
    rng = np.random.default_rng(count * 4 + 2 * fast + (element == "float"))
    for idx, (lines, length, row) in enumerate(CASES):
        k_contig = (idx + count) % 2 == 0
        bits = (55, 62, 26)[(idx + count) % 3]
        host, s_line, s_k = _operand(rng, lines, length, real, k_contig, pad=idx % 3)
        x = cp.asarray(host)
        for guard in (True, False):
            want = _two_passes(cp, passes, x, lines, length, row, s_line, s_k, bits, fast, guard)
            for shape in _shapes(cp, row, np.dtype(real).itemsize):
                got = _one_pass(cp, passes, x, lines, length, row, s_line, s_k, bits, fast, guard, shape)
                for key in want:
                    assert got[key] == want[key], (key, shape, lines, length, row, k_contig, bits, guard)


@pytest.mark.gpu
@pytest.mark.parametrize("fast", [False, True], ids=["default", "fast"])
def test_gpu_one_pass_counts_non_finite_and_lost_lines_once_per_cluster(fast):
    """Inf and NaN lines (counted non-finite, their bytes by the word steps), a line past 2^62
    at its exponent, and lost lines: the counters count each line once, not once per CTA of
    its cluster."""
    cp = _cupy()
    lines, length = 40, 1024
    passes = ok.OzakiPasses(16)
    vals = special_lines(lines, length)
    vals[9, 3] = 1e-200                        # lost at any bits: 1e-200 beside elements near 1
    vals[10, 1000] = 1e-40
    x = cp.asarray(vals.ravel())
    for guard in (True, False):
        want = _two_passes(cp, passes, x, lines, length, length, length, 1, 55, fast, guard)
        assert want["counts"][0] == 3 and want["counts"][1] >= 2
        for shape in _shapes(cp, length, 8):
            got = _one_pass(cp, passes, x, lines, length, length, length, 1, 55, fast, guard, shape)
            assert got == want, (shape, guard)


@pytest.mark.gpu
def test_gpu_one_pass_refuses_what_it_cannot_write():
    """A row that is not a whole number of the kernel's positions, misaligned planes, a chunk
    that does not cover the row and a cluster size it has no kernel for: ValueErrors naming
    the value and the bound, before any launch (the counters stay zero)."""
    cp = _cupy()
    passes = ok.OzakiPasses(16)
    x = cp.ones(64 * 256)
    counts = cp.zeros(2, cp.int32)
    out = cp.empty((17, 64, 256), cp.int8)
    with pytest.raises(ValueError, match="row=250: the planes' rows hold the lines' 256 positions"):
        passes.scale_residues(x, 64, 256, 256, 1, 55, counts, out, ok.OnePassShape(8, 1, 256), row=250)
    with pytest.raises(ValueError, match="chunk=128: a multiple of 128 with cluster \\* chunk >= row"):
        passes.scale_residues(x, 64, 256, 256, 1, 55, counts, out, ok.OnePassShape(8, 1, 128))
    with pytest.raises(ValueError, match="chunk=384: a multiple of (512|256) with cluster"):
        passes.scale_residues(x, 64, 256, 256, 1, 55, counts, out, ok.OnePassShape(1, 1, 384))
    with pytest.raises(ValueError, match="cluster=3"):
        passes.scale_residues(x, 64, 256, 256, 1, 55, counts, out, ok.OnePassShape(8, 3, 128))
    with pytest.raises(ValueError, match="lines=4: a CTA holds 1 or 8 lines"):
        passes.scale_residues(x, 64, 256, 256, 1, 55, counts, out, ok.OnePassShape(4, 1, 256))
    whole = cp.empty(17 * 64 * 256 + 8, cp.int8)
    with pytest.raises(ValueError, match="address % 16 = 8"):
        passes.scale_residues(x, 64, 256, 256, 1, 55, counts, whole[8:].reshape(17, 64, 256), ok.OnePassShape(8, 1, 256))
    assert counts.get().tolist() == [0, 0]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
@pytest.mark.parametrize("compute", ["int8-ozaki", "int8-ozaki-fast"])
@pytest.mark.parametrize("m,n,k,trans", [(130, 70, 257, "NN"), (64, 300, 3000, "TN"), (40, 24, 9000, "NT")])
def test_gpu_one_pass_call_has_the_two_pass_bits(monkeypatch, dtype, compute, m, n, k, trans):
    """The whole call with the planner's one pass on and off: the same C, byte for byte, with
    alpha and beta (complex: the stacked operands' 2k), the one pass run for each operand the
    plan gives a shape (the default scaling's lines where it measured faster)."""
    import pyblasgemm
    from pyblasgemm.planner import composite as planned

    cp = _cupy()
    rng = np.random.default_rng(m + n + k)
    ta, tb = trans

    def mat(rows, cols):
        x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-20, 21, (rows, 1)))
        if np.dtype(dtype).kind == "c":
            x = x + 1j * rng.standard_normal((rows, cols))
        return cp.asfortranarray(cp.asarray(x.astype(dtype)))

    shapes = []
    real = ok.OzakiPasses.scale_residues

    def spy(self, *args, **kwargs):
        shapes.append(args[8])
        return real(self, *args, **kwargs)
    monkeypatch.setattr(ok.OzakiPasses, "scale_residues", spy)
    a = mat(*((m, k) if ta == "N" else (k, m)))
    b = mat(*((k, n) if tb == "N" else (n, k)))
    c = mat(m, n)
    runs = {}
    try:
        for one in (True, False):
            monkeypatch.setattr(planned, "ONE_PASS", one)
            pyblasgemm.clear_plan_cache()
            out = c.copy(order="F")
            pyblasgemm.gemm(ta, tb, a, b, out, 1.5, -0.5, compute=compute, backend="tensorcore")
            runs[one] = out.get()
    finally:
        pyblasgemm.clear_plan_cache()
    np.testing.assert_array_equal(runs[True], runs[False])
    two = 2 if np.dtype(dtype).kind == "c" else 1
    itemsize = np.dtype(dtype).itemsize // two
    row = -(-(two * k) // 16) * 16
    from pyblasgemm.planner.arch import arch_for_device

    arch = arch_for_device(cp.cuda.Device().id)
    # (complex: A2's rows contiguous, B2's columns strided)
    contiguous = (True, False) if two == 2 else (ta != "N", tb == "N")
    want = [ok.one_pass_shape(m, row, itemsize, arch, contiguous[0]),
            ok.one_pass_shape(two * n, row, itemsize, arch, contiguous[1])]
    if compute.endswith("fast"):                # (the planner keeps the two passes there)
        want = [None, None]
    assert shapes == [w for w in want if w is not None], (shapes, want)


def test_the_design_note_quotes_the_measured_run():
    """docs/design/ozaki-residue-planes.md's table of the one pass per operand is the H200 run's
    ratios (half the two passes' time over each shape's), rounded as quoted."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    run = json.loads((root / "bench/results/ozaki_one_pass_h200_2026-11-29_4528870.json").read_text())
    note = (root / "docs/design/ozaki-residue-planes.md").read_text()
    rows = {(r["size"], r["compute"]): r["ms"] for r in run["passes"]}

    def ratio(size, operand, shape, compute="int8-ozaki"):
        ms = rows[(size, compute)]
        key = next(k for k in ms if k.startswith(f"{operand} one pass {shape}"))
        return f"{ms['two passes (A and B)'] / 2 / ms[key]:.2f}x"

    assert f"| contiguous, one CTA a line (two an SM) | {ratio(4096, 'B', (1, 1, 4096))} | " \
           f"{ratio(8192, 'B', (1, 1, 8192))} | one an SM: {ratio(16384, 'B', (1, 1, 16384))} |" in note
    assert f"| contiguous, clusters of 2 | {ratio(4096, 'B', (1, 2, 2048))} | {ratio(8192, 'B', (1, 2, 4096))} | " \
           f"{ratio(16384, 'B', (1, 2, 8192))} |" in note
    assert f"| strided, clusters of 8 | {ratio(4096, 'A', (8, 8, 512))} | {ratio(8192, 'A', (8, 8, 1024))} | " \
           f"{ratio(16384, 'A', (8, 8, 2048))} (one an SM) |" in note
    fast = [f"{rows[(s, 'int8-ozaki-fast')]['two passes (A and B)'] / rows[(s, 'int8-ozaki-fast')]['one pass (A and B)']:.2f}x"
            for s in (4096, 8192, 16384)]
    assert f"| 'fast' scaling, one pass for both | {' | '.join(fast)} |" in note
