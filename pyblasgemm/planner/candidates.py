"""Candidates: every kernel config x decomposition our kernels could run a problem with, each
scored by the cost model or rejected with the constraint that failed; and the pick among them.
"""
from __future__ import annotations

from dataclasses import replace

from ..constraints import backend_supports, kernel_problem, packable, packed_desc
from ..kernels.pack import copy_seconds, pack_steps
from ..desc import GemmDesc
from . import model as M
from .arch import ArchSpec, arch_for_device
from .overrides import current_settings
from .plan import Candidate
from .problem import kind_of

__all__ = ["kernel_problem_for", "enumerate_candidates", "best_of", "spec_for", "pack_seconds"]


def kernel_problem_for(desc: GemmDesc):
    """Our kernels' ``KernelProblem`` for ``desc`` with pointers of exactly its alignment
    (:func:`pyblasgemm.constraints.kernel_problem`)."""
    return kernel_problem(desc)


def _supports(name: str, desc: GemmDesc):
    """(ok, reason) of backend ``name`` for ``desc`` (:mod:`pyblasgemm.constraints`)."""
    return backend_supports(name, desc)


def _arch(desc: GemmDesc, arch: ArchSpec | None) -> ArchSpec:
    return arch if arch is not None else arch_for_device(desc.device)


def _split_choices(tiles: int, kt: int, slots: int) -> list[int]:
    want = {2, 3, 4, 6, 8, 12, 16, -(-slots // max(1, tiles)), -(-2 * slots // max(1, tiles))}
    return sorted(s for s in want if 2 <= s <= min(64, kt // 2))


def enumerate_candidates(desc: GemmDesc, arch: ArchSpec, cal: dict,
                         config=None) -> list[Candidate]:
    """Every candidate config for our kernels on ``desc``, scored or rejected with the reason;
    where an operand's leading dimension keeps the kernels off TMA and 16-byte copies
    (:func:`~pyblasgemm.constraints.packable`), every config again on the packed problem, its
    copies' cost added (those candidates carry ``pack``). ``config``: that configuration only,
    as ``PYBLASGEMM_CONFIG`` forces one (no tile pruning; a batch-invariant plan's)."""
    out = _enumerate(desc, arch, cal, config)
    ops = packable(desc)
    if ops:
        gpu, host = pack_seconds(desc, ops, arch, cal)
        for c in _enumerate(packed_desc(desc, ops), arch, cal, config):
            if c.score is None:
                out.append(replace(c, pack=ops))
                continue
            s = c.score
            note = f"copies {' and '.join(x.upper() for x in ops)}: {gpu * 1e6:.1f} us" + (
                f"; {s.note}" if s.note else "")
            out.append(replace(c, pack=ops, score=s._replace(
                time=s.time + gpu + host, gpu=s.gpu + gpu, host=s.host + host, note=note,
                workspace_bytes=s.workspace_bytes + _packed_bytes(desc, ops))))
    return out


def _packed_bytes(desc: GemmDesc, ops: tuple) -> int:
    return sum(s.nbytes for s in pack_steps(kernel_problem_for(desc), ops))


def pack_seconds(desc: GemmDesc, ops: tuple, arch: ArchSpec, cal: dict) -> tuple:
    """(GPU, host) seconds of packing ``ops``: each copy's measured cost model
    (:func:`~pyblasgemm.kernels.pack.copy_seconds`, at the device's DRAM bandwidth), and an
    extra launch's host cost.

    Example::

        >>> from pyblasgemm.planner import make_desc, model
        >>> from pyblasgemm.planner.arch import FAMILIES
        >>> d = make_desc(6453, 738, 9058, "bf16", lda=6455)
        >>> gpu, host = pack_seconds(d, ("a",), FAMILIES["sm_90"], model.load_calibration())
        >>> 100e-6 < gpu < 120e-6        # 117 MB read and written at 69 % of 3.35 TB/s
        True
    """
    gpu = 0.0
    for step in pack_steps(kernel_problem_for(desc), ops):
        gpu += copy_seconds(step.nbytes, arch.dram_bw, step.transpose, step.rows)
    return gpu, len(ops) * M.launch_host_s(cal)


def _enumerate(desc: GemmDesc, arch: ArchSpec, cal: dict, config=None) -> list[Candidate]:
    kind = kind_of(desc)
    prob = kernel_problem_for(desc)
    out = []
    settings = current_settings()
    forced = config if config is not None else settings.config
    tiles_cfgs = [forced] if forced is not None else M.candidate_configs(kind, cal, arch)
    for base in tiles_cfgs:
        ok, why = M.check(replace(base, decomposition="sliced", splits=0), prob, arch)
        if not ok and forced is None:
            out.append(Candidate("tensorcore", base, None, why))
            continue
        if forced is None and base.kernel_family.wide_tile_pruning and base.bm > max(64, 2 * desc.m):
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
                if s <= 8 or forced_splits:      # serial chains longer than 8 rarely pay
                    variants.append(replace(base, decomposition="splitk_serial", splits=s))
                variants.append(replace(base, decomposition="splitk_parallel", splits=s))
            # the decompositions its family runs (the Hopper kernel's split-k is the parallel one)
            variants = [v for v in variants if v.decomposition in base.kernel_family.decompositions]
        offered = 0
        for cfg in variants:
            if settings.decomposition and cfg.decomposition != settings.decomposition:
                continue
            if settings.splits and cfg.decomposition.startswith("splitk") and cfg.splits != settings.splits:
                continue
            offered += 1
            ok, why = M.check(cfg, prob, arch)
            if not ok:
                out.append(Candidate("tensorcore", cfg, None, why))
                continue
            _, calibrated = M.tile_efficiency(cfg, kind, cal)
            out.append(Candidate("tensorcore", cfg, M.score_ours(cfg, prob, arch, cal, occ), "",
                                 calibrated))
        if not offered:     # the forced decomposition / splits left this tile nothing to run
            why = ("clusters run the data-parallel schedule only" if base.cluster > 1 else
                   f"{kt} K step(s) of {base.bk} leave no split that fits" if
                   (settings.decomposition or "").startswith("splitk") or settings.splits else "")
            wanted = settings.decomposition or "splitk_parallel"
            label = replace(base, decomposition=wanted,
                            splits=(settings.splits or 2) if wanted.startswith("splitk") else 0)
            out.append(Candidate("tensorcore", label, None, f"{base.name}: no {wanted} variant"
                                 f"{(' (' + why + ')') if why else ''}"))
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


def spec_for(desc: GemmDesc, arch, cand):
    """The :class:`~pyblasgemm.kernels.spec.LaunchSpec` of our candidate ``cand`` on ``desc``:
    the geometry its score was computed with (same SM count and occupancy) and the kernel
    argument values, so the plan shows what the launch will run.

    Example::

        >>> import pyblasgemm
        >>> p = pyblasgemm.plan(4096, 4096, 4096, "float16", backend="tensorcore")
        >>> w = next(c for c in p.candidates if c.config == p.config)
        >>> spec_for(p.problem, p.arch, w).same_as(p.launch)
        True
    """
    from ..kernels.spec import launch_spec

    return launch_spec(kernel_problem_for(packed_desc(desc, cand.pack)), cand.config,
                       arch.sm_count, cand.score.occupancy)
