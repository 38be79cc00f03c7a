"""Every public form takes and returns every framework (issue 31, A.2 and A.4): ``matmul`` and
``gemm`` with epilogue keywords, ``grouped_matmul`` (both forms), ``fused_mlp`` and ``Matmul``,
with PyTorch CPU tensors and JAX CPU arrays on the host backend, in float32, float16 and
bfloat16: values against NumPy float64 of the same data within the dtype's rounding, the
result's type and dtype (bfloat16 stays bfloat16), ``out=`` / ``preactivation_out=`` tensors
written in place, JAX's immutable arrays refused as outputs, JAX tracers (jit, grad, vmap)
running ``matmul`` as an XLA operation and refused by the other forms with what works, and tensors that require grad routed to
``pyblasgemm.torch`` where the call is differentiable, else refused. GPU-marked: the same forms
with CUDA tensors."""
import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.epilogue import ACTIVATIONS
from epilogue_ref import REF, UNIT

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float16", "bfloat16"]
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


class Framework:
    """Arrays of one framework on one device, made from NumPy data and read back as float64."""

    def __init__(self, name, device="cpu"):
        self.name, self.device = name, device
        if name == "jax":
            self.jax = pytest.importorskip("jax")
            self.jnp = pytest.importorskip("jax.numpy")

    def __repr__(self):
        return f"{self.name}-{self.device}"

    def array(self, x):
        x = np.ascontiguousarray(x)
        if self.name == "jax":
            return self.jnp.asarray(x)
        if x.dtype == ml_dtypes.bfloat16:
            t = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(x.copy())
        return t.to(self.device)

    def dtype(self, name):
        return getattr(self.jnp if self.name == "jax" else torch, name)

    def empty(self, shape, name):
        return torch.full(shape, float("nan"), dtype=self.dtype(name), device=self.device)

    def to64(self, x):
        if self.name == "jax":
            return np.asarray(x).astype(np.float64)
        return x.detach().cpu().to(torch.float64).numpy()

    def assert_native(self, x, dtype):
        """x is this framework's array on this device, of ``dtype``."""
        if self.name == "jax":
            assert isinstance(x, self.jax.Array), type(x)
        else:
            assert type(x) is torch.Tensor, type(x)
            assert x.device.type == torch.device(self.device).type, x.device
        assert x.dtype == self.dtype(dtype), (x.dtype, dtype)


@pytest.fixture(params=["torch", "jax"])
def fw(request):
    return Framework(request.param)


def _data(rng, shape, dtype):
    return rng.uniform(-2, 2, size=shape).astype(_NP[dtype])


def _assert_close(got64, want64, dtype, scale, what=""):
    """Within the output's one rounding plus a float32 accumulation's error."""
    err = np.abs(got64 - want64)
    tol = 4 * UNIT[_NP[dtype]] * (np.abs(want64) + scale) + 64 * 2.0**-24 * scale
    assert got64.shape == want64.shape, (what, got64.shape, want64.shape)
    assert np.all(err <= tol), (what, float(np.max(err - tol)))


def _f64(*xs):
    return [x.astype(np.float64) for x in xs]


# ---------------------------------------------------------------------------------------------
# matmul and gemm with epilogue keywords


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_epilogue(fw, dtype):
    rng = np.random.default_rng(1)
    x, w, bias = _data(rng, (2, 5, 7), dtype), _data(rng, (7, 6), dtype), _data(rng, (6,), dtype)
    x64, w64, b64 = _f64(x, w, bias)
    v64, scale = x64 @ w64 + b64, np.abs(x64) @ np.abs(w64) + 1
    pre = fw.empty((2, 5, 6), dtype) if fw.name == "torch" else None
    y = pyblasgemm.matmul(fw.array(x), fw.array(w), bias=fw.array(bias), activation="gelu",
                          preactivation_out=pre)
    fw.assert_native(y, dtype)
    _assert_close(fw.to64(y), REF["gelu"](v64), dtype, scale, "y")
    if pre is not None:                                     # written in place
        _assert_close(fw.to64(pre), v64, dtype, scale, "pre-activation")
        out = fw.empty((2, 5, 6), dtype)
        got = pyblasgemm.matmul(fw.array(x), fw.array(w), out=out, activation="relu")
        assert got is out
        _assert_close(fw.to64(out), REF["relu"](x64 @ w64), dtype, scale, "out")


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_epilogue(fw, dtype):
    rng = np.random.default_rng(2)
    a, bt, bias = _data(rng, (6, 4), dtype), _data(rng, (5, 4), dtype), _data(rng, (5,), dtype)
    a64, bt64, b64 = _f64(a, bt, bias)
    scale = np.abs(a64) @ np.abs(bt64.T) + 1
    y = pyblasgemm.gemm("N", "T", fw.array(a), fw.array(bt), alpha=0.5, bias=fw.array(bias),
                        activation="silu")
    fw.assert_native(y, dtype)
    _assert_close(fw.to64(y), REF["silu"](0.5 * a64 @ bt64.T + b64), dtype, scale)
    if fw.name == "torch":
        c = _data(rng, (6, 5), dtype)
        out, pre = fw.array(c), fw.empty((6, 5), dtype)
        got = pyblasgemm.gemm("N", "T", fw.array(a), fw.array(bt), out, alpha=1.0, beta=-1.0,
                              bias=fw.array(bias), activation="relu", preactivation_out=pre)
        assert got is out
        v64 = a64 @ bt64.T - c.astype(np.float64) + b64
        _assert_close(fw.to64(pre), v64, dtype, scale + np.abs(c.astype(np.float64)), "pre")
        _assert_close(fw.to64(out), REF["relu"](v64), dtype, scale + np.abs(c.astype(np.float64)))


def test_int8_dequantized(fw):
    """int8 operands with scale_a / scale_b: float32 in the caller's framework (matmul, gemm)."""
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (5, 9)).astype(np.int8)
    b = rng.integers(-128, 128, (9, 4)).astype(np.int8)
    sa, sb = rng.uniform(0.5, 2, 5).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
    want = sa[:, None].astype(np.float64) * sb.astype(np.float64) * (a.astype(np.float64) @ b)
    for got in (pyblasgemm.matmul(fw.array(a), fw.array(b), scale_a=fw.array(sa), scale_b=fw.array(sb)),
                pyblasgemm.gemm("N", "N", fw.array(a), fw.array(b), scale_a=fw.array(sa),
                                scale_b=fw.array(sb))):
        fw.assert_native(got, "float32")
        _assert_close(fw.to64(got), want, "float32", np.abs(want))


# ---------------------------------------------------------------------------------------------
# grouped_matmul


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_list_form(fw, dtype):
    rng = np.random.default_rng(4)
    shapes = [(3, 4, 5), (1, 6, 2), (4, 2, 3)]
    a = [_data(rng, (m, k), dtype) for m, k, _ in shapes]
    b = [_data(rng, (k, n), dtype) for _, k, n in shapes]
    bias = [_data(rng, (n,), dtype) for *_, n in shapes]
    got = pyblasgemm.grouped_matmul([fw.array(x) for x in a], [fw.array(x) for x in b],
                                    bias=[fw.array(x) for x in bias], activation="relu")
    assert isinstance(got, list) and len(got) == 3
    for g, y in enumerate(got):
        fw.assert_native(y, dtype)
        a64, b64, c64 = _f64(a[g], b[g], bias[g])
        _assert_close(fw.to64(y), REF["relu"](a64 @ b64 + c64), dtype, np.abs(a64) @ np.abs(b64) + 1)
    if dtype != "float32":      # dtype=float32 of 16-bit operands holds (not rounded back)
        for y in pyblasgemm.grouped_matmul([fw.array(x) for x in a], [fw.array(x) for x in b],
                                           dtype=np.float32):
            fw.assert_native(y, "float32")
    if fw.name == "torch":
        outs = [fw.empty((m, n), dtype) for m, _, n in shapes]
        got = pyblasgemm.grouped_matmul([fw.array(x) for x in a], [fw.array(x) for x in b], out=outs)
        assert all(y is o for y, o in zip(got, outs))
        for g, o in enumerate(outs):
            a64, b64 = _f64(a[g], b[g])
            _assert_close(fw.to64(o), a64 @ b64, dtype, np.abs(a64) @ np.abs(b64) + 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_expert_form(fw, dtype):
    rng = np.random.default_rng(5)
    ends = [2, 2, 7]                                        # expert 1 has no tokens
    a, b, bias = _data(rng, (7, 4), dtype), _data(rng, (3, 4, 5), dtype), _data(rng, (3, 5), dtype)
    a64, b64, c64 = _f64(a, b, bias)
    want = np.concatenate([a64[s:e] @ b64[g] + c64[g] for g, (s, e) in enumerate(zip([0] + ends, ends))])
    scale = np.concatenate([np.abs(a64[s:e]) @ np.abs(b64[g]) for g, (s, e) in
                            enumerate(zip([0] + ends, ends))]) + 1
    offsets = fw.array(np.array(ends, np.int32))             # torch._grouped_mm's offs: a tensor
    y = pyblasgemm.grouped_matmul(fw.array(a), fw.array(b), offsets=offsets, bias=fw.array(bias),
                                  activation="gelu_tanh")
    fw.assert_native(y, dtype)
    _assert_close(fw.to64(y), REF["gelu_tanh"](want), dtype, scale)
    if fw.name == "torch":
        out = fw.empty((7, 5), dtype)
        assert pyblasgemm.grouped_matmul(fw.array(a), fw.array(b), offsets=ends, out=out,
                                         bias=fw.array(bias)) is out
        _assert_close(fw.to64(out), want, dtype, scale)


# ---------------------------------------------------------------------------------------------
# fused_mlp and Matmul


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_mlp(fw, dtype):
    rng = np.random.default_rng(6)
    x, w1, w2 = _data(rng, (5, 8), dtype), _data(rng, (8, 16), dtype), _data(rng, (16, 3), dtype)
    b1, b2 = _data(rng, (16,), dtype), _data(rng, (3,), dtype)
    x64, w164, w264, b164, b264 = _f64(x, w1, w2, b1, b2)
    h = REF["gelu"](x64 @ w164 + b164).astype(_NP[dtype]).astype(np.float64)   # rounded once
    scale = np.abs(h) @ np.abs(w264) + (np.abs(x64) @ np.abs(w164) + 1) @ np.abs(w264) * UNIT[_NP[dtype]] + 1
    for bias2 in (b2, None):        # (a second product without epilogue: bfloat16 NumPy refused it)
        y = pyblasgemm.fused_mlp(fw.array(x), fw.array(w1), fw.array(w2), b1=fw.array(b1),
                                 b2=None if bias2 is None else fw.array(bias2))
        fw.assert_native(y, dtype)
        _assert_close(fw.to64(y), h @ w264 + (0 if bias2 is None else b264), dtype, scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_stateful_matmul(fw, dtype):
    rng = np.random.default_rng(7)
    a, b, a2 = _data(rng, (3, 4, 6), dtype), _data(rng, (6, 5), dtype), _data(rng, (3, 4, 6), dtype)
    a64, b64, a264 = _f64(a, b, a2)
    mm = pyblasgemm.Matmul(fw.array(a), fw.array(b))
    y = mm.execute()
    fw.assert_native(y, dtype)
    _assert_close(fw.to64(y), a64 @ b64, dtype, np.abs(a64) @ np.abs(b64))
    y2 = mm.execute(a=fw.array(a2))
    fw.assert_native(y2, dtype)
    _assert_close(fw.to64(y2), a264 @ b64, dtype, np.abs(a264) @ np.abs(b64))
    if fw.name == "jax":            # immutable: each execute a new array, the first unchanged
        assert y2 is not y
        _assert_close(fw.to64(y), a64 @ b64, dtype, np.abs(a64) @ np.abs(b64))
    else:                           # the one tensor, written in place by every execute
        assert y2 is y
    bias = _data(rng, (5,), dtype)
    pre = fw.empty((3, 4, 5), dtype) if fw.name == "torch" else None
    out = fw.empty((3, 4, 5), dtype) if fw.name == "torch" else None
    mm = pyblasgemm.Matmul(fw.array(a), fw.array(b), out=out, bias=fw.array(bias),
                           activation="silu", preactivation_out=pre)
    y = mm.execute()
    if out is not None:
        assert y is out
        _assert_close(fw.to64(pre), a64 @ b64 + bias.astype(np.float64), dtype, np.abs(a64) @ np.abs(b64) + 1)
    fw.assert_native(y, dtype)
    _assert_close(fw.to64(y), REF["silu"](a64 @ b64 + bias.astype(np.float64)), dtype,
                  np.abs(a64) @ np.abs(b64) + 1)


def test_stateful_matmul_checks_new_arrays():
    a = torch.ones(4, 3)
    mm = pyblasgemm.Matmul(a, torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"Matmul.execute: a must have dtype float32, shape \(4, 3\)"):
        mm.execute(a=torch.ones(5, 3))
    buf = torch.ones(12)
    with pytest.raises(ValueError, match="c overlaps a"):
        mm.execute(a=buf.view(4, 3), c=buf[:8].view(4, 2))


# ---------------------------------------------------------------------------------------------
# JAX: immutable arrays, tracers, bfloat16


def _jax():
    jax = pytest.importorskip("jax")
    return jax, jax.numpy


def test_jax_bfloat16_crosses_to_the_host():
    """JAX CPU bfloat16 (NumPy's DLPack import has no bfloat16: it crosses as uint16 bits)."""
    jax, jnp = _jax()
    rng = np.random.default_rng(8)
    a, b = _data(rng, (4, 6), "bfloat16"), _data(rng, (6, 3), "bfloat16")
    y = pyblasgemm.matmul(jnp.asarray(a), jnp.asarray(b))
    assert isinstance(y, jax.Array) and y.dtype == jnp.bfloat16
    a64, b64 = _f64(a, b)
    _assert_close(np.asarray(y).astype(np.float64), a64 @ b64, "bfloat16", np.abs(a64) @ np.abs(b64))


def _every_form(jnp, x, out=None):
    """One call of each form on JAX array x (4 x 4 float32) and an optional out."""
    bias = jnp.ones(4, jnp.float32)
    return {
        "matmul": lambda: pyblasgemm.matmul(x, x, out),
        "matmul epilogue": lambda: pyblasgemm.matmul(x, x, out, bias=bias, activation="relu"),
        "gemm epilogue": lambda: pyblasgemm.gemm("N", "N", x, x, out, bias=bias),
        "grouped list": lambda: pyblasgemm.grouped_matmul([x], [x], out=None if out is None else [out]),
        "grouped expert": lambda: pyblasgemm.grouped_matmul(x, x[None], offsets=[4], out=out),
        "fused_mlp": lambda: pyblasgemm.fused_mlp(x, x, x),
        "Matmul": lambda: pyblasgemm.Matmul(x, x, out).execute(),
    }


def test_jax_out_is_refused():
    _, jnp = _jax()
    x = jnp.ones((4, 4), jnp.float32)
    forms = _every_form(jnp, x, out=jnp.zeros((4, 4), jnp.float32))
    del forms["fused_mlp"]                                  # (no out=)
    for name, call in forms.items():
        with pytest.raises(TypeError, match="JAX array, which is immutable"):
            call()
    with pytest.raises(TypeError, match="preactivation_out is a JAX array, which is immutable"):
        pyblasgemm.matmul(x, x, activation="relu", preactivation_out=jnp.zeros((4, 4)))


@pytest.mark.parametrize("transform", ["jit", "grad", "vmap"])
def test_jax_tracers_run_matmul_and_are_refused_by_the_other_forms(transform):
    """Under jit / grad / vmap the arrays are tracers (no memory): ``matmul`` (with its
    epilogue words) runs as an XLA operation (pyblasgemm.jax) and gives jnp's values; every
    other form raises a TypeError that says what works (it was an AttributeError from DLPack)."""
    jax, jnp = _jax()
    x = jnp.asarray(np.random.default_rng(5).uniform(-1, 1, (4, 4)), jnp.float32)
    bias = jnp.ones(4, jnp.float32)
    refs = {"matmul": lambda t: t @ t, "matmul epilogue": lambda t: jax.nn.relu(t @ t + bias)}
    for name in _every_form(jnp, x):
        def f(t, name=name):
            return jnp.sum(_every_form(jnp, t)[name]() if name != "grouped list" else
                           _every_form(jnp, t)[name]()[0])
        run = {"jit": jax.jit(f), "grad": jax.grad(f),
               "vmap": lambda t: jax.vmap(f)(jnp.stack([t, 2 * t]))}[transform]
        if name in refs:
            def g(t, name=name):
                return jnp.sum(refs[name](t))
            with jax.default_matmul_precision("highest"):      # (a GPU's default is TF32)
                want = {"jit": jax.jit(g), "grad": jax.grad(g),
                        "vmap": lambda t: jax.vmap(g)(jnp.stack([t, 2 * t]))}[transform](x)
            np.testing.assert_allclose(np.asarray(run(x)), np.asarray(want), rtol=1e-5, atol=1e-5)
            continue
        with pytest.raises(TypeError, match="JAX tracer .*pyblasgemm.matmul runs.* on eager"):
            run(x)


def test_jax_tracers_refuse_what_an_xla_operation_cannot_take():
    """``matmul`` on tracers with a keyword the XLA operation has no meaning for (``out=``,
    ``dtype=``, ``stream=``, ``preactivation_out=``...) names it and what it takes."""
    jax, jnp = _jax()
    x = jnp.ones((4, 4), jnp.float32)
    for kw in (dict(dtype=jnp.float32), dict(stream=0), dict(invariant=True),
               dict(activation="relu", preactivation_out=jnp.zeros((4, 4)))):
        with pytest.raises(TypeError, match=f"takes a, b, bias, activation, compute, backend; not "
                                            f"{next(k for k in kw if k != 'activation')}"):
            jax.jit(lambda t, kw=kw: pyblasgemm.matmul(t, t, **kw))(x)


# ---------------------------------------------------------------------------------------------
# tensors that require grad


@pytest.mark.parametrize("act", [None, *ACTIVATIONS])
def test_requires_grad_epilogue_is_linear(act):
    """matmul(x, w, bias=, activation=) with tensors that require grad is
    pyblasgemm.torch.linear(x, w.T, bias, activation): its gradients, not a detached product."""
    rng = np.random.default_rng(9)
    x = torch.tensor(rng.standard_normal((2, 3, 4)), requires_grad=True)
    w = torch.tensor(rng.standard_normal((4, 5)), requires_grad=True)
    bias = torch.nn.Parameter(torch.tensor(rng.standard_normal(5)))     # a subclass: counts too
    y = pyblasgemm.matmul(x, w, bias=bias, activation=act)
    assert "pyblasgemm_linear" in type(y.grad_fn).__name__
    want_fn = {None: lambda v: v, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
               "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
               "silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid}[act]
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, bias))
    want = want_fn(xr @ wr + br)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    grad = torch.tensor(rng.standard_normal(y.shape))
    got_g = torch.autograd.grad(y, (x, w, bias), grad)
    want_g = torch.autograd.grad(want, (xr, wr, br), grad)
    for g, h in zip(got_g, want_g):
        torch.testing.assert_close(g, h, rtol=1e-10, atol=1e-10)


def test_requires_grad_parameter_is_not_detached():
    """A torch.nn.Parameter (a Tensor subclass) that requires grad goes to the differentiable
    product too (it was silently detached)."""
    w = torch.nn.Parameter(torch.ones(3, 2))
    y = pyblasgemm.matmul(torch.ones(4, 3), w)
    assert y.grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(w.grad, torch.full((3, 2), 4.0))


def test_requires_grad_fused_mlp_is_two_linears():
    rng = np.random.default_rng(10)
    x = torch.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w1, w2 = (torch.tensor(rng.standard_normal(s), requires_grad=True) for s in ((4, 6), (6, 2)))
    b1, b2 = (torch.tensor(rng.standard_normal(s), requires_grad=True) for s in ((6,), (1, 2)))
    y = pyblasgemm.fused_mlp(x, w1, w2, b1, b2, activation="silu")
    assert y.grad_fn is not None
    leaves = (x, w1, w2, b1, b2)
    refs = [t.detach().clone().requires_grad_() for t in leaves]
    want = torch.nn.functional.silu(refs[0] @ refs[1] + refs[3]) @ refs[2] + refs[4]
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    for g, h in zip(torch.autograd.grad(y.sum(), leaves), torch.autograd.grad(want.sum(), refs)):
        torch.testing.assert_close(g, h, rtol=1e-10, atol=1e-10)


def test_requires_grad_outside_the_differentiable_forms_is_refused():
    x = torch.ones(4, 3, requires_grad=True)
    w = torch.ones(3, 2)
    refused = [
        (lambda: pyblasgemm.matmul(x, w, bias=torch.ones(2), preactivation_out=torch.empty(4, 2)),
         "preactivation_out= on tensors that require grad: the differentiable epilogue is "
         "pyblasgemm.torch.linear's"),
        (lambda: pyblasgemm.matmul(x, w, torch.empty(4, 2), activation="relu"), "out= on tensors"),
        (lambda: pyblasgemm.matmul(x, w, activation="relu", dtype=np.float64), "dtype= on tensors"),
        (lambda: pyblasgemm.matmul(x, w, bias=torch.ones(4, 1)),
         r"b of shape \(3, 2\) and bias of shape \(4, 1\) on tensors that require grad"),
        (lambda: pyblasgemm.matmul(x, torch.ones(3), activation="relu"), r"b of shape \(3,\)"),
        (lambda: pyblasgemm.matmul(x, w, bias=np.ones(2, np.float32)), "not all tensors"),
        (lambda: pyblasgemm.gemm("N", "N", x, w, bias=torch.ones(2)), "gemm is not differentiable"),
        (lambda: pyblasgemm.grouped_matmul([x], [w]), "grouped_matmul is not differentiable"),
        (lambda: pyblasgemm.grouped_matmul(x, w[None], offsets=[4]), "grouped_matmul is not differentiable"),
        (lambda: pyblasgemm.Matmul(x, w), "a bound launch records no autograd graph"),
        (lambda: pyblasgemm.fused_mlp(x, w, torch.ones(2, 2), method="two_gemms", compute="fp32"),
         "compute='fp32' with tensors that require grad"),
    ]
    for call, message in refused:
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(ValueError, match="activation='tanh' is not one of"):
        pyblasgemm.matmul(x, w, activation="tanh")              # named as matmul's, first
    with torch.no_grad():                                       # nothing records: the plain form
        assert pyblasgemm.Matmul(x, w).execute().grad_fn is None
        assert pyblasgemm.gemm("N", "N", x, w, bias=torch.ones(2)).grad_fn is None


# ---------------------------------------------------------------------------------------------
# CUDA tensors (the same door, on the GPU)


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device for PyTorch")
    return Framework("torch", "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_tensors_every_form(dtype):
    fw = _cuda()
    rng = np.random.default_rng(11)
    x, w, bias = _data(rng, (64, 32), dtype), _data(rng, (32, 48), dtype), _data(rng, (48,), dtype)
    x64, w64, b64 = _f64(x, w, bias)
    v64, scale = x64 @ w64 + b64, np.abs(x64) @ np.abs(w64) + 1
    pre = fw.empty((64, 48), dtype)
    y = pyblasgemm.matmul(fw.array(x), fw.array(w), bias=fw.array(bias), activation="gelu",
                          preactivation_out=pre)
    fw.assert_native(y, dtype)
    _assert_close(fw.to64(y), REF["gelu"](v64), dtype, scale)
    _assert_close(fw.to64(pre), v64, dtype, scale)
    out = fw.empty((64, 48), dtype)
    assert pyblasgemm.gemm("N", "N", fw.array(x), fw.array(w), out, bias=fw.array(bias)) is out
    _assert_close(fw.to64(out), v64, dtype, scale)
    got = pyblasgemm.grouped_matmul([fw.array(x)] * 3, [fw.array(w)] * 3, backend="tensorcore")
    for y in got:
        fw.assert_native(y, dtype)
        _assert_close(fw.to64(y), x64 @ w64, dtype, scale)
    y = pyblasgemm.grouped_matmul(fw.array(x), fw.array(np.stack([w, w])), offsets=[16, 64])
    fw.assert_native(y, dtype)
    _assert_close(fw.to64(y), x64 @ w64, dtype, scale)
    w2 = _data(rng, (48, 16), dtype)
    y = pyblasgemm.fused_mlp(fw.array(x), fw.array(w), fw.array(w2), b1=fw.array(bias))
    fw.assert_native(y, dtype)
    h = REF["gelu"](v64).astype(_NP[dtype]).astype(np.float64)
    _assert_close(fw.to64(y), h @ w2.astype(np.float64), dtype,
                  np.abs(h) @ np.abs(w2.astype(np.float64)) + 1)
    mm = pyblasgemm.Matmul(fw.array(x), fw.array(w))
    y = mm.execute()
    fw.assert_native(y, dtype)
    torch.cuda.synchronize()
    _assert_close(fw.to64(y), x64 @ w64, dtype, scale)
    assert mm.execute(a=fw.array(x)) is y


@pytest.mark.gpu
def test_cuda_tensors_on_torch_stream():
    """The epilogue's work is enqueued on PyTorch's current stream (a side stream here)."""
    fw = _cuda()
    x = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    bias = torch.randn(256, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        y = pyblasgemm.matmul(x, x, bias=bias, activation="relu")
        mm = pyblasgemm.Matmul(x, x)
        z = mm.execute()
    side.synchronize()
    fw.assert_native(y, "float16")
    torch.testing.assert_close(y.float(), torch.relu(x.float() @ x.float() + bias.float()),
                               rtol=2e-2, atol=2e-1)
    torch.testing.assert_close(z.float(), x.float() @ x.float(), rtol=2e-2, atol=2e-1)


def test_torch_bfloat16_with_dtype_float32_keeps_float32():
    """dtype= is the caller's type: bfloat16 tensors with dtype=float32 give float32 (the
    framework's bfloat16 rule applies only when no type was asked for)."""
    torch = pytest.importorskip("torch")
    a, b = torch.randn(4, 3).bfloat16(), torch.randn(3, 5).bfloat16()
    got = pyblasgemm.matmul(a, b, dtype=np.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, a.float() @ b.float(), rtol=1e-6, atol=1e-6)
    assert pyblasgemm.matmul(a, b).dtype == torch.bfloat16
