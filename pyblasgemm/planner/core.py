"""Plan, the heuristic pipeline and the in-memory plan cache.

Pipeline for one problem (a ``GemmDesc``): backend support (each backend's ``supports``) ->
candidate kernel configs x decompositions -> the constraint predicate
(:func:`~pyblasgemm.planner.model.check`, i.e. ``KernelConfig.validate``) -> the analytic score
of every valid candidate and of cuBLAS -> the winner -> a frozen :class:`Plan`. Memoized per
problem key (which includes the device and excludes alpha and beta).

Precedence of the winner ('auto'): a stored autotune result, then the measured-choice table
(:mod:`pyblasgemm.planner.measured`: the implementation measured fastest on this device at this
or a nearby shape, when it is valid for the problem), then the model. A forced backend,
decomposition, split count or config bypasses the table.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field, replace

from .. import settings as _env
from ..backends import BACKEND_NAMES, get_backend
from ..desc import GemmDesc
from ..kernels.config import DECOMPOSITIONS, KernelConfig
from . import model as M
from .arch import ArchSpec, arch_for_device
from .problem import kind_of

__all__ = ["Plan", "Candidate", "plan_for", "clear_plan_cache", "current_settings", "kernel_problem_for"]


# ---------------------------------------------------------------------------------------------
# Settings (PYBLASGEMM_* environment variables; re-read by clear_plan_cache)
# ---------------------------------------------------------------------------------------------

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


def _read_settings() -> Settings:
    """The planner's variables, validated by :mod:`pyblasgemm.settings` (a bad value raises
    ``SettingError`` naming the variable); the config name is checked against the kernels."""
    name = _env.get("PYBLASGEMM_CONFIG")
    try:
        cfg = M.parse_config_name(name) if name else None
    except ValueError as exc:
        raise _env.SettingError("PYBLASGEMM_CONFIG", name, str(exc)) from None
    return Settings(_env.get("PYBLASGEMM_BACKEND", BACKEND_NAMES),
                    not _env.get("PYBLASGEMM_NO_PLAN_CACHE"), _env.get("PYBLASGEMM_PRINT_PLANS"),
                    _env.get("PYBLASGEMM_DECOMPOSITION", DECOMPOSITIONS),
                    _env.get("PYBLASGEMM_SPLITS"), cfg, _env.get("PYBLASGEMM_AUTOTUNE"),
                    not _env.get("PYBLASGEMM_NO_MEASURED_CHOICES"))


_settings: Settings | None = None


def current_settings() -> Settings:
    """The planner's settings, read from the environment on first use (not at import) and
    kept until :func:`clear_plan_cache`."""
    global _settings
    s = _settings
    if s is None:
        s = _settings = _read_settings()
    return s


# ---------------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """One scored (or rejected) option: our kernels with ``config``, or cuBLAS (config None)."""

    backend: str
    config: KernelConfig | None
    score: M.Score | None          # None when rejected
    rejected: str = ""             # the constraint that failed
    calibrated: bool = True        # the tile's efficiency was measured (else extrapolated)

    @property
    def label(self) -> str:
        return self.config.name if self.config is not None else self.backend

    @property
    def time(self) -> float:
        return self.score.time if self.score is not None else float("inf")


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
            lines.append(f"problem: {d.routine} {types} compute={d.compute} "
                         f"{d.transa}{d.transb} m={d.m} n={d.n} k={d.k} lda={d.lda} ldb={d.ldb} "
                         f"ldc={d.ldc}{batch}, {d.align}-byte aligned, {d.xp} device {d.device}")
        if self.arch is not None:
            lines.append(f"arch: {self.arch.short()}")
        cfg = f" config {self.config.name}" if isinstance(self.config, KernelConfig) else ""
        pred = f", predicted {self.predicted_s * 1e6:.1f} us" if self.predicted_s else ""
        lines.append(f"plan: backend {self.backend!r}{cfg}{pred} [{self.source}]")
        if self.backend == "tensorcore" and self.grid:
            lines.append(f"      decomposition {self.decomposition}, splits {self.splits}, grid "
                         f"{self.grid}, workspace {self.workspace_bytes} B")
        lines.append(f"why: {self.reason}")
        scored = sorted((c for c in self.candidates if c.score is not None), key=lambda c: c.time)
        if scored:
            shown = scored if not limit else scored[:limit]
            lines.append(f"candidates ({len(scored)} scored, best first; times = host + GPU):")
            lines.append(f"  {'candidate':44} {'waves':>6} {'last':>5} {'occ':>3} {'compute':>9} "
                         f"{'fixup':>8} {'memory':>8} {'predicted':>10}")
            for c in shown:
                s = c.score
                mark = "*" if (c.backend == self.backend and c.config == self.config) else " "
                cal = "" if c.calibrated else "  (tile rate extrapolated)"
                note = f"  {s.note}" if s.note else ""
                lines.append(f"{mark} {c.label:44} {s.waves:6.2f} {s.last_wave_util:5.2f} "
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


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------

_plan_cache: dict = {}
_lock = threading.Lock()


def plan_for(desc: GemmDesc, backend: str | None = None, *, autotune: bool | None = None,
             arch: ArchSpec | None = None) -> Plan:
    """The plan for ``desc``; memoized on (problem key, requested backend).

    ``backend`` forces one (else ``PYBLASGEMM_BACKEND``, else 'auto'); ``autotune=True`` times
    the best candidates on the GPU once and persists the winner (see
    :func:`pyblasgemm.planner.tune`); ``arch`` plans for a given spec instead of the device's.
    A repeated call costs one dict lookup.

    Example::

        >>> from pyblasgemm.planner import plan_for
        >>> from pyblasgemm.planner.problem import make_desc
        >>> plan_for(make_desc(64, 64, 64, "float64", xp="numpy")).backend
        'host'
    """
    key = (desc.key, backend, autotune, arch if arch is None else arch.key)
    plan = _plan_cache.get(key)
    if plan is not None:
        return plan
    s = current_settings()
    tune = s.autotune if autotune is None else autotune
    plan = _choose(desc, backend or s.backend, arch, tune)
    if s.print_plans:
        print(plan.explain(), file=sys.stderr)
    if s.cache:
        with _lock:
            _plan_cache[key] = plan
    return plan


def clear_plan_cache() -> None:
    """Forget every memoized plan and re-read the ``PYBLASGEMM_*`` variables.

    Example::

        >>> import pyblasgemm
        >>> pyblasgemm.clear_plan_cache()
    """
    global _settings
    with _lock:
        _plan_cache.clear()
        _settings = None
    from .arch import _by_device
    _by_device.clear()


def kernel_problem_for(desc: GemmDesc):
    """Our kernels' ``KernelProblem`` for ``desc``; the pointers carry ``desc.align`` so the
    vectorized-copy and element-alignment rules see the real alignment."""
    from ..backends.tensorcore import kernel_problem

    p = desc.align
    # C of an element-aligned array is aligned to its element size at least (int32 C of int8)
    return kernel_problem(desc, p, p, max(p, desc.row.c_dtype.itemsize))


def _supports(name: str, desc: GemmDesc):
    try:
        module = get_backend(name)
    except ImportError as exc:
        return False, f"backend unavailable ({exc})"
    return module.supports(desc)


def _arch(desc: GemmDesc, arch: ArchSpec | None) -> ArchSpec:
    return arch if arch is not None else arch_for_device(desc.device)


def _split_choices(tiles: int, kt: int, slots: int) -> list[int]:
    want = {2, 3, 4, 6, 8, 12, 16, -(-slots // max(1, tiles)), -(-2 * slots // max(1, tiles))}
    return sorted(s for s in want if 2 <= s <= min(64, kt // 2))


def enumerate_candidates(desc: GemmDesc, arch: ArchSpec, cal: dict) -> list[Candidate]:
    """Every candidate config for our kernels on ``desc``, scored or rejected with the reason."""
    kind = kind_of(desc)
    prob = kernel_problem_for(desc)
    out = []
    settings = current_settings()
    forced = settings.config
    tiles_cfgs = [forced] if forced is not None else M.candidate_configs(kind, cal, arch)
    for base in tiles_cfgs:
        ok, why = M.check(replace(base, decomposition="sliced", splits=0), prob, arch)
        if not ok and forced is None:
            out.append(Candidate("tensorcore", base, None, why))
            continue
        if forced is None and base.is_sm90 and base.bm > max(64, 2 * desc.m):
            # Pruned, not impossible: the model prices a tile by its whole MMA work, but measured
            # (planner_sm90_h100_2026-11-22_run3.json) 192/256-wide tiles on m <= 128 ran 1.3-1.7x
            # slower than the best, worse than the model says.
            out.append(Candidate("tensorcore", base, None, f"tile width bm={base.bm} is more than twice "
                                 f"m={desc.m}: most of its MMA work would be padding"))
            continue
        occ = M.occupancy(base, kind, arch)
        tiles = -(-desc.m // base.bm) * -(-desc.n // base.bn) * desc.batch
        kt = -(-desc.k // base.bk)
        if forced is not None:
            variants = [forced]
        elif base.cluster > 1:
            variants = [base]      # clusters run the data-parallel schedule only
        else:
            variants = [base, replace(base, decomposition="hybrid"), replace(base, decomposition="streamk")]
            forced_splits = settings.splits
            for s in ([forced_splits] if forced_splits else _split_choices(tiles, kt, arch.sm_count * occ)):
                # serial chains longer than 8 rarely pay; the Hopper kernel's split-k is parallel
                if (s <= 8 or forced_splits) and not base.is_sm90:
                    variants.append(replace(base, decomposition="splitk_serial", splits=s))
                variants.append(replace(base, decomposition="splitk_parallel", splits=s))
        for cfg in variants:
            if settings.decomposition and cfg.decomposition != settings.decomposition:
                continue
            if settings.splits and cfg.decomposition.startswith("splitk") and cfg.splits != settings.splits:
                continue
            ok, why = M.check(cfg, prob, arch)
            if not ok:
                out.append(Candidate("tensorcore", cfg, None, why))
                continue
            _, calibrated = M.tile_efficiency(cfg, kind, cal)
            out.append(Candidate("tensorcore", cfg, M.score_ours(cfg, prob, arch, cal, occ), "",
                                 calibrated))
    return out


def best_of(cands) -> Candidate | None:
    """The fastest scored candidate; within 1% the simpler decomposition (sliced first)."""
    scored = [c for c in cands if c.score is not None]
    if not scored:
        return None
    t0 = min(c.time for c in scored)
    near = [c for c in scored if c.time <= t0 * (1 + M.TIE)]
    return min(near, key=lambda c: (M.SIMPLICITY.get(c.config.decomposition, 9)
                                    if c.config is not None else -1, c.time))


def _ours_plan(desc, arch, winner: Candidate, reason, cands, source="heuristic") -> Plan:
    s = winner.score
    return Plan("tensorcore", reason, winner.config, winner.config.decomposition, s.splits,
                s.grid, s.workspace_bytes, s.time, source, arch, desc, tuple(cands))


def _why_ours(winner: Candidate, cands) -> str:
    s = winner.score
    d = winner.config.decomposition
    if d == "sliced":
        slots = s.ctas / s.waves
        if s.waves >= 1:
            why = (f"sliced-k: {s.ctas} tiles fill {s.waves:.2f} waves of {slots:.0f} CTA slots "
                   f"(last wave {s.last_wave_util:.0%} full); sharing K would not pay for its fixup")
        else:
            why = (f"sliced-k: {s.ctas} tiles fill {s.waves:.0%} of the {slots:.0f} CTA slots, but "
                   f"K is short: split-k / stream-k fixups would cost more than they recover")
    elif d.startswith("splitk"):
        how = "serial (running sum passed along)" if d == "splitk_serial" else "parallel (reduce kernel)"
        why = (f"split-k {how} with {s.splits} splits: the output tiles alone fill only "
               f"{s.waves / s.splits:.2f} waves and K is long, so {s.splits} CTAs share each tile's K")
    else:
        name = "hybrid data-parallel + stream-k" if d == "hybrid" else "stream-k"
        sl = _sliced(winner, cands)
        if sl is not None and sl.score.waves < 1:
            what = (f"the output tiles fill only {sl.score.waves:.0%} of the GPU and K is long, so "
                    f"the K iterations of all tiles are spread over {s.ctas} persistent CTAs")
        else:
            what = f"a grid of {s.ctas} persistent CTAs evens out a badly quantized last wave"
        ref = ("sliced not valid" if sl is None else
               f"sliced would run {sl.score.waves:.2f} waves, last {sl.score.last_wave_util:.0%} "
               f"full, {sl.time / winner.time:.2f}x the time")
        why = f"{name}: {what} ({ref}); fixup {s.fixup * 1e6:.1f} us"
    others = sorted((c for c in cands if c.score is not None and c is not winner
                     and c.backend == winner.backend), key=lambda c: c.time)
    if others:
        why += f"; next best of ours {others[0].label} predicted {others[0].time / winner.time:.2f}x the time"
    return why


def _sliced(winner, cands):
    """The sliced candidate with the winner's tile shape, or None."""
    base = replace(winner.config, decomposition="sliced", splits=0)
    return next((c for c in cands if c.score is not None and c.config is not None
                 and c.config == base), None)


def _choose(desc: GemmDesc, requested: str, arch: ArchSpec | None, autotune: bool) -> Plan:
    on_host = desc.xp == "numpy"
    if requested == "auto" and on_host:
        return Plan("host", "NumPy arrays run on the host (NumPy/SciPy BLAS)", source="host",
                    problem=desc)
    if requested != "auto" and on_host != (requested == "host"):
        wanted = "NumPy" if requested == "host" else "CuPy"
        got = "NumPy" if on_host else "CuPy"
        raise ValueError(f"{desc.routine}: backend={requested!r} runs on {wanted} arrays, "
                         f"but the arrays are {got} arrays")
    if requested == "host":
        return Plan("host", "forced by backend= / PYBLASGEMM_BACKEND", source="forced", problem=desc)
    arch = _arch(desc, arch)
    cal = M.load_calibration()
    ours_ok, why_not_ours = _supports("tensorcore", desc)
    if ours_ok:
        # the backend asks without pointers; the kernels' rules with the real alignment
        from ..kernels.launch import supports as kernels_support

        ours_ok, why_not_ours = kernels_support(kernel_problem_for(desc))
    if ours_ok and arch.cc < (8, 0):
        ours_ok, why_not_ours = False, f"our kernels need sm_80+ (device is sm_{arch.cc[0]}{arch.cc[1]})"
    theirs_ok, why_not_theirs = _supports("cublas", desc)
    cands: list[Candidate] = []
    if ours_ok:
        cands = enumerate_candidates(desc, arch, cal)
    cublas_cand = None
    if theirs_ok:
        cublas_cand = Candidate("cublas", None, M.score_cublas(desc, arch, cal))
        cands.append(cublas_cand)
    elif ours_ok:
        cands.append(Candidate("cublas", None, None, why_not_theirs))
    ours_best = best_of(c for c in cands if c.backend == "tensorcore")
    if (requested in ("auto", "tensorcore") and not autotune and ours_ok
            and current_settings().config is None and current_settings().decomposition is None):
        from .autotune import lookup

        cached = lookup(desc, arch, cands, allow_cublas=requested == "auto")
        if cached is not None:
            return cached

    if requested == "cublas":
        if not theirs_ok:
            raise NotImplementedError(f"{desc.routine}: backend='cublas' cannot run this "
                                      f"problem: {why_not_theirs}")
        s = cublas_cand.score
        return Plan("cublas", "forced by backend= / PYBLASGEMM_BACKEND", None, None, 1, (), 0,
                    s.time, "forced", arch, desc, tuple(cands))
    if requested == "tensorcore":
        if not ours_ok:
            raise NotImplementedError(f"{desc.routine}: backend='tensorcore' cannot run this "
                                      f"problem: {why_not_ours}")
        if ours_best is None:
            raise NotImplementedError(f"{desc.routine}: backend='tensorcore': no kernel config is "
                                      f"valid for this problem: " + "; ".join(
                                          sorted({c.rejected for c in cands if c.rejected})))
        if autotune:
            return _autotuned(desc, arch, cands, ours_best, forced=True)
        vs = ""
        if cublas_cand is not None:
            vs = (f" (cuBLAS predicted {cublas_cand.time * 1e6:.1f} us, "
                  f"{ours_best.time / cublas_cand.time:.2f}x faster than this)"
                  if cublas_cand.time < ours_best.time else "")
        return _ours_plan(desc, arch, ours_best, "forced by backend= / PYBLASGEMM_BACKEND" + vs
                          + "; " + _why_ours(ours_best, cands), cands, "forced")
    # auto
    if ours_best is None and not theirs_ok:
        raise NotImplementedError(f"{desc.routine}: no GPU backend runs compute={desc.compute!r} "
                                  f"for this problem: tensorcore: {why_not_ours}; "
                                  f"cublas: {why_not_theirs}")
    if not autotune and _table_allowed():
        # after a stored autotune result (above), before the model: what was measured here
        measured = _measured_plan(desc, arch, cal, cands, ours_best, cublas_cand, ours_ok)
        if measured is not None:
            return measured
    if ours_best is None:
        why = (f"our kernels do not run it ({why_not_ours})" if not ours_ok else
               "no kernel config is valid for it")
        s = cublas_cand.score
        return Plan("cublas", f"cuBLAS: {why}", None, None, 1, (), 0, s.time, "heuristic", arch,
                    desc, tuple(cands))
    if autotune:
        return _autotuned(desc, arch, cands, ours_best, forced=False)
    if cublas_cand is None:
        return _ours_plan(desc, arch, ours_best, f"our kernels: cuBLAS has no such mode "
                          f"({why_not_theirs}); " + _why_ours(ours_best, cands), cands)
    if ours_best.time < cublas_cand.time * (1 - CUBLAS_MARGIN):
        return _ours_plan(desc, arch, ours_best,
                          f"our kernels predicted faster than cuBLAS ({ours_best.time * 1e6:.1f} "
                          f"vs {cublas_cand.time * 1e6:.1f} us, beyond the model's "
                          f"{CUBLAS_MARGIN:.0%} margin); " + _why_ours(ours_best, cands),
                          cands)
    ratio = ours_best.time / cublas_cand.time
    if ratio < 1:
        return Plan("cublas", f"cuBLAS kept: our best ({ours_best.label}) is predicted only "
                    f"{1 / ratio:.2f}x faster ({ours_best.time * 1e6:.1f} vs "
                    f"{cublas_cand.time * 1e6:.1f} us), within the model's {CUBLAS_MARGIN:.0%} "
                    f"margin. Force backend='tensorcore' to use ours.", None, None, 1, (), 0,
                    cublas_cand.time, "heuristic", arch, desc, tuple(cands))
    return Plan("cublas", f"cuBLAS predicted faster: {cublas_cand.time * 1e6:.1f} us vs "
                f"{ours_best.time * 1e6:.1f} us for our best ({ours_best.label}, {ratio:.2f}x "
                f"slower; calibrated from bench/results: on the H100 our mma.sync kernels ran 0.3-0.75x "
                f"cuBLAS, the sm_90a wgmma kernel 0.5-1.05x). Force backend='tensorcore' to use ours.", None, None, 1, (), 0,
                cublas_cand.time, "heuristic", arch, desc, tuple(cands))


#: Our kernels replace cuBLAS only when predicted faster by more than this fraction. The model
#: is within 25% of the measurement on ~80% of points, and its misses lean one way: on thin and
#: small float16/bfloat16 problems it under-predicts our time (16x4096x4096: 15 us predicted,
#: 39 us measured), while cuBLAS there is 1.2-2.4x faster (planner_h100_2026-11-22.json). A
#: wrong switch away from cuBLAS costs more than a missed one, so ties go to cuBLAS.
CUBLAS_MARGIN = 0.25


def _table_allowed() -> bool:
    """The measured-choice table decides only when nothing is forced: a forced config,
    decomposition or split count (PYBLASGEMM_CONFIG / _DECOMPOSITION / _SPLITS) is the user's
    call, and PYBLASGEMM_NO_MEASURED_CHOICES=1 turns the table off."""
    s = current_settings()
    return (s.measured_choices and s.config is None and s.decomposition is None
            and s.splits is None)


def _measured_plan(desc, arch, cal, cands, ours_best, cublas_cand, ours_ok) -> Plan | None:
    """The plan of the measured-choice table's entry for ``desc`` on ``arch``, or None (no entry
    applies, or its implementation is not valid for this exact problem: the model decides)."""
    from .measured import choice_for_desc

    entry = choice_for_desc(desc, arch)
    if entry is None:
        return None
    if entry.impl == "cublas":
        if cublas_cand is None:
            return None            # cuBLAS does not run this problem
        return Plan("cublas", _measured_reason(entry, desc, ours_best, cublas_cand), None, None,
                    1, (), 0, cublas_cand.time, "measured", arch, desc, tuple(cands))
    if not ours_ok:
        return None
    try:
        cfg = M.parse_config_name(entry.impl)
    except ValueError:
        return None
    prob = kernel_problem_for(desc)
    if not M.check(cfg, prob, arch)[0]:
        return None                # e.g. a near shape the config cannot run: the model decides
    winner = next((c for c in cands if c.config == cfg and c.score is not None), None)
    if winner is None:
        # valid but not scored: pruned by a model rule (a tile far wider than m) or a split
        # count the enumeration does not try; the measurement overrides the model, so score it
        occ = M.occupancy(cfg, prob.kind, arch)
        winner = Candidate("tensorcore", cfg, M.score_ours(cfg, prob, arch, cal, occ), "",
                           M.tile_efficiency(cfg, prob.kind, cal)[1])
        cands = [c for c in cands if c.config != cfg] + [winner]
    return _ours_plan(desc, arch, winner, _measured_reason(entry, desc, ours_best, cublas_cand),
                      cands, "measured")


def _model_pick(ours_best, cublas_cand) -> str:
    """The label of what the model alone would choose (the rule of ``_choose`` below)."""
    if ours_best is None:
        return "cublas"
    if cublas_cand is None or ours_best.time < cublas_cand.time * (1 - CUBLAS_MARGIN):
        return ours_best.label
    return "cublas"


def _measured_reason(entry, desc, ours_best, cublas_cand) -> str:
    """E.g. 'measured fastest on <device> at 128x4096x4096 (<runs>): <impl> 1.31x faster than
    the model's pick (cublas)'."""
    where = entry.shape
    if (desc.m, desc.n, desc.k) != (entry.m, entry.n, entry.k):
        where += f" (the nearest measured shape to {desc.m}x{desc.n}x{desc.k})"
    runs = ", ".join(entry.sources)
    fastest = min(entry.times, key=lambda i: (entry.times[i], i))
    if entry.impl == fastest:
        what = f"measured fastest on {entry.device} at {where} ({runs}): {entry.impl}"
    else:     # cuBLAS, kept within the table's tolerance of a faster one of ours
        what = (f"measured on {entry.device} at {where} ({runs}): cublas, within "
                f"{entry.cublas_tolerance:.0%} of the fastest ({fastest}, "
                f"{entry.time_s / entry.times[fastest]:.3f}x faster)")
    pick = _model_pick(ours_best, cublas_cand)
    if pick == entry.impl:
        if entry.runner_up is None or entry.impl != fastest:
            return what + "; the model picks it too"
        return (what + f"; the model picks it too (runner-up {entry.runner_up} "
                f"{entry.runner_up_s / entry.time_s:.2f}x its time)")
    t_pick = entry.time_of(pick)
    if t_pick is None:
        return what + f"; the model's pick ({pick}) was not timed there"
    ratio = t_pick / entry.time_s
    if ratio >= 1:
        return what + f" {ratio:.2f}x faster than the model's pick ({pick})"
    return what + f"; the model's pick ({pick}) measured {ratio:.3f}x its time"


def _autotuned(desc, arch, cands, ours_best, forced: bool) -> Plan:
    from .autotune import tune_desc

    return tune_desc(desc, arch=arch, candidates=cands, include_cublas=not forced)
