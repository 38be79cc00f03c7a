"""The residue tile kernel (issue 34, item 1): ``ozaki_residues_pipe`` splits each scaled
integer q once into ``a 2^28 + b`` and takes each modulus' residue from two DFMA, one DADD and
one IMAD, where the word kernel (``ozaki_residues``) spent ~13 integer instructions; it must
write the word kernel's bytes (every plane, the guard's plane, the line sums). The host tests
replay its arithmetic exactly (rationals) against :func:`pyblasgemm.ozaki.residues` and compile
it with NVRTC (registers, no spills, 16- / 8-byte stores); the GPU tests (marked gpu) compare
the kernels' outputs byte for byte.
"""
from fractions import Fraction

import numpy as np
import pytest

from pyblasgemm import ozaki as oz
from pyblasgemm.kernels import ozaki_kernels as ok
from conftest import gpu_cupy

TILES = ("tile16-pipe", "tile8-pipe")
#: the counts whose float kernels the host compiles too (each count's compile is ~3.5 s here)
FLOAT_COMPILES = (1, 2, 9, 16, 17, 34)
M = 3 * 2**51                           # kRoundMagic, 1.5 * 2^52


def _rint(x: Fraction) -> int:
    """Round to nearest, ties to even: what adding 1.5 * 2^52 in float64 does to |x| < 2^51."""
    f = x.numerator // x.denominator
    rest = x - f
    return f + 1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and f % 2) else f


def _tile_byte(q: int, p: int, c28: float, invp: float) -> int:
    """residue_byte(split28(q)) step by step, each float64 step exact or rounded as the kernel's."""
    a = _rint(Fraction(q, 2**28))                       # fma(q, 2^-28, m) - m
    b = q - a * 2**28                                   # fma(-a, 2^28, q): exact
    assert abs(a) < 2**35 and abs(b) <= 2**27
    v = a * int(c28) + b                                # fma(a, c28, b): exact below 2^53
    assert abs(v) < 2**43
    kx = Fraction(v) * Fraction(invp)                   # fma(v, 1/p, m): one rounding to an integer
    assert abs(kx) < 2**51
    k = _rint(kx)
    r = ((v & 0xFFFFFFFF) - (k & 0xFFFFFFFF) * p) & 0xFF   # low words, one wrapping IMAD
    return r - 256 if r > 127 else r


def test_tile_arithmetic_gives_the_symmetric_residues():
    """For q at the split's and the range's edges and random below 2^62, both signs, all 34
    moduli: the tile kernel's byte is pyblasgemm.ozaki.residues' (the word kernel's)."""
    rng = np.random.default_rng(3434)
    edges = [0, 1, 2**27, 2**27 + 1, 2**28 - 1, 2**28, 2**28 + 2**27, 3 * 2**27, 2**31, 2**32 - 1, 2**52,
             2**53 + 1, 2**55 - 1, 2**61, 2**62 - 1, 2**62 - 2**28 - 2**27]
    qs = edges + [-q for q in edges] + [int(x) for x in rng.integers(-2**62 + 1, 2**62, 1500)]
    qs += [int(x) for x in rng.integers(-2**30, 2**30, 300)]
    t = ok.table_values(len(oz.MODULI))
    for l, p in enumerate(t["kOzMod"]):
        want = oz.residues(np.array(qs, dtype=np.int64), p).tolist()
        got = [_tile_byte(q, p, t["kOzPow28d"][l], t["kOzInvMod"][l]) for q in qs]
        assert got == want, (p, [(q, g, w) for q, g, w in zip(qs, got, want) if g != w][:5])


def test_tables_carry_the_tile_constants():
    t = ok.table_values(3)
    assert t["kOzPow28d"] == [0.0, float(2**28 % 255), float(2**28 % 253)]
    assert t["kOzInvMod"] == [1 / 256, 1 / 255, 1 / 253]
    src = ok.tables_source(3)
    assert "__constant__ double kOzPow28d[3]" in src and "__constant__ double kOzInvMod[3]" in src


@pytest.mark.parametrize("count", range(1, len(oz.MODULI) + 1))
def test_tile_kernels_compile_within_their_launch_bounds_without_spills(count):
    """Every shipped count (sm_90a; float operands at FLOAT_COMPILES' counts), both widths: no
    spill, no stack, registers within the launch bounds (V = 16: 2 blocks of 256, 128; V = 8:
    3 blocks, 80)."""
    pytest.importorskip("cupy")
    from pyblasgemm.kernels import jit

    for element in ("double", "float") if count in FLOAT_COMPILES else ("double",):
        pipes = [n for n in ok.kernel_names(count, element) if n.startswith("ozaki_residues_pipe")]
        _, log = ok.compile_offline(count, "sm_90a", element, names=pipes)
        if "ptxas" not in log:
            pytest.skip("this NVRTC puts no ptxas report in the program log")
        res = {k: v for k, v in jit.ptxas_resources(log).items() if "residues_pipe" in k}
        assert len(res) == 2, res
        for name, r in res.items():
            wide = "Li16EE" in name
            assert r["registers"] <= (128 if wide else 80), (name, r)
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)


def test_tile_kernels_store_16_and_8_bytes_a_plane():
    """PTX: V = 16 stores each plane's bytes as st.global.v4.u32, V = 8 as st.global.v2.u32;
    both load by 8-byte cp.async copies (zero-filled past the edges)."""
    pytest.importorskip("cupy")
    ptx, _ = ok.compile_offline(16, "sm_90a", "double", ptx=True)
    text = ptx.decode() if isinstance(ptx, bytes) else ptx
    entries = {e.split("(")[0]: e for e in text.split(".entry ")[1:]}
    v16 = [e for n, e in entries.items() if n.startswith("_Z19ozaki_residues_pipeILi16EdLi16E")]
    v8 = [e for n, e in entries.items() if n.startswith("_Z19ozaki_residues_pipeILi16EdLi8E")]
    assert len(v16) == 1 and len(v8) == 1
    assert "st.global.v4.u32" in v16[0] and "st.global.v2.u32" not in v16[0]
    assert "st.global.v2.u32" in v8[0]
    assert "cp.async.ca.shared.global" in v16[0] and "cp.async.ca.shared.global" in v8[0]


class _Planes:
    """Stand-in for a CuPy array: residues_kernel_applies reads only data.ptr."""

    def __init__(self, ptr):
        self.data = type("D", (), {"ptr": ptr})()


def test_residues_kernel_applies_needs_the_width_and_16_byte_planes():
    assert ok.residues_kernel_applies(_Planes(256), 4096, "tile16-pipe")
    assert not ok.residues_kernel_applies(_Planes(256), 24, "tile16-pipe")
    assert ok.residues_kernel_applies(_Planes(256), 24, "tile8-pipe")
    assert not ok.residues_kernel_applies(_Planes(264), 4096, "tile8-pipe")
    assert ok.RESIDUES_DEFAULT in ok.RESIDUE_KERNELS


@pytest.mark.parametrize("length,ptr,want", [(4096, 256, ok.RESIDUES_DEFAULT), (24, 256, "tile8-pipe"),
                                             (20, 256, "words"), (7, 256, "words"), (4096, 264, "words")])
def test_residues_kernel_for_falls_back_from_the_default(length, ptr, want):
    """The default where it applies (length % 16 == 0), the pipelined 8-position tile where only
    length % 8 == 0, the word kernel otherwise or for planes off a 16-byte boundary."""
    assert ok.RESIDUES_DEFAULT == "tile16-pipe"
    assert ok.residues_kernel_for(_Planes(ptr), length) == want


# ---------------------------------------------------------------------------------------------
# GPU: the kernels side by side on the same operands

_cupy = gpu_cupy


def _operand(rng, lines, length, real, k_contig, pad):
    """An operand's lines (lines x length) with wide exponent ranges per line, zeros,
    subnormals and a zero line, laid out k-contiguous (line stride length + pad) or
    line-contiguous (position stride lines + pad): (host buffer, s_line, s_k)."""
    vals = rng.standard_normal((lines, length)) * np.exp2(rng.integers(-30, 31, (lines, length)))
    vals[rng.random((lines, length)) < 0.05] = 0.0
    if lines > 2:
        vals[1] = 0.0
        tiny = np.finfo(real).smallest_subnormal
        vals[2, ::3] = tiny * rng.integers(1, 9, vals[2, ::3].shape)
    vals = vals.astype(real)
    if k_contig:
        buf = np.zeros((lines, length + pad), real)
        buf[:, :length] = vals
        return buf.ravel(), length + pad, 1
    buf = np.zeros((length, lines + pad), real)
    buf[:, :lines] = vals.T
    return buf.ravel(), 1, lines + pad


def special_lines(lines: int, length: int):
    """Normal lines (seed 7) but for an Inf in line 3, a NaN in line 4, a -Inf in line 5
    (positions 5, 17 and 40 of every 64) and line 6 scaled by 1e300 (past 2^62 at a normal
    line's exponent)."""
    vals = np.random.default_rng(7).standard_normal((lines, length))
    vals[3, length * 5 // 64] = np.inf
    vals[4, length * 17 // 64] = np.nan
    vals[5, length * 40 // 64] = -np.inf
    vals[6] *= 1e300
    return vals


def _residues(cp, passes, kernel, x, lines, length, s_line, s_k, exps, bits, guard):
    out = cp.full((passes.count + 1, lines, length), 77, cp.int8)
    sums = cp.zeros(lines, cp.uint64) if guard else None
    used = passes.residues(x, lines, length, s_line, s_k, exps, out, bits, sums, kernel=kernel)
    planes = out if guard else out[:passes.count]
    return used, cp.asnumpy(planes).tobytes(), None if sums is None else cp.asnumpy(sums).tolist()


SHAPES = [(5, 16), (33, 128), (70, 272), (129, 400), (64, 1024)]   # length % 16 == 0


@pytest.mark.gpu
@pytest.mark.parametrize("element", ["double", "float"])
@pytest.mark.parametrize("count", range(1, len(oz.MODULI) + 1))
def test_gpu_tile_kernels_write_the_word_kernels_bytes(count, element):
    """Both tile kernels against the word kernel on the same operands: every plane's bytes,
    the guard's plane and the line sums identical, for both layouts (line or position
    contiguous, padded strides), the exponents of the real scaling pass at two bit counts."""
    cp = _cupy()
    real = np.float64 if element == "double" else np.float32
    passes = ok.OzakiPasses(count, None, element)
    rng = np.random.default_rng(count * 2 + (element == "float"))
    for idx, (lines, length) in enumerate(SHAPES):
        k_contig = (idx + count) % 2 == 0
        bits = (55, 62, 26)[(idx + count) % 3]
        host, s_line, s_k = _operand(rng, lines, length, real, k_contig, pad=idx % 3)
        x = cp.asarray(host)
        counts = cp.zeros(2, cp.int32)
        exps, _ = passes.scale(x, lines, length, s_line, s_k, bits, counts)
        for guard in (True, False):
            want = _residues(cp, passes, "words", x, lines, length, s_line, s_k, exps, bits, guard)
            for kernel in TILES:
                got = _residues(cp, passes, kernel, x, lines, length, s_line, s_k, exps, bits, guard)
                assert got[0] == kernel
                assert got[1] == want[1], (kernel, count, element, lines, length, k_contig, bits, guard)
                assert got[2] == want[2], (kernel, "sums")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", TILES)
def test_gpu_tile_kernels_take_the_word_steps_past_2_62(kernel):
    """Elements whose q leaves the split's range (exponents set by hand: |q| >= 2^62, Inf and
    NaN in a line of exponent 0, which only lines the host runs natively hold) get the word
    kernel's bytes too; the other threads of the tile keep the split."""
    cp = _cupy()
    lines, length = 40, 64
    passes = ok.OzakiPasses(16)
    x = cp.asarray(special_lines(lines, length).ravel())
    exps = cp.asarray(np.where(np.arange(lines) < 8, np.int32(0), np.int32(58)).astype(np.int32))
    exps[7] = 70                                  # |x| 2^70: past 2^62, a saturated conversion
    for guard in (True, False):
        want = _residues(cp, passes, "words", x, lines, length, length, 1, exps, 62, guard)
        got = _residues(cp, passes, kernel, x, lines, length, length, 1, exps, 62, guard)
        assert got[1] == want[1] and got[2] == want[2], (kernel, guard)


@pytest.mark.gpu
def test_gpu_residues_default_and_forced_kernels():
    """The default: tile16-pipe where length % 16 == 0, tile8-pipe where only length % 8 == 0, the
    word kernel otherwise (the same bytes each); a forced tile kernel that cannot apply is a
    ValueError naming the length and the address."""
    cp = _cupy()
    passes = ok.OzakiPasses(16)
    rng = np.random.default_rng(11)
    for length, default in ((32, ok.RESIDUES_DEFAULT), (24, "tile8-pipe"), (20, "words"), (7, "words")):
        host, s_line, s_k = _operand(rng, 9, length, np.float64, True, 0)
        x = cp.asarray(host)
        exps, _ = passes.scale(x, 9, length, s_line, s_k, 55, cp.zeros(2, cp.int32))
        got = _residues(cp, passes, None, x, 9, length, s_line, s_k, exps, 55, True)
        want = _residues(cp, passes, "words", x, 9, length, s_line, s_k, exps, 55, True)
        assert got[0] == default and got[1:] == want[1:], length
    out = cp.empty((17, 9, 24), cp.int8)
    with pytest.raises(ValueError, match="row=24"):
        passes.residues(x, 9, 24, 24, 1, exps, out, 55, None, kernel="tile16-pipe")
    with pytest.raises(ValueError, match="row=20: the planes' rows hold the lines' 24 positions"):
        passes.residues(x, 9, 24, 24, 1, exps, out, 55, None, row=20)
    whole = cp.empty(17 * 9 * 32 + 8, cp.int8)
    shifted = whole[8:].reshape(17, 9, 32)
    with pytest.raises(ValueError, match="address % 16 = 8"):
        passes.residues(x, 9, 32, 32, 1, exps, shifted, 55, None, kernel="tile8-pipe")
    with pytest.raises(ValueError, match="kernel='fast'"):
        passes.residues(x, 9, 32, 32, 1, exps, out, 55, None, kernel="fast")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", (None, "words", *TILES))
def test_gpu_padded_rows_hold_the_residues_then_zeros(kernel):
    """``row`` > the lines' length (the moduli GEMM's k rounded up to whole 16-byte lines,
    planner.composite.PLANE_ROW): each plane's row holds the unpadded call's bytes, then zeros
    up to ``row`` (over a buffer poisoned with 77), the guard's plane too, and the line sums
    are the unpadded call's; both layouts, lengths 1000 (-> 1008) and 7 (-> 16)."""
    cp = _cupy()
    passes = ok.OzakiPasses(16)
    rng = np.random.default_rng(1000)
    for lines, length, row, k_contig in ((37, 1000, 1008, True), (37, 1000, 1008, False), (5, 7, 16, True)):
        host, s_line, s_k = _operand(rng, lines, length, np.float64, k_contig, 1)
        x = cp.asarray(host)
        exps, _ = passes.scale(x, lines, length, s_line, s_k, 55, cp.zeros(2, cp.int32))
        _, want, want_sums = _residues(cp, passes, "words", x, lines, length, s_line, s_k, exps, 55, True)
        want = np.frombuffer(want, np.int8).reshape(17, lines, length)
        out = cp.full((17, lines, row), 77, cp.int8)
        sums = cp.zeros(lines, cp.uint64)
        used = passes.residues(x, lines, length, s_line, s_k, exps, out, 55, sums, kernel=kernel, row=row)
        assert used == (kernel or ok.residues_kernel_for(out, row))
        got = cp.asnumpy(out)
        assert (got[:, :, :length] == want).all(), (kernel, lines, length, k_contig)
        assert (got[:, :, length:] == 0).all(), (kernel, lines, length, k_contig)
        assert cp.asnumpy(sums).tolist() == want_sums
