"""The routes of a problem's epilogue and of a grouped problem: options priced by the cost
model, one chosen and recorded in the plan (``Plan.epilogue``, ``Plan.group``; ``explain()``
prints them).

**Epilogue** (``desc.epilogue``, an :class:`~pyblasgemm.epilogue.EpilogueSpec`): the plan of the
product itself is made first (:func:`~pyblasgemm.planner.core.plan_for` of ``desc.product``),
then three ways to add the epilogue are priced:

* *ours*: one of our kernels with the epilogue in its store (:func:`~pyblasgemm.kernels.launch.fusable`
  configs; the planned GEMM's own config costs nothing extra, another one its candidate's time);
* *cuBLASLt*: cuBLASLt's epilogue (relu and the tanh GELU, a bias along the described C's
  rows, 16-byte aligned pointers), at cuBLAS's predicted time;
* *unfused*: the planned GEMM into the accumulation type, then one elementwise pass
  (:func:`~pyblasgemm.planner.model.unfused_pass_s` on top of the GEMM's time).

The GEMM the plan picked takes the epilogue when it can (fusing into its store adds no pass);
otherwise another fused route is taken only when the model puts it below the planned GEMM
plus the unfused pass (H100, 4096³ bias + GELU: our fused kernel 0.236 ms against cuBLAS and
the pass 0.284 ms), else the unfused route.

**Group** (``desc.group``, a :class:`~pyblasgemm.desc.GroupSpec`): one persistent launch of our
grouped kernel against a loop of planned GEMMs, priced by
:func:`~pyblasgemm.planner.model.grouped_times`; ``backend='tensorcore'`` takes the launch
whenever the arrays allow it.
"""
from __future__ import annotations

from dataclasses import replace

from ..backends.cublas import lt_types
from ..backends.cublaslt import EPILOGUE_ALIGN, LT_EPILOGUE_NAMES, LT_EPILOGUES
from ..epilogue_pass import UNFUSED
from ..kernels.config import SM90_MAX_GROUPS
from ..kernels.grouped import GROUPED_CONFIGS, grouped_config, hopper_grouped_config
from ..kernels.jit import epilogue_code
from ..kinds import KERNEL_KINDS
from ..kernels.launch import fusable
from . import model as M
from .arch import ArchSpec
from .candidates import kernel_problem_for, spec_for
from .composite import CompositeSpec
from .plan import Plan, Route, RouteOption

__all__ = ["epilogue_plan", "group_plan", "GROUPED_KINDS"]


def epilogue_plan(desc, base: Plan, requested: str, arch: ArchSpec | None) -> Plan:
    """The plan of ``desc`` (a description with an epilogue) from ``base``, the plan of its
    product: the route chosen among the priced options (see the module docstring)."""
    unfused_line = UNFUSED[desc.xp].line
    if base.backend == "host" or base.arch is None or arch is None or base.predicted_s is None \
            or base.backend not in ("tensorcore", "cublas") or isinstance(base.launch, CompositeSpec) \
            or base.decomposition == "gemv":
        why = ("the arrays are on the host: NumPy computes the product, then the epilogue"
               if base.backend == "host" else "the planned route runs the product on its own "
               "(no fused store)")
        route = Route("unfused", unfused_line, why, (RouteOption("unfused", "the product, then one pass",
                                                                 base.predicted_s),))
        return replace(base, problem=desc, epilogue=route)
    pass_s = M.unfused_pass_s(desc.product, arch)
    unfused_time = base.predicted_s + pass_s if base.predicted_s is not None else None
    ours_own, ours_other = _ours_options(desc, base, requested)
    lt = _cublaslt_option(desc, base, requested)
    if desc.invariant:
        # the invariant plan's own configuration only: another one, or cuBLASLt's kernel,
        # would add the K terms in another order (planner/invariant.py)
        ours_other = None
        lt = RouteOption("cublaslt", "fused in cuBLASLt's epilogue", None,
                         "invariant=True: its kernel changes with the shape")
    unfused = RouteOption("unfused", f"unfused: the planned GEMM ({base.backend}) + one pass",
                          unfused_time, f"pass {pass_s * 1e6:.1f} us")
    options = tuple(o for o in (ours_own, ours_other, lt) if o is not None) + (unfused,)
    own = ours_own if base.backend == "tensorcore" else lt if base.backend == "cublas" else None
    if own is not None and own.time is not None:
        return _fused_plan(desc, base, own, arch, options, "the planned GEMM takes the epilogue in its "
                           "store: no pass beyond it")
    others = [o for o in (ours_other, lt if base.backend != "cublas" else None)
              if o is not None and o.time is not None]
    best = min(others, key=lambda o: o.time, default=None)
    if best is not None and unfused_time is not None and best.time <= unfused_time:
        return _fused_plan(desc, base, best, arch, options,
                           f"{best.label} is predicted {best.time * 1e6:.1f} us, below the planned "
                           f"GEMM plus the unfused pass ({unfused_time * 1e6:.1f} us)")
    why = ("no fused route takes this epilogue" if best is None else
           f"the fused routes are predicted slower than the planned GEMM plus the pass "
           f"({best.time * 1e6:.1f} vs {unfused_time * 1e6:.1f} us)")
    return replace(base, problem=desc, epilogue=Route("unfused", unfused_line, why, options))


def _fused_plan(desc, base: Plan, option: RouteOption, arch, options, why) -> Plan:
    """The plan that runs ``option`` (a fused route), recorded with every option priced."""
    epi = desc.epilogue
    if option.kind == "cublaslt":
        code = LT_EPILOGUES[(epi.activation, bool(epi.bias), epi.preactivation)]
        route = Route("cublaslt", f"cuBLASLt epilogue {LT_EPILOGUE_NAMES[code]} (fused in the GEMM)", why,
                      options, code)
        if base.backend == "cublas":
            return replace(base, problem=desc, epilogue=route)
        cublas = next(c for c in base.candidates if c.backend == "cublas")
        return Plan("cublas", "cuBLASLt: its epilogue fuses this one (our planned kernel's store "
                    "cannot)", None, None, 1, (), 0, cublas.time, "heuristic", base.arch, desc,
                    base.candidates, epilogue=route)
    what = "int8 dequantized in its store" if epi.dequantize else "the epilogue fused in its store"
    cand = option.candidate
    if cand is None:        # the plan's own config
        route = Route("ours", f"pyblasgemm kernel {base.config.name}, {what}", why, options)
        if base.pack:       # (only a dequantizing store takes a packed plan: unpacked, scalar loads)
            return replace(base, problem=desc, epilogue=route, pack=(), launch=None)
        return replace(base, problem=desc, epilogue=route)
    route = Route("ours", f"pyblasgemm kernel {cand.config.name}, {what}", why, options)
    spec = spec_for(desc.product, arch, cand)
    return Plan("tensorcore", f"our kernel {cand.config.name} takes the epilogue in its store",
                cand.config, cand.config.decomposition, spec.splits, spec.grid, spec.workspace_bytes,
                cand.time, "heuristic", arch, desc, base.candidates, spec, (), epilogue=route)


def _ours_options(desc, base: Plan, requested: str):
    """(the planned GEMM's own fused store, the cheapest other fusable config of ours), each a
    RouteOption (time None: rejected, the note says why) or None where not considered."""
    epi = desc.epilogue
    dequant = epi.dequantize is not None
    if requested not in ("auto", "tensorcore"):
        return RouteOption("ours", "fused in our kernel", None, f"backend={requested!r}"), None
    if epi.blocker:
        return RouteOption("ours", "fused in our kernel", None, epi.blocker), None
    if not dequant and epi.bias and epi.bias_align % (2 * desc.row.c_dtype.itemsize):
        # our kernels read the bias in pairs of elements
        return RouteOption("ours", "fused in our kernel", None,
                           f"the bias pointer is {epi.bias_align}-byte aligned; our store reads "
                           f"pairs of elements"), None
    kind = kernel_problem_for(desc.product).kind
    own = None
    if base.backend == "tensorcore" and base.config is not None:
        cfg = base.config
        label = f"fused in our kernel {cfg.name} (the plan's)"
        if not fusable(kind, cfg, dequantize=dequant):
            own = RouteOption("ours", label, None, f"{cfg.name} takes no fused epilogue for {kind}")
        elif base.pack and not (dequant and cfg.kernel_family.any_alignment):
            # (a family that runs any alignment takes the unpacked problem for a dequantizing
            # store: bound without the packed problem's spec, on its scalar operand path)
            own = RouteOption("ours", label, None, "the plan packs the operands first")
        else:
            own = RouteOption("ours", label, base.predicted_s)
    pool = [c for c in base.candidates if c.backend == "tensorcore" and c.score is not None and not c.pack
            and c.config is not None and fusable(kind, c.config, dequantize=dequant)
            and not (base.backend == "tensorcore" and c.config == base.config)]
    best = min(pool, key=lambda c: c.time, default=None)
    other = None
    if best is not None:
        other = RouteOption("ours", f"fused in our kernel {best.config.name}", best.time, "",
                            best)
    return own, other


def _cublaslt_option(desc, base: Plan, requested: str):
    epi = desc.epilogue
    label = "fused in cuBLASLt's epilogue"
    if requested not in ("auto", "cublas") or desc.xp != "cupy":
        return RouteOption("cublaslt", label, None, f"backend={requested!r}")
    if epi.dequantize is not None:
        return RouteOption("cublaslt", label, None, "cuBLASLt has no int8 dequantizing epilogue")
    if epi.blocker:
        return RouteOption("cublaslt", label, None, epi.blocker)
    code = LT_EPILOGUES.get((epi.activation, bool(epi.bias), epi.preactivation))
    if code is None:
        return RouteOption("cublaslt", label, None, "cuBLASLt has no such epilogue (relu and the tanh "
                           "GELU, with a bias; the GELU's pre-activation)")
    if epi.bias == "n":
        return RouteOption("cublaslt", label, None, "cuBLASLt adds one bias value per row of D only")
    if epi.bias and epi.bias_align < EPILOGUE_ALIGN or epi.preactivation and (
            epi.pre_align < EPILOGUE_ALIGN or desc.ldc % 8):
        return RouteOption("cublaslt", label, None, f"its bias and pre-activation need "
                           f"{EPILOGUE_ALIGN}-byte pointers (and a pre-activation ld multiple of 8)")
    if lt_types(desc) is None:
        return RouteOption("cublaslt", label, None, "cuBLAS has no such mode")
    cublas = next((c for c in base.candidates if c.backend == "cublas"), None)
    if base.backend == "cublas":
        return RouteOption("cublaslt", f"{label} ({LT_EPILOGUE_NAMES[code]}, the plan's)",
                           base.predicted_s if base.predicted_s is not None else 0.0)
    if cublas is None or cublas.score is None:
        return RouteOption("cublaslt", label, None, "cuBLAS does not run this problem")
    return RouteOption("cublaslt", f"{label} ({LT_EPILOGUE_NAMES[code]})", cublas.time)


# ---------------------------------------------------------------------------------------------
# The group

#: (A's dtype name, B's) in the kernel's terms -> (kernel kind, the result dtype it writes
#: without dequantization), for the kinds the grouped kernel has a config for (read off the
#: kinds table; one type per operand pair but the float8 kinds, whose A and B may differ)
GROUPED_KINDS = {(KERNEL_KINDS[k].ab_dtype, KERNEL_KINDS[k].b_dtype or KERNEL_KINDS[k].ab_dtype):
                 (k, KERNEL_KINDS[k].c_dtype) for k in GROUPED_CONFIGS}


def _hopper_walk_blocker(desc, kind, arch, config) -> str:
    """Why a grouped problem stays off the Hopper grouped walk (kernels/sm90.py's
    Sm90GroupedLaunch), or '': the walk runs the expert form with its sizes on the GPU (it
    reads them there; a host list is the table walk's), float16 / bfloat16 on sm_90, its
    operands 16-byte aligned (TMA), at most SM90_MAX_GROUPS groups, K >= 1, and no
    dequantizing store."""
    g, epi = desc.group, desc.epilogue
    if arch is None or tuple(arch.cc) != (9, 0):
        return "the Hopper walk runs on sm_90"
    if not g.device_sizes:
        return "the Hopper walk reads device-side sizes (this call's are on the host: the table walk's)"
    if config is None:
        return f"the Hopper walk runs float16 and bfloat16 (not {desc.row.ab_dtype.name})"
    if epi is not None and epi.dequantize:
        return "the Hopper walk has no dequantizing store"
    if g.ab_align < 16:
        return f"TMA needs 16-byte aligned tokens and weights (their alignment: {g.ab_align} bytes)"
    if len(g.sizes) > SM90_MAX_GROUPS:
        return f"{len(g.sizes)} groups > {SM90_MAX_GROUPS} (the walk's shared table)"
    if desc.k < 1:
        return "k = 0"
    return ""


def group_plan(desc, requested: str, arch: ArchSpec) -> Plan:
    """The plan of a grouped problem: one persistent launch of our grouped kernel, or a loop of
    planned GEMMs (one per non-empty problem), priced by the model."""
    g = desc.group
    kind = GROUPED_KINDS.get((desc.row.ab_dtype.name, (desc.row.b_dtype or desc.row.ab_dtype).name), (None,))[0]
    loop_line = f"a loop of planned GEMMs, one per non-empty problem ({g.live})"
    one_label = "one persistent launch of our grouped kernel"
    epi = desc.epilogue
    blocker = (g.blocker or (f"backend={requested!r}" if requested not in ("auto", "tensorcore") else "")
               or ("no grouped kernel for " + desc.row.ab_dtype.name if kind is None else "")
               or ("nothing to compute" if not g.live else "")
               or ("a dequantizing store writes 16-byte aligned rows of whole 16-byte columns"
                   if epi is not None and epi.dequantize and g.c_align < 16 else ""))
    if blocker:
        options = (RouteOption("one launch", one_label, None, blocker), RouteOption("loop", loop_line, None))
        route = Route("loop", loop_line, blocker, options)
        return Plan("loop", f"grouped: {blocker}", problem=desc, source="heuristic", arch=arch, group=route)
    mean_rows = sum(n for _, n, _ in g.sizes) / max(len(g.sizes), 1)
    hopper = hopper_grouped_config(kind, mean_rows)
    hopper_blocker = _hopper_walk_blocker(desc, kind, arch, hopper)
    one, loop = M.grouped_times(g.sizes, kind, arch, hopper=not hopper_blocker, device_sizes=g.device_sizes)
    hopper_label = "one persistent launch of the Hopper grouped walk (wgmma + TMA)"
    if hopper_blocker:
        options = (RouteOption("one launch", one_label, one, f"{g.live} problems"),
                   RouteOption("hopper walk", hopper_label, None, hopper_blocker))
    else:
        options = (RouteOption("one launch", hopper_label, one, f"{g.live} groups, sizes read on the GPU"),
                   RouteOption("mma.sync walk", one_label, None, "the Hopper walk runs this group"))
    options += (RouteOption("loop", loop_line, loop, f"{g.live} planned GEMMs"),)
    if requested == "auto" and loop <= one:
        why = (f"the loop is predicted {loop * 1e6:.1f} us against {one * 1e6:.1f} us for one launch "
               f"(few large problems: cuBLAS's mainloop is the faster)")
        return Plan("loop", f"grouped: {why}", problem=desc, predicted_s=loop, arch=arch,
                    group=Route("loop", loop_line, why, options))
    # the tile from the groups' mean rows (the kernel's n; with the sizes on the device the
    # nominal sizes still sum to the tokens' count)
    config = grouped_config(kind, mean_rows) if hopper_blocker else hopper
    vec = g.ab_align >= 16
    code = 0 if epi is None else epilogue_code(epi.code, epi.dequantize)
    why = ("forced by backend='tensorcore'" if requested == "tensorcore" else
           f"one launch is predicted {one * 1e6:.1f} us against {loop * 1e6:.1f} us for the loop "
           f"(many small problems: the loop's host time per call dominates)")
    walk = "grouped kernel" if hopper_blocker else "Hopper grouped walk (wgmma + TMA)"
    line = (f"pyblasgemm {walk} {config.name}: {g.live} problems in one persistent launch"
            + (", the epilogue fused in its store" if code else ""))
    route = Route("one launch", line, why, options, code,
                  ("grouped", desc.device, kind, vec, code, None if epi is None else epi.bias, config))
    return Plan("tensorcore", f"grouped: {why}", config, None, 1, (), 0, one, "heuristic", arch, desc,
                group=route)
