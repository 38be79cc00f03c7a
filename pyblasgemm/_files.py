"""Reading files that someone else may have put in place: caches, tables, results documents.

Every reader of such a file goes through :func:`read_regular`, which opens the path only if
it is a regular file and reads at most a stated number of bytes. A FIFO left where a cache
entry belongs would block ``open`` until a writer came (or ``read`` until it wrote), and a
link to ``/dev/zero`` or a huge file would be read without bound: either would hang the
planner (issue #30). A path that is refused raises :class:`RefusedFile`, an ``OSError``, so
the readers' existing "unreadable file" handling (one warning, the entry ignored) applies.

The bounds are per kind of file (:data:`CACHE_ENTRY_BYTES`, :data:`CUBIN_BYTES`,
:data:`DOCUMENT_BYTES`), each far above the largest such file we write.

Example
-------
>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> path = os.path.join(d, "entry.json")
>>> with open(path, "w") as f:
...     _ = f.write('{"ok": true}')
>>> read_regular(path, CACHE_ENTRY_BYTES)
b'{"ok": true}'
>>> read_regular(d, CACHE_ENTRY_BYTES)
Traceback (most recent call last):
    ...
pyblasgemm._files.RefusedFile: not a regular file (a directory)
>>> read_regular(path, 4)
Traceback (most recent call last):
    ...
pyblasgemm._files.RefusedFile: larger than 4 bytes, the most read from such a file
"""
from __future__ import annotations

import errno
import os
import stat

__all__ = ["RefusedFile", "read_regular", "CACHE_ENTRY_BYTES", "CUBIN_BYTES", "DOCUMENT_BYTES"]

#: an autotune winner or a kernel cache entry's metadata: a few kilobytes of JSON (a winner
#: names ~10 timings and failures cut to 200 characters each); 1 MiB is hundreds of times that
CACHE_ENTRY_BYTES = 1 << 20
#: one compiled sm_90a kernel (a GEMM and its split-k reduction): well under 1 MB today;
#: 64 MiB leaves room for far larger instantiations and still bounds what a bad entry costs
CUBIN_BYTES = 64 << 20
#: a JSON table or benchmark results document (calibration, measured choices, bench/results):
#: the largest committed one is under 1 MB; 64 MiB leaves room for runs of ~80x as many cases
DOCUMENT_BYTES = 64 << 20

# O_NONBLOCK: opening a FIFO that has no writer returns at once instead of waiting for one
# (it has no effect on a regular file's reads); O_NOCTTY: a terminal never becomes ours
_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
          | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class RefusedFile(OSError):
    """:func:`read_regular` did not read the path: it is not a regular file, or it is larger
    than the bound. ``str()`` is the reason alone (the readers name the file themselves)."""

    def __str__(self) -> str:
        return self.strerror


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a file")


def read_regular(path, limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (links followed), at most ``limit`` of them.

    Raises :class:`RefusedFile` when ``path`` is a directory, FIFO, device or socket, or holds
    more than ``limit`` bytes; any other ``OSError`` of ``open`` or ``read`` as it comes
    (``FileNotFoundError`` for a missing file). The type is judged on the opened descriptor
    (``fstat``), so a file swapped after the check cannot slip through, and the size again
    while reading, so a file that grows after ``fstat`` is still cut off at ``limit + 1``.
    """
    fd = os.open(path, _FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RefusedFile(errno.EINVAL, f"not a regular file ({_kind(mode)})", os.fspath(path))
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(limit + 1 - total, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise RefusedFile(errno.EFBIG, f"larger than {limit} bytes, the most read from such "
                              f"a file", os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)
