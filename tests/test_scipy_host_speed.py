"""pyblasgemm.scipy's repeated NumPy call (issue 35): a call of SciPy's signature whose key
(pyblasgemm.calls.key) was recorded runs the gemm its first call ran on the host again, with
none of SciPy's reading and gemm's checks, and answers what the full path answers: the same
bits, the same array (c itself or a new one), the same floating-point reports; what the key
cannot prove (the scalars' values, c's writability, alignment and overlap) is checked on every
call, and anything else takes the full path."""
import warnings

import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import scipy as pblas

from test_blas_host_speed import _ratios

M, N, K = 7, 5, 129       # odd, and K long enough for the summation order to show in the bits

#: prefix -> (operand dtype, alpha/beta pairs: the common ones, then others)
ROUTINES = {
    "s": (np.float32, [(1.0, 0.0), (2, 0.5), (-0.1, -0.0)]),
    "d": (np.float64, [(1.0, 0.0), (2, 0.5), (-0.1, -0.0)]),
    "c": (np.complex64, [(1.0, 0.0), (0.5 - 1j, 0.25j), (2, 0.5)]),
    "z": (np.complex128, [(1.0, 0.0), (0.5 - 1j, 0.25j), (2, 0.5)]),
    "h": (np.float16, [(1.0, 0.0), (0.5, 2.0)]),
    "b": (ml_dtypes.bfloat16, [(1.0, 0.0), (0.5, 2.0)]),
    "i": (np.int8, [(1, 0), (3, -2)]),
}
#: how c is given: None; a C-ordered c copied; a Fortran-ordered c copied; written in place
C_MODES = ["none", "copy C", "copy F", "in place"]


@pytest.fixture
def full_calls(monkeypatch):
    """Counts the gemm calls pyblasgemm.scipy makes: its full path makes one a call."""
    count = [0]
    real = pblas._gemm

    def counting(*args, **kw):
        count[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(pblas, "_gemm", counting)
    return count


def _data(prefix, trans_a, trans_b, rng, order_a="F", order_b="C"):
    dtype = ROUTINES[prefix][0]
    shape_a = (M, K) if trans_a == 0 else (K, M)
    shape_b = (K, N) if trans_b == 0 else (N, K)
    if prefix == "i":
        a, b = rng.integers(-128, 128, shape_a), rng.integers(-128, 128, shape_b)
        c = rng.integers(-1000, 1000, (M, N))
        c_dtype = np.int32
    else:
        a, b, c = (rng.uniform(-1, 1, s) for s in (shape_a, shape_b, (M, N)))
        if prefix in "cz":
            a, b, c = (x + 1j * rng.uniform(-1, 1, x.shape) for x in (a, b, c))
        c_dtype = dtype
    return (np.array(a, dtype, order=order_a), np.array(b, dtype, order=order_b),
            np.array(c, c_dtype, order="C"))


def _c_for(mode, c):
    """c as the mode gives it, and overwrite_c."""
    if mode == "none":
        return None, 0
    if mode == "copy C":
        return c.copy(order="C"), 0
    return np.asfortranarray(c), 1 if mode == "in place" else 0


def _same(got, want):
    assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
    assert got.flags.f_contiguous == want.flags.f_contiguous
    assert got.tobytes() == want.tobytes()          # bit for bit (NaN's payloads too)


@pytest.mark.parametrize("prefix", list(ROUTINES))
@pytest.mark.parametrize("mode", C_MODES)
@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 2), (2, 1)])
def test_a_repeated_call_gives_the_first_calls_bits(prefix, mode, trans, full_calls):
    """Each call recorded by its full path, then repeated on new data of the same layout:
    the repeat makes no gemm call and answers the full path's bits (computed again with the
    signature forgotten) in the same kind of array (c itself exactly where the full path
    writes c)."""
    fn = getattr(pblas, prefix + "gemm")
    rng = np.random.default_rng(sum(map(ord, prefix + mode)) + 7 * trans[0] + trans[1])
    # bᴴ of a C-ordered b (_data's) is no BLAS flag on its memory: the full path conjugates a
    # copy, every call
    recorded = not (prefix in "cz" and trans[1] == 2)
    for alpha, beta in ROUTINES[prefix][1]:
        pyblasgemm.clear_plan_cache()
        for call in range(3):
            a, b, c0 = _data(prefix, *trans, rng)
            c_want, overwrite = _c_for(mode, c0)
            c_got, _ = _c_for(mode, c0)
            kw = dict(trans_a=trans[0], trans_b=trans[1], overwrite_c=overwrite)
            if mode != "none":
                kw.update(beta=beta, c=c_got)
            before = full_calls[0]
            got = fn(alpha, a, b, **kw)
            full = full_calls[0] - before
            assert full == (call == 0 or not recorded), "a repeated call made a gemm call"
            # the full path's answer: the signature forgotten, the same arguments
            with _forgotten():
                want = fn(alpha, a, b, **dict(kw, c=c_want) if mode != "none" else kw)
            _same(got, want)
            assert (got is c_got) == (want is c_want) == (mode == "in place")


class _forgotten:
    """No signature found for the calls inside: their full path (which records again what
    was recorded)."""

    def __enter__(self):
        self.peek = pblas._peek
        pblas._peek = lambda key: None

    def __exit__(self, *exc):
        pblas._peek = self.peek
        return False


@pytest.mark.parametrize("routine", ["sgemm", "dgemm", "cgemm", "zgemm"])
def test_a_repeat_of_the_common_call_needs_no_gemm(routine, full_calls):
    dtype = {"s": np.float32, "d": np.float64, "c": np.complex64, "z": np.complex128}[routine[0]]
    a = np.ones((4, 4), dtype, order="F")
    fn = getattr(pblas, routine)
    pyblasgemm.clear_plan_cache()
    for _ in range(5):
        np.testing.assert_array_equal(fn(1.0, a, a), np.full((4, 4), 4, dtype))
    assert full_calls[0] == 1


def test_what_the_key_cannot_prove_is_checked_on_every_call(full_calls):
    """Same keys, other facts: a read-only or a misaligned c with overwrite_c (a new array, as
    the first time), a c that is a (computed through a temporary), alpha 0 (C = beta·C),
    scalars past float32 or not finite: the full path each, answering what it answers."""
    pyblasgemm.clear_plan_cache()
    rng = np.random.default_rng(3)
    a = np.asfortranarray(rng.uniform(-1, 1, (4, 4)).astype(np.float32))
    b = np.asfortranarray(rng.uniform(-1, 1, (4, 4)).astype(np.float32))
    c = np.asfortranarray(rng.uniform(-1, 1, (4, 4)).astype(np.float32))

    def both(*args):
        """The call, and the same on copies of its arrays through the full path: equal."""
        copies = [x.copy(order="F") if isinstance(x, np.ndarray) else x for x in args]
        got = pblas.sgemm(*args)
        with _forgotten():
            want = pblas.sgemm(*copies)
        np.testing.assert_array_equal(got, want)
        return got

    assert both(1.0, a, b, 0.5, c.copy(order="F"), 0, 0, 1).flags.f_contiguous  # recorded
    calls = full_calls[0]
    assert both(1.0, a, b, 0.5, c.copy(order="F"), 0, 0, 1) is not None
    assert full_calls[0] == calls + 1                       # (the hit, then the reference)
    read_only = c.copy(order="F")
    read_only.flags.writeable = False
    got = both(1.0, a, b, 0.5, read_only, 0, 0, 1)
    assert got is not read_only
    np.testing.assert_array_equal(read_only, c)
    raw = np.zeros(4 * 4 * 4 + 1, np.uint8)
    misaligned = raw[1:].view(np.float32).reshape((4, 4), order="F")
    misaligned[...] = c
    assert not misaligned.flags.aligned
    assert both(1.0, a, b, 0.5, misaligned, 0, 0, 1) is not misaligned
    a_too = a.copy(order="F")
    want = a_too.astype(np.float64) @ b + 0.5 * a_too
    got = pblas.sgemm(1.0, a_too, b, 0.5, a_too, 0, 0, 1)      # c is a: via a temporary
    assert got is a_too
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for alpha, beta in [(0.0, 0.5), (1e-50, 0.5), (1e39, 0.5), (1.0, 1e39),
                            (float("nan"), 0.5), (1.0, float("inf"))]:
            both(alpha, a, b, beta, c.copy(order="F"), 0, 0, 1)
        assert np.isnan(both(1.0, a, b, float("nan"))).all()    # no c: a zero c, NaN·0
    for context in (_forgotten(), warnings.catch_warnings()):
        with context, pytest.raises(OverflowError, match=r"sgemm: alpha=1000"):
            pblas.sgemm(10**400, a, b, 0.5, c.copy(order="F"), 0, 0, 1)


def test_a_recorded_signature_changes_no_refusal():
    pyblasgemm.clear_plan_cache()
    a = np.ones((3, 4), np.float64, order="F")
    for _ in range(2):
        pblas.dgemm(1.0, a, a, trans_a=1)
    with pytest.raises(pblas.error, match=r"dgemm: trans_a=3 must be 0"):
        pblas.dgemm(1.0, a, a, trans_a=3)
    with pytest.raises(pblas.error, match=r"inner dimensions must agree"):
        pblas.dgemm(1.0, a, a)
    with pytest.raises(ValueError, match=r"dgemm: alpha='x' can't be converted"):
        pblas.dgemm("x", a, a, trans_a=1)


@pytest.mark.parametrize("alpha,beta,c_mode", [(1.0, 0.0, "none"), (2.0, 0.0, "none"),
                                               (1.0, 0.5, "copy F"), (1.0, 0.5, "in place")])
def test_floating_point_exceptions_on_a_repeat_are_reported_as_the_first_time(alpha, beta,
                                                                                c_mode):
    """Once each, in numpy.matmul's words, at the caller's line, as the caller's error state
    says (the full path's report), on the plain product and on the scaled one."""
    pyblasgemm.clear_plan_cache()
    small = np.ones((4, 4), np.float32, order="F")
    big = np.full((4, 4), 3e38, np.float32, order="F")
    c0 = np.ones((4, 4), np.float32)

    def call(x):
        c, overwrite = _c_for(c_mode, c0)
        return pblas.sgemm(alpha, x, x, beta, c, 0, 0, overwrite)

    call(small)                                   # recorded
    for path in (warnings.catch_warnings(), _forgotten()):      # the repeat, the full path
        with path:
            with pytest.warns(RuntimeWarning, match="overflow encountered in matmul") as rec:
                got = call(big)
            assert len(rec) == 1 and rec[0].filename == __file__
            assert np.isinf(got).all()
            with np.errstate(over="raise"), pytest.raises(FloatingPointError):
                call(big)
            seen = []
            with np.errstate(all="call", call=lambda kind, flag: seen.append(kind)):
                call(big)
            assert seen == ["overflow"]
    np.testing.assert_array_equal(call(small), np.full((4, 4), 4 * alpha + beta * (c_mode != "none"),
                                                       np.float32))
    assert np.geterr()["over"] == "warn"


# --- the cost (issue 35: the BLAS forms on NumPy arrays within 10x SciPy's call at 4x4) -----

def _forms(m, a, b, c, cs, in_place) -> dict:
    """The calls timed, on module ``m`` (ours or SciPy's), as lean as each can be written
    (what a lambda adds, it adds to both sides of a ratio)."""
    sgemm, dgemm, cgemm, zgemm = m.sgemm, m.dgemm, m.cgemm, m.zgemm
    sa, sb, da, db, ca, cb, za, zb = a["s"], b["s"], a["d"], b["d"], a["c"], b["c"], a["z"], b["z"]
    zc = c["z"]
    return {"sgemm(1.0, a, b)": lambda: sgemm(1.0, sa, sb),
            "dgemm(1.0, a, b)": lambda: dgemm(1.0, da, db),
            "cgemm(1.0, a, b)": lambda: cgemm(1.0, ca, cb),
            "zgemm(1.0, a, b)": lambda: zgemm(1.0, za, zb),
            "sgemm(2.0, a, b, beta=0.5, c=C-ordered c)": lambda: sgemm(2.0, sa, sb, beta=0.5, c=cs),
            "zgemm(2.0, a, b, beta=0.5j, c=c)": lambda: zgemm(2.0, za, zb, beta=0.5j, c=zc),
            "dgemm(1.0, a, b, trans_a=1, trans_b=2)": lambda: dgemm(1.0, da, db, trans_a=1,
                                                                    trans_b=2),
            "sgemm(2.0, a, b)": lambda: sgemm(2.0, sa, sb),
            "sgemm(1.0, a, b, 0.5, c, overwrite_c=1)": lambda: sgemm(1.0, sa, sb, 0.5, in_place,
                                                                     overwrite_c=1)}


def test_a_repeated_call_costs_within_10x_scipys():
    """At 4x4 a repeated call costs less than 10 times SciPy's own on the same arguments (each
    ratio the median of 31 interleaved rounds; the 2-core dev host under a load of 1-4,
    three runs): s/d/c/z gemm(1.0, a, b) 6.4-7.4x (130-190x before, through SciPy's reading,
    gemm's checks, describe and plan on every call). With beta and a copied c, and with
    trans_a / trans_b: 3.9-10.4x, held under 15x. alpha other than 1 (the product then
    scaled: two NumPy operations more) 14.7-16.8x, and c written in place with beta (three
    more, where SciPy's call allocates nothing) 10.6-12.1x: held under 25x."""
    sblas = pytest.importorskip("scipy.linalg.blas")
    rng = np.random.default_rng(5)
    a = {p: np.asfortranarray(rng.standard_normal((4, 4)) + (1j if p in "cz" else 0)
                              * rng.standard_normal((4, 4))).astype(d)
         for p, d in (("s", np.float32), ("d", np.float64), ("c", np.complex64),
                      ("z", np.complex128))}
    b = {p: np.asfortranarray(x[::-1]) for p, x in a.items()}
    c = {p: np.asfortranarray(x + 1) for p, x in a.items()}
    cs, in_place = np.ascontiguousarray(c["s"]), c["s"].copy(order="F")
    ours, theirs = (_forms(m, a, b, c, cs, in_place) for m in (pblas, sblas))
    bounds = dict.fromkeys(ours, 25)
    bounds.update(dict.fromkeys(list(ours)[:4], 10))
    bounds.update(dict.fromkeys(list(ours)[4:7], 15))
    pyblasgemm.clear_plan_cache()
    for name in ours:
        for _ in range(2):                           # recorded, then repeated
            np.testing.assert_allclose(ours[name](), theirs[name](), rtol=1e-5, atol=1e-5)
    ratios = {name: round(_ratios({"ours": ours[name], "scipy": theirs[name]},
                                  against="scipy")["ours"], 1) for name in ours}
    assert all(ratios[name] < bounds[name] for name in ours), (ratios, bounds)
