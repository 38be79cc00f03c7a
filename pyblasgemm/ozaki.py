"""FP64 and FP32 products from exact int8 products: the Ozaki scheme II (Ozaki, Uchino, Imamura 2025).

The algorithm, in the order it runs (each step a function here, so that tests check each):

1. :func:`split` scales each row of ``A`` and each column of ``B`` by a power of two and
   truncates to integers of at most ``bits`` bits: ``A' = trunc(diag(2^e) A)``,
   ``B' = trunc(B diag(2^f))``. Scaling by powers of two is exact; the truncation is the
   method's only rounding of the inputs (elements more than ``bits - 53`` binades below their
   row's or column's largest lose low bits).
2. :func:`residues`: ``A' mod p`` and ``B' mod p`` for each modulus ``p`` of :data:`MODULI`
   (pairwise coprime, at most 256), in the symmetric range, so each fits an int8.
3. The residue products ``(A' mod p) @ (B' mod p)``: exact integer GEMMs (int8 in, int32
   out on tensor cores while ``k · 128² < 2³¹``; on the host, float64 BLAS on small integers,
   exact while ``k · 2¹⁴ < 2⁵³``), reduced mod ``p``.
4. :func:`reconstruct`: the Chinese remainder theorem gives ``A'B'`` as an integer in
   ``(-P/2, P/2)``, ``P`` the product of the moduli, as long as ``|A'B'| <= k · 2^(2·bits)``
   stays below ``P / 2`` with a margin (:func:`bits_for` picks ``bits`` from the moduli):
   one sum of the residues times the CRT basis in 39-bit float64 chunks (exact), minus the
   nearest multiple of P, as a float64 (exact below 2^53, else within two ulps); then
   ``C = 2^-(e+f) · A'B'``.

More moduli, more bits, more accuracy: the precision dial is the moduli count (each one more
int8 GEMM). ``scaling='fast'`` (:data:`SCALINGS`; on the GPU ``compute='int8-ozaki-fast'``) replaces step 1's worst case
by Cauchy–Schwarz: :func:`split_fast` scales each line as far as its 2-norm allows, never to
fewer bits (one modulus saved at equal accuracy on graded or one-element-dominated rows, none on
random normal or uniform data: ``docs/design/ozaki-fast-scaling.md``). Inf and NaN cannot be
scaled: :func:`dgemm_ozaki` answers those products with native float64 arithmetic (and says so), and likewise the rows and columns whose range the
scaling cannot hold (a nonzero element more than ``bits`` binades below its row's largest).
:func:`zgemm_ozaki` runs complex products through the same steps.

**float32 and complex64** (:func:`sgemm_ozaki`, :func:`cgemm_ozaki`): their values are exact in
float64, so the same steps run on them with fewer bits (:data:`PRECISIONS`: the default keeps
:data:`DEFAULT_BITS_FP32`, 8 moduli at k = 1024 where float64's default takes 16), and the
float64 result is rounded once to float32; the native arithmetic of the fallbacks is float32's
(SGEMM / CGEMM: NumPy's float32 matmul on the host, cuBLAS on the GPU).

**The guard** (the default dial and any dial of at least :data:`DEFAULT_BITS`, float32's
:data:`DEFAULT_BITS_FP32`): the result is never less accurate than native arithmetic's error
bound ``γ_k · Σ_k |a_ik| |b_kj|`` (u of float64, or of float32), on any input. An element kept to few bits (one far below its row's largest) is harmless unless
its partner in the product is large, so no per-line test can decide it; the guard decides
per element of C, at the price of one more int8 GEMM (:func:`guard_failures`):

5. an extra plane holds the top :data:`GUARD_HI_BITS` bits of each ``|A'|`` and ``|B'|``; its
   int8 product ``L`` bounds ``Σ|a||b|`` from below, and integer line sums bound the
   truncation error (about ``Σ|A'| + Σ|B'|``) from above. Where the bound on the error exceeds
   ``(k - 4) u · Σ|a||b|`` (``4u``: the reconstruction's two ulps; float32: ``(k - 2) u``, the
   rounding to float32 and the float64 reconstruction's 2^-51 within ``2u``), that element of
   C is computed natively. Random data passes everywhere from k = 8 on; graded data, a column of
   A far below the others against a large row of B, does not (:func:`dgemm_ozaki`'s example).

Example
-------
>>> import numpy as np
>>> from pyblasgemm import ozaki
>>> a = np.array([[1.5, -2.0], [0.25, 3.25]]); b = np.array([[4.0, 0.5], [-1.0, 2.0]])
>>> c, how = ozaki.dgemm_ozaki(a, b)
>>> c.tolist(), how.count, how.bits
([[8.0, -3.25], [-2.25, 6.625]], 15, 57)
>>> c32, how = ozaki.sgemm_ozaki(a.astype(np.float32), b.astype(np.float32), bits=20)
>>> c32.dtype, c32.tolist(), how.count, how.bits, how.precision
(dtype('float32'), [[8.0, -3.25], [-2.25, 6.625]], 6, 20, 'float32')
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._arrays import array_module_name, xp_of

__all__ = ["MODULI", "MAX_BITS", "DEFAULT_BITS", "DEFAULT_BITS_FP32", "GUARD_HI_BITS", "GUARD_SUM_BITS",
           "Precision", "PRECISIONS", "precision_of", "SCALINGS", "NORM_BITS", "NORM_J_LOW", "OzakiSetting", "bits_for",
           "error_bound", "setting", "split", "norm_thresholds", "split_fast", "line_bits", "residues", "reconstruct", "crt_chunks",
           "crt_tables", "residue_products_host",
           "guard_constants", "guard_unit", "guard_planes", "guard_failures", "dgemm_ozaki", "zgemm_ozaki", "sgemm_ozaki",
           "cgemm_ozaki", "emulated"]

#: pairwise coprime moduli of at most 256 (a residue in the symmetric range fits an int8),
#: largest first: 2^8, then 255 = 3·5·17, 253 = 11·23, 247 = 13·19, then primes that share
#: no factor with those
MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 211, 199, 197, 193, 191, 181,
          179, 173, 167, 163, 157, 151, 149, 139, 137, 131, 127, 113, 109, 107, 103, 101, 97)

#: the most bits a scaled integer may have: A'·2^0 fits int64 with room for the sign
MAX_BITS = 62
#: the default: every input kept to 55 bits relative to its row's (column's) largest element.
#: Worst max relative error against a long-double reference (48 x k x 48, random normal, three
#: draws, host): 53 bits lose to native float64 up to k = 64 and tie it at 1024 (1.15e-16 vs
#: 1.45e-16); 55 bits are 2-10x below native at every k from 8 to 1024 (2.1e-16 vs 2.8e-16 at
#: k = 8, 1.5e-17 vs 1.5e-16 at 1024). 16 moduli hold it up to k = 8192.
DEFAULT_BITS = 55
#: float32's default (float32 and complex64 operands): float64's rule, the unit roundoff's bits
#: plus two (24 + 2). Worst max relative error against a long-double reference (48 x k x 48,
#: random normal, host): 26 bits are 2-6x below native float32 (NumPy's SGEMM) at every k from
#: 8 to 4096 (6.8e-8 vs 1.4e-7 at k = 8, 4.8e-9 vs 2.9e-8 at 4096) and the guard passes every
#: element from k = 8 on; 25 bits tie native at k = 8 and fail the guard for 3% of C there.
#: 8 moduli hold it up to k = 1024, 9 up to k = 65536.
DEFAULT_BITS_FP32 = 26


class Precision(NamedTuple):
    """The type a product is rounded to, and what the scheme's bound and guard take from it."""

    name: str           # 'float64' / 'float32': the type of C's (real) parts
    unit_bits: int      # u = 2^-unit_bits, the unit roundoff of that type
    default_bits: int   # the default dial; the guard is on from it up
    #: the roundings after the exact integer product, in units of u: float64, the
    #: reconstruction's two ulps (4u); float32, the rounding to float32 (u) plus the float64
    #: reconstruction's two float64 ulps (2^-51, below u): 2u
    rounding: int
    #: absolute error of the last rounding below the type's normal range (one subnormal ulp,
    #: float32's 2^-149); 0 for float64, whose bound leaves an underflowing C out (the scaled
    #: float32 products, at least 2^-298, never underflow float64)
    underflow: float


#: one row per type the scheme rounds to
PRECISIONS = {p.name: p for p in (
    Precision("float64", 53, DEFAULT_BITS, 4, 0.0),
    Precision("float32", 24, DEFAULT_BITS_FP32, 2, 2.0**-149),
)}


def precision_of(dtype) -> str:
    """The :data:`PRECISIONS` row of an operand type: float64 / complex128 -> 'float64',
    float32 / complex64 -> 'float32'.

    >>> precision_of(np.complex64), precision_of("float64")
    ('float32', 'float64')
    """
    d = np.dtype(dtype)
    name = {"f8": "float64", "c16": "float64", "f4": "float32", "c8": "float32"}.get(f"{d.kind}{d.itemsize}")
    if name is None:
        raise TypeError(f"the Ozaki scheme takes float64, complex128, float32 or complex64 operands, got {d}")
    return name


#: the guard's lower bound of Σ|a||b| keeps the top 7 bits of each |A'| (an int8 up to 127):
#: the extra plane is one more int8 GEMM, and 127² · k < 2³¹ holds wherever the others do
GUARD_HI_BITS = 7
#: the guard's line sums count |A'| in units of 2^(bits - 16), rounded up: exact integers
#: (order-independent on the GPU's atomics), at most k · (2^16 + 1) < 2^53
GUARD_SUM_BITS = 16

#: how :func:`split` / :func:`split_fast` pick each row's (column's) power of two, and the bound
#: on ``|A'B'|`` that keeps the CRT exact (the ``scaling=`` argument; 'max' the default)
SCALINGS = {
    "max": "the largest element kept to the setting's bits: |A'B'|_ij <= k 4^bits (worst case)",
    "fast": ("each line scaled as far as its 2-norm allows: |A'B'|_ij <= ||A'_i.|| ||B'_.j|| "
             "(Cauchy-Schwarz), each squared norm <= (1/2 - 2^-20) P"),
}


class OzakiSetting(NamedTuple):
    """One precision setting: how many moduli (int8 GEMMs) and how many bits per scaled row /
    column (what the moduli's product can hold for this k)."""

    count: int
    bits: int
    k: int
    #: rows of A / columns of B the scaling could not hold (a nonzero element more than
    #: ``bits`` binades below its row's largest truncates to 0), multiplied natively
    native_rows: int = 0
    native_cols: int = 0
    #: the guard (never less accurate than native float64): one more int8 GEMM, and the
    #: elements of C whose error bound it could not prove, multiplied natively
    guard: bool = False
    native_elements: int = 0
    #: the guard failed for more than half of C's elements: the whole product ran natively
    #: (the GPU then skips the moduli's GEMMs)
    whole_native: bool = False
    #: the :data:`PRECISIONS` row the result is rounded to (and the guard holds native bound of)
    precision: str = "float64"
    #: the :data:`SCALINGS` row: 'max' keeps ``bits`` per line; 'fast' keeps at least ``bits``
    #: per line, more where the line's 2-norm allows (:func:`split_fast`)
    scaling: str = "max"

    @property
    def planes(self) -> int:
        """The int8 GEMMs of one product: one per modulus, one more for the guard."""
        return self.count + int(self.guard)

    def bound(self) -> str:
        """The error bound of a product made with this setting, in words (``explain()`` prints
        it; :func:`error_bound` computes it).

        >>> setting(1024, bits=40).bound()
        '|c_ij - exact| <= 1024 * 2^-38 * max|a_i.| * max|b_.j| + 4u|c_ij| (u = 2^-53)'
        >>> setting(1024).bound().endswith("(the guard)")
        True
        >>> setting(1024, precision="float32").bound()
        "|c_ij - exact| <= 1024 * 2^-24 * max|a_i.| * max|b_.j| + 2u|c_ij| + 2^-149 (u = 2^-24); and never above native float32's gamma_k * sum_k |a_ik||b_kj| (the guard)"

        The 'fast' scaling's bound is per element, from each line's own scale (at least
        ``bits`` bits of its largest element: within the 'max' bound of the same bits):

        >>> setting(1024, scaling="fast").bound().split(";")[0]
        '|c_ij - exact| <= 2^-e_i * sum_k |b_kj| + 2^-f_j * sum_k |a_ik| + 4u|c_ij| (u = 2^-53), 2^e_i and 2^f_j the scales of row i of A and column j of B (split_fast: each line keeps at least 57 bits of its largest element, more where its 2-norm allows)'
        """
        p = PRECISIONS[self.precision]
        tiny = f" + 2^{math.log2(p.underflow):.0f}" if p.underflow else ""
        if self.scaling == "fast":
            text = (f"|c_ij - exact| <= 2^-e_i * sum_k |b_kj| + 2^-f_j * sum_k |a_ik| + {p.rounding}u|c_ij|{tiny} "
                    f"(u = 2^-{p.unit_bits}), 2^e_i and 2^f_j the scales of row i of A and column j of B "
                    f"(split_fast: each line keeps at least {self.bits} bits of its largest element, more "
                    f"where its 2-norm allows)")
        else:
            text = (f"|c_ij - exact| <= {self.k} * 2^-{self.bits - 2} * max|a_i.| * max|b_.j| + "
                    f"{p.rounding}u|c_ij|{tiny} (u = 2^-{p.unit_bits})")
        if self.guard:
            text += f"; and never above native {p.name}'s gamma_k * sum_k |a_ik||b_kj| (the guard)"
        return text

    def describe(self) -> str:
        """One line for messages and plans.

        >>> setting(1024).describe()
        'Ozaki II with 16 moduli: rows of A and columns of B as 57-bit integers, 17 exact int8 GEMMs of k = 1024 (one for the guard: never less accurate than native float64)'
        """
        name = self.precision
        guard = f" (one for the guard: never less accurate than native {name})" if self.guard else ""
        fallback = (f"; {self.native_rows} rows and {self.native_cols} columns natively (a nonzero "
                    f"element more than {self.bits} binades below its row's or column's largest)"
                    if self.native_rows or self.native_cols else "")
        if self.whole_native:
            return (f"native: the guard could not prove native {name}'s error bound for {self.native_elements} "
                    f"elements (more than half: the whole product runs natively)")
        if self.native_elements:
            fallback += (f"; {self.native_elements} elements natively (the guard could not prove native "
                         f"{name}'s error bound for them)")
        ints = (f"integers of at least {self.bits} bits (more where a line's 2-norm allows: the 'fast' "
                f"scaling)" if self.scaling == "fast" else f"{self.bits}-bit integers")
        return (f"Ozaki II with {self.count} moduli: rows of A and columns of B as {ints}, "
                f"{self.planes} exact int8 GEMMs of k = {self.k}{guard}{fallback}")


def _product(count: int) -> int:
    return math.prod(MODULI[:count])


def _holds(k: int, bits: int, p: int) -> bool:
    """``k · 4^bits <= (1/2 - CRT_MARGIN) · p`` in integers (CRT_MARGIN = 2^-20)."""
    return k * 4**bits * 2**20 <= (2**19 - 1) * p


def bits_for(count: int, k: int) -> int:
    """The most bits ``b`` (at most :data:`MAX_BITS`) for which ``count`` moduli recover every
    entry of ``A'B'``: ``k · 4^b <= (1/2 - CRT_MARGIN) P`` (``|A'B'| <= k · 4^b``, and the
    reconstruction's rounding of S / P needs that margin below P / 2). ValueError when not
    even 1 bit fits.

    >>> bits_for(18, 1024), bits_for(8, 1024)
    (62, 26)
    """
    if not 1 <= count <= len(MODULI):
        raise ValueError(f"count={count} moduli: between 1 and {len(MODULI)}")
    if k < 1:
        raise ValueError(f"k={k}: the inner dimension must be at least 1")
    p = _product(count)
    bits = min(MAX_BITS, ((p - 1) // (2 * k)).bit_length() // 2)
    while bits > 0 and not _holds(k, bits, p):
        bits -= 1
    if bits < 1:
        raise ValueError(f"{count} moduli cannot hold a product with k={k}: use more")
    return bits


def setting(k: int, count: int | None = None, bits: int | None = None,
            precision: str = "float64", scaling: str = "max") -> OzakiSetting:
    """The setting for inner dimension ``k``: the given moduli ``count``, or the fewest moduli
    that give ``bits``. The default (neither given) takes the fewest moduli that keep the
    precision's default bits (:data:`DEFAULT_BITS`, float32's :data:`DEFAULT_BITS_FP32`) and
    then every bit those moduli hold at this k (more bits cost nothing once the moduli are
    paid for). The guard is on wherever at least the default bits are kept.

    >>> setting(1024).count, setting(1024).bits, setting(1024, bits=40).count, setting(1024, count=10).bits
    (16, 57, 12, 34)
    >>> setting(1024).guard, setting(1024, bits=40).guard
    (True, False)
    >>> f32 = setting(1024, precision="float32")
    >>> f32.count, f32.bits, f32.guard, setting(1024, bits=20, precision="float32").guard
    (8, 26, True, False)

    ``scaling='fast'`` (:data:`SCALINGS`) takes the same moduli; ``bits`` is then the least any
    line keeps (every bit the moduli hold at this k: :func:`split_fast` keeps more where it can):

    >>> fast = setting(1024, bits=40, scaling="fast")
    >>> fast.count, fast.bits, fast.scaling, fast.guard
    (12, 41, 'fast', False)
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: one of {', '.join(map(repr, PRECISIONS))}")
    _check_scaling(scaling)
    if scaling != "max":
        how = setting(k, count, bits, precision)
        return how._replace(bits=bits_for(how.count, k), scaling=scaling)
    default = PRECISIONS[precision].default_bits
    if count is not None:
        have = bits_for(count, k)
        return OzakiSetting(count, have, k, guard=have >= default, precision=precision)
    want = default if bits is None else bits
    if not 1 <= want <= MAX_BITS:
        raise ValueError(f"bits={want}: between 1 and {MAX_BITS}")
    for c in range(1, len(MODULI) + 1):
        try:
            have = bits_for(c, k)
        except ValueError:
            continue
        if have >= want:
            kept = have if bits is None else want
            return OzakiSetting(c, kept, k, guard=kept >= default, precision=precision)
    raise ValueError(f"k={k} needs more than {len(MODULI)} moduli for {want} bits")


def _check_scaling(scaling) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r}: one of {', '.join(map(repr, SCALINGS))}")


def split(x: np.ndarray, axis: int, bits: int):
    """(integers, exponents): ``x`` scaled by ``2^exponent`` per row (``axis=1``: the
    exponent of row i scales x[i, :]) or per column (``axis=0``), truncated toward zero, every
    integer below ``2^bits`` in magnitude (int64). A zero row has exponent 0.

    >>> ints, e = split(np.array([[3.0, 0.5], [0.0, 0.0]]), axis=1, bits=4)
    >>> ints.tolist(), e.tolist()
    ([[12, 2], [0, 0]], [2, 0])
    """
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits={bits}: between 1 and {MAX_BITS}")
    biggest = np.max(np.abs(x), axis=axis, keepdims=True)
    _, top = np.frexp(biggest)                  # biggest < 2^top
    exps = np.where(biggest > 0, bits - top, 0).astype(np.int64)
    scaled = np.ldexp(x, exps)                  # exact: a power of two (|scaled| < 2^bits)
    return np.trunc(scaled).astype(np.int64), exps.reshape(-1)


def _crt_budget(count: int) -> int:
    """``Q = floor((1/2 - CRT_MARGIN) P)``: the most any ``|A'B'|_ij`` may be (:func:`_holds`'s
    test, ``v · 2^20 <= (2^19 - 1) P``, holds exactly for the integers ``v <= Q``)."""
    return ((2**19 - 1) * _product(count)) >> 20


#: the 'fast' scaling's norm counts each ``|x|`` of a line in units of ``2^(top - 20)``
#: (``max|x| < 2^top``), rounded up: integers of at most 20 bits, their squares' sum exact in
#: 64 bits (order-independent: the GPU's atomics give the host's bits) while ``k < 2^24``
NORM_BITS = 20


def _norm_bits(k: int) -> int:
    """:data:`NORM_BITS`, fewer where ``k · 4^NORM_BITS`` would pass 2^64."""
    return min(NORM_BITS, (64 - max(k, 1).bit_length()) // 2)


#: the least ``j`` :func:`norm_thresholds` tabulates: ``4^j W <= Q`` holds there for every
#: ``W < 2^64`` (``Q >= 1``), so every line's ``j`` is at least this
NORM_J_LOW = -32


def norm_thresholds(count: int, k: int) -> np.ndarray:
    """The 'fast' scaling's rule for ``j`` as 64-bit integers (uint64): entry ``i`` is
    ``min(floor(Q / 4^j), 2^64 - 1)`` for ``j = NORM_J_LOW + i``, up to ``MAX_BITS - G``
    (``G = _norm_bits(k)``; a larger ``j`` is capped to the same exponent), ``Q =
    floor((1/2 - 2^-20) P)`` for the first ``count`` moduli. A line's ``j`` (the largest with
    ``4^j W <= Q``) is ``NORM_J_LOW - 1`` plus the number of entries ``>= W``: what
    :func:`split_fast` and the GPU's ``ozaki_line_scale`` both compute from this one table.

    Why the comparison is exact: ``W`` is an integer below 2^64. For ``j >= 0``, ``4^j W <= Q``
    iff ``W <= Q / 4^j`` iff ``W <= floor(Q / 4^j)`` (W an integer); for ``j < 0``, ``Q / 4^j
    = Q 4^-j`` is an integer. Where that is at least 2^64 every ``W`` passes, and so it does
    against ``2^64 - 1``. The test is monotone in ``j`` (it holds for ``j`` if for ``j + 1``),
    so counting the entries that pass gives the largest ``j``; the first always passes
    (``Q 4^32 >= 2^64 > W``).

    >>> t = norm_thresholds(16, 1024)
    >>> len(t), int(t[0]) == 2**64 - 1, int(t[-1]) == _crt_budget(16) >> 2 * (MAX_BITS - NORM_BITS)
    (75, True, True)
    >>> w = 1024 * 4**NORM_BITS                 # a flat line: j = bits_for - G
    >>> int(np.sum(np.uint64(w) <= t)) - 1 + NORM_J_LOW == bits_for(16, 1024) - NORM_BITS
    True
    """
    if not 1 <= count <= len(MODULI):
        raise ValueError(f"count={count} moduli: between 1 and {len(MODULI)}")
    if k < 1:
        raise ValueError(f"k={k}: the inner dimension must be at least 1")
    q = _crt_budget(count)
    top = 2**64 - 1
    return np.array([min(q >> 2 * j if j >= 0 else q << -2 * j, top)
                     for j in range(NORM_J_LOW, MAX_BITS - _norm_bits(k) + 1)], np.uint64)


def split_fast(x: np.ndarray, axis: int, count: int):
    """(integers, exponents) as :func:`split` gives them, each row (``axis=1``) or column
    (``axis=0``) scaled by the largest power of two that an upper bound of its 2-norm allows
    within ``Q = (1/2 - 2^-20) P`` (``P`` the product of the first ``count`` moduli), at most
    :data:`MAX_BITS` bits: the 'fast' scaling of :data:`SCALINGS`. Never fewer bits than
    :func:`split` with ``bits_for(count, k)`` (``k`` the line's length); a row dominated by one
    element keeps up to ``log2(k) / 2`` bits more; a flat row (all of one magnitude) is the worst
    case and keeps the same bits, or one more where its largest element's significand leaves
    room.

    The norm's bound, per line with ``max|x| < 2^t`` and ``G`` = :data:`NORM_BITS`: ``w_k =
    ceil(|x_k| 2^(G - t))`` (at least 1 where ``x_k != 0``: a product below float64's range
    rounds, and may round to 0), integers in ``[0, 2^G]``, and ``W = Σ w_k^2``, an exact
    integer. ``|x_k| 2^(G - t) <= w_k``, so ``Σ x^2 <= 4^(t - G) W``. The exponent is
    ``e = G - t + j``, ``j`` the largest integer with ``4^j W <= Q`` (exactly, in 64-bit
    integers: :func:`norm_thresholds`), capped at ``MAX_BITS - t``.

    Why the CRT stays exact. ``A'_i = trunc(2^e_i a_i)``, ``B'_j = trunc(2^f_j b_j)``, and
    ``|trunc(v)| <= |v|``: ``Σ A'^2 <= 4^e Σ a^2 <= 4^(e + t - G) W = 4^j W <= Q`` for every
    row, likewise every column of B. By Cauchy–Schwarz on these integers,
    ``|Σ_k A'_ik B'_kj| <= ||A'_i||_2 ||B'_j||_2 <= sqrt(Q) · sqrt(Q) = Q <= (1/2 - 2^-20) P``,
    which is :func:`reconstruct`'s condition. And never fewer bits than :func:`split`: every
    ``w_k <= 2^G``, so ``W <= k 4^G`` and split's exponent ``bits - t`` (``k 4^bits <= Q``,
    :func:`bits_for`) has ``4^(bits - G) W <= k 4^bits <= Q``: ``j`` is at least ``bits - G``.
    No rounding anywhere: the scaled values and ``ceil`` are exact in float64 (a power of two,
    then an integer of at most 21 bits), ``W`` and ``j`` are integers.

    >>> x = np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 2.0**-30, 0.0, 0.0]])
    >>> _, e_max = split(x, axis=1, bits=bits_for(4, 4))
    >>> ints, e = split_fast(x, axis=1, count=4)
    >>> e_max.tolist(), e.tolist()               # the flat row: one bit more; the spiky row: two
    ([13, 13], [14, 15])
    >>> int(np.sum(ints[1].astype(object) ** 2)) <= _crt_budget(4), line_bits(x, e, axis=1).tolist()
    (True, [15, 16])
    """
    if axis not in (0, 1):
        raise ValueError(f"axis={axis}: 0 (columns) or 1 (rows)")
    if not 1 <= count <= len(MODULI):
        raise ValueError(f"count={count} moduli: between 1 and {len(MODULI)}")
    rows = np.asarray(x, dtype=np.float64)
    rows = rows.T if axis == 0 else rows
    m, k = rows.shape
    g = _norm_bits(k)
    biggest = np.max(np.abs(rows), axis=1) if k else np.zeros(m)
    _, top = np.frexp(biggest)                           # biggest < 2^top
    units = np.ceil(np.ldexp(np.abs(rows), (g - top)[:, None]))
    units = np.maximum(units, rows != 0).astype(np.uint64)          # a nonzero x counts at least 1
    norms = np.sum(units * units, axis=1, dtype=np.uint64)          # W, exact: k 4^G <= 2^64
    table = norm_thresholds(count, k)
    # j: the table's rule, as the GPU's ozaki_line_scale runs it (one entry per j from NORM_J_LOW)
    j = np.sum(norms[:, None] <= table[None, :], axis=1) - 1 + NORM_J_LOW
    exps = np.where(biggest > 0, np.minimum(j + g - top, MAX_BITS - top), 0).astype(np.int64)
    ints = np.trunc(np.ldexp(rows, exps[:, None])).astype(np.int64)
    return (ints.T if axis == 0 else ints), exps


def line_bits(x: np.ndarray, exps: np.ndarray, axis: int) -> np.ndarray:
    """The bits each row (``axis=1``) or column (``axis=0``) of ``x`` keeps under the
    exponents ``exps`` (:func:`split`, :func:`split_fast`): ``e + top``, ``max|x| < 2^top``,
    so every scaled integer of that line is below ``2^bits``; 0 for a zero line.

    >>> line_bits(np.array([[3.0, 0.5], [0.0, 0.0]]), np.array([2, 0]), axis=1).tolist()
    [4, 0]
    """
    biggest = np.max(np.abs(x), axis=axis) if x.shape[axis] else np.zeros(x.shape[1 - axis])
    _, top = np.frexp(biggest.astype(np.float64))
    return np.where(biggest > 0, np.asarray(exps).reshape(-1) + top, 0).astype(np.int64)


def error_bound(a: np.ndarray, b: np.ndarray, c: np.ndarray, how: OzakiSetting) -> np.ndarray:
    """Each element's bound on ``|c - a @ b|`` (exact product) for ``c`` made by the scheme with
    ``how`` (its bits; rows and columns it ran natively are not covered): the truncation of
    :func:`split` and the reconstruction's rounding.

    A row scaled by ``2^(bits - top)``, ``max|a_i.| < 2^top <= 2 max|a_i.|``, loses less than
    one unit of the scaled integer: ``|Δa_ik| < 2^(top - bits) <= 2^(1-bits) max|a_i.|``, and
    likewise each column of B. ``a·b - (a-Δa)·(b-Δb) = Δa·b + a·Δb - Δa·Δb``, where
    ``|Δa·b - Δa·Δb| = |Δa|·|b - Δb| <= |Δa|·|b|``: summed over k, less than
    ``k·2^(2-bits)·max|a_i.|·max|b_.j|``. The integer ``A'B'`` is exact (CRT); its scaling by
    powers of two is exact (unless C underflows), and the float64 it becomes is within two
    ulps, ``4u|c|``. float32 (``how.precision``): that float64 rounded to float32 adds
    ``u|c|`` (u = 2^-24), ``2u|c|`` with the two float64 ulps, plus one subnormal ulp
    (2^-149) where C falls below float32's normal range.

    >>> rng = np.random.default_rng(0)
    >>> a = rng.standard_normal((8, 300)) * np.exp2(rng.integers(-30, 30, (8, 300)))
    >>> b = rng.standard_normal((300, 6))
    >>> c, how = dgemm_ozaki(a, b, bits=30, fallback=False)
    >>> exact = (a.astype(np.longdouble) @ b.astype(np.longdouble))
    >>> bool(np.all(np.abs(c - exact) <= error_bound(a, b, c, how)))
    True

    The 'fast' scaling (``how.scaling``): each line has its own exponent, so the bound is per
    element, ``2^-e_i Σ_k |b'_kj| + 2^-f_j Σ_k |a_ik|`` (``2^-e_i``: one unit of row i's
    integers; the same split gives ``|Δa·b| + |a·Δb|``), with ``|b'| <= |b|``; the exponents
    are :func:`split_fast`'s (computed again here from ``a`` and ``b``). Since
    ``2^-e_i < 2^(1-bits) max|a_i.|``, this is within the 'max' bound of ``how.bits``. The
    1-norms are float64 sums of k terms, at least ``(1 - γ_k)`` of the exact ones in any order
    (``γ_k = k u / (1 - k u)``, u = 2^-53), made upper bounds by ``1 + (k + 4) 2^-50``, which
    covers ``1 / (1 - γ_k)`` and the products' and the final sum's roundings. A complex
    product's parts each sum over the stacked ``[Re, Im]`` of a row (and column): the same
    1-norms for both parts.

    >>> c, how = dgemm_ozaki(a, b, bits=30, fallback=False, scaling="fast")
    >>> fast = error_bound(a, b, c, how)
    >>> bool(np.all(np.abs(c - exact) <= fast)), bool(np.all(fast <= error_bound(a, b, c, how._replace(scaling="max"))))
    (True, True)
    """
    p = PRECISIONS[how.precision]
    if how.scaling == "fast":
        a2, b2 = _stacked(np.asarray(a), np.asarray(b))
        _, ea = split_fast(a2, 1, how.count)
        _, eb = split_fast(b2, 0, how.count)
        slack = 1 + (how.k + 4) * 2.0**-50
        na, nb = np.sum(np.abs(a2), axis=1) * slack, np.sum(np.abs(b2), axis=0) * slack
        trunc = (np.ldexp(nb[None, :], -ea[:, None]) + np.ldexp(na[:, None], -eb[None, :])) * slack
        # a zero row (column) is exact: its integers and its products are 0
        trunc = np.where((na[:, None] > 0) & (nb[None, :] > 0), trunc, 0.0)
        return trunc + p.rounding * 2.0**-p.unit_bits * np.abs(c).astype(np.float64) + p.underflow
    row_max = np.max(np.abs(a), axis=1, keepdims=True).astype(np.float64)
    col_max = np.max(np.abs(b), axis=0, keepdims=True).astype(np.float64)
    u = 2.0**-p.unit_bits
    return (how.k * 2.0**(2 - how.bits) * row_max * col_max + p.rounding * u * np.abs(c).astype(np.float64)
            + p.underflow)


def residues(ints: np.ndarray, p: int) -> np.ndarray:
    """``ints mod p`` in the symmetric range (``[-128, 127]`` for 256, ``[-(p-1)/2, (p-1)/2]``
    for odd p), as int8.

    >>> residues(np.array([300, -300, 5]), 256).tolist(), residues(np.array([300]), 251).tolist()
    ([44, -44, 5], [49])
    """
    r = np.mod(ints, p)
    r = np.where(r > p // 2 - (p % 2 == 0), r - p, r)    # 256: 128..255 -> -128..-1
    return r.astype(np.int8)


def residue_products_host(a_res, b_res, moduli) -> list:
    """``(a_res[l] @ b_res[l]) mod p_l`` for each modulus, in ``[0, p_l)`` (int64): float64
    BLAS on small integers, exact while ``k · 2^14 < 2^53``.

    >>> a, b = np.array([[100, -3]], np.int8), np.array([[2], [1]], np.int8)
    >>> residue_products_host([a], [b], [251])[0].tolist()          # 197 = 197 mod 251
    [[197]]
    """
    k = a_res[0].shape[1]
    if k * 2**14 >= 2**53:
        raise ValueError(f"k={k} is too long for exact float64 residue products on the host")
    out = []
    for ar, br, p in zip(a_res, b_res, moduli):
        prod = ar.astype(np.float64) @ br.astype(np.float64)
        out.append(np.mod(prod.astype(np.int64), p))
    return out


#: bits per chunk of the CRT constants: a residue (< 2^8) times a chunk (< 2^39) is below
#: 2^47, so products and sums of up to 64 of them are exact in float64 (53 bits)
CRT_CHUNK_BITS = 39
#: the reconstruction rounds S / P to the nearest integer: |X| must stay below P / 2 by this
#: fraction of P (bits_for keeps it), far above that quotient's error (~2^-46)
CRT_MARGIN = 2.0**-20


def crt_chunks(count: int) -> int:
    """How many :data:`CRT_CHUNK_BITS`-bit chunks hold P (< 2^(8 count)) and each P / p_l
    exactly.

    >>> crt_chunks(16), crt_chunks(34)
    (4, 7)
    """
    return -(-8 * count // CRT_CHUNK_BITS)


def _chunks(v: int, count: int) -> tuple:
    """``v`` (< 2^(8 count)) as :func:`crt_chunks` floats of at most :data:`CRT_CHUNK_BITS`
    bits each, the first on the top chunk's grid: their sum is exactly v."""
    n = crt_chunks(count)
    out = []
    for j in range(n):
        shift = CRT_CHUNK_BITS * (n - 1 - j)
        c = (v >> shift) << shift
        out.append(float(c))
        v -= c
    return tuple(out)


def crt_tables(count: int) -> dict:
    """The constants of the reconstruction for the first ``count`` moduli (the GPU kernels read
    the same numbers): ``y[l] = (P / p_l)^-1 mod p_l``, ``m[l]`` = the chunks of P / p_l
    (:func:`_chunks`), ``p`` = the chunks of P, ``inv_p`` = 1 / P rounded.

    >>> t = crt_tables(2)                       # P = 256 * 255
    >>> t["y"], t["m"], t["p"]
    ([255, 1], [(255.0,), (256.0,)], (65280.0,))
    """
    mods = MODULI[:count]
    big = math.prod(mods)
    return {"y": [pow((big // p) % p, -1, p) for p in mods],
            "m": [_chunks(big // p, count) for p in mods], "p": _chunks(big, count), "inv_p": 1.0 / big}


def reconstruct(products, moduli) -> np.ndarray:
    """The integer ``X`` in ``(-P/2, P/2)`` with ``X ≡ products[l] (mod moduli[l])`` for every
    l, as float64: exact where X fits 53 bits, else within two units in the last place; for
    ``|X| <= (1/2 - CRT_MARGIN) P`` (what :func:`bits_for` keeps).

    The Chinese remainder theorem as one sum: ``X = S - q P`` with ``S = sum_l u_l (P / p_l)``,
    ``u_l = (r_l y_l) mod p_l`` and ``q = round(S / P)``. ``P / p_l`` and ``P`` are split into
    39-bit chunks (:func:`crt_tables`), so each chunk's sum ``S_j`` and ``D_j = S_j - q P_j``
    are exact in float64, and X = D_1 + D_2 + ..., summed from the top chunk down (each
    partial sum is exact unless X is far above its grid). O(count · chunks) per element (the
    mixed-radix digits of Garner's algorithm took O(count²)); the GPU kernel runs the same
    operations, so both give the same bits.

    >>> m = MODULI[:3]
    >>> x = np.array([-123456, 7, 0, 8_000_000])
    >>> reconstruct([np.mod(x, p) for p in m], m).tolist()
    [-123456.0, 7.0, 0.0, 8000000.0]
    """
    moduli = tuple(int(p) for p in moduli)
    if moduli != MODULI[:len(moduli)]:
        raise ValueError(f"moduli {moduli}: the first {len(moduli)} of MODULI are expected")
    t = crt_tables(len(moduli))
    sums = [0.0] * len(t["p"])
    for c, p, y, chunks in zip(products, moduli, t["y"], t["m"]):
        u = ((np.asarray(c, dtype=np.int64) % p) * y % p).astype(np.float64)
        sums = [s_ + u * mj for s_, mj in zip(sums, chunks)]      # exact: see CRT_CHUNK_BITS
    whole = sums[0]
    for s_ in sums[1:]:
        whole = whole + s_                      # S to 53 bits: q's quotient needs no more
    q = np.rint(whole * t["inv_p"])
    x = sums[0] - q * t["p"][0]
    for s_, pj in zip(sums[1:], t["p"][1:]):
        x = x + (s_ - q * pj)                                    # the difference is exact
    return x


def guard_constants(how: OzakiSetting, k_native: int) -> tuple:
    """``(c_sum, c_hi)``: the guard's test of one element of C fails (that element is
    computed natively) where ``na_i > 0``, ``nb_j > 0`` and ``(na_i + nb_j) * c_sum > L_ij *
    c_hi``, in this order of float64 operations on the host and the GPU alike.

    Why it proves the bound: with ``x = 2^e a``, ``A' = trunc(x)`` (likewise ``y``, ``B'``)
    each truncation error is below 1 and 0 where the element is 0, so
    ``|Σ xy - Σ A'B'| <= Σ_(b != 0) |A'| + Σ_(a != 0) |y|``, and ``|y| <= |B'| + 1``: the line
    sums ``na`` (``nb``) count ``|A'| + 1`` over the nonzero elements in units of ``c_sum =
    2^(bits - 16)``, rounded up (a zero line makes no error). ``L = Σ hi(A') hi(B')`` with
    ``hi = |A'| >> (bits - 7)`` bounds ``Σ|x||y|`` from below by ``L · 2^(2 (bits - 7))``. The
    reconstruction adds at most two ulps (4u) of ``|X| <= Σ|x||y|``, so a truncation error
    within ``(k - 4) u Σ|x||y|`` keeps the whole error within ``k u Σ|a||b| <= γ_k Σ|a||b|``:
    ``c_hi = (k - 4) 2^(2 (bits - 7) - 53)``, less 2^-40 for the test's own roundings.
    float32 (``how.precision``, u = 2^-24): the float64 reconstruction's 2^-51 and the rounding
    to float32 (u) stay within 2u, so ``c_hi = (k - 2) 2^(2 (bits - 7) - 24)``: the whole
    error is then within ``(k - 2) u + 2^-51 + u (1 + (k - 2) u + 2^-51) <= k u`` of Σ|a||b|.
    ``k_native`` is the k of native arithmetic's bound (a complex product's length is 2k,
    its bound per part still γ_k: the stacked sum is at most ``Σ|a||b|`` with complex
    moduli). At k <= 4 nothing passes (``c_hi = 0``; float32: at k <= 2).

    >>> c_sum, c_hi = guard_constants(setting(1024), 1024)
    >>> c_sum == 2.0 ** 41, c_hi > 0, guard_constants(setting(4), 4)[1]
    (True, True, 0.0)
    >>> s3, s2 = setting(3, precision="float32"), setting(2, precision="float32")
    >>> guard_constants(s3, 3)[1] > 0, guard_constants(s2, 2)[1]
    (True, 0.0)
    """
    p = PRECISIONS[how.precision]
    s_sum, s_hi = max(how.bits - GUARD_SUM_BITS, 0), max(how.bits - GUARD_HI_BITS, 0)
    c_hi = ((k_native - p.rounding) * 2.0 ** (2 * s_hi - p.unit_bits) * (1 - 2.0**-40)
            if k_native > p.rounding else 0.0)
    return 2.0**s_sum, c_hi


def guard_unit(how: OzakiSetting, k_native: int) -> float:
    """The per-line guard's factor (:func:`guard_failures` with ``bits_a`` / ``bits_b``, the
    GPU's ``ozaki_guard_fails_lines``): :func:`guard_constants`'s ``c_hi`` at shift 0, each
    element's own power of two applied to it.

    >>> guard_unit(setting(1024), 1024) == guard_constants(setting(1024)._replace(bits=7), 1024)[1]
    True
    """
    return guard_constants(how._replace(bits=GUARD_HI_BITS), k_native)[1]


def guard_planes(ints: np.ndarray, axis: int, bits: int):
    """``(hi, sums)`` of the scaled integers of one operand: ``hi = |ints| >> (bits - 7)``
    (int8, the guard's extra residue plane) and, per row (``axis=1``) or column (``axis=0``),
    ``Σ ((|ints| >> (bits - 16)) + 1)`` over its nonzero elements (int64): what the GPU's
    residue pass also writes. ``ints`` is nonzero wherever the element was (else the line
    is run natively before the guard looks).

    >>> hi, sums = guard_planes(np.array([[2**20 - 1, -3, 0]]), axis=1, bits=20)
    >>> hi.tolist(), sums.tolist()                   # (2^20-1 >> 4) + 1 + (3 >> 4) + 1
    ([[127, 0, 0]], [65537])

    ``bits`` may be one per line (the 'fast' scaling's :func:`line_bits`): each line's planes
    then count in its own units (:func:`guard_failures` with ``bits_a`` / ``bits_b``).

    >>> hi, sums = guard_planes(np.array([[2**20 - 1, -3], [2**9, 0]]), axis=1, bits=np.array([20, 10]))
    >>> hi.tolist(), sums.tolist()
    ([[127, 0], [64, 0]], [65537, 513])
    """
    mag = np.abs(ints)
    if np.ndim(bits):                           # one per line: broadcast along the line
        bits = np.asarray(bits, np.int64)
        bits = bits[:, None] if axis == 1 else bits[None, :]
    hi = (mag >> np.maximum(bits - GUARD_HI_BITS, 0)).astype(np.int8)
    sums = np.sum(np.where(mag != 0, (mag >> np.maximum(bits - GUARD_SUM_BITS, 0)) + 1, 0), axis=axis,
                  dtype=np.int64)
    return hi, sums


def guard_failures(na, nb, low, how: OzakiSetting, k_native: int, bits_a=None, bits_b=None):
    """The elements of C whose error bound the guard cannot prove (bool, m x n): ``na`` and
    ``nb`` the line sums of :func:`guard_planes`, ``low`` the product of the ``hi`` planes
    (any array of the integers' values; NumPy or CuPy: the same operations, one at a time).

    >>> a, b = np.array([[1.0, 2.0**-50 * (4 / 3)]]), np.array([[2.0**-50 * (4 / 3)], [1.0]])
    >>> how = setting(2)
    >>> ai, _ = split(a, 1, how.bits); bi, _ = split(b, 0, how.bits)
    >>> (ha, na), (hb, nb) = guard_planes(ai, 1, how.bits), guard_planes(bi, 0, how.bits)
    >>> guard_failures(na, nb, ha.astype(float) @ hb.astype(float), how, 2).tolist()
    [[True]]

    Per-line bits (``bits_a`` per row of A, ``bits_b`` per column of B: the 'fast' scaling's
    :func:`line_bits`, the planes made with them): :func:`guard_constants`'s proof holds for
    each element in its own scaled space, ``na_i 2^(bits_a_i - 16) + nb_j 2^(bits_b_j - 16)``
    against ``L_ij 2^(bits_a_i - 7 + bits_b_j - 7)`` times ``c_hi``'s factor without its
    power of two (each shift at least 0); the sum of the two terms, now rounded, and the
    product's rounding stay within the 2^-40 ``c_hi`` leaves for the test's own roundings.

    >>> f = setting(2, scaling="fast")
    >>> ai, ea = split_fast(a, 1, f.count); bi, eb = split_fast(b, 0, f.count)
    >>> ba, bb = line_bits(a, ea, 1), line_bits(b, eb, 0)
    >>> (ha, na), (hb, nb) = guard_planes(ai, 1, ba), guard_planes(bi, 0, bb)
    >>> guard_failures(na, nb, ha.astype(float) @ hb.astype(float), f, 2, ba, bb).tolist()
    [[True]]
    """
    if bits_a is not None:
        # arrays of one module (NumPy, or CuPy: the composite route's fix-up), one operation at
        # a time in the GPU kernels' order (ozaki_guard_fails_lines)
        xp = xp_of(array_module_name(low) or "numpy")
        unit = guard_unit(how, k_native)
        # int32 shifts: ldexp's exponent type on NumPy and CuPy alike
        sa, sb = (xp.maximum(xp.asarray(x).astype(np.int32) - GUARD_SUM_BITS, 0) for x in (bits_a, bits_b))
        ha, hb = (xp.maximum(xp.asarray(x).astype(np.int32) - GUARD_HI_BITS, 0) for x in (bits_a, bits_b))
        na, nb = xp.asarray(na), xp.asarray(nb)
        lhs = (xp.ldexp(na.astype(np.float64), sa)[:, None] + xp.ldexp(nb.astype(np.float64), sb)[None, :])
        rhs = xp.ldexp(low.astype(np.float64) * unit, ha[:, None] + hb[None, :])
        return (lhs > rhs) & (na[:, None] > 0) & (nb[None, :] > 0)
    c_sum, c_hi = guard_constants(how, k_native)
    na, nb = na[:, None], nb[None, :]
    lhs = (na + nb).astype(np.float64) * c_sum
    return (lhs > low.astype(np.float64) * c_hi) & (na > 0) & (nb > 0)


def _guard(how, k_native, ai, bi_parts, rows, cols, elements, lines=None):
    """``(setting, bad)``: the lost lines recorded, and the guard's failures over the products
    ``ai @ part`` for each of ``bi_parts`` (the complex form has two, sharing line sums)
    outside those lines; more than half of the ``elements`` failing makes the whole product
    native (``whole_native``), as on the GPU. ``bad`` is None without the guard. ``lines``:
    the bits of each row of A and column of B (the 'fast' scaling), else None (``how.bits``)."""
    how = how._replace(native_rows=int(rows.sum()), native_cols=int(cols.sum()))
    if not how.guard:
        return how, None
    bits_a, bits_b = lines if lines is not None else (how.bits, how.bits)
    per_line = (bits_a, bits_b) if lines is not None else ()
    hi_a, na = guard_planes(ai, 1, bits_a)
    bad = None
    for part in bi_parts:
        hi_b, nb = guard_planes(part, 0, bits_b)
        fails = guard_failures(na, nb, hi_a.astype(np.float64) @ hi_b.astype(np.float64), how, k_native,
                               *per_line)
        bad = fails if bad is None else bad | fails
    bad &= ~rows[:, None] & ~cols[None, :]
    failed = int(bad.sum())
    return how._replace(native_elements=failed, whole_native=2 * failed > elements), bad


def _check_operands(routine: str, a, b, dtype):
    a, b = np.asarray(a), np.asarray(b)
    for name, x in (("a", a), ("b", b)):
        if x.ndim != 2 or x.dtype != dtype:
            raise TypeError(f"{routine}: {name} must be a 2-D {np.dtype(dtype).name} array, "
                            f"got {x.ndim}-D {x.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{routine}: a {a.shape} @ b {b.shape}: inner sizes differ")
    return a, b


def _ozaki_product(a_ints, b_ints_list, how):
    """The exact integer products ``a_ints @ b`` for each ``b`` of ``b_ints_list`` (one
    residue set of ``a_ints`` shared), reconstructed as float64."""
    mods = MODULI[:how.count]
    a_res = [residues(a_ints, p) for p in mods]
    out = []
    for b_ints in b_ints_list:
        prods = residue_products_host(a_res, [residues(b_ints, p) for p in mods], mods)
        out.append(reconstruct(prods, mods))
    return out


def _lost(x, ints, axis: int) -> np.ndarray:
    """Which rows (``axis=1``) or columns (``axis=0``) hold a nonzero element that truncated
    to 0: the range the scaling cannot hold."""
    return np.any((x != 0) & (ints == 0), axis=axis)


def _native_where_lost(c, native, rows, cols):
    """C's rows ``rows`` and columns ``cols`` recomputed in native arithmetic (in place);
    ``native(rows, cols)`` multiplies those lines (None: all)."""
    if rows.any():
        c[rows, :] = native(rows, None)
    if cols.any():
        c[:, cols] = native(None, cols)
    return c


def _stacked(a: np.ndarray, b: np.ndarray):
    """The float64 operands the scheme scales: ``a`` and ``b`` themselves (widened), or for a
    complex product each row of ``[Ar Ai]`` and each column of ``[Br; Bi]``."""
    if a.dtype.kind == "c":
        return (np.concatenate([a.real, a.imag], axis=1).astype(np.float64),
                np.concatenate([b.real, b.imag], axis=0).astype(np.float64))
    return a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)


def _host_only(routine: str, *arrays) -> None:
    """This module's functions are the host backend: refuse a GPU array (CUDA array interface,
    or a DLPack device other than the CPU, 1) before any work, naming the GPU's route (the
    composite route of ``compute='int8-ozaki'``, the scaling in the mode's name)."""
    for name, x in zip("ab", arrays):
        dev = getattr(x, "__dlpack_device__", None)
        if hasattr(x, "__cuda_array_interface__") or (callable(dev) and int(dev()[0]) != 1):
            raise TypeError(
                f"{routine}: {name} is a GPU array ({type(x).__name__}); this function runs on the host. "
                f"On the GPU: pyblasgemm.matmul(a, b, compute='int8-ozaki') (the 'fast' scaling: "
                f"compute='int8-ozaki-fast', or 'int8-ozaki-<bits>-fast')")


def emulated(a: np.ndarray, b: np.ndarray, count: int | None = None, bits: int | None = None,
             fallback: bool = True, scaling: str = "max"):
    """``(a @ b, setting)`` by the scheme for 2-D operands of one of the four types, the result
    as float64 (complex128) before any rounding to float32: the host backend applies alpha and
    beta to it and rounds once, as the GPU's reconstruction does. float64 operands: what
    :func:`dgemm_ozaki` returns; float32: :func:`sgemm_ozaki`'s result before its rounding.
    The native arithmetic of the fallbacks is the operands' own type's (``numpy.matmul``:
    float32 operands, float32 BLAS, SGEMM's float32 accumulation).

    (1 + 2^-20)² - 1 is 2^-19 + 2^-40: the scheme alone keeps it (to be rounded by the caller);
    the default's guard proves nothing at k <= 2, so native float32 answers (2^-19):

    >>> x = np.array([[1 + 2**-20, 1.0]], np.float32); y = np.array([[1 + 2**-20], [-1.0]], np.float32)
    >>> c, how = emulated(x, y, fallback=False)
    >>> c.dtype, float(c[0, 0]) == 2.0**-19 + 2.0**-40, how.precision
    (dtype('float64'), True, 'float32')
    >>> c, how = emulated(x, y)
    >>> float(c[0, 0]) == 2.0**-19 == float((x @ y)[0, 0]), how.whole_native
    (True, True)
    """
    _check_scaling(scaling)
    _host_only("emulated", a, b)
    a, b = np.asarray(a), np.asarray(b)
    precision = precision_of(a.dtype)
    cplx = a.dtype.kind == "c"
    wide = np.complex128 if cplx else np.float64
    m, k = a.shape
    n = b.shape[1]

    def native(rows=None, cols=None):
        """op(A)[rows] @ op(B)[:, cols] in the operands' own arithmetic, widened."""
        x = a if rows is None else a[rows]
        y = b if cols is None else b[:, cols]
        return (x @ y).astype(wide, copy=False)

    if k == 0 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return native(), None
    how = setting(2 * k if cplx else k, count, bits, precision, scaling)
    # complex: one scale per row of [Ar Ai] and per column of [Br; Bi] (zgemm_ozaki)
    a2, b2 = _stacked(a, b)
    if how.scaling == "fast":
        ai, ea = split_fast(a2, axis=1, count=how.count)
        bi, eb = split_fast(b2, axis=0, count=how.count)
        lines = (line_bits(a2, ea, 1), line_bits(b2, eb, 0))
    else:
        ai, ea = split(a2, axis=1, bits=how.bits)
        bi, eb = split(b2, axis=0, bits=how.bits)
        lines = None
    # the integer products: one for a real C; Re = [A'r, A'i] @ [B'r; -B'i] and
    # Im = [A'r, A'i] @ [B'i; B'r] for a complex one (each part rounded once)
    parts = [np.concatenate([bi[:k], -bi[k:]]), np.concatenate([bi[k:], bi[:k]])] if cplx else [bi]
    if fallback:
        rows, cols = _lost(a2, ai, 1), _lost(b2, bi, 0)
        # the guard reads each product's magnitudes: Re's and Im's share them per column
        how, bad = _guard(how, k, ai, [bi, parts[1]] if cplx else [bi], rows, cols, m * n, lines)
        if how.whole_native:
            return native(), how
    shift = -(ea.reshape(m, 1) + eb.reshape(1, n))
    # C = 2^-(e_i + f_j) A'B' (one power-of-two scaling, exact unless C underflows)
    values = [np.ldexp(x, shift) for x in _ozaki_product(ai, parts, how)]
    c = values[0] + 1j * values[1] if cplx else values[0]
    if fallback:
        c = _native_where_lost(c, native, rows, cols)
        if bad is not None and bad.any():
            c[bad] = native()[bad]
    return c, how


def dgemm_ozaki(a: np.ndarray, b: np.ndarray, count: int | None = None, bits: int | None = None,
                fallback: bool = True, scaling: str = "max"):
    """``(a @ b, setting)`` for float64 2-D ``a`` (m x k) and ``b`` (k x n) by the Ozaki
    scheme II on the host (the same steps our GPU kernels run with int8 GEMMs). ``count``
    or ``bits`` set the precision (:func:`setting`); the default keeps 55-58 bits and the
    guard (elements whose error bound it cannot prove run natively). Operands
    with Inf or NaN are multiplied natively (the setting is then None), as is ``k == 0``;
    with ``fallback`` (default), so are the rows of ``a`` and columns of ``b`` that the
    scaling cannot hold (:attr:`OzakiSetting.native_rows`), whose products would otherwise
    lose whole terms (``[1e10, 1e-10] @ [0, 1]`` would be 0).

    The exact sum of the exact products, rounded once (NumPy's float64 sum of rounded products
    gives 0.9999999999999999 here):

    >>> import numpy as np
    >>> c, how = dgemm_ozaki(np.ones((1, 10)), np.full((10, 1), 0.1))
    >>> c.tolist(), (np.ones((1, 10)) @ np.full((10, 1), 0.1)).tolist(), how.count
    ([[1.0]], [[0.9999999999999999]], 15)

    Graded data: the second column of ``a`` far below the first, against a large row of ``b``
    (kept to 57 bits of its row's largest, ``x`` loses 6 of its own). The guard computes that
    element natively, as it can prove nothing better:

    >>> x = 2.0**-50 * (4 / 3)
    >>> c, how = dgemm_ozaki(np.array([[1.0, x]]), np.array([[x], [1.0]]))
    >>> bool(c[0, 0] == 2 * x), how.native_elements
    (True, 1)

    ``scaling='fast'`` (:func:`split_fast`): the same moduli, each line as many bits as its
    2-norm allows; at 15 moduli and k = 1024 the default keeps 53 bits on every line, the fast
    scaling 59 on a row dominated by one element and 55 on an evenly spread one:

    >>> a = np.full((2, 1024), 2.0**-20); a[0, 0] = 1.0; a[1] = np.linspace(-1, 1, 1024)
    >>> c, how = dgemm_ozaki(a, a.T, count=15, scaling="fast")
    >>> _, e = split_fast(a, 1, how.count)
    >>> how.bits, line_bits(a, e, 1).tolist()
    (53, [59, 55])
    """
    _check_scaling(scaling)
    _host_only("dgemm_ozaki", a, b)
    a, b = _check_operands("dgemm_ozaki", a, b, np.float64)
    return emulated(a, b, count, bits, fallback, scaling)


def zgemm_ozaki(a: np.ndarray, b: np.ndarray, count: int | None = None, bits: int | None = None,
                fallback: bool = True, scaling: str = "max"):
    """``(a @ b, setting)`` for complex128 2-D ``a`` and ``b`` through the same steps (4M, each
    part rounded once): a row of ``a`` shares one scale over its real and imaginary parts (a
    column of ``b`` likewise), and each part of the result is one integer product of length
    2k, ``Re = [A'r, A'i] @ [B'r; -B'i]`` and ``Im = [A'r, A'i] @ [B'i; B'r]``, reconstructed
    once (no cancellation between separately rounded products). The setting is for 2k;
    ``fallback`` as in :func:`dgemm_ozaki`.

    >>> import numpy as np
    >>> c, how = zgemm_ozaki(np.array([[1 + 2j, 0.5j]]), np.array([[3 - 1j], [2 + 0j]]))
    >>> c.tolist(), how.k
    ([[(5+6j)]], 4)
    """
    _check_scaling(scaling)
    _host_only("zgemm_ozaki", a, b)
    a, b = _check_operands("zgemm_ozaki", a, b, np.complex128)
    return emulated(a, b, count, bits, fallback, scaling)


def sgemm_ozaki(a: np.ndarray, b: np.ndarray, count: int | None = None, bits: int | None = None,
                fallback: bool = True, scaling: str = "max"):
    """``(a @ b, setting)`` for float32 2-D ``a`` and ``b``: :func:`dgemm_ozaki`'s steps on
    their values (exact in float64) with float32's setting (the default keeps
    :data:`DEFAULT_BITS_FP32` and the guard of native float32's bound), the float64 result
    rounded once to float32. The fallbacks (Inf / NaN, lines the scaling cannot hold, the
    guard's elements) are float32 products (``numpy.matmul``: SGEMM's float32 sums, whose
    error is within ``γ_k Σ|a||b|``, u = 2^-24, in any summation order).

    The exact sum, rounded once: ``x = 1 + 2^-13`` squared, minus 1, is ``2^-12 + 2^-26``
    exactly (a float32); float32 products round the square to ``1 + 2^-12`` first:

    >>> import numpy as np
    >>> x = np.float32(1 + 2**-13)
    >>> a = np.array([[x, 1, 1, 1]], np.float32); b = np.array([[x], [-1], [0.5], [-0.5]], np.float32)
    >>> c, how = sgemm_ozaki(a, b)
    >>> float(c[0, 0]) == 2.0**-12 + 2.0**-26, float((a @ b)[0, 0]) == 2.0**-12, how.count, how.bits
    (True, True, 7, 26)
    """
    _check_scaling(scaling)
    _host_only("sgemm_ozaki", a, b)
    a, b = _check_operands("sgemm_ozaki", a, b, np.float32)
    c, how = emulated(a, b, count, bits, fallback, scaling)
    return c.astype(np.float32), how


def cgemm_ozaki(a: np.ndarray, b: np.ndarray, count: int | None = None, bits: int | None = None,
                fallback: bool = True, scaling: str = "max"):
    """``(a @ b, setting)`` for complex64 2-D ``a`` and ``b``: :func:`zgemm_ozaki`'s steps with
    float32's setting, each part rounded once to float32; the fallbacks are complex64 products.

    >>> import numpy as np
    >>> c, how = cgemm_ozaki(np.array([[1 + 2j, 0.5j]], np.complex64), np.array([[3 - 1j], [2 + 0j]], np.complex64))
    >>> c.dtype, c.tolist(), how.k, how.precision
    (dtype('complex64'), [[(5+6j)]], 4, 'float32')
    """
    _check_scaling(scaling)
    _host_only("cgemm_ozaki", a, b)
    a, b = _check_operands("cgemm_ozaki", a, b, np.complex64)
    c, how = emulated(a, b, count, bits, fallback, scaling)
    return c.astype(np.complex64), how
