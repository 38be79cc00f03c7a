"""A CPU emulator of a plan's decomposition: which CTA computes which tile over which k range,
and in which order partial sums are combined, with NumPy on small problems.

It mirrors the device code's arithmetic line by line:

* :func:`geometry` - ``pyblasgemm.kernels.geometry.launch_geometry`` (grid, splits, k-steps per
  split, data-parallel and stream-k tile counts), re-derived here so a test can compare the two;
* :func:`coord` - ``TileScheduler::coord`` (grouped rasterization, ``scheduler/tile_scheduler.cuh``);
* :func:`sk_begin` / :func:`sk_cta_of` - the stream-k even split of MAC iterations;
* :func:`emulate` - the kernel's control flow per mode (``impls/sm80_gemm.cuh``): sliced;
  serial split-k (split ``s`` adds the running sum of splits ``0..s-1``, the last one finishes);
  parallel split-k (partials reduced in split order); stream-k and hybrid (data-parallel tiles
  first, ``t = cta, cta + G, ...``; then each CTA's iteration range; a CTA whose first segment
  starts mid-tile publishes into its own slot, the CTA holding k-step 0 adds the later CTAs'
  slots in CTA order and finishes the tile).

It counts every MAC iteration (tile, k-step) and every tile finish, and checks the invariants
the device code relies on (every stream-k CTA has work, a CTA publishes at most once, an owner
only waits on higher-numbered co-resident CTAs), so tests can prove coverage is exact.

Example::

    >>> import numpy as np
    >>> from pyblasgemm.kernels import KernelConfig
    >>> from emulator import emulate
    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.standard_normal((1, 70, 90)), rng.standard_normal((1, 90, 50))
    >>> r = emulate(a, b, KernelConfig(bm=64, bn=64, bk=16, decomposition="streamk"), sm_count=3)
    >>> bool(np.allclose(r.c, a @ b)), int(r.coverage.min()), int(r.coverage.max())
    (True, 1, 1)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pyblasgemm.kernels.config import KernelConfig

__all__ = ["geometry", "coord", "sk_begin", "sk_cta_of", "emulate", "Emulation", "WorkItem"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def geometry(m: int, n: int, k: int, batch: int, cfg: KernelConfig, sm_count: int,
             occupancy: int = 1) -> dict:
    """Grid and runtime parameters, the same arithmetic as ``launch_geometry``."""
    tiles_m, tiles_n = _cdiv(m, cfg.bm), _cdiv(n, cfg.bn)
    tpb = tiles_m * tiles_n
    tiles = tpb * batch
    kt = _cdiv(k, cfg.bk)
    if cfg.family == "sm90a":
        occupancy = 1
    g = dict(grid=(tpb, 1, batch), splits=1, kt_per_split=kt, dp_tiles=0, sk_tiles=0,
             ws_slots=0, flags=0, tiles=tiles, kt=kt)
    d = cfg.decomposition
    if d in ("splitk_serial", "splitk_parallel"):
        splits = cfg.splits
        if not splits:
            splits = max(2, min(kt // 4 if kt >= 8 else kt, _cdiv(sm_count, tiles)))
        splits = max(1, min(splits, kt))
        kps = _cdiv(kt, splits)
        splits = _cdiv(kt, kps)                       # no empty splits
        g.update(grid=(tpb, splits, batch), splits=splits, kt_per_split=kps)
        g.update(ws_slots=tiles, flags=tiles) if d == "splitk_serial" else g.update(ws_slots=tiles * splits)
    elif d in ("streamk", "hybrid"):
        G = max(1, sm_count * max(1, occupancy))
        if d == "hybrid":
            rem = tiles % G
            sk = 0 if rem == 0 else (rem + G if tiles >= 2 * G else tiles)
        else:
            sk = tiles
        dp = tiles - sk
        ctas = G if sk == 0 else min(G, sk * kt)
        if dp and ctas < G:
            ctas = G
        if dp % ctas:
            sk, dp = tiles, 0
            ctas = min(G, sk * kt)
        g.update(grid=(ctas, 1, 1), dp_tiles=dp, sk_tiles=sk, ws_slots=ctas, flags=ctas)
    if cfg.family == "sm90a":
        # the Hopper kernel: a persistent grid of at most sm_count CTAs in every decomposition
        # (one CTA per SM: its TMA ring fills shared memory); split-k partials are whole matrices
        if d == "sliced" and cfg.cluster > 1:
            units = _cdiv(tiles_n, cfg.cluster) * tiles_m * batch
            g["grid"] = (cfg.cluster * max(1, min(units, sm_count // cfg.cluster)), 1, 1)
        elif d == "sliced":
            g["grid"] = (min(tiles, sm_count), 1, 1)
        elif d == "splitk_parallel":
            g.update(grid=(min(tiles * g["splits"], sm_count), 1, 1), ws_slots=0)
            g["ws_bytes"] = g["splits"] * batch * m * n * 4
            return g
    g["ws_bytes"] = g["ws_slots"] * cfg.bm * cfg.bn * 4
    return g


def coord(tile: int, group: int, tiles_m: int, tiles_n: int) -> tuple[int, int, int]:
    """(batch, tile row, tile column) of linear tile ``tile``: ``TileScheduler::coord``."""
    tpb = tiles_m * tiles_n
    b = tile // tpb
    lin = tile - b * tpb
    width = group * tiles_n
    gid = lin // width
    first_m = gid * group
    gsize = tiles_m - first_m if tiles_m - first_m < group else group
    r = lin - gid * width
    return b, first_m + r % gsize, r // gsize


def sk_begin(c: int, total: int, ctas: int) -> int:
    """First MAC iteration of stream-k CTA ``c`` (CTA c owns [c*T/G, (c+1)*T/G))."""
    return (c * total) // ctas


def sk_cta_of(it: int, total: int, ctas: int) -> int:
    """The CTA whose range holds iteration ``it`` (largest c with sk_begin(c) <= it)."""
    return ((it + 1) * ctas + total - 1) // total - 1


@dataclass
class WorkItem:
    """One piece of a CTA's work, in the order the CTA does it."""

    cta: int              # linear CTA id (stream-k: blockIdx.x; else x + tpb*(y + splits*z))
    tile: int
    kb0: int
    kb1: int
    action: str           # 'finish', 'publish', 'chain' (serial split-k), 'partial' (parallel)
    consumes: tuple = ()  # CTAs (stream-k) or splits (split-k) whose partials are added, in order


@dataclass
class Emulation:
    """What :func:`emulate` computed and counted."""

    c: np.ndarray                 # (batch, m, n) result
    coverage: np.ndarray          # (tiles, kt) MAC iterations computed per (tile, k-step)
    finishes: np.ndarray          # (tiles,) times each tile's C was written
    geometry: dict
    work: list = field(default_factory=list)


def emulate(a: np.ndarray, b: np.ndarray, cfg: KernelConfig, sm_count: int = 4,
            occupancy: int = 1, alpha: float = 1.0, beta: float = 0.0, c: np.ndarray | None = None,
            dtype=np.float64) -> Emulation:
    """Run the decomposition of ``cfg`` on ``a`` (batch, m, k) @ ``b`` (batch, k, n) on the CPU.

    Products of (bm x bk) and (bk x bn) blocks are accumulated in ``dtype`` in the kernel's
    order; returns the result with the coverage and finish counts. Raises ``AssertionError``
    when an invariant of the device code would be broken (that is a bug, not a user error).
    """
    a = np.asarray(a, dtype=dtype)
    b = np.asarray(b, dtype=dtype)
    if cfg.family == "sm90a":
        return _emulate_sm90(a, b, cfg, sm_count, alpha, beta, c, dtype)
    batch, m, k = a.shape
    n = b.shape[2]
    g = geometry(m, n, k, batch, cfg, sm_count, occupancy)
    bm, bn, bk = cfg.bm, cfg.bn, cfg.bk
    tiles_m, tiles_n = _cdiv(m, bm), _cdiv(n, bn)
    tpb = tiles_m * tiles_n
    kt = g["kt"]
    tiles = g["tiles"]
    out = np.zeros((batch, m, n), dtype=dtype) if c is None else np.array(c, dtype=dtype)
    cov = np.zeros((tiles, max(kt, 1)), dtype=np.int64)
    fin = np.zeros(tiles, dtype=np.int64)
    work: list[WorkItem] = []

    def block(tile, kb0, kb1):
        """The tile's accumulator over k-steps [kb0, kb1), one k-step at a time."""
        bb, tm, tn = coord(tile, cfg.group_m, tiles_m, tiles_n)
        r0, c0 = tm * bm, tn * bn
        acc = np.zeros((bm, bn), dtype=dtype)
        rows, cols = min(bm, m - r0), min(bn, n - c0)
        for kb in range(kb0, kb1):
            k0, k1 = kb * bk, min(k, (kb + 1) * bk)
            acc[:rows, :cols] += a[bb, r0:r0 + rows, k0:k1] @ b[bb, k0:k1, c0:c0 + cols]
            cov[tile, kb] += 1
        return acc

    def finish(tile, acc):
        bb, tm, tn = coord(tile, cfg.group_m, tiles_m, tiles_n)
        r0, c0 = tm * bm, tn * bn
        rows, cols = min(bm, m - r0), min(bn, n - c0)
        view = out[bb, r0:r0 + rows, c0:c0 + cols]
        res = alpha * acc[:rows, :cols]
        view[...] = res if beta == 0 else res + beta * view   # beta == 0: C is not read
        fin[tile] += 1

    d = cfg.decomposition
    if d in ("sliced", "splitk_serial", "splitk_parallel"):
        splits, kps = g["splits"], g["kt_per_split"]
        gx, gy, gz = g["grid"]
        slots: dict = {}
        partials: dict = {}
        # blockIdx.y = split: lower splits first; the serial chain needs split s-1 before s,
        # which this order gives (the device gets it from its dispatch order + flag waits)
        for z in range(gz):
            for s in range(gy):
                for x in range(gx):
                    tile = z * tpb + x
                    cta = x + gx * (s + gy * z)
                    kb0, kb1 = 0, kt
                    if d != "sliced":
                        kb0 = s * kps
                        kb1 = kb0 + kps if kb0 + kps < kt else kt
                        if kb0 > kb1:
                            kb0 = kb1            # an empty split still takes part (adds zero)
                    acc = block(tile, kb0, kb1)
                    if d == "sliced":
                        work.append(WorkItem(cta, tile, kb0, kb1, "finish"))
                        finish(tile, acc)
                    elif d == "splitk_serial":
                        if s > 0:
                            have, running = slots.pop(tile)
                            assert have == s, f"split {s} of tile {tile} saw flag {have}"
                            acc = acc + running
                        if s < splits - 1:
                            slots[tile] = (s + 1, acc)
                            work.append(WorkItem(cta, tile, kb0, kb1, "chain", (s - 1,) if s else ()))
                        else:
                            work.append(WorkItem(cta, tile, kb0, kb1, "finish", (s - 1,) if s else ()))
                            finish(tile, acc)
                    else:
                        partials[(s, tile)] = acc
                        work.append(WorkItem(cta, tile, kb0, kb1, "partial"))
        if d == "splitk_parallel":
            for tile in range(tiles):            # the reduce kernel: split order, fixed
                acc = partials[(0, tile)].copy()
                for s in range(1, splits):
                    acc += partials[(s, tile)]
                finish(tile, acc)
        assert not slots, f"serial split-k left running sums unconsumed: {sorted(slots)}"
    else:
        G = g["grid"][0]
        dp, sk = g["dp_tiles"], g["sk_tiles"]
        total = sk * kt
        assert dp % G == 0, "data-parallel tiles must be whole waves"
        assert G <= max(1, sm_count * max(1, occupancy)), "stream-k CTAs must all be co-resident"
        if total:
            assert G <= total, "every stream-k CTA needs at least one MAC iteration"
        slot_of: dict = {}                     # cta -> (tile, partial)
        # an owner only waits on higher-numbered CTAs: run them first (reverse order)
        for cta in reversed(range(G)):
            for t in range(cta, dp, G):
                work.append(WorkItem(cta, t, 0, kt, "finish"))
                finish(t, block(t, 0, kt))
            if total == 0:
                continue
            it, end = sk_begin(cta, total, G), sk_begin(cta + 1, total, G)
            first = True
            while it < end:
                local = it // kt
                kb0 = it - local * kt
                seg_end = (local + 1) * kt if (local + 1) * kt < end else end
                kb1 = kb0 + (seg_end - it)
                tile = dp + local
                acc = block(tile, kb0, kb1)
                if kb0 != 0:
                    assert first, "only a CTA's first segment can start mid-tile"
                    assert cta not in slot_of, f"CTA {cta} would publish twice"
                    slot_of[cta] = (tile, acc)
                    work.append(WorkItem(cta, tile, kb0, kb1, "publish"))
                else:
                    consumed = ()
                    if kb1 != kt:
                        last = sk_cta_of((local + 1) * kt - 1, total, G)
                        consumed = tuple(range(cta + 1, last + 1))
                        for q in consumed:            # CTA order: a fixed summation order
                            assert q in slot_of, f"owner {cta} waits on CTA {q}, which never publishes"
                            q_tile, part = slot_of.pop(q)
                            assert q_tile == tile, f"CTA {q}'s slot holds tile {q_tile}, not {tile}"
                            acc = acc + part
                    work.append(WorkItem(cta, tile, kb0, kb1, "finish", consumed))
                    finish(tile, acc)
                first = False
                it = seg_end
        assert not slot_of, f"published partials never consumed: CTAs {sorted(slot_of)}"
    return Emulation(out, cov, fin, g, work)


def sm90_coord(unit: int, units_m: int, tiles_n: int, group: int, unit_m: int = 1,
               rank: int = 0) -> tuple[int, int, int]:
    """``sm90_coord`` of impls/sm90_gemm.cuh: (batch, tile row, tile column) of the D tile that
    CTA ``rank`` of a cluster takes in work unit ``unit`` (a unit = ``unit_m`` tile rows).

    Example::

        sm90_coord(5, units_m=3, tiles_n=4, group=8)               # -> (0, 2, 1)
        sm90_coord(5, units_m=2, tiles_n=4, group=8, unit_m=2, rank=1)   # -> (0, 3, 2): CTA 1 of a pair
    """
    per = units_m * tiles_n
    b = unit // per
    lin = unit - b * per
    width = group * tiles_n
    gid = lin // width
    first = gid * group
    gsize = min(group, units_m - first)
    return b, (first + (lin - gid * width) % gsize) * unit_m + rank, (lin - gid * width) // gsize


def _emulate_sm90(a, b, cfg: KernelConfig, sm_count: int, alpha, beta, c, dtype) -> Emulation:
    """The Hopper kernel's schedule. It computes D = P Q^T with D = C^T (rows over n, 128 per
    tile = ``cfg.bn``; columns over m, ``cfg.bm`` per tile), P = op(B)^T and Q = op(A), on a
    persistent grid: data-parallel units ``worker, worker + workers, ...`` (a unit = one tile, or
    with 2-CTA clusters two vertically adjacent tiles, one per CTA); split-k units (tile, split)
    the same way, reduced in split order; stream-k / hybrid exactly as the mma.sync kernel's
    (same control flow, emulated on the transposed problem)."""
    from dataclasses import replace

    batch, m, k = a.shape
    n = b.shape[2]
    pt, qt = np.swapaxes(b, 1, 2), np.swapaxes(a, 1, 2)      # P (batch, n, k), Q^T (batch, k, m)
    g = geometry(m, n, k, batch, cfg, sm_count)
    d = cfg.decomposition
    c_t = None if c is None else np.swapaxes(np.asarray(c, dtype=dtype), 1, 2)
    if d in ("streamk", "hybrid"):
        view = replace(cfg, bm=cfg.bn, bn=cfg.bm, family="sm80", cluster=1)
        r = emulate(pt, qt, view, sm_count=sm_count, occupancy=1, alpha=alpha, beta=beta, c=c_t, dtype=dtype)
        assert r.geometry["grid"] == g["grid"], (r.geometry["grid"], g["grid"])
        return Emulation(np.swapaxes(r.c, 1, 2), r.coverage, r.finishes, g, r.work)
    bmt, bnt, bk = cfg.bn, cfg.bm, cfg.bk
    tiles_m, tiles_n = _cdiv(n, bmt), _cdiv(m, bnt)
    kt = g["kt"]
    tiles = tiles_m * tiles_n * batch
    out = np.zeros((batch, n, m), dtype=dtype) if c_t is None else np.array(c_t)
    cov = np.zeros((tiles, max(kt, 1)), dtype=np.int64)
    fin = np.zeros(tiles, dtype=np.int64)
    work: list[WorkItem] = []

    def index(bb, tm, tn):
        return (bb * tiles_m + tm) * tiles_n + tn

    def block(bb, tm, tn, kb0, kb1):
        r0, c0 = tm * bmt, tn * bnt
        rows, cols = min(bmt, n - r0), min(bnt, m - c0)
        acc = np.zeros((bmt, bnt), dtype=dtype)
        for kb in range(kb0, kb1):
            k0, k1 = kb * bk, min(k, (kb + 1) * bk)
            acc[:rows, :cols] += pt[bb, r0:r0 + rows, k0:k1] @ qt[bb, k0:k1, c0:c0 + cols]
            cov[index(bb, tm, tn), kb] += 1
        return acc

    def finish(bb, tm, tn, acc):
        r0, c0 = tm * bmt, tn * bnt
        rows, cols = min(bmt, n - r0), min(bnt, m - c0)
        view = out[bb, r0:r0 + rows, c0:c0 + cols]
        res = alpha * acc[:rows, :cols]
        view[...] = res if beta == 0 else res + beta * view
        fin[index(bb, tm, tn)] += 1

    G = g["grid"][0]
    cl = cfg.cluster
    assert G % cl == 0 and G <= max(sm_count, cl), "a persistent grid of whole clusters, one CTA per SM"
    workers = G // cl
    if d == "sliced":
        units_m = _cdiv(tiles_m, cl)
        units = units_m * tiles_n * batch
        for worker in range(workers):
            for rank in range(cl):
                for u in range(worker, units, workers):
                    bb, tm, tn = sm90_coord(u, units_m, tiles_n, cfg.group_m, cl, rank)
                    if tm >= tiles_m:
                        continue  # the odd last row: this CTA loads its share, stores nothing
                    work.append(WorkItem(worker * cl + rank, index(bb, tm, tn), 0, kt, "finish"))
                    finish(bb, tm, tn, block(bb, tm, tn, 0, kt))
    else:
        assert d == "splitk_parallel", d
        splits, kps = g["splits"], g["kt_per_split"]
        partials = {}
        for worker in range(workers):
            for u in range(worker, tiles * splits, workers):
                t, sp = divmod(u, splits)
                kb0 = sp * kps
                kb1 = min(kb0 + kps, kt)
                assert kb0 < kb1, "the host leaves no split empty"
                bb, tm, tn = sm90_coord(t, tiles_m, tiles_n, cfg.group_m)
                partials[(sp, t)] = block(bb, tm, tn, kb0, kb1)
                work.append(WorkItem(worker, index(bb, tm, tn), kb0, kb1, "partial"))
        for t in range(tiles):                   # sm90_splitk_reduce: split order, fixed
            bb, tm, tn = sm90_coord(t, tiles_m, tiles_n, cfg.group_m)
            acc = partials[(0, t)].copy()
            for sp in range(1, splits):
                acc += partials[(sp, t)]
            finish(bb, tm, tn, acc)
    return Emulation(np.swapaxes(out, 1, 2), cov, fin, g, work)
