"""Every ``PYBLASGEMM_*`` environment variable: one table, parsed and validated here only.

Environment variables are untrusted input. Each is read when it is first needed (never at
``import pyblasgemm``), and a bad value raises :class:`SettingError`, which names the
variable, the value and what is allowed. Unset, empty and all-blank mean "the default".
Booleans accept ``1/0``, ``true/false``, ``yes/no``, ``on/off`` in any case.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["SettingError", "Variable", "VARIABLES", "get", "describe"]


class SettingError(ValueError):
    """A ``PYBLASGEMM_*`` variable holds a value that is not allowed."""

    def __init__(self, name: str, value: str, allowed: str):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r} is not allowed: {allowed}")


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


# The allowed words of the choice variables live in the tables that own them; they are looked
# up when a value is parsed (importing them here would make this bottom module import the
# planner and the kernels, which import it).
def _backends() -> tuple:
    from .backends import BACKEND_NAMES
    return BACKEND_NAMES


def _decompositions() -> tuple:
    from .kernels.config import DECOMPOSITIONS
    return DECOMPOSITIONS


def _families() -> tuple:
    from .planner.arch import FAMILIES
    return tuple(FAMILIES)


def _fp32_computes() -> tuple:
    from ._types import TYPE_ROWS
    return TYPE_ROWS["s"].computes


#: splits run along gridDim.y/z, whose hardware limit is 65535 (kernels/config.py)
MAX_SPLITS = 65535


def _bool_var(name: str, doc: str) -> Variable:
    return Variable(name, _boolean, False, lambda: "one of 1/0, true/false, yes/no, on/off", doc)


def _choice_var(name: str, options: Callable[[], tuple], default, doc: str) -> Variable:
    def parse(text: str) -> str:
        word = text.lower()
        if word not in options():
            raise ValueError(text)
        return word
    return Variable(name, parse, default,
                    lambda: "one of " + ", ".join(repr(o) for o in options()) + " (any case)", doc)


VARIABLES = {v.name: v for v in (
    _choice_var("PYBLASGEMM_BACKEND", _backends, "auto",
                "force a backend for every call without ``backend=``"),
    _choice_var("PYBLASGEMM_DECOMPOSITION", _decompositions, None,
                "force our kernels' decomposition (other decompositions are not considered)"),
    Variable("PYBLASGEMM_SPLITS", _integer(2, MAX_SPLITS), None,
             lambda: f"an integer from 2 to {MAX_SPLITS}",
             "with a split-k decomposition: force the split count"),
    Variable("PYBLASGEMM_CONFIG", _text, None, lambda: "a kernel config name (KernelConfig.name)",
             "force one kernel config by name, e.g. ``hybrid_128x128x32_w2x2_s4_g8``"),
    _bool_var("PYBLASGEMM_PRINT_PLANS", "print ``Plan.explain()`` to stderr for every new plan"),
    _bool_var("PYBLASGEMM_NO_PLAN_CACHE", "do not memoize plans in memory (plan every call)"),
    _bool_var("PYBLASGEMM_AUTOTUNE", "autotune every new problem on the GPU (as ``autotune=True``)"),
    _bool_var("PYBLASGEMM_NO_MEASURED_CHOICES",
              "ignore the measured-choice table: the cost model alone decides"),
    Variable("PYBLASGEMM_CACHE_DIR", _directory, None, lambda: "a directory path",
             "directory of the autotune cache (default ``~/.cache/pyblasgemm/``); compiled "
             "sm_90a kernels go under ``kernels/`` there"),
    _bool_var("PYBLASGEMM_NO_KERNEL_CACHE", "compile sm_90a kernels anew in every process"),
    _bool_var("PYBLASGEMM_NO_TUNE_CACHE", "neither read nor write autotuned winners on disk"),
    _choice_var("PYBLASGEMM_ARCH", _families, None,
                "plan with that family's datasheet spec instead of the device's (default "
                "without a GPU: sm_90, the H100)"),
    _choice_var("PYBLASGEMM_FP32_COMPUTE", _fp32_computes, "fp32",
                "default ``compute=`` of float32 problems (see ``set_default_compute``)"),
)}


def get(name: str):
    """The value of variable ``name`` as the environment holds it now (the default if unset).

    Raises :class:`SettingError` for a value that is not allowed, and KeyError for a name
    that is not in :data:`VARIABLES` (a typo in the code, not in the environment).
    """
    var = VARIABLES[name]
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return var.default
    try:
        return var.parse(raw.strip())
    except ValueError:
        raise SettingError(name, raw, var.allowed()) from None


def describe() -> str:
    """Every variable with what it allows and does (the CLI's ``info`` and the docs).

    Example
    -------
    >>> print(describe().splitlines()[0])
    PYBLASGEMM_BACKEND: one of 'auto', 'tensorcore', 'cublas', 'host' (any case); default 'auto'
    """
    lines = []
    for v in VARIABLES.values():
        lines.append(f"{v.name}: {v.allowed()}; default {v.default!r}")
        lines.append(f"    {v.doc}")
    return "\n".join(lines)
