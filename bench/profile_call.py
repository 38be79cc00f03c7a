"""cProfile of one repeated call (host cost, where it goes): ``python bench/profile_call.py FORM``.

FORM: ``fused-f32`` (a float32 bias+gelu matmul on CuPy arrays, 64³) or ``jax-f16`` (a float16
matmul on JAX GPU arrays, 64³). Prints the 18 costliest functions by own time over 300 calls.
"""
import cProfile
import pstats
import sys

import numpy as np


def main(form: str) -> None:
    import cupy as cp

    import pyblasgemm as pb

    if form == "fused-f32":
        a, b = cp.random.rand(64, 64, dtype=np.float32), cp.random.rand(64, 64, dtype=np.float32)
        bias = cp.random.rand(64, dtype=np.float32)

        def fn():
            return pb.matmul(a, b, bias=bias, activation="gelu")
    elif form == "jax-f16":
        import jax.numpy as jnp

        a = jnp.ones((64, 64), jnp.float16)

        def fn():
            return pb.matmul(a, a)
    else:
        raise SystemExit(f"unknown form {form!r}")
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
