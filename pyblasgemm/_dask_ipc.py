"""CUDA IPC for :mod:`pyblasgemm.dask`: GPU blocks moved between the Dask workers of one host
through CUDA IPC memory handles and a device-to-device copy, instead of Dask's comm.

Dask stays the scheduler; the graph (``pyblasgemm.dask._ipc_rewrite``) gets two kinds of task
where a block crosses workers:

* :func:`export`, on the worker holding the blocks: each block is made C-contiguous, and an
  :class:`IpcBlocks` is returned: per block the IPC handle of its allocation
  (``cuIpcGetMemHandle`` of the base that ``cuMemGetAddressRange`` gives: CuPy's pool hands out
  sub-ranges of larger allocations), the block's offset in it, shape, dtype, strides and the
  device's PCI bus id, with the host name and this process's id; and two kinds of CUDA IPC
  event (``CU_EVENT_INTERPROCESS``, :class:`_Exported`): *ready*, recorded on the exporting
  thread's stream after the work queued there (the blocks' writers), and one *done* event per
  reader (``readers``: the fetches the graph gives the export), which each reader records
  after its copy. The object keeps the arrays alive for as long as Dask keeps its key (until
  every reader's task has ended); when Dask lets it go, the stream that wrote the blocks is made
  to wait for every *done* event before the blocks' memory can be handed out again. It pickles
  to that metadata alone. A block that cannot be exported (NumPy, a CuPy array whose allocator
  refuses IPC, no CUDA) is carried as data: Dask's own transfer; when no block of the group can
  be exported, the task returns the blocks themselves and Dask moves them as it always does;
* :func:`fetch`, on the worker that reads them (a task of its own, or an inline task of the one
  task there that reads them; ``indices``: the export's blocks it takes): opens each handle
  once per (producer process, handle, device) (``cuIpcOpenMemHandle`` with
  ``CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS``; a cache
  of at most :data:`OPEN_MAX`, closed by :func:`close_handles`), and on a copy stream of its own
  waits for the *ready* event, copies each block into memory of its own (``cuMemcpyDtoDAsync``,
  peer to peer over NVLink where the GPUs have it), records its *done* event, and makes the
  stream current on its thread (CuPy's, where the products run) wait for the copy. No thread
  waits for a GPU: the export does not synchronize the producer's device, the fetch returns
  once its copy is queued, and the products queued after it run when the copy has landed.

Which writes the *ready* event covers: those queued on the exporting thread's stream, and, when
that is the legacy default stream (CuPy's default), on every blocking stream of the process,
which is what Dask's own TCP transfer waits for (it copies to the host on the current stream).
On any other stream (per-thread default streams, a stream of the caller's) the export
synchronizes the device first, as a fetch does when its thread's stream is not the legacy one
(it then waits for its copy on the host). :data:`EVENTS` = False gives the transport without
events: every export synchronizes its device and every fetch its copy.

Memory of fetched blocks comes from CuPy's pool on the copy stream; when a fetched block is
released, the copy stream is made to wait for the work queued on the stream that was current
when it was fetched (the products that read it), so a later copy into the same memory cannot
overtake them.

:func:`stats` says, per worker process, how many blocks went through IPC, how many fell back to
Dask's transfer and why, and how many exports and fetches had to synchronize.
"""
from __future__ import annotations

import collections
import os
import socket
import threading

import numpy as np

__all__ = ["IpcBlocks", "export", "fetch", "pick", "stats", "close_handles", "OPEN_MAX", "EVENTS",
           "TRACE"]

#: opened IPC handles kept per process (each maps one allocation of a producer: CuPy's pool
#: makes a few large ones, so a handful per peer is typical); the oldest is closed beyond this
OPEN_MAX = 64

#: True: blocks cross with CUDA IPC events, no thread waits for a GPU (module docstring);
#: False: every export synchronizes its device and every fetch waits for its copy on the host
#: (the transport as it was before events, kept to compare: bench/dask_scaling.py's ipc-sync)
EVENTS = True

#: a function the benchmark sets (bench/dask_scaling.py ``--trace``) where the transport's GPU
#: work is queued: ``"ready"`` (an export's ready event, on its stream), ``"copy_start"`` (a
#: fetch's copy stream, once it waits for ready) and ``"copy_end"`` (after its copies), each
#: with the device and the stream; None (the default) costs one global read
TRACE = None

#: reentrant: a finalizer (_Exported, _Fetched) may run while this thread holds it
_LOCK = threading.RLock()
#: (producer pid, handle bytes, device) -> base address of the opened mapping
_OPENED: collections.OrderedDict = collections.OrderedDict()
_STREAMS = threading.local()
_STATS = {"ipc_blocks": 0, "ipc_bytes": 0, "fallback_blocks": 0, "same_process_blocks": 0,
          "exported_blocks": 0, "opened": 0, "closed": 0, "event_exports": 0, "synchronized_exports": 0,
          "synchronized_fetches": 0, "peer_blocks": 0, "no_peer_blocks": 0, "fallback_reasons": {}}
#: (this process's device, the producer's PCI bus id) -> whether the device can read the
#: producer's GPU peer to peer (cuDeviceCanAccessPeer); else the driver stages the copy
_PEER: dict = {}


def stats(reset: bool = False) -> dict:
    """This process's counts: blocks fetched through IPC (and their bytes), blocks that fell
    back to Dask's transfer (with the reasons), blocks read in the process that exported them,
    handles opened, closed and open now; exports that made IPC events, exports that
    synchronized their device, fetches that waited for their copy on the host. Run it on the
    workers with ``client.run``.

    ``peer_blocks`` / ``no_peer_blocks``: fetched blocks whose GPUs can / cannot reach each
    other peer to peer (cuDeviceCanAccessPeer; without it the driver stages the copy through
    the host, at PCIe speed).

    >>> sorted(stats())       # doctest: +NORMALIZE_WHITESPACE
    ['closed', 'event_exports', 'exported_blocks', 'fallback_blocks', 'fallback_reasons', 'ipc_blocks',
     'ipc_bytes', 'no_peer_blocks', 'open_now', 'opened', 'peer_blocks', 'same_process_blocks',
     'synchronized_exports', 'synchronized_fetches']
    """
    with _LOCK:
        out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in _STATS.items()}
        out["open_now"] = len(_OPENED)
        if reset:
            for k, v in _STATS.items():
                _STATS[k] = {} if isinstance(v, dict) else 0
    return out


def _count(name: str, n: int = 1) -> None:
    with _LOCK:
        _STATS[name] += n


def _fallback(reason: str) -> None:
    with _LOCK:
        _STATS["fallback_blocks"] += 1
        reasons = _STATS["fallback_reasons"]
        reasons[reason] = reasons.get(reason, 0) + 1


class IpcBlocks:
    """CUDA IPC handles of a group of blocks held by one worker (see the module docstring).

    ``entries``: per block ``(handle, offset, shape, dtype, strides, pci_bus_id, data)``, where
    ``handle`` is the 64 bytes of the allocation's IPC handle (None for a block carried as
    ``data``, which is then the block itself). ``events``: None (the producer synchronized its
    device: a reader waits for its copy on the host) or ``(ready, (done, ...))``, the 64-byte
    handles of the IPC events (one *done* a reader). Pickled, it is this metadata, the host name
    and the producer's pid; the arrays (and the events' owner) it keeps on the producer never
    travel.

    >>> import pickle
    >>> h = IpcBlocks([(bytes(64), 256, (8192, 8192), np.dtype(np.float16), (16384, 2), "0000:18:00.0", None)],
    ...               host="gpu-host", pid=1234, arrays=[np.zeros((8192, 8192), np.float16)],
    ...               events=(bytes(64), (bytes(64),)))
    >>> back = pickle.loads(pickle.dumps(h))
    >>> len(pickle.dumps(h)) < 1000, back.arrays is None, len(back.events[1])
    (True, True, 1)
    """

    __slots__ = ("entries", "host", "pid", "arrays", "events", "owner")

    def __init__(self, entries, host: str, pid: int, arrays=None, events=None, owner=None):
        self.entries = tuple(entries)
        self.host, self.pid = host, pid
        self.arrays = arrays            # the producer's arrays (None once pickled)
        self.events = events
        self.owner = owner              # the producer's _Exported (None once pickled)

    def __reduce__(self):
        return IpcBlocks, (self.entries, self.host, self.pid, None, self.events)

    def __sizeof__(self):               # Dask's memory accounting: the blocks are counted under their own keys
        return 64 * (1 + len(self.entries))

    def __repr__(self):
        ipc = sum(e[0] is not None for e in self.entries)
        how = "events" if self.events else "synchronized"
        return f"IpcBlocks({len(self.entries)} blocks, {ipc} by IPC, {how}, host={self.host!r}, pid={self.pid})"


def _driver():
    from .kernels import driver

    return driver


def _handle_bytes(handle) -> bytes:
    """The 64 bytes of a ``CUipcMemHandle`` or ``CUipcEventHandle``: cuda-bindings 13.5 exposes
    no field of the structs, only their address."""
    import ctypes

    return ctypes.string_at(handle.getPtr(), 64)


def _entry(block):
    """The IPC entry of a C-contiguous CuPy block (CudaDriverError if the driver refuses)."""
    import cupy

    drv = _driver()
    cu = drv.bindings()
    dev = block.device.id
    ptr = cu.CUdeviceptr(block.data.ptr)
    base, _size = drv.call_in_context(dev, "cuMemGetAddressRange", cu.cuMemGetAddressRange, ptr)
    handle = drv.call_in_context(dev, "cuIpcGetMemHandle", cu.cuIpcGetMemHandle, base)
    return (_handle_bytes(handle), block.data.ptr - int(base), tuple(block.shape), block.dtype,
            tuple(block.strides), cupy.cuda.Device(dev).pci_bus_id, None)


class _Exported:
    """The producer's side of an export's IPC events: *ready*, recorded on ``stream`` (the
    exporting thread's, where the blocks were written) when the export is made, and one *done*
    event a reader. When the export is let go (:meth:`release`, from ``__del__``: Dask drops
    the key once every reader's task has ended, so each reader has recorded its *done* event,
    though its copy may still run), ``stream`` is made to wait for every *done* event (on the
    GPU: no thread waits), so work queued there after it (CuPy's pool hands a freed block's
    memory to the stream it was allocated on) cannot overwrite a block a reader is copying;
    then the events are destroyed (the driver frees them once they have completed) and the
    arrays let go: this object holds them too, so that their memory returns to the pool only
    after the waits are queued, whatever order the export's references go in."""

    __slots__ = ("device", "stream", "ready", "done", "arrays", "released")

    def __init__(self, device: int, stream: int, readers: int, arrays=()):
        drv = _driver()
        cu = drv.bindings()
        flags = int(cu.CUevent_flags.CU_EVENT_INTERPROCESS) | int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.device, self.stream, self.released, self.arrays = device, stream, False, list(arrays)
        self.ready, self.done = None, []
        try:
            self.ready = drv.call_in_context(device, "cuEventCreate", cu.cuEventCreate, flags)
            for _ in range(readers):
                self.done.append(drv.call_in_context(device, "cuEventCreate", cu.cuEventCreate, flags))
            drv.call_in_context(device, "cuEventRecord", cu.cuEventRecord, self.ready, drv.stream(stream))
            if TRACE is not None:
                TRACE("ready", device, stream)
        except Exception:
            self.release()
            raise

    def handles(self):
        """``(ready, (done, ...))``: the events' 64-byte IPC handles."""
        drv = _driver()
        cu = drv.bindings()

        def handle(event):
            return _handle_bytes(drv.call_in_context(self.device, "cuIpcGetEventHandle", cu.cuIpcGetEventHandle, event))

        return handle(self.ready), tuple(handle(e) for e in self.done)

    def release(self) -> None:
        if self.released:
            return
        self.released = True            # once; a failure below is said in stats() (from __del__)
        drv = _driver()
        cu = drv.bindings()
        # from Dask's event loop thread, which may have no current context: call_in_context
        for event in self.done:
            drv.call_in_context(self.device, "cuStreamWaitEvent", cu.cuStreamWaitEvent, drv.stream(self.stream),
                                event, 0)
        for event in [self.ready] + self.done:
            if event is not None:
                drv.call_in_context(self.device, "cuEventDestroy", cu.cuEventDestroy, event)
        self.arrays = None

    def __del__(self):
        try:
            self.release()
        except Exception as e:          # interpreter shutdown, a lost context: said in stats()
            try:
                _fallback_reason(f"release: {type(e).__name__}: {e}"[:160])
            except Exception:
                pass


def _is_legacy(stream) -> bool:
    """Whether a CuPy stream is the legacy default stream (handle 0, or CU_STREAM_LEGACY), which
    the blocking streams of the process synchronize with."""
    return int(stream.ptr) in (0, 1)


def export(*blocks, readers: int = 1):
    """The blocks of one worker as an :class:`IpcBlocks` (the task placed on that worker), or the
    blocks themselves (a tuple) when none can go through IPC: NumPy blocks, no CUDA, an
    allocator whose memory ``cuIpcGetMemHandle`` refuses. ``readers``: the fetch tasks that will
    read it (one IPC *done* event each; a fetch of a slot beyond them waits for its copy on the
    host).

    >>> export(np.ones(3), np.zeros(2))[0].tolist()        # NumPy: Dask moves the data
    [1.0, 1.0, 1.0]
    """
    if isinstance(readers, (bool, np.bool_)) or not isinstance(readers, (int, np.integer)) or readers < 0:
        raise ValueError(f"pyblasgemm.dask: an export's readers={readers!r} must be an integer >= 0")
    entries, arrays, devices = [], [], []
    for block in blocks:
        entry = None
        if type(block).__module__.startswith("cupy") and block.size:
            import cupy

            try:
                block = cupy.ascontiguousarray(block)       # a copy, if any, is queued on this thread's stream
                entry = _entry(block)
                if block.device.id not in devices:
                    devices.append(block.device.id)
            except Exception as e:      # the driver or bindings refuse: Dask's transfer
                _fallback(f"export: {type(e).__name__}: {e}"[:160])
        else:
            _fallback("export: empty block" if type(block).__module__.startswith("cupy") else
                      f"export: not a CuPy array ({type(block).__module__}.{type(block).__name__})")
        if entry is None:
            entry = (None, 0, tuple(getattr(block, "shape", ())), getattr(block, "dtype", None), None, None, block)
        else:
            _count("exported_blocks")
        entries.append(entry)
        arrays.append(block)
    if not devices:
        return tuple(blocks)
    events = owner = None
    import cupy

    if EVENTS and len(devices) == 1:
        try:
            with cupy.cuda.Device(devices[0]):
                stream = cupy.cuda.get_current_stream()
                if not _is_legacy(stream):      # the blocks may have been written on other threads' streams
                    cupy.cuda.Device(devices[0]).synchronize()
                    _count("synchronized_exports")
                owner = _Exported(devices[0], int(stream.ptr), int(readers), arrays)
                events = owner.handles()
            _count("event_exports")
        except Exception as e:          # no IPC events here: the producer synchronizes, the readers wait
            _fallback_reason(f"export events: {type(e).__name__}: {e}"[:160])
            if owner is not None:
                owner.release()
            owner = events = None
    if events is None:
        for dev in devices:             # written on any stream of this worker: all of it done
            cupy.cuda.Device(dev).synchronize()
        _count("synchronized_exports")
    return IpcBlocks(entries, socket.gethostname(), os.getpid(), arrays, events, owner)


def _fallback_reason(reason: str) -> None:
    """A reason in ``fallback_reasons`` that moved no block to Dask's transfer."""
    with _LOCK:
        reasons = _STATS["fallback_reasons"]
        reasons[reason] = reasons.get(reason, 0) + 1


def pick(blocks, index: int):
    """Block ``index`` of a fetched group (an inline task of a product that reads it)."""
    return blocks[index]


def _copy_stream(device: int):
    """This thread's copy stream on ``device`` (non-blocking: it does not wait for the legacy
    default stream, where CuPy queues the products)."""
    import cupy

    streams = getattr(_STREAMS, "by_device", None)
    if streams is None:
        streams = _STREAMS.by_device = {}
    s = streams.get(device)
    if s is None:
        with cupy.cuda.Device(device):
            s = streams[device] = cupy.cuda.Stream(non_blocking=True)
    return s


class _Fetched:
    """The owner of a fetched block's memory (from CuPy's pool, on the copy stream). Released
    when the block is: the copy stream then waits for what was queued on the compute stream
    (the products that read the block), so a later copy into this memory cannot overtake them."""

    __slots__ = ("memory", "copy_stream", "compute_stream", "device")

    def __init__(self, memory, copy_stream, compute_stream, device):
        self.memory, self.copy_stream, self.compute_stream, self.device = memory, copy_stream, compute_stream, device

    def __del__(self):
        try:
            import cupy

            with cupy.cuda.Device(self.device):
                done = cupy.cuda.Event(block=False, disable_timing=True)
                done.record(self.compute_stream)
                self.copy_stream.wait_event(done)
        except Exception:               # interpreter shutdown: nothing is queued any more
            pass


def _peer(device: int, bus: str):
    """Whether ``device`` (this process's ordinal) can access the GPU at PCI bus id ``bus`` peer
    to peer; None when the driver cannot say (the GPU is not visible here, say). Cached."""
    key = (device, bus)
    if key not in _PEER:
        drv = _driver()
        cu = drv.bindings()
        try:
            other = drv.call_in_context(device, "cuDeviceGetByPCIBusId", cu.cuDeviceGetByPCIBusId, bus.encode())
            mine = drv.call_in_context(device, "cuDeviceGet", cu.cuDeviceGet, device)
            _PEER[key] = True if int(other) == int(mine) else bool(
                drv.call_in_context(device, "cuDeviceCanAccessPeer", cu.cuDeviceCanAccessPeer, mine, other))
        except Exception:
            _PEER[key] = None
    return _PEER[key]


def _open(pid: int, handle: bytes, device: int) -> int:
    """The base address of the producer's allocation, mapped in this process (opened once per
    (pid, handle, device): opening a handle this context holds open fails on older drivers with
    CUDA_ERROR_ALREADY_MAPPED). Called under ``_LOCK``."""
    key = (pid, handle, device)
    base = _OPENED.get(key)
    if base is not None:
        _OPENED.move_to_end(key)
        return base
    drv = _driver()
    cu = drv.bindings()
    while len(_OPENED) >= OPEN_MAX:
        # a copy from the oldest mapping may still run (a fetch no longer waits for its copy):
        # the device finishes its queued work first (rare: OPEN_MAX mappings are many allocations)
        (_, _, old_device), old = _OPENED.popitem(last=False)
        drv.call_in_context(old_device, "cuCtxSynchronize", cu.cuCtxSynchronize)
        drv.call_in_context(old_device, "cuIpcCloseMemHandle", cu.cuIpcCloseMemHandle, cu.CUdeviceptr(old))
        _STATS["closed"] += 1
    raw = np.frombuffer(bytearray(handle), np.uint8)
    h = cu.CUipcMemHandle(raw.ctypes.data)          # a view of ``raw``: kept alive through the call
    ptr = drv.call_in_context(device, "cuIpcOpenMemHandle", cu.cuIpcOpenMemHandle, h,
                              cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    _OPENED[key] = base = int(ptr)
    _STATS["opened"] += 1
    return base


def close_handles() -> int:
    """Close every IPC handle this process opened (after the products that read them: the
    device's queued work is finished first); the number closed. Run it on the workers with
    ``client.run`` to give the producers' memory back.

    >>> close_handles()
    0
    """
    with _LOCK:
        if not _OPENED:
            return 0
        drv = _driver()
        cu = drv.bindings()
        for device in sorted({key[2] for key in _OPENED}):      # no copy from a mapping still runs
            drv.call_in_context(device, "cuCtxSynchronize", cu.cuCtxSynchronize)
        n = 0
        while _OPENED:
            (_, _, device), base = _OPENED.popitem(last=False)
            drv.call_in_context(device, "cuIpcCloseMemHandle", cu.cuIpcCloseMemHandle, cu.CUdeviceptr(base))
            n += 1
        _STATS["closed"] += n
        return n


def _empty_like_entry(nbytes, shape, dtype, owner, device):
    import cupy

    memory = cupy.cuda.UnownedMemory(owner.memory.ptr, nbytes, owner, device)
    raw = cupy.ndarray((nbytes,), np.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))
    return raw.view(dtype).reshape(shape)


def _imported(device: int, handle: bytes):
    """A producer's IPC event, opened in this process (destroy it after use: the driver keeps
    what was queued on it)."""
    drv = _driver()
    cu = drv.bindings()
    raw = np.frombuffer(bytearray(handle), np.uint8)
    h = cu.CUipcEventHandle(raw.ctypes.data)        # a view of ``raw``: kept alive through the call
    return drv.call_in_context(device, "cuIpcOpenEventHandle", cu.cuIpcOpenEventHandle, h)


def fetch(group, slot: int = 0, indices=None, waits=None):
    """The blocks of an :func:`export` in this worker's memory, as a tuple (see the module
    docstring); blocks Dask moved are returned as they came. ``slot``: which of the export's
    *done* events this reader records (each fetch of one export has its own, a fetch task or
    one folded into the task that reads the blocks). ``indices``: the blocks of the export this
    reader takes, in this order (None: all of them); only those are copied. ``waits``: None
    (the current stream waits for the copy at once), or a list that gets the copy's event,
    which the caller makes the stream that reads the blocks wait for before it queues that
    work (an engine queues several copies ahead of the runs that read them: each run then
    waits for its own copy, not for every copy queued before it).

    >>> fetch(export(np.ones(2)))[0].tolist()
    [1.0, 1.0]
    >>> [b.tolist() for b in fetch(export(np.ones(1), np.zeros(2), np.full(1, 7.0)), 0, (2, 0))]
    [[7.0], [1.0]]
    """
    if not isinstance(group, IpcBlocks):
        blocks = tuple(group)
        return blocks if indices is None else tuple(blocks[i] for i in indices)
    entries = group.entries if indices is None else tuple(group.entries[i] for i in indices)
    if group.arrays is not None:        # never pickled: the exporting process itself
        with _LOCK:
            _STATS["same_process_blocks"] += len(entries)
        return tuple(group.arrays) if indices is None else tuple(group.arrays[i] for i in indices)
    if group.pid == os.getpid():        # pickled and read back in its own process (spilled): the arrays are gone
        raise RuntimeError("pyblasgemm.dask: a CUDA IPC export came back to the process that made it without "
                           "its arrays (spilled to disk?); transport='dask' moves blocks through Dask instead")
    if group.host != socket.gethostname():
        raise RuntimeError(f"pyblasgemm.dask: CUDA IPC handles from host {group.host!r} reached host "
                           f"{socket.gethostname()!r}; IPC works within one host: pass transport='dask'")
    import cupy

    drv = _driver()
    cu = drv.bindings()
    device = cupy.cuda.Device().id
    compute = cupy.cuda.get_current_stream()
    stream = _copy_stream(device)
    raw_stream = drv.stream(stream.ptr)
    ready = done = None
    out = []
    try:
        if group.events is not None:
            ready_handle, done_handles = group.events
            try:
                ready = _imported(device, ready_handle)
                if 0 <= slot < len(done_handles):
                    done = _imported(device, done_handles[slot])
            except drv.CudaDriverError as e:
                raise RuntimeError(f"pyblasgemm.dask: cannot open the CUDA IPC events of an export of process "
                                   f"{group.pid} on GPU {cupy.cuda.Device(device).pci_bus_id}: {e}; "
                                   "transport='dask' moves blocks through Dask instead") from e
        with _LOCK:
            with cupy.cuda.Device(device), stream:
                if ready is not None:       # the producer's writes of the blocks, on the GPU
                    drv.call_in_context(device, "cuStreamWaitEvent", cu.cuStreamWaitEvent, raw_stream, ready, 0)
                if TRACE is not None:
                    TRACE("copy_start", device, int(stream.ptr))
                for handle, offset, shape, dtype, _strides, _bus, data in entries:
                    if handle is None:          # carried as data (counted where it was exported)
                        out.append(data)
                        continue
                    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                    try:
                        base = _open(group.pid, handle, device)
                    except drv.CudaDriverError as e:
                        raise RuntimeError(f"pyblasgemm.dask: cannot open the CUDA IPC handle of a block of process "
                                           f"{group.pid} (GPU {_bus}) on GPU {cupy.cuda.Device(device).pci_bus_id}: "
                                           f"{e}; transport='dask' moves blocks through Dask instead") from e
                    owner = _Fetched(cupy.cuda.alloc(nbytes), stream, compute, device)
                    drv.call_in_context(device, "cuMemcpyDtoDAsync", cu.cuMemcpyDtoDAsync,
                                        cu.CUdeviceptr(owner.memory.ptr), cu.CUdeviceptr(base + offset), nbytes,
                                        raw_stream)
                    out.append(_empty_like_entry(nbytes, shape, dtype, owner, device))
                    _STATS["ipc_blocks"] += 1
                    _STATS["ipc_bytes"] += nbytes
                    if _bus:
                        peer = _peer(device, _bus)
                        if peer is not None:
                            _STATS["peer_blocks" if peer else "no_peer_blocks"] += 1
                if TRACE is not None:
                    TRACE("copy_end", device, int(stream.ptr))
                if done is not None:        # the producer may reuse the blocks' memory once this is reached
                    drv.call_in_context(device, "cuEventRecord", cu.cuEventRecord, done, raw_stream)
                if done is not None and _is_legacy(compute):
                    copied = cupy.cuda.Event(block=False, disable_timing=True)
                    copied.record(stream)
                    if waits is None:
                        compute.wait_event(copied)      # the products queued after this read the copies
                    else:
                        waits.append(copied)
                else:                       # no done event (the producer waits for nothing), or the
                    stream.synchronize()    # products on a stream the copy cannot order: wait here
                    _STATS["synchronized_fetches"] += 1
    finally:
        for event in (ready, done):
            if event is not None:
                drv.call_in_context(device, "cuEventDestroy", cu.cuEventDestroy, event)
    return tuple(out)
