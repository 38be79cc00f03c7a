"""The row reconstruction kernel (issue 34, item 1): ``ozaki_reconstruct_rows`` reads 4 rows
of each int32 plane as one int4 and must give the element kernel's (``ozaki_reconstruct``)
bits, for every moduli count, real and complex C, float64 and float32, with the guard, lost
lines, alpha / beta and any C layout. The host tests check its integer shortcut (one Barrett
step for ``(x y) mod p``) against the element kernel's two steps, and compile it with NVRTC
(registers, no spills); the GPU tests (marked gpu) compare the kernels' outputs bit for bit.
"""
import numpy as np
import pytest

from pyblasgemm import ozaki as oz
from pyblasgemm.kernels import ozaki_kernels as ok
from conftest import gpu_cupy

ROWS = ("rows-staged", "rows")


def _x_edges_and_random(rng, size=200_000):
    """int32 values: every edge of the digit split (0, ±1, ±2^15, ±2^16, the extremes) and a
    uniform draw over the whole range."""
    edges = [0, 1, -1, 2**15, -2**15, 2**16 - 1, 2**16, -2**16, -2**16 - 1, 2**31 - 1, -2**31, -2**31 + 1,
             255, 256, -255, -256, 2**24, -2**24]
    return np.concatenate([np.array(edges, np.int64),
                           rng.integers(-2**31, 2**31, size, dtype=np.int64)])


def test_one_step_digit_is_the_element_kernels_two_steps():
    """crt_digit(h, lo, l) = mod_wide(h (2^16 y) + lo y + (-2^31 y) mod p) is the element
    kernel's u = ((x mod p) y) mod p for every int32 x and all 34 moduli, its sum below 2^25
    (mod_wide's Barrett quotient is exact below 2^30)."""
    rng = np.random.default_rng(34)
    x = _x_edges_and_random(rng)
    t = ok.table_values(len(oz.MODULI))
    h = ((x & 0xFFFFFFFF) >> 16) ^ 0x8000               # (x >> 16) + 2^15, from the unsigned bits
    lo = x & 0xFFFF
    assert h.min() >= 0 and h.max() < 2**16
    for l, p in enumerate(t["kOzMod"]):
        y = t["kOzCrtY"][l]
        # the element kernel: r = |x| mod p, negated for x < 0, then (r y) mod p
        r = np.abs(x) % p
        r = np.where((x < 0) & (r != 0), p - r, r)
        want = (r * y) % p
        v = h * t["kOzCrtY16"][l] + lo * y + t["kOzCrtYNeg31"][l]
        assert v.max() < 2**25, (p, v.max())
        got = v - ((v * t["kOzMagic"][l]) >> 38) * p      # mod_wide
        np.testing.assert_array_equal(got, want, err_msg=f"modulus {p}")


def test_u32_to_double_is_exact():
    """2^52 + u built from its bits, minus 2^52: u itself for every u below 2^32."""
    u = np.concatenate([np.array([0, 1, 2**31, 2**32 - 1], np.uint64),
                        np.random.default_rng(1).integers(0, 2**32, 10_000, dtype=np.uint64)])
    d = ((np.uint64(0x43300000) << np.uint64(32)) | u).view(np.float64) - 2.0**52
    np.testing.assert_array_equal(d, u.astype(np.float64))


def test_kernel_names_carry_both_row_kernels_and_the_digit_kernels():
    names = ok.kernel_names(16, "float")
    assert "ozaki_reconstruct_rows<16, true, float, true, int>" in names
    assert "ozaki_reconstruct_rows<16, false, float, false, int>" in names
    assert ok.ROWS_DEFAULT in ok.RECONSTRUCT_KERNELS
    # the digit planes of the Hopper int8 kernel's digit store: element, register row and staged
    # 16-row kernels
    assert {n for n in names if n.endswith(f", {ok.DIGIT}>") or "digits16" in n} == {
        "ozaki_reconstruct<16, false, float, unsigned char>", "ozaki_reconstruct<16, true, float, unsigned char>",
        "ozaki_reconstruct_rows<16, false, float, false, unsigned char>",
        "ozaki_reconstruct_rows<16, true, float, false, unsigned char>",
        "ozaki_reconstruct_digits16<16, false, float>", "ozaki_reconstruct_digits16<16, true, float>"}


def test_digit_table_and_the_host_digits_are_the_exact_residues():
    """The digit store's table (its bias= pointer) and its arithmetic replayed on the host
    (``digits_host``: the device's u32 steps) give ``(x y_l) mod p_l`` for the int32 extremes,
    both signs near every power of two, and random products, at every moduli count's moduli."""
    count = len(oz.MODULI)
    t = ok.table_values(count)
    table = ok.digit_table(count)
    assert table.shape == (count, ok.DIGIT_WORDS) and table.dtype == np.uint32
    assert table[:, 0].tolist() == t["kOzMod"] and table[:, 3].tolist() == t["kOzCrtY"]
    assert not table[:, 5:].any()
    edges = [v + d for e in range(32) for v in (2**e, -2**e) for d in (-1, 0, 1)] + [2**31 - 1, -2**31, 0]
    xs = np.array([v for v in edges if -2**31 <= v < 2**31]
                  + np.random.default_rng(3).integers(-2**31, 2**31, 2000).tolist(), np.int64)
    planes = np.broadcast_to(xs.astype(np.int32), (count, xs.size))
    got = ok.digits_host(planes, count)
    want = np.array([[(int(x) * y) % p for x in xs] for y, p in zip(t["kOzCrtY"], t["kOzMod"])])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="3 planes; the table 4 moduli"):
        ok.digits_host(planes[:3], 4)


@pytest.mark.parametrize("count", range(1, len(oz.MODULI) + 1))
def test_row_kernels_compile_within_their_launch_bounds_without_spills(count):
    """Every shipped count (sm_90a): no spill, no stack, the row kernels' registers within
    their launch bounds (3 blocks of 128 threads, or the digits' 6 of 64: 170); the element kernels spill-free too
    (the complex one spilled 20 and 24 bytes at 29 and 30 moduli before its parts were rolled)."""
    pytest.importorskip("cupy")
    from pyblasgemm.kernels import jit

    _, log = ok.compile_offline(count, "sm_90a", "double")
    if "ptxas" not in log:      # NVRTC 13.0 leaves ptxas's report out (test_composite says so too)
        pytest.skip("this NVRTC puts no ptxas report in the program log")
    res = {k: v for k, v in jit.ptxas_resources(log).items() if "reconstruct" in k}
    # 4 row kernels, the real and complex element kernels; the digit planes' 2 row, 2 staged
    # 16-row and 2 element kernels
    assert len(res) == 12, res
    for name, r in res.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)
        if "reconstruct_rows" in name or "digits16" in name:
            assert r["registers"] <= 170, (name, r)


def test_row_kernels_load_16_bytes_per_plane():
    """The PTX of the register kernel has 16-byte non-coherent loads, the staged one 16-byte
    cp.async copies (all issued before the arithmetic: ozaki_values4); the digit planes'
    register kernel one 4-byte word a plane, their staged kernel one 16-byte cp.async a plane."""
    pytest.importorskip("cupy")
    ptx, _ = ok.compile_offline(16, "sm_90a", "double", ptx=True)
    text = ptx.decode() if isinstance(ptx, bytes) else ptx
    entries = text.split(".entry ")
    staged = [e for e in entries if e.startswith("_Z22ozaki_reconstruct_rowsILi16ELb0EdLb1EiE")]
    plain = [e for e in entries if e.startswith("_Z22ozaki_reconstruct_rowsILi16ELb0EdLb0EiE")]
    digits = [e for e in entries if e.startswith("_Z22ozaki_reconstruct_rowsILi16ELb0EdLb0EhE")]
    digits16 = [e for e in entries if e.startswith("_Z26ozaki_reconstruct_digits16ILi16ELb0EdE")]
    assert len(staged) == 1 and len(plain) == 1 and len(digits) == 1 and len(digits16) == 1
    assert staged[0].count("cp.async.cg.shared.global") == 16, staged[0].count("cp.async.cg.shared.global")
    assert plain[0].count("ld.global.nc.v4.s32") == 17          # 16 planes and the guard's
    # the digit planes: one 4-byte word (4 rows' digits) a plane (16, beside the 4 row and 1
    # column exponents and the 'fast' scaling's guard, which reads a row's and the column's
    # bits at each of the 4 rows' tests), and the guard's int32 plane
    assert digits[0].count("ld.global.nc.u32") == 16 + 5 + 8 and digits[0].count("ld.global.nc.v4.s32") == 1
    # the staged 16-row kernel: the planes only by cp.async (the guard's int32 one loaded)
    assert digits16[0].count("cp.async.cg.shared.global") == 16 and "ld.global.nc.v4" not in digits16[0]


# ---------------------------------------------------------------------------------------------
# GPU: the kernels side by side on the same planes

_cupy = gpu_cupy


def _case(cp, rng, count, m, n, cplx, guard, real, ldc, c_offset):
    """Random planes (full int32 range), exponents, lost lines, guard sums and a C buffer
    (column-major m x n of C's real type or interleaved complex, leading dimension ldc, its
    first element c_offset elements into the allocation)."""
    n_prod = 2 * n if cplx else n
    planes = count + (1 if guard else 0)
    prod = cp.asarray(rng.integers(-2**31, 2**31, (planes, n_prod, m), dtype=np.int64).astype(np.int32))
    ea = cp.asarray(rng.integers(-40, 41, m).astype(np.int32))
    eb = cp.asarray(rng.integers(-40, 41, n_prod).astype(np.int32))
    lost_a = cp.asarray((rng.random(m) < 0.1).astype(np.uint8))
    lost_b = cp.asarray((rng.random(n) < 0.1).astype(np.uint8))
    parts = 2 if cplx else 1
    buf = rng.standard_normal(c_offset + parts * ldc * n + 8).astype(real)
    g = None
    if guard:
        sums = rng.integers(0, 1000, m + n_prod).astype(np.uint64)
        sums[rng.random(m + n_prod) < 0.1] = 0                   # zero lines pass
        sums = cp.asarray(sums)
        g = [sums[:m], sums[m:], 1.0, 0.5]
    return prod, ea, eb, lost_a, lost_b, buf, g


def _run(cp, passes, kernel, case, m, n, cplx, ldc, c_offset, alpha, beta):
    prod, ea, eb, lost_a, lost_b, buf, g = case
    c = cp.asarray(buf)
    failed = cp.zeros(1, cp.int32)
    guard = None if g is None else (*g, failed)
    parts = 2 if cplx else 1
    cv = c[c_offset:]
    used = passes.reconstruct(prod, m, n, ea, eb, lost_a, lost_b, cv, parts, parts * ldc, alpha, beta, cplx,
                              guard, kernel=kernel)
    return used, cp.asnumpy(c), int(failed.get()[0])


SHAPES = [(4, 1), (8, 3), (12, 2), (516, 33), (1028, 5)]      # m % 4 == 0; m not a multiple of 512


@pytest.mark.gpu
@pytest.mark.parametrize("element", ["double", "float"])
@pytest.mark.parametrize("count", range(1, len(oz.MODULI) + 1))
def test_gpu_row_kernels_have_the_element_kernels_bits(count, element):
    """Both row kernels against the element kernel on the same random planes: C's bytes and
    the guard's count identical, real and complex, with and without the guard, alpha and beta
    on and off, C's leading dimension m, padded (m + 8) and odd (m + 3), C's first element
    16-byte aligned or not (one element in)."""
    cp = _cupy()
    real = np.float64 if element == "double" else np.float32
    passes = ok.OzakiPasses(count, None, element)
    rng = np.random.default_rng(count * 2 + (element == "float"))
    combos = [  # (cplx, guard, alpha, beta, ldc pad, c_offset)
        (False, False, 1.0, 0.0, 0, 0), (False, True, 1.5, -0.25, 8, 1), (True, False, 1.0, 0.0, 3, 0),
        (True, True, 0.5 - 2j, 1 + 0.25j, 8, 1), (False, True, 1.0, 2.0, 3, 1), (True, True, -1.0, 0.0, 0, 0)]
    for idx, (m, n) in enumerate(SHAPES):
        cplx, guard, alpha, beta, pad, off = combos[(idx + count) % len(combos)]
        for cplx_, guard_ in ((cplx, guard), (not cplx, not guard)):
            case = _case(cp, rng, count, m, n, cplx_, guard_, real, m + pad, off)
            used, want, want_failed = _run(cp, passes, "elements", case, m, n, cplx_, m + pad, off, alpha, beta)
            assert used == "elements"
            for kernel in ROWS:
                used, got, got_failed = _run(cp, passes, kernel, case, m, n, cplx_, m + pad, off, alpha, beta)
                assert used == kernel
                assert got.tobytes() == want.tobytes(), (kernel, count, element, m, n, cplx_, guard_,
                                                         int(np.sum(got != want)))
                assert got_failed == want_failed, (kernel, got_failed, want_failed)
            if guard_ and m * n >= 64:
                assert 0 < want_failed, "the case should exercise the guard's failures"
    # the default: the row kernel where the planes allow it
    case = _case(cp, rng, count, 8, 2, False, False, real, 8, 0)
    assert _run(cp, passes, None, case, 8, 2, False, 8, 0, 1.0, 0.0)[0] == ok.ROWS_DEFAULT


@pytest.mark.gpu
@pytest.mark.parametrize("element", ["double", "float"])
@pytest.mark.parametrize("count", [1, 9, 16, 17, len(oz.MODULI)])
def test_gpu_digit_planes_have_the_int32_planes_bits(count, element):
    """The reconstruction from the digit planes (what the Hopper int8 kernel's digit store
    writes: ``digits_host`` of the int32 planes) and the guard's int32 plane passed apart gives
    the int32 planes' C and guard count, byte for byte: the staged 16-row kernel where m % 16
    == 0 (the default; m = 528: a warp with one copying lane), the register row kernel where
    m % 4 == 0, the element kernel everywhere (odd m too), real and complex, with and without
    the guard, alpha and beta; a forced kernel the planes do not fit and a missing guard plane
    are refused."""
    cp = _cupy()
    real = np.float64 if element == "double" else np.float32
    passes = ok.OzakiPasses(count, None, element)
    rng = np.random.default_rng(100 + count)
    combos = [(False, True, 1.5, -0.25, 8, 1), (True, True, 0.5 - 2j, 1 + 0.25j, 3, 0),
              (False, False, 1.0, 0.0, 0, 0), (True, False, -1.0, 2.0, 8, 1)]
    for idx, (m, n) in enumerate(SHAPES + [(7, 3), (513, 2), (528, 3), (16, 5), (1040, 2)]):
        cplx, guard, alpha, beta, pad, off = combos[idx % len(combos)]
        case = _case(cp, rng, count, m, n, cplx, guard, real, m + pad, off)
        _, want, want_failed = _run(cp, passes, "elements", case, m, n, cplx, m + pad, off, alpha, beta)
        prod = case[0]
        digits = cp.asarray(ok.digits_host(cp.asnumpy(prod[:count]), count))
        low = prod[count] if guard else None
        kernels = [k for k in ok.RECONSTRUCT_KERNELS if k == "elements" or ok.rows_kernel_applies(digits, m, k)]
        assert kernels[0] == ("rows-staged" if m % 16 == 0 else "rows" if m % 4 == 0 else "elements")
        for kernel in [None] + kernels:
            prod_, ea, eb, lost_a, lost_b, buf, g = case
            c = cp.asarray(buf)
            failed = cp.zeros(1, cp.int32)
            parts = 2 if cplx else 1
            used = passes.reconstruct(digits, m, n, ea, eb, lost_a, lost_b, c[off:], parts, parts * (m + pad),
                                      alpha, beta, cplx, None if g is None else (*g, failed), kernel=kernel, low=low)
            assert used == (kernel or kernels[0])
            got = cp.asnumpy(c)
            assert got.tobytes() == want.tobytes(), (used, count, element, m, n, cplx, guard, int(np.sum(got != want)))
            assert int(failed.get()[0]) == want_failed
    prod_, ea, eb, lost_a, lost_b, buf, g = _case(cp, rng, count, 8, 2, False, True, real, 8, 0)
    digits = cp.asarray(ok.digits_host(cp.asnumpy(prod_[:count]), count))
    c = cp.asarray(buf)
    with pytest.raises(ValueError, match="needs m % 16 == 0 and a 16-byte aligned prod, got m=8"):
        passes.reconstruct(digits, 8, 2, ea, eb, lost_a, lost_b, c, 1, 8, 1.0, 0.0, False, kernel="rows-staged")
    with pytest.raises(ValueError, match="pass the guard's int32 plane as low="):
        passes.reconstruct(digits, 8, 2, ea, eb, lost_a, lost_b, c, 1, 8, 1.0, 0.0, False,
                           (*g, cp.zeros(1, cp.int32)))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 5, 7, 514])
def test_gpu_unaligned_planes_take_the_element_kernel(m):
    """m % 4 != 0, or planes one int32 off a 16-byte boundary: the element kernel, and a forced
    row kernel is a ValueError naming m and the address."""
    cp = _cupy()
    passes = ok.OzakiPasses(16)
    rng = np.random.default_rng(m)
    prod, ea, eb, lost_a, lost_b, buf, _ = _case(cp, rng, 16, m, 3, False, False, np.float64, m, 0)
    c = cp.asarray(buf)
    assert not ok.rows_kernel_applies(prod, m)
    assert passes.reconstruct(prod, m, 3, ea, eb, lost_a, lost_b, c, 1, m, 1.0, 0.0, False) == "elements"
    with pytest.raises(ValueError, match=f"m={m}"):
        passes.reconstruct(prod, m, 3, ea, eb, lost_a, lost_b, c, 1, m, 1.0, 0.0, False, kernel="rows")
    # m % 4 == 0 but the planes start 4 bytes past an aligned address
    m4 = 8
    whole = cp.zeros(16 * 3 * m4 + 1, cp.int32)
    shifted = whole[1:].reshape(16, 3, m4)
    assert shifted.data.ptr % 16 == 4 and not ok.rows_kernel_applies(shifted, m4)
    with pytest.raises(ValueError, match="address % 16 = 4"):
        passes.reconstruct(shifted, m4, 3, ea[:m4], eb, lost_a[:m4], lost_b, c, 1, m4, 1.0, 0.0, False,
                           kernel="rows-staged")
    with pytest.raises(ValueError, match="kernel='fast'"):
        passes.reconstruct(prod, m, 3, ea, eb, lost_a, lost_b, c, 1, m, 1.0, 0.0, False, kernel="fast")
