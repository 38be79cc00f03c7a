"""Candidates, the one constraint predicate, and the analytic cost model.

Every number the model uses comes from an :class:`~pyblasgemm.planner.arch.ArchSpec` (device
limits, peak rates) or from the calibration (``calibration_h100.json``, derived from the
measurements in ``bench/results/`` by ``tools/calibrate.py``). Times are seconds.

Our kernels (``score_ours``), for a config with tile ``bm x bn x bk`` on ``S`` SMs:

* one MAC iteration (a ``bm x bn x bk`` block product) takes ``t_it = 2·bm·bn·bk / r_sm`` where
  ``r_sm`` is the calibrated per-SM rate of that tile shape (efficiency x the arch's mma.sync
  peak) times the layout factor (K- or MN-contiguous operands) and the scalar-copy factor
  (unaligned operands);
* a fixed cost per tile a CTA works on (pipeline fill + epilogue, ``cta_overhead_it`` MAC
  iterations, assumed);
* wave quantization at SM granularity: the busiest SM runs ``ceil(ctas / S)`` CTAs, up to
  ``occupancy`` of them at a time; an SM running fewer CTAs than its occupancy hides less latency
  (``lone_cta_eff``, calibrated on the long-K split-k points);
* K iterations per CTA: all of K (sliced), ``kt / splits`` (split-k), ``tiles·kt / G`` (stream-k
  over a persistent grid of ``G = S x occupancy`` CTAs, hybrid: full waves first);
* fixups: serial split-k passes a running sum along the splits (``splitk_link_us`` each, and
  the fp32 tiles through L2);
  parallel split-k writes ``splits`` fp32 partial tiles and runs a reduce kernel (bytes at DRAM
  bandwidth + ``reduce_launch_us``); stream-k owners add the other CTAs' partials of their tile
  one after the other (``streamk_fixed_us`` + ``streamk_partial_us`` each, plus the partial
  tiles through L2);
* memory: compulsory DRAM traffic (A, B once, C written, split-k workspace) at the device
  bandwidth; GPU time = max(compute + fixup, memory) + ``kernel_latency_us``;
* predicted time = host time of the backend's call (``call_host_us``: measured per planned,
  bound call; plus ``call_host_us.launch`` per extra launch, where the GPU time before it does
  not hide it) + GPU time.

cuBLAS (``score_cublas``): calibrated efficiency x the family's best peak per (dtype, compute),
a partial wave-tail penalty for its 128x256 tiles, a penalty for unaligned leading dimensions, the bandwidth floor, its host overhead, and
for int8 the rearranging copies the cuBLAS backend makes unless the problem is "TN" with k and
leading dimensions multiples of 4.

The calibration files are read once and checked (:func:`load_calibration`: every key the model
reads, with its type); the planner cannot work without them, so a file that is unreadable, not
JSON or of the wrong shape raises a ``ValueError`` naming the file and what is wrong.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from .._files import DOCUMENT_BYTES, read_regular
from ..settings import shown
from ..kernels.config import KERNEL_FAMILIES, KernelConfig, families_on
from ..kernels.geometry import launch_geometry
from ..kernels.problem import BASE_KIND, C_BYTES, ELEM_BYTES, KernelProblem
from ..kinds import KERNEL_KINDS, base_compute, route_of
from ._checks import why_not_dict, why_not_number, why_not_numbers
from .arch import ArchSpec

__all__ = ["Score", "load_calibration", "tile_key", "parse_config_name", "check", "occupancy",
           "candidate_configs", "score_ours", "score_cublas", "streamk_partials", "SIMPLICITY"]

CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration_h100.json"
#: the Hopper kernel's tile efficiencies (fractions of the wgmma peak), derived from
#: bench/results/sm90_*.json by ``calibrate.derive_sm90``
CALIBRATION_SM90_FILE = Path(__file__).resolve().parent / "calibration_sm90_h100.json"

#: tie-break order: within TIE of the best time, the simpler decomposition wins
SIMPLICITY = {"sliced": 0, "splitk_serial": 1, "splitk_parallel": 2, "hybrid": 3, "streamk": 4}
TIE = 0.01


@lru_cache(maxsize=4)
def load_calibration(path: str | None = None) -> dict:
    """The calibration dict (rates, overheads) shipped with the package (or at ``path``), read
    once; the Hopper kernel's part (``cal["sm90"]``) comes from its own file unless ``path``'s
    has one.

    Both files are checked for the keys and types the model reads (:func:`_why_invalid_calibration`);
    one that is unreadable, not JSON or of the wrong shape raises ``ValueError`` naming the
    file (the planner cannot work without a calibration).

    Example::

        >>> load_calibration()["host_us"]["cublas"] > 0
        True
    """
    main = Path(path) if path else CALIBRATION_FILE
    cal = _read_calibration_file(main)
    why = _why_invalid_calibration(cal)
    if why:
        raise ValueError(f"pyblasgemm: malformed calibration file {main}: {why}")
    if "sm90" not in cal and CALIBRATION_SM90_FILE.exists():
        sm90 = _read_calibration_file(CALIBRATION_SM90_FILE)
        why = _why_invalid_section(sm90, "the file")
        if why:
            raise ValueError(f"pyblasgemm: malformed calibration file {CALIBRATION_SM90_FILE}: {why}")
        cal["sm90"] = sm90
    return cal


def _read_calibration_file(path: Path):
    try:
        return json.loads(read_regular(path, DOCUMENT_BYTES))
    except OSError as exc:     # also RefusedFile: a FIFO, a device, a directory, too large
        raise ValueError(f"pyblasgemm: cannot read calibration file {path}: {exc.strerror or exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"pyblasgemm: malformed calibration file {path}: not JSON "
                         f"({str(exc)[:120]})") from exc


#: calibration numbers the model divides by or scales rates with (> 0), and additive costs (>= 0)
_CAL_FACTORS = ("scalar_path_factor", "lone_cta_eff")
_CAL_COSTS = ("cta_overhead_it", "splitk_link_us", "reduce_launch_us", "streamk_partial_us",
              "kernel_latency_us")
_CUBLAS_FACTORS = ("eff_default", "bw_eff")
_TILE_KEY = re.compile(r"(\d+)x(\d+)x(\d+)B_w(\d+)x(\d+)_s(\d+)$")


def _why_invalid_calibration(cal) -> str | None:
    """Why a calibration dict cannot be used by the model, or None: the keys and types
    ``score_ours``, ``score_cublas``, ``tile_efficiency`` and ``candidate_configs`` read."""
    why = why_not_dict(cal, "the file")
    if why:
        return why
    checks = [why_not_number(cal.get(k), k, positive=True) for k in _CAL_FACTORS]
    checks += [why_not_number(cal.get(k), k) for k in _CAL_COSTS]
    if "streamk_fixed_us" in cal:
        checks.append(why_not_number(cal["streamk_fixed_us"], "streamk_fixed_us"))
    host = cal.get("host_us")
    checks.append(why_not_numbers(host, "host_us"))
    if isinstance(host, dict):
        checks += [why_not_number(host.get(k), f"host_us[{k!r}]") for k in ("tensorcore", "cublas")]
    if "call_host_us" in cal:
        call = cal["call_host_us"]
        checks.append(why_not_numbers(call, "call_host_us"))
        if isinstance(call, dict):
            checks += [why_not_number(call.get(k), f"call_host_us[{k!r}]", positive=True)
                       for k in ("tensorcore", "cublas", "tensorcore_high", "cublas_low")]
            checks.append(why_not_number(call.get("launch", 0.0), "call_host_us['launch']"))
    checks.append(_why_invalid_ours(cal.get("ours")))
    checks.append(_why_invalid_cublas(cal.get("cublas")))
    for family in KERNEL_FAMILIES.values():       # a family's own section (the Hopper kernel's)
        if family.calibration is not None and family.calibration in cal:
            checks.append(_why_invalid_section(cal[family.calibration], family.calibration))
    return next((w for w in checks if w), None)


def _why_invalid_ours(ours) -> str | None:
    why = why_not_dict(ours, "ours")
    if why:
        return why
    if "f16" not in ours:
        return "ours has no 'f16' entry (every kind falls back to it)"
    for kind, entry in ours.items():
        where = f"ours[{kind!r}]"
        why = (why_not_dict(entry, where)
               or why_not_numbers(entry.get("tiles"), f"{where}['tiles']", positive=True)
               or why_not_numbers(entry.get("layout"), f"{where}['layout']", positive=True)
               or why_not_number(entry.get("workhorse_eff"), f"{where}['workhorse_eff']", positive=True))
        if why:
            return why
        bad = next((k for k in entry["tiles"] if not _TILE_KEY.match(k)), None)
        if bad is not None:
            return f"{where}['tiles'] has {bad!r}, not a tile key such as '128x128x64B_w2x2_s4'"
    return None


def _why_invalid_cublas(cb) -> str | None:
    why = (why_not_dict(cb, "cublas")
           or why_not_numbers(cb.get("eff"), "cublas['eff']", positive=True))
    if why:
        return why
    checks = [why_not_number(cb.get(k), f"cublas[{k!r}]", positive=True) for k in _CUBLAS_FACTORS]
    checks.append(why_not_number(cb.get("tail"), "cublas['tail']"))
    if "unaligned_eff" in cb:
        checks.append(why_not_number(cb["unaligned_eff"], "cublas['unaligned_eff']", positive=True))
    copy = cb.get("int8_copy")
    checks.append(why_not_dict(copy, "cublas['int8_copy']"))
    if isinstance(copy, dict):
        checks.append(why_not_number(copy.get("fixed_us"), "cublas['int8_copy']['fixed_us']"))
        checks.append(why_not_number(copy.get("bytes_per_s"), "cublas['int8_copy']['bytes_per_s']",
                                     positive=True))
    return next((w for w in checks if w), None)


def _why_invalid_section(section, where: str) -> str | None:
    """A kernel family's section (the Hopper kernel's, ``sm90``): per kind {'tiles': {tile key:
    efficiency}}, and two optional numbers."""
    why = why_not_dict(section, where)
    if why:
        return why
    for kind in BASE_KIND:
        if kind in section:
            at = f"{where}[{kind!r}]"
            why = (why_not_dict(section[kind], at)
                   or why_not_numbers(section[kind].get("tiles"), f"{at}['tiles']", positive=True))
            if why:
                return why
    for key in ("host_over_cublas", "streamk_spread_penalty"):
        if key in section:
            why = why_not_number(section[key], f"{where}[{key!r}]", positive=key == "host_over_cublas")
            if why:
                return why
    return None


class Score(NamedTuple):
    """The cost model's verdict on one candidate (all times in seconds)."""

    time: float            # predicted time of one call: host + GPU
    gpu: float
    host: float
    compute: float         # busiest SM's MAC time
    fixup: float           # split-k / stream-k fixup and reduction
    memory: float          # DRAM floor
    waves: float           # CTAs / (SMs x occupancy)
    last_wave_util: float  # fill of the last wave (1.0 = full)
    ctas: int
    occupancy: int
    grid: tuple
    splits: int
    workspace_bytes: int
    note: str = ""


def tile_key(cfg: KernelConfig, kind: str) -> str:
    """Calibration key of a tile shape: '128x128x64B_w2x2_s4' (bk in bytes, as the kernels);
    a family's keys carry its name prefix (the Hopper kernel's: 'sm90a_')."""
    pre = cfg.kernel_family.name_prefix
    post = f"_c{cfg.cluster}" if cfg.cluster != 1 else ""
    post += "_mmasync" if cfg.consumer == "mma.sync" else ""
    return f"{pre}{cfg.bm}x{cfg.bn}x{cfg.bk_bytes(kind)}B_w{cfg.warps_m}x{cfg.warps_n}_s{cfg.stages}{post}"


#: mma.sync consumers on the Hopper kernel's ring (never chosen, only forced) against the wgmma
#: consumers on the same tile: 0.63-0.73 (fp16 4096^3 / 8192^3, TN and NN, burst and sustained:
#: bench/results/mma_sync_h100_2026-11-22.json)
MMA_SYNC_CONSUMER_FACTOR = 0.70


@lru_cache(maxsize=4)
def _name_pattern(prefixes: tuple) -> re.Pattern:
    """A config name: a family's prefix ('' for one family), decomposition, tile, pipeline,
    splits, cluster, consumer, group (built for the registered families' prefixes)."""
    alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
    return re.compile(r"^(" + alternatives + r")(sliced|splitk_serial|splitk_parallel|streamk|hybrid)"
                      r"_(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)_s(\d+)(?:_k(\d+))?(?:_c(\d+))?(_mmasync)?(?:_g(\d+))?$")


def parse_config_name(name: str) -> KernelConfig:
    """Inverse of ``KernelConfig.name``: 'hybrid_128x128x32_w2x2_s4_g8' -> KernelConfig.

    >>> parse_config_name("splitk_parallel_128x128x32_w2x2_s4_k8_g8").splits
    8
    >>> parse_config_name("sm90a_streamk_256x128x64_w2x1_s4_g8").family
    'sm90a'
    >>> parse_config_name("sm90a_sliced_256x128x64_w2x1_s4_c2_mmasync_g8").consumer
    'mma.sync'
    """
    family_by_prefix = {f.name_prefix: f.name for f in KERNEL_FAMILIES.values()}
    m = _name_pattern(tuple(family_by_prefix)).match(name.strip())
    if not m:
        raise ValueError(f"{shown(name)} is not a kernel config name such as "
                         f"'sliced_128x128x32_w2x2_s4_g8', 'splitk_parallel_128x128x32_w2x2_s4_k8_g8' "
                         f"or 'sm90a_sliced_256x128x64_w2x1_s4_g8'")
    fam, d, bm, bn, bk, wm, wn, st, k, c, sync, g = m.groups()
    return KernelConfig(bm=int(bm), bn=int(bn), bk=int(bk), warps_m=int(wm), warps_n=int(wn),
                        stages=int(st), decomposition=d, splits=int(k or 0), group_m=int(g or 8),
                        family=family_by_prefix[fam], cluster=int(c or 1),
                        consumer="mma.sync" if sync else "wgmma")


def check(cfg: KernelConfig, problem: KernelProblem, arch: ArchSpec) -> tuple[bool, str]:
    """The constraint predicate for a config: :func:`pyblasgemm.constraints.config_valid`."""
    from ..constraints import config_valid

    return config_valid(cfg, problem, arch)


def _regs_per_thread(cfg: KernelConfig, kind: str) -> int:
    # accumulators (warp tile / 32 lanes) + fragments and addresses; 3xTF32 keeps a second set
    # of accumulators per k-step (NOTES.md, 3xTF32 fix). Capped at 255 by the ISA.
    acc = (cfg.bm // cfg.warps_m) * (cfg.bn // cfg.warps_n) // 32
    if kind == "3xtf32":
        acc *= 2
    return min(255, acc + 64 + acc // 2)


def occupancy(cfg: KernelConfig, kind: str, arch: ArchSpec) -> int:
    """Estimated CTAs per SM (shared memory, registers, threads), at least 1.

    The launcher asks the driver for the real value for stream-k grids; this estimate is what
    the planner has before anything is compiled. The Hopper kernel: one (its ring takes most
    of shared memory, and its grid is persistent): a family's fixed ``ctas_per_sm``.
    """
    if cfg.kernel_family.ctas_per_sm:
        return cfg.kernel_family.ctas_per_sm
    smem = cfg.smem_bytes(kind) + 1024              # 1 KB per CTA reserved by the driver
    by_smem = arch.smem_per_sm // smem
    per_warp = -(-_regs_per_thread(cfg, kind) * 32 // 256) * 256   # allocation unit: 256 regs
    by_regs = arch.regs_per_sm // (per_warp * cfg.warps_m * cfg.warps_n)
    by_threads = arch.max_threads_per_sm // cfg.threads
    return max(1, min(by_smem, by_regs, by_threads, arch.max_ctas_per_sm))


def candidate_configs(kind: str, cal: dict, arch: ArchSpec | None = None) -> list[KernelConfig]:
    """Tile shapes worth scoring for ``kind`` (as sliced configs): those of every kernel family
    that runs on ``arch`` in the registry's order (on a compute capability 9.0 device the Hopper
    kernel's tiles first, then the shipped mma.sync ones; without an arch, the sm_80 baseline's),
    then the mma.sync tiles the calibration measured; the decompositions are added by the
    planner."""
    seen, out = set(), []
    tiles = []
    for family in families_on(tuple(arch.cc) if arch is not None else (8, 0)):
        tiles += family.candidate_tiles(kind)
    for key in cal["ours"].get(kind, {}).get("tiles", {}):
        tiles.append(_config_from_key(key, kind))
    for c in tiles:
        k = tile_key(c, kind)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


def _config_from_key(key: str, kind: str) -> KernelConfig:
    m = re.match(r"(\d+)x(\d+)x(\d+)B_w(\d+)x(\d+)_s(\d+)$", key)
    bm, bn, bkb, wm, wn, st = (int(x) for x in m.groups())
    return KernelConfig(bm=bm, bn=bn, bk=bkb // ELEM_BYTES[kind], warps_m=wm, warps_n=wn, stages=st)


#: The FP32 FMA kind ('f32', a ``simt`` row of the kinds table) while the calibration has no
#: entry of its own: its tiles' efficiency as a fraction of the FP32 FMA peak, as the model's
#: compute term implies it at >= 2 waves on an H100 (SIMT_EFFICIENCY_SOURCE: 0.58 for the
#: 128x128 workhorse, 0.67 for 64x64; cuBLAS's SGEMM ran 1.4-2x faster there), every layout
#: alike (the mainloop reads each layout from shared memory at one wavefront per load). The
#: tensor-core kinds' numbers say nothing about it: their fallback to f16's entry does not apply.
SIMT_ENTRY = {"workhorse_eff": 0.5805, "tiles": {"128x128x64B_w2x4_s4": 0.5805, "64x64x64B_w2x2_s4": 0.6678},
              "layout": {}}
SIMT_EFFICIENCY_SOURCE = "bench/results/simt_f32_h100_2026-11-27_035de94.json"


def _ours_entry(cal: dict, kind: str) -> dict:
    """The calibration's ``ours`` entry of ``kind``: its own, else its mainloop's, else (an FMA
    kind) :data:`SIMT_ENTRY`, else f16's."""
    ours = cal["ours"]
    entry = ours.get(kind) or ours.get(BASE_KIND[kind])
    if entry is None:
        entry = SIMT_ENTRY if KERNEL_KINDS[kind].simt else ours["f16"]
    return entry


def tile_efficiency(cfg: KernelConfig, kind: str, cal: dict) -> tuple[float, bool]:
    """(fraction of the family's peak at full occupancy, calibrated?) for this tile shape.

    Uncalibrated shapes: the kind's workhorse efficiency scaled by the warp tile's MMA density
    (a 32x32 warp tile re-reads its fragments four times as often per MAC as 64x64)."""
    # a kind's own calibration, else its mainloop's (fp32-C kinds share the 16-bit ones)
    base = BASE_KIND[kind]
    section = cfg.kernel_family.calibration
    if section is not None:
        # a family with its own section (the Hopper kernel: a fraction of the wgmma peak per
        # tile, calibration_sm90_h100.json); an unmeasured tile gets the kind's smallest
        # measured efficiency
        sm = cal.get(section, {})
        entry = sm.get(kind) or sm.get(base) or sm.get("f16") or {"tiles": {}}
        eff = entry["tiles"].get(tile_key(cfg, kind))
        if eff is not None:
            return eff, True
        if cfg.consumer == "mma.sync":
            wgmma_eff, _ = tile_efficiency(replace(cfg, consumer="wgmma"), kind, cal)
            return wgmma_eff * MMA_SYNC_CONSUMER_FACTOR, False
        return min(entry["tiles"].values(), default=0.5), False
    entry = _ours_entry(cal, kind)
    eff = entry["tiles"].get(tile_key(cfg, kind))
    if eff is not None:
        return eff, True
    wtm, wtn = cfg.bm // cfg.warps_m, cfg.bn // cfg.warps_n
    density = (wtm * wtn / (wtm + wtn)) / 32.0          # 1.0 for a 64x64 warp tile
    return entry["workhorse_eff"] * min(1.0, density) ** 0.5, False


def call_host_s(cal: dict, route: str, section: str | None = None) -> float:
    """Host seconds of one call on ``route`` ('tensorcore' or 'cublas'): the current call path's
    measured cost (``call_host_us``: a planned, bound call, bench/host_cost.py) when the
    calibration has it, else the cost recorded with the API-call timings (``host_us``; a kernel
    family's with its own calibration ``section`` scaled by that section's ``host_over_cublas``:
    the Hopper launcher's, ``sm90``).

    Example::

        >>> cal = load_calibration()
        >>> call_host_s(cal, "tensorcore") < call_host_s(cal, "cublas")
        True
    """
    call = cal.get("call_host_us")
    if call is not None:
        return call[route] * 1e-6
    if route == "tensorcore" and section and "host_over_cublas" in cal.get(section, {}):
        # the family's launch path's own measured host cost (bench_sm90.py), relative to cuBLAS's
        return cal["host_us"]["cublas"] * cal[section]["host_over_cublas"] * 1e-6
    return cal["host_us"][route] * 1e-6


def extra_launches(cfg: KernelConfig, problem: KernelProblem, geometry: dict) -> int:
    """Host calls a call of ``cfg`` makes beyond its GEMM launch: a prep kernel per operand for
    its family's ``prep_kinds`` (the Hopper fp32 kinds), split-k's reduce kernel, the memset
    that zeroes split-k/stream-k flags.

    Example::

        >>> from pyblasgemm.kernels import KernelProblem, default_config
        >>> p = KernelProblem("f16", "N", "N", 1000, 1000, 4096, 1000, 4096, 1000, 16, 16, 16)
        >>> cfg = default_config(p, 132)                      # serial split-k: flags to zero
        >>> extra_launches(cfg, p, launch_geometry(p, cfg, 132))
        1
    """
    n = 2 if problem.kind in cfg.kernel_family.prep_kinds else 0    # one per operand, A and B
    n += cfg.decomposition == "splitk_parallel"
    n += geometry["flags"] > 0
    return n


def launch_host_s(cal: dict) -> float:
    """Host seconds of one more kernel launch or memset in a call (``call_host_us.launch``,
    bench/launch_primitives.py; 0 for a calibration without it).

    Example::

        >>> round(launch_host_s({"call_host_us": {"launch": 4.9}}) * 1e6, 3)
        4.9
    """
    return cal.get("call_host_us", {}).get("launch", 0.0) * 1e-6


def _group_time(load: int, occ: int, lone: float) -> float:
    """Time units for an SM that runs ``load`` equal CTAs, ``occ`` at a time: full groups at
    full rate, the remainder with less latency hiding (``lone`` = rate of a single CTA)."""
    if occ <= 1:
        return float(load)
    full, rem = divmod(load, occ)
    t = float(full * occ)
    if rem:
        eff = lone + (1.0 - lone) * (rem - 1) / (occ - 1)
        t += rem / eff
    return t


def _partials(kt: int, total: int, G: int) -> int:
    per = total / G                       # MAC iterations per CTA
    return max(1, math.ceil(kt / per) - 1) if per < kt else 1


def streamk_partials(cfg: KernelConfig, problem: KernelProblem, arch: ArchSpec, occ: int) -> int:
    """Partials an owner CTA adds in a stream-k/hybrid launch (0 without stream-k tiles)."""
    g = launch_geometry(problem, cfg, arch.sm_count, occ)
    total = g["sk_tiles"] * g["kt"]
    return _partials(g["kt"], total, g["grid"][0]) if total else 0


def _layout(transa: str, transb: str) -> str:
    return transa + transb


def score_ours(cfg: KernelConfig, problem: KernelProblem, arch: ArchSpec, cal: dict,
               occ: int | None = None) -> Score:
    """Predict the time of our kernels with ``cfg`` on ``problem`` (see the module docstring)."""
    p, kind = problem, problem.kind
    S = arch.sm_count
    occ = occ or occupancy(cfg, kind, arch)
    g = launch_geometry(p, cfg, S, occ)
    eff, _ = tile_efficiency(cfg, kind, cal)
    mma_kind = BASE_KIND[kind]   # fp32-output kinds run the 16-bit mainloop
    # fp32 on wgmma: the geometry is the prepared problem's (a 3xTF32 stage issues the three
    # products: the 3xtf32 rate, a third of tf32's); the prep kernel's traffic is added below
    prep_bytes = g.get("prep_bytes", 0)
    family = cfg.kernel_family
    rate = eff * family.peak(arch, mma_kind)
    if family.layout_sensitive:
        rate = rate * _ours_entry(cal, mma_kind)["layout"].get(_layout(p.transa, p.transb), 1.0)
    if family.any_alignment and not p.operands_vectorizable():
        rate *= cal["scalar_path_factor"]       # the scalar operand path
    t_it = 2.0 * cfg.bm * cfg.bn * cfg.bk / (rate / S)    # one MAC iteration on one SM
    lone = cal["lone_cta_eff"]
    ovh = cal["cta_overhead_it"]          # pipeline fill + epilogue of one tile, in iterations
    tile_bytes = cfg.bm * cfg.bn * 4
    d = cfg.decomposition
    tiles, kt = g["tiles"], g["kt"]
    fixup, ws = 0.0, 0
    if d == "sliced":
        ctas = tiles
        compute = _group_time(-(-ctas // S), occ, lone) * (kt + ovh) * t_it
    elif d.startswith("splitk"):
        splits, kps = g["splits"], g["kt_per_split"]
        ctas = tiles * splits
        compute = _group_time(-(-ctas // S), occ, lone) * (kps + ovh) * t_it
        if d == "splitk_serial":
            # the running sum goes through L2: each link writes and reads one fp32 tile
            ws = tiles * tile_bytes + 4 * tiles
            fixup = ((splits - 1) * cal["splitk_link_us"] * 1e-6
                     + tiles * (splits - 1) * 2 * tile_bytes / arch.l2_bw)
        else:
            # partial tiles (mma.sync) or whole partial matrices (Hopper), written then reduced:
            # the geometry's workspace less the prepared operands
            ws = g["ws_bytes"] - prep_bytes
            fixup = cal["reduce_launch_us"] * 1e-6 + 2 * ws / arch.dram_bw
    else:
        G = g["grid"][0]
        ctas = G
        cps = -(-G // S)                                   # CTAs on the busiest SM
        dp_per_cta = g["dp_tiles"] // G if G else 0
        total = g["sk_tiles"] * kt
        it_cta = -(-total // G) if total else 0
        if family.calibration is not None and total:
            # many stream-k tiles per CTA: concurrently running tiles are far apart (no L2 reuse;
            # measured on the Hopper kernel, its section's penalty)
            spread = max(0.0, g["sk_tiles"] / G - 2)
            penalty = cal.get(family.calibration, {}).get("streamk_spread_penalty", 0.0)
            it_cta = int(it_cta * (1 + penalty * spread))
        segs = (math.ceil(it_cta / kt) + (1 if it_cta % kt else 0)) if total else 0
        units = dp_per_cta * (kt + ovh) + it_cta + segs * ovh
        compute = units * _group_time(cps, min(occ, cps), lone) * t_it
        if total:
            ws_traffic = g["sk_tiles"] * 2 * tile_bytes * max(1, _partials(kt, total, G))
            fixup_bytes = ws_traffic / arch.l2_bw
            # a fixed cost (flags, the tile hand-over) plus, at an owner, the partials of the
            # CTAs sharing its tile, added one after the other
            fixup = (cal.get("streamk_fixed_us", 0.0)
                     + _partials(kt, total, G) * cal["streamk_partial_us"]) * 1e-6 + fixup_bytes
        ws = G * tile_bytes + 4 * G
    if prep_bytes:
        read = (p.m * (p.batch if p.stride_a else 1) + p.n * (p.batch if p.stride_b else 1)) * p.k * 4
        fixup += (read + prep_bytes) / arch.dram_bw + 2 * cal["kernel_latency_us"] * 1e-6
        ws += prep_bytes
    eb, cb = ELEM_BYTES[kind], C_BYTES[kind]
    a_b = p.m * p.k * (p.batch if p.stride_a else 1) * eb
    b_b = p.k * p.n * (p.batch if p.stride_b else 1) * eb
    dram = a_b + b_b + p.m * p.n * p.batch * cb
    memory = dram / arch.dram_bw
    gpu = max(compute + fixup, memory) + cal["kernel_latency_us"] * 1e-6
    # the extra launches are issued while the GPU runs the earlier ones: only the part of their
    # host time beyond that GPU time shows
    extra = extra_launches(cfg, p, g) * launch_host_s(cal)
    busy = gpu - cal["kernel_latency_us"] * 1e-6
    host = call_host_s(cal, "tensorcore", family.calibration) + max(0.0, extra - busy)
    slots = S * occ
    waves = ctas / slots
    last = waves - math.floor(waves)
    util = 1.0 if last == 0 else last
    return Score(host + gpu, gpu, host, compute, fixup, memory, waves, util, ctas, occ,
                 tuple(g["grid"]), g["splits"], ws)


_CUBLAS_KIND = {("h", "fp32"): "f16", ("h", "fp16"): "f16", ("b", "fp32"): "bf16",
                ("sh", "fp32"): "f16", ("sb", "fp32"): "bf16",
                ("i", "int32"): "s8", ("s", "tf32"): "tf32", ("s", "fp32"): "fp32",
                ("d", "fp64"): "fp64", ("c", "fp32"): "fp32", ("z", "fp64"): "fp64",
                ("c", "tf32"): "tf32", ("c", "3xtf32"): "fp32"}


_CUBLAS_OPERAND_PREFIX = {"sh": "h", "sb": "b"}
#: cuBLAS runs 3xTF32 as its plain float32 SGEMM (kinds.ROUTES): that rate
_CUBLAS_COMPUTE = {"3xtf32": "fp32"}


def score_cublas(desc, arch: ArchSpec, cal: dict) -> Score:
    """Predict cuBLAS's time for ``desc`` (a GemmDesc) from the calibrated efficiency table."""
    # an emulated mode's cuBLAS route is its type's native mode (kinds.Route.native): its rate
    compute = route_of(desc.prefix, desc.compute).native or base_compute(desc.compute)
    # fp32 C from 16-bit operands: the 16-bit GEMM's rate (measured per operand type)
    key = (f"{_CUBLAS_OPERAND_PREFIX.get(desc.prefix, desc.prefix)}/"
           f"{_CUBLAS_COMPUTE.get(compute, compute)}")
    cb = cal["cublas"]
    eff = cb["eff"].get(key, cb["eff_default"])
    kind = _CUBLAS_KIND.get((desc.prefix, compute), "fp32")
    peak = arch.best_peak(kind)
    flops = desc.flops
    # cuBLAS's tail: a 128x256 tile grid on S SMs; part of the quantization loss shows
    tiles = -(-desc.m // 128) * -(-desc.n // 256) * desc.batch
    waves = tiles / arch.sm_count
    q = math.ceil(waves) / waves if waves else 1.0
    q = 1.0 + cb["tail"] * (q - 1.0)
    compute = flops / (eff * peak) * q
    if desc.align < 16:                  # leading dimensions not multiples of 16 bytes
        compute /= cb.get("unaligned_eff", 1.0)
    isz, csz = desc.row.ab_dtype.itemsize, desc.row.c_dtype.itemsize
    dram = ((desc.m * desc.k * (desc.batch if desc.stride_a else 1)
             + desc.k * desc.n * (desc.batch if desc.stride_b else 1)) * isz
            + desc.m * desc.n * desc.batch * csz)
    memory = dram / (arch.dram_bw * cb["bw_eff"])
    fixup, note = 0.0, ""
    if desc.prefix == "i":
        copied = 0
        k_ok = desc.k % 4 == 0
        if not (k_ok and desc.transa == "T" and desc.lda % 4 == 0 and desc.align >= 4):
            copied += desc.m * desc.k * (desc.batch if desc.stride_a else 1)
        if not (k_ok and desc.transb == "N" and desc.ldb % 4 == 0 and desc.align >= 4):
            copied += desc.k * desc.n * (desc.batch if desc.stride_b else 1)
        if copied:
            cp = cb["int8_copy"]
            fixup = cp["fixed_us"] * 1e-6 + copied / cp["bytes_per_s"]
            note = f"int8 operands rearranged for cuBLAS IMMA ({copied / 1e6:.1f} MB copied)"
    gpu = max(compute, memory) + fixup + cal["kernel_latency_us"] * 1e-6
    host = call_host_s(cal, "cublas")
    util = waves - math.floor(waves) or 1.0
    return Score(host + gpu, gpu, host, compute, fixup, memory, waves, util, tiles, 1,
                 (), 1, 0, note)


# ---------------------------------------------------------------------------------------------
# The epilogue's and the group's routes (priced here, chosen in planner/routes.py)

#: the unfused epilogue route's extra launch: ~5 µs measured between back-to-back launches on
#: an H100
UNFUSED_PASS_LAUNCH_S = 5e-6


def unfused_pass_s(desc, arch: ArchSpec) -> float:
    """The unfused epilogue route's time beyond its GEMM: the float32 product written and read
    back, the result written (bytes at DRAM bandwidth), and one more launch (H100, 4096³ bias +
    GELU: 0.236 ms fused in our kernel against 0.284 ms for cuBLAS and this pass).

    Example::

        >>> from pyblasgemm.planner import make_desc
        >>> from pyblasgemm.planner.arch import FAMILIES
        >>> round(unfused_pass_s(make_desc(4096, 4096, 4096, "f16"), FAMILIES["sm_90"]) * 1e6, 1)
        55.1
    """
    return desc.m * desc.n * desc.batch * (4 + 4 + desc.row.c_dtype.itemsize) / arch.dram_bw \
        + UNFUSED_PASS_LAUNCH_S


#: The grouped routes' model. The loop: one planned GEMM per group, at most LOOP_EFFICIENCY of
#: the chip's best peak (H200: torch.matmul's loop over 8 experts of ~1000 x 4096 x 4096
#: reached 0.86), and LOOP_CALL_S of host time per group (H200: our loop over 62 small
#: experts, 40 µs a group). The one persistent launch: GROUPED_EFFICIENCY of the mma.sync peak
#: (H200, the 8 experts above: 0.55) plus ONE_LAUNCH_S of host time (checks, table, launch).
LOOP_EFFICIENCY = 0.85
LOOP_CALL_S = 40e-6
GROUPED_EFFICIENCY = 0.55
ONE_LAUNCH_S = 60e-6


#: the Hopper grouped walk's mainloop (wgmma): this fraction of the chip's best peak (H200,
#: bench/results/grouped_sm90_h200_2026-11-29_9babe66.json: 8 experts of ~2150 x 4096 x 4096,
#: 628 TF/s = 0.63)
SM90_GROUPED_EFFICIENCY = 0.6
#: With the sizes on the GPU the loop reads them back first: the GPU's queue drains and every
#: GEMM is issued after it, so the loop's host time adds to its GPU time instead of hiding
#: behind it. H200, same file: the public call's loop over 8 large experts took 1359 µs where
#: the same cuBLAS GEMMs back to back took 810: 549 µs exposed = 8 x LOOP_CALL_S + ~230 µs.
READBACK_S = 200e-6


def grouped_times(sizes, kind: str, arch: ArchSpec, hopper: bool = False,
                  device_sizes: bool = False) -> tuple:
    """(one persistent launch, a loop of GEMMs) predicted seconds for problems of ``sizes``
    ((m, n, k) each) of kernel kind ``kind``: many small groups make the loop host-bound, a few
    large ones favour cuBLAS's wgmma over our mma.sync mainloop. ``hopper``: the one launch is
    the Hopper grouped walk (wgmma: :data:`SM90_GROUPED_EFFICIENCY` of the best peak);
    ``device_sizes``: the sizes are on the GPU, so the loop pays :data:`READBACK_S` and its host
    time in full.

    Example::

        >>> from pyblasgemm.planner.arch import FAMILIES
        >>> one, loop = grouped_times([(64, 16, 64)] * 64, "f16", FAMILIES["sm_90"])
        >>> one < loop                    # 64 small experts: the loop pays 64 host calls
        True
    """
    ours = (SM90_GROUPED_EFFICIENCY * arch.best_peak(kind) if hopper
            else GROUPED_EFFICIENCY * arch.mma_sync_peak(kind))
    theirs = LOOP_EFFICIENCY * arch.best_peak(kind)
    flops = [(2.0 * m * n * max(k, 1), m > 0 and n > 0) for m, n, k in sizes]
    one = sum(f for f, _ in flops) / ours + ONE_LAUNCH_S
    if device_sizes:
        loop = READBACK_S + sum(f / theirs + LOOP_CALL_S for f, live in flops if live)
    else:
        loop = sum(max(f / theirs, LOOP_CALL_S) for f, live in flops if live)
    return one, loop
