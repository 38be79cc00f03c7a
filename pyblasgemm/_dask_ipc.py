"""CUDA IPC for :mod:`pyblasgemm.dask`: GPU blocks moved between the Dask workers of one host
through CUDA IPC memory handles and a device-to-device copy, instead of Dask's comm.

Dask stays the scheduler; the graph (``pyblasgemm.dask._ipc_rewrite``) gets two kinds of task
where a block crosses workers:

* :func:`export`, on the worker holding the blocks: the device is synchronized (a block may
  have been written on any stream of the worker), each block is made C-contiguous, and an
  :class:`IpcBlocks` is returned: per block the IPC handle of its allocation
  (``cuIpcGetMemHandle`` of the base that ``cuMemGetAddressRange`` gives: CuPy's pool hands out
  sub-ranges of larger allocations), the block's offset in it, shape, dtype, strides and the
  device's PCI bus id, with the host name and this process's id. The object keeps the arrays
  alive for as long as Dask keeps its key (until every consumer task has ended) and pickles to
  that metadata alone. A block that cannot be exported (NumPy, a CuPy array whose allocator
  refuses IPC, no CUDA) is carried as data: Dask's own transfer; when no block of the group can
  be exported, the task returns the blocks themselves and Dask moves them as it always does;
* :func:`fetch`, on the worker that reads them: opens each handle once per (producer process,
  handle, device) (``cuIpcOpenMemHandle`` with ``CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS``; a cache
  of at most :data:`OPEN_MAX`, closed by :func:`close_handles`), copies the block into memory of
  its own on a copy stream of its own (``cuMemcpyDtoDAsync``, peer to peer over NVLink where
  the GPUs have it), and synchronizes that stream before it returns, so the producer may
  release the block as soon as the task ends.

The copy stream does not wait for the kernels already queued on the worker (CuPy's current
stream): a fetch overlaps the products queued before it. Its memory comes from CuPy's pool on
the copy stream; when a fetched block is released, the copy stream is made to wait for the
work queued on the stream that was current when it was fetched (the products that read it), so
a later copy into the same memory cannot overtake them.

:func:`stats` says, per worker process, how many blocks went through IPC, how many fell back to
Dask's transfer and why.
"""
from __future__ import annotations

import collections
import os
import socket
import threading

import numpy as np

__all__ = ["IpcBlocks", "export", "fetch", "pick", "stats", "close_handles", "OPEN_MAX"]

#: opened IPC handles kept per process (each maps one allocation of a producer: CuPy's pool
#: makes a few large ones, so a handful per peer is typical); the oldest is closed beyond this
OPEN_MAX = 64

_LOCK = threading.Lock()
#: (producer pid, handle bytes, device) -> base address of the opened mapping
_OPENED: collections.OrderedDict = collections.OrderedDict()
_STREAMS = threading.local()
_STATS = {"ipc_blocks": 0, "ipc_bytes": 0, "fallback_blocks": 0, "same_process_blocks": 0,
          "exported_blocks": 0, "opened": 0, "closed": 0, "fallback_reasons": {}}


def stats(reset: bool = False) -> dict:
    """This process's counts: blocks fetched through IPC (and their bytes), blocks that fell
    back to Dask's transfer (with the reasons), blocks read in the process that exported them,
    handles opened, closed and open now. Run it on the workers with ``client.run``.

    >>> sorted(stats())       # doctest: +NORMALIZE_WHITESPACE
    ['closed', 'exported_blocks', 'fallback_blocks', 'fallback_reasons', 'ipc_blocks', 'ipc_bytes',
     'open_now', 'opened', 'same_process_blocks']
    """
    with _LOCK:
        out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in _STATS.items()}
        out["open_now"] = len(_OPENED)
        if reset:
            for k, v in _STATS.items():
                _STATS[k] = {} if isinstance(v, dict) else 0
    return out


def _fallback(reason: str) -> None:
    with _LOCK:
        _STATS["fallback_blocks"] += 1
        reasons = _STATS["fallback_reasons"]
        reasons[reason] = reasons.get(reason, 0) + 1


class IpcBlocks:
    """CUDA IPC handles of a group of blocks held by one worker (see the module docstring).

    ``entries``: per block ``(handle, offset, shape, dtype, strides, pci_bus_id, data)``, where
    ``handle`` is the 64 bytes of the allocation's IPC handle (None for a block carried as
    ``data``, which is then the block itself). Pickled, it is this metadata, the host name and
    the producer's pid; the arrays it keeps alive on the producer never travel.

    >>> import pickle
    >>> h = IpcBlocks([(bytes(64), 256, (8192, 8192), np.dtype(np.float16), (16384, 2), "0000:18:00.0", None)],
    ...               host="gpu-host", pid=1234, arrays=[np.zeros((8192, 8192), np.float16)])
    >>> len(pickle.dumps(h)) < 1000, pickle.loads(pickle.dumps(h)).arrays is None
    (True, True)
    """

    __slots__ = ("entries", "host", "pid", "arrays")

    def __init__(self, entries, host: str, pid: int, arrays=None):
        self.entries = tuple(entries)
        self.host, self.pid = host, pid
        self.arrays = arrays            # the producer's arrays (None once pickled)

    def __reduce__(self):
        return IpcBlocks, (self.entries, self.host, self.pid)

    def __sizeof__(self):               # Dask's memory accounting: the blocks are counted under their own keys
        return 64 * (1 + len(self.entries))

    def __repr__(self):
        ipc = sum(e[0] is not None for e in self.entries)
        return f"IpcBlocks({len(self.entries)} blocks, {ipc} by IPC, host={self.host!r}, pid={self.pid})"


def _driver():
    from .kernels import driver

    return driver


def _handle_bytes(handle) -> bytes:
    """The 64 bytes of a ``CUipcMemHandle``: cuda-bindings 13.5 exposes no field of the struct,
    only its address."""
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


def export(*blocks):
    """The blocks of one worker as an :class:`IpcBlocks` (the task placed on that worker), or the
    blocks themselves (a tuple) when none can go through IPC: NumPy blocks, no CUDA, an
    allocator whose memory ``cuIpcGetMemHandle`` refuses.

    >>> export(np.ones(3), np.zeros(2))[0].tolist()        # NumPy: Dask moves the data
    [1.0, 1.0, 1.0]
    """
    entries, arrays, any_ipc, synced = [], [], False, False
    for block in blocks:
        entry = None
        if type(block).__module__.startswith("cupy") and block.size:
            import cupy

            try:
                block = cupy.ascontiguousarray(block)
                if not synced:          # written on any stream of this worker: all of it done
                    cupy.cuda.Device(block.device.id).synchronize()
                    synced = True
                entry = _entry(block)
            except Exception as e:      # the driver or bindings refuse: Dask's transfer
                _fallback(f"export: {type(e).__name__}: {e}"[:160])
        else:
            _fallback("export: empty block" if type(block).__module__.startswith("cupy") else
                      f"export: not a CuPy array ({type(block).__module__}.{type(block).__name__})")
        if entry is None:
            entry = (None, 0, tuple(getattr(block, "shape", ())), getattr(block, "dtype", None), None, None, block)
        else:
            any_ipc = True
            with _LOCK:
                _STATS["exported_blocks"] += 1
        entries.append(entry)
        arrays.append(block)
    if not any_ipc:
        return tuple(blocks)
    return IpcBlocks(entries, socket.gethostname(), os.getpid(), arrays)


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
    while len(_OPENED) >= OPEN_MAX:     # no copy is in flight: each fetch synchronizes under the lock
        _, old = _OPENED.popitem(last=False)
        drv.check(cu.cuIpcCloseMemHandle(cu.CUdeviceptr(old)), "cuIpcCloseMemHandle")
        _STATS["closed"] += 1
    raw = np.frombuffer(bytearray(handle), np.uint8)
    h = cu.CUipcMemHandle(raw.ctypes.data)          # a view of ``raw``: kept alive through the call
    ptr = drv.call_in_context(device, "cuIpcOpenMemHandle", cu.cuIpcOpenMemHandle, h,
                              cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    _OPENED[key] = base = int(ptr)
    _STATS["opened"] += 1
    return base


def close_handles() -> int:
    """Close every IPC handle this process opened (after the products that read them); the
    number closed. Run it on the workers with ``client.run`` to give the producers' memory back.

    >>> close_handles()
    0
    """
    with _LOCK:
        if not _OPENED:
            return 0
        drv = _driver()
        cu = drv.bindings()
        n = 0
        while _OPENED:
            _, base = _OPENED.popitem(last=False)
            drv.check(cu.cuIpcCloseMemHandle(cu.CUdeviceptr(base)), "cuIpcCloseMemHandle")
            n += 1
        _STATS["closed"] += n
        return n


def _empty_like_entry(nbytes, shape, dtype, owner, device):
    import cupy

    memory = cupy.cuda.UnownedMemory(owner.memory.ptr, nbytes, owner, device)
    raw = cupy.ndarray((nbytes,), np.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))
    return raw.view(dtype).reshape(shape)


def fetch(group):
    """The blocks of an :func:`export` in this worker's memory, as a tuple (see the module
    docstring); blocks Dask moved are returned as they came.

    >>> fetch(export(np.ones(2)))[0].tolist()
    [1.0, 1.0]
    """
    if not isinstance(group, IpcBlocks):
        return tuple(group)
    if group.arrays is not None:        # never pickled: the exporting process itself
        with _LOCK:
            _STATS["same_process_blocks"] += len(group.entries)
        return tuple(group.arrays)
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
    out = []
    with _LOCK:
        with cupy.cuda.Device(device), stream:
            for handle, offset, shape, dtype, _strides, _bus, data in group.entries:
                if handle is None:          # carried as data (counted where it was exported)
                    out.append(data)
                    continue
                nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                try:
                    base = _open(group.pid, handle, device)
                except drv.CudaDriverError as e:
                    raise RuntimeError(f"pyblasgemm.dask: cannot open the CUDA IPC handle of a block of process "
                                       f"{group.pid} (GPU {_bus}) on GPU {cupy.cuda.Device(device).pci_bus_id}: {e}; "
                                       "transport='dask' moves blocks through Dask instead") from e
                owner = _Fetched(cupy.cuda.alloc(nbytes), stream, compute, device)
                drv.call_in_context(device, "cuMemcpyDtoDAsync", cu.cuMemcpyDtoDAsync,
                                    cu.CUdeviceptr(owner.memory.ptr), cu.CUdeviceptr(base + offset), nbytes,
                                    drv.stream(stream.ptr))
                out.append(_empty_like_entry(nbytes, shape, dtype, owner, device))
                _STATS["ipc_blocks"] += 1
                _STATS["ipc_bytes"] += nbytes
        stream.synchronize()            # copied: the producer may release its blocks now
    return tuple(out)
