"""pyblasgemm.scipy against scipy.linalg.blas itself: same values (within the routine's
tolerance), shapes, dtypes, memory order, ``overwrite_c`` behaviour and refusals, on NumPy
arrays (and on CuPy arrays on a GPU machine, compared with SciPy on host copies); then a table
of every kind of argument SciPy accepts or refuses, run through both (host), and the rules of
the types SciPy lacks (hgemm, bgemm, igemm)."""
import decimal
import fractions
import itertools
import re
import warnings

import numpy as np
import pytest
import scipy.linalg.blas as sblas

from pyblasgemm import scipy as pblas

from conftest import to_host

#: (prefix, SciPy routine, relative tolerance against SciPy's own result)
ROUTINES = [("s", sblas.sgemm, 2e-5), ("d", sblas.dgemm, 1e-12), ("c", sblas.cgemm, 2e-5),
            ("z", sblas.zgemm, 1e-12)]


def _rand(rng, shape, complex_):
    x = rng.uniform(-1, 1, shape)
    return x + 1j * rng.uniform(-1, 1, shape) if complex_ else x


def _close(got, want, tol):
    scale = np.max(np.abs(want)) if want.size else 1.0
    np.testing.assert_allclose(to_host(got), want, rtol=tol, atol=tol * max(scale, 1.0) * 4)


@pytest.mark.parametrize("prefix,ref,tol", ROUTINES, ids=[r[0] for r in ROUTINES])
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product((0, 1, 2), repeat=2)))
def test_values_shapes_and_order_match_scipy(xp, prefix, ref, tol, trans_a, trans_b):
    rng = np.random.default_rng(7 + 3 * trans_a + trans_b)
    m, n, k = 13, 7, 29                     # odd, prime: no tile multiple
    cplx = prefix in "cz"
    a = _rand(rng, (m, k) if trans_a == 0 else (k, m), cplx)
    b = _rand(rng, (k, n) if trans_b == 0 else (n, k), cplx)
    c = _rand(rng, (m, n), cplx)
    alpha, beta = (0.5 - 0.25j, 1.5 + 1j) if cplx else (0.5, 1.5)
    fn = getattr(pblas, prefix + "gemm")
    for kw in ({}, {"beta": beta, "c": c}):
        want = ref(alpha, a, b, trans_a=trans_a, trans_b=trans_b, **kw)
        args = {k_: (xp.asarray(v) if k_ == "c" else v) for k_, v in kw.items()}
        got = fn(alpha, xp.asarray(a), xp.asarray(b), trans_a=trans_a, trans_b=trans_b, **args)
        assert type(got) is type(xp.asarray(a))
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.flags.f_contiguous and want.flags.f_contiguous
        _close(got, want, tol)


@pytest.mark.parametrize("prefix,ref,tol", ROUTINES[:2], ids=["s", "d"])
def test_overwrite_c_like_scipy(xp, prefix, ref, tol):
    """In place exactly when SciPy is: overwrite_c and a Fortran-ordered c of the routine's type."""
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, (6, 5)), rng.uniform(-1, 1, (5, 4))
    dt = np.float32 if prefix == "s" else np.float64
    fn = getattr(pblas, prefix + "gemm")
    cases = [(dt, "F", 1, True), (dt, "C", 1, False), (dt, "F", 0, False),
             (np.float64 if dt is np.float32 else np.float32, "F", 1, False)]
    for c_dtype, order, overwrite, in_place in cases:
        c0 = rng.uniform(-1, 1, (6, 4))
        c_ref = np.array(c0, dtype=c_dtype, order=order)
        want = ref(2.0, a, b, beta=0.5, c=c_ref, overwrite_c=overwrite)
        assert (want is c_ref) == in_place                          # SciPy's own behaviour
        c_ours = xp.array(c0, dtype=c_dtype, order=order)
        before = to_host(c_ours).copy()
        got = fn(2.0, xp.asarray(a), xp.asarray(b), beta=0.5, c=c_ours, overwrite_c=overwrite)
        assert (got is c_ours) == in_place
        _close(got, want, tol)
        if not in_place:
            np.testing.assert_array_equal(to_host(c_ours), before)   # c untouched


def test_inputs_are_converted_like_scipy():
    """Integer, float64 and C/F-ordered inputs are converted to the routine's type; a finite
    beta without c scales SciPy's zero c (no change); beta = 0 never reads c (NaN there stays
    out)."""
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(pblas.sgemm(1, a, b), sblas.sgemm(1, a, b))
    np.testing.assert_array_equal(pblas.sgemm(1, a, b, beta=2.0), sblas.sgemm(1, a, b, beta=2.0))
    nan_c = np.full((2, 4), np.nan)
    got = pblas.dgemm(1, a, b, beta=0, c=nan_c)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, sblas.dgemm(1, a, b, beta=0, c=nan_c))
    assert pblas.sgemm(1, np.ones((0, 3)), b).shape == sblas.sgemm(1, np.ones((0, 3)), b).shape


def test_shape_errors_name_the_arguments():
    """The refusals say which argument, its shape and what was needed (the table below checks
    that each one names SciPy's argument, as its first word)."""
    a, b = np.ones((2, 3)), np.ones((2, 4))
    with pytest.raises(ValueError, match=r"^sgemm: b has 2 rows.* op\(a\) is 2 x 3"):
        pblas.sgemm(1.0, a, b)
    with pytest.raises(ValueError, match=r"^sgemm: c has shape \(3, 3\).* 2 x 2"):
        pblas.sgemm(1.0, a, a, trans_b=1, c=np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"^sgemm: a has shape \(1, 0, 3\)"):
        pblas.sgemm(1.0, np.ones((1, 0, 3)), b)


@pytest.mark.parametrize("prefix,dtype,c_dtype,rtol", [
    ("h", np.float16, np.float16, 4e-3), ("b", "bfloat16", "bfloat16", 3e-2), ("i", np.int8, np.int32, 0)])
def test_types_scipy_lacks(xp, prefix, dtype, c_dtype, rtol):
    """hgemm, bgemm, igemm keep SciPy's signature for float16, bfloat16 and int8 (int32 out)."""
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    c_dtype = ml_dtypes.bfloat16 if c_dtype == "bfloat16" else c_dtype
    rng = np.random.default_rng(5)
    if prefix == "i":
        a, b = rng.integers(-128, 128, (9, 17)), rng.integers(-128, 128, (11, 17))
        alpha, beta = 2, 3
        c = rng.integers(-1000, 1000, (9, 11))
    else:
        a, b, c = rng.uniform(-1, 1, (9, 17)), rng.uniform(-1, 1, (11, 17)), rng.uniform(-1, 1, (9, 11))
        alpha, beta = 0.5, 0.25
    a_t, b_t, c_t = a.astype(dtype), b.astype(dtype), c.astype(c_dtype)
    got = getattr(pblas, prefix + "gemm")(alpha, xp.asarray(a_t), xp.asarray(b_t), beta=beta,
                                           c=xp.asarray(c_t), trans_b=1)
    assert got.dtype == np.dtype(c_dtype) and got.flags.f_contiguous
    want = alpha * a_t.astype(np.float64) @ b_t.astype(np.float64).T + beta * c_t.astype(np.float64)
    if prefix == "i":
        np.testing.assert_array_equal(to_host(got), want.astype(np.int64).astype(np.int32))
    else:
        np.testing.assert_allclose(to_host(got).astype(np.float64), want, rtol=rtol, atol=rtol * 4)


# --- the same calls on SciPy and on us: every argument SciPy accepts, every refusal ---------
#
# Each check builds its inputs twice (one set for SciPy, one for us: overwrite_c may write into
# them), runs both routines and requires what SciPy does: the same shape, dtype, memory order
# and values (exact: the data are small integers and the scalars multiply them once, so every
# correct GEMM gives the same numbers, NaN where SciPy has NaN; a row marked ROUNDED differs by
# rounding at most), the result being ``c`` itself exactly when SciPy's is, ``c`` untouched
# otherwise; and where SciPy raises, an exception of SciPy's type whose message starts with
# "<routine>: <SciPy's name of the argument at fault>".

PREFIXES = "sdcz"
#: the operand type of each SciPy routine
DTYPE = {"s": np.float32, "d": np.float64, "c": np.complex64, "z": np.complex128}


class Rounded:
    """A table value whose product is rounded differently by different correct GEMMs (complex
    scaling with or without a fused multiply-add): compared within a few units in the last place."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Rounded({self.value!r})"


def _ints(shape, cplx, seed=0):
    """Small integers (complex ones for the complex routines): every sum is exact."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, shape).astype(np.float64)
    return x + 1j * rng.integers(-4, 5, shape) if cplx else x


def _outcome(fn, args, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # ComplexWarning, overflow in casts: both sides
        try:
            return fn(*args, **kwargs), None
        except Exception as exc:                # the refusal itself is what is compared
            return None, exc


def _c_of(args, kwargs):
    return kwargs.get("c", args[4] if len(args) > 4 else None)


def check_like_scipy(prefix, build, name=None, rounded=False):
    """Run scipy.linalg.blas.<prefix>gemm and ours on the calls ``build()`` makes (fresh for
    each); ``name``: the argument a refusal must name (required when SciPy refuses)."""
    routine = prefix + "gemm"
    s_args, s_kwargs = build()
    o_args, o_kwargs = build()
    s_c, o_c = _c_of(s_args, s_kwargs), _c_of(o_args, o_kwargs)
    o_c_before = np.array(o_c, copy=True) if isinstance(o_c, np.ndarray) else None
    want, s_exc = _outcome(getattr(sblas, routine), s_args, s_kwargs)
    got, o_exc = _outcome(getattr(pblas, routine), o_args, o_kwargs)
    if s_exc is not None:
        assert o_exc is not None, f"SciPy raised {s_exc!r}; we returned {got!r}"
        assert isinstance(o_exc, type(s_exc)), f"SciPy raised {s_exc!r}; we raised {o_exc!r}"
        assert name is not None, f"the table does not say which argument {s_exc!r} is about"
        assert re.match(rf"{routine}: {name}\b", str(o_exc)), \
            f"{o_exc!r} does not start with '{routine}: {name}' (SciPy: {s_exc!r})"
        return None
    assert o_exc is None, f"we raised {o_exc!r}; SciPy returned {want!r}"
    assert isinstance(got, np.ndarray)
    assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
    assert got.flags.f_contiguous == want.flags.f_contiguous
    if rounded:
        eps = np.finfo(want.dtype).eps
        scale = max(float(np.nanmax(np.abs(want), initial=0.0)), 1.0)
        np.testing.assert_allclose(got, want, rtol=8 * eps, atol=8 * eps * scale)
    else:
        np.testing.assert_array_equal(got, want)     # NaN where SciPy's NaN are
    assert (got is o_c) == (want is s_c), "c updated in place where SciPy did not, or not where it did"
    if o_c_before is not None and got is not o_c:
        np.testing.assert_array_equal(o_c, o_c_before)          # c untouched
    return got


def _run_table(prefix, values, make_call, name):
    for value in values:
        rounded = isinstance(value, Rounded)
        value = value.value if rounded else value
        check_like_scipy(prefix, lambda: make_call(value), name, rounded)


#: alpha and beta as callers pass them: every Python and NumPy number kind, the strings and
#: sequences SciPy reads (its f2py wrappers take a sequence's first item), and refusals
SCALARS = [
    2, -3, 0, True, False, 2.5, -0.0, 1e-50, 1e300, -1e300, float("nan"), float("inf"),
    10**400, np.float32(2.5), np.float16(0.5), np.float64(-1.5), np.int8(-3), np.uint64(7),
    np.bool_(True), np.longdouble(0.25), 2 + 1j, -0.5j, np.complex64(1 - 2j),
    np.complex128(0.5 + 0.25j), np.clongdouble(1 + 1j),
    "2", "2.5", " -1.5 ", b"3", "nan", "-inf", "1e3", "x", "", "2+1j", np.str_("2"),
    np.str_("x"), np.bytes_(b"2"), decimal.Decimal("0.5"), Rounded(fractions.Fraction(1, 3)),
    Rounded(np.longdouble("0.1")), [2.0], (3,), [[4.0]], [2, 3], [1 + 1j], [], [[]], ["2"],
    np.array(2.0), np.array([1.5]), np.array([[2.5, 7.0]]), np.array([]), np.array("2"),
    np.array(["2"]), np.array(1 + 1j), None, object(), {}, {1: 2},
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_alpha_of_every_kind_like_scipy(prefix):
    cplx = prefix in "cz"

    def call(alpha):
        return (alpha, _ints((3, 4), cplx, 1), _ints((4, 2), cplx, 2)), {}

    _run_table(prefix, SCALARS, call, "alpha")


@pytest.mark.parametrize("prefix", PREFIXES)
def test_beta_of_every_kind_like_scipy(prefix):
    """With c (copied: float64 c for every routine) and without c: SciPy's c is then a zero
    matrix that beta still scales, so NaN and infinite betas give NaN."""
    cplx = prefix in "cz"

    def with_c(beta):
        return (2.0, _ints((3, 4), cplx, 1), _ints((4, 2), cplx, 2)), \
            {"beta": beta, "c": np.asfortranarray(_ints((3, 2), cplx, 3))}

    def without_c(beta):
        return (2.0, _ints((3, 4), cplx, 1), _ints((4, 2), cplx, 2)), {"beta": beta}

    _run_table(prefix, SCALARS, with_c, "beta")
    _run_table(prefix, SCALARS, without_c, "beta")


#: trans_a / trans_b as callers pass them: SciPy reads an int the way f2py does (int() of
#: numbers and strings, a sequence's first item, the real part of a complex), then checks 0..2
TRANS = [
    0, 1, 2, True, False, 1.0, 1.9, 2.5, -0.5, -0.9, np.int8(1), np.uint8(2), np.float32(1.5),
    np.bool_(True), "1", " 2 ", "+1", b"1", 1 + 5j, 0.5 + 3j, np.complex64(2 + 1j), [1], (2, 0),
    [[1]], np.array(1), np.array([2]), None, decimal.Decimal("1.5"), fractions.Fraction(5, 2),
    3, -1, [3], 2**31 - 1, "1.0", "T", "n", "", np.array([]), [], float("nan"), float("inf"),
    2**31, -2**31 - 1, np.uint64(2**63), object(), {},
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("which", ["trans_a", "trans_b"])
def test_trans_flags_of_every_kind_like_scipy(prefix, which):
    cplx = prefix in "cz"

    def call(flag):           # square operands: every op() is a valid product
        return (1.0, _ints((3, 3), cplx, 1), _ints((3, 3), cplx, 2)), {which: flag}

    _run_table(prefix, TRANS, call, which)


#: overwrite_c as callers pass it: SciPy takes what int's __index__ takes, in C int range
OVERWRITE = [0, 1, 2, -1, True, False, np.int64(1), np.int8(0), 2**31 - 1, 0.5, "1", None, [1],
             np.bool_(True), np.float64(1.0), 2**31, -2**31 - 1, 1j]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_overwrite_c_of_every_kind_like_scipy(prefix):
    cplx = prefix in "cz"

    def call(flag):
        c = np.asfortranarray(_ints((3, 2), cplx, 3).astype(DTYPE[prefix]))
        return (2.0, _ints((3, 4), cplx, 1), _ints((4, 2), cplx, 2)), \
            {"beta": 0.5, "c": c, "overwrite_c": flag}

    _run_table(prefix, OVERWRITE, call, "overwrite_c")


#: (a's shape, b's shape, keywords, the argument a refusal names): SciPy's f2py wrappers read
#: a 1-D operand as a column (an empty one as 1 x 0), a 0-d one as 1 x 1, and one of more axes
#: by dropping its length-1 axes and folding the others past the first into the columns
#: (Fortran order)
SHAPES = [
    ((3,), (1, 2), {}, None), ((3, 4), (4,), {}, None), ((3,), (3,), {"trans_a": 1}, None),
    ((), (1, 2), {}, None), ((0,), (0, 2), {}, None), ((1, 3, 4), (4, 2), {}, None),
    ((3, 1, 4), (4, 2), {}, None), ((3, 4, 1), (4, 2), {}, None),
    ((1, 1, 3, 4), (1, 4, 2), {}, None), ((2, 2, 2), (4, 2), {}, None),
    ((1, 1, 1), (1, 2), {}, None), ((2, 3, 1, 2), (6, 1), {}, None),
    ((1, 4, 3), (1, 4, 2), {"trans_a": 1}, None), ((3, 4), (1, 2, 4), {"trans_b": 2}, None),
    ((0, 3), (3, 2), {}, None), ((3, 0), (0, 2), {}, None), ((3, 4), (4, 0), {}, None),
    ((1, 0, 3), (3, 2), {}, "a"), ((3, 4), (2, 0, 2), {}, "b"), ((0, 0, 0), (1, 1), {}, "a"),
    ((3, 4), (3, 2), {}, "b"), ((3, 4), (2, 3), {"trans_b": 1}, "b"),
    ((3, 4), (4, 2), {"trans_a": 1}, "b"), ((2, 2, 2), (2, 2), {}, "b"), ((3,), (3, 2), {}, "b"),
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_operand_shapes_like_scipy(prefix):
    cplx = prefix in "cz"
    for a_shape, b_shape, kwargs, name in SHAPES:
        def call(a_shape=a_shape, b_shape=b_shape, kwargs=kwargs):
            return (1.5, _ints(a_shape, cplx, 1), _ints(b_shape, cplx, 2)), dict(kwargs)

        check_like_scipy(prefix, call, name)


def _operands():
    """(a, b, the argument a refusal names) as callers pass them: any array-like SciPy takes.
    (The refusals make SciPy's f2py print "Reference count error detected" at exit: its own
    double release of a builtin dtype, which NumPy's guard keeps harmless.)"""
    x = _ints((3, 4), False, 1)
    big = np.arange(24.0).reshape(4, 6) % 9 - 4
    return [
        ([[1, 2], [3, 4]], [[1], [2]], None), (((1, 2), (3, 4)), ((5, 6), (7, 8)), None),
        ([["1", "2"], ["3", "-4"]], [["0.5"], ["2"]], None),
        (np.array([[b"1", b"2"]]), np.array([[3.0], [4.0]]), None),
        (np.array([[True, False], [True, True]]), np.eye(2, dtype=bool), None),
        (x.astype(np.int64), x.T.astype(np.int8), None), (x.astype(np.uint8) % 5, x.T, None),
        (x.astype(np.float16), x.T.astype(np.float32), None),
        (x + 2j, x.T - 1j, None), ([[2**62, 1]], [[1], [2]], None),
        (np.array([[1, None]], dtype=object), [[1], [2]], None),
        (np.ascontiguousarray(x), np.asfortranarray(x.T), None), (big[::2, ::-1], big.T[::-1, ::2], None),
        (x.astype(">f8"), x.T.astype(">c16"), None), (x.astype(np.longdouble), x.T, None),
        (None, [[1.0, 2.0]], None), (2.0, [[3.0, 4.0]], None),
        ([[1, 2], [3]], [[1], [2]], "a"), ([["x", "1"]], [[1], [2]], "a"), ({1: 2}, x, "a"),
        (x, [[1, 2], [3]], "b"), (x, [["1"], ["y"]], "b"), (x, {}, "b"), (x, object(), "b"),
    ]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_operand_conversions_like_scipy(prefix):
    for i, (_, _, name) in enumerate(_operands()):
        def call(i=i):
            a, b, _ = _operands()[i]
            return (1.0, a, b), {}

        check_like_scipy(prefix, call, name)


#: (a's shape, b's shape, c's shape or a value, the argument a refusal names): SciPy reads c
#: by f2py's rules for a shape it knows (m x n): a 1-D c when n is 1, a 0-d c when m = n = 1,
#: length-1 axes anywhere; the result has c's own shape. It takes no c for an empty product.
C_SHAPES = [
    ((3, 4), (4, 2), (3, 2), None), ((3, 4), (4, 1), (3,), None), ((3, 4), (4, 2), (1, 3, 2), None),
    ((3, 4), (4, 2), (3, 2, 1), None), ((3, 4), (4, 2), (3, 1, 2), None),
    ((1, 4), (4, 1), (), None), ((1, 4), (4, 1), (1,), None), ((1, 4), (4, 1), (1, 1, 1), None),
    ((1, 4), (4, 1), "scalar", None), ((1, 4), (4, 3), (3,), "c"), ((3, 4), (4, 1), (1, 3), "c"),
    ((3, 4), (4, 2), (2, 3), "c"), ((3, 4), (4, 2), (1, 2), "c"), ((3, 4), (4, 2), (6,), "c"),
    ((3, 4), (4, 2), (3,), "c"), ((3, 4), (4, 2), (3, 2, 2), "c"), ((3, 4), (4, 2), (1, 3), "c"),
    ((3, 4), (4, 2), (1, 1), "c"), ((3, 4), (4, 2), "scalar", "c"), ((3, 4), (4, 1), (2,), "c"),
    ((0, 4), (4, 2), (0, 2), "c"), ((3, 4), (4, 0), (3, 0), "c"), ((3, 0), (0, 2), (3, 2), None),
    ((1, 4), (4, 1), (1, 0), "c"), ((3, 4), (4, 2), "ragged", "c"), ((3, 4), (4, 2), "strings", "c"),
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("overwrite_c", [0, 1])
def test_c_shapes_like_scipy(prefix, overwrite_c):
    cplx = prefix in "cz"
    for a_shape, b_shape, c_shape, name in C_SHAPES:
        def call(a_shape=a_shape, b_shape=b_shape, c_shape=c_shape):
            if c_shape == "scalar":
                c = 3.0
            elif c_shape == "ragged":
                c = [[1, 2], [3]]
            elif c_shape == "strings":
                c = [["1", "x"], ["2", "3"], ["4", "5"]]
            else:
                c = np.asfortranarray(_ints(c_shape, cplx, 3).astype(DTYPE[prefix]))
            return (2.0, _ints(a_shape, cplx, 1), _ints(b_shape, cplx, 2)), \
                {"beta": -0.5, "c": c, "overwrite_c": overwrite_c}

        check_like_scipy(prefix, call, name)


def _c_layouts(prefix):
    """c arrays for a 3 x 2 product (or 3 x 1 for the last ones), and whether SciPy updates them
    in place with overwrite_c: exactly a Fortran-contiguous, aligned, native-order array of the
    routine's type."""
    cplx, dt = prefix in "cz", DTYPE[prefix]
    x = _ints((3, 2), cplx, 3)
    other = {"s": np.float64, "d": np.float32, "c": np.complex128, "z": np.complex64}[prefix]
    raw = np.zeros(x.size * np.dtype(dt).itemsize + 1, np.uint8)
    unaligned = raw[1:].view(dt).reshape((3, 2), order="F")      # Fortran-ordered, misaligned
    unaligned[...] = x
    wide = np.asfortranarray(_ints((3, 4), cplx, 4).astype(dt))
    return [
        np.asfortranarray(x.astype(dt)), np.ascontiguousarray(x.astype(dt)),
        np.asfortranarray(x.astype(other)), np.asfortranarray(x.real.astype(np.int32)),
        wide[:, ::2], np.asfortranarray(x.astype(np.dtype(dt).newbyteorder())),
        unaligned, x.tolist(), np.asfortranarray(x.astype(dt)[None]),
        np.ascontiguousarray(x[:, :1].astype(dt)), x[:, 0].astype(dt), x[:, 0].astype(dt)[::-1],
    ]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("overwrite_c", [0, 1, 7])
def test_c_updated_in_place_exactly_when_scipy_does(prefix, overwrite_c):
    cplx = prefix in "cz"
    for i, c0 in enumerate(_c_layouts(prefix)):
        n = 1 if np.ndim(c0) < 2 or np.shape(c0)[-1] == 1 else 2

        def call(i=i, n=n):
            return (2.0, _ints((3, 4), cplx, 1), _ints((4, n), cplx, 2)), \
                {"beta": 0.5, "c": _c_layouts(prefix)[i], "overwrite_c": overwrite_c}

        check_like_scipy(prefix, call)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_read_only_c_is_copied_not_written(prefix):
    """SciPy writes into a read-only c given with overwrite_c (its wrapper checks only the
    layout) and returns it; we return a new array with SciPy's values and leave c as it was."""
    cplx, dt = prefix in "cz", DTYPE[prefix]
    a, b = _ints((3, 4), cplx, 1), _ints((4, 2), cplx, 2)
    c = np.asfortranarray(_ints((3, 2), cplx, 3).astype(dt))
    c.flags.writeable = False
    got = getattr(pblas, prefix + "gemm")(2.0, a, b, beta=0.5, c=c, overwrite_c=1)
    assert got is not c and got.flags.f_contiguous and got.dtype == dt and got.flags.writeable
    np.testing.assert_array_equal(c, _ints((3, 2), cplx, 3))
    c_scipy = np.asfortranarray(_ints((3, 2), cplx, 3).astype(dt))
    np.testing.assert_array_equal(got, getattr(sblas, prefix + "gemm")(2.0, a, b, beta=0.5, c=c_scipy))


@pytest.mark.parametrize("prefix", PREFIXES)
def test_c_sharing_memory_with_an_operand_gets_the_exact_product_in_place(prefix):
    """overwrite_c with a c that is (or overlaps) a or b: SciPy hands BLAS aliased arguments
    (undefined behaviour: wrong sums, measured); we compute into a temporary and copy it into
    c, which is returned as SciPy returns it."""
    cplx, dt = prefix in "cz", DTYPE[prefix]
    fn = getattr(pblas, prefix + "gemm")
    for n in (4, 70):
        a = np.asfortranarray(_ints((n, n), cplx, 1).astype(dt))
        b = np.asfortranarray(_ints((n, n), cplx, 2).astype(dt))
        want = a.astype(np.complex128) @ b + 2 * a
        got = fn(1.0, a, b, beta=2.0, c=a, overwrite_c=1)
        assert got is a
        np.testing.assert_array_equal(got, want)
        want = a.astype(np.complex128) @ a.T
        got = fn(1.0, a, a, beta=0.0, c=a, trans_b=1, overwrite_c=1)
        assert got is a
        np.testing.assert_array_equal(got, want)
    buf = _ints(30, cplx, 5).astype(dt)
    b = buf[:18].reshape((6, 3), order="F")                 # Fortran-contiguous, both
    c = buf[12:21].reshape((3, 3), order="F")               # c's first 2 columns: b's last one
    want = _ints((3, 6), cplx, 6) @ b.astype(np.complex128) - c
    got = fn(1.0, _ints((3, 6), cplx, 6), b, beta=-1.0, c=c, overwrite_c=1)
    assert got is c
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("prefix", "cz")
def test_beta_with_a_nan_imaginary_part_is_nan_as_reference_blas(prefix):
    """beta = 0 + NaN·i: reference BLAS multiplies c by it (NaN), and so do we, c given or not;
    SciPy's bundled OpenBLAS tests beta == 0 in its x86 kernels in a way that NaN passes, and
    returns alpha·op(a)·op(b) alone (a difference of SciPy's BLAS, not of SciPy's rules)."""
    fn = getattr(pblas, prefix + "gemm")
    a, b = _ints((3, 4), True, 1), _ints((4, 2), True, 2)
    beta = complex(0.0, float("nan"))
    assert np.isnan(fn(1.0, a, b, beta=beta)).all()
    assert np.isnan(fn(1.0, a, b, beta=beta, c=_ints((3, 2), True, 3))).all()


def test_refusals_of_scipys_checks_are_scipys_error_class():
    """What SciPy raises as its f2py module's ``error`` (trans out of range, operand and c
    shapes that do not fit) is ``pyblasgemm.scipy.error``: a ValueError, and an instance of
    SciPy's class too, so that ``except`` clauses written for either catch it."""
    a = np.ones((2, 2))
    with pytest.raises(Exception) as scipy_error:
        sblas.dgemm(1.0, a, a, trans_a=3)
    assert issubclass(pblas.error, ValueError) and issubclass(pblas.error, type(scipy_error.value))
    for kwargs in ({"trans_a": 3}, {"trans_b": -1}, {"b": np.ones((3, 2))}):
        with pytest.raises(pblas.error):
            pblas.dgemm(1.0, a, **{"b": a, **kwargs})
    with pytest.raises(pblas.error):          # an empty product's c (read as 1 x 2, not 0 x 2)
        pblas.dgemm(1.0, np.ones((0, 2)), a, c=np.ones((1, 2)))


# --- the types SciPy lacks: hgemm / bgemm read every argument as sgemm does; igemm's rule ---

@pytest.mark.parametrize("prefix", ["h", "b"])
def test_hgemm_bgemm_read_arguments_as_sgemm(prefix):
    """float16 / bfloat16 with SciPy's argument rules (those of sgemm): small integers are
    exact in both, so the results are SciPy's float32 ones rounded to the type."""
    import ml_dtypes

    dt = np.float16 if prefix == "h" else ml_dtypes.bfloat16
    fn = getattr(pblas, prefix + "gemm")
    x = _ints((3, 4), False, 1)
    calls = [(("2", x, x[:, 0]), {"trans_a": 1.0}), ((np.float32(0.5), x[None], x.T[None]), {}),
             (([1.5], x, x), {"trans_b": True, "beta": float("nan")}),
             ((-1, x, x.T), {"beta": "2", "c": np.ones((3, 1, 3)), "overwrite_c": 1}),
             ((1, x[:, :1], x[:2, :1]), {"trans_b": "1", "beta": None})]
    for args, kwargs in calls:
        want = sblas.sgemm(*args, **kwargs)
        got = fn(*args, **kwargs)
        assert got.dtype == dt and got.shape == want.shape and got.flags.f_contiguous
        np.testing.assert_array_equal(got.astype(np.float32), want)
    with pytest.raises(ValueError, match=rf"^{prefix}gemm: alpha="):
        fn("x", x, x.T)
    with pytest.raises(pblas.error, match=rf"^{prefix}gemm: trans_a="):
        fn(1.0, x, x, trans_a=3)


def test_igemm_refuses_operand_values_outside_int8():
    """SciPy has no igemm. Ours takes any array-like of booleans, integers or floats whose
    values are integers in [-128, 127], and refuses others, naming the argument, the first
    value that does not fit and the bound: nothing wraps (300 is not 44)."""
    ok = np.array([[1, -2], [3, 4]])
    for bad, shown in [([[300, 1]], "300"), ([[-129, 0]], "-129"), ([[1.5, 0]], "1.5"),
                       ([[float("nan"), 0]], "nan"), ([[float("inf"), 1]], "inf"),
                       (np.array([[2**40, 0]]), str(2**40)), (np.array([[200]], np.uint8), "200")]:
        for args, name in [((1, bad, ok[:1].T), "a"), ((1, ok[:, :1], bad), "b")]:
            with pytest.raises(ValueError, match=rf"^igemm: {name}\b.*{re.escape(shown)}.*\[-128, 127\]"):
                pblas.igemm(*args)
    for bad in ([[1 + 1j]], [["1"]], np.array([[None]], dtype=object)):
        with pytest.raises(TypeError, match=r"^igemm: a\b"):
            pblas.igemm(1, bad, [[1]])


def test_igemm_takes_exact_int8_values_of_any_type():
    x = np.array([[-128, 127, 0], [5, -6, 7]])
    want = x.astype(np.int64) @ x.T.astype(np.int64)
    for a in (x, x.astype(np.float64), x.astype(np.int16), x.tolist(), x.astype(np.int8)):
        got = pblas.igemm(1, a, a, trans_b=1)
        assert got.dtype == np.int32 and got.flags.f_contiguous
        np.testing.assert_array_equal(got, want)
    flags = np.array([[True, False], [True, True]])
    np.testing.assert_array_equal(pblas.igemm(2, flags, flags), 2 * flags.astype(int) @ flags)
    np.testing.assert_array_equal(pblas.igemm(1, [3, -4], [[2, 5]]), [[6, 15], [-8, -20]])


def test_igemm_c_alpha_and_beta_must_fit_int32():
    """c: integer values in int32 range (any array-like); alpha, beta: integers (what
    ``operator.index`` takes) in int32 range. The products wrap modulo 2**32 as the int32
    accumulator of cuBLAS does, which the bounds let the caller rely on."""
    a, b = np.array([[1, 2]]), np.array([[3], [4]])                    # a @ b = 11
    lo, hi = -2**31, 2**31 - 1
    np.testing.assert_array_equal(pblas.igemm(hi, a, b), np.array([[11 * hi]]).astype(np.int32))
    np.testing.assert_array_equal(pblas.igemm(1, a, b, beta=lo, c=[[1]]), [[11 + lo]])
    np.testing.assert_array_equal(pblas.igemm(np.int64(2), a, b, beta=True, c=np.array([[hi - 30]])),
                                  [[hi - 8]])
    for kwargs, name, exc in [({"alpha": hi + 1}, "alpha", ValueError), ({"alpha": lo - 1}, "alpha", ValueError),
                              ({"beta": hi + 1, "c": [[0]]}, "beta", ValueError),
                              ({"alpha": 1.5}, "alpha", TypeError), ({"alpha": "2"}, "alpha", TypeError),
                              ({"beta": 0.5, "c": [[0]]}, "beta", TypeError),
                              ({"c": [[hi + 1]], "beta": 1}, "c", ValueError),
                              ({"c": [[0.5]], "beta": 1}, "c", ValueError),
                              ({"c": [[1j]], "beta": 1}, "c", TypeError)]:
        kwargs = {"alpha": 1, **kwargs}
        with pytest.raises(exc, match=rf"^igemm: {name}\b"):
            pblas.igemm(a=a, b=b, **kwargs)
