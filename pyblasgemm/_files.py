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
import pathlib
import stat

__all__ = ["RefusedFile", "read_regular", "CACHE_ENTRY_BYTES", "CUBIN_BYTES", "DOCUMENT_BYTES",
           "cache_home", "data_home", "cache_info", "clear_cache", "trim_cache"]

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


# ---------------------------------------------------------------------------------------------
# Where the caches and results live (XDG base directories), their sizes, the size cap, clearing
# ---------------------------------------------------------------------------------------------

def _home(variable: str, which: int, *xdg_default: str) -> pathlib.Path:
    from . import settings

    return settings.app_home(variable, which, *xdg_default)


def cache_home():
    """The caches' root: ``$PYBLASGEMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/pyblasgemm``, else
    the platform's cache folder: ``~/.cache/pyblasgemm`` (Linux), ``~/Library/Caches/pyblasgemm``
    (macOS), ``%LOCALAPPDATA%\\pyblasgemm\\Cache`` (Windows). Autotuned winners are its
    ``tune-*.json`` files, compiled kernels live in ``kernels/``.

    >>> cache_home().name in ("pyblasgemm", "Cache") or settings_dir_is_set()
    True
    """
    from . import settings

    return settings.get("PYBLASGEMM_CACHE_DIR") or _home("XDG_CACHE_HOME", 0, ".cache")


def settings_dir_is_set() -> bool:
    from . import settings

    return settings.get("PYBLASGEMM_CACHE_DIR") is not None


def data_home():
    """Where results go by default: ``$XDG_DATA_HOME/pyblasgemm``, else the platform's data
    folder: ``~/.local/share/pyblasgemm`` (Linux), ``~/Library/Application Support/pyblasgemm``
    (macOS), ``%LOCALAPPDATA%\\pyblasgemm`` (Windows); never the package's own folder."""
    return _home("XDG_DATA_HOME", 1, ".local", "share")


#: cache name -> (its directory below cache_home(), the glob of its files)
CACHES = {"tune": ("", "tune-*.json"), "kernels": ("kernels", "*")}


def _cache_files(name: str):
    sub, pattern = CACHES[name]
    d = cache_home() / sub if sub else cache_home()
    try:
        return d, [p for p in d.glob(pattern) if p.is_file() and not p.is_symlink()]
    except OSError:
        return d, []


def cache_info() -> dict:
    """``{cache name: {"path", "files", "bytes"}}`` plus ``"max_bytes"``, the cap
    (``PYBLASGEMM_CACHE_MAX_MB``) each cache is trimmed to after a write.

    >>> sorted(cache_info())
    ['kernels', 'max_bytes', 'tune']
    """
    out: dict = {}
    for name in CACHES:
        d, files = _cache_files(name)
        size = 0
        for p in files:
            try:
                size += p.stat().st_size
            except OSError:
                pass
        out[name] = {"path": str(d), "files": len(files), "bytes": size}
    out["max_bytes"] = max_cache_bytes()
    return out


def max_cache_bytes() -> int:
    from . import settings

    return settings.get("PYBLASGEMM_CACHE_MAX_MB") << 20


def clear_cache(names=tuple(CACHES)) -> int:
    """Delete the files of the named caches (``'tune'``, ``'kernels'``); returns how many went.
    Other files in the directories are left alone.

    >>> clear_cache(("nope",))
    Traceback (most recent call last):
        ...
    ValueError: clear_cache: names=('nope',) must name caches among ('tune', 'kernels')
    """
    if isinstance(names, str) or any(n not in CACHES for n in names):
        raise ValueError(f"clear_cache: names={names!r} must name caches among {tuple(CACHES)}")
    removed = 0
    for name in names:
        for p in _cache_files(name)[1]:
            try:
                p.unlink()
                removed += 1
            except OSError:
                pass
    return removed


def trim_cache(name: str, max_bytes: int | None = None) -> int:
    """Delete the least recently written entries of cache ``name`` until it holds at most
    ``max_bytes`` (default: the ``PYBLASGEMM_CACHE_MAX_MB`` cap); an entry's files (a kernel's
    ``.cubin``, ``.json``, ``.lock`` and ``.compile``) go together. Called after a write (a cold
    path: a compile or a tuning just ran). Returns the bytes freed; never raises for the file
    system.
    """
    if max_bytes is None:
        max_bytes = max_cache_bytes()
    entries: dict = {}
    for p in _cache_files(name)[1]:
        try:
            st = p.stat()
        except OSError:
            continue
        e = entries.setdefault(p.name.split(".", 1)[0], [0.0, 0, []])
        e[0], e[1] = max(e[0], st.st_mtime), e[1] + st.st_size
        e[2].append(p)
    total = sum(e[1] for e in entries.values())
    freed = 0
    for mtime, size, paths in sorted(entries.values(), key=lambda e: e[0]):
        if total - freed <= max_bytes:
            break
        for p in paths:
            try:
                p.unlink()
            except OSError:
                pass
        freed += size
    if freed:
        from ._warnings import log

        log.info("%s cache over %d bytes: removed %d bytes of its oldest entries",
                 name, max_bytes, freed)
    return freed


# Paths to be written: why not, before any work (the CLI's checks; issue #30)

def why_not_creatable(path) -> str | None:
    """Why the missing ``path`` cannot be created (its nearest existing ancestor is not a
    directory we may write in), or None."""
    for up in pathlib.Path(os.path.abspath(path)).parents:
        if os.path.exists(up):
            if not os.path.isdir(up):
                return f"{str(up)!r} is not a directory"
            if not os.access(up, os.W_OK | os.X_OK):
                return f"no permission to create anything in {str(up)!r}"
            return None
    return None


def why_not_directory(path) -> str | None:
    """Why files cannot be written into the directory ``path`` (made if missing), or None."""
    if os.path.isdir(path):
        return None if os.access(path, os.W_OK | os.X_OK) else "no permission to write in it"
    if os.path.lexists(path):
        return "it is a file, not a directory"
    return why_not_creatable(path)
