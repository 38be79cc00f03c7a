"""Launch specs: everything about launching one config on one problem class except the pointers.

A :class:`LaunchSpec` is computed once, when the planner decides (pure arithmetic, no GPU):
grid, block, shared memory, workspace, split counts, stream-k tile counts and the values of
every kernel argument but the operand pointers and the scales. The plan carries it, the
launchers (:class:`~pyblasgemm.kernels.mma_sync.BoundLaunch`, the Hopper ones) pack it into
their argument cells once per stream and refill only pointers per call, and autotune binds the
same spec, so what the plan shows is what runs.

Two facts only the device knows can change a spec at bind time, both for safety: a stream-k
grid is shrunk when the driver fits fewer CTAs per SM than the model assumed (its CTAs wait on
each other, so all must be resident), and a Hopper cluster grid is clipped to the clusters the
driver can place. The bound launch's ``spec`` then says what actually runs.

Example
-------
>>> from pyblasgemm.kernels import KernelProblem, default_config
>>> from pyblasgemm.kernels.spec import launch_spec
>>> p = KernelProblem("f16", "N", "N", 1000, 1000, 4096, 1000, 4096, 1000, 0, 0, 0)
>>> cfg = default_config(p, 132)
>>> cfg.name
'splitk_serial_128x128x64_w2x2_s3_k3_g8'
>>> s = launch_spec(p, cfg, sm_count=132)
>>> s.grid, s.block, s.splits, s.workspace_bytes      # 64 tiles x 3 K-splits, fp32 partials
((64, 3, 1), 128, 3, 4194304)
>>> s.args["kt_per_split"], s.args["a"]               # pointers are not planned
(22, 0)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from .config import KernelConfig
from .geometry import launch_geometry
from .problem import KernelProblem

__all__ = ["LaunchSpec", "launch_spec", "problem_class"]


def problem_class(p: KernelProblem) -> tuple:
    """What a launch depends on besides pointer values and scales: kind, layout, sizes, leading
    dimensions, batch strides, and the alignment class of the pointers (16-byte vectorizable
    operands and C, or not)."""
    return (p.kind, p.acc, p.transa, p.transb, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.batch,
            p.stride_a, p.stride_b, p.stride_c, p.operands_vectorizable(), p.c_vectorizable())


@dataclass(frozen=True, eq=False)
class LaunchSpec:
    """One config on one problem class, launched on ``sm_count`` SMs at ``occupancy`` CTAs per
    SM: the geometry (``launch_geometry``'s), shared memory, block size, and the GEMM kernel's
    argument values (``args``; pointers and scales 0) and its split-k reduce kernel's
    (``red_args``, None without one)."""

    config: KernelConfig
    problem_class: tuple
    sm_count: int
    occupancy: int
    geometry: MappingProxyType
    smem: int
    args: MappingProxyType
    red_args: MappingProxyType | None = field(default=None)

    @property
    def grid(self) -> tuple:
        return tuple(self.geometry["grid"])

    @property
    def block(self) -> int:
        return self.config.threads

    @property
    def splits(self) -> int:
        return self.geometry["splits"]

    @property
    def workspace_bytes(self) -> int:
        return self.geometry["ws_bytes"]

    def same_as(self, other: "LaunchSpec") -> bool:
        """Whether ``other`` launches exactly this (the launchers' check of a plan's spec)."""
        return (self.config == other.config and self.problem_class == other.problem_class
                and self.sm_count == other.sm_count and self.occupancy == other.occupancy
                and dict(self.geometry) == dict(other.geometry) and self.smem == other.smem
                and dict(self.args) == dict(other.args)
                and (None if self.red_args is None else dict(self.red_args))
                == (None if other.red_args is None else dict(other.red_args)))


def launch_spec(problem: KernelProblem, config: KernelConfig, sm_count: int,
                occupancy: int = 1) -> LaunchSpec:
    """The :class:`LaunchSpec` of ``config`` on ``problem``'s class (pure arithmetic).

    ``occupancy`` (CTAs per SM) matters to stream-k and hybrid grids only; a family with a
    fixed ``ctas_per_sm`` (the Hopper kernel: one) runs that whatever is given."""
    family = config.kernel_family
    occ = family.ctas_per_sm or max(1, int(occupancy))
    g = launch_geometry(problem, config, sm_count, occ)
    args, red = family.kernel_args(problem, config, g)
    return LaunchSpec(config, problem_class(problem), sm_count, occ, MappingProxyType(dict(g)),
                      config.smem_bytes(problem.kind), MappingProxyType(args),
                      None if red is None else MappingProxyType(red))
