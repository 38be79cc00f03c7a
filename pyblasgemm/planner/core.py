"""The choice among candidates and the in-memory plan cache (the :class:`Plan` and
:class:`Candidate` types are in :mod:`~pyblasgemm.planner.plan`, the enumeration and scoring in
:mod:`~pyblasgemm.planner.candidates`, the ``PYBLASGEMM_*`` overrides in
:mod:`~pyblasgemm.planner.overrides`; autotuning builds on those, and this module on it).

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

import math
import sys
from dataclasses import replace

from ..backends.cublaslt import loaded_version
from ..desc import GemmDesc, check_backend_place
from ..kernels import fp8 as fp8_settings      # FAMILY, ROUTE: the float8 route's settings
from ..kinds import route_of
from .._warnings import log
from ..plancache import get_plan_cache
from . import model as M
from . import overrides
from .arch import ArchSpec
from .autotune import lookup, tune_desc
from .candidates import (_arch, _supports, best_of, enumerate_candidates,  # noqa: F401
                         kernel_problem_for, spec_for)
from .overrides import current_settings
from .plan import Candidate, Plan
from .invariant import check_route as check_invariant_route, invariant_choice
from .routes import epilogue_plan, group_plan
from .decode import cublas_band_reason, decode_plan
from .fp8 import plan_fp8

__all__ = ["Plan", "Candidate", "plan_for", "clear_plan_cache", "current_settings", "kernel_problem_for"]


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------

_cache = get_plan_cache()


def plan_for(desc: GemmDesc, backend: str | None = None, *, autotune: bool | None = None,
             arch: ArchSpec | None = None, lt_version="loaded") -> Plan:
    """The plan for ``desc``; memoized on (problem key, requested backend).

    ``backend`` forces one (else ``PYBLASGEMM_BACKEND``, else 'auto'); ``autotune=True`` times
    the best candidates on the GPU once and persists the winner (see
    :func:`pyblasgemm.planner.tune`); ``arch`` plans for a given spec instead of the device's.
    A float8 description (:func:`pyblasgemm.desc.describe_fp8`) takes the planner's float8 route
    (:func:`pyblasgemm.planner.fp8.plan_fp8`) on ``arch`` and cuBLASLt's version ``lt_version``
    (a machine fact: 'loaded', the library this process loads, or a version, or None for none),
    under ``kernels.fp8.FAMILY`` / ``ROUTE``, all of them in its key. A repeated call costs one
    dict lookup.

    Example::

        >>> from pyblasgemm.planner import plan_for
        >>> from pyblasgemm.planner.problem import make_desc
        >>> plan_for(make_desc(64, 64, 64, "float64", xp="numpy")).backend
        'host'
    """
    if desc.row.b_dtype is not None and desc.group is None:
        # a float8 product (its scales in the description; float8 groups: the grouped route's)
        return _fp8_plan_for(desc, backend, arch, lt_version)
    key = ("plan", desc.key, backend, autotune, arch if arch is None else arch.key)
    plan = _cache.get(key)
    if plan is not None:
        return plan
    s = current_settings()
    tune = s.autotune if autotune is None else autotune
    if backend is None:     # the environment forced it: its message names the variable
        check_backend_place(desc.routine, s.backend, desc.xp, name="PYBLASGEMM_BACKEND")
    if desc.group is not None:
        # not memoized: a mixture of experts routes its tokens anew every step (a repeated
        # routing replays through its call signature instead)
        check_backend_place(desc.routine, backend or s.backend, desc.xp)
        return group_plan(desc, backend or s.backend, _arch(desc, arch) if desc.xp == "cupy" else None)
    if desc.epilogue is not None:
        # the product's own plan first (memoized alone), then the epilogue's route on it
        base = plan_for(desc.product, backend, autotune=autotune, arch=arch)
        plan = epilogue_plan(desc, base, backend or s.backend, base.arch)
    else:
        plan = _choose(desc, backend or s.backend, arch, tune)
    # a new plan only (a memoized one returned above): the cold path's one log line
    log.debug("plan %s for %s %s%s m=%d n=%d k=%d batch=%d (%s): %s", plan, desc.routine,
              desc.transa, desc.transb, desc.m, desc.n, desc.k, desc.batch, desc.xp, plan.reason)
    if s.print_plans:
        print(plan.explain(), file=sys.stderr)
    if s.cache:
        _cache.put(key, plan)
    return plan


def _fp8_plan_for(desc: GemmDesc, backend: str | None, arch: ArchSpec | None, lt_version) -> Plan:
    """:func:`plan_for` of a float8 description: the host's plan for NumPy arrays (exact block
    sums: pyblasgemm.fp8.scaled_product), else the planner's float8 route, memoized."""
    if lt_version == "loaded":
        lt_version = loaded_version()
    key = ("plan", desc.key, backend, arch if arch is None else arch.key, fp8_settings.FAMILY, fp8_settings.ROUTE, lt_version)
    plan = _cache.get(key)
    if plan is not None:
        return plan
    s = current_settings()
    requested = backend or s.backend
    if backend is None:     # the environment forced it: its message names the variable
        check_backend_place(desc.routine, s.backend, desc.xp, name="PYBLASGEMM_BACKEND")
    if desc.xp == "numpy" and requested in ("auto", "host"):
        plan = Plan("host", "NumPy arrays run on the host (pyblasgemm.fp8.scaled_product: exact block sums)",
                    source="host", problem=desc)
    else:
        check_backend_place(desc.routine, requested, desc.xp)
        forced = requested if requested in ("cublas", "tensorcore") else None
        plan = plan_fp8(desc, _arch(desc, arch), lt_version, forced, fp8_settings.FAMILY, fp8_settings.ROUTE)
    log.debug("plan %s for %s float8 %s%s m=%d n=%d k=%d (%s): %s", plan, desc.routine, desc.transa, desc.transb,
              desc.m, desc.n, desc.k, desc.xp, plan.reason)
    if s.print_plans:
        print(plan.explain(), file=sys.stderr)
    if s.cache:
        _cache.put(key, plan)
    return plan


def clear_plan_cache() -> None:
    """Forget every memoized plan, bound launch and call signature (the whole plan cache,
    with the GPU workspace it owns) and re-read the ``PYBLASGEMM_*`` variables.

    Example::

        >>> import pyblasgemm
        >>> pyblasgemm.clear_plan_cache()
    """
    _cache.free()
    overrides.reset()
    from .arch import _by_device
    _by_device.clear()


def _ours_plan(desc, arch, winner: Candidate, reason, cands, source="heuristic") -> Plan:
    spec = spec_for(desc, arch, winner)
    return Plan("tensorcore", reason, winner.config, winner.config.decomposition, spec.splits,
                spec.grid, spec.workspace_bytes, winner.score.time, source, arch, desc,
                tuple(cands), spec, winner.pack)


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
                 and c.config == base and c.pack == winner.pack), None)


_HOST_INVARIANT = ("; invariant: each element one dot product of its row and column, so its bits "
                   "do not depend on m, n or the batch (backends.host.invariant_matmul)")


def _choose(desc: GemmDesc, requested: str, arch: ArchSpec | None, autotune: bool) -> Plan:
    check_invariant_route(desc)
    on_host = desc.xp == "numpy"
    if requested == "auto" and on_host:
        return Plan("host", "NumPy arrays run on the host (NumPy/SciPy BLAS)"
                    + (_HOST_INVARIANT if desc.invariant else ""), source="host", problem=desc)
    check_backend_place(desc.routine, requested, desc.xp)
    if requested == "host":
        return Plan("host", "forced by backend= / PYBLASGEMM_BACKEND"
                    + (_HOST_INVARIANT if desc.invariant else ""), source="forced", problem=desc)
    arch = _arch(desc, arch)
    if desc.invariant:
        pick, why, cands = invariant_choice(desc, requested, arch, M.load_calibration())
        return _ours_plan(desc, arch, pick, why, cands, "invariant")
    if route_of(desc.prefix, desc.compute).composite is not None:
        from .composite import plan_composite

        return plan_composite(desc, requested, arch, plan_for)
    if not autotune:
        decode = decode_plan(desc, requested, arch, current_settings())
        if decode is not None:          # measured: bench/results/gemv_*; planner/decode.py
            return decode
    cal = M.load_calibration()
    ours_ok, why_not_ours = _supports("tensorcore", desc)   # the kernels' rules included
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
    if not autotune and _nothing_forced() and cublas_cand is not None:
        band = cublas_band_reason(desc)     # measured: bench/results/torch_callpath_*; planner/decode.py
        if band is not None:
            return Plan("cublas", band, None, None, 1, (), 0, cublas_cand.score.time, "heuristic", arch, desc,
                        tuple(cands))
    if not autotune and _nothing_forced() and cublas_cand is not None and ours_best is not None:
        # a call so small that the host decides it: ours wins even if cuBLAS's kernel took
        # no more than a launch's latency
        bound = _host_bound_pick(cands, cal, cublas_cand)
        if bound is not None:
            worst, pick = bound
            host = rule_host_us(cal)
            h_o, h_c = host["tensorcore"], host["cublas"]
            g_c = cublas_cand.score.gpu * 1e6
            return _ours_plan(desc, arch, pick, (
                f"host-bound: our call ({h_o:.1f} us host, at most {worst * 1e6:.1f} us GPU: the "
                f"model's prediction x{MODEL_MISS} for its worst measured miss) is no slower than "
                f"cuBLAS's ({h_c:.1f} us host, {g_c:.1f} us GPU predicted"
                + (f", its int8 copies ({cublas_cand.score.fixup * 1e6:.1f} us) included"
                   if cublas_cand.score.fixup else "")
                + f") waited for ({h_o + worst * 1e6:.1f} vs {h_c + g_c:.1f} us) or back to back "
                f"(at most {max(h_o, worst * 1e6):.1f} vs at least {h_c:.1f} us per call); "
                + _why_ours(pick, cands)), cands)
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
    if beyond_margin(ours_best, cublas_cand):
        return _ours_plan(desc, arch, ours_best,
                          f"our kernels predicted faster than cuBLAS ({ours_best.time * 1e6:.1f} "
                          f"vs {cublas_cand.time * 1e6:.1f} us waited for; with its GPU part "
                          f"{1 / (1 - CUBLAS_MARGIN):.2f}x the prediction, the model's margin, "
                          f"{_margin_cost(ours_best, True) * 1e6:.1f} vs "
                          f"{_margin_cost(cublas_cand, False) * 1e6:.1f} us waited for and back "
                          f"to back alike); "
                          + _why_ours(ours_best, cands), cands)
    ratio = ours_best.time / cublas_cand.time
    if ratio < 1:
        return Plan("cublas", f"cuBLAS kept: our best ({ours_best.label}) is predicted only "
                    f"{1 / ratio:.2f}x faster ({ours_best.time * 1e6:.1f} vs "
                    f"{cublas_cand.time * 1e6:.1f} us), within the model's {CUBLAS_MARGIN:.0%} "
                    f"margin on its GPU part. Force backend='tensorcore' to use ours.", None, None, 1, (), 0,
                    cublas_cand.time, "heuristic", arch, desc, tuple(cands))
    return Plan("cublas", f"cuBLAS predicted faster: {cublas_cand.time * 1e6:.1f} us vs "
                f"{ours_best.time * 1e6:.1f} us for our best ({ours_best.label}, {ratio:.2f}x "
                f"slower; calibrated from bench/results: on the H100 our mma.sync kernels ran 0.3-0.75x "
                f"cuBLAS, the sm_90a wgmma kernel 0.5-1.05x). Force backend='tensorcore' to use ours.", None, None, 1, (), 0,
                cublas_cand.time, "heuristic", arch, desc, tuple(cands))


def rule_host_us(cal) -> dict:
    """Host µs of one planned, bound call per route for the host-bound rule: the cautious pair
    of the calibration's ``call_host_us`` (the largest per-run median of ours, the smallest of
    cuBLAS's: tools/calibrate.py, from bench/host_cost.py runs on the H100 and H200), or the
    model's host terms for a calibration without one.

    Example::

        >>> from pyblasgemm.planner import model
        >>> h = rule_host_us(model.load_calibration())
        >>> h["tensorcore"] < h["cublas"]
        True
    """
    call = cal.get("call_host_us")
    if call is not None:
        return {"tensorcore": call["tensorcore_high"], "cublas": call["cublas_low"]}
    return {"tensorcore": M.call_host_s(cal, "tensorcore") * 1e6,
            "cublas": M.call_host_s(cal, "cublas") * 1e6}


#: The model's worst measured under-prediction of our GPU time (16x4096x4096 fp16: 15 µs
#: predicted, 39 µs measured; see CUBLAS_MARGIN), applied beyond the launch latency
MODEL_MISS = 2.6


def _host_bound_pick(cands, cal, cublas_cand):
    """(worst-case GPU seconds, candidate) of the mma.sync candidate whose call is host-bound
    even with its GPU time taken MODEL_MISS times the prediction beyond the launch latency (that
    worst case fits within cuBLAS's host time, so back to back ours is never slower) and which,
    waited for, ends before cuBLAS's call (host + its predicted GPU time, int8 copies
    included). None when no candidate is; the smallest worst case wins."""
    latency = cal["kernel_latency_us"] * 1e-6
    host = rule_host_us(cal)
    host_ours, host_theirs = host["tensorcore"] * 1e-6, host["cublas"] * 1e-6
    single_theirs = host_theirs + cublas_cand.score.gpu
    best = None
    for c in cands:
        if (c.backend != "tensorcore" or c.score is None or not c.config.kernel_family.host_bound_rule
                or c.pack):
            continue
        worst = latency + MODEL_MISS * max(0.0, c.score.gpu - latency)
        if (worst <= host_theirs and host_ours + worst < single_theirs
                and (best is None or worst < best[0])):
            best = (worst, c)
    return best


#: Our kernels replace cuBLAS only when predicted faster by more than this fraction. The model
#: is within 25% of the measurement on ~80% of points, and its misses lean one way: on thin and
#: small float16/bfloat16 problems it under-predicts our time (16x4096x4096: 15 us predicted,
#: 39 us measured), while cuBLAS there is 1.2-2.4x faster (planner_h100_2026-11-22.json). A
#: wrong switch away from cuBLAS costs more than a missed one, so ties go to cuBLAS.
CUBLAS_MARGIN = 0.25


def _margin_cost(cand, ours: bool) -> float:
    """:func:`_waited_and_streamed` of a candidate, ours with its GPU part taken as the margin's
    worst case (the host part is measured per call, ``call_host_us``; the GPU part is the
    model's, where its misses lie)."""
    s = cand.score
    return _waited_and_streamed(s.host, s.gpu / (1 - CUBLAS_MARGIN) if ours else s.gpu)


def _waited_and_streamed(host: float, gpu: float) -> float:
    """A call's cost to the two callers the planner serves alike, as one number: the geometric
    mean of the single call waited for (host + GPU) and of back-to-back calls (the larger of
    the two: the host enqueues the next launch while the GPU runs this one)."""
    return math.sqrt((host + gpu) * max(host, gpu))


def beyond_margin(ours, cublas) -> bool:
    """True when our candidate stays faster than cuBLAS's with its predicted GPU time
    stretched by the margin (CUBLAS_MARGIN: ours' GPU time may be 1/(1-margin) = 1.33x the
    prediction), waited for and back to back alike (:func:`_waited_and_streamed`). On a
    GPU-bound problem that is ``ours < 0.75 x cuBLAS``; on a host-bound one the measured host
    difference (7.8 vs 13.4 µs per call) counts in full, and back to back only the larger of
    host and GPU time is paid.

    Example::

        >>> import pyblasgemm
        >>> p = pyblasgemm.plan(4096, 4096, 4096, "float16", arch="sm_90")
        >>> ours = min((c for c in p.candidates if c.backend == "tensorcore" and c.score),
        ...            key=lambda c: c.time)
        >>> cublas = next(c for c in p.candidates if c.backend == "cublas")
        >>> beyond_margin(ours, cublas) == (p.backend == "tensorcore")
        True
    """
    return _margin_cost(ours, True) < _margin_cost(cublas, False)


def _nothing_forced() -> bool:
    """No config, decomposition or split count forced (PYBLASGEMM_CONFIG / _DECOMPOSITION /
    _SPLITS): the planner's own rules may decide."""
    s = current_settings()
    return s.config is None and s.decomposition is None and s.splits is None


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
    from ..constraints import packable
    from .measured import choice_for_desc

    if packable(desc):
        return None      # the table was measured before packing: it never timed that option
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
    winner = next((c for c in cands if c.config == cfg and c.score is not None and not c.pack),
                  None)
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
    if cublas_cand is None or beyond_margin(ours_best, cublas_cand):
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

    return tune_desc(desc, arch=arch, candidates=cands, include_cublas=not forced)
