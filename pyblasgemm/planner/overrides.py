"""What the user forced through ``PYBLASGEMM_*`` variables: the planner's overrides.

Read from :mod:`pyblasgemm.settings` on first use (never at import) and kept until
:func:`reset` (which :func:`pyblasgemm.clear_plan_cache` calls).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import settings as _env
from ..backends import BACKEND_NAMES
from ..desc import BACKEND_ALIASES, check_backend_place
from ..kernels.config import DECOMPOSITIONS, KernelConfig
from . import model as M

__all__ = ["Settings", "current_settings", "reset", "resolve_invariant"]


@dataclass(frozen=True)
class Settings:
    backend: str = "auto"
    cache: bool = True
    print_plans: bool = False
    decomposition: str | None = None
    splits: int | None = None
    config: KernelConfig | None = None
    autotune: bool = False
    measured_choices: bool = True      # consult the measured-choice table (measured.py)
    invariant: bool = False            # the default of ``invariant=`` (PYBLASGEMM_INVARIANT)
    #: whether ``matmul``'s NumPy fast path may answer: a backend that runs on the host, and
    #: no batch-invariant default (NumPy's GEMM is not invariant); a field, read per call
    host_direct: bool = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "host_direct", self.backend in ("auto", "host") and not self.invariant)


def _read_settings() -> Settings:
    """The planner's variables, validated by :mod:`pyblasgemm.settings` (a bad value raises
    ``SettingError`` naming the variable); the config name is checked against the kernels."""
    name = _env.get("PYBLASGEMM_CONFIG")
    try:
        cfg = M.parse_config_name(name) if name else None
    except ValueError as exc:
        raise _env.SettingError("PYBLASGEMM_CONFIG", name, str(exc)) from None
    return Settings(_env.get("PYBLASGEMM_BACKEND", BACKEND_NAMES, BACKEND_ALIASES),
                    not _env.get("PYBLASGEMM_NO_PLAN_CACHE"), _env.get("PYBLASGEMM_PRINT_PLANS"),
                    _env.get("PYBLASGEMM_DECOMPOSITION", DECOMPOSITIONS),
                    _env.get("PYBLASGEMM_SPLITS"), cfg, _env.get("PYBLASGEMM_AUTOTUNE"),
                    not _env.get("PYBLASGEMM_NO_MEASURED_CHOICES"), _env.get("PYBLASGEMM_INVARIANT"))


_settings: Settings | None = None


def current_settings() -> Settings:
    """The planner's settings, read from the environment on first use (not at import) and
    kept until :func:`clear_plan_cache`."""
    global _settings
    s = _settings
    if s is None:
        s = _settings = _read_settings()
    return s


def reset() -> None:
    """Forget the settings read; the next :func:`current_settings` reads the environment."""
    global _settings
    _settings = None


def resolve_invariant(routine: str, value) -> bool:
    """``invariant=`` as the call runs it: True or False as given, None the setting
    (``PYBLASGEMM_INVARIANT``, default False). TypeError for anything else, naming the
    argument (``invariant=1`` is refused: a typo should not pass for a promise).

    >>> resolve_invariant("matmul", None)
    False
    >>> resolve_invariant("matmul", "yes")
    Traceback (most recent call last):
        ...
    TypeError: matmul: invariant='yes' must be True, False or None (None: the PYBLASGEMM_INVARIANT setting)
    """
    if value is None:
        return current_settings().invariant
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):          # NumPy's bool
        return bool(value)
    raise TypeError(f"{routine}: invariant={value!r} must be True, False or None "
                    f"(None: the PYBLASGEMM_INVARIANT setting)")


def check_forced_backend(routine: str, backend: str | None, xp: str) -> None:
    """:func:`check_backend_place` for the backend a call runs under: ``backend=`` (checked by
    :func:`check_backend`) or, without it, ``PYBLASGEMM_BACKEND`` (named as such). For routes
    that do not reach the planner, which checks the same."""
    if backend is not None:
        check_backend_place(routine, backend, xp)
        return
    check_backend_place(routine, current_settings().backend, xp, name="PYBLASGEMM_BACKEND")
