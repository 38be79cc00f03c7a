"""pyblasgemm.jax: matmul as an XLA operation (jax.experimental.buffer_callback), eagerly and
under jax.jit, jax.grad and jax.vmap. Host tests run it on JAX's CPU (the host backend inside
XLA); ``gpu`` tests on a GPU (the launch on XLA's stream, replayed after a compiled call's
first run). Values against float64 NumPy of the same data, gradients against JAX's own
differentiation of ``jnp.matmul`` and ``jax.nn``'s activations."""
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.epilogue import ACTIVATIONS

jax = pytest.importorskip("jax")
jnp = jax.numpy
pbj = pytest.importorskip("pyblasgemm.jax")

gpu = pytest.mark.gpu

#: JAX's own forward of each activation of the table (the reference its gradients come from)
JAX_ACTIVATIONS = {None: lambda x: x, "relu": jax.nn.relu,
                   "gelu": lambda x: jax.nn.gelu(x, approximate=False),
                   "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
                   "silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid}
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
#: JAX's references in full float32 (on a GPU its default float32 dot is TF32)
def exact():
    return jax.default_matmul_precision("highest")


def test_every_activation_has_a_jax_reference():
    assert set(JAX_ACTIVATIONS) - {None} == set(ACTIVATIONS)


def _device():
    """The GPU if the tests run on one with JAX seeing it, else JAX's CPU."""
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    return gpus[0] if gpus else jax.devices("cpu")[0]


def _data(rng, shape, dtype, device=None):
    x = jnp.asarray(rng.uniform(-1, 1, shape), dtype=dtype)
    return jax.device_put(x, device) if device is not None else x


def _close(got, want64, dtype, scale):
    got = np.asarray(got, np.float64)
    assert got.shape == want64.shape
    bound = TOL[dtype] * scale + TOL[dtype]
    assert np.all(np.abs(got - want64) <= bound), float(np.max(np.abs(got - want64) - bound))


@pytest.mark.parametrize("shape_a, shape_b", [((5, 7), (7, 3)), ((1, 1), (1, 1)), ((7,), (7, 3)),
                                              ((5, 7), (7,)), ((7,), (7,)), ((2, 1, 5, 7), (3, 7, 4)),
                                              ((33, 257), (257, 1))])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_values_eager_and_jit(shape_a, shape_b, dtype):
    rng = np.random.default_rng(0)
    a, b = _data(rng, shape_a, dtype), _data(rng, shape_b, dtype)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    want = a64 @ b64
    for f in (pbj.matmul, jax.jit(pbj.matmul), pyblasgemm.matmul, jax.jit(pyblasgemm.matmul)):
        got = f(a, b)
        assert isinstance(got, jax.Array) and got.dtype == jnp.result_type(a.dtype, b.dtype)
        _close(got, np.asarray(want), dtype, np.abs(a64) @ np.abs(b64))


@pytest.mark.parametrize("activation", [None, *ACTIVATIONS])
def test_bias_activation_and_their_gradients(activation):
    """Forward and all three gradients against JAX's differentiation of jnp.matmul and the
    activation, eagerly and under jit (float32)."""
    rng = np.random.default_rng(1)
    a, b, bias = _data(rng, (6, 9), "float32"), _data(rng, (9, 5), "float32"), _data(rng, (5,), "float32")
    act = JAX_ACTIVATIONS[activation]

    def ours(a, b, bias):
        return jnp.sum(jnp.sin(pyblasgemm.matmul(a, b, bias=bias, activation=activation)))

    def theirs(a, b, bias):
        return jnp.sum(jnp.sin(act(a @ b + bias)))
    with exact():
        np.testing.assert_allclose(ours(a, b, bias), theirs(a, b, bias), rtol=1e-5)
        want = jax.grad(theirs, argnums=(0, 1, 2))(a, b, bias)
    for grad in (jax.grad(ours, argnums=(0, 1, 2)), jax.jit(jax.grad(ours, argnums=(0, 1, 2)))):
        for g, w in zip(grad(a, b, bias), want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-6)


def test_gradients_of_broadcast_batches_and_vectors():
    rng = np.random.default_rng(2)
    cases = [((4, 1, 5, 7), (3, 7, 2)), ((7,), (2, 7, 3)), ((5, 7), (7,)), ((2, 5, 7), (7, 4))]
    for sa, sb in cases:
        a, b = _data(rng, sa, "float32"), _data(rng, sb, "float32")
        ours = jax.grad(lambda a, b: jnp.sum(pbj.matmul(a, b) ** 2), argnums=(0, 1))(a, b)
        with exact():
            want = jax.grad(lambda a, b: jnp.sum(jnp.matmul(a, b) ** 2), argnums=(0, 1))(a, b)
        for g, w, s in zip(ours, want, (sa, sb)):
            assert g.shape == s
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)


def test_vmap_with_and_without_bias():
    rng = np.random.default_rng(3)
    xs, w, bias = _data(rng, (4, 3, 6), "float32"), _data(rng, (6, 5), "float32"), _data(rng, (5,), "float32")
    with exact():
        plain, silu = jnp.einsum("bmk,kn->bmn", xs, w), jax.nn.silu(xs @ w + bias)
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda x: pbj.matmul(x, w))(xs)),
                               np.asarray(plain), rtol=1e-5, atol=1e-6)
    ws = jnp.stack([w, 2 * w, -w, w])
    with exact():
        want = jnp.einsum("bmk,bkn->bmn", xs, ws)
    np.testing.assert_allclose(np.asarray(jax.vmap(pbj.matmul)(xs, ws)), np.asarray(want), rtol=1e-5, atol=1e-6)
    got = jax.vmap(lambda x: pbj.matmul(x, w, bias=bias, activation="silu"))(xs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(silu), rtol=1e-5, atol=1e-6)


def test_errors_name_the_argument_before_any_work():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"a is \(2, 3\) and b is \(2, 3\); a's last axis \(3\)"):
        pbj.matmul(x, x)
    with pytest.raises(ValueError, match="a is a scalar"):
        pbj.matmul(jnp.float32(1), x)
    with pytest.raises(TypeError, match="b is int32; the products take"):
        pbj.matmul(x, jnp.ones((3, 2), jnp.int32))
    with pytest.raises(ValueError, match=r"bias has shape \(3,\); it must be \(2,\)"):
        pbj.matmul(x, jnp.ones((3, 2)), bias=jnp.ones(3))
    with pytest.raises(ValueError, match="activation='tanh'; use one of none, relu"):
        pbj.matmul(x, jnp.ones((3, 2)), activation="tanh")
    with pytest.raises(ValueError, match="batch axes .* do not broadcast"):
        pbj.matmul(jnp.ones((2, 2, 3)), jnp.ones((3, 3, 2)))
    with pytest.raises(TypeError, match="compute must be a string"):
        pbj.matmul(x, jnp.ones((3, 2)), compute=3)


# ------------------------------------------------------------------------------------------
# On a GPU: the launch on XLA's stream


def _gpu_or_skip():
    d = _device()
    if d.platform != "gpu":
        pytest.skip("JAX sees no GPU here")
    return d


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 33, 257), (257, 7, 33), (128, 129, 127), (1000, 64, 512)])
def test_gpu_values_replays_and_bits(dtype, m, n, k):
    """Eager and jit on GPU arrays: right values, the replayed runs' bits equal the first run's,
    and new operands of the same signature are computed afresh (no stale replay)."""
    d = _gpu_or_skip()
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    a, b = _data(rng, (m, k), dtype, d), _data(rng, (k, n), dtype, d)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    first = pyblasgemm.matmul(a, b)
    assert list(first.devices())[0].platform == "gpu"
    _close(first, a64 @ b64, dtype, np.abs(a64) @ np.abs(b64))
    for _ in range(3):
        assert np.array_equal(np.asarray(pyblasgemm.matmul(a, b)), np.asarray(first))
    a2 = _data(rng, (m, k), dtype, d)
    a264 = np.asarray(a2, np.float64)
    _close(pyblasgemm.matmul(a2, b), a264 @ b64, dtype, np.abs(a264) @ np.abs(b64))
    _close(jax.jit(pyblasgemm.matmul)(a2, b), a264 @ b64, dtype, np.abs(a264) @ np.abs(b64))


@gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_gpu_chain_inside_jit_is_stream_ordered(activation):
    """Two products and XLA's own operations between them in one jitted program: each reads
    what the one before wrote on XLA's stream (a missing order gives stale values)."""
    d = _gpu_or_skip()
    rng = np.random.default_rng(9)
    x, w1, w2 = _data(rng, (512, 256), "float32", d), _data(rng, (256, 1024), "float32", d), \
        _data(rng, (1024, 256), "float32", d)
    bias = _data(rng, (1024,), "float32", d)
    act = JAX_ACTIVATIONS[activation]

    def ours(x):
        h = pyblasgemm.matmul(x, w1, bias=bias, activation=activation)
        return pyblasgemm.matmul(jnp.tanh(h), w2) * 0.5

    def theirs(x):
        h = act(jnp.matmul(x, w1, precision="highest") + bias)
        return jnp.matmul(jnp.tanh(h), w2, precision="highest") * 0.5
    f = jax.jit(ours)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(x)), np.asarray(theirs(x)), rtol=1e-4, atol=1e-4)
    g = jax.jit(jax.grad(lambda x: jnp.sum(ours(x) ** 2)))(x)
    w = jax.grad(lambda x: jnp.sum(theirs(x) ** 2))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-3, atol=1e-3)


@gpu
def test_gpu_fused_epilogue_replays_without_the_full_path(monkeypatch):
    """A repeated eager call with bias and activation replays its fused launch."""
    d = _gpu_or_skip()
    rng = np.random.default_rng(4)
    a, b, bias = _data(rng, (64, 96), "float16", d), _data(rng, (96, 128), "float16", d), \
        _data(rng, (128,), "float16", d)
    first = pyblasgemm.matmul(a, b, bias=bias, activation="gelu")
    ref = np.asarray(jax.nn.gelu(a.astype(jnp.float32) @ b.astype(jnp.float32) + bias.astype(jnp.float32),
                                 approximate=False))
    np.testing.assert_allclose(np.asarray(first, np.float32), ref, rtol=1e-2, atol=1e-2)
    runs = []
    full = pbj._Callback._full
    monkeypatch.setattr(pbj._Callback, "_full", lambda self, *args: runs.append(1) or full(self, *args))
    for _ in range(3):
        assert np.array_equal(np.asarray(pyblasgemm.matmul(a, b, bias=bias, activation="gelu")),
                              np.asarray(first))
    assert not runs


# ------------------------------------------------------------------------------------------
# Small eager products outside XLA (pyblasgemm.jax.eager)
# ------------------------------------------------------------------------------------------

def test_result_pool_gives_unshared_ready_arrays_and_refills():
    """The pool's arrays: the asked shape and dtype, on the asked device, no two with one buffer,
    each handed out once (a refill after ``depth``), depth bounded by the pool's bytes."""
    cpu = jax.devices("cpu")[0]
    pool = pbj._ResultPool((3, 5), np.dtype("float32"), cpu)
    assert pool.depth == pbj._ResultPool.DEPTH
    taken = [pool.take() for _ in range(pool.depth + 3)]
    assert all(x.shape == (3, 5) and x.dtype == jnp.float32 and list(x.devices()) == [cpu] for x in taken)
    pointers = {x.unsafe_buffer_pointer() for x in taken}
    assert len(pointers) == len(taken)
    big = pbj._ResultPool((1024, 1024), np.dtype("float16"), cpu)     # 2 MiB a result
    assert big.depth == pbj._ResultPool.BYTES // (2 << 20)


def test_result_pool_refuses_a_program_whose_results_share_a_buffer(monkeypatch):
    pool = pbj._ResultPool((2, 2), np.dtype("float32"), jax.devices("cpu")[0])
    one = jnp.zeros((2, 2))
    pool.make = lambda: (one, one)
    with pytest.raises(RuntimeError, match="one buffer"):
        pool.take()


@pytest.mark.parametrize("case", ["cpu", "one_d", "broadcast_fault", "empty", "flops", "bytes", "result",
                                  "bias_shape", "word"])
def test_which_eager_calls_stay_xla_operations(case, monkeypatch):
    """_EagerProduct.of says None (the compiled XLA operation runs, and names any fault) for
    arrays off the GPU, 1-D operands, shapes that do not fit, empty products, products over
    each bound, a bias of the wrong shape and an unknown activation; each bound is checked on
    its own (the others lifted)."""
    monkeypatch.setattr(pbj._ResultPool, "__init__", lambda self, *args: None)
    gpu_set = {type("Gpu", (), {"platform": "gpu"})()}

    class Fake:
        def __init__(self, shape, dtype="float16", device_set=gpu_set):
            self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)
            self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
            self.sharding = type("Sharding", (), {"device_set": device_set, "__eq__": lambda s, o: True,
                                                  "__hash__": lambda s: 0})()
    monkeypatch.setattr(pbj._EagerProduct, "__init__", lambda self, *args: None)
    a, b, bias, act = Fake((64, 32)), Fake((32, 16)), None, None
    assert pbj._EagerProduct.of(a, b, None, None, None, None) is not None     # the baseline runs eagerly
    if case == "cpu":
        a = b = Fake((8, 8), device_set={type("Cpu", (), {"platform": "cpu"})()})
    elif case == "one_d":
        b = Fake((32,))
    elif case == "broadcast_fault":
        a, b = Fake((2, 64, 32)), Fake((3, 32, 16))
    elif case == "empty":
        a = Fake((0, 32))
    elif case == "flops":
        monkeypatch.setattr(pbj, "EAGER_MAX_FLOPS", 2 * 64 * 32 * 16 - 1)
    elif case == "bytes":
        monkeypatch.setattr(pbj, "EAGER_MAX_BYTES", a.nbytes + b.nbytes + 64 * 16 * 2 - 1)
    elif case == "result":
        monkeypatch.setattr(pbj, "EAGER_MAX_RESULT_BYTES", 64 * 16 * 2 - 1)
    elif case == "bias_shape":
        bias = Fake((17,))
    elif case == "word":
        act = "swish"
    assert pbj._EagerProduct.of(a, b, bias, act, None, None) is None


def test_eager_on_host_arrays_is_the_compiled_operation(monkeypatch):
    """Eager JAX CPU arrays (and any call the eager route does not take) run through
    :func:`pyblasgemm.jax.compiled`, once per signature decision."""
    used = []
    real = pbj.compiled
    monkeypatch.setattr(pbj, "compiled", lambda *words: used.append(words) or real(*words))
    cpu = jax.devices("cpu")[0]
    a, b = jax.device_put(jnp.ones((4, 3)), cpu), jax.device_put(jnp.ones((3, 2)), cpu)
    np.testing.assert_array_equal(np.asarray(pbj.eager(a, b, None, "none")), np.full((4, 2), 3.0))
    assert used == [(False, None, None, None)]


def _nan_pool_program(shape, dtype, depth):
    """A pool program whose arrays hold NaNs, each array its own NaN payload (distinct values,
    so no two share a buffer)."""
    bits = np.dtype(f"uint{8 * dtype.itemsize}")
    nan = int(np.array(np.nan, dtype).view(bits))
    return jax.jit(lambda: tuple(jax.lax.bitcast_convert_type(jnp.full(shape, nan + i, bits), dtype)
                                 for i in range(depth)))


def test_nan_pool_program_is_nan_and_unshared():
    for dtype in (np.dtype("float32"), np.dtype(jnp.bfloat16), np.dtype("float16")):
        made = _nan_pool_program((2, 3), dtype, 5)()
        assert all(bool(jnp.all(jnp.isnan(x.astype(jnp.float32)))) for x in made)
        assert len({x.unsafe_buffer_pointer() for x in made}) == 5


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_gpu_small_eager_products_run_outside_xla(dtype, monkeypatch):
    """A small eager product never calls XLA's compiled operation, gives the traced route's
    bits, fills every element of its pooled result (a pool value left behind fails the
    reference) and hands out each result once: 140 calls (past two refills) on fresh operands,
    every result kept and checked afterwards. The pool's arrays come filled with NaN here (its
    own are uninitialized), so an element the launch skips fails the reference."""
    d = _gpu_or_skip()
    real_program = pbj._ResultPool._program
    monkeypatch.setattr(pbj._ResultPool, "_program", staticmethod(_nan_pool_program))
    rng = np.random.default_rng(11)
    b = _data(rng, (96, 72), dtype, d)
    b64 = np.asarray(b, np.float64)
    a0 = _data(rng, (40, 96), dtype, d)
    traced = np.asarray(jax.jit(pbj.matmul)(a0, b))
    monkeypatch.setattr(pbj, "compiled", lambda *words: pytest.fail("the eager route called XLA"))
    assert np.array_equal(np.asarray(pyblasgemm.matmul(a0, b)), traced)
    operands = [_data(rng, (40, 96), dtype, d) for _ in range(140)]
    results = [pyblasgemm.matmul(a, b) for a in operands]
    assert len({r.unsafe_buffer_pointer() for r in results}) == len(results)
    for a, r in zip(operands, results):
        a64 = np.asarray(a, np.float64)
        _close(r, a64 @ b64, dtype, np.abs(a64) @ np.abs(b64))
    with_bias = pyblasgemm.matmul(a0, b, bias=_data(rng, (72,), dtype, d), activation="relu")
    assert float(jnp.min(with_bias.astype(jnp.float32))) >= 0
    # the library's own (unfilled) pool: the same bits as the poisoned one
    monkeypatch.setattr(pbj._ResultPool, "_program", staticmethod(real_program))
    pbj._EAGER.clear()
    assert np.array_equal(np.asarray(pyblasgemm.matmul(a0, b)), traced)


@gpu
def test_gpu_eager_waits_for_its_operands_and_is_read_at_once():
    """Operands that JAX is still computing (a long chain just dispatched) are read finished, and
    the result is final when returned: read by the host and by an XLA operation at once."""
    d = _gpu_or_skip()
    rng = np.random.default_rng(12)
    x = _data(rng, (4096, 4096), "float32", d)
    b = _data(rng, (256, 64), "float32", d)
    for _ in range(3):
        slow = x
        for _ in range(8):                        # ~8 big products queued on XLA's stream
            slow = jnp.tanh(slow @ x * 1e-3)
        a = slow[:128, :256] + 1.0
        got = pyblasgemm.matmul(a, b)
        doubled = got * 2                         # an XLA operation reading it at once
        want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(doubled), 2 * want, rtol=1e-4, atol=1e-4)


@gpu
def test_gpu_large_eager_products_stay_xla_operations(monkeypatch):
    d = _gpu_or_skip()
    used = []
    real = pbj.compiled
    monkeypatch.setattr(pbj, "compiled", lambda *words: used.append(words) or real(*words))
    rng = np.random.default_rng(13)
    a, b = _data(rng, (1024, 1024), "float16", d), _data(rng, (1024, 1024), "float16", d)
    got = pyblasgemm.matmul(a, b)          # a 2 MiB result: over EAGER_MAX_RESULT_BYTES
    assert used == [(False, None, None, None)]
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    _close(got, a64 @ b64, "float16", np.abs(a64) @ np.abs(b64))
