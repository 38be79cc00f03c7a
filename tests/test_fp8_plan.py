"""The GPU route's launch plan (pyblasgemm/kernels/fp8.py ``plan``) on the CPU: a NumPy model of
the mma.sync kernel's column-major problem (op(A), op(B) read from flat memory through
transa / transb and the leading dimensions, the scales through the EPI bits as the store and
the mainloop's block promotion index them: epilogue/sm80_smem_epilogue.cuh ``scale_of_m`` /
``block_scale``) must give scaled_product's result for every operand layout, result order,
scale layout, operand type pair and bias axis. No GPU: this checks the orientation (the swap
to c^T = b^T a^T), the kind, the leading dimensions and the scale and bias mapping."""
from __future__ import annotations

import itertools
import zlib

import ml_dtypes
import numpy as np
import pytest

from pyblasgemm import fp8
from pyblasgemm.kernels import jit
from pyblasgemm.planner.fp8 import plan
from pyblasgemm.kinds import KERNEL_KINDS

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def _store(x, order, pad):
    """x (r x c) in flat memory: ('row', ld) x[i, j] at i*ld + j, or ('col', ld) at i + j*ld."""
    r, c = x.shape
    if order == "row":
        ld = c + pad
        mem = np.full(r * ld + 1, np.nan)
        for i in range(r):
            mem[i * ld:i * ld + c] = x[i]
    else:
        ld = r + pad
        mem = np.full(c * ld + 1, np.nan)
        for j in range(c):
            mem[j * ld:j * ld + r] = x[:, j]
    return mem, (order, ld)


def _scale(s, mode_bits, one_bit, idx, dim, q, kbn, epi):
    """The device's scale of index idx (a row or column of the kernel's C) in K block q."""
    s = np.asarray(s, np.float64).reshape(-1)
    mode = mode_bits
    if mode == 0:       # not block-scaled: the store's per-tensor or per-row / column scale
        return s[0 if epi & one_bit else idx]
    if mode == 1:
        return s[0]
    if mode == 2:
        return s[idx]
    if mode == 3:
        return s[idx * kbn + q]
    return s[q * ((dim + 127) >> 7) + (idx >> 7)]


def emulate(p, amem, bmem, sa, sb, bias_m, bias_n):
    """The kernel's C (flat, ldc) from its plan: sum over K blocks of scale_m * scale_n * the
    block's products (each side's scale through the EPI bits), + the bias of its axis."""
    A, B = (bmem, amem) if p.swap else (amem, bmem)
    sm, sn = (sb, sa) if p.swap else (sa, sb)
    mode_m = (p.epi >> jit.EPI_BLOCK_SHIFT) & 7
    mode_n = (p.epi >> (jit.EPI_BLOCK_SHIFT + 3)) & 7
    assert (mode_m == 0) == (mode_n == 0)
    i = np.arange(p.m)[:, None]
    kk = np.arange(p.k)[None, :]
    opa = A[kk + i * p.lda] if p.transa == "T" else A[i + kk * p.lda]          # m x k
    kk2 = np.arange(p.k)[:, None]
    j = np.arange(p.n)[None, :]
    opb = B[kk2 + j * p.ldb] if p.transb == "N" else B[j + kk2 * p.ldb]       # k x n
    kbn = -(-p.k // 128)
    c = np.zeros((p.m, p.n))
    for q in range(kbn):
        blk = opa[:, q * 128:(q + 1) * 128] @ opb[q * 128:(q + 1) * 128]
        rs = np.array([_scale(sm, mode_m, jit.EPI_SCALE_M_ONE, r, p.m, q, kbn, p.epi) for r in range(p.m)])
        cs = np.array([_scale(sn, mode_n, jit.EPI_SCALE_N_ONE, cc, p.n, q, kbn, p.epi) for cc in range(p.n)])
        c += rs[:, None] * blk * cs[None, :]
    if p.bias_axis == "m":
        c += bias_m[:, None]
    elif p.bias_axis == "n":
        c += bias_n[None, :]
    mem = np.full(p.n * p.ldc + p.m, np.nan)
    for jj in range(p.n):
        mem[jj * p.ldc:jj * p.ldc + p.m] = c[:, jj]
    return mem


SCALE_LAYOUTS = [("tensor", "tensor"), ("rows", "cols"), ("rows", "tensor"), ("tensor", "cols"),
                 ("blocks", "blocks"), ("blocks", "tensor"), ("rows", "blocks"), ("tensor", "blocks"),
                 ("blocks", "cols")]


@pytest.mark.parametrize("la, lb", SCALE_LAYOUTS, ids=["-".join(x) for x in SCALE_LAYOUTS])
@pytest.mark.parametrize("target", ["row", "col"])
def test_the_plan_computes_the_scaled_product(la, lb, target):
    rng = np.random.default_rng(zlib.crc32(f"{la}-{lb}-{target}".encode()))
    for (oa, ob), (ta, tb), (m, n, k), bias_axis in zip(
            itertools.product(("row", "col"), ("row", "col")),
            itertools.cycle([(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)]),
            itertools.cycle([(5, 130, 300), (131, 3, 129), (1, 200, 257), (70, 1, 40)]),
            itertools.cycle(["cols", "rows", None])):
        a = rng.standard_normal((m, k)).astype(ta)
        b = rng.standard_normal((k, n)).astype(tb)
        kb, nb = -(-k // 128), -(-n // 128)
        sa = {"tensor": np.float32(0.75), "rows": rng.uniform(0.5, 2, m),
              "blocks": rng.uniform(0.5, 2, (m, kb))}[la].astype(np.float32)
        sb = {"tensor": np.float32(1.5), "cols": rng.uniform(0.5, 2, n),
              "blocks": rng.uniform(0.5, 2, (kb, nb))}[lb].astype(np.float32)
        amem, lay_a = _store(a.astype(np.float64), oa, pad=int(rng.integers(0, 3)))
        bmem, lay_b = _store(b.astype(np.float64), ob, pad=int(rng.integers(0, 3)))
        ldc = (n if target == "row" else m) + 4
        p = plan(m, n, k, np.dtype(ta).name, np.dtype(tb).name, lay_a, lay_b, target, ldc, (la, lb),
                 "float32", 0, bias_axis, 132)
        row = KERNEL_KINDS[p.kind]
        assert (row.ab_dtype, row.b_dtype or row.ab_dtype) == (
            (np.dtype(tb).name, np.dtype(ta).name) if p.swap else (np.dtype(ta).name, np.dtype(tb).name))
        assert p.config.validate(kind=p.kind)[0]
        assert p.lda >= (p.k if p.transa == "T" else p.m) and p.ldb >= (p.n if p.transb == "T" else p.k)
        bias = rng.standard_normal(n if bias_axis == "cols" else m)
        bias_m = bias if (bias_axis == "cols") == p.swap else None
        bias_n = bias if bias_m is None else None
        cmem = emulate(p, amem, bmem, sa, sb, bias_m, bias_n)
        got = np.array([[cmem[j + i * ldc] if target == "row" else cmem[i + j * ldc] for j in range(n)]
                        for i in range(m)])
        want = fp8.scaled_product(a, b, sa, sb)
        if bias_axis is not None:
            want = want + (bias.reshape(1, -1) if bias_axis == "cols" else bias.reshape(-1, 1))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9,
                                   err_msg=f"{oa} {ob} {target} {la} {lb} {m}x{n}x{k} {bias_axis} {p}")


def test_block_products_take_the_tiles_without_spills():
    p = plan(256, 4096, 4096, "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row", 4096,
             ("blocks", "blocks"), "bfloat16", 0, None, 132)
    assert p.config.name.startswith(("sliced_128x64", "splitk_serial_128x64"))
    q = plan(16, 4096, 4096, "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row", 4096,
             ("blocks", "blocks"), "bfloat16", 0, None, 132)
    assert (q.config.bm, q.config.bn) == (64, 64)


def test_sm90_takes_the_hopper_kernel_for_k_major_operands(monkeypatch):
    """On sm_90: both operands K-major -> the Hopper (wgmma) kernel, block scales included (its
    promotion scales each stage: sm90_fold_block_scaled); any other layout -> mma.sync; FAMILY =
    'sm80' keeps mma.sync, and another value is refused. Block scales where the Hopper tile does
    not validate fall back to mma.sync's block tile (two accumulator sets: 128 x 64), not its
    plain one."""
    from pyblasgemm.kernels import fp8 as gpu
    from pyblasgemm.kernels.problem import KernelProblem
    from pyblasgemm.planner.fp8 import sm90_config

    def family(la, lb, layouts=("tensor", "cols"), cc=(9, 0), n=4096):
        return plan(64, n, 4096, "float8_e4m3fn", "float8_e4m3fn", la, lb, "row", n, layouts, "bfloat16", 0,
                    None, 132, cc).config.family

    k_major = (("row", 4096), ("col", 4096))
    assert family(*k_major) == "sm90a"
    assert family(*k_major, cc=(8, 9)) == "sm80"
    assert family(("row", 4096), ("row", 4096)) == "sm80"
    assert family(*k_major, layouts=("blocks", "blocks")) == "sm90a"         # decode too
    assert family(*k_major, layouts=("rows", "blocks")) == "sm90a"
    assert family(("row", 4096), ("row", 4096), layouts=("blocks", "blocks")) == "sm80"    # not K-major
    blocked = plan(512, 4096, 4096, "float8_e4m3fn", "float8_e4m3fn", *k_major, "row", 4096, ("blocks", "blocks"),
                   "bfloat16", 0, None, 132, (9, 0))
    # lda 4100: not a whole 16-byte TMA row pitch -> the mma.sync fallback, with block scales' tile
    problem = KernelProblem(blocked.kind, blocked.transa, blocked.transb, blocked.m, blocked.n, blocked.k, 4100,
                            blocked.ldb, blocked.ldc, 0, 0, 0, 1.0, 0.0)
    config = gpu.launch_config(problem, blocked.config, blocked.epi, 132)
    assert config.family == "sm80" and (config.bm, config.bn) == (128, 64)
    monkeypatch.setattr(gpu, "FAMILY", "sm90a")
    with pytest.raises(ValueError, match="FAMILY='sm90a' must be None or 'sm80'"):
        family(*k_major)
    monkeypatch.setattr(gpu, "FAMILY", "sm80")
    assert family(*k_major) == "sm80"
    # decode on Hopper: 64 x 64 tiles, parallel split-k; its config validates for the kind
    cfg = sm90_config("e5m2_e4m3", 4096, 16, 4096, 132)
    assert (cfg.bm, cfg.bn, cfg.decomposition) == (64, 64, "splitk_parallel")
    assert cfg.validate(kind="e5m2_e4m3")[0]
