"""Plan: choose the backend (and, for our kernels, the kernel config) for a ``GemmDesc``.

This is the foundation's simple rule; the full planner (cost model, stream-k / split-k choice,
autotuning) replaces ``_choose`` without changing ``Plan`` or ``plan_for``.

Rule:
  * NumPy arrays -> 'host' (NumPy / SciPy BLAS).
  * CuPy arrays  -> 'tensorcore' (our kernels) where cuBLAS has no such mode (3xTF32) or where
    our kernels were measured faster (``_ours_measured_faster``: nowhere yet on Hopper), else
    'cublas'.
  * ``backend=`` (or ``PYBLASGEMM_BACKEND``) forces a backend; a forced backend that cannot run
    the problem is an error, never a silent substitute.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from .backends import BACKEND_NAMES, get_backend
from .desc import GemmDesc


class Plan(NamedTuple):
    """The decision for one problem: which backend, with which config, and why."""

    backend: str
    reason: str
    config: object = None   # backend-specific (our kernels: a KernelConfig)

    def explain(self) -> str:
        """One paragraph saying what runs and why."""
        cfg = f" with config {self.config}" if self.config is not None else ""
        return f"backend {self.backend!r}{cfg}: {self.reason}"


_ENV_BACKEND = os.environ.get("PYBLASGEMM_BACKEND", "auto").lower()
if _ENV_BACKEND not in BACKEND_NAMES:
    raise ImportError(f"PYBLASGEMM_BACKEND={_ENV_BACKEND!r} must be one of {BACKEND_NAMES}")
_CACHE_ENABLED = os.environ.get("PYBLASGEMM_NO_PLAN_CACHE", "") in ("", "0")

_plan_cache: dict = {}


def plan_for(desc: GemmDesc, backend: str | None = None) -> Plan:
    """The plan for ``desc``; memoized on (problem key, requested backend)."""
    requested = backend or _ENV_BACKEND
    key = (desc.key, requested)
    plan = _plan_cache.get(key)
    if plan is None:
        plan = _choose(desc, requested)
        if _CACHE_ENABLED:
            _plan_cache[key] = plan
    return plan


def clear_plan_cache() -> None:
    """Forget every memoized plan (after changing defaults or registering kernels)."""
    _plan_cache.clear()


def _choose(desc: GemmDesc, requested: str) -> Plan:
    on_host = desc.xp == "numpy"
    if requested == "auto":
        if on_host:
            return Plan("host", "NumPy arrays run on the host (NumPy/SciPy BLAS)")
        ours, why_not_ours = _supports("tensorcore", desc)
        theirs, why_not_theirs = _supports("cublas", desc)
        if ours and (not theirs or _ours_measured_faster(desc)):
            why = ("cuBLAS has no such mode (" + why_not_theirs + ")" if not theirs
                   else "measured faster than cuBLAS for this kind of problem")
            return Plan("tensorcore", f"our tensor-core kernels: {why}",
                        get_backend("tensorcore").choose_config(desc))
        if theirs:
            why = (f"our kernels do not run it ({why_not_ours})" if not ours else
                   "our mma.sync kernels measured slower than cuBLAS for this dtype "
                   "(force backend='tensorcore' to use them)")
            return Plan("cublas", f"cuBLAS: {why}")
        raise NotImplementedError(f"{desc.routine}: no GPU backend runs compute={desc.compute!r} "
                                  f"for this problem: tensorcore: {why_not_ours}; "
                                  f"cublas: {why_not_theirs}")
    if on_host != (requested == "host"):
        wanted = "NumPy" if requested == "host" else "CuPy"
        got = "NumPy" if on_host else "CuPy"
        raise ValueError(f"{desc.routine}: backend={requested!r} runs on {wanted} arrays, "
                         f"but the arrays are {got} arrays")
    ok, why_not = _supports(requested, desc)
    if not ok:
        raise NotImplementedError(f"{desc.routine}: backend={requested!r} cannot run this "
                                  f"problem: {why_not}")
    config = get_backend(requested).choose_config(desc) if requested == "tensorcore" else None
    return Plan(requested, "forced by backend= / PYBLASGEMM_BACKEND", config)


def _ours_measured_faster(desc: GemmDesc) -> bool:
    """Where our mma.sync kernels beat cuBLAS, by measurement in the same run.

    H100, 2026-11-22 (bench/results/backends_h100_2026-11-22.json): none of the measured
    shapes. cuBLAS ran fp16/bf16 4096³ at 2.4x our speed, tf32 at 3.4x, int8 "TN" 4096³/8192³
    at 2.0x, and int8 "NN" 4096³ at 2.3x even with its rearranging copies; the one tie was
    int8 1000x1000x1001 (ours 1.05x). So 'auto' uses our kernels only where cuBLAS has no such
    mode (3xTF32), until the kernels or the planner's cost model say otherwise.
    """
    return False


def _supports(name: str, desc: GemmDesc):
    try:
        module = get_backend(name)
    except ImportError as exc:  # e.g. our kernels' package not importable
        return False, f"backend unavailable ({exc})"
    return module.supports(desc)
