"""Architecture specs: one per SM family (sm_80, sm_86, sm_89, sm_90), refined from the device.

The planner's cost model needs a handful of numbers per GPU: SM count, shared memory and
register limits (occupancy), DRAM bandwidth, and the peak rates of the instructions our kernels
(``mma.sync``) and cuBLAS (``wgmma`` on Hopper) use. Each family has a datasheet default
(:data:`FAMILIES`); :func:`arch_for_device` overwrites what the device reports (SM count, shared
memory, registers, clocks, L2) and keeps the rest. Without a GPU :func:`default_arch` is the
H100 SXM spec, the machine the calibration was measured on.

Example::

    >>> from pyblasgemm.planner.arch import FAMILIES
    >>> FAMILIES["sm_90"].sm_count
    132
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from .. import settings as _env
from ..kinds import FP8_KINDS, KERNEL_KINDS

__all__ = ["ArchSpec", "FAMILIES", "default_arch", "arch_for_device", "family_of", "device_identity"]


@dataclass(frozen=True)
class ArchSpec:
    """What the cost model knows about one GPU (rates in FLOP/s, bandwidths in bytes/s)."""

    family: str                 # 'sm_90'
    name: str                   # device or datasheet name
    cc: tuple                   # compute capability (9, 0)
    sm_count: int
    clock_ghz: float            # boost clock the peaks below are computed at
    smem_per_block_optin: int   # opt-in dynamic shared memory per CTA (bytes)
    smem_per_sm: int            # shared memory per SM (bytes)
    regs_per_sm: int
    max_threads_per_sm: int
    max_ctas_per_sm: int
    l2_bytes: int
    dram_bw: float              # bytes/s
    # dense tensor FLOPs per SM per clock, per kernel kind, for mma.sync (what our kernels
    # issue) and for the best instruction of the family (what cuBLAS uses: wgmma on sm_90)
    mma_sync_per_sm_clk: dict = field(default_factory=dict)
    best_per_sm_clk: dict = field(default_factory=dict)
    simt_fp32_per_sm_clk: int = 128     # FLOPs (an FMA counts 2) per SM per clock
    fp64_per_sm_clk: int = 128
    from_device: bool = False

    @property
    def key(self) -> tuple:
        """A hashable identity of the spec (plans made for it are memoized under it)."""
        return (self.family, self.name, self.cc, self.sm_count, self.clock_ghz,
                self.smem_per_block_optin, self.smem_per_sm, self.regs_per_sm, self.dram_bw)

    @property
    def l2_bw(self) -> float:
        """L2 bandwidth, bytes/s: assumed 2.5x DRAM (H100: ~8 TB/s vs 3.35 TB/s HBM)."""
        return 2.5 * self.dram_bw

    def mma_sync_peak(self, kind: str) -> float:
        """Chip-wide mma.sync peak for ``kind`` ('f16', 'bf16', 's8', 'tf32', '3xtf32'), FLOP/s;
        for a kind of the kinds table's FMA rows ('f32') the FP32 FMA rate."""
        per = (self.simt_fp32_per_sm_clk if KERNEL_KINDS[kind].simt
               else self.mma_sync_per_sm_clk[kind])
        return per * self.sm_count * self.clock_ghz * 1e9

    def best_peak(self, kind: str) -> float:
        """Chip-wide peak of the family's best instruction for ``kind`` (cuBLAS's), FLOP/s."""
        per = self.best_per_sm_clk.get(kind)
        if per is None:
            per = self.fp64_per_sm_clk if kind == "fp64" else self.simt_fp32_per_sm_clk
        return per * self.sm_count * self.clock_ghz * 1e9

    def short(self) -> str:
        src = "from the device" if self.from_device else "datasheet default, no GPU read"
        return (f"{self.name} ({self.family}, {self.sm_count} SMs, "
                f"{self.smem_per_block_optin // 1024} KB smem/CTA, {self.dram_bw / 1e12:.2f} TB/s; "
                f"{src})")


def _rates(f16: int, tf32: int, s8: int, fp8: bool = False) -> dict:
    # 3xTF32 issues three tf32 MMAs per useful product: a third of the tf32 rate in useful FLOPs.
    # float8 (sm_89+: mma.sync m16n8k32 .e4m3 / .e5m2, wgmma k32) runs at int8's rate (H100
    # datasheet: 1,979 TF/s dense FP8, as int8's TOPS)
    rates = {"f16": f16, "bf16": f16, "tf32": tf32, "3xtf32": tf32 // 3, "s8": s8}
    return dict(rates, **{kind: s8 for kind in FP8_KINDS.values()}) if fp8 else rates


#: datasheet defaults per family (dense rates; H100: 989 TF/s fp16 = 4096 FLOP/SM/clk x 132 x
#: 1.83 GHz; mma.sync on Hopper reaches about 2/3 of wgmma's rate, PERFORMANCE.md)
FAMILIES = {
    "sm_80": ArchSpec("sm_80", "A100 SXM (datasheet)", (8, 0), 108, 1.41, 166912, 167936, 65536,
                      2048, 32, 40 << 20, 2.039e12, _rates(2048, 1024, 4096),
                      dict(_rates(2048, 1024, 4096), fp64=128), 128, 128),
    "sm_86": ArchSpec("sm_86", "A10 (datasheet)", (8, 6), 72, 1.695, 101376, 102400, 65536, 1536,
                      16, 6 << 20, 0.6e12, _rates(1024, 512, 2048), _rates(1024, 512, 2048), 256, 4),
    "sm_89": ArchSpec("sm_89", "L40S (datasheet)", (8, 9), 142, 2.52, 101376, 102400, 65536, 1536,
                      24, 96 << 20, 0.864e12, _rates(1024, 512, 2048, fp8=True),
                      _rates(1024, 512, 2048, fp8=True), 256, 4),
    "sm_90": ArchSpec("sm_90", "H100 SXM (datasheet)", (9, 0), 132, 1.83, 232448, 233472, 65536,
                      2048, 32, 50 << 20, 3.35e12, _rates(2731, 1365, 5461, fp8=True),
                      dict(_rates(4096, 2048, 8192, fp8=True), fp64=256), 256, 256),
}


def family_of(cc: tuple) -> str | None:
    """The family spec name for a compute capability: (9, 0) -> 'sm_90'; None before sm_80."""
    major, minor = cc
    if major < 8:
        return None
    if major == 8:
        return {0: "sm_80", 6: "sm_86", 7: "sm_86", 9: "sm_89"}.get(minor, "sm_86")
    return "sm_90"   # sm_90 and later run the sm_80 kernels; rates of the last known family


def default_arch() -> ArchSpec:
    """The spec used without a GPU: ``PYBLASGEMM_ARCH`` (e.g. 'sm_80') or the H100's."""
    return FAMILIES[_env.get("PYBLASGEMM_ARCH", tuple(FAMILIES)) or "sm_90"]


_lock = threading.Lock()
_by_device: dict = {}


def _attr(attrs: dict, name: str, default):
    v = attrs.get(name)
    return default if v in (None, 0) else v


def arch_for_device(device: int) -> ArchSpec:
    """The spec for CUDA device ``device``: its family's defaults with the device's own limits.

    Falls back to :func:`default_arch` when no GPU can be read (no CuPy, no driver). A
    ``PYBLASGEMM_ARCH`` setting wins over the device (plan for another GPU). Memoized.
    """
    spec = _by_device.get(device)
    if spec is not None:
        return spec
    if _env.get("PYBLASGEMM_ARCH", tuple(FAMILIES)) or device < 0:
        spec = default_arch()
    else:
        spec = _read_device(device)
    with _lock:
        _by_device[device] = spec
    return spec


def _read_device(device: int) -> ArchSpec:
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(device)
        attrs = cupy.cuda.Device(device).attributes
    except Exception:
        return default_arch()
    cc = (int(props["major"]), int(props["minor"]))
    fam = family_of(cc)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    base = FAMILIES[fam] if fam else FAMILIES["sm_80"]
    clock_khz = _attr(attrs, "ClockRate", 0)
    mem_khz = _attr(attrs, "MemoryClockRate", 0)
    bus_bits = _attr(attrs, "GlobalMemoryBusWidth", 0)
    dram = 2 * mem_khz * 1e3 * bus_bits / 8 if mem_khz and bus_bits else base.dram_bw
    return replace(
        base, family=fam or f"sm_{cc[0]}{cc[1]}", name=name, cc=cc,
        sm_count=int(_attr(attrs, "MultiProcessorCount", base.sm_count)),
        clock_ghz=clock_khz / 1e6 if clock_khz else base.clock_ghz,
        smem_per_block_optin=int(_attr(attrs, "MaxSharedMemoryPerBlockOptin",
                                       base.smem_per_block_optin)),
        smem_per_sm=int(_attr(attrs, "MaxSharedMemoryPerMultiprocessor", base.smem_per_sm)),
        regs_per_sm=int(_attr(attrs, "MaxRegistersPerMultiprocessor", base.regs_per_sm)),
        max_threads_per_sm=int(_attr(attrs, "MaxThreadsPerMultiProcessor",
                                     base.max_threads_per_sm)),
        max_ctas_per_sm=int(_attr(attrs, "MaxBlocksPerMultiprocessor", base.max_ctas_per_sm)),
        l2_bytes=int(_attr(attrs, "L2CacheSize", base.l2_bytes)),
        dram_bw=dram, from_device=True)


def device_identity(device: int) -> dict:
    """What autotuned results are only valid for: device name, compute capability, driver and
    NVRTC versions (needs CuPy and a GPU)."""
    import cupy

    from ..kernels import nvrtc

    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"device": name, "cc": f"{props['major']}.{props['minor']}",
            "driver": int(cupy.cuda.runtime.driverGetVersion()),
            "nvrtc": ".".join(str(v) for v in nvrtc.getVersion())}
