"""pyblasgemm on Dask arrays: block GEMM with wide, deterministic partial sums.

Dask is the engine (its schedulers, its clusters, its chunks); this module brings the block
products, the accumulation and the order of the sums. For ``x @ y`` with NumPy or CuPy chunks:

* each block product runs through :func:`pyblasgemm.matmul` / :func:`pyblasgemm.gemm` (the
  planner, our kernels, ``compute=`` and ``backend=`` honoured); the types pyblasgemm does not
  accelerate (mixed pairs such as float32 @ float64, int16, bool, float16 with
  ``dtype=float64``) go on to ``numpy.matmul`` / ``cupy.matmul`` from there, so every pair
  ``numpy.matmul`` takes gives its result type and values (operands rounded first where NumPy
  rounds them: ``dtype=float16`` on float32 data);
* products over K are kept in a wide type (:func:`accumulation_dtype`: float32 for float16 /
  bfloat16 results, int32 for int8, the result's own type otherwise): a group of consecutive K
  chunks is one chain of GEMMs accumulating into one wide buffer (``C += A_k B_k``), and the
  groups are added in a fixed pairwise tree, then cast to the result type once (with
  ``alpha`` and ``beta · C`` for :func:`gemm`, whose ``alpha`` and ``beta`` are checked as
  :func:`pyblasgemm.gemm` checks them); by default all of K is one group (one task per output
  block) when the product has at least :data:`MIN_TASKS` output blocks, and K is split into
  about :data:`MIN_TASKS` tasks in all when it has fewer (:func:`k_group_for`);
* the graph, and so every sum's order, depends only on the chunks and ``k_group``: the result
  is bitwise the same from the threaded scheduler, a ``distributed.LocalCluster`` or a
  ``dask_cuda.LocalCUDACluster``;
* on a ``distributed`` cluster whose memory holds the operands' blocks when the product is
  built (persisted and waited for), each task is placed where its data is (:func:`_placement`:
  ``C[i, j]`` with A's row panel, a long K's partial products with their K chunks, adds with
  their left input, within a fair share of the work a worker; local work first), so each
  worker fetches a block it lacks once and partial sums stay where they are; the placement
  travels as Dask annotations (``workers``, ``allow_other_workers``, ``priority``) on a
  ``dask.array.Array`` subclass optimized without low-level fusion, which would drop them
  (an array derived from the result is Dask's own again, and Dask places its tasks); the
  placed blocks of a worker that read the same other workers' blocks run as one task, each
  output block a pick of it (:data:`RUNS`; a run of one block is that block's task);
  ``z.persist()`` and ``z.compute()`` hand each worker's engine, a Dask actor, its exports and
  its runs before the graph goes to the scheduler (``client.persist(z)`` and
  ``dask.persist(z)``: once the client has queued it), runs that read other workers' blocks
  included (the engine asks those workers' engines for their exports, worker to worker, and
  queues the copies behind its own runs), and the tasks take them (:data:`START`);
* where a placed task needs a block another worker of the same host holds, the block moves
  through CUDA IPC (``transport="auto"`` for CuPy chunks, or ``"ipc"``; :mod:`pyblasgemm._dask_ipc`):
  an export task makes the IPC handles where the blocks are (one a worker for the blocks in
  memory that others read), a fetch copies them device to device where they are read, once
  per worker (a task of its own, or folded into the one task there that reads them: few
  tasks, since each costs Dask time before the first product starts); NumPy blocks, memory
  that refuses IPC and other hosts keep Dask's transfer (``transport="dask"`` for all of them);
* K chunks of the two operands are aligned (rechunked to their common refinement only when
  they differ, logged at DEBUG on ``logging.getLogger("pyblasgemm.dask")``); batch dimensions
  broadcast as in ``numpy.matmul``.

``dask.array.matmul`` sums the partial products in the result type (float16 adds for
float16), in an order its reduction picks; that is the difference in accuracy this module
exists for (docs: guide/dask).

``out=`` is not a Dask concept: a Dask array is a recipe, and the result is a new one. Keep it
in memory with ``.persist()``, write it into an existing array (NumPy, CuPy, Zarr, ...) with
``dask.array.store(result, target)``, or pass the beta term of a GEMM as ``c=``.

Example (NumPy chunks, the threaded scheduler)
----------------------------------------------
>>> import numpy as np, dask.array as da
>>> from pyblasgemm import dask as pbd
>>> rng = np.random.default_rng(0)
>>> x = da.from_array(rng.standard_normal((64, 96)).astype(np.float16), chunks=(32, 12))
>>> y = da.from_array(rng.standard_normal((96, 40)).astype(np.float16), chunks=(12, 20))
>>> z = pbd.matmul(x, y)    # 4 output blocks: K's 8 chunks in 2 tasks of 4 a block, float32 sums
>>> z.dtype, z.chunks
(dtype('float16'), ((32, 32), (20, 20)))
>>> exact = x.compute().astype(np.float64) @ y.compute().astype(np.float64)
>>> bool(np.abs(z.compute() - exact).max() <= 2**-11 * np.abs(exact).max())
True
"""
from __future__ import annotations

import collections
import functools
import itertools
import logging
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:     # types only
    from dask.array import Array as DaskArray

    from ._typing import Backend, Compute, DaskTransport, GemmTrans, HostScalar

__all__ = ["matmul", "gemm", "accumulation_dtype", "k_group_for", "transport_of", "ipc_stats", "close_ipc_handles",
           "MIN_TASKS", "TRANSPORTS", "engine_stats"]

log = logging.getLogger("pyblasgemm.dask")

#: the default grouping of K chunks: one task per output block (all of K chained into one wide
#: buffer) when the product has at least this many output blocks; with fewer, K split into
#: groups until there are about this many partial tasks in all, so that a long K with a single
#: output block still spreads over 4-8 GPUs. Why not more tasks: Dask spends 0.5-1 ms on each
#: (scheduler and worker), and the old aim of ~32 partial tasks took 71.8 ms where one task per
#: block took 41.3 ms (16384^3 float16 in 4096^2 chunks, one H100; 71.9 / 40.0 ms on an H200:
#: docs/guide/dask.rst); on several GPUs every split of K adds transfers of partial products
#: besides. A function of the chunks only, so that the sums' order never depends on the cluster.
MIN_TASKS = 8

#: how a block that a task needs reaches it from another worker (the ``transport`` keyword):
#: ``"ipc"``: through CUDA IPC within one host (:mod:`pyblasgemm._dask_ipc`; a block that
#: cannot be exported, or a worker on another host, goes through Dask's transfer); ``"dask"``:
#: Dask's own comm (TCP, UCX, ...); ``"auto"`` (the default): ``"ipc"`` when the chunks are
#: CuPy arrays, else ``"dask"``
TRANSPORTS = ("auto", "ipc", "dask")

#: on a cluster holding the operands (a placed product, one task per output block over all of
#: K): True bundles the block products of a worker that read the same other workers' blocks
#: into one *run* task, which computes them back to back and returns them as a tuple, each
#: output block then a pick of it (:func:`_bundle_runs`). A worker's first message from the
#: scheduler then holds one run (and its export) instead of each of its products, and it starts
#: its GPU work once that run is unpacked, not once every product's is; the sums and so the
#: bits are the same. False: one task per output block, as before 2026-11-28 (kept to compare:
#: bench/dask_scaling.py ``--schedule``)
RUNS = True

#: on a cluster holding the operands: True makes ``z.persist()`` and ``z.compute()`` of a placed
#: product hand each worker its work (its exports of the blocks others read, its runs of its own
#: blocks, and its runs that read other workers' exports, which its engine asks their engines
#: for: :func:`_start_work`; :data:`RUNS`) directly, through a Dask actor on that
#: worker (:class:`_Engine`, made once a worker when a product is first placed), before the graph
#: goes to the scheduler; ``client.persist(z)`` and ``dask.persist(z)`` on that cluster hand it
#: out just after the client has queued the graph (:func:`_start_persisted`, through Dask's
#: collection protocol, ``__dask_postpersist__``), once per product and client. The graph's
#: tasks then take what was started (:func:`_take`) or, where nothing was (another scheduler,
#: ``client.compute(z)``, a second persist of the same product, an engine that failed), compute
#: it themselves, the same function on the same blocks: the same bits. Why: on 2 H200s Dask
#: takes 7.26 ms from a one-task ``persist`` to its task's start, against the ~4.7 ms that 1.85x
#: one call leaves it at 32768^3 float16 (~55 ms); an actor's call goes from the client to its
#: worker without the scheduler. False: the graph alone, as before 2026-11-28 (kept to compare:
#: bench/dask_scaling.py ``--schedule``)
START = True

#: a worker keeps the started work of at most this many persists (the newest) that no task has
#: taken yet, none of it older than :data:`KEEP_S` seconds; older work is dropped (its tasks,
#: if they still come, compute it): started work that no graph reads (a persist of keys the
#: cluster already holds, a graph that failed to reach the scheduler) must not hold GPU memory
KEEP_TICKETS = 2
KEEP_S = 30.0

#: how long a task waits for the engine's started work of its block before it computes the
#: block itself (the engine runs it: this is a bound for a hung engine, not a timing)
WAIT_S = 60.0

#: how long making a worker's engine may take (once a worker; a worker that does not answer
#: in time has none, and its tasks compute everything)
ENGINE_TIMEOUT_S = 30.0


def _dask_array():
    try:
        import dask.array as da
    except ImportError as e:        # pragma: no cover - the extra is missing
        raise ImportError("pyblasgemm.dask needs Dask: pip install 'pyblasgemm[dask]' "
                          "(dask[array] and distributed)") from e
    return da


def accumulation_dtype(result_dtype) -> np.dtype:
    """The type the partial products over K are kept and summed in.

    >>> import ml_dtypes
    >>> [accumulation_dtype(t).name for t in (np.float16, ml_dtypes.bfloat16, np.int8, np.int32,
    ...                                       np.float32, np.float64, np.complex64)]
    ['float32', 'float32', 'int32', 'int32', 'float32', 'float64', 'complex64']
    """
    dt = np.dtype(result_dtype)
    if dt.kind == "f" and dt.itemsize < 4 or dt.name == "bfloat16":
        return np.dtype(np.float32)
    if dt.kind in "iu" and dt.itemsize < 4:
        return np.dtype(np.int32)   # int32 adds wrap modulo 2^32: one cast wraps as numpy would
    return dt


def _check_k_group(routine: str, k_group) -> None:
    """``k_group`` is None or an integer >= 1 (not a bool), named in the error."""
    if k_group is None:
        return
    if isinstance(k_group, (bool, np.bool_)) or not isinstance(k_group, (int, np.integer)):
        raise TypeError(f"{routine}: k_group={k_group!r} must be an integer number of K chunks per task "
                        f"(or None), not {type(k_group).__name__}")
    if k_group < 1:
        raise ValueError(f"{routine}: k_group={k_group!r} must be at least 1 K chunk per task")


def _check_transport(routine: str, transport) -> None:
    """``transport`` is one of :data:`TRANSPORTS`, named in the error.

    >>> _check_transport("pyblasgemm.dask.matmul", "nvlink")
    Traceback (most recent call last):
        ...
    ValueError: pyblasgemm.dask.matmul: transport='nvlink' must be one of 'auto', 'ipc', 'dask'
    """
    if not isinstance(transport, str) or transport not in TRANSPORTS:
        raise ValueError(f"{routine}: transport={transport!r} must be one of "
                         + ", ".join(repr(t) for t in TRANSPORTS))


def k_group_for(k_chunks: int, output_blocks: int, k_group: int | None = None) -> int:
    """K chunks per partial-product task: ``k_group`` if given (an integer >= 1; more than
    ``k_chunks`` means all of them), else the default, from the chunks alone:

    * at least :data:`MIN_TASKS` output blocks: all ``k_chunks`` in one task per block (one
      chain of GEMMs into one wide buffer, no tree of sums);
    * fewer: K split so that there are about :data:`MIN_TASKS` partial tasks in all. With
      ``n = ceil(MIN_TASKS / output_blocks)`` groups per block (at most ``k_chunks``), a task
      takes ``ceil(k_chunks / n)`` K chunks: the longest task ``n`` groups would have, in the
      fewest groups that give it (9 K chunks on one block: 5 tasks of at most 2, not 9 of 1).

    >>> k_group_for(4, 16)          # 16 output blocks: all of K in one task per block
    4
    >>> k_group_for(32, 1)          # one output block, long K: 8 tasks of 4 K chunks
    4
    >>> k_group_for(16, 2), k_group_for(7, 4), k_group_for(3, 1), k_group_for(9, 1)
    (4, 4, 1, 2)
    >>> k_group_for(8, 1, k_group=3), k_group_for(8, 1, k_group=100)
    (3, 8)
    """
    _check_k_group("pyblasgemm.dask.k_group_for", k_group)
    for name, value in (("k_chunks", k_chunks), ("output_blocks", output_blocks)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"pyblasgemm.dask.k_group_for: {name}={value!r} must be an integer, "
                            f"not {type(value).__name__}")
        if value < 1:
            raise ValueError(f"pyblasgemm.dask.k_group_for: {name}={value!r} must be at least 1")
    if k_group is not None:
        return int(min(k_group, k_chunks))
    if output_blocks >= MIN_TASKS:
        return int(k_chunks)
    groups = min(k_chunks, -(-MIN_TASKS // output_blocks))
    return int(-(-k_chunks // groups))


# ---------------------------------------------------------------------------------------------
# Tasks (run on the workers; pure functions of their inputs)
# ---------------------------------------------------------------------------------------------

def _contiguous(x):
    """``x`` in C order (itself when it is): a block's layout must not depend on where it came
    from (a view of the whole array on the threaded scheduler, a copy after a transfer between
    workers), or the product's path may (OpenBLAS's float32 bits differed by layout on the GPU
    machine's host; our planner picks by leading dimension and alignment)."""
    return x if x.flags.c_contiguous else x.copy(order="C")


def _gemm_accumulates(a, b, out) -> bool:
    """Whether :func:`pyblasgemm.gemm` takes ``out += a @ b`` for these blocks: 2-D, one type it
    accelerates, ``out`` in that type's output type or float32 for 16-bit floats (shgemm /
    sbgemm). Everything else (mixed pairs, int16, bool, float16 into float64 sums) is
    ``out += matmul(a, b)``: pyblasgemm.matmul hands those to numpy / cupy.matmul."""
    from ._types import ROW_BY_DTYPE, ROW_BY_DTYPES

    row = ROW_BY_DTYPE.get(a.dtype)
    return (a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype and row is not None
            and (out.dtype == row.c_dtype or (a.dtype, out.dtype) in ROW_BY_DTYPES))


def _typed(block, dtype):
    """``block`` as the graph's ``dtype``: a bfloat16 CuPy block that crossed between workers
    arrives as ``|V2`` (Dask's CuPy serializer sends ``__cuda_array_interface__['typestr']``,
    which is ``'<V2'`` for ml_dtypes' bfloat16: a 2-GPU run failed on it), so a void block of
    the expected width is viewed as that type again; anything else is returned as it is.

    >>> import ml_dtypes
    >>> bf16 = np.dtype(ml_dtypes.bfloat16)
    >>> _typed(np.ones(3, bf16).view("V2"), bf16).dtype.name, _typed(np.ones(3, np.float16), bf16).dtype.name
    ('bfloat16', 'float16')
    """
    if (block.dtype != dtype and block.dtype.kind == "V" and block.dtype.fields is None
            and block.dtype.itemsize == dtype.itemsize):
        return block.view(dtype)
    return block


def _product(xs, ys, types, acc, compute, backend):
    """sum_k xs[k] @ ys[k] in ``acc``, in order: the first product into a new buffer, each
    next one accumulated into it (by the GEMM itself, beta = 1, where it takes the blocks).
    ``types``: the operands' dtypes in the graph (:func:`_typed`)."""
    import pyblasgemm

    x_type, y_type = types
    out = None
    for a, b in zip(xs, ys):
        a, b = _contiguous(_typed(a, x_type)), _contiguous(_typed(b, y_type))
        if out is None:
            out = pyblasgemm.matmul(a, b, dtype=acc, compute=compute, backend=backend)
        elif _gemm_accumulates(a, b, out):
            pyblasgemm.gemm("N", "N", a, b, out, 1, 1, compute=compute, backend=backend)
        else:
            out += pyblasgemm.matmul(a, b, dtype=acc, compute=compute, backend=backend)
    return out


def _add(p, q):
    return p + q


def _to_bfloat16(x):
    """float32 -> bfloat16, rounded to nearest even, NaN kept quiet, with integer operations on
    the bits: what ``ml_dtypes`` does on the host, for any array module (CuPy has no bfloat16
    cast of its own: an H100 run of the benchmark got float32 chunks from ``astype``).

    >>> import ml_dtypes
    >>> v = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5e-40, np.inf, np.nan], np.float32)
    >>> bool((_to_bfloat16(v).view(np.uint16) == v.astype(ml_dtypes.bfloat16).view(np.uint16)).all())
    True
    """
    import ml_dtypes

    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x40)
    out = (rounded * ~nan + quiet * nan).astype(np.uint16)
    return out.view(ml_dtypes.bfloat16)


def _finish(total, out_dtype, alpha, beta, c, c_type):
    """alpha * total + beta * c in the accumulation type (c not read when beta == 0), cast once."""
    if alpha != 1:
        total = total * total.dtype.type(alpha)
    if beta != 0:
        total = total + _typed(c, c_type).astype(total.dtype) * total.dtype.type(beta)
    if np.dtype(out_dtype).name == "bfloat16":
        return _to_bfloat16(total)
    return total.astype(out_dtype, copy=False)


def _product_finish(xs, ys, types, acc, compute, backend, out_dtype, alpha, beta, c, c_type):
    return _finish(_product(xs, ys, types, acc, compute, backend), out_dtype, alpha, beta, c, c_type)


def _sum_finish(p, q, out_dtype, alpha, beta, c, c_type):
    return _finish(p + q, out_dtype, alpha, beta, c, c_type)


def _run(plan, types, acc, compute, backend, out_dtype, alpha, beta, c_type, *groups):
    """Several output blocks of one worker, back to back: ``plan`` holds per block the
    ``(group, index)`` of its K chunks of x and of y (and of c, or None) in ``groups`` (lists
    of blocks, one argument each: the worker's own, or those fetched from one other worker,
    where a fetch folds in); each block is
    :func:`_product_finish` of them, what its own task would compute, so the bits are the same.

    >>> a, b = np.ones((2, 3), np.float32), np.full((3, 2), 2, np.float32)
    >>> out = _run([([(0, 0)], [(0, 1)], None)] * 2, (a.dtype, b.dtype), np.dtype(np.float32), None, None,
    ...            np.float32, 1, 0, None, [a, b])
    >>> len(out), out[0].tolist()
    (2, [[6.0, 6.0], [6.0, 6.0]])
    """
    out = []
    for xs, ys, c in plan:
        out.append(_product_finish([groups[g][n] for g, n in xs], [groups[g][n] for g, n in ys], types, acc,
                                   compute, backend, out_dtype, alpha, beta,
                                   None if c is None else groups[c[0]][c[1]], c_type))
    return tuple(out)


def _pick(blocks, index: int):
    """Block ``index`` of a run's tuple: an output block's own key."""
    return blocks[index]


class _LaterFetch:
    """A fetch of another worker's blocks that a run task makes only if its worker's engine has
    not run it already (:func:`_fetch_later`): the export (an :class:`pyblasgemm._dask_ipc.IpcBlocks`,
    or the blocks themselves), this reader's slot among the export's, and the blocks it takes."""

    __slots__ = ("group", "slot", "indices")

    def __init__(self, group, slot, indices=None):
        self.group, self.slot, self.indices = group, slot, indices

    def fetch(self):
        from . import _dask_ipc

        return _dask_ipc.fetch(self.group, self.slot, self.indices)


def _fetch_later(group, slot, indices=None):
    """The fetch folded into a run task (:func:`_ipc_rewrite`), made when the task needs it: an
    inline fetch runs before the task's function, and so would copy the blocks again where the
    worker's engine has already copied them and computed the run (:data:`START`).

    >>> later = _fetch_later((np.ones(2), np.zeros(3)), 0, (1,))
    >>> [b.tolist() for b in later.fetch()]
    [[0.0, 0.0, 0.0]]
    """
    return _LaterFetch(group, slot, indices)


def _run_task(ticket, slot, plan, types, acc, compute, backend, out_dtype, alpha, beta, c_type, *groups,
              single=False):
    """A run task (:func:`_bundle_runs`): the run this worker's engine started under ``ticket``
    (:data:`START`; ``slot``: the run's name in it), else :func:`_run` of ``groups`` here (the
    fetches folded into it, :func:`_fetch_later`, made first); ``single``: the run's one block
    instead of the tuple (a run of one output block is that block's own task).

    >>> a = np.ones((2, 2), np.float32)
    >>> _run_task(None, 0, [([(0, 0)], [(0, 0)], None)], (a.dtype, a.dtype), a.dtype, None, None, a.dtype, 1, 0,
    ...           None, [a])[0].tolist()
    [[2.0, 2.0], [2.0, 2.0]]
    """
    if ticket is not None:
        started = _take(ticket, slot)
        if started is not None:
            return started[0] if single else started
    groups = tuple(g.fetch() if isinstance(g, _LaterFetch) else g for g in groups)
    out = _run(plan, types, acc, compute, backend, out_dtype, alpha, beta, c_type, *groups)
    return out[0] if single else out


def _export_task(ticket, slot, *blocks, readers=1):
    """An export task of blocks in memory (:func:`_ipc_rewrite`): the export this worker's
    engine made under ``ticket``, else :func:`pyblasgemm._dask_ipc.export` of ``blocks`` here."""
    if ticket is not None:
        started = _take(ticket, slot)
        if started is not None:
            return started
    from . import _dask_ipc

    made = _dask_ipc.export(*blocks, readers=readers)
    if ticket is not None:              # other workers' engines may be waiting for it (_Engine.exported)
        _publish(ticket, slot, made)
    return made


# ---------------------------------------------------------------------------------------------
# The engine: work a worker starts before its tasks arrive (START); state of the worker process
# ---------------------------------------------------------------------------------------------

_PENDING = object()                     # a slot the engine is computing
_ENGINE = threading.Condition()         # guards the three below; notified when a slot is done
#: (ticket, slot) -> _PENDING, or the started value until a task takes it
_STARTED: dict = {}
#: ticket -> when its work arrived (monotonic s), newest last: KEEP_TICKETS, KEEP_S
_TICKETS: collections.OrderedDict = collections.OrderedDict()
#: (ticket, slot) that a task found unstarted (and so computes): an engine arriving later skips it
_TAKEN: collections.OrderedDict = collections.OrderedDict()
_TAKEN_MAX = 4096
_ENGINE_COUNTS = {"started": 0, "taken": 0, "computed_in_task": 0, "skipped": 0, "dropped": 0, "failed": 0}
#: (ticket, slot) -> an export of this worker's blocks as other workers read it (the IPC
#: handles and events without the arrays, or NumPy blocks themselves), or None when it could not
#: be made here: what another worker's engine asks for (:meth:`_Engine.exported`) to start a run
#: that reads these blocks. Dropped with its ticket (:func:`_forget_old`)
_EXPORTS: dict = {}

#: how long an engine's run that reads another worker's blocks waits for that worker's export
#: (made by its engine or its task, normally within a few ms of the persist) before it leaves
#: the run to its task: a bound for an engine that never got its work, not a timing
EXPORT_WAIT_S = 10.0


def engine_stats(reset: bool = False) -> dict:
    """This process's counts of started work (:data:`START`): slots the engine started, slots a
    task took from it, slots a task computed itself (nothing started), slots the engine skipped
    (a task was first, or a block was not in this worker's memory), started results dropped
    unread (:data:`KEEP_TICKETS`, :data:`KEEP_S`) and slots that failed in the engine (their
    task computes them); ``held``: started results waiting for their task. On a cluster:
    ``client.run(pyblasgemm.dask.engine_stats)``.

    >>> sorted(engine_stats())
    ['computed_in_task', 'dropped', 'failed', 'held', 'skipped', 'started', 'taken']
    """
    with _ENGINE:
        out = dict(_ENGINE_COUNTS, held=sum(v is not _PENDING for v in _STARTED.values()))
        if reset:
            for k in _ENGINE_COUNTS:
                _ENGINE_COUNTS[k] = 0
    return out


def _forget_old(now: float) -> None:
    """Drop the started results of tickets beyond the newest :data:`KEEP_TICKETS` or older than
    :data:`KEEP_S` (under ``_ENGINE``); slots still computing are dropped when they finish."""
    while _TICKETS and (len(_TICKETS) > KEEP_TICKETS or now - next(iter(_TICKETS.values())) > KEEP_S):
        old, _ = _TICKETS.popitem(last=False)
        for key in [k for k in _EXPORTS if k[0] == old]:
            del _EXPORTS[key]
        for key in [k for k in _STARTED if k[0] == old]:
            if _STARTED[key] is not _PENDING:
                del _STARTED[key]
                _ENGINE_COUNTS["dropped"] += 1


def _take(ticket, slot):
    """The engine's started value of ``(ticket, slot)`` (waiting while it computes it), or None:
    then the caller computes it, and an engine that comes later skips it."""
    key = (ticket, slot)
    deadline = time.monotonic() + WAIT_S
    with _ENGINE:
        while _STARTED.get(key) is _PENDING and (left := deadline - time.monotonic()) > 0:
            _ENGINE.wait(left)
        value = _STARTED.pop(key, None)
        if value is None or value is _PENDING:
            _TAKEN[key] = True
            while len(_TAKEN) > _TAKEN_MAX:
                _TAKEN.popitem(last=False)
            _ENGINE_COUNTS["computed_in_task"] += 1
            return None
        _ENGINE_COUNTS["taken"] += 1
    return value


def _publish(ticket, slot, made) -> None:
    """Keep the export ``made`` under ``(ticket, slot)`` for other workers' engines (``_EXPORTS``),
    as it travels: the IPC handles and events without the arrays (the export task's value holds
    those, for as long as Dask keeps its key), or None where none was made."""
    from . import _dask_ipc

    if isinstance(made, _dask_ipc.IpcBlocks):
        made = _dask_ipc.IpcBlocks(made.entries, made.host, made.pid, None, made.events)
    with _ENGINE:
        _EXPORTS[ticket, slot] = made


async def _exported(ticket, slot, wait_s: float = EXPORT_WAIT_S):
    """The export published under ``(ticket, slot)`` in this process (:func:`_publish`), once
    there (polled on the event loop: no thread waits), or None after ``wait_s`` seconds."""
    import asyncio

    deadline = time.monotonic() + wait_s
    missing = object()
    while (made := _EXPORTS.get((ticket, slot), missing)) is missing:
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.0002)     # an export is made within ~0.3 ms of its engine's start
    return made


def _start_work(ticket, jobs, data, ask=None) -> int:
    """Compute ``jobs`` (:func:`_started_graph`) under ``ticket``, each from the blocks in
    ``data`` (a worker's memory), in order: ``("export", slot, keys, readers)`` is
    :func:`pyblasgemm._dask_ipc.export` of those blocks (published for other workers:
    :func:`_publish`), ``("run", slot, keys, args)`` is :func:`_run` with the blocks as its one
    group, and ``("remote", slot, keys, (args, sources))`` is :func:`_run` with the blocks as its
    first group and one group per source ``(address, engine, export slot, reader slot,
    indices)``: the export that worker's engine publishes, asked for through ``ask(address,
    engine, ticket, export slot)`` (a future; all asked at once, before any run) and fetched
    here (:func:`pyblasgemm._dask_ipc.fetch`: a copy queued on a copy stream, which the runs
    after it wait for on the GPU, so the copies overlap this worker's own runs). A job whose
    task came first, or one of whose blocks is not in ``data``, is skipped; a job that raises,
    or whose export does not come, is left to its task. The number started.

    >>> a = np.ones((2, 2), np.float32)
    >>> args = ([([(0, 0)], [(0, 0)], None)], (a.dtype, a.dtype), a.dtype, None, None, a.dtype, 1, 0, None)
    >>> _start_work("t-doc", [("run", 0, ["a"], args), ("run", 1, ["missing"], args)], {"a": a})
    1
    >>> _run_task("t-doc", 0, *args, None)[0].tolist(), _take("t-doc", 1)
    ([[2.0, 2.0], [2.0, 2.0]], None)
    """
    now = time.monotonic()
    with _ENGINE:
        _TICKETS[ticket] = now
        _TICKETS.move_to_end(ticket)
        _forget_old(now)
        mine = []
        for job in jobs:
            key = (ticket, job[1])
            if key in _TAKEN or key in _STARTED:
                _ENGINE_COUNTS["skipped"] += 1
                continue
            _STARTED[key] = _PENDING
            mine.append(job)
    asked = {}                          # (slot, source) -> a future of that source's export
    if ask is not None:
        for kind, slot, _keys, args in mine:
            if kind == "remote":
                for n, (address, engine, export_slot, _reader, _indices) in enumerate(args[1]):
                    try:
                        asked[slot, n] = ask(address, engine, ticket, export_slot)
                    except Exception as e:  # no loop, no connection: the task fetches
                        log.debug("asking %s for export %s failed: %s: %s", address, export_slot,
                                  type(e).__name__, e)
    started = 0
    fetched = None                      # slot -> (groups, copy events), made before the first remote run
    for kind, slot, keys, args in mine:
        key = (ticket, slot)
        value = None
        try:
            blocks = [data[k] for k in keys]
        except KeyError:                # not here (moved, spilled away, released): its task reads it
            blocks = None
        if kind == "remote" and fetched is None:
            # every copy queued back to back on the copy stream, after this worker's own runs
            # (queued above) and before any run that reads them: a fetched block released after
            # its run makes the copy stream wait for that run (_dask_ipc._Fetched), so a copy
            # queued after that would wait for it too (4 H200s, 32768^3 float16: each copy
            # waited for the previous run, 4-8 ms of GPU idle a worker)
            fetched = {s: _fetch_sources(s, a[1], asked) for k, s, _, a in mine if k == "remote"}
        if blocks is not None:
            try:
                if kind == "export":
                    from . import _dask_ipc

                    value = _dask_ipc.export(*blocks, readers=args)
                elif kind == "run":
                    value = _run(*args, blocks)
                else:
                    value = _run_fetched(args[0], blocks, fetched.pop(slot))
            except Exception as e:      # its task computes it, and says what goes wrong there
                log.debug("started %s %s failed: %s: %s", kind, slot, type(e).__name__, e)
                value = None
        if kind == "export":
            _publish(ticket, slot, value)
        with _ENGINE:
            if _STARTED.get(key) is _PENDING and value is not None and ticket in _TICKETS:
                _STARTED[key] = value
                _ENGINE_COUNTS["started"] += 1
                started += 1
            else:
                if _STARTED.get(key) is _PENDING:
                    del _STARTED[key]
                _ENGINE_COUNTS["failed" if blocks is not None and value is None else
                               "skipped" if value is None else "dropped"] += 1
            _ENGINE.notify_all()
    return started


def _fetch_sources(slot, sources, asked):
    """A ``"remote"`` job's fetches (:func:`_start_work`): ``(groups, events)``, each source's
    blocks with their copies queued and the copies' events, or None when an export did not come
    or a fetch failed (its task fetches)."""
    from . import _dask_ipc

    groups, waits = [], []
    try:
        for n, (_address, _engine, _export_slot, reader, indices) in enumerate(sources):
            future = asked.get((slot, n))
            made = None if future is None else future.result(timeout=EXPORT_WAIT_S + 5)
            if made is None:
                return None
            groups.append(_dask_ipc.fetch(made, reader, indices, waits))
    except Exception as e:              # its task fetches, and says what goes wrong there
        log.debug("started fetch %s failed: %s: %s", slot, type(e).__name__, e)
        return None
    return groups, waits


def _run_fetched(run_args, blocks, fetched):
    """A ``"remote"`` job's run (:func:`_start_work`): over this worker's ``blocks`` and the
    fetched groups, queued after the current stream waits for their copies; None without them."""
    if fetched is None:
        return None
    groups, waits = fetched
    if waits:
        import cupy

        stream = cupy.cuda.get_current_stream()
        for event in waits:
            stream.wait_event(event)
    return _run(*run_args, blocks, *groups)


class _Engine:
    """A worker's engine (:data:`START`): a Dask actor that starts the work the client hands it
    (:meth:`start`) on its worker, from the blocks in that worker's memory, in the actor's
    thread; the work is kept in the worker process for the tasks that take it. Runs that read
    other workers' blocks ask those workers' engines for their exports (:meth:`exported`, a
    coroutine: it runs on the worker's event loop, so an engine busy starting its own work
    still answers) straight from worker to worker, without the scheduler."""

    def __init__(self):
        from distributed import get_worker

        self._worker = get_worker()

    def start(self, ticket, jobs) -> int:
        return _start_work(ticket, jobs, self._worker.data, self._ask)

    async def exported(self, ticket, slot):
        return await _exported(ticket, slot)

    def _ask(self, address, engine, ticket, slot):
        """A future (concurrent.futures) of the export ``slot`` of ``ticket`` that the engine
        ``engine`` on the worker at ``address`` publishes (None if it does not come)."""
        import asyncio

        from distributed.protocol import to_serialize

        worker = self._worker

        async def call():
            got = await worker.rpc(address).actor_execute(actor=engine, function="exported",
                                                          args=[to_serialize(ticket), to_serialize(slot)], kwargs={})
            return got.get("result") if got.get("status") == "OK" else None

        return asyncio.run_coroutine_threadsafe(call(), worker.loop.asyncio_loop)

    def stats(self) -> dict:
        return engine_stats()


# ---------------------------------------------------------------------------------------------
# Graph
# ---------------------------------------------------------------------------------------------

def _result_dtype(x_dtype, y_dtype, dtype, compute):
    """pyblasgemm.matmul's own result type (and its checks of dtype= and compute=), from a
    1 x 1 product on the host: raised here, before any graph is built. One addition:
    ``dtype=bfloat16`` for bfloat16 operands (NumPy's type is float32 and NumPy has no
    bfloat16-out loop; ``bgemm``'s type): the float32 sum is rounded once to bfloat16.

    >>> import ml_dtypes
    >>> bf16 = np.dtype(ml_dtypes.bfloat16)
    >>> _result_dtype(bf16, bf16, None, None).name, _result_dtype(bf16, bf16, bf16, None).name
    ('float32', 'bfloat16')
    """
    import pyblasgemm

    wanted = None if dtype is None else np.dtype(dtype)
    if wanted is not None and wanted.name == "bfloat16" and np.dtype(x_dtype) == wanted == np.dtype(y_dtype):
        pyblasgemm.matmul(np.ones((1, 1), x_dtype), np.ones((1, 1), y_dtype), compute=compute)   # compute= checked
        return wanted
    one = pyblasgemm.matmul(np.ones((1, 1), x_dtype), np.ones((1, 1), y_dtype), dtype=dtype, compute=compute)
    return one.dtype


def _as_loop_operands(x, y, dtype):
    """x and y cast to the type NumPy's matmul multiplies them in, where that cast is not exact:
    ``dtype=float16`` on float32 operands makes NumPy round the operands to float16 first, and
    our sums, wider than the result, would otherwise see the unrounded values. Exact casts
    (float16 into float32 sums, int8 into int32) are left to the block products: no copies.

    >>> import dask.array as da
    >>> x = da.ones((2, 2), chunks=1, dtype=np.float32)
    >>> [t.dtype.name for t in _as_loop_operands(x, x.astype(np.int8), np.float16)]
    ['float16', 'int8']
    """
    try:
        loop = np.matmul.resolve_dtypes((x.dtype, y.dtype, None), signature=(None, None, dtype))
    except (TypeError, ValueError):
        return x, y                 # no NumPy loop (dtype=bfloat16): the operands as they are
    return tuple(v if np.can_cast(v.dtype, t, "safe") else v.astype(t) for v, t in zip((x, y), loop))


def _scalars(x_dtype, y_dtype, out_dtype, alpha, beta):
    """alpha and beta checked as :func:`pyblasgemm.gemm` checks them for the row of these types
    (float32 scalars for 16- and 32-bit floats, int32 for int8, ...; 0-d arrays read); for
    results without a row, integers in the accumulation type's range (0 or 1 for bool)."""
    from numbers import Integral

    from ._types import ROW_BY_DTYPE, ROW_BY_DTYPES
    from .desc import BlasArgumentError, _scalar_value, check_scalar

    routine = "pyblasgemm.dask.gemm"
    row = ROW_BY_DTYPES.get((x_dtype, out_dtype)) if x_dtype == y_dtype else None
    row = row or ROW_BY_DTYPE.get(out_dtype)
    checked = []
    for position, name, value in ((6, "alpha", alpha), (7, "beta", beta)):
        if row is not None:
            checked.append(check_scalar(routine, position, name, value, row))
            continue
        value = _scalar_value(value)
        acc = accumulation_dtype(out_dtype)
        if not isinstance(value, Integral) or (isinstance(value, bool) and acc.kind != "b"):
            raise TypeError(f"{routine}: parameter {position} ({name}={value!r}) must be an integer for "
                            f"{out_dtype.name} results, not {type(value).__name__}")
        lo, hi = (0, 1) if acc.kind == "b" else (int(np.iinfo(acc).min), int(np.iinfo(acc).max))
        if not lo <= int(value) <= hi:
            bound = "0 or 1 (bool results)" if acc.kind == "b" else f"in the {acc.name} range [{lo}, {hi}]"
            raise BlasArgumentError(routine, position, name, value, f"must be {bound}")
        checked.append(int(value))
    return checked


def _refine(a: tuple, b: tuple) -> tuple:
    """The common refinement of two chunkings of one axis (every boundary of both)."""
    edges = sorted(set(itertools.accumulate(a)) | set(itertools.accumulate(b)))
    return tuple(e - s for s, e in zip([0] + edges[:-1], edges))


def _align(x, y):
    """Broadcast the batch dimensions and align the batch and K chunks (rechunking only where
    they differ, and saying so)."""
    da = _dask_array()
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    if x.shape[:-2] != batch:
        x = da.broadcast_to(x, batch + x.shape[-2:])
    if y.shape[:-2] != batch:
        y = da.broadcast_to(y, batch + y.shape[-2:])
    nb = len(batch)
    xc, yc = list(x.chunks), list(y.chunks)
    for d in range(nb):
        if xc[d] != yc[d]:
            xc[d] = yc[d] = _refine(xc[d], yc[d])
    if xc[-1] != yc[-2]:
        common = _refine(xc[-1], yc[-2])
        log.debug("rechunking K: x has %s, y has %s; both take %s", xc[-1], yc[-2], common)
        xc[-1] = yc[-2] = common
    if tuple(xc) != x.chunks:
        log.debug("rechunking x from %s to %s", x.chunks, tuple(xc))
        x = x.rechunk(tuple(xc))
    if tuple(yc) != y.chunks:
        log.debug("rechunking y from %s to %s", y.chunks, tuple(yc))
        y = y.rechunk(tuple(yc))
    return x, y


def _contract(x, y, out_dtype, compute, backend, k_group, alpha=1, beta=0, c=None, transport="auto"):
    """The graph of ``alpha * x @ y + beta * c`` over aligned chunks, as a plain task dict: the
    operands' graphs merged as dicts, then our tasks (:mod:`dask.task_spec` tasks, not the
    deprecated tuples) for each output block: one task per group of K chunks, a fixed pairwise
    tree of adds, a root that finishes. On a distributed cluster holding the operands' blocks,
    each task is placed too (:func:`_placement`), and blocks that cross workers go through CUDA
    IPC where ``transport`` says so (:func:`_ipc_rewrite`); the sums, and so the bits, are the
    same.

    Not ``HighLevelGraph.from_collections`` (discouraged by Dask for new code) and not
    ``da.blockwise``: the tree over K groups is no blockwise pattern, and a dict states every
    task and every sum's order itself. What Dask's array optimization does to it (cull, fuse
    linear chains) keeps those tasks: every add has two inputs, and every partial task is a
    task of its own, for any worker."""
    da = _dask_array()
    from dask.base import tokenize
    from dask.task_spec import List, Task, TaskRef
    from dask.utils import ensure_dict

    acc = accumulation_dtype(out_dtype)
    nb = x.ndim - 2
    nk = len(x.chunks[-1])
    batch_blocks = list(itertools.product(*[range(len(ch)) for ch in x.chunks[:nb]]))
    out_blocks = len(batch_blocks) * len(x.chunks[-2]) * len(y.chunks[-1])
    group = k_group_for(nk, out_blocks, k_group)
    token = tokenize(x, y, out_dtype, compute, backend, group, alpha, beta, c)
    name = "pyblasgemm-matmul-" + token
    part, tree = "pyblasgemm-partial-" + token, "pyblasgemm-sum-" + token
    starts = list(range(0, nk, group))
    with_c = c is not None and beta != 0
    deps = [x, y] + ([c] if with_c else [])
    dsk = {}
    for operand in deps:
        dsk.update(ensure_dict(operand.__dask_graph__()))
    types = (x.dtype, y.dtype)
    c_type = c.dtype if with_c else None
    rows, cols, depth = x.chunks[-2], y.chunks[-1], x.chunks[-1]
    # for the placement: each chain of K chunks (a task of products) with its input blocks and
    # their bytes, and each add with its left input, which it joins
    products, joins = [], []
    runs_of = {}                        # output block -> (x's blocks, y's blocks, c's block): for _bundle_runs

    def inputs(bidx, i, j, ks):
        return ([((x.name, *bidx, i, k), rows[i] * depth[k] * x.dtype.itemsize, "x") for k in ks]
                + [((y.name, *bidx, k, j), depth[k] * cols[j] * y.dtype.itemsize, "y") for k in ks])

    def blocks(bidx, i, j, ks):
        return (List(*[TaskRef((x.name, *bidx, i, k)) for k in ks]),
                List(*[TaskRef((y.name, *bidx, k, j)) for k in ks]))

    for bidx in batch_blocks:
        for i in range(len(rows)):
            for j in range(len(cols)):
                c_ref = TaskRef((c.name, i, j)) if with_c else None
                c_in = [((c.name, i, j), rows[i] * cols[j] * c.dtype.itemsize, "c")] if with_c else []
                where = (*bidx, i, j)
                root = (name, *where)
                if len(starts) == 1:
                    runs_of[root] = ([(x.name, *bidx, i, k) for k in range(nk)],
                                     [(y.name, *bidx, k, j) for k in range(nk)], (c.name, i, j) if with_c else None)
                    dsk[root] = Task(root, _product_finish, *blocks(bidx, i, j, range(nk)), types, acc, compute,
                                     backend, out_dtype, alpha, beta, c_ref, c_type)
                    products.append((root, rows[i] * cols[j] * sum(depth), inputs(bidx, i, j, range(nk)) + c_in))
                    continue
                keys = []
                for g, s in enumerate(starts):
                    key = (part, *where, g)
                    ks = range(s, min(s + group, nk))
                    dsk[key] = Task(key, _product, *blocks(bidx, i, j, ks), types, acc, compute, backend)
                    products.append((key, rows[i] * cols[j] * sum(depth[k] for k in ks), inputs(bidx, i, j, ks)))
                    keys.append(key)
                level = 0
                while len(keys) > 2:            # a fixed pairwise tree: (0+1), (2+3), ...
                    nxt = []
                    for t in range(0, len(keys) - 1, 2):
                        key = (tree, level, *where, t // 2)
                        dsk[key] = Task(key, _add, TaskRef(keys[t]), TaskRef(keys[t + 1]))
                        joins.append((key, keys[t]))
                        nxt.append(key)
                    if len(keys) % 2:
                        nxt.append(keys[-1])
                    keys, level = nxt, level + 1
                dsk[root] = Task(root, _sum_finish, TaskRef(keys[0]), TaskRef(keys[1]), out_dtype, alpha, beta,
                                 c_ref, c_type)
                joins.append((root, keys[0]))
    chunks = x.chunks[:nb] + (rows, cols)
    meta = da.utils.meta_from_array(x._meta, len(chunks), dtype=out_dtype)
    held = _cluster_holders(deps, dsk)
    if held is None:
        return da.Array(dsk, name, chunks, meta=meta)
    workers, holders, hosts = held
    where, priority = _placement(products, joins, workers, holders)
    if not where:
        return da.Array(dsk, name, chunks, meta=meta)
    if RUNS and runs_of:
        _bundle_runs(dsk, runs_of, where, priority, holders, token,
                     (types, acc, compute, backend, out_dtype, alpha, beta, c_type))
    if transport == "ipc" or (transport == "auto" and _is_cupy(x._meta) and _is_cupy(y._meta)):
        _ipc_rewrite(dsk, where, priority, holders, hosts, token)
    engines = _engines(sorted(set(where.values()))) if START else {}
    if engines:
        # the product's name as the ticket of the work its engines can start: a graph that
        # reaches the scheduler as built (client.persist(z)) has it to take (_start_persisted)
        _ticket(dsk, name, _engine_jobs(dsk, _ByKey({k: [w] for k, w in where.items()}), engines)[1])
    return _placed_array(dsk, name, chunks, meta, where, priority)


# ---------------------------------------------------------------------------------------------
# Placement on a distributed cluster
# ---------------------------------------------------------------------------------------------

#: how far past its fair share of the work (total / workers) a worker may be given a task
#: whose data it holds, in tasks: half a task keeps even shares exact (16 output blocks on 4
#: workers: 4 each) and leaves uneven ones one task apart at most
SHARE_SLACK = 0.5

#: how many tasks deep a block that is not itself in cluster memory (a transpose, a
#: rechunked piece, a broadcast of a persisted block) is traced back to the blocks it is made of
_TRACE_DEPTH = 4


def _bundle_runs(dsk, runs_of, where, priority, holders, token, args):
    """Bundle placed output blocks (each one task over all of K) into run tasks (:data:`RUNS`),
    in place: the blocks of one worker whose inputs come from the same set of other workers
    become one task of :func:`_run`, in the graph's order, and each block's key a
    :func:`_pick` of it on the same worker; a run of one block is that block's own task (no
    pick: each level of tasks costs a scheduler round trip, and on 4 H200s every run at
    32768^3 float16 in 8192^2 chunks is one block, whose picks reached their workers up to
    30 ms after the persist). The run's blocks are passed as one list per worker
    they come from (its own first), each sorted as :func:`_ipc_rewrite` sorts a task's
    dependencies, so that a fetch of another worker's blocks folds into the run that alone
    reads them there. Priority: 0 for a run of local blocks, -1 for one that waits for others'.

    >>> from dask.task_spec import Task, TaskRef
    >>> runs_of = {("c", i, j): ([("x", i, 0)], [("y", 0, j)], None) for i in range(2) for j in range(2)}
    >>> dsk = {k: Task(k, abs, 0) for k in runs_of}
    >>> where = {("c", i, j): f"w{i}" for i in range(2) for j in range(2)}
    >>> on = {("x", 0, 0): "w0", ("x", 1, 0): "w1", ("y", 0, 0): "w0", ("y", 0, 1): "w1"}
    >>> priority = dict.fromkeys(where, 0)
    >>> _bundle_runs(dsk, runs_of, where, priority, lambda k: {on[k]}, "t", (None,) * 8)
    >>> sorted((k, where[k], priority[k]) for k in dsk)        # one block a run: the blocks' own tasks
    [(('c', 0, 0), 'w0', 0), (('c', 0, 1), 'w0', -1), (('c', 1, 0), 'w1', -1), (('c', 1, 1), 'w1', 0)]
    >>> dsk["c", 0, 1].func.__name__, dsk["c", 0, 1].args[1], dsk["c", 0, 1].kwargs
    ('_run_task', 1, {'single': True})
    >>> where = dict.fromkeys(where, "w0")      # all on w0: c[0, 0] alone, the three that read w1's blocks a run
    >>> _bundle_runs(dsk, runs_of, where, dict.fromkeys(where, 0), lambda k: {on[k]}, "t", (None,) * 8)
    >>> sorted(k[1] for k in dsk if k[0] == "pyblasgemm-run-t"), dsk["c", 0, 1].args[0].key, dsk["c", 0, 1].args[1]
    ([1], ('pyblasgemm-run-t', 1), 0)
    """
    from dask.task_spec import List, Task, TaskRef

    types, acc, compute, backend, out_dtype, alpha, beta, c_type = args
    run_name = "pyblasgemm-run-" + token
    bundles = {}                        # (worker, its sources) -> [output blocks]
    for root, (xs, ys, c) in runs_of.items():
        w = where.get(root)
        if w is None:
            continue                    # left to Dask: its own task
        sources = set()
        for block in xs + ys + ([c] if c is not None else []):
            has = holders(block)
            if has and w not in has:
                sources.add(sorted(has)[0])
        bundles.setdefault((w, tuple(sorted(sources))), []).append(root)
    for n, ((w, sources), roots) in enumerate(bundles.items()):
        key = roots[0] if len(roots) == 1 else (run_name, n)
        groups = {}                     # source (None: this worker or Dask) -> [blocks]
        for root in roots:
            xs, ys, c = runs_of[root]
            for block in xs + ys + ([c] if c is not None else []):
                has = holders(block)
                src = sorted(has)[0] if has and w not in has else None
                if block not in groups.setdefault(src, []):
                    groups[src].append(block)
        order = [None] + list(sources)
        lists = [sorted(groups.get(src, []), key=_block_order) for src in order]
        at = {b: (g, lists[g].index(b)) for g in range(len(lists)) for b in lists[g]}
        plan = tuple(([at[b] for b in runs_of[r][0]], [at[b] for b in runs_of[r][1]],
                      None if runs_of[r][2] is None else at[runs_of[r][2]]) for r in roots)
        dsk[key] = Task(key, _run_task, None, n, plan, types, acc, compute, backend, out_dtype, alpha, beta, c_type,
                        *[List(*[TaskRef(b) for b in blocks]) for blocks in lists], single=len(roots) == 1)
        where[key], priority[key] = w, (0 if not sources else -1)
        if len(roots) == 1:
            continue
        for index, root in enumerate(roots):
            dsk[root] = Task(root, _pick, TaskRef(key), index)
            priority[root] = 0


def _cluster_holders(operands, dsk):
    """``(workers, holders, hosts)`` when the default ``distributed`` client's cluster holds
    blocks of the operands: the workers' addresses, sorted, a function from a block's key to the
    workers that hold it (or the blocks it is computed from), and each worker's host; None
    otherwise (no client, an asynchronous one, operands not persisted: Dask places the tasks
    itself). One scheduler round trip (``Client.who_has``)."""
    distributed = sys.modules.get("distributed")
    if distributed is None:             # no client can exist without the package imported
        return None
    import dask
    from dask.core import get_dependencies

    try:
        client = distributed.default_client()
    except ValueError:
        return None
    if client.asynchronous or client.status != "running" or "workers" in dask.get_annotations():
        return None                     # a placement of the caller's own is kept
    futures = distributed.futures_of(operands)
    if not futures:
        return None
    held = {k: frozenset(v) for k, v in client.who_has(futures).items()}
    workers = sorted(client.nthreads())
    memo = {}

    def holders(key, depth=_TRACE_DEPTH):
        if key in held:
            return held[key]
        if key in memo:
            return memo[key]
        found = frozenset()
        if depth and key in dsk:
            for dep in get_dependencies(dsk, key) - {key}:
                found |= holders(dep, depth - 1)
        memo[key] = found
        return found

    return workers, holders, _hosts(client, workers)


def _hosts(client, workers) -> dict:
    """Each worker's host, as the scheduler knows it (the address's host part otherwise)."""
    try:
        info = client.scheduler_info(n_workers=-1)["workers"]
    except Exception:                   # pragma: no cover - an older client
        info = {}
    return {w: (info.get(w) or {}).get("host") or w.split("://")[-1].rsplit(":", 1)[0] for w in workers}


def _is_cupy(a) -> bool:
    return type(a).__module__.split(".")[0] == "cupy"


def _block_order(key):
    """A sort key for the blocks of a group: the same order in every graph."""
    return (key[0], key[1:]) if isinstance(key, tuple) else (key, ())


def _references(task, key) -> int:
    """How many times ``task``'s arguments refer to ``key``, at any depth.

    >>> from dask.task_spec import List, Task, TaskRef
    >>> _references(Task("t", max, TaskRef("a"), List(TaskRef("a"), TaskRef("b"))), "a")
    2
    """
    from dask.task_spec import Task, TaskRef

    n, work = 0, list(task.args) + list(task.kwargs.values())
    while work:
        node = work.pop()
        if isinstance(node, TaskRef):
            n += node.key == key
        elif isinstance(node, Task):
            work.extend(node.args)
            work.extend(node.kwargs.values())
        elif isinstance(node, (list, tuple)):
            work.extend(node)
    return n


def _ipc_rewrite(dsk, where, priority, holders, hosts, token):
    """Blocks that cross workers go through CUDA IPC (:mod:`pyblasgemm._dask_ipc`), in place,
    with as few tasks as the sharing allows (each costs Dask ~0.5 ms between ``persist`` and
    the first task: bench/dask_overhead.py). For each placed task, in the graph's order, the
    inputs that its worker neither holds nor computes are taken from the worker that has them
    (the first address of those holding one), on the same host (another host: Dask's transfer):

    * export tasks, on that worker: one for every block in cluster memory that any other worker
      reads from it (they are all ready at once), and one for each group of computed inputs
      (partial sums) a task reads from it (they are ready at different times; one export of
      them all could wait for a sum that waits for another worker's export: a cycle);
    * a fetch of an export for each worker that reads it (of the blocks that worker reads,
      ``indices`` into the export's, where it reads fewer than all): a block is fetched once
      per worker. Where one task alone on that worker reads them, the fetch is folded into it:
      an inline task in place of the argument that lists exactly those blocks (a product's
      K chunks of one operand), or of a single block's reference; else a fetch task of its
      own, which every task there reads them from (an inline ``pick``);
    * no task depends on a block's key from another worker (Dask would move the block):
      exports depend on the blocks, fetches on the export's key.

    Exports run first on their worker (priority 2, fetch tasks 1): a worker's first tasks are
    the exports the others wait for. Each export is told how many fetches read it (``readers``:
    one CUDA IPC *done* event each) and each fetch its ``slot`` among them (the event it
    records once its copies are queued); a folded fetch has its own slot as a fetch task does.

    >>> from dask.task_spec import List, Task, TaskRef
    >>> def product(xs, ys):
    ...     return xs, ys
    >>> dsk = {("c", j): Task(("c", j), product, List(TaskRef(("x", 0))), List(TaskRef(("y", j)))) for j in (0, 1)}
    >>> where, priority = {("c", 0): "w0", ("c", 1): "w0"}, {("c", 0): 0, ("c", 1): -1}
    >>> on = {("x", 0): {"w0"}, ("y", 0): {"w0"}, ("y", 1): {"w1"}}
    >>> _ipc_rewrite(dsk, where, priority, lambda k: on.get(k, set()), {"w0": "h", "w1": "h"}, "t")
    >>> sorted((k[0], where[k], priority[k]) for k in dsk)      # c[0, 1] alone reads y[1]: no fetch task
    [('c', 'w0', -1), ('c', 'w0', 0), ('pyblasgemm-ipc-export-t', 'w1', 2)]
    >>> sorted(k[0] for k in dsk["c", 1].dependencies)
    ['pyblasgemm-ipc-export-t', 'x']
    >>> export = dsk[[k for k in dsk if k[0] == "pyblasgemm-ipc-export-t"][0]]
    >>> export.kwargs, sorted(export.dependencies)
    ({'readers': 1}, [('y', 1)])
    """
    from dask.base import tokenize
    from dask.task_spec import List, Task, TaskRef

    from . import _dask_ipc

    export_name, fetch_name = "pyblasgemm-ipc-export-" + token, "pyblasgemm-ipc-fetch-" + token
    exports = {}                        # export id -> (producer, [its blocks])
    units = {}                          # (reader, export id) -> {"blocks": [...], "tasks": [...]}
    unit_of = {}                        # (reader, block) -> its unit
    placed = [k for k in dsk if k in where]
    for key in placed:
        w = where[key]
        computed = {}                   # producer -> [computed inputs of this task not yet fetched here]
        for dep in sorted(dsk[key].dependencies, key=_block_order):
            unit = unit_of.get((w, dep))
            if unit is None:
                has = {where[dep]} if dep in where else set(holders(dep))
                if not has or w in has:
                    continue            # Dask's (not in memory) or already here
                producer = sorted(has)[0]
                if hosts.get(producer) != hosts.get(w):
                    continue            # another host: Dask's transfer
                if dep in where:
                    computed.setdefault(producer, []).append(dep)
                    continue
                eid = ("memory", producer)
                blocks = exports.setdefault(eid, (producer, []))[1]
                if dep not in blocks:
                    blocks.append(dep)
                unit = unit_of[w, dep] = (w, eid)
                units.setdefault(unit, {"blocks": [], "tasks": []})["blocks"].append(dep)
            tasks = units[unit]["tasks"]
            if key not in tasks:
                tasks.append(key)
        for producer, deps in computed.items():
            eid = ("computed", producer, tuple(deps))
            exports.setdefault(eid, (producer, list(deps)))
            units[w, eid] = {"blocks": list(deps), "tasks": [key]}
            for dep in deps:
                unit_of[w, dep] = (w, eid)
    # keys named by what they hold: a graph built on the same operands after blocks moved must
    # not meet another group's export or fetch under the same key
    ekeys = {eid: (export_name, tokenize(producer, blocks)) for eid, (producer, blocks) in exports.items()}
    readers = dict.fromkeys(exports, 0)
    subs_of = {}                        # task -> {block: what replaces its reference}
    for (w, eid), unit in units.items():
        ekey, blocks = ekeys[eid], exports[eid][1]
        slot = readers[eid]
        readers[eid] += 1
        indices = None if unit["blocks"] == blocks else tuple(blocks.index(b) for b in unit["blocks"])
        args = (TaskRef(ekey), slot) + (() if indices is None else (indices,))
        if len(unit["tasks"]) == 1:
            (key,) = unit["tasks"]
            task = dsk[key]
            lists = [n for n, a in enumerate(task.args) if isinstance(a, List)
                     and [getattr(r, "key", None) for r in a.args] == unit["blocks"]]
            if lists:                   # the argument listing these blocks: the fetch's tuple of them
                n = lists[0]
                # a run task fetches only if its engine has not (START): _fetch_later
                fetch = _fetch_later if task.func is _run_task else _dask_ipc.fetch
                folded = Task(key, task.func, *task.args[:n], Task(None, fetch, *args),
                              *task.args[n + 1:], **task.kwargs)
                if not folded.dependencies & set(unit["blocks"]):      # read nowhere else in the task
                    dsk[key] = folded
                    continue
            if len(unit["blocks"]) == 1 and _references(task, unit["blocks"][0]) == 1:
                subs_of.setdefault(key, {})[unit["blocks"][0]] = Task(
                    None, _dask_ipc.pick, Task(None, _dask_ipc.fetch, *args), 0)
                continue                # (read twice, the inline fetch would run twice: a fetch task)
        fkey = (fetch_name, tokenize(w, ekey, indices))
        dsk[fkey] = Task(fkey, _dask_ipc.fetch, *args)
        where[fkey], priority[fkey] = w, 1
        for key in unit["tasks"]:
            subs = subs_of.setdefault(key, {})
            for index, dep in enumerate(unit["blocks"]):
                if dep in dsk[key].dependencies:
                    subs[dep] = Task(None, _dask_ipc.pick, TaskRef(fkey), index)
    for key, subs in subs_of.items():
        dsk[key] = dsk[key].substitute(subs)
    for eid, (producer, blocks) in exports.items():
        ekey = ekeys[eid]
        if eid[0] == "memory":          # ready at once: the engine can make it (START)
            dsk[ekey] = Task(ekey, _export_task, None, ekey[1], *[TaskRef(d) for d in blocks], readers=readers[eid])
        else:
            dsk[ekey] = Task(ekey, _dask_ipc.export, *[TaskRef(d) for d in blocks], readers=readers[eid])
        where[ekey], priority[ekey] = producer, 2


def transport_of(z) -> str:
    """How the blocks of ``z``'s graph cross workers: ``"ipc"`` if its graph has CUDA IPC
    exports (a product placed on a cluster holding its operands, with ``transport`` ``"ipc"``,
    or ``"auto"`` and CuPy chunks), else ``"dask"``. What ran is per worker process:
    :func:`ipc_stats`.

    >>> import dask.array as da
    >>> x = da.ones((4, 4), chunks=2)
    >>> transport_of(matmul(x, x, transport="ipc"))     # no cluster holds x: nothing to place
    'dask'
    """
    for key in dict(z.__dask_graph__()):
        name = key[0] if isinstance(key, tuple) else key
        if isinstance(name, str) and name.startswith("pyblasgemm-ipc-export-"):
            return "ipc"
    return "dask"


def ipc_stats(reset: bool = False) -> dict:
    """This process's CUDA IPC counts (blocks fetched through IPC and their bytes, blocks that
    fell back to Dask's transfer and why, handles opened, closed and open now); on a cluster,
    ``client.run(pyblasgemm.dask.ipc_stats)`` gives each worker's.

    >>> ipc_stats()["ipc_blocks"]
    0
    """
    from . import _dask_ipc

    return _dask_ipc.stats(reset)


def close_ipc_handles() -> int:
    """Close the CUDA IPC handles this process opened for fetched blocks (each maps a
    producer's allocation; at most :data:`pyblasgemm._dask_ipc.OPEN_MAX` are kept open); the
    number closed. On a cluster: ``client.run(pyblasgemm.dask.close_ipc_handles)``.

    >>> close_ipc_handles()
    0
    """
    from . import _dask_ipc

    return _dask_ipc.close_handles()


def _placement(products, joins, workers, holders):
    """(worker of each task, priority of each chain of products): a function of the chunks and
    of where their blocks are, never of timing, so that every run of a product on the same
    data is laid out alike.

    * each chain of K chunks goes to the worker holding the most bytes of its inputs (ties: the
      most of x's, then the first address): ``C[i, j]`` where A's row panel ``i`` is, a long K's
      partial products where their K chunks are; unless that worker already has its fair share
      of the work (flops; :data:`SHARE_SLACK`), then to the next holder, else to the least
      loaded worker; a chain none of whose blocks is in memory is left to Dask;
    * each add goes where its left input is (one transfer of a partial sum per add);
    * priority 0 for chains whose inputs all sit on their worker, -1 for those that wait for a
      transfer: a worker computes what it holds while the rest arrives.

    Each worker fetches a block it lacks once, however many of its tasks read it (Dask's
    worker keeps it while they wait).

    >>> blk = lambda *k: (k, 8, k[0])
    >>> products = [(("c", i, j), 1, [blk("x", i), blk("y", j)]) for i in range(2) for j in range(2)]
    >>> on = {("x", 0): {"w0"}, ("x", 1): {"w1"}, ("y", 0): {"w0"}, ("y", 1): {"w1"}}
    >>> where, priority = _placement(products, [], ["w0", "w1"], lambda k: on.get(k, set()))
    >>> [where["c", i, j] for i in range(2) for j in range(2)], [priority["c", 0, j] for j in range(2)]
    (['w0', 'w0', 'w1', 'w1'], [0, -1])
    """
    index = {w: n for n, w in enumerate(workers)}
    share = sum(weight for _, weight, _ in products) / len(workers)
    load = dict.fromkeys(workers, 0)
    where, priority = {}, {}
    for key, weight, inputs in products:
        held = {}                       # worker -> [bytes held, bytes of x held]
        for block, nbytes, side in inputs:
            for w in holders(block):
                if w in load:
                    h = held.setdefault(w, [0, 0])
                    h[0] += nbytes
                    h[1] += nbytes if side == "x" else 0
        if not held:
            continue
        ranked = sorted(held, key=lambda w: (-held[w][0], -held[w][1], index[w]))
        fits = [w for w in ranked if load[w] + weight <= share + SHARE_SLACK * weight]
        chosen = fits[0] if fits else min(workers, key=lambda w: (load[w], -held.get(w, (0,))[0], index[w]))
        load[chosen] += weight
        where[key] = chosen
        priority[key] = 0 if all(chosen in holders(block) for block, _, _ in inputs) else -1
    for key, left in joins:
        if left in where:
            where[key] = where[left]
    return where, priority


class _ByKey:
    """An annotation of some tasks: the value for a key, None (no annotation) for the others.
    A class, not a closure: annotations travel to the scheduler pickled."""

    def __init__(self, values: dict):
        self.values = values

    def __call__(self, key):
        return self.values.get(key)


def _optimize_unfused(dsk, keys, **kwargs):
    """Dask's array optimization (cull, blockwise fusion) without the low-level fusion of linear
    chains, which turns the graph into a plain dict and drops every layer's annotations (Dask
    issue 7036), our placement with them. The operands of a placed product are in memory:
    there is nothing of theirs to fuse."""
    import dask

    da = _dask_array()
    with dask.config.set({"optimization.fuse.active": False}):
        return da.optimization.optimize(dsk, keys, **kwargs)


def _cull(dsk, keys) -> dict:
    """The tasks of ``dsk`` that ``keys`` need, in ``dsk``'s order: a walk over each task's
    dependencies (:mod:`dask.task_spec` nodes state theirs; anything else, a Future of a
    persisted operand or a legacy tuple, through :func:`dask.core.get_dependencies`).

    >>> from dask.task_spec import Task, TaskRef
    >>> dsk = {"a": 1, "b": Task("b", abs, TaskRef("a")), "c": Task("c", abs, TaskRef("a")), "d": (abs, "c")}
    >>> list(_cull(dsk, ["b"])), list(_cull(dsk, [["d"]]))
    (['a', 'b'], ['a', 'c', 'd'])
    """
    from dask.core import flatten, get_dependencies
    from dask.task_spec import GraphNode

    needed, work = set(), list(flatten(keys))
    while work:
        key = work.pop()
        if key in needed or key not in dsk:
            continue
        needed.add(key)
        task = dsk[key]
        work.extend(task.dependencies if isinstance(task, GraphNode) else get_dependencies(dsk, task=task))
    return {k: v for k, v in dsk.items() if k in needed}


def _optimize_placed(dsk, keys, **kwargs):
    """A placed product's optimization: none, when its graph holds nothing that ``keys`` do
    not need (the usual case: persisted operands, whose graphs are their blocks' futures), else
    :func:`_optimize_unfused`. Its graph is one layer, a plain dict (the operands' graphs merged
    as dicts, then our tasks: :func:`_contract`), so Dask's array optimization would find no
    blockwise layers to fuse, and low-level fusion is off; what it did was a cull through the
    high-level graph's generic walk, ~2 ms on the scheduler of a 2-core host for the 56 keys of
    a 4 x 4 x 4 block product on 2 workers (bench/dask_overhead.py), where this check
    (:func:`_cull`) takes ~0.1 ms. The graph, and so the layer's annotations (the placement),
    are handed back as they came."""
    layers = getattr(dsk, "layers", None)
    if layers is not None and len(layers) == 1:
        (layer,) = layers.values()
        mapping = getattr(layer, "mapping", None)
        if isinstance(mapping, dict) and len(_cull(mapping, keys)) == len(mapping):
            return dsk
    return _optimize_unfused(dsk, keys, **kwargs)


#: (client id, worker address) -> (the actor's future, the actor, whether the client reaches the
#: worker directly): each worker's engine (START)
_ENGINES: dict = {}
#: the engine calls in flight (asyncio tasks on the client's loop keep a reference to them here)
_SENDING: set = set()


async def _call_engine(client, address, key, function, *args):
    """``function(*args)`` of the engine ``key`` on the worker at ``address``, sent by the client
    straight to that worker (Dask's actor call, ``actor_execute``, on the client's connection
    pool): a client's own actor handle goes through the scheduler unless the client was made
    with ``direct_to_workers``, and the scheduler is busy with the graph just sent. Its result,
    or None if the call failed (said at DEBUG)."""
    from distributed.protocol import to_serialize

    try:
        got = await client.rpc(address).actor_execute(actor=key, function=function,
                                                      args=[to_serialize(a) for a in args], kwargs={})
    except Exception as e:              # the worker is gone or unreachable: its tasks compute everything
        log.debug("pyblasgemm.dask engine %s on %s: %s: %s", function, address, type(e).__name__, e)
        return None
    if got.get("status") != "OK":
        log.debug("pyblasgemm.dask engine %s on %s: %s", function, address, got.get("exception"))
        return None
    return got.get("result")


def _send_starts(client, calls) -> None:
    """Send the engines' ``start`` calls ``[(address, key, ticket, jobs)]`` from the client's
    loop and return once they are on their way (their replies are not awaited): each call's
    message is written when its coroutine first runs, and the caller waits for the loop once.
    Why wait: the loop's thread would otherwise get the GIL only every 5 ms (Python's switch
    interval) while this thread goes on building and pickling the persist's graph (2 H200s: the
    engines' first work 5.3 ms after persist, through the actor handles)."""
    import asyncio

    async def send():
        for address, key, ticket, jobs in calls:
            task = asyncio.ensure_future(_call_engine(client, address, key, "start", ticket, jobs))
            _SENDING.add(task)
            task.add_done_callback(_SENDING.discard)
        await asyncio.sleep(0)          # the calls run to their first wait: the writes

    client.sync(send)


def _engines(workers) -> dict:
    """The engines (:class:`_Engine`) of ``workers`` on the default client's cluster, made on
    first use (one actor a worker, kept for the client's life; each made with one call to it, so
    that the connection to its worker is open before a persist needs it); {} without a client.
    A worker whose engine cannot be made has none (its tasks compute everything)."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return {}
    try:
        client = distributed.default_client()
    except ValueError:
        return {}
    if client.asynchronous or client.status != "running":
        return {}
    missing = [w for w in workers if (client.id, w) not in _ENGINES]
    if missing:
        try:
            known = client.nthreads()
            missing = [w for w in missing if w in known]
            futures = [client.submit(_Engine, workers=[w], allow_other_workers=False, actor=True, pure=False,
                                     key=f"pyblasgemm-engine-{uuid.uuid4().hex}") for w in missing]
            for w, future in zip(missing, futures):
                actor = future.result(timeout=ENGINE_TIMEOUT_S)
                # one call opens the client's connection to the worker, or finds there is none
                direct = client.sync(_call_engine, client, w, future.key, "stats",
                                     callback_timeout=ENGINE_TIMEOUT_S) is not None
                if not direct:
                    actor.stats().result(timeout=ENGINE_TIMEOUT_S)
                _ENGINES[client.id, w] = (future, actor, direct)
        except Exception as e:          # no actors here (a restricted cluster, a lost worker): no engine
            log.debug("no pyblasgemm.dask engine on %s: %s: %s", missing, type(e).__name__, e)
    return {w: _ENGINES[client.id, w] for w in workers if (client.id, w) in _ENGINES}


def _ticket(dsk, ticket, keys) -> None:
    """Give the run and export tasks ``keys`` of ``dsk`` (a placed product's) ``ticket``, in
    place: the name under which their workers' engines keep the work they start for them
    (:func:`_take`); the other tasks keep None (nothing to look for)."""
    from dask.task_spec import Task

    for key in keys:
        task = dsk[key]
        dsk[key] = Task(key, task.func, ticket, *task.args[1:], **task.kwargs)


def _placed_layer(z):
    """(the task dict, the ``workers`` annotation, the ``priority`` annotation) of a placed
    product ``z`` as built (:func:`_placed_array`: one layer), or None."""
    if type(z) is not _placed_array_type():
        return None
    layers = z.__dask_graph__().layers
    if len(layers) != 1:
        return None
    (layer,) = layers.values()
    annotations = layer.annotations or {}
    mapping, placed = getattr(layer, "mapping", None), annotations.get("workers")
    if not isinstance(mapping, dict) or not isinstance(placed, _ByKey):
        return None
    return mapping, placed, annotations.get("priority")


def _engine_jobs(mapping, placed, engines) -> tuple:
    """(each worker's work that its engine can start, ``{worker: [job, ...]}``, exports first,
    then runs of its own blocks, then runs that read others'; the keys of those tasks): the
    export tasks of blocks in memory (``("export", slot, keys, readers)``), the run tasks that
    read only their worker's own blocks (``("run", slot, keys, run's arguments)``) and those
    whose other blocks come from exports of blocks in memory on workers with engines
    (``("remote", slot, keys, (run's arguments, sources))``, a source per export: its worker,
    that worker's engine's key, the export's slot, this reader's slot and the blocks it takes),
    of the workers in ``engines``; ({}, []) for a graph with none."""
    from dask.task_spec import List, Task, TaskRef

    jobs, keys = {}, []
    for key, task in mapping.items():
        if not isinstance(task, Task) or task.func not in (_run_task, _export_task):
            continue
        w = (placed(key) or [None])[0]
        if w not in engines:
            continue
        if task.func is _export_task:
            refs = task.args[2:]
            if not all(isinstance(r, TaskRef) for r in refs):
                continue
            job = ("export", task.args[1], [r.key for r in refs], task.kwargs["readers"])
        else:
            own, *others = task.args[11:]
            if not isinstance(own, List) or not all(isinstance(r, TaskRef) for r in own.args):
                continue
            sources = []
            for group in others:
                source = None
                if isinstance(group, Task) and group.func is _fetch_later and isinstance(group.args[0], TaskRef):
                    export = mapping.get(group.args[0].key)
                    holder = (placed(group.args[0].key) or [None])[0]
                    if getattr(export, "func", None) is _export_task and holder in engines:
                        indices = group.args[2] if len(group.args) > 2 else None
                        source = (holder, engines[holder][0].key, export.args[1], group.args[1], indices)
                if source is None:
                    break               # a block Dask moves, a fetch task: its task fetches them
                sources.append(source)
            if len(sources) != len(others):
                continue
            ref_keys = [r.key for r in own.args]
            job = (("remote", task.args[1], ref_keys, (task.args[2:11], tuple(sources))) if sources else
                   ("run", task.args[1], ref_keys, task.args[2:11]))
        jobs.setdefault(w, []).append(job)
        keys.append(key)
    for work in jobs.values():
        # exports first: an export's ready event covers the work queued before it on the
        # worker's stream, and the other workers' copies wait for it; then the worker's own
        # runs, which its copies of the others' blocks overlap (a run's 4 products of 8192^3
        # float16: ~26 ms on an H200; a 512 MiB copy over NVLink ~2 ms)
        work.sort(key=lambda job: ("export", "run", "remote").index(job[0]))
    return jobs, keys


#: the tickets whose work this process has handed to engines (newest last, at most
#: _SENT_MAX): a product persisted again, or a graph persisted by ``z.persist()`` (which
#: starts its work itself), is not started twice
_SENT: collections.OrderedDict = collections.OrderedDict()
_SENT_MAX = 1024


def _hand_out(client, engines, ticket, jobs) -> None:
    """Send each worker's ``jobs`` under ``ticket`` to its engine: straight to the worker where
    the client reaches it (:func:`_send_starts`), else through the actor's handle (the
    scheduler); a call that fails leaves the work to its tasks."""
    _SENT[ticket] = True
    while len(_SENT) > _SENT_MAX:
        _SENT.popitem(last=False)
    direct = []
    for w, work in jobs.items():
        future, actor, straight = engines[w]
        if straight:
            direct.append((w, future.key, ticket, work))
            continue
        try:
            actor.start(ticket, work)   # through the scheduler
        except Exception as e:          # a lost worker: its tasks compute everything
            log.debug("pyblasgemm.dask engine on %s: %s: %s", w, type(e).__name__, e)
    if direct:
        try:
            _send_starts(client, direct)
        except Exception as e:          # a closed loop: the tasks compute everything
            log.debug("pyblasgemm.dask engines: %s: %s", type(e).__name__, e)


def _started_graph(z, kwargs):
    """``z`` with its work started (:data:`START`), for ``z.persist(**kwargs)`` /
    ``z.compute(**kwargs)``: when these run on the default client's cluster, a fresh ticket in
    each run and export task that an engine can start (an export of blocks in memory, a run
    whose blocks are all its worker's), each worker's such work handed to its engine, and ``z``
    rebuilt on the ticketed graph (the same keys, placement and sums); else ``z`` itself.

    >>> import dask.array as da
    >>> x = da.ones((4, 4), chunks=2)
    >>> z = matmul(x, x)                 # no cluster: nothing to start
    >>> _started_graph(z, {}) is z
    True
    """
    distributed = sys.modules.get("distributed")
    if not START or distributed is None or type(z) is not _placed_array_type():
        return z
    from dask.base import get_scheduler

    try:
        client = distributed.default_client()
        scheduler = get_scheduler(scheduler=kwargs.get("scheduler"), collections=[z])
    except (ValueError, KeyError):
        return z
    if getattr(scheduler, "__self__", None) is not client:
        return z                        # the threaded scheduler, another client: the graph alone
    layer = _placed_layer(z)
    if layer is None:
        return z
    mapping, placed, ranks = layer
    engines = {w: e for (cid, w), e in _ENGINES.items() if cid == client.id}
    jobs, keys = _engine_jobs(mapping, placed, engines)
    if not jobs:
        return z
    ticket = uuid.uuid4().hex
    ticketed = dict(mapping)
    _ticket(ticketed, ticket, keys)
    _hand_out(client, engines, ticket, jobs)      # first: the calls leave before the graph is sent
    return _placed_array(ticketed, z.name, z.chunks, z._meta,
                         {k: ws[0] for k, ws in placed.values.items()}, ranks.values if isinstance(ranks, _ByKey) else {})


def _start_persisted(z, persisted) -> None:
    """Start the work of a placed product ``z`` that ``client.persist(z)`` (or
    ``dask.persist(z)`` on a client) has just queued for the scheduler (:data:`START`): called
    with the persisted blocks (``{key: Future}``) by the rebuild function of ``z``'s
    ``__dask_postpersist__``, which Dask's ``Client.persist`` calls once the graph is on its way;
    the graph's tasks carry the product's name as their ticket (:func:`_contract`), so each
    engine keeps its work under it. Nothing for blocks that are no ``distributed`` futures
    (another scheduler), a ticket this process has already handed out (``z.persist()`` started
    its own; a second persist of the same product), or a cluster without engines.

    >>> import dask.array as da
    >>> z = matmul(da.ones((4, 4), chunks=2), da.ones((4, 4), chunks=2))
    >>> _start_persisted(z, {(z.name, 0, 0): np.ones((2, 2))}) is None     # no futures: nothing
    True
    """
    distributed = sys.modules.get("distributed")
    if not START or distributed is None:
        return
    future = next(iter(persisted.values()), None)
    client = getattr(future, "client", None) if isinstance(future, distributed.Future) else None
    layer = _placed_layer(z)
    if client is None or layer is None:
        return
    mapping, placed, _ = layer
    tickets = {t.args[0] for t in mapping.values() if getattr(t, "func", None) in (_run_task, _export_task)}
    tickets.discard(None)
    if len(tickets) != 1 or next(iter(tickets)) in _SENT:
        return
    engines = {w: e for (cid, w), e in _ENGINES.items() if cid == client.id}
    jobs, _ = _engine_jobs(mapping, placed, engines)
    if jobs:
        _hand_out(client, engines, next(iter(tickets)), jobs)


def _rebuild_started(z, rebuild, dsk, *args, **kwargs):
    """``z``'s ``__dask_postpersist__`` rebuild: :func:`_start_persisted`, then Dask's own."""
    _start_persisted(z, dsk)
    return rebuild(dsk, *args, **kwargs)


def _postpersist(self):
    """``dask.array.Array.__dask_postpersist__``, its rebuild starting the persisted work first
    (:func:`_start_persisted`)."""
    rebuild, args = _dask_array().Array.__dask_postpersist__(self)
    return functools.partial(_rebuild_started, self, rebuild), args


def _persist(self, **kwargs):
    """``dask.array.Array.persist``, with the work started first (:data:`START`)."""
    return _dask_array().Array.persist(_started_graph(self, kwargs), **kwargs)


def _compute(self, **kwargs):
    """``dask.array.Array.compute``, with the work started first (:data:`START`)."""
    return _dask_array().Array.compute(_started_graph(self, kwargs), **kwargs)


@functools.lru_cache(maxsize=1)
def _placed_array_type():
    """``dask.array.Array`` optimized by :func:`_optimize_placed` (made on first use: Dask is
    an optional dependency of this module)."""
    da = _dask_array()
    return type("PlacedArray", (da.Array,), {
        "__slots__": (), "__module__": __name__,
        "__doc__": "A dask.array.Array whose tasks carry their placement (pyblasgemm.dask).",
        "__dask_optimize__": staticmethod(_optimize_placed), "persist": _persist, "compute": _compute,
        "__dask_postpersist__": _postpersist})


def _placed_array(dsk, name, chunks, meta, where, priority):
    """A Dask array of ``dsk`` whose tasks carry their placement as annotations (``workers``;
    ``allow_other_workers``, so that a task still runs if its worker leaves the cluster, and
    Dask's work stealing may move it: it leaves alone tasks whose inputs take longer to move
    than to compute; ``priority``), optimized without low-level fusion so that the annotations
    reach the scheduler; Dask's own ``Array`` in every other respect (a subclass: an array made
    from it is a plain one)."""
    import dask

    with dask.annotate(workers=_ByKey({k: [w] for k, w in where.items()}),
                       allow_other_workers=_ByKey(dict.fromkeys(where, True)), priority=_ByKey(priority)):
        return _placed_array_type()(dsk, name, chunks, meta=meta)


def matmul(x: DaskArray, y: DaskArray, *, dtype: Any = None, compute: Compute | None = None,
           backend: Backend | None = None, k_group: int | None = None, transport: DaskTransport = "auto",
           out: DaskArray | None = None) -> DaskArray:
    """``x @ y`` for Dask arrays with NumPy or CuPy chunks (any array type pyblasgemm takes), as
    a Dask array: ``numpy.matmul``'s shapes, broadcasting and result type (``dtype=`` as in
    :func:`pyblasgemm.matmul`, plus ``dtype=ml_dtypes.bfloat16`` for bfloat16 operands, whose
    NumPy type is float32), block products through pyblasgemm, wide and deterministic sums
    over K (module docstring). ``k_group``: K chunks per partial-product task (default
    :func:`k_group_for`: all of K in one task per output block from :data:`MIN_TASKS` output
    blocks up). ``transport``: how blocks cross workers on a cluster that holds the operands
    (:data:`TRANSPORTS`: ``"auto"``, CUDA IPC for CuPy chunks on one host, Dask's transfer
    otherwise; ``"ipc"``; ``"dask"``); it changes no sum. ``out=`` is refused: see the module
    docstring for what replaces it.

    >>> import numpy as np, dask.array as da
    >>> x = da.ones((3, 4, 6), chunks=(2, 4, 2), dtype=np.float32)
    >>> matmul(x, da.ones((6,), chunks=3, dtype=np.float32)).compute().tolist()[0]
    [6.0, 6.0, 6.0, 6.0]
    """
    da = _dask_array()
    _check_k_group("pyblasgemm.dask.matmul", k_group)
    _check_transport("pyblasgemm.dask.matmul", transport)
    if out is not None:
        raise TypeError("pyblasgemm.dask.matmul: out= is not a Dask concept (the result is a new Dask "
                        "array); use dask.array.store(result, target) or result.persist()")
    x, y = da.asarray(x), da.asarray(y)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"pyblasgemm.dask.matmul: operands must be at least 1-D, got {x.ndim}-D and {y.ndim}-D")
    out_dtype = _result_dtype(x.dtype, y.dtype, dtype, compute)
    x, y = _as_loop_operands(x, y, dtype)
    squeeze_x, squeeze_y = x.ndim == 1, y.ndim == 1
    if squeeze_x:
        x = x[None, :]
    if squeeze_y:
        y = y[:, None]
    if x.shape[-1] != y.shape[-2]:
        raise ValueError(f"pyblasgemm.dask.matmul: x {x.shape} @ y {y.shape}: the inner sizes "
                         f"{x.shape[-1]} and {y.shape[-2]} differ")
    x, y = _align(x, y)
    if x.shape[-1] == 0:            # no K chunks: the product is zeros
        z = da.zeros(x.shape[:-1] + y.shape[-1:], dtype=out_dtype, chunks=x.chunks[:-1] + y.chunks[-1:])
    else:
        z = _contract(x, y, out_dtype, compute, backend, k_group, transport=transport)
    if squeeze_y:
        z = z[..., 0]
    if squeeze_x:
        z = z[..., 0, :] if not squeeze_y else z[..., 0]
    return z


def gemm(transa: GemmTrans, transb: GemmTrans, a: DaskArray, b: DaskArray, c: DaskArray | None = None,
         alpha: HostScalar = 1, beta: HostScalar = 0, *, dtype: Any = None, compute: Compute | None = None,
         backend: Backend | None = None, k_group: int | None = None,
         transport: DaskTransport = "auto") -> DaskArray:
    """``alpha * op(a) @ op(b) + beta * c`` for 2-D Dask arrays, as a new Dask array (``op``:
    'N', 'T' or 'C', as :func:`pyblasgemm.gemm`; ``c`` is read only when ``beta != 0`` and is
    rechunked to the result's blocks if needed). The result type is the product's (``dtype=``
    as in :func:`pyblasgemm.matmul`; ``c`` must cast to it under ``same_kind``); alpha, beta and
    the sum are applied in the accumulation type and rounded once. alpha and beta are checked
    before any graph, as :func:`pyblasgemm.gemm` checks them (int8: integers in the int32
    range; 16- and 32-bit floats: real, within float32; types pyblasgemm does not accelerate:
    their row's, or integers in the accumulation type's range). ``k_group`` and ``transport`` as
    in :func:`matmul`.

    >>> import numpy as np, dask.array as da
    >>> a = da.from_array(np.arange(6.0).reshape(3, 2), chunks=(2, 1))
    >>> gemm("T", "N", a, a, c=da.ones((2, 2), chunks=1), alpha=2, beta=-1).compute().tolist()
    [[39.0, 51.0], [51.0, 69.0]]
    >>> gemm("N", "N", a.astype(np.int8), a.T.astype(np.int8), alpha=1.5)
    Traceback (most recent call last):
        ...
    TypeError: pyblasgemm.dask.gemm: parameter 6 (alpha=1.5) must be an integer (int32 scalars for int8 GEMM), not float
    """
    da = _dask_array()
    _check_k_group("pyblasgemm.dask.gemm", k_group)
    _check_transport("pyblasgemm.dask.gemm", transport)
    ops = {"N": lambda m: m, "T": lambda m: m.T, "C": lambda m: m.conj().T}
    for pos, flag in ((1, transa), (2, transb)):
        if not isinstance(flag, str) or flag.upper() not in ops:
            raise ValueError(f"pyblasgemm.dask.gemm: parameter {pos} (trans{'ab'[pos - 1]}={flag!r}) must be "
                             f"'N', 'T' or 'C'")
    a, b = da.asarray(a), da.asarray(b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"pyblasgemm.dask.gemm: a and b must be 2-D, got {a.ndim}-D and {b.ndim}-D")
    x, y = ops[transa.upper()](a), ops[transb.upper()](b)
    if x.shape[1] != y.shape[0]:
        raise ValueError(f"pyblasgemm.dask.gemm: op(a) {x.shape} @ op(b) {y.shape}: inner sizes differ")
    out_dtype = _result_dtype(x.dtype, y.dtype, dtype, compute)
    x, y = _as_loop_operands(x, y, dtype)
    alpha, beta = _scalars(x.dtype, y.dtype, out_dtype, alpha, beta)
    if beta != 0:
        if c is None:
            raise ValueError("pyblasgemm.dask.gemm: beta != 0 needs c=")
        c = da.asarray(c)
        if c.shape != (x.shape[0], y.shape[1]):
            raise ValueError(f"pyblasgemm.dask.gemm: c has shape {c.shape}; the result is "
                             f"{(x.shape[0], y.shape[1])}")
        if not np.can_cast(c.dtype, out_dtype, "same_kind"):
            # c is added in the result's type: a complex c on a real product would lose its
            # imaginary part, a float c on an integer one its fractions
            raise TypeError(f"pyblasgemm.dask.gemm: c has dtype {c.dtype.name}, which the result type "
                            f"{out_dtype.name} cannot hold (same_kind casting)")
    x, y = _align(x, y)
    if beta != 0 and c.chunks != (x.chunks[0], y.chunks[1]):
        log.debug("rechunking c from %s to %s", c.chunks, (x.chunks[0], y.chunks[1]))
        c = c.rechunk((x.chunks[0], y.chunks[1]))
    if x.shape[1] == 0:
        if beta == 0:
            return da.zeros((x.shape[0], y.shape[1]), dtype=out_dtype, chunks=(x.chunks[0], y.chunks[1]))
        acc = accumulation_dtype(out_dtype)
        return (c.astype(acc) * acc.type(beta)).astype(out_dtype)
    return _contract(x, y, out_dtype, compute, backend, k_group, alpha, beta, c if beta != 0 else None, transport)
