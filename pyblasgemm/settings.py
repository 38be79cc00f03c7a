"""Every ``PYBLASGEMM_*`` environment variable: one table, parsed and validated here only.

Environment variables are untrusted input. Each is read when it is first needed (never at
``import pyblasgemm``), and a bad value raises :class:`SettingError`, which names the
variable, the value and what is allowed. Unset, empty and all-blank mean "the default".
Booleans accept ``1/0``, ``true/false``, ``yes/no``, ``on/off`` in any case. The words a
choice variable allows come from the table that owns them (the backends, decompositions, arch
families, float32 compute modes), passed in by the caller: this module imports nothing of the
package, so it sits at the bottom of the import graph.

Example
-------
>>> import os
>>> from pyblasgemm import settings
>>> os.environ["PYBLASGEMM_PRINT_PLANS"] = "off"
>>> settings.get("PYBLASGEMM_PRINT_PLANS")
False
>>> os.environ["PYBLASGEMM_SPLITS"] = "1"
>>> settings.get("PYBLASGEMM_SPLITS")
Traceback (most recent call last):
    ...
pyblasgemm.settings.SettingError: PYBLASGEMM_SPLITS='1' is not allowed: an integer from 2 to 65535
>>> del os.environ["PYBLASGEMM_PRINT_PLANS"], os.environ["PYBLASGEMM_SPLITS"]
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["SettingError", "Variable", "VARIABLES", "get", "in_environment", "describe"]


#: the characters of a refused value an error message quotes (the environment is untrusted
#: input: a value of any length, with control characters, is quoted escaped and clipped)
SHOWN_CHARS = 64


def shown(value: str) -> str:
    """``value`` as an error message quotes it: its ``repr`` (control characters escaped), the
    first :data:`SHOWN_CHARS` characters of a longer one and its length.

    >>> shown("tf32"), shown("x" * 100)[-24:]
    ("'tf32'", "xxx'... (100 characters)")
    """
    if len(value) <= SHOWN_CHARS:
        return repr(value)
    return f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"


class SettingError(ValueError):
    """A ``PYBLASGEMM_*`` variable holds a value that is not allowed: the message names the
    variable, the value (:func:`shown`) and what is allowed; ``.value`` holds it whole."""

    def __init__(self, name: str, value: str, allowed: str):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={shown(value)} is not allowed: {allowed}")


@dataclass(frozen=True)
class Variable:
    """One environment variable: how its text becomes a value, and what it does."""

    name: str
    parse: Callable[[str], object]     # raises ValueError for a value that is not allowed
    default: object
    allowed: Callable[[], str]         # what is allowed, for the error message
    doc: str


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _boolean(text: str) -> bool:
    word = text.lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(text)


def _integer(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text, 10)          # ValueError for '2.5', '0x10', 'two'
        if not lo <= value <= hi:
            raise ValueError(text)
        return value
    return parse


def _text(text: str) -> str:
    return text


def _directory(text: str) -> Path:
    return Path(text).expanduser()


#: the plan cache's largest size: an entry costs ~1-10 KiB of host memory, so 10**6 is ~GBs
MAX_CACHE_ENTRIES = 10**6

#: a disk cache's largest cap in MiB (1 TiB)
MAX_CACHE_MB = 1 << 20

#: splits run along gridDim.y/z, whose hardware limit is 65535 (kernels/config.py)
MAX_SPLITS = 65535


def _bool_var(name: str, doc: str) -> Variable:
    return Variable(name, _boolean, False, lambda: "one of 1/0, true/false, yes/no, on/off", doc)


def _choice_var(name: str, owner: str, default, doc: str) -> Variable:
    # The words a choice variable allows live in the table that owns them (``owner``); the
    # caller passes them to get(), so this bottom module imports nothing of the package.
    return Variable(name, str.lower, default, lambda: f"one of {owner} (any case)", doc)


VARIABLES = {v.name: v for v in (
    _choice_var("PYBLASGEMM_BACKEND", "backends.BACKEND_NAMES or desc.BACKEND_ALIASES", "auto",
                "force a backend for every call without ``backend=``"),
    _choice_var("PYBLASGEMM_DECOMPOSITION", "kernels.config.DECOMPOSITIONS", None,
                "force our kernels' decomposition (other decompositions are not considered)"),
    Variable("PYBLASGEMM_SPLITS", _integer(2, MAX_SPLITS), None,
             lambda: f"an integer from 2 to {MAX_SPLITS}",
             "with a split-k decomposition: force the split count"),
    Variable("PYBLASGEMM_CONFIG", _text, None, lambda: "a kernel config name (KernelConfig.name)",
             "force one kernel config by name, e.g. ``hybrid_128x128x32_w2x2_s4_g8``"),
    _bool_var("PYBLASGEMM_PRINT_PLANS", "print ``Plan.explain()`` to stderr for every new plan"),
    _bool_var("PYBLASGEMM_NO_PLAN_CACHE", "do not memoize plans in memory (plan every call)"),
    Variable("PYBLASGEMM_PLAN_CACHE_SIZE", _integer(0, MAX_CACHE_ENTRIES), 1024,
             lambda: f"an integer from 0 to {MAX_CACHE_ENTRIES}",
             "entries the plan cache holds (plans, bound launches with their workspace, call "
             "signatures) before the least recently used go; 0 keeps none"),
    _bool_var("PYBLASGEMM_AUTOTUNE", "autotune every new problem on the GPU (as ``autotune=True``)"),
    _bool_var("PYBLASGEMM_INVARIANT",
              "batch-invariant results for every call without ``invariant=`` (each output row's "
              "bits independent of the other rows; see docs/guide/invariance.rst)"),
    _bool_var("PYBLASGEMM_NO_MEASURED_CHOICES",
              "ignore the measured-choice table: the cost model alone decides"),
    Variable("PYBLASGEMM_CACHE_DIR", _directory, None, lambda: "a directory path",
             "directory of the autotune cache (default ``$XDG_CACHE_HOME/pyblasgemm/``, "
             "else ``~/.cache/pyblasgemm/``); compiled sm_90a kernels go under ``kernels/`` there"),
    Variable("PYBLASGEMM_CACHE_MAX_MB", _integer(0, MAX_CACHE_MB), 1024,
             lambda: f"an integer from 0 to {MAX_CACHE_MB}",
             "MiB each disk cache (autotune winners, compiled kernels) keeps; after a write the "
             "oldest entries go (``python -m pyblasgemm cache info`` shows the sizes)"),
    _bool_var("PYBLASGEMM_NO_KERNEL_CACHE", "compile sm_90a kernels anew in every process"),
    _bool_var("PYBLASGEMM_NO_TUNE_CACHE", "neither read nor write autotuned winners on disk"),
    _choice_var("PYBLASGEMM_ARCH", "planner.arch.FAMILIES", None,
                "plan with that family's datasheet spec instead of the device's (default "
                "without a GPU: sm_90, the H100)"),
    _choice_var("PYBLASGEMM_FP32_COMPUTE", "the float32 compute modes or their aliases", "fp32",
                "default ``compute=`` of float32 problems (see ``set_default_compute``)"),
    Variable("PYBLASGEMM_RESULTS_DIR", _directory, None, lambda: "a directory path",
             "where ``bench`` writes its results without ``--out`` (default "
             "``$XDG_DATA_HOME/pyblasgemm/bench/``, else ``~/.local/share/pyblasgemm/bench/``)"),
)}


def get(name: str, options: tuple | None = None, aliases: dict | None = None):
    """The value of variable ``name`` as the environment holds it now (the default if unset).

    A choice variable (backend, decomposition, arch, float32 compute) is checked against
    ``options``, the words its owner's table allows; ``aliases`` (the owner's table of other
    words, ``{alias: word}``: the same one its ``backend=`` / ``compute=`` argument reads)
    maps an alias to its word. Raises :class:`SettingError` for a value that is not allowed,
    and KeyError for a name that is not in :data:`VARIABLES` (a typo in the code, not in the
    environment).

    Example
    -------
    >>> import os
    >>> os.environ["PYBLASGEMM_ARCH"] = "SM_80"
    >>> get("PYBLASGEMM_ARCH", ("sm_80", "sm_90"))
    'sm_80'
    >>> os.environ["PYBLASGEMM_BACKEND"] = "PyBlasGemm"
    >>> get("PYBLASGEMM_BACKEND", ("auto", "tensorcore"), {"pyblasgemm": "tensorcore"})
    'tensorcore'
    >>> del os.environ["PYBLASGEMM_ARCH"], os.environ["PYBLASGEMM_BACKEND"]
    """
    var = VARIABLES[name]
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return var.default
    try:
        value = var.parse(raw.strip())
    except ValueError:
        raise SettingError(name, raw, var.allowed()) from None
    if aliases:
        value = aliases.get(value, value)
    if options is not None and value not in options:
        allowed = "one of " + ", ".join(repr(o) for o in options)
        if aliases:
            allowed += ", or " + ", ".join(f"{a!r} ({w!r})" for a, w in aliases.items())
        raise SettingError(name, raw, allowed + " (any case)")
    return value


def in_environment() -> tuple[dict, list]:
    """({name: raw value} of the variables set now, [PYBLASGEMM_* names that are none of
    ours]): what ``python -m pyblasgemm info`` shows, so a misspelt name is seen.

    Example
    -------
    >>> import os
    >>> os.environ["PYBLASGEMM_PRINT_PLAN"] = "1"          # misspelt: PRINT_PLANS
    >>> in_environment()[1]
    ['PYBLASGEMM_PRINT_PLAN']
    >>> del os.environ["PYBLASGEMM_PRINT_PLAN"]
    """
    ours = {k: v for k, v in sorted(os.environ.items()) if k.startswith("PYBLASGEMM_")}
    return ({k: v for k, v in ours.items() if k in VARIABLES},
            [k for k in ours if k not in VARIABLES])


def describe() -> str:
    """Every variable with what it allows and does (the CLI's ``info`` and the docs).

    Example
    -------
    >>> print(describe().splitlines()[0])
    PYBLASGEMM_BACKEND: one of backends.BACKEND_NAMES or desc.BACKEND_ALIASES (any case); default 'auto'
    """
    lines = []
    for v in VARIABLES.values():
        lines.append(f"{v.name}: {v.allowed()}; default {v.default!r}")
        lines.append(f"    {v.doc}")
    return "\n".join(lines)


#: where no XDG variable is set, the platforms' own folders (platformdirs' choices for an app
#: without an author) below the home folder (Windows: %LOCALAPPDATA%): (cache, data)
_PLATFORM_HOMES = {
    "darwin": (("Library", "Caches", "pyblasgemm"),
               ("Library", "Application Support", "pyblasgemm")),
    "win32": (("pyblasgemm", "Cache"), ("pyblasgemm",)),
}


def app_home(variable: str, which: int, *xdg_default: str) -> Path:
    """``$variable/pyblasgemm`` when the XDG variable is an absolute path (on every platform: the
    user asked for it), else the platform's folder (``_PLATFORM_HOMES``; ``which``: 0 cache,
    1 data), else XDG's default below ``~`` (Linux and the rest)."""
    own = _PLATFORM_HOMES.get(sys.platform)
    if own is None or os.path.isabs(os.environ.get(variable, "")):
        return xdg_home(variable, *xdg_default) / "pyblasgemm"
    base = Path.home()
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA", "")
        base = Path(local) if os.path.isabs(local) else base / "AppData" / "Local"
    return base.joinpath(*own[which])


def xdg_home(variable: str, *default: str) -> Path:
    """An XDG base directory: ``$XDG_CACHE_HOME`` / ``$XDG_DATA_HOME`` (``variable``) when it is
    an absolute path (the spec ignores a relative one), else ``~`` joined with ``default``.

    >>> xdg_home("XDG_NOT_SET_ANYWHERE", ".cache") == Path.home() / ".cache"
    True
    """
    value = os.environ.get(variable, "")
    return Path(value) if os.path.isabs(value) else Path.home().joinpath(*default)
