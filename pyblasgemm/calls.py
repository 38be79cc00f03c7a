"""Call signatures: a repeated public call goes straight to the launch that ran it before.

The first call of a form with given argument types, dtypes, shapes, strides, devices and
pointer-alignment class is described, validated and planned in full; if it ran as one launch
on the arrays' own memory (no copies, no temporaries, no Python loop over batches) its
signature is stored in the plan cache with that launch (a :class:`Call`). The next call with
the same signature proves by its key everything the checks proved the first time, so only what
the key cannot prove is checked: pointers (overlap of C with A and B, the alignment of a fresh
result), scalar values, the current device. A key miss is the full path again.

The key is built from attribute reads that cost ~0.1-0.25 µs each on an H100 host (CuPy's
``shape``, ``strides``, ``dtype``, ``data.ptr``; bench/results/host_primitives_h100_2026-11-24.json),
against 4.5 µs for a raw kernel launch and ~50 µs for the path it replaces.
"""
from __future__ import annotations

import sys
import threading
from typing import NamedTuple

import numpy as np

from . import _arrays
from .plancache import get_plan_cache

__all__ = ["Call", "ordered", "cupy_type", "key", "peek", "words", "flag", "get", "put", "record",
           "span_bytes", "last_recorded", "forget_last", "recorded"]

cache = get_plan_cache()
#: the Call this thread recorded last (the converting path of foreign arrays records it under
#: their own key too: pyblasgemm.arrays.torch_record)
_last = threading.local()
#: the same object, for the replays that look their key up with the cache's ``peek`` inline
#: and write ``recorded.call = hit`` themselves (a replayed call counts as recorded, as in :func:`get`)
recorded = _last


def last_recorded():
    """The :class:`Call` this thread's last :func:`record` stored, or None (also after
    :func:`forget_last`)."""
    return getattr(_last, "call", None)


def forget_last() -> None:
    _last.call = None


class Call(NamedTuple):
    """What a signature's call does: the launch, operand order and pointer facts. A replay
    runs it as ``call.run(pa, pb, pc, alpha, beta, stream)``, the pointers in the caller's
    order (:func:`ordered`)."""

    launch: object          # (a_ptr, b_ptr, c_ptr, alpha, beta, stream) -> None
    swap: bool              # the problem ran as Cᵀ = op(B)ᵀ op(A)ᵀ: launch(b, a, c)
    a_bytes: int            # bytes each operand spans from its first element (overlap checks)
    b_bytes: int
    c_bytes: int
    c_mask: int             # a fresh result's pointer must have (ptr & c_mask) == 0
    shape: tuple            # a fresh result's shape, dtype and order (None with out=)
    dtype: object
    order: str
    one: object             # alpha and beta of the forms that fix them (matmul); ``zero``
    zero: object            # is also added to given scalars (-0.0 + 0.0 is +0.0)
    limit: object           # |alpha|, |beta| bound of the routine's scalar type (None: fixed)
    run: object             # ordered(launch, swap): (pa, pb, pc, alpha, beta, stream) -> None


def ordered(launch, swap: bool):
    """``launch`` as a replay calls it: ``(pa, pb, pc, alpha, beta, stream)`` with the operands'
    pointers in the caller's order. ``launch`` itself, or for a problem that ran as
    Cᵀ = op(B)ᵀ op(A)ᵀ (``swap``) a function that hands it ``(pb, pa, ...)``: bound once when
    the call is recorded, so that a replay is one call with no branch. (Against the branch
    each replay wrote, ``if call.swap: call.launch(pb, pa, ...) else: call.launch(pa, pb,
    ...)``: -0.04 µs unswapped, +0.02-0.04 µs swapped, where a method on :class:`Call` holding
    that branch cost +0.05-0.09 µs; a fake launch, medians of 21 rounds, 2-core dev host.)

    >>> seen = []
    >>> launch = lambda *pointers_scalars_stream: seen.append(pointers_scalars_stream)
    >>> ordered(launch, False) is launch
    True
    >>> ordered(launch, True)(0xA, 0xB, 0xC, 1.0, 0.0, 0); seen
    [(11, 10, 12, 1.0, 0.0, 0)]

    A launch that makes its own replay (``launch.replay(swap)``, not None: the mma.sync
    kernel's :meth:`~pyblasgemm.kernels.mma_sync.BoundLaunch.replay`) is replayed through it:
    one plain function with the operands' cells bound in the order ``swap`` says, no frame of
    ``swapped`` and none of the launch's ``__call__``.
    """
    replay = getattr(launch, "replay", None)
    run = replay(swap) if replay is not None else None
    if run is not None:
        return run
    if not swap:
        return launch

    def swapped(pa, pb, pc, alpha, beta, stream):
        launch(pb, pa, pc, alpha, beta, stream)

    return swapped


_cupy_ndarray: list = []
#: torch.Tensor, once PyTorch has been imported by anyone (set by pyblasgemm.arrays)
torch_tensor: list = []
#: JAX's concrete array type (``ArrayImpl``), once JAX has been imported (set by pyblasgemm.arrays)
jax_array: list = []
_current_device = _arrays.current_device
#: where a tensor key (:func:`key`) holds the first operand's device ordinal
TORCH_DEVICE = 6


def cupy_type():
    """``cupy.ndarray`` once CuPy has been imported by anyone, else None (never imports it)."""
    if _cupy_ndarray:
        return _cupy_ndarray[0]
    cupy = sys.modules.get("cupy")
    nd = getattr(cupy, "ndarray", None)
    if nd is not None:
        _cupy_ndarray.append(nd)
    return nd


_NDARRAY = np.ndarray


_ONE_GPU: dict = {}


def on_one_gpu(sharding) -> bool:
    """Whether a JAX sharding places the whole array on one GPU (remembered per sharding: the
    few a process uses; bounded, as every cache here). Looked up by the object's ``id`` and
    held with it (so the id stays its own): a sharding's ``__hash__`` is Python code, ~0.2 µs
    of a ~0.55 µs lookup on the dev host."""
    held = _ONE_GPU.get(id(sharding))
    if held is not None and held[0] is sharding:
        return held[1]
    devices = sharding.device_set
    hit = len(devices) == 1 and next(iter(devices)).platform == "gpu"
    if len(_ONE_GPU) >= 64:
        _ONE_GPU.clear()
    _ONE_GPU[id(sharding)] = (sharding, hit)
    return hit


def key(words: tuple, a, b, c=None, extra: tuple = ()):
    """The call-signature key of a call on arrays: ``(key, pa, pb, pc, *extra pointers)``, or
    None when the arrays are not all of one kind this builder keys (the full path then runs).

    The one place a signature is assembled. ``words``: the form's own part (its name, the
    keywords and scalar types as given: hashable values the full path read); ``a``, ``b``: the
    operands; ``c``: the array written in place, or None for a fresh result; ``extra``: more
    input arrays (a bias, a float8 product's scales; None entries allowed), each with its own
    dtype, shape, strides, device and alignment class, so that a scale's layout (per tensor,
    per row / column, per block: its shape), its dtype and its contiguity are key facts; an
    extra of another kind than the operands' (a NumPy scale beside CuPy arrays, a CPU tensor)
    gives no key. Per array kind:

    * CuPy: dtype, shape, strides and device of each array, the current device, and the
      16-byte alignment class of the operands' and output's pointers together (the plan's
      ``desc.align`` is read off the same OR of them);
    * PyTorch CUDA tensors: dtype, shape, ``stride()``, device and ``requires_grad`` of each,
      the same alignment class; None for a CPU tensor (the converting path) and for a tensor
      that requires grad while autograd records (the differentiable path: such a call must
      never replay into a detached launch, even one recorded under ``torch.no_grad()``);
    * NumPy: dtype, shape and strides of the operands and the output, not of the extras (a host
      call runs on views: no pointers, no device; no form records a NumPy call with extras).

    ``pa``, ``pb``, ``pc``: the pointers the key was read from (0 for NumPy and for a missing
    ``c``), then one per extra (0 for a None entry; none for NumPy arrays): a replay launches on
    these and reads no pointer again. A tensor key holds ``a``'s device ordinal at
    ``k[TORCH_DEVICE]`` (a replay reads it there, not again from the tensor: ``get_device()``
    is ~0.1 µs); the current device is not in it (a tensor replay compares its record's).

    >>> import numpy as np
    >>> a = np.ones((2, 3), np.float32)
    >>> k, *_ = key(("doc",), a, a.T)
    >>> k[:3], k == key(("doc",), a, a.T)[0], k == key(("doc",), a, a)[0]
    (('call', <class 'numpy.ndarray'>, ('doc',)), True, False)
    """
    t = type(a)
    if type(b) is not t or (c is not None and type(c) is not t):
        return None
    if _cupy_ndarray and t is _cupy_ndarray[0]:
        ma, mb = a.data, b.data
        pa, pb = ma.ptr, mb.ptr
        if c is None:
            pc, cpart, align = 0, None, pa | pb
        else:
            mc = c.data
            pc = mc.ptr
            cpart, align = (c.dtype, c.shape, c.strides, mc.device_id), pa | pb | pc
        k = ("call", t, words, a.dtype, a.shape, a.strides, ma.device_id, b.dtype, b.shape,
             b.strides, mb.device_id, cpart, _current_device(), align & 15)
        if not extra:       # (the plain product's call: no loop set up, ~0.02 µs)
            return k, pa, pb, pc
        # (the extras' facts joined to the key once, their pointers collected beside it: 0.70
        # against 0.82 µs for tuples grown per extra, three extras, 2-core dev host)
        sig, facts = [k, pa, pb, pc], []
        for x in extra:
            if type(x) is t:
                mx = x.data
                px = mx.ptr
                facts.append((x.dtype, x.shape, x.strides, mx.device_id, px & 15))
            elif x is None:
                px = 0
                facts.append(None)
            else:
                return None         # a host scale, a tensor beside CuPy arrays: the full path
            sig.append(px)
        sig[0] = k + tuple(facts)
        return tuple(sig)
    if torch_tensor and t is torch_tensor[0]:
        da, db = a.get_device(), b.get_device()
        if da < 0 or db < 0:
            return None
        ga, gb = a.requires_grad, b.requires_grad
        pa, pb = a.data_ptr(), b.data_ptr()
        if c is None:
            pc, cpart, align, gc = 0, None, pa | pb, False
        else:
            dc = c.get_device()
            if dc < 0:
                return None
            pc, gc = c.data_ptr(), c.requires_grad
            cpart, align = (c.dtype, c.shape, c.stride(), dc, gc), pa | pb | pc
        k = ("call", t, words, a.dtype, a.shape, a.stride(), da, ga, b.dtype, b.shape, b.stride(),
             db, gb, cpart, align & 15)
        sig = [k, pa, pb, pc]
        if extra:
            facts = []
            for x in extra:
                if x is None:
                    facts.append(None)
                    sig.append(0)
                    continue
                if type(x) is not t:
                    return None
                dx, gx = x.get_device(), x.requires_grad
                if dx < 0:
                    return None
                gc = gc or gx
                px = x.data_ptr()
                facts.append((x.dtype, x.shape, x.stride(), dx, gx, px & 15))
                sig.append(px)
            sig[0] = k + tuple(facts)
        if (ga or gb or gc) and sys.modules["torch"].is_grad_enabled():
            return None             # autograd records it: the differentiable path, never a replay
        return tuple(sig)
    if t is _NDARRAY:       # (no pointers: 0 for each, the extras' too)
        return (("call", t, words, a.dtype, a.shape, a.strides, b.dtype, b.shape, b.strides,
                 None if c is None else (c.dtype, c.shape, c.strides)), 0, 0, 0) + (0,) * len(extra)
    return None


def peek(key):
    """The entry of ``key`` or None, in one dict lookup (:meth:`pyblasgemm.plancache.PlanCache.peek`:
    not marked used, not counted; None for a key that cannot be hashed). For the replays whose
    whole cost is a few µs: :func:`get` hashes and compares the key twice (``move_to_end``) and
    writes a thread-local: 1.7 against 0.8 µs for a fresh 25-item key on the 2-core dev host. A peeked entry
    ages as if unused: a full cache may evict it, and its next call records it again."""
    try:
        return cache.peek(key)
    except TypeError:
        return None


def words(form, compute, backend, invariant, fields: tuple) -> tuple:
    """The form's own part of a signature key (:func:`key`'s ``words``), written in one place
    for the forms with scalars and flags (the BLAS form, :func:`pyblasgemm.gemm`,
    :mod:`pyblasgemm.scipy`), for the key each looks up and the one it records: the form's
    name, ``compute=`` and ``backend=`` as given, ``invariant=`` as :func:`flag` reads it, and
    ``fields``, what else the form's full path read (flags, sizes, the scalars' types:
    hashable values).

    ``fields`` is taken as a tuple and kept as one, and :func:`flag`'s common answers are read
    here, not called for: against the flat tuple written out at each call with its ``flag()``
    call this costs ~0.05 µs; ``*fields`` and a concatenation cost ~0.12 µs (14 words, median
    of 11 rounds on the 2-core dev host).

    >>> words("s", None, "host", None, ("N", "T", 4, 4, 4, float))
    ('s', None, 'host', None, ('N', 'T', 4, 4, 4, <class 'float'>))
    >>> words("gemm", None, None, 1, ())[3]              # invariant=1 is not True's call
    [1]
    """
    if not (invariant is None or invariant is True or invariant is False):
        invariant = flag(invariant)
    return (form, compute, backend, invariant, fields)


def span_bytes(x) -> int | None:
    """Bytes from ``x``'s first element to the end of its last (None for a negative stride)."""
    if x.size == 0:
        return 0
    reach = x.dtype.itemsize
    for dim, stride in zip(x.shape, x.strides):
        if stride < 0:
            return None
        reach += (dim - 1) * stride
    return reach


def record(key, launch, swap: bool, a, b, c, fresh: bool, one=None, zero=None,
           limit=None) -> None:
    """Remember that ``key``'s call ran as ``launch`` on (a, b, c) (C fresh or given).
    Nothing is kept under ``PYBLASGEMM_NO_PLAN_CACHE=1`` (every call planned anew), nor for a
    ``key`` of None (arrays :func:`key` does not key)."""
    from .planner.overrides import current_settings

    if key is None or not current_settings().cache:
        return
    spans = [span_bytes(x) for x in (a, b, c)]
    if None in spans:
        return
    order = "C" if c.flags.c_contiguous else "F"
    c_mask = 15 if fresh else 0
    if fresh and c.data.ptr & 15:
        return                  # a custom allocator's odd alignment: keep the full path
    call = Call(launch, swap, spans[0], spans[1], spans[2], c_mask, c.shape if fresh else None, c.dtype,
                order, one, zero, limit, ordered(launch, swap))
    try:
        cache.put(key, call, refers_to=launch)     # the launch's own entry (execute's) owns it
    except TypeError:       # an unhashable word (calls.flag's stand-in): nothing to replay
        return
    _last.call = call


def put(key, value, refers_to=None) -> None:
    """Store ``value`` under a key of :func:`key` (nothing under ``PYBLASGEMM_NO_PLAN_CACHE=1``);
    ``refers_to``: the launch it replays (see :meth:`pyblasgemm.plancache.PlanCache.put`)."""
    from .planner.overrides import current_settings

    if current_settings().cache:
        try:
            cache.put(key, value, refers_to=refers_to)
        except TypeError:   # an unhashable word (calls.flag's stand-in): nothing to replay
            pass


def flag(value):
    """A True / False / None keyword (``invariant=``) as a key word: itself, or for any other
    value an unhashable stand-in, so that no signature is found and the full path names the
    value in its error (``invariant=1`` equals and hashes as True: it must not replay True's
    call unchecked).

    >>> import numpy as np
    >>> flag(True), flag(None), flag(np.True_), get((flag(1),))
    (True, None, True, None)
    """
    if value is None or value is True or value is False:
        return value
    if isinstance(value, np.bool_):             # NumPy's bool: the same flag
        return bool(value)
    return [value]


def get(key):
    """The :class:`Call` of ``key``, or None (also for a key that cannot be hashed: a list
    given as a flag, say, which the full path then names in its error)."""
    try:
        hit = cache.get(key)
    except TypeError:
        return None
    if hit is not None:
        _last.call = hit        # a replayed call counts as recorded (arrays.torch_record)
    return hit


def overlaps(call: Call, pa: int, pb: int, pc: int) -> bool:
    """Whether C's span meets A's or B's (then the full path computes via a temporary)."""
    cb = call.c_bytes
    return ((pc < pa + call.a_bytes and pa < pc + cb) or (pc < pb + call.b_bytes and pb < pc + cb))
