"""The planner's verdicts: a :class:`Candidate` per option considered, and the :class:`Plan`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..desc import GemmDesc
from ..kernels.config import KernelConfig
from . import model as M
from .arch import ArchSpec

__all__ = ["Candidate", "Plan", "RouteOption", "Route"]


@dataclass(frozen=True)
class Candidate:
    """One scored (or rejected) option: our kernels with ``config``, or cuBLAS (config None)."""

    backend: str
    config: KernelConfig | None
    score: M.Score | None          # None when rejected
    rejected: str = ""             # the constraint that failed
    calibrated: bool = True        # the tile's efficiency was measured (else extrapolated)
    pack: tuple = ()               # operands copied into aligned storage first ('a', 'b')

    @property
    def label(self) -> str:
        name = self.config.name if self.config is not None else self.backend
        return name + "+pack_" + "".join(self.pack) if self.pack else name

    @property
    def time(self) -> float:
        return self.score.time if self.score is not None else float("inf")


class RouteOption(NamedTuple):
    """One way to run a problem's epilogue or group, priced by the model or rejected."""

    kind: str                   # epilogue: 'ours', 'cublaslt', 'unfused'; group: 'one launch', 'loop'
    label: str                  # e.g. 'fused in our kernel hybrid_128x128x32_w2x2_s4_g8'
    time: float | None          # predicted seconds (host + GPU); None: rejected
    note: str = ""              # why rejected, or what the time includes
    candidate: object = None    # the Candidate of ours it runs (an epilogue fused in another config)


class Route(NamedTuple):
    """The route a plan takes for its problem's epilogue (``Plan.epilogue``) or group
    (``Plan.group``): the options it was chosen from, and the one line a call reports
    (:func:`pyblasgemm.epilogue.last_route`)."""

    kind: str                   # the chosen option's kind
    line: str                   # how it runs, in one line
    reason: str                 # why this option
    options: tuple = ()         # RouteOption, in the order considered
    code: int = 0               # what binds it: cuBLASLt's epilogue code for 'cublaslt'
    launch_key: tuple = ()      # a group's launch class (its plan-cache key: one launch per class)

    def explain_lines(self, what: str) -> list:
        lines = [f"{what}: {self.line}", f"      why: {self.reason}"]
        for o in self.options:
            mark = "*" if o.kind == self.kind and o.time is not None else " "
            t = f"{o.time * 1e6:9.1f}u" if o.time is not None else "  rejected"
            lines.append(f"    {mark} {o.label:52} {t}" + (f"  {o.note}" if o.note else ""))
        return lines


@dataclass(frozen=True)
class Plan:
    """The decision for one problem: backend, kernel config, decomposition, grid, workspace,
    predicted time, and the candidates it was chosen from (``explain()`` prints them).

    Example::

        >>> import pyblasgemm
        >>> p = pyblasgemm.plan(4096, 4096, 4096, "float16")
        >>> p.backend
        'cublas'
        >>> p2 = pyblasgemm.plan(4096, 4096, 4096, "float32", compute="3xtf32")
        >>> (p2.backend, p2.decomposition)        # doctest: +SKIP
        ('tensorcore', 'sliced')
    """

    backend: str
    reason: str
    config: object = None              # our kernels: a KernelConfig; else None
    decomposition: str | None = None
    splits: int = 1
    grid: tuple = ()
    workspace_bytes: int = 0
    predicted_s: float | None = None
    source: str = "heuristic"          # 'heuristic', 'measured', 'autotune', 'forced', 'host'
    arch: ArchSpec | None = field(default=None, compare=False)
    problem: GemmDesc | None = field(default=None, compare=False, repr=False)
    candidates: tuple = field(default=(), compare=False, repr=False)
    #: our kernels: the LaunchSpec the launch is bound from (grid, block, shared memory,
    #: workspace, splits, kernel argument values; kernels/spec.py); grid, splits and
    #: workspace_bytes above are its numbers. None for cuBLAS and the host.
    launch: object = field(default=None, compare=False, repr=False)
    #: operands ('a', 'b') our kernels copy into 16-byte pitched storage before the GEMM
    #: (kernels/pack.py); the launch spec is the packed problem's
    pack: tuple = ()
    #: the route of the problem's epilogue (a :class:`Route`: fused in our kernel's store, in
    #: cuBLASLt's epilogue, or unfused), None without one
    epilogue: Route | None = field(default=None, compare=False)
    #: the route of a grouped problem (a :class:`Route`: one persistent launch or a loop)
    group: Route | None = field(default=None, compare=False)

    def explain(self, limit: int = 12) -> str:
        """A readable report: the problem, the arch spec, the scored candidates (best first,
        ``limit`` of them; 0 = all) with waves, last-wave utilisation and predicted time, the
        rejected ones with their reason, and why the winner won.
        """
        lines = []
        d = self.problem
        if d is not None:
            batch = f", batch {d.batch}" if d.batch != 1 else ""
            types = d.row.ab_dtype.name
            if d.row.c_dtype != d.row.ab_dtype:
                types += f" -> {d.row.c_dtype.name}"
            if d.group is not None:
                lines.append(f"problem: {d.routine} {types} compute={d.compute}, "
                             f"{len(d.group.sizes)} problems ({d.group.live} not empty) of up to "
                             f"m={d.m} n={d.n} k={d.k} (the {d.group.form} form), {d.xp} device {d.device}")
            else:
                lines.append(f"problem: {d.routine} {types} compute={d.compute} "
                             f"{d.transa}{d.transb} m={d.m} n={d.n} k={d.k} lda={d.lda} ldb={d.ldb} "
                             f"ldc={d.ldc}{batch}, {d.align}-byte aligned, {d.xp} device {d.device}")
            if d.epilogue is not None:
                lines.append(f"epilogue: {d.epilogue.describe()}")
        if self.arch is not None:
            lines.append(f"arch: {self.arch.short()}")
        cfg = f" config {self.config.name}" if isinstance(self.config, KernelConfig) else ""
        pred = f", predicted {self.predicted_s * 1e6:.1f} us" if self.predicted_s else ""
        lines.append(f"plan: backend {self.backend!r}{cfg}{pred} [{self.source}]")
        if self.backend == "tensorcore" and self.grid:
            lines.append(f"      decomposition {self.decomposition}, splits {self.splits}, grid "
                         f"{self.grid}, workspace {self.workspace_bytes} B")
        if self.pack:
            lines.append(f"      packs {' and '.join(x.upper() for x in self.pack)} into 16-byte "
                         f"pitched storage first (its leading dimension keeps TMA and cp.async off)")
        lines.append(f"why: {self.reason}")
        if hasattr(self.launch, "explain_lines"):        # a composite route's inner GEMM
            lines.extend(self.launch.explain_lines())
        if self.epilogue is not None:
            lines.extend(self.epilogue.explain_lines("epilogue route"))
        if self.group is not None:
            lines.extend(self.group.explain_lines("group route"))
        scored = sorted((c for c in self.candidates if c.score is not None), key=lambda c: c.time)
        if scored:
            shown = scored if not limit else scored[:limit]
            w = max([44] + [len(c.label) for c in shown])      # long names keep the columns
            lines.append(f"candidates ({len(scored)} scored, best first; times = host + GPU):")
            lines.append(f"  {'candidate':{w}} {'waves':>6} {'last':>5} {'occ':>3} {'compute':>9} "
                         f"{'fixup':>8} {'memory':>8} {'predicted':>10}")
            for c in shown:
                s = c.score
                mark = "*" if (c.backend == self.backend and c.config == self.config) else " "
                cal = "" if c.calibrated else "  (tile rate extrapolated)"
                note = f"  {s.note}" if s.note else ""
                lines.append(f"{mark} {c.label:{w}} {s.waves:6.2f} {s.last_wave_util:5.2f} "
                             f"{s.occupancy:3d} {s.compute * 1e6:8.1f}u {s.fixup * 1e6:7.1f}u "
                             f"{s.memory * 1e6:7.1f}u {s.time * 1e6:9.1f}u{cal}{note}")
            if limit and len(scored) > limit:
                lines.append(f"  ... {len(scored) - limit} more (explain(limit=0) shows all)")
        rejected = [c for c in self.candidates if c.score is None]
        if rejected:
            lines.append(f"rejected ({len(rejected)}):")
            for c in rejected:
                lines.append(f"  {c.label:44} {c.rejected}")
        return "\n".join(lines)

    def __str__(self) -> str:
        cfg = f" {self.config.name}" if isinstance(self.config, KernelConfig) else ""
        return f"Plan({self.backend}{cfg})"

    def __repr__(self) -> str:
        """One line: the backend, our kernel's config and decomposition (splits when > 1), the
        source and the predicted time; ``explain()`` has the rest (the dataclass's repr was a
        many-line dump of every candidate's config).

        >>> import pyblasgemm
        >>> pyblasgemm.plan(64, 64, 64, "f64", backend="cublas")       # doctest: +ELLIPSIS
        Plan(backend='cublas', source='forced'...)
        """
        parts = [f"backend={self.backend!r}"]
        if isinstance(self.config, KernelConfig):
            parts.append(f"config={self.config.name!r}")
        if self.decomposition is not None:
            parts.append(f"decomposition={self.decomposition!r}")
        if self.splits != 1:
            parts.append(f"splits={self.splits}")
        if self.pack:
            parts.append(f"pack={self.pack!r}")
        parts.append(f"source={self.source!r}")
        if self.predicted_s:
            parts.append(f"predicted_us={self.predicted_s * 1e6:.1f}")
        return f"Plan({', '.join(parts)})"
