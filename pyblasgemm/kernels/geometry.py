"""Launch geometry: grid, splits, k-steps per split, stream-k tiles and workspace of a config on
a problem (pure arithmetic, no GPU). The planner scores with it, the launchers launch with it,
the emulator (tests/emulator.py) checks it."""
from __future__ import annotations

from .config import KernelConfig
from .problem import KernelProblem

__all__ = ["launch_geometry", "tile_geometry"]


def launch_geometry(problem: KernelProblem, config: KernelConfig, sm_count: int, occupancy: int = 1) -> dict:
    """Grid and runtime parameters for ``config`` on ``problem`` (pure arithmetic, no GPU): its
    family's (``KernelFamily.geometry``), on :func:`tile_geometry`.

    ``ws_bytes`` is the workspace the launch needs. The Hopper kernel (``config.family ==
    'sm90a'``) runs a persistent grid of at most ``sm_count`` CTAs for every decomposition; its
    split-k partials are whole fp32/s32 matrices, one per split. Its fp32 kinds run the
    prepared "TN" problem (K tripled for 3xTF32): geometry of that, ``prep_bytes`` of prepared
    operands added to ``ws_bytes``.
    """
    return config.kernel_family.geometry(problem, config, sm_count, occupancy)


def tile_geometry(problem: KernelProblem, config: KernelConfig, sm_count: int, occupancy: int) -> dict:
    """The tile arithmetic every family starts from: output tiles, K steps, and per
    decomposition the splits, the stream-k / hybrid split of tiles over a grid of ``sm_count x
    occupancy`` CTAs, workspace slots and flags (no ``ws_bytes``: the family's)."""
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
