"""Measured choices: the fastest implementation per problem, as timed on one GPU.

The cost model (:mod:`pyblasgemm.planner.model`) generalises, but it mis-ranks some problems
by more than the 5 % that matter (small squares, decode shapes, long K, near-ties). So, like
cuBLAS's shipped heuristics tables and an autotuner's pre-seeded cache, the planner also
consults a table of *measured* choices, ``choices_sm90_h100.json``: for each problem of the
public shape suite, the implementation that ran fastest in ``bench/bench_planner.py`` runs on an
H100 (cuBLAS, or one of our kernel configs by name), with its time, the runner-up and the times
of every implementation timed there. It is derived by
``python tools/calibrate.py --choices <planner run JSON> [...]``
(``derive_choices`` there).

:func:`lookup` is the rule for when an entry applies (a pure function of the table, the
problem's facts and the :class:`~pyblasgemm.planner.arch.ArchSpec`); the planner
(:mod:`pyblasgemm.planner.core`) then takes the entry's implementation if it is valid for the
exact problem. ``PYBLASGEMM_NO_MEASURED_CHOICES=1`` turns the table off.

The table file is untrusted input (it may be edited, or passed by path): :func:`load_choices`
checks the shape and types of everything :func:`lookup` reads, and a file that is unreadable
(a FIFO, a device, a directory, over :data:`~pyblasgemm._files.DOCUMENT_BYTES`: never read),
not JSON or of the wrong shape is ignored with one :class:`ChoicesWarning` naming the file and
the reason; the cost model then decides.
"""
from __future__ import annotations

import functools
import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .._files import DOCUMENT_BYTES, read_regular
from .._warnings import PyblasgemmWarning, log
from ._checks import describe, is_int, why_not_dict, why_not_number, why_not_numbers
from .arch import ArchSpec

__all__ = ["CHOICES_FILE", "ChoicesWarning", "MeasuredChoice", "load_choices", "lookup", "choice_for_desc",
           "NEAR_FACTOR", "LAYOUT_FREE_KINDS"]

#: the shipped table (bench/results/planner_sm90_h100_*.json on an H100 SXM)
CHOICES_FILE = Path(__file__).resolve().parent / "choices_sm90_h100.json"

#: an entry applies to problems whose m, n and k are each within this factor of the measured
#: shape: close enough that tile counts, waves and the K loop change by at most ~10 %
NEAR_FACTOR = 1.1

#: kinds for which the measured layout does not matter: the Hopper kernel's wgmma reads K- and
#: MN-major 16-bit operands from shared memory alike, and cuBLAS has native kernels for every
#: 16-bit layout. int8 is different (wgmma reads K-major int8 only: other layouts run other
#: kernels of ours, and cuBLAS rearranges the operands first), so other kinds need the layout
#: that was measured.
#: 3xTF32 too: on the Hopper kernel a prep kernel writes every layout K-major, and the mma.sync
#: kernel reads all four layouts through the same tile loads.
LAYOUT_FREE_KINDS = frozenset({"f16", "bf16", "3xtf32"})


@dataclass(frozen=True)
class MeasuredChoice:
    """One entry of the table: at ``m x n x k`` of ``kind`` / ``compute``, ``impl`` ('cublas' or
    a kernel config name) measured fastest, in ``time_s`` (median over the source runs)."""

    kind: str
    compute: str
    m: int
    n: int
    k: int
    align: int                 # byte alignment of the measured problem (make_desc's rule)
    impl: str
    time_s: float
    runner_up: str | None
    runner_up_s: float | None
    times: dict = field(compare=False, repr=False)   # every implementation timed: median s
    device: str = ""
    sources: tuple = ()
    cublas_tolerance: float = 0.0    # cuBLAS was preferred within this fraction of the fastest

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def time_of(self, impl: str) -> float | None:
        """The measured time of ``impl`` at this shape, or None if it was not timed."""
        return self.times.get(impl)


class ChoicesWarning(PyblasgemmWarning):
    """A measured-choice table could not be read or has the wrong shape; it is ignored (the
    cost model decides)."""


_CC = re.compile(r"\d+\.\d+")


def _why_invalid_entry(e) -> str | None:
    """Why one entry of ``entries`` is unusable (what :func:`lookup` and the planner read)."""
    why = why_not_dict(e, "it")
    if why:
        return why
    for key in ("kind", "compute", "impl"):
        if not isinstance(e.get(key), str):
            return f"{key} is {describe(e.get(key))}, not a string"
    for key in ("m", "n", "k", "align"):
        if not is_int(e.get(key), positive=True):
            return f"{key} is {describe(e.get(key))}, not a positive integer"
    why = why_not_number(e.get("time_s"), "time_s", positive=True)
    if why:
        return why
    if e.get("runner_up") is not None or e.get("runner_up_s") is not None:
        if not isinstance(e.get("runner_up"), str):
            return f"runner_up is {describe(e.get('runner_up'))}, not a string or null"
        why = why_not_number(e.get("runner_up_s"), "runner_up_s", positive=True)
        if why:
            return why
    why = why_not_numbers(e.get("times"), "times", positive=True)
    if why:
        return why
    if not e["times"]:
        return "times is empty"
    return None


def _why_invalid_table(table) -> str | None:
    """Why a loaded table is unusable, or None. Checks the keys and types :func:`lookup` and
    the planner read: ``device`` {name, cc 'X.Y', sm_count}, ``layout``, ``sources``,
    ``cublas_tolerance`` (optional) and every entry."""
    why = why_not_dict(table, "the table")
    if why:
        return why
    missing = [k for k in ("device", "layout", "entries", "sources") if k not in table]
    if missing:
        return f"no {', '.join(map(repr, missing))}"
    dev = table["device"]
    why = why_not_dict(dev, "device")
    if why:
        return why
    if not isinstance(dev.get("name"), str):
        return f"device name is {describe(dev.get('name'))}, not a string"
    if not isinstance(dev.get("cc"), str) or not _CC.fullmatch(dev["cc"]):
        return f"device cc is {describe(dev.get('cc'))}, not a string such as '9.0'"
    if not is_int(dev.get("sm_count"), positive=True):
        return f"device sm_count is {describe(dev.get('sm_count'))}, not a positive integer"
    if not isinstance(table["layout"], str):
        return f"layout is {describe(table['layout'])}, not a string such as 'TN'"
    if not isinstance(table["sources"], list) or not all(isinstance(x, str) for x in table["sources"]):
        return "sources is not a list of file names"
    if "cublas_tolerance" in table:
        why = why_not_number(table["cublas_tolerance"], "cublas_tolerance")
        if why:
            return why
    if not isinstance(table["entries"], list):
        return f"entries is {describe(table['entries'])}, not a list"
    for i, e in enumerate(table["entries"]):
        why = _why_invalid_entry(e)
        if why:
            return f"entries[{i}]: {why}"
    return None


@functools.lru_cache(maxsize=4)
def _read(path: str) -> dict | None:
    """The checked table at ``path``; None when there is none (silently) or it is unusable
    (one :class:`ChoicesWarning`; cached, so once per file and process)."""
    try:
        table = json.loads(read_regular(path, DOCUMENT_BYTES))
    except FileNotFoundError:
        return None
    except OSError as exc:     # also RefusedFile: a FIFO, a device, a directory, too large
        why = f"cannot read it ({exc.strerror or exc})"
    except (ValueError, RecursionError) as exc:
        why = f"not JSON ({str(exc)[:120]})"
    else:
        why = _why_invalid_table(table)
        if why is None:
            return table
    # stacklevel: past _read (lru_cache adds no Python frame) and load_choices
    message = f"ignoring the measured-choice table {path}: {why}; the cost model decides"
    log.info("%s", message)
    warnings.warn(f"pyblasgemm: {message}", ChoicesWarning, stacklevel=3)
    return None


def load_choices(path=None) -> dict | None:
    """The table as a dict (the shipped file unless ``path``), or None when there is none, or
    when the file is unreadable, not JSON or of the wrong shape (then one
    :class:`ChoicesWarning` naming the file and the reason: the cost model decides).

    Example::

        >>> load_choices()["device"]["name"]
        'NVIDIA H100 80GB HBM3'
        >>> import os, tempfile, warnings
        >>> bad = os.path.join(tempfile.mkdtemp(), "choices.json")
        >>> with open(bad, "w") as f:
        ...     _ = f.write('{"device": [], "layout": "TN", "entries": [], "sources": []}')
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     print(load_choices(bad), caught[0].category.__name__)
        None ChoicesWarning
    """
    return _read(str(path or CHOICES_FILE))


def _cc(text: str) -> tuple:
    major, minor = str(text).split(".")
    return int(major), int(minor)


def lookup(table: dict | None, arch: ArchSpec, *, kind: str | None, compute: str, transa: str,
           transb: str, m: int, n: int, k: int, batch: int = 1, align: int = 16):
    """The table entry that applies to this problem on ``arch``, or None.

    An entry applies when all of these hold:

    * ``arch`` is the measured device: the same compute capability and SM count (the datasheet
      H100 spec, ``arch='sm_90'``, matches an H100 SXM table; an A100 or an H100 PCIe with
      114 SMs does not), and, for a spec read from a GPU, the same device name (an H200 also
      has 132 SMs, but other memory and clocks);
    * ``batch == 1`` (the runs timed single GEMMs);
    * the same kind and compute mode, and the same byte ``align``\\ ment class as the measured
      problem (leading dimensions decide whether the TMA / vectorized paths run at all);
    * for int8 (any kind outside :data:`LAYOUT_FREE_KINDS`), the measured layout;
    * each of m, n, k within :data:`NEAR_FACTOR` of the measured shape; of several such
      entries, the nearest in log distance.

    Example::

        >>> from pyblasgemm.planner.arch import FAMILIES
        >>> table = load_choices()
        >>> e = lookup(table, FAMILIES["sm_90"], kind="f16", compute="fp32", transa="T",
        ...            transb="N", m=136, n=4000, k=4096)
        >>> e.shape                                  # the nearest measured shape
        '128x4096x4096'
        >>> lookup(table, FAMILIES["sm_80"], kind="f16", compute="fp32", transa="T",
        ...        transb="N", m=128, n=4096, k=4096) is None       # another GPU
        True
    """
    if not table or kind is None or batch != 1:
        return None
    dev = table["device"]
    # the measured choices hold for the measured chip: same architecture and SM count
    if tuple(arch.cc) != _cc(dev["cc"]) or arch.sm_count != dev["sm_count"] or (
            arch.from_device and arch.name != dev["name"]):
        return None
    layout = table["layout"]
    if kind not in LAYOUT_FREE_KINDS and transa + transb != layout:
        return None
    limit = math.log(NEAR_FACTOR) + 1e-12
    best, best_d = None, math.inf
    for e in table["entries"]:
        if e["kind"] != kind or e["compute"] != compute or e["align"] != align:
            continue
        logs = [abs(math.log(q / s)) for q, s in ((m, e["m"]), (n, e["n"]), (k, e["k"]))]
        if max(logs) > limit:
            continue
        d = math.sqrt(sum(x * x for x in logs))
        if d < best_d:            # ties: the first in the table (deterministic)
            best, best_d = e, d
    if best is None:
        return None
    return MeasuredChoice(best["kind"], best["compute"], best["m"], best["n"], best["k"],
                          best["align"], best["impl"], best["time_s"], best["runner_up"],
                          best["runner_up_s"], dict(best["times"]), dev["name"],
                          tuple(table["sources"]), table.get("cublas_tolerance", 0.0))


def choice_for_desc(desc, arch: ArchSpec, table: dict | None = None):
    """:func:`lookup` for a ``GemmDesc`` (the shipped table unless ``table``).

    Example::

        >>> from pyblasgemm.planner import FAMILIES, make_desc
        >>> choice_for_desc(make_desc(128, 4096, 4096, "f16", transa="T"), FAMILIES["sm_90"]).impl
        'sm90a_sliced_128x64x64_w1x1_s8_g8'
    """
    from .problem import kind_of

    return lookup(load_choices() if table is None else table, arch, kind=kind_of(desc),
                  compute=desc.compute, transa=desc.transa, transb=desc.transb, m=desc.m,
                  n=desc.n, k=desc.k, batch=desc.batch, align=desc.align)
