"""Shape and type checks for what the planner reads from disk (caches and shipped tables).

Files on disk are untrusted input: a hand edit, a half-synced home directory or another
version of the package can leave valid JSON of the wrong shape. The readers check what they
use with these helpers and say why a file is unusable (a reason string, None when fine).

Example::

    >>> is_number(1e-5), is_number(True), is_number(float("nan")), is_number(-1.0)
    (True, False, False, False)
    >>> why_not_numbers({"a": 1.0, "b": "x"}, "timings")
    "timings['b'] is the string 'x', not a number >= 0"
"""
from __future__ import annotations

import math

__all__ = ["is_number", "is_int", "describe", "why_not_number", "why_not_numbers", "why_not_dict"]


def is_number(x, *, positive: bool = False) -> bool:
    """A finite int or float, >= 0 (> 0 with ``positive``); a bool is not a number here."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return math.isfinite(x) and (x > 0 if positive else x >= 0)


def is_int(x, *, positive: bool = False) -> bool:
    """An int (not a bool), >= 0 (> 0 with ``positive``)."""
    return isinstance(x, int) and not isinstance(x, bool) and (x > 0 if positive else x >= 0)


def describe(x) -> str:
    """What ``x`` is, for a message: 'null', 'a list', "the string 'x'", 'the number nan'."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return f"the boolean {str(x).lower()}"
    if isinstance(x, str):
        return f"the string {x[:60]!r}"
    if isinstance(x, (int, float)):
        return f"the number {x!r}"
    return {dict: "an object", list: "a list"}.get(type(x), f"a {type(x).__name__}")


def why_not_number(x, where: str, *, positive: bool = False) -> str | None:
    """None if ``x`` is a number (see :func:`is_number`), else the reason naming ``where``."""
    if is_number(x, positive=positive):
        return None
    return f"{where} is {describe(x)}, not a number {'> 0' if positive else '>= 0'}"


def why_not_dict(x, where: str) -> str | None:
    """None if ``x`` is a JSON object (dict), else the reason naming ``where``."""
    return None if isinstance(x, dict) else f"{where} is {describe(x)}, not an object"


def why_not_numbers(x, where: str, *, positive: bool = False) -> str | None:
    """None if ``x`` is a dict of string keys to numbers, else the reason naming ``where``."""
    why = why_not_dict(x, where)
    if why:
        return why
    for k, v in x.items():
        why = why_not_number(v, f"{where}[{k!r}]", positive=positive)
        if why:
            return why
    return None
