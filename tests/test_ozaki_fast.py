"""The Ozaki scheme's 'fast' scaling (pyblasgemm.ozaki.split_fast, ``scaling='fast'``; issue 34,
1c): each row of A and column of B scaled by its 2-norm, ``|A'B'|_ij <= ||A'_i|| ||B'_j||``
(Cauchy-Schwarz) within the CRT's ``(1/2 - 2^-20) P``.

Checked against exact references (rational arithmetic): the CRT's condition on every line
(Python integers), cases built to sit on the norm bound, the per-element error bound
(:func:`error_bound`) on hard inputs, the guard's promise (never less accurate than native),
that no line keeps fewer bits than the default scaling, the table of thresholds the GPU shares,
and the refusals (a bad ``scaling=``; a GPU array, sent to the GPU's route).
"""
from fractions import Fraction

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import ozaki as oz
from _ref import count_violations, exact

U = 2.0**-53
ROUTINES = {np.float64: oz.dgemm_ozaki, np.complex128: oz.zgemm_ozaki,
            np.float32: oz.sgemm_ozaki, np.complex64: oz.cgemm_ozaki}


def budget(count):
    """Q = floor((1/2 - 2^-20) P), in integers."""
    return ((2**19 - 1) * oz._product(count)) >> 20


def sq_norms(ints, axis):
    """Each line's exact sum of squares (Python integers)."""
    obj = ints.astype(object)
    return np.sum(obj * obj, axis=axis)


def over_bound(c, a, b, how):
    """How many elements (parts) of ``c`` lie further from the exact product than
    :func:`error_bound` says (compared in rational arithmetic)."""
    bound = oz.error_bound(a, b, c, how)
    # the bound leaves float64's underflow out (PRECISIONS: C's scaling rounds to the
    # subnormal grid below 2^-1022, within 2^-1074; float32's row counts its own)
    return count_violations(c, exact(a, b), bound, 1.0, Fraction(2) ** -1074)


# --- hard inputs: (m, k) rows; B is drawn as rows too and transposed -------------------------

def dominated(rng, m, k):
    """Each row one element ~1, the rest ~2^-20 of it: the norm is the largest element's."""
    x = rng.standard_normal((m, k)) * 2.0**-20
    x[np.arange(m), rng.integers(0, k, m)] = rng.uniform(1, 2, m)
    return x


def flat(rng, m, k):
    """Every element of a row one magnitude (random signs): the worst case, norm = sqrt(k) max."""
    return rng.uniform(0.5, 2, (m, 1)) * rng.choice([-1.0, 1.0], (m, k))


def wide(rng, m, k):
    """Elements spread over 2^U(-30, 30) within each row."""
    return rng.standard_normal((m, k)) * np.exp2(rng.uniform(-30, 30, (m, k)))


def subnormal(rng, m, k):
    """Subnormal rows (2^-1074 .. 2^-1030) and rows mixing them with normals near 2^-1000."""
    x = rng.integers(1, 2**40, (m, k)) * 2.0**-1074 * rng.choice([-1.0, 1.0], (m, k))
    x[::2, 0] = 2.0**-1000
    return x


def cancelling(rng, m, k):
    """Rows whose second half repeats the first: against ``cancel_partner`` the products
    cancel to about 2^-40 of Σ|a||b|."""
    x = rng.standard_normal((m, k))
    half = k // 2
    x[:, half:2 * half] = x[:, :half]
    return x


def cancel_partner(rng, n, k):
    y = rng.standard_normal((n, k))
    half = k // 2
    y[:, half:2 * half] = -y[:, :half] * (1 + 2.0**-40)
    return y


KINDS = {"dominated": dominated, "flat": flat, "wide": wide, "subnormal": subnormal, "cancel": cancelling,
         "normal": lambda rng, m, k: rng.standard_normal((m, k))}
SHAPES = [(1, 1, 1), (3, 2, 5), (4, 3, 2), (7, 13, 5), (5, 31, 3), (2, 64, 3)]


def operands(kind, shape, seed=0, dtype=np.float64):
    m, k, n = shape
    rng = np.random.default_rng([seed, m, k, n, list(KINDS).index(kind)])
    a = KINDS[kind](rng, m, k)
    b = (cancel_partner(rng, n, k) if kind == "cancel" else KINDS[kind](rng, n, k)).T.copy()
    if np.dtype(dtype).kind == "c":
        a = a + 1j * KINDS[kind](rng, m, k)
        b = b + 1j * KINDS[kind](rng, n, k).T
    return a.astype(dtype), b.astype(dtype)


# --- the CRT's condition -------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("count", [2, 4, 8, 12, 16, 20])
def test_every_line_within_the_crt_budget(kind, count):
    """Each line's exact Σ A'^2 <= Q, so |A'B'| <= Q by Cauchy-Schwarz; and no line keeps
    fewer bits than the default scaling with bits_for(count, k)."""
    for shape in [(6, 1, 6), (6, 3, 6), (9, 17, 4), (8, 200, 5)]:
        a, b = operands(kind, shape)
        k = shape[1]
        try:
            floor = oz.bits_for(count, k)
        except ValueError:
            continue
        for x, axis in ((a, 1), (b, 0)):
            ints, e = oz.split_fast(x, axis, count)
            assert max(sq_norms(ints, axis)) <= budget(count), (kind, count, shape, axis)
            assert int(np.abs(ints).max()) < 2**oz.MAX_BITS
            _, e_max = oz.split(x, axis, floor)
            live = np.any(x != 0, axis=axis)
            assert np.all(e[live] >= e_max[live]), (kind, count, shape, axis)
            # the scaled integers are the values times 2^e, truncated
            scaled = np.ldexp(x, e[:, None] if axis == 1 else e[None, :])
            assert np.array_equal(ints, np.trunc(scaled).astype(np.int64))


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8, 16, 24, 34])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 9, 64])
def test_on_the_norm_bound_the_crt_stays_exact(count, k):
    """Adversarial: a row equal to the column it meets (|A'.B'| = ||A'||^2, Cauchy-Schwarz with
    equality) with its integers chosen as large as the budget allows, so the product sits
    on (or just under) the bound: reconstruct must give it exactly (within two ulps above
    2^53), and its negation."""
    q = budget(count)
    try:
        floor = oz.bits_for(count, k)
    except ValueError:
        pytest.skip(f"{count} moduli hold nothing at k={k}")
    # the largest integer v with k v^2 <= Q, as a float64 (53 significant bits, rounded down)
    from math import isqrt
    v = isqrt(q // k)
    drop = max(v.bit_length() - 53, 0)
    v = (v >> drop) << drop
    # the top element just below, the rest v: the float test and the floor alike are tried
    for row in ([float(v)] * k, [float(v)] + [float(v >> 1)] * (k - 1), [float(v - (1 << drop))] * k):
        x = np.array([row])
        ints, e = oz.split_fast(x, 1, count)
        bi, f = oz.split_fast(x.T.copy(), 0, count)
        big = int(sq_norms(ints, 1)[0])
        prod = sum(int(p) * int(r) for p, r in zip(ints[0], bi[:, 0]))
        assert prod <= big <= q
        _, e_max = oz.split(x, 1, floor)
        assert e[0] >= e_max[0]
        mods = oz.MODULI[:count]
        for sign in (1, -1):
            got = oz.reconstruct([np.array([[(sign * prod) % p]]) for p in mods], mods)[0, 0]
            want = sign * prod
            if abs(want) < 2**53:
                assert got == want
            else:
                assert abs(Fraction(float(got)) - want) <= 2 * Fraction(2) ** (want.bit_length() - 53)


@pytest.mark.parametrize("count,k", [(2, 1), (3, 2), (4, 3), (8, 7), (16, 9), (16, 64)])
def test_on_the_norm_bound_end_to_end(count, k):
    """The whole product on the bound: a row times itself (and its negation), its squared norm
    within 2^-18 of Q (its elements of 20 significant bits: the norm's bound, NORM_BITS, is
    then exact), exact to the reconstruction's two ulps."""
    from math import isqrt
    v = isqrt(budget(count) // k)
    drop = max(v.bit_length() - oz.NORM_BITS, 0)
    x = np.full((1, k), float((v >> drop) << drop))
    for sign in (1.0, -1.0):
        c, how = oz.dgemm_ozaki(x, sign * x.T, count=count, fallback=False, scaling="fast")
        ints, _ = oz.split_fast(x, 1, count)
        assert int(sq_norms(ints, 1)[0]) > budget(count) * 0.99     # on the bound, not below it
        want = sign * k * Fraction(float(x[0, 0])) ** 2
        assert abs(Fraction(float(c[0, 0])) - want) <= 4 * U * abs(want), (count, k, sign)


def four_squares(q):
    """Integers (a, b, c, d) with a^2 + b^2 + c^2 + d^2 == q (Lagrange), found by a short search
    from the largest down."""
    from math import isqrt
    for a in range(isqrt(q), 0, -1):
        for b in range(isqrt(q - a * a), -1, -1):
            r = q - a * a - b * b
            for c in range(isqrt(r), max(isqrt(r) - 50, -1), -1):
                d = isqrt(r - c * c)
                if d * d == r - c * c:
                    return a, b, c, d
    raise AssertionError(q)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("pad", [0, 3])
def test_exactly_on_the_bound(count, pad):
    """A row of four integers whose squares sum to Q itself (the elements have few enough bits
    that the norm's bound is exact), times its own transpose: |A'B'| = ||A'||^2 = Q, the
    largest the CRT holds; reconstruct must give Q (and -Q) exactly (up to 5 moduli Q < 2^39:
    its four squares have at most 20 bits)."""
    q = budget(count)
    x = np.array([list(map(float, four_squares(q))) + [0.0] * pad])
    ints, e = oz.split_fast(x, 1, count)
    assert e[0] == 0 and int(sq_norms(ints, 1)[0]) == q
    for sign in (1.0, -1.0):
        c, how = oz.dgemm_ozaki(x, sign * x.T, count=count, fallback=False, scaling="fast")
        assert c[0, 0] == sign * q, (count, pad)


# --- accuracy ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32, np.complex64])
def test_the_stated_bound_holds_on_every_element(kind, shape, dtype):
    """error_bound's per-element bound against the exact product: the scheme alone (no
    fallback) at a few dials, and the default."""
    a, b = operands(kind, shape, dtype=dtype)
    call = ROUTINES[dtype]
    for kw in ({"bits": 20}, {"bits": 40}, {}):
        c, how = call(a, b, fallback=False, scaling="fast", **kw)
        assert how.scaling == "fast"
        assert over_bound(c, a, b, how) == 0, (kind, shape, kw)


@pytest.mark.parametrize("kind", ["dominated", "wide", "flat", "normal"])
def test_the_fast_bound_is_within_the_default_bound(kind):
    """2^-e_i <= 2^(1-bits) max|a_i.| on every line, so the per-element bound never exceeds
    the 'max' bound of the same (least) bits."""
    a, b = operands(kind, (6, 40, 5))
    c, how = oz.dgemm_ozaki(a, b, bits=30, fallback=False, scaling="fast")
    fast = oz.error_bound(a, b, c, how)
    assert np.all(fast <= oz.error_bound(a, b, c, how._replace(scaling="max")))


@pytest.mark.parametrize("kind", ["dominated", "wide", "cancel", "subnormal", "normal"])
@pytest.mark.parametrize("shape", [(3, 2, 5), (7, 13, 5), (5, 31, 3), (4, 97, 4)])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_the_guard_still_holds_native_bound(kind, shape, dtype):
    """The default dial with the fast scaling: every element (each part) within native
    float64's γ_k Σ|a||b| (+ k η below the normal range; complex moduli for complex), the
    guard's promise with per-line bits."""
    a, b = operands(kind, shape, dtype=dtype)
    c, how = ROUTINES[dtype](a, b, scaling="fast")
    assert how.guard
    k = shape[1]
    scale = (np.abs(a) @ np.abs(b)) * (1 + 4 * k * U)
    assert count_violations(c, exact(a, b), scale, k * U / (1 - k * U), Fraction(2 * k) * Fraction(2) ** -1074) == 0


def test_the_guard_catches_graded_data_with_per_line_bits():
    """The module's graded example (a column far below the others against a large row):
    the fast scaling keeps more bits, and the guard still sends the element natively when it
    cannot prove native's bound."""
    x = 2.0**-50 * (4 / 3)
    a, b = np.array([[1.0, x]]), np.array([[x], [1.0]])
    c, how = oz.dgemm_ozaki(a, b, scaling="fast")
    assert c[0, 0] == 2 * x and how.native_elements == 1 and how.scaling == "fast"


@pytest.mark.parametrize("kind", list(KINDS))
def test_flat_rows_keep_the_default_bits_or_one_more(kind):
    """A flat row is Cauchy-Schwarz's equality case: the fast scaling keeps the default's bits,
    or one more where the largest element's significand leaves room; a row of the largest
    significand (2 - 2^-52) keeps exactly the default's."""
    rng = np.random.default_rng(3)
    for k in (1, 2, 3, 16, 257, 1024):
        for count in (4, 8, 16):
            floor = oz.bits_for(count, k)
            x = flat(rng, 5, k)
            x[0] = (2 - 2.0**-52) * np.sign(x[0])
            _, e = oz.split_fast(x, 1, count)
            _, e_max = oz.split(x, 1, floor)
            assert np.all((e - e_max >= 0) & (e - e_max <= 1)), (k, count)
            if floor < oz.MAX_BITS:
                assert e[0] == e_max[0], (k, count)


def test_dominated_rows_gain_half_of_log2_k():
    """A row dominated by one element keeps about log2(k) / 2 bits more than the worst case."""
    k, count = 4096, 12
    x = np.zeros((1, k))
    x[0, 5] = 1.5
    _, e = oz.split_fast(x, 1, count)
    _, e_max = oz.split(x, 1, oz.bits_for(count, k))
    assert e[0] - e_max[0] in (6, 7)


def test_fast_is_never_less_accurate_in_bits_and_usually_more_accurate():
    """Same moduli, every line at least as many bits: on dominated rows the error drops."""
    a, b = operands("dominated", (6, 200, 6))
    ref = exact(a, b)
    err = {}
    for scaling in ("max", "fast"):
        c, _ = oz.dgemm_ozaki(a, b, count=8, fallback=False, scaling=scaling)
        err[scaling] = max(abs(Fraction(float(c[i, j])) - r) for (i, j), r in np.ndenumerate(ref))
    assert err["fast"] <= err["max"] / 8


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2, 2), (3, 3, 3), (1, 3, 2), (5, 1, 7)])
def test_small_k_exact_on_integers(shape):
    """k = 1, 2, 3: small integer operands are kept whole, so the product is exact."""
    m, k, n = shape
    rng = np.random.default_rng(k)
    a = rng.integers(-1000, 1000, (m, k)).astype(float)
    b = rng.integers(-1000, 1000, (k, n)).astype(float)
    for count in (2, 3, 4):
        try:
            c, how = oz.dgemm_ozaki(a, b, count=count, fallback=False, scaling="fast")
        except ValueError:
            continue
        if how.bits >= 10:
            assert np.array_equal(c, a @ b), (shape, count)


# --- fallbacks and the default -------------------------------------------------------------

@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32, np.complex64])
def test_inf_and_nan_run_natively(bad, dtype):
    a, b = operands("normal", (3, 4, 2), dtype=dtype)
    a[1, 2] = bad
    c, how = ROUTINES[dtype](a, b, scaling="fast")
    assert how is None
    np.testing.assert_array_equal(c, a @ b)


def test_lines_the_scaling_cannot_hold_run_natively():
    """A nonzero element far below its row's largest truncates to 0 even with the extra bits:
    the row runs natively, as with the default scaling."""
    a = np.array([[1e10, 1e-10], [1.0, 2.0]])
    b = np.array([[0.0, 1.0], [1.0, 0.0]])
    c, how = oz.dgemm_ozaki(a, b, bits=30, scaling="fast")
    assert how.native_rows == 1
    assert c[0, 0] == 1e-10


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32, np.complex64])
def test_the_default_scaling_is_unchanged(dtype):
    a, b = operands("wide", (5, 31, 3), dtype=dtype)
    call = ROUTINES[dtype]
    c0, h0 = call(a, b)
    c1, h1 = call(a, b, scaling="max")
    np.testing.assert_array_equal(c0, c1)
    assert h0 == h1 and h0.scaling == "max"


def test_the_setting_says_so():
    how = oz.setting(1024, scaling="fast")
    assert how.count == oz.setting(1024).count and how.guard
    assert "at least 57 bits" in how.describe() and "'fast'" in how.describe()
    assert how.bound().startswith("|c_ij - exact| <= 2^-e_i * sum_k |b_kj|")
    assert how.bound().endswith("(the guard)")


# --- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("call", [oz.dgemm_ozaki, oz.zgemm_ozaki, oz.sgemm_ozaki, oz.cgemm_ozaki, oz.emulated])
def test_a_bad_scaling_names_argument_value_and_choices(call):
    a = np.ones((2, 2))
    with pytest.raises(ValueError, match=r"scaling='norm': one of 'max', 'fast'"):
        call(a, a, scaling="norm")
    with pytest.raises(ValueError, match=r"scaling=None: one of 'max', 'fast'"):
        oz.setting(8, scaling=None)


@pytest.mark.parametrize("count", [0, len(oz.MODULI) + 1])
def test_split_fast_checks_its_arguments(count):
    with pytest.raises(ValueError, match=rf"count={count} moduli: between 1 and {len(oz.MODULI)}"):
        oz.split_fast(np.ones((2, 2)), 1, count)
    with pytest.raises(ValueError, match=r"axis=2: 0 \(columns\) or 1 \(rows\)"):
        oz.split_fast(np.ones((2, 2)), 2, 4)


def test_long_lines_count_in_coarser_units():
    """Past k = 2^24 the norm's units coarsen so that W stays within 64 bits."""
    assert oz._norm_bits(2**23) == oz.NORM_BITS and oz._norm_bits(2**24) < oz.NORM_BITS
    for k in (1, 2**23, 2**24, 2**30):
        assert k * 4 ** oz._norm_bits(k) < 2**64


class _GpuStandIn:
    """Stands in for a GPU array: what the host functions' check looks at, nothing else."""

    def __init__(self, interface):
        if interface == "cai":
            self.__cuda_array_interface__ = {"shape": (2, 2), "typestr": "<f8", "data": (0, False), "version": 3}
        self._dev = (2, 0) if interface == "dlpack" else (1, 0)

    def __dlpack_device__(self):
        return self._dev

    def __array__(self, dtype=None, copy=None):
        raise AssertionError("the host-only check must refuse before reading the array")


@pytest.mark.parametrize("scaling", sorted(oz.SCALINGS))
@pytest.mark.parametrize("interface", ["cai", "dlpack"])
@pytest.mark.parametrize("call", [oz.dgemm_ozaki, oz.zgemm_ozaki, oz.sgemm_ozaki, oz.cgemm_ozaki, oz.emulated])
def test_a_gpu_array_is_sent_to_the_gpu_route(call, interface, scaling):
    """The module's functions are the host backend; a GPU array is told where the GPU's
    route is (either scaling: the 'fast' one is no longer host-only), before any work."""
    with pytest.raises(TypeError, match=r"b is a GPU array .* compute='int8-ozaki-fast'"):
        call(np.ones((2, 2)), _GpuStandIn(interface), scaling=scaling)


def test_a_cpu_dlpack_array_is_not_refused():
    """A CPU array with DLPack (device type 1, e.g. a torch CPU tensor) goes through."""

    class CpuArray(np.ndarray):
        def __dlpack_device__(self):
            return (1, 0)

    a = np.eye(3).view(CpuArray)
    assert a.__dlpack_device__() == (1, 0)          # (what the check reads: it must see this array)
    c, how = oz.dgemm_ozaki(a, np.eye(3), scaling="fast")
    np.testing.assert_array_equal(c, np.eye(3))


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_torch_and_jax_cpu_arrays_take_the_fast_scaling(framework):
    """PyTorch CPU tensors and JAX CPU arrays (64-bit types on) give the NumPy call's bits."""
    mod = pytest.importorskip(framework)
    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((5, 33)), rng.standard_normal((33, 4)) * np.exp2(rng.integers(-20, 20, (33, 4)))
    want, _ = oz.dgemm_ozaki(a, b, scaling="fast")
    if framework == "torch":
        got, how = oz.dgemm_ozaki(mod.from_numpy(a), mod.from_numpy(b), scaling="fast")
    else:
        from test_composite_gpu import _x64
        with _x64(mod):
            got, how = oz.dgemm_ozaki(mod.numpy.asarray(a), mod.numpy.asarray(b), scaling="fast")
    assert how.scaling == "fast"
    np.testing.assert_array_equal(np.asarray(got), want)


# --- the table the GPU shares, and the public route (compute='int8-ozaki-fast') -------------

def _j_by_division(w, count):
    """The largest j with 4^j W <= Q, from exact integer division (the reference)."""
    q = budget(count)
    return ((q << 64) // w).bit_length() - 1 >> 1 if w else None


@pytest.mark.parametrize("count", [1, 2, 8, 16, 20, 34])
@pytest.mark.parametrize("k", [1, 64, 8192, 2**24, 2**30])
def test_the_threshold_table_gives_the_division_rule_exactly(count, k):
    """norm_thresholds' count of passing entries is the largest j with 4^j W <= Q (computed
    by exact division) for W at every entry's edge (W = T and T + 1) and at the ends; the
    table ends at the cap MAX_BITS - G."""
    table = oz.norm_thresholds(count, k)
    g = oz._norm_bits(k)
    assert len(table) == oz.MAX_BITS - g - oz.NORM_J_LOW + 1
    ws = {1, 2, 3, 2**64 - 1, min(k * 4**g, 2**64 - 1)}
    for t in table.tolist():
        ws |= {t, t + 1} if t < 2**64 - 1 else {t}
    for w in sorted(ws - {0}):                  # a nonzero line's W is at least 1
        j = int(np.sum(np.uint64(w) <= table)) - 1 + oz.NORM_J_LOW
        want = _j_by_division(w, count) - 32
        assert j == min(want, oz.MAX_BITS - g), (w, j, want)


@pytest.mark.parametrize("kind", ["normal", "uniform", "graded", "onehot"])
def test_split_fast_keeps_the_division_rules_exponents(kind):
    """split_fast (now the table's rule) gives the exponents of the division rule it had."""
    rng = np.random.default_rng(len(kind))
    x = {"normal": rng.standard_normal((40, 300)), "uniform": rng.uniform(-1, 1, (40, 300)),
         "graded": rng.standard_normal((40, 300)) * np.exp2(rng.uniform(-30, 30, (40, 300))),
         "onehot": np.where(rng.random((40, 300)) < 0.01, 1.0, 2.0**-20)}[kind]
    x[3] = 0.0
    for count in (4, 12, 16, 34):
        _, e = oz.split_fast(x, 1, count)
        g = oz._norm_bits(300)
        for i, row in enumerate(x):
            big = np.max(np.abs(row))
            if big == 0:
                assert e[i] == 0
                continue
            top = int(np.frexp(big)[1])
            w = sum(max(int(np.ceil(np.ldexp(abs(v), g - top))), int(v != 0)) ** 2 for v in row)
            want = min(_j_by_division(w, count) - 32 + g - top, oz.MAX_BITS - top)
            assert e[i] == want, (count, i)


def test_the_fast_scaling_is_a_compute_mode():
    """'int8-ozaki-fast' and 'int8-ozaki-<bits>-fast' (any case) name the emulated mode with
    the 'fast' scaling; malformed words are refused naming the grammar."""
    from pyblasgemm._types import TYPE_ROWS, resolve_compute
    from pyblasgemm.kinds import ROUTES, ozaki_bits, ozaki_scaling, route_of

    for prefix in "sdcz":
        row = TYPE_ROWS[prefix]
        assert resolve_compute(row, "INT8-Ozaki-Fast", "gemm") == "int8-ozaki-fast"
        assert resolve_compute(row, "int8-ozaki-040-fast", "gemm") == "int8-ozaki-40-fast"
        assert route_of(prefix, "int8-ozaki-40-fast") is ROUTES[(prefix, "int8-ozaki")]
    assert (ozaki_bits("int8-ozaki-fast"), ozaki_scaling("int8-ozaki-fast")) == (None, "fast")
    assert (ozaki_bits("int8-ozaki-40-fast"), ozaki_scaling("int8-ozaki-40-fast")) == (40, "fast")
    assert ozaki_scaling("int8-ozaki-40") == "max" and ozaki_scaling("fp64") == "max"
    assert set(map(ozaki_scaling, ("int8-ozaki-fast", "int8-ozaki"))) == set(oz.SCALINGS)
    a = np.ones((2, 3))
    for bad in ("int8-ozaki-fast-40", "int8-ozaki--fast", "int8-ozaki-0-fast", "int8-ozaki-63-fast",
                "int8-ozaki-fastest", "int8-ozaki-40-fast-fast"):
        with pytest.raises(ValueError, match=r"int8-ozaki-<bits>-fast"):
            pyblasgemm.matmul(a, a.T, compute=bad)


@pytest.mark.parametrize("dtype", list(ROUTINES))
def test_host_matmul_runs_the_fast_scaling(dtype):
    """matmul(compute='int8-ozaki-fast') on NumPy arrays is emulated(..., scaling='fast'),
    rounded once (float32 / complex64), the dial with it too."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((9, 70)) * np.exp2(rng.uniform(-30, 30, (9, 1)))
    b = rng.standard_normal((70, 5))
    if np.dtype(dtype).kind == "c":
        a, b = a + 1j * a[::-1], b - 2j * b[::-1]
    a, b = a.astype(dtype), b.astype(dtype)
    for compute, bits in (("int8-ozaki-fast", None), ("int8-ozaki-30-fast", 30)):
        got = pyblasgemm.matmul(a, b, compute=compute)
        want, how = ROUTINES[dtype](a, b, bits=bits, scaling="fast")
        assert how.scaling == "fast" and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_the_plan_says_fast_the_least_bits_and_the_bound():
    """The plan's count is the data-independent setting(k, scaling='fast') (the default's
    moduli), and explain() gives the scaling, the least bits and OzakiSetting.bound()."""
    from pyblasgemm.planner import FAMILIES, make_desc, plan_for

    for dtype, k2 in (("float64", 4096), ("complex128", 8192), ("float32", 4096)):
        p = plan_for(make_desc(4096, 4096, 4096, dtype, compute="int8-ozaki-fast"), "tensorcore",
                     arch=FAMILIES["sm_90"])
        want = oz.setting(k2, precision=oz.precision_of(dtype), scaling="fast")
        assert p.launch.setting == want and want.count == oz.setting(k2, precision=want.precision).count
        text = p.explain()
        assert want.bound() in text and f"at least {want.bits} bits" in text and "'fast' scaling" in text
