"""A NumPy emulator of the GEMV kernel (``include/pyblasgemm/gemv/gemv.cuh``), on small problems.

It mirrors the device code's index arithmetic, so the CPU tests can prove it exact without a GPU:

* :func:`warp_accumulators` - one warp's mainloop (every path): what each lane loads (rows
  clamped to R - 1, tokens to T - 1, K and R tails as zeros), how the words become mma.sync
  fragments (``mma`` places each element by the PTX fragment layout), the FFMA paths' per-lane
  sums; it returns the lanes' accumulators, which :func:`coord` places in C;
* :func:`run` - the CTA framework: the grid's unit ranges, each row tile's contributors, the
  workspace slots ``rt + c``, the warps-along-k and KSPLIT sums in order, and the finisher's sum
  in contributor order; it returns C and the bookkeeping tests check (coverage, slot use);
* :func:`run_rows` - the row-block split (gemv_rows_kernel): CTA c takes row blocks c, c + G,
  ...; its WK warps take warp steps w, w + WK, ...; their sums are added in warp order and
  stored, no workspace.

Example::

    >>> import numpy as np
    >>> from pyblasgemm._types import TYPE_ROWS
    >>> from pyblasgemm.desc import describe
    >>> from pyblasgemm.kernels import gemv
    >>> d = describe("t", TYPE_ROWS["h"], "fp32", "T", "N", 40, 3, 70, 70, 70, 40, 1, 0, 0, 0,
    ...              "cupy", 0, (16,), 1.0, 0.0)
    >>> spec = gemv.plan(d, sm_count=3)
    >>> rng = np.random.default_rng(0)
    >>> w, x = rng.integers(-3, 4, (40, 70)), rng.integers(-3, 4, (3, 70))
    >>> out = run(spec, w, x)
    >>> bool(np.array_equal(out.c, w @ x.T)), int(out.coverage.min()), int(out.coverage.max())
    (True, 1, 1)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyblasgemm.kernels import gemv

__all__ = ["mma", "warp_accumulators", "coord", "lane_at", "run", "run_rows", "Emulation"]


# ---- mma.sync fragments (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k32") -----------------
def _a_positions(per: int, g: int, q: int) -> list:
    """(row, col) of each element of a lane's four A registers, in register order."""
    if per == 2:   # m16n8k16, 16-bit: a0a1 (g, 2q..), a2a3 (g+8, 2q..), a4a5 (g, 2q+8..), a6a7 (g+8, 2q+8..)
        return [[(g, 2 * q + e) for e in range(2)], [(g + 8, 2 * q + e) for e in range(2)],
                [(g, 2 * q + 8 + e) for e in range(2)], [(g + 8, 2 * q + 8 + e) for e in range(2)]]
    return [[(g, 4 * q + e) for e in range(4)], [(g + 8, 4 * q + e) for e in range(4)],   # m16n8k32, int8
            [(g, 16 + 4 * q + e) for e in range(4)], [(g + 8, 16 + 4 * q + e) for e in range(4)]]


def _b_positions(per: int, g: int, q: int) -> list:
    if per == 2:
        return [[(2 * q + e, g) for e in range(2)], [(2 * q + 8 + e, g) for e in range(2)]]
    return [[(4 * q + e, g) for e in range(4)], [(16 + 4 * q + e, g) for e in range(4)]]


def _c_positions(g: int, q: int) -> list:
    return [(g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1)]


def _places(positions, per: int, nregs: int):
    """Index arrays (rows, cols) of every (lane, register, element) in ``positions``' layout."""
    rows = np.zeros((32, nregs, per), dtype=int)
    cols = np.zeros((32, nregs, per), dtype=int)
    for lane in range(32):
        for r, reg in enumerate(positions(per, lane >> 2, lane & 3)):
            for e, (i, j) in enumerate(reg):
                rows[lane, r, e], cols[lane, r, e] = i, j
    return rows, cols


_PLACES = {per: (_places(_a_positions, per, 4), _places(_b_positions, per, 2)) for per in (2, 4)}
_C_ROWS = np.array([[i for i, _ in _c_positions(lane >> 2, lane & 3)] for lane in range(32)])
_C_COLS = np.array([[j for _, j in _c_positions(lane >> 2, lane & 3)] for lane in range(32)])


def mma(d, a, b, per: int) -> None:
    """d[lane][0..4) += the warp's m16n8k(8 per) product of the lanes' registers: a[lane] is four
    registers, b[lane] two, each a list of ``per`` element values (low bits first), placed by
    the PTX fragment layout (a bijection: test_gemv_host checks it)."""
    (ar, ac), (br, bc) = _PLACES[per]
    A, B = np.zeros((16, 8 * per)), np.zeros((8 * per, 8))
    A[ar, ac] = np.asarray(a, dtype=float)
    B[br, bc] = np.asarray(b, dtype=float)
    D = A @ B
    d += D[_C_ROWS, _C_COLS]


# ---- one warp's mainloop -------------------------------------------------------------------------
def _vec(line, p0: int, n: int, limit: int) -> list:
    """Elements p0 .. p0 + n of a line, zero from ``limit`` on (the header's gather / zero)."""
    return [float(line[p]) if p < limit else 0.0 for p in range(p0, p0 + n)]


def _words(vals: list, per: int) -> list:
    return [vals[i:i + per] for i in range(0, len(vals), per)]


def warp_accumulators(spec, w, x, row0: int, steps) -> np.ndarray:
    """The accumulators [32][FRAG] of the warp whose first row is ``row0`` after its mainloop
    over the warp steps ``steps`` (``w``: R x K, ``x``: T x K, any numeric arrays)."""
    R, T, K = spec.R, spec.T, spec.K
    eb, tg_n, p1, p2 = spec.kind.elem_bytes, spec.token_groups, spec.p1, spec.p2
    path = spec.path
    if path == "mma_k":
        ve, per, rg_n, kv = 16 // eb, 4 // eb, p1, p2
        acc = [[0.0] * (rg_n * tg_n * 4) for _ in range(32)]
        for ks in steps:
            k0 = ks * 4 * kv * ve
            wv = [[[[None] * kv for _ in range(2)] for _ in range(rg_n)] for _ in range(32)]
            xv = [[[None] * kv for _ in range(tg_n)] for _ in range(32)]
            for lane in range(32):
                g, q = lane >> 2, lane & 3
                for rg in range(rg_n):
                    for h in range(2):
                        row = min(row0 + 16 * rg + 8 * h + g, R - 1)
                        for j in range(kv):
                            wv[lane][rg][h][j] = _words(_vec(w[row], k0 + (4 * j + q) * ve, ve, K), per)
                for tg in range(tg_n):
                    tok = min(8 * tg + g, T - 1)
                    for j in range(kv):
                        xv[lane][tg][j] = _words(_vec(x[tok], k0 + (4 * j + q) * ve, ve, K), per)
            for rg in range(rg_n):
                for tg in range(tg_n):
                    if 8 * tg >= T:
                        continue
                    fresh = np.zeros((32, 4))
                    for j in range(kv):
                        for half in (0, 1):       # MMA #1: words .x .y; MMA #2: .z .w
                            a = [[wv[ln][rg][0][j][2 * half], wv[ln][rg][1][j][2 * half],
                                  wv[ln][rg][0][j][2 * half + 1], wv[ln][rg][1][j][2 * half + 1]] for ln in range(32)]
                            b = [[xv[ln][tg][j][2 * half], xv[ln][tg][j][2 * half + 1]] for ln in range(32)]
                            mma(fresh, a, b, per)
                    for ln in range(32):
                        for e in range(4):
                            acc[ln][(rg * tg_n + tg) * 4 + e] += fresh[ln][e]
        return np.array(acc)
    if path == "mma_r":
        rpt, mt_n = p1, p1 // 2
        acc = [[0.0] * (mt_n * tg_n * 4) for _ in range(32)]
        for ks in steps:
            k0 = ks * 16
            P = [None] * 32
            xv = [[None] * tg_n for _ in range(32)]
            for lane in range(32):
                g, q = lane >> 2, lane & 3
                r0 = row0 + rpt * g
                # vector path: R % RPT == 0 and a vector wholly past R reads the last RPT rows;
                # element path: rows past R read 0 (either way those rows are never stored)
                rv = r0 if r0 < R or not spec.loads & gemv.W_VEC else R - rpt
                cols = []
                for c in range(4):
                    k = k0 + 4 * q + c
                    col = [float(w[r, k]) if (k < K and (r < R)) else 0.0 for r in range(rv, rv + rpt)]
                    cols.append(col)
                P[lane] = [[[cols[0][i], cols[1][i]], [cols[2][i], cols[3][i]]] for i in range(rpt)]
                for tg in range(tg_n):
                    tok = min(8 * tg + g, T - 1)
                    xv[lane][tg] = _words(_vec(x[tok], k0 + 4 * q, 4, K), 2)
            for tg in range(tg_n):
                if 8 * tg >= T:
                    continue
                for mt in range(mt_n):
                    a = [[P[ln][2 * mt][0], P[ln][2 * mt + 1][0], P[ln][2 * mt][1], P[ln][2 * mt + 1][1]]
                         for ln in range(32)]
                    b = [xv[ln][tg] for ln in range(32)]
                    fresh = np.zeros((32, 4))
                    mma(fresh, a, b, 2)
                    for ln in range(32):
                        for e in range(4):
                            acc[ln][(mt * tg_n + tg) * 4 + e] += fresh[ln][e]
        return np.array(acc)
    lanes = np.arange(32)
    wz = np.zeros((R, K + 64))      # zeros past K: the guarded loads' values
    wz[:, :K] = w
    xz = np.zeros((T, K + 64))
    xz[:, :K] = x
    if path == "fma_k":
        ve, rpt, lt = 16 // eb, p1, p2
        rlanes, tpt = 4 // lt, 8 * tg_n // lt
        kl, sub = lanes & 7, lanes >> 3
        rl, tl = sub % rlanes, sub // rlanes
        acc = np.zeros((32, rpt * tpt))
        rows = np.minimum(row0 + np.arange(rpt)[None, :] * rlanes + rl[:, None], R - 1)   # [lane, i]
        toks = tl[:, None] + lt * np.arange(tpt)[None, :]                                 # [lane, jj]
        live = toks < T
        tk = np.minimum(toks, T - 1)
        for ks in steps:
            kk = (ks * 8 * ve + kl * ve)[:, None] + np.arange(ve)[None, :]                # [lane, e]
            wl = wz[rows[:, :, None], kk[:, None, :]]                                      # [lane, i, e]
            xl = xz[tk[:, :, None], kk[:, None, :]] * live[:, :, None]                     # [lane, jj, e]
            acc += np.einsum("lie,lje->lij", wl, xl).reshape(32, rpt * tpt)
        return acc
    lt = p1
    lr, tpt = 32 // lt, 8 * tg_n // lt
    rl, tl = lanes % lr, lanes // lr
    r0 = row0 + rl * 4
    rv = np.where((r0 < R) | (not spec.loads & gemv.W_VEC), r0, R - 4)
    rows = rv[:, None] + np.arange(4)[None, :]                                            # [lane, e]
    wpad = np.zeros((R + 512, K + 64))
    wpad[:R, :K] = w                 # rows past R read 0 (element path; never stored either way)
    toks = tl[:, None] + lt * np.arange(tpt)[None, :]                                     # [lane, i]
    live = toks < T
    tk = np.minimum(toks, T - 1)
    acc = np.zeros((32, 4 * tpt))
    for ks in steps:
        kk = 4 * ks + np.arange(4)                                                          # [c]
        wl = wpad[rows[:, :, None], kk[None, None, :]]                                    # [lane, e, c]
        xl = xz[tk[:, :, None], kk[None, None, :]] * live[:, :, None]                      # [lane, i, c]
        acc += np.einsum("lec,lic->lei", wl, xl).reshape(32, 4 * tpt)
    return acc


def coord(spec, i: int, lane: int) -> tuple:
    """(row within the warp, token) of accumulator ``i`` of ``lane`` (the header's coord)."""
    tg_n, p1 = spec.token_groups, spec.p1
    if spec.path in ("mma_k", "mma_r"):
        g, q = lane >> 2, lane & 3
        blk, tg, e = i // (tg_n * 4), (i // 4) % tg_n, i % 4
        tok = 8 * tg + 2 * q + (e & 1)
        if spec.path == "mma_k":
            return 16 * blk + g + 8 * (e >> 1), tok
        return p1 * g + 2 * blk + (e >> 1), tok
    if spec.path == "fma_k":
        lt = spec.p2
        rlanes, tpt, sub = 4 // lt, 8 * tg_n // lt, lane >> 3
        return (i // tpt) * rlanes + sub % rlanes, sub // rlanes + lt * (i % tpt)
    lr, tpt = 32 // p1, 8 * tg_n // p1
    return (lane % lr) * 4 + i // tpt, lane // lr + p1 * (i % tpt)


def lane_at(spec, pos: int) -> int:
    """The lane whose accumulator sits at workspace position ``pos`` (0..31) of its row of 32
    (the header's M::lane_at)."""
    if spec.path in ("mma_k", "mma_r"):
        return (pos & 7) * 4 + (pos >> 3)
    if spec.path == "fma_k":
        return (pos & 3) * 8 + (pos >> 2)
    return pos


def ksplit(spec) -> int:
    return 8 if spec.path == "fma_k" else 1


# ---- the CTA framework ---------------------------------------------------------------------------
@dataclass
class Emulation:
    c: np.ndarray              # R x T
    coverage: np.ndarray       # row_tiles x wsteps: how often each warp step of each row column ran
    stored: np.ndarray         # R x T: how often each entry of C was stored
    slots_used: list           # every workspace slot index written
    contributors: dict         # row tile -> contributor CTAs in order


def _geometry(spec):
    rows, kstep, out, _, _ = gemv._geometry(spec.path, spec.p1, spec.p2, spec.token_groups, spec.kind.elem_bytes)
    return rows, kstep, out


def cta_of(u: int, units: int, G: int) -> int:
    return ((u + 1) * G - 1) // units


def run(spec, w, x, alpha=1.0, beta=0.0, c=None) -> Emulation:
    """C (R x T) = alpha W Xᵀ + beta C the way the kernel computes it (see the module docstring)."""
    R, T, K = spec.R, spec.T, spec.K
    rows, kstep, out = _geometry(spec)
    WR, WK, G = spec.wr, spec.wk, spec.ctas
    wsteps = -(-K // kstep)
    csteps = -(-wsteps // WK)
    assert csteps == spec.csteps and spec.cta_rows == WR * rows
    units = spec.row_tiles * csteps
    c = np.zeros((R, T)) if c is None else np.array(c, dtype=float)
    result = c.copy()
    coverage = np.zeros((spec.row_tiles, WR, wsteps), dtype=int)
    stored = np.zeros((R, T), dtype=int)
    ws: dict = {}
    counters = np.zeros(spec.row_tiles, dtype=int)
    contributors: dict = {}
    n_entries = WR * out * 32
    arrivals = []      # (cta, rt) in CTA order: any order gives the same sums, which run() checks
    partial_of: dict = {}
    for cta in range(G):
        u, u_end = cta * units // G, (cta + 1) * units // G
        assert u < u_end, "every CTA has at least one unit"
        while u < u_end:
            rt = u // csteps
            tile_u0 = rt * csteps
            seg_end = min(u_end, tile_u0 + csteps)
            s0, s1 = u - tile_u0, seg_end - tile_u0
            park = np.zeros((WK * WR, out, 32))
            for warp in range(WK * WR):
                wr_, wk_ = warp % WR, warp // WR
                steps = list(range(s0 * WK + wk_, min(s1 * WK, wsteps), WK))
                for ks in steps:
                    coverage[rt, wr_, ks] += 1
                acc = warp_accumulators(spec, w, x, rt * spec.cta_rows + wr_ * rows, steps)
                park[warp] = acc[:, :out].T
            park = park.reshape(WK, n_entries)
            first, last = cta_of(tile_u0, units, G), cta_of(tile_u0 + csteps - 1, units, G)
            contributors.setdefault(rt, []).append(cta)
            sums = {}     # workspace position -> (row, token, the CTA's sum)
            for pos in range(n_entries):
                ln = lane_at(spec, pos & 31)
                e = (pos & ~31) | ln
                r, tok = coord(spec, (pos >> 5) % out, ln)
                r += rt * spec.cta_rows + (pos // (32 * out)) * rows
                if ln % ksplit(spec) or r >= R or tok >= T:
                    continue
                v = 0.0
                for k in range(WK):
                    for j in range(ksplit(spec)):
                        v += park[k, e + j]
                sums[pos] = (r, tok, v)
            if first == last:
                for r, tok, v in sums.values():
                    result[r, tok] = alpha * v + (beta * c[r, tok] if beta != 0 else 0.0)
                    stored[r, tok] += 1
            else:
                slot = rt + cta
                assert slot not in ws, "a workspace slot written twice"
                assert slot < spec.slots, "slot index past the workspace"
                ws[slot] = dict(sums)
                partial_of[(rt, cta)] = slot
                counters[rt] += 1
                arrivals.append((cta, rt, first, last))
            u = seg_end
    # finishers: the last arrival of each shared tile sums slots rt + first .. rt + last in order
    for cta, rt, first, last in arrivals:
        if counters[rt] != last - first + 1:
            raise AssertionError(f"tile {rt}: {counters[rt]} arrivals, {last - first + 1} expected")
    done = set()
    for cta, rt, first, last in arrivals:
        if rt in done:
            continue
        done.add(rt)
        assert contributors[rt] == list(range(first, last + 1)), "contributors are first..last"
        for key in ws[rt + first]:
            r, tok, v = ws[rt + first][key]
            for cc in range(first + 1, last + 1):
                r2, tok2, v2 = ws[rt + cc][key]
                assert (r2, tok2) == (r, tok), "every contributor holds the entry at the same place"
                v += v2
            result[r, tok] = alpha * v + (beta * c[r, tok] if beta != 0 else 0.0)
            stored[r, tok] += 1
    return Emulation(result, coverage.reshape(spec.row_tiles * WR, wsteps), stored, sorted(ws),
                     contributors)


def run_rows(spec, w, x, alpha=1.0, beta=0.0, c=None) -> Emulation:
    """C (R x T) = alpha W Xᵀ + beta C the way gemv_rows_kernel computes it (``spec.split ==
    'rows'``): blocks grid-stride over the CTAs, warp steps interleaved over the CTA's warps,
    the warps' sums added in warp order."""
    assert spec.split == "rows" and spec.wr == 1 and spec.slots == 0
    R, T, K = spec.R, spec.T, spec.K
    rows, kstep, out = _geometry(spec)
    WK, G = spec.wk, spec.ctas
    wsteps = -(-K // kstep)
    assert spec.cta_rows == rows and spec.row_tiles == -(-R // rows) and spec.csteps == -(-wsteps // WK)
    c = np.zeros((R, T)) if c is None else np.array(c, dtype=float)
    result = c.copy()
    coverage = np.zeros((spec.row_tiles, 1, wsteps), dtype=int)
    stored = np.zeros((R, T), dtype=int)
    contributors: dict = {}
    for cta in range(G):
        for blk in range(cta, spec.row_tiles, G):
            contributors.setdefault(blk, []).append(cta)
            park = np.zeros((WK, out * 32))
            for warp in range(WK):
                steps = list(range(warp, wsteps, WK))
                for ks in steps:
                    coverage[blk, 0, ks] += 1
                park[warp] = warp_accumulators(spec, w, x, blk * rows, steps)[:, :out].T.reshape(-1)
            for e in range(out * 32):
                r, tok = coord(spec, e >> 5, e & 31)
                r += blk * rows
                if r >= R or tok >= T:
                    continue
                v = park[0, e]
                for k in range(1, WK):
                    v += park[k, e]
                result[r, tok] = alpha * v + (beta * c[r, tok] if beta != 0 else 0.0)
                stored[r, tok] += 1
    return Emulation(result, coverage.reshape(spec.row_tiles, wsteps), stored, [], contributors)
