"""Mixture-of-experts layers (bfloat16, uneven token counts): the one-launch expert form
against the two-launch form, ``torch._grouped_mm`` and a loop of cuBLAS calls, with each
layer's bytes, FLOPs and roofline time (issue #36).

    PYTHONPATH=. python bench/grouped_fused.py --out bench/results/grouped_fused_<gpu>_<date>_<sha>.json

For each case (experts, most rows an expert gets, k, n; sizes numpy default_rng(5) uniform in
0..most, as bench/fusion.py and bench/grouped_tiles.py draw them) and on the same bytes:

* ``torch._grouped_mm(x, w, offs=ends)`` and a loop of ``torch.mm`` (cuBLAS) over the experts
  into slices of one output (empty experts skipped);
* pyblasgemm's expert form with the offsets on the GPU, launched directly (GroupedLaunch,
  the tile ``grouped_config`` picks for the mean rows): ``fused`` (one launch,
  impls/grouped_fused.cuh) and ``two launches`` (the table kernel, then the GEMM); and the public
  ``pyblasgemm.grouped_matmul(x, w, offsets=ends, out=out)`` call; where that tile is not the
  small-group one, the fused launch with the small-group tile too;
* the same without the host: ``torch._grouped_mm`` and the launches captured 20 times (4 for
  the large layers) in one CUDA graph, the replay's time per call (``graph`` rows), also with
  every offset 0 (no tile: what remains is the launch, the offsets' scan and the grid's start
  and end);
* a yardstick of the memory system: one read of the weights by a plain vectorized kernel
  (16-byte loads, grid-stride), giving the HBM read rate this GPU reaches on these bytes.

The roofline per case: bytes = weights + tokens + output (each once), FLOPs = 2 x tokens x k
x n; its time at the measured read rate and at the datasheet's 3.35 TB/s (H100 SXM HBM3), and
the compute time at the 989 TF/s dense bf16 peak. Times: CUDA events around back-to-back calls
(bench/timing.py), so the host's issue time enters only where it exceeds the GPU's (the cuBLAS
loop of small experts: it is then the host's). Correctness before timing: fused and two-launch
bits equal; max relative error against ``torch._grouped_mm``. The document is written after
every case.
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.heldout import meta, write_doc  # noqa: E402
from bench.timing import event_median_s  # noqa: E402

#: (experts, most rows an expert gets, k, n): small experts (two sizes), a 128-expert layer of
#: ~256 tokens an expert, large experts
CASES = ((64, 64, 1024, 1024), (128, 64, 2048, 2048), (128, 512, 2048, 2048), (64, 2048, 4096, 4096))
HBM_DATASHEET = 3.35e12
BF16_DENSE_PEAK = 989e12

_READ = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ p, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;     // keeps the loads; (almost) never stores
}
"""


def _timed(fn, big):
    return event_median_s(fn, inner=3, samples=15) if big else event_median_s(fn)


def _graph_us(fn, big, torch_side):
    """µs per call of ``fn`` captured 20 times (4 where a call takes ~0.3 ms or more) in one
    CUDA graph (PyTorch's capture for its calls, CuPy's stream capture for ours), replayed back
    to back."""
    calls = 4 if big else 20
    import cupy as cp
    import torch

    if torch_side:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize()
        return _timed(graph.replay, big) * 1e6 / calls
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.begin_capture()
        for _ in range(calls):
            fn()
        graph = stream.end_capture()
        t = _timed(lambda: graph.launch(stream), big)
    return t * 1e6 / calls


def case(experts, max_rows, k, n) -> dict:
    import cupy as cp
    import ml_dtypes
    import torch

    import pyblasgemm as pb
    from pyblasgemm.kernels.grouped import GROUPED_SMALL_CONFIGS, GroupedLaunch, grouped_config

    sizes = np.random.default_rng(5).integers(0, max_rows + 1, experts)
    ends = np.cumsum(sizes)
    rows = int(ends[-1])
    big = 2.0 * rows * k * n > 1e11     # (fewer samples where a call takes ~0.3 ms or more)
    a = cp.random.uniform(-1, 1, (rows, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    b = (cp.random.uniform(-1, 1, (experts, k, n), dtype=cp.float32) / 64).astype(ml_dtypes.bfloat16)
    dev_ends = cp.asarray(ends.astype(np.int32))
    zero_ends = cp.zeros(experts, np.int32)
    ta = torch.as_tensor(a.view(cp.uint16), device="cuda").view(torch.bfloat16)
    tb = torch.as_tensor(b.view(cp.uint16), device="cuda").view(torch.bfloat16)
    offs = torch.as_tensor(ends.astype(np.int32), device="cuda")
    zero_offs = torch.zeros(experts, dtype=torch.int32, device="cuda")
    ref = torch._grouped_mm(ta, tb, offs=offs).float()
    weight_bytes, token_bytes = experts * k * n * 2, rows * k * 2
    layer_bytes = weight_bytes + token_bytes + rows * n * 2
    flops = 2.0 * rows * k * n
    row = {"experts": experts, "max_rows": max_rows, "k": k, "n": n, "tokens": rows, "mean_rows": rows / experts,
           "empty_experts": int((sizes == 0).sum()), "weight_bytes": weight_bytes, "layer_bytes": layer_bytes,
           "flops": flops, "us": {}}
    us = row["us"]

    # the memory system's read rate on the weights' bytes
    read = cp.RawKernel(_READ, "read_all")
    sink = cp.zeros(1, cp.uint32)
    words = weight_bytes // 16
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    us["read weights once (16-byte loads)"] = _timed(
        lambda: read((sms * 8,), (512,), (b, np.int64(words), sink)), big) * 1e6
    read_rate = weight_bytes / (us["read weights once (16-byte loads)"] * 1e-6)

    us["torch._grouped_mm"] = _timed(lambda: torch._grouped_mm(ta, tb, offs=offs), big) * 1e6
    tout = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
    pieces = [(ta[s:e], tb[g], tout[s:e]) for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends)) if e > s]

    def cublas_loop():
        for x, w, o in pieces:
            torch.mm(x, w, out=o)

    us["cuBLAS loop (torch.mm per expert)"] = _timed(cublas_loop, big) * 1e6
    row["cublas_loop_max_rel_err_vs_torch"] = float((tout.float() - ref).abs().max() / ref.abs().max())

    config = grouped_config("bf16", rows / experts)
    row["tile"] = config.name
    launch = GroupedLaunch("bf16", "N", "N", True, (0, None), config)
    outs = {}
    variants = (("pyblasgemm fused (one launch)", True), ("pyblasgemm two launches", False))
    for label, fused in variants:
        out = cp.full((rows, n), np.nan, ml_dtypes.bfloat16)
        values = dict(weights=b.data.ptr, tokens=a.data.ptr, out=out.data.ptr, bias=0, scale_w=0, scale_x=0,
                      w_group_bytes=b.strides[0], x_row_bytes=a.strides[0], out_row_bytes=out.strides[0],
                      bias_group_bytes=0, scale_w_group_bytes=0, lda=n, ldb=k, ldc=n, rows=rows, m=n, k=k,
                      out_bytes=2, bias_mode=0, alpha=1.0, beta=0.0, ialpha=0, ibeta=0)

        def run(values=values, fused=fused, ends_ptr=dev_ends.data.ptr):
            launch.launch_offsets(experts, ends_ptr, 4, values, fused=fused)

        run()
        cp.cuda.Device().synchronize()
        outs[label] = out
        us[label] = _timed(run, big) * 1e6
        us[label + ", graph"] = _graph_us(run, big, False)
        us[label + ", graph, every offset 0"] = _graph_us(
            lambda values=values, fused=fused: launch.launch_offsets(experts, zero_ends.data.ptr, 4, values,
                                                                     fused=fused), big, False)
    if config.name != GROUPED_SMALL_CONFIGS["bf16"].name:
        # the small-group tile on this layer too (two CTAs per SM, 64 tokens a tile)
        small = GroupedLaunch("bf16", "N", "N", True, (0, None), GROUPED_SMALL_CONFIGS["bf16"])
        out = cp.full((rows, n), np.nan, ml_dtypes.bfloat16)
        values = dict(values, out=out.data.ptr)

        def run_small(values=values):
            small.launch_offsets(experts, dev_ends.data.ptr, 4, values)

        run_small()
        label = f"pyblasgemm fused, tile {small.config.name}"
        outs[label] = out
        us[label] = _timed(run_small, big) * 1e6
    us["torch._grouped_mm, graph"] = _graph_us(lambda: torch._grouped_mm(ta, tb, offs=offs), big, True)
    try:
        us["torch._grouped_mm, graph, every offset 0"] = _graph_us(
            lambda: torch._grouped_mm(ta, tb, offs=zero_offs), big, True)
    except RuntimeError as e:          # (a refusal is recorded, not fatal)
        row["torch_zero_offsets_graph_error"] = str(e)[:200]
    fused_out = outs["pyblasgemm fused (one launch)"]
    row["bits_equal_two_launches"] = {label: bool(cp.array_equal(o.view(cp.uint16),
                                                                 outs["pyblasgemm two launches"].view(cp.uint16)))
                                      for label, o in outs.items()}
    got = torch.as_tensor(fused_out.view(cp.uint16), device="cuda").view(torch.bfloat16).float()
    row["max_rel_err_vs_torch"] = float((got - ref).abs().max() / ref.abs().max())
    pub = cp.empty((rows, n), ml_dtypes.bfloat16)
    pb.grouped_matmul(a, b, offsets=dev_ends, out=pub)
    row["public_call_bits_equal_fused"] = bool(cp.array_equal(pub.view(cp.uint16), fused_out.view(cp.uint16)))
    us["pyblasgemm.grouped_matmul (public call, offsets on the GPU)"] = _timed(
        lambda: pb.grouped_matmul(a, b, offsets=dev_ends, out=pub), big) * 1e6

    best = us["pyblasgemm fused (one launch)"]
    row["roofline_us"] = {"memory at the measured read rate": layer_bytes / read_rate * 1e6,
                          "memory at 3.35 TB/s": layer_bytes / HBM_DATASHEET * 1e6,
                          "compute at 989 TF/s": flops / BF16_DENSE_PEAK * 1e6}
    row["measured_read_TB_per_s"] = read_rate / 1e12
    row["achieved_TB_per_s"] = {name: layer_bytes / t / 1e6 for name, t in us.items() if "offset 0" not in name
                                and "read weights" not in name}
    row["achieved_TF_per_s"] = {name: flops / t / 1e6 for name, t in us.items() if "offset 0" not in name
                                and "read weights" not in name}
    row["ratios"] = {"fused vs torch._grouped_mm": us["torch._grouped_mm"] / best,
                     "fused vs cuBLAS loop": us["cuBLAS loop (torch.mm per expert)"] / best,
                     "fused vs two launches": us["pyblasgemm two launches"] / best,
                     "fused vs torch._grouped_mm, both in CUDA graphs": us["torch._grouped_mm, graph"]
                     / us["pyblasgemm fused (one launch), graph"],
                     "public call vs torch._grouped_mm": us["torch._grouped_mm"]
                     / us["pyblasgemm.grouped_matmul (public call, offsets on the GPU)"],
                     "roofline (measured read rate) vs torch._grouped_mm": us["torch._grouped_mm"]
                     / row["roofline_us"]["memory at the measured read rate"]}
    print(json.dumps({key: row[key] for key in ("experts", "max_rows", "k", "n", "tokens", "tile", "us", "ratios",
                                                "roofline_us", "bits_equal_two_launches",
                                                "max_rel_err_vs_torch")}, indent=1), flush=True)
    del a, b, ta, tb, ref, tout, outs, pub, pieces
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return row


def run_cases(argv, method: str, schema: str, seed: int, cases, run_case) -> int:
    """The grouped benches' command line: ``--out`` (the JSON, written after every case) and
    ``--cases N`` (the first N of ``cases``), CuPy's generator seeded with ``seed``, each case
    ``run_case(*spec)``'s row."""
    import argparse
    import types

    import cupy as cp
    import torch

    ap = argparse.ArgumentParser(description=method.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=len(cases), help="run the first N cases")
    args = ap.parse_args(argv)
    cp.random.seed(seed)
    doc = {"schema": schema,
           **meta(types.SimpleNamespace(torch=torch), seed=f"CuPy {seed}; sizes default_rng(5)"),
           "method": method, "cases": []}
    for spec in cases[:args.cases]:
        doc["cases"].append(run_case(*spec))
        write_doc(doc, args.out)
    return 0


def main(argv=None) -> int:
    return run_cases(argv, __doc__, "pyblasgemm-grouped-fused/1", 20261201, CASES, case)


if __name__ == "__main__":
    sys.exit(main())
