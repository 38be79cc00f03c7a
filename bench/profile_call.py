"""cProfile of one repeated call (host cost, where it goes): ``python bench/profile_call.py FORM``.

FORM (64³ each): ``fused-f32`` / ``fused-f16`` (a bias+gelu matmul on CuPy arrays), ``torch-fused-f32``
/ ``torch-fused-f16`` (the same on torch tensors), ``f32`` / ``torch-f32`` (a float32 matmul on CuPy
arrays / torch tensors), ``jax-f16`` / ``jax-bf16`` (a matmul on JAX GPU arrays). Prints the 18
costliest functions by own time over 300 calls.
"""
import cProfile
import pstats
import sys

import numpy as np


def main(form: str) -> None:
    import cupy as cp

    import pyblasgemm as pb

    if form not in ("fused-f32", "fused-f16", "torch-fused-f32", "torch-fused-f16", "f32", "torch-f32",
                    "jax-f16", "jax-bf16"):
        raise SystemExit(f"unknown form {form!r}")
    dtype = np.float16 if form.endswith("f16") else np.float32
    if form.startswith("jax-"):
        import jax.numpy as jnp

        a = jnp.ones((64, 64), jnp.bfloat16 if form == "jax-bf16" else jnp.float16)
        b = a
    elif form.startswith("torch-"):
        import torch

        a, b = (torch.randn(64, 64, device="cuda", dtype=getattr(torch, np.dtype(dtype).name)) for _ in "ab")
    else:
        a, b = (cp.random.rand(64, 64).astype(dtype) for _ in "ab")
    bias = a[0] if "fused" in form else None

    def fn():
        if bias is None:
            return pb.matmul(a, b)
        return pb.matmul(a, b, bias=bias, activation="gelu")

    for _ in range(20):
        fn()
    cp.cuda.Device().synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        fn()
    prof.disable()
    cp.cuda.Device().synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main(sys.argv[1])
