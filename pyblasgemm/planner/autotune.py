"""Autotuning: time the cost model's best candidates on the GPU and persist the winners.

Method (nvmath / quack style): every candidate is compiled and run ``warmup`` times first; then
``repeats`` rounds, each timing every candidate once in a freshly shuffled order, with the L2
flushed (a write over a buffer twice the L2 size) before each timed call; CUDA events around the
call; the median per candidate decides. Candidates that fail to compile or launch are dropped
with the reason.

Winners persist as one small JSON file per entry under ``PYBLASGEMM_CACHE_DIR`` (default
``~/.cache/pyblasgemm/``), named by a hash of the key: device name, compute capability, driver
and NVRTC versions, the kernel headers' fingerprint, and the problem (the ``GemmDesc`` key
without routine name, device ordinal, alpha and beta). Writes go to a temporary file in the same
directory and are renamed into place (``os.replace``, atomic), so concurrent processes never
see a torn file; the last writer of an entry wins.

The cache is untrusted input: every read is checked (:func:`_why_invalid_winner`: a known
backend, a config name for our kernels, finite non-negative times). A file that cannot be read
or parsed, whose stored key differs (stale), whose winner has the wrong shape, or whose config
is no longer valid, is ignored with one :class:`CacheWarning` naming the file and the reason,
and the problem is tuned again (the entry is overwritten). An entry is opened only if it is a
regular file, and read up to :data:`~pyblasgemm._files.CACHE_ENTRY_BYTES`: a FIFO, a link to
a device or an oversized file in its place is unreadable (the same warning), never a hang. A
cache that cannot be written (the directory is a file, no permission, a full disk) costs only
the warning: the tuned plan is still returned.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from .. import settings as _env
from .._warnings import PyblasgemmWarning, log
from .._files import CACHE_ENTRY_BYTES, cache_home, read_regular, trim_cache
from ..desc import GemmDesc, matrix_span
from . import model as M
from ._checks import describe, is_number, why_not_number, why_not_numbers
from .arch import ArchSpec, arch_for_device, device_identity
from .candidates import _supports, enumerate_candidates, kernel_problem_for, spec_for
from .plan import Candidate, Plan

__all__ = ["TuneCache", "cache_dir", "tune_desc", "lookup", "problem_key", "CacheWarning"]

FORMAT = 1


class CacheWarning(PyblasgemmWarning):
    """An autotune cache file was unreadable, corrupt, stale or of the wrong shape and is
    ignored, or could not be written (the result is used, just not stored)."""


def _warn_cache(message: str, stacklevel: int) -> None:
    """One :class:`CacheWarning`, and the same words on the ``pyblasgemm`` logger at INFO (an
    unusable entry is a cold-path event: a tuning follows), as the kernel cache does.
    ``stacklevel`` as ``warnings.warn``'s from the caller's frame (this one is added)."""
    log.info("autotune cache: %s", message)
    warnings.warn(f"pyblasgemm: {message}", CacheWarning, stacklevel=stacklevel + 1)


#: the backends a stored winner may name
WINNER_BACKENDS = ("cublas", "tensorcore")


def _why_invalid_winner(win) -> str | None:
    """Why a stored winner cannot be used, or None when its shape is right.

    A winner is an object with ``backend`` ('cublas' or 'tensorcore'), ``config`` (a kernel
    config name for 'tensorcore', null for 'cublas'), ``time_s`` (a finite number >= 0) and
    optionally ``timings`` (an object of such numbers). Whether the config still runs the
    problem is checked later, against the problem (``_plan_from_winner``).

    Example::

        >>> _why_invalid_winner({"backend": "cublas", "config": None, "time_s": 1e-4}) is None
        True
        >>> _why_invalid_winner({"backend": "tensorcore", "config": None, "time_s": 1e-4})
        "config is null, not a kernel config name (backend 'tensorcore')"
    """
    if not isinstance(win, dict):
        return f"the winner is {describe(win)}, not an object"
    backend = win.get("backend")
    if backend not in WINNER_BACKENDS:
        return f"backend is {describe(backend)}, not one of {', '.join(map(repr, WINNER_BACKENDS))}"
    config = win.get("config")
    if backend == "tensorcore" and not isinstance(config, str):
        return f"config is {describe(config)}, not a kernel config name (backend 'tensorcore')"
    if backend == "cublas" and config is not None:
        return f"config is {describe(config)}, not null (backend 'cublas')"
    why = why_not_number(win.get("time_s"), "time_s")
    if why:
        return why
    if "timings" in win:
        return why_not_numbers(win["timings"], "timings")
    return None


def cache_dir() -> Path:
    """``PYBLASGEMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/pyblasgemm``, else ``~/.cache/pyblasgemm``
    (:func:`pyblasgemm._files.cache_home`)."""
    return cache_home()


def disk_cache_enabled() -> bool:
    return not _env.get("PYBLASGEMM_NO_TUNE_CACHE")


def problem_key(desc: GemmDesc) -> list:
    """The persisted problem key: the desc key without routine, xp and device ordinal."""
    return list(desc.key[1:15]) + [desc.align]


def _fingerprint() -> str:
    from ..kernels.jit import header_fingerprint

    return header_fingerprint()


class TuneCache:
    """Per-entry JSON files in ``directory`` (see the module docstring).

    Example::

        >>> import tempfile
        >>> c = TuneCache(tempfile.mkdtemp())
        >>> ident = {"device": "X", "cc": "9.0", "driver": 1, "nvrtc": "13.0"}
        >>> path = c.put(ident, "fp", ["h"], {"backend": "cublas", "config": None, "time_s": 1e-4})
        >>> c.get(ident, "fp", ["h"])["backend"]
        'cublas'
    """

    def __init__(self, directory=None):
        self.dir = Path(directory) if directory is not None else cache_dir()
        # a read that failed on the file system already warned: a failing write of the same
        # call (tune_desc's get, then put) says nothing new
        self._warned_unusable = False

    @staticmethod
    def _full_key(identity: dict, fingerprint: str, key) -> dict:
        return {"format": FORMAT, "identity": identity, "kernels": fingerprint, "problem": list(key)}

    def path(self, identity: dict, fingerprint: str, key) -> Path:
        blob = json.dumps(self._full_key(identity, fingerprint, key), sort_keys=True)
        return self.dir / f"tune-{hashlib.sha256(blob.encode()).hexdigest()[:32]}.json"

    def get(self, identity: dict, fingerprint: str, key) -> dict | None:
        """The stored winner, or None: missing (silently), or unreadable, corrupt, stale or of
        the wrong shape (one :class:`CacheWarning` naming the file and the reason)."""
        path = self.path(identity, fingerprint, key)
        try:
            data = json.loads(read_regular(path, CACHE_ENTRY_BYTES))
        except FileNotFoundError:
            return None
        except OSError as exc:     # the directory is a file, the entry a directory, a FIFO or
            # a device (RefusedFile: never opened for a blocking read), too large, no permission
            self._warned_unusable = True
            _warn_cache(f"ignoring unreadable autotune cache file {path}: {exc}", 2)
            return None
        except (ValueError, RecursionError) as exc:    # not JSON (or not UTF-8, or nested absurdly)
            _warn_cache(f"ignoring corrupt autotune cache file {path}: {str(exc)[:200]}", 2)
            return None
        want = json.loads(json.dumps(self._full_key(identity, fingerprint, key)))
        if not isinstance(data, dict) or data.get("key") != want or "winner" not in data:
            _warn_cache(f"ignoring stale autotune cache file {path} (written for another "
                        f"device, driver, NVRTC, kernel source or format)", 2)
            return None
        why = _why_invalid_winner(data["winner"])
        if why:
            _warn_cache(f"ignoring malformed autotune cache file {path}: {why}", 2)
            return None
        return data["winner"]

    def put(self, identity: dict, fingerprint: str, key, winner: dict) -> Path | None:
        """Store ``winner`` atomically (temporary file + ``os.replace``); returns the path.

        A cache that cannot be written (the directory is a file, no permission, a full disk:
        any ``OSError``) is not an error of the call that tuned: one :class:`CacheWarning`
        (none if a :meth:`get` of this instance already warned that the cache is unreadable),
        the temporary file removed, and None.
        """
        path = self.path(identity, fingerprint, key)
        data = {"key": self._full_key(identity, fingerprint, key), "winner": winner,
                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tune-", suffix=".tmp", dir=self.dir)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            if self.dir == cache_home():
                trim_cache("tune")     # the size cap (cold: a tuning just ran)
        except OSError as exc:
            _remove_quietly(tmp)
            if self._warned_unusable:
                return None
            _warn_cache(f"cannot write autotune cache file {path}: {exc} (the tuned plan is "
                        f"used, but not stored)", 2)
            return None
        except BaseException:      # KeyboardInterrupt, an unserializable winner: no torn file
            _remove_quietly(tmp)
            raise
        return path


def _remove_quietly(path) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass


# identity of a device: memoized; tests replace ``identity_provider``
_identities: dict = {}


def identity_provider(device: int) -> dict:
    ident = _identities.get(device)
    if ident is None:
        ident = _identities[device] = device_identity(device)
    return ident


_no_gpu: set = set()


def _identity(device: int):
    if device in _no_gpu:
        return None
    try:
        return identity_provider(device)
    except Exception:    # no CuPy / no GPU: nothing tuned can apply; do not ask again
        _no_gpu.add(device)
        return None


def lookup(desc: GemmDesc, arch: ArchSpec, cands, allow_cublas: bool = True):
    """The plan from a stored autotune winner for ``desc``, or None (no GPU, no entry, or an
    entry that is unreadable, stale or of the wrong shape: those warn, see :meth:`TuneCache.get`;
    planning goes on without it)."""
    if not disk_cache_enabled():
        return None
    ident = _identity(desc.device)
    if ident is None:
        return None
    win = TuneCache().get(ident, _fingerprint(), problem_key(desc))
    if win is None:
        return None
    return _plan_from_winner(desc, arch, cands, win, "autotune cache", allow_cublas)


def _plan_from_winner(desc, arch, cands, win, where, allow_cublas=True):
    """The plan of ``win`` (checked by :func:`_why_invalid_winner` when read from disk), or None
    when its config does not parse or cannot run ``desc`` on ``arch`` (warns)."""

    if win.get("backend") == "cublas":
        if not allow_cublas:
            return None
        return Plan("cublas", f"{where}: cuBLAS measured fastest ({_fmt(win)})", None, None, 1, (),
                    0, win.get("time_s"), "autotune", arch, desc, tuple(cands))
    try:
        cfg = M.parse_config_name(win["config"])
    except (KeyError, TypeError, ValueError):
        _warn_cache(f"ignoring autotune entry with a bad config {win.get('config')!r}", 3)
        return None
    prob = kernel_problem_for(desc)
    ok, why = M.check(cfg, prob, arch)
    if not ok:
        _warn_cache(f"ignoring stale autotune winner {cfg.name}: {why}", 3)
        return None
    occ = M.occupancy(cfg, prob.kind, arch)
    s = M.score_ours(cfg, prob, arch, M.load_calibration(), occ)
    winner = next((c for c in cands if c.config == cfg and c.score is not None and not c.pack),
                  None)
    if winner is None:
        winner = Candidate("tensorcore", cfg, s)
        cands = tuple(cands) + (winner,)
    spec = spec_for(desc, arch, winner)
    return Plan("tensorcore", f"{where}: {cfg.name} measured fastest ({_fmt(win)})", cfg,
                cfg.decomposition, spec.splits, spec.grid, spec.workspace_bytes, win.get("time_s"),
                "autotune", arch, desc, tuple(cands), spec)


def _fmt(win) -> str:
    """The four fastest stored timings, e.g. 'cublas 12.0 us, ...' (never raises)."""
    t = win.get("timings") if isinstance(win, dict) else None
    if not isinstance(t, dict):
        return "no timings stored"
    best = sorted(((str(k), v) for k, v in t.items() if is_number(v)), key=lambda kv: kv[1])[:4]
    return ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in best) or "no timings stored"


# ---------------------------------------------------------------------------------------------
# Timing on the GPU
# ---------------------------------------------------------------------------------------------

class GpuTimer:
    """Times candidates on real arrays for ``desc`` (CUDA events, L2 flushed before each call)."""

    def __init__(self, desc: GemmDesc, arch: ArchSpec):
        import cupy
        import numpy as np

        self.cupy = cupy
        self.desc, self.arch = desc, arch
        row = desc.row
        rng = np.random.default_rng(0)

        def buf(rows, cols, ld, stride, dtype, fill=True):
            n = matrix_span(rows, cols, ld) + stride * (desc.batch - 1)
            off = 0
            itemsize = np.dtype(dtype).itemsize
            if desc.align < 16 and desc.align >= itemsize:
                off = desc.align // itemsize     # reproduce the caller's pointer alignment
            if dtype == np.int8:
                host = rng.integers(-128, 128, n + off).astype(np.int8)
            elif np.dtype(dtype).kind == "c":
                host = (rng.uniform(-1, 1, n + off) + 1j * rng.uniform(-1, 1, n + off)).astype(dtype)
            else:
                host = rng.uniform(-1, 1, n + off).astype(dtype)
            return cupy.asarray(host)[off:]

        ar, ac = desc.a_shape()
        br, bc = desc.b_shape()
        self.a = buf(ar, ac, desc.lda, desc.stride_a, row.ab_dtype)
        self.b = buf(br, bc, desc.ldb, desc.stride_b, row.ab_dtype)
        self.c = buf(desc.m, desc.n, desc.ldc, desc.stride_c, row.c_dtype)
        self.flush = cupy.empty(max(2 * arch.l2_bytes, 1 << 20), dtype=cupy.uint8)

    def runner(self, cand):
        """A zero-argument callable that enqueues the candidate once: the very launch
        ``execute`` would run for it (the backend's ``bind``), else the backend's ``run``."""
        from types import SimpleNamespace

        from .. import streams
        from ..backends import get_backend

        backend = get_backend(cand.backend)
        # the plan this candidate would become carries this spec: time exactly that launch
        spec = (spec_for(self.desc, self.arch, cand) if cand.backend == "tensorcore"
                and cand.score is not None else None)
        launch = backend.bind(self.desc, SimpleNamespace(config=cand.config, launch=spec))
        d, a, b, c = self.desc, self.a, self.b, self.c
        if launch is None:
            return lambda: backend.run(d, a, b, c)
        pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr
        return lambda: launch(pa, pb, pc, d.alpha, d.beta, streams.current())

    def time(self, fn) -> float:
        cp = self.cupy
        self.flush.fill(1)           # evict A, B, C from L2 (an L2-cold call, like first use)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) * 1e-3


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm     # a dependency (pyproject.toml)

    return tqdm(total=total, desc=desc, leave=False)


def tune_desc(desc: GemmDesc, *, arch: ArchSpec | None = None, candidates=None, top: int = 8,
              repeats: int = 20, warmup: int = 3, cache: bool = True, include_cublas: bool = True,
              progress: bool = True, timer=None, identity: dict | None = None, seed: int | None = None):
    """Autotune ``desc``: returns the winner's ``Plan`` (``source='autotune'``).

    ``timer(candidate, desc) -> seconds`` replaces the GPU measurement (no GPU needed); then
    ``identity`` (device name, cc, driver, nvrtc) keys the disk cache, default a fake one.

    With ``cache`` a stored winner is served without timing anything; an entry that is
    unusable (see :meth:`TuneCache.get`) is ignored with a :class:`CacheWarning` and the problem
    tuned and stored again, and a cache that cannot be written only warns: the plan is returned.
    """

    if desc.xp != "cupy":
        raise ValueError("tune: autotuning is for GPU problems (CuPy arrays)")
    if timer is None:
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA device")
        except Exception as exc:
            raise RuntimeError(f"pyblasgemm.tune needs a CUDA GPU (CuPy could not find one: {exc}); "
                               f"use pyblasgemm.plan(...) for the model's prediction without one") from None
    arch = arch if arch is not None else arch_for_device(desc.device)
    cal = M.load_calibration()
    if candidates is None:
        ok = _supports("tensorcore", desc)[0]
        candidates = enumerate_candidates(desc, arch, cal) if ok else []
        if include_cublas and _supports("cublas", desc)[0]:
            candidates.append(Candidate("cublas", None, M.score_cublas(desc, arch, cal)))
    candidates = list(candidates)
    if identity is None:
        identity = ({"device": "fake-timer", "cc": "0.0", "driver": 0, "nvrtc": "0"}
                    if timer is not None else identity_provider(desc.device))
    use_disk = cache and disk_cache_enabled()
    store, fp, key = TuneCache(), _fingerprint(), problem_key(desc)
    if use_disk:
        win = store.get(identity, fp, key)
        if win is not None:
            plan = _plan_from_winner(desc, arch, candidates, win, "autotune cache", include_cublas)
            if plan is not None:
                return plan
    # packed candidates are the planner's (their copies are priced by the model, not timed here)
    ours = sorted((c for c in candidates if c.backend == "tensorcore" and c.score is not None
                   and not c.pack), key=lambda c: c.time)
    picked = _diverse_top(ours, top)
    if include_cublas:
        picked += [c for c in candidates if c.backend == "cublas" and c.score is not None]
    if not picked:
        raise NotImplementedError(f"{desc.routine}: nothing to tune: no candidate is valid")
    log.info("autotune: timing %d candidates for %s %s%s m=%d n=%d k=%d batch=%d (%s)",
             len(picked), desc.row.ab_dtype.name, desc.transa, desc.transb, desc.m, desc.n,
             desc.k, desc.batch,
             "no usable stored winner" if use_disk else "the disk cache is off")
    measure = None
    if timer is None:
        gt = GpuTimer(desc, arch)
        runners, failed = {}, {}
        for c in picked:
            try:
                runners[c.label] = gt.runner(c)
            except Exception as exc:    # compile or launch failure: drop it, say why
                failed[c.label] = f"{type(exc).__name__}: {str(exc)[:200]}"
        picked = [c for c in picked if c.label in runners]
        measure = lambda c: gt.time(runners[c.label])
    else:
        failed = {}
        measure = lambda c: timer(c, desc)
    rng = random.Random(seed)
    bar = _progress(len(picked) * (warmup + repeats), progress, f"tuning {desc.m}x{desc.n}x{desc.k}")
    times: dict = {c.label: [] for c in picked}
    try:
        for c in rng.sample(picked, len(picked)):
            for _ in range(warmup):
                measure(c)
                if bar is not None:
                    bar.update(1)
        for _ in range(repeats):
            for c in rng.sample(picked, len(picked)):
                times[c.label].append(measure(c))
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    medians = {label: statistics.median(v) for label, v in times.items() if v}
    if not medians:
        raise RuntimeError(f"tune: every candidate failed: {failed}")
    best_label = min(medians, key=medians.get)
    best = next(c for c in picked if c.label == best_label)
    winner = {"backend": best.backend, "config": best.config.name if best.config else None,
              "time_s": medians[best_label], "timings": medians, "failed": failed,
              "method": f"median of {repeats} after {warmup} warm-ups, L2 flushed, shuffled"}
    stored = store.put(identity, fp, key, winner) if use_disk else None
    log.info("autotune: %s won in %.2f us (%s)", best_label, medians[best_label] * 1e6,
             f"stored in {stored}" if stored is not None else "not stored")
    return _plan_from_winner(desc, arch, candidates, winner, "autotuned", True)


def _diverse_top(ours, top: int):
    """The ``top`` best-scored of our candidates, at most half of them of one decomposition, so
    that a mis-ranked decomposition still gets measured."""
    picked, per = [], {}
    cap = max(1, top // 2)
    for c in ours:
        d = c.config.decomposition
        if per.get(d, 0) < cap:
            picked.append(c)
            per[d] = per.get(d, 0) + 1
        if len(picked) >= top:
            break
    for c in ours:                      # fill up if the caps left room
        if len(picked) >= top:
            break
        if c not in picked:
            picked.append(c)
    return picked
