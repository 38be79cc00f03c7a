"""Launch geometry: grid, splits, k-steps per split, stream-k tiles and workspace of a config on
a problem (pure arithmetic, no GPU). The planner scores with it, the launchers launch with it,
the emulator (tests/emulator.py) checks it."""
from __future__ import annotations

from .config import SM90_PREP_KINDS, KernelConfig, sm90_prep_shape
from .problem import KernelProblem

__all__ = ["launch_geometry"]


def launch_geometry(problem: KernelProblem, config: KernelConfig, sm_count: int, occupancy: int = 1) -> dict:
    """Grid and runtime parameters for ``config`` on ``problem`` (pure arithmetic, no GPU).

    ``ws_bytes`` is the workspace the launch needs. The Hopper kernel (``config.family ==
    'sm90a'``) runs a persistent grid of at most ``sm_count`` CTAs for every decomposition; its
    split-k partials are whole fp32/s32 matrices, one per split. Its fp32 kinds run the
    prepared "TN" problem (K tripled for 3xTF32): geometry of that, ``prep_bytes`` of prepared
    operands added to ``ws_bytes``.
    """
    if config.is_sm90 and problem.kind in SM90_PREP_KINDS:
        from .sm90 import prepared_problem

        g = _launch_geometry(prepared_problem(problem), config, sm_count, occupancy)
        g["prep_bytes"] = sm90_prep_shape(problem)[2]
        g["ws_bytes"] += g["prep_bytes"]
        return g
    return _launch_geometry(problem, config, sm_count, occupancy)


def _launch_geometry(problem: KernelProblem, config: KernelConfig, sm_count: int, occupancy: int) -> dict:
    g = _geometry(problem, config, sm_count, 1 if config.is_sm90 else occupancy)
    p, c = problem, config
    if c.is_sm90:
        if c.decomposition == "sliced" and c.cluster > 1:
            # units of `cluster` tile rows along n (the pair shares its m-side operand)
            units = -(-(-(-p.n // c.bn)) // c.cluster) * -(-p.m // c.bm) * p.batch
            # at least one cluster, even when a test's sm_count override is below its size
            g.update(grid=(c.cluster * max(1, min(units, sm_count // c.cluster)), 1, 1))
        elif c.decomposition == "sliced":
            g.update(grid=(min(g["tiles"], sm_count), 1, 1))
        elif c.decomposition == "splitk_parallel":
            g.update(grid=(min(g["tiles"] * g["splits"], sm_count), 1, 1), ws_slots=0)
            g["ws_bytes"] = g["splits"] * p.batch * p.m * p.n * 4
            return g
    g["ws_bytes"] = g["ws_slots"] * c.bm * c.bn * 4
    return g


def _geometry(problem: KernelProblem, config: KernelConfig, sm_count: int, occupancy: int) -> dict:
    p, c = problem, config
    tiles_m, tiles_n = -(-p.m // c.bm), -(-p.n // c.bn)
    tpb = tiles_m * tiles_n
    tiles = tpb * p.batch
    kt = -(-p.k // c.bk)
    g = dict(grid=(tpb, 1, p.batch), splits=1, kt_per_split=kt, dp_tiles=0, sk_tiles=0,
             ws_slots=0, flags=0, tiles=tiles, kt=kt)
    d = c.decomposition
    if d.startswith("splitk"):
        splits = c.splits or max(2, min(kt // 4 if kt >= 8 else kt, -(-sm_count // tiles)))
        splits = max(1, min(splits, kt))
        kps = -(-kt // splits)
        splits = -(-kt // kps)  # no empty splits
        g.update(grid=(tpb, splits, p.batch), splits=splits, kt_per_split=kps)
        if d == "splitk_serial":
            g.update(ws_slots=tiles, flags=tiles)
        else:
            g.update(ws_slots=tiles * splits)
    elif d in ("streamk", "hybrid"):
        G = max(1, sm_count * max(1, occupancy))
        if d == "hybrid":
            rem = tiles % G
            sk = 0 if rem == 0 else (rem + G if tiles >= 2 * G else tiles)
        else:
            sk = tiles
        dp = tiles - sk
        # every stream-k CTA needs >= 1 MAC iteration (the owner waits on each in between)
        ctas = G if sk == 0 else min(G, sk * kt)
        if dp and ctas < G:
            ctas = G
        if dp % ctas:
            # data-parallel tiles must be a whole number of waves of this grid
            sk, dp = tiles, 0
            ctas = min(G, sk * kt)
        g.update(grid=(ctas, 1, 1), dp_tiles=dp, sk_tiles=sk, ws_slots=ctas, flags=ctas)
    return g
