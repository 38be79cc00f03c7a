"""pyblasgemm.torch: the custom operators (opcheck), autograd (gradcheck in float64, every
activation with and without bias), pyblasgemm.torch.Linear against torch.nn.Linear, and
torch.compile(fullgraph=True) on the host; CUDA-graph capture, mode="reduce-overhead" and
16-bit backward on a GPU (marked gpu). The whole file is skipped where PyTorch is not installed
(CI installs the `test` extra, which leaves PyTorch out)."""
import doctest
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.library import opcheck  # noqa: E402

import pyblasgemm  # noqa: E402
import pyblasgemm.torch as pbt  # noqa: E402

OPS = torch.ops.pyblasgemm
ACTS = ["none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid"]
REFERENCE = {        # PyTorch's own activations, what each name means
    "none": lambda p: p,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda p: F.gelu(p, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
}
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tensors(x_shape, out_features, dtype, bias=True, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    k = x_shape[-1]
    x = torch.randn(x_shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    w = torch.randn((out_features, k), generator=g, dtype=torch.float64).to(device=device,
                                                                            dtype=dtype)
    b = torch.randn(out_features, generator=g, dtype=torch.float64).to(device=device,
                                                                       dtype=dtype)
    return (x.requires_grad_(), w.requires_grad_(), b.requires_grad_() if bias else None)


def _assert_within_ulps(mine, theirs, ulps):
    """mine and theirs of one dtype, apart by at most ``ulps`` units of the dtype's epsilon
    times the largest |theirs| (sums in other orders, each rounded once)."""
    assert mine.dtype == theirs.dtype
    err = (mine.double() - theirs.double()).abs().max().item() if mine.numel() else 0.0
    bound = ulps * torch.finfo(mine.dtype).eps * theirs.double().abs().max().item()
    assert err <= bound, f"{err} > {ulps} ulps of the largest value ({bound})"


def _torch_linear(x, w, b, act):
    return REFERENCE[act](F.linear(x, w, b))


# --- the operators --------------------------------------------------------------------------

LINEAR_CASES = [   # (x shape, out_features, bias, activation): batch dims, one row, a vector
    ((3, 4), 5, True, "relu"),
    ((1, 4), 5, True, "gelu"),
    ((2, 3, 4), 5, False, "gelu_tanh"),
    ((4,), 3, True, "silu"),
    ((2, 1, 3, 4), 2, True, "none"),
    ((1, 1), 1, False, "gelu"),
    ((0, 4), 5, True, "silu"),       # no rows
    ((3, 0), 5, True, "gelu"),       # in_features = 0: bias alone
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", LINEAR_CASES, ids=str)
@pytest.mark.parametrize("op", ["linear", "linear_with_preactivation"])
def test_opcheck_linear(op, case, dtype):
    shape, n, bias, act = case
    x, w, b = _tensors(shape, n, dtype, bias)
    opcheck(getattr(OPS, op), (x, w, b, act))


@pytest.mark.parametrize("act", ACTS)
def test_opcheck_linear_every_activation(act):
    x, w, b = _tensors((2, 3, 8), 6, torch.float32)
    opcheck(OPS.linear, (x, w, b, act))
    opcheck(OPS.linear_with_preactivation, (x, w, b, act))


MATMUL_CASES = [((3, 4), (4, 5)), ((1, 4), (4, 1)), ((4,), (4,)), ((4,), (4, 5)), ((3, 4), (4,)),
                ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)),
                ((0, 4), (4, 5)), ((3, 0), (0, 2))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shapes", MATMUL_CASES, ids=str)
def test_opcheck_matmul(shapes, dtype):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(shapes[0], generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(shapes[1], generator=g, dtype=dtype, requires_grad=True)
    opcheck(OPS.matmul, (a, b))
    assert torch.allclose(pbt.matmul(a, b), torch.matmul(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_linear_values_and_preactivation(dtype, act):
    x, w, b = _tensors((2, 5, 16), 12, dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        y, pre = OPS.linear_with_preactivation(x, w, b, act)
        torch.testing.assert_close(y, _torch_linear(x, w, b, act), **tol)
        torch.testing.assert_close(pre, F.linear(x, w, b), **tol)
        torch.testing.assert_close(OPS.linear(x, w, b, act), y, rtol=0, atol=0)
    assert y.is_contiguous() and pre.is_contiguous() and y.data_ptr() != pre.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16_bit_on_the_host(dtype):
    """The result keeps the operands' dtype (bfloat16 too, where NumPy's rule gives float32),
    rounded once from the float32 sum, as PyTorch's float32 reference rounded."""
    x, w, b = _tensors((7, 64), 9, dtype)
    y = pbt.linear(x, w, b, activation="silu")
    assert y.dtype == dtype and pbt.matmul(x, w.t()).dtype == dtype
    ref = _torch_linear(x.float(), w.float(), b.float(), "silu").to(dtype)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(y, ref, rtol=2 * eps, atol=2 * eps)
    y.float().sum().backward()
    assert (x.grad.dtype, w.grad.dtype, b.grad.dtype) == (dtype,) * 3


# --- autograd -------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_linear(act, bias):
    x, w, b = _tensors((2, 3, 4), 5, torch.float64, bias, seed=3)
    inputs = (x, w) + ((b,) if bias else ())

    def public(x, w, b=None):         # saves the pre-activation (linear_with_preactivation)
        return pbt.linear(x, w, b, activation=act)

    def op(x, w, b=None):             # the plain op: relu from its output, others recomputed
        return OPS.linear(x, w, b, act)

    assert torch.autograd.gradcheck(public, inputs)
    assert torch.autograd.gradcheck(op, inputs)


def test_gradcheck_linear_each_input_alone():
    """Only the inputs that need a gradient get one (the others' products are not run)."""
    x, w, b = _tensors((3, 4), 5, torch.float64)
    for need in ("x", "w", "b"):
        args = [t.detach().requires_grad_(name == need) for name, t in zip("xwb", (x, w, b))]
        pbt.linear(*args, activation="gelu").sum().backward()
        assert [a.grad is not None for a in args] == [n == need for n in "xwb"]
        assert torch.autograd.gradcheck(lambda *a: pbt.linear(*a, activation="gelu"), args)


@pytest.mark.parametrize("shapes", MATMUL_CASES[:8], ids=str)
def test_gradcheck_matmul(shapes):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(shapes[0], generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(shapes[1], generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(pbt.matmul, (a, b))


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_gradgradcheck(act):
    """Second derivatives: the backward is written with the operators (themselves
    differentiable) and differentiable elementwise operations."""
    x, w, b = _tensors((3, 4), 5, torch.float64, seed=4)
    assert torch.autograd.gradgradcheck(lambda *a: pbt.linear(*a, activation=act), (x, w, b))


def test_backward_products_run_through_pyblasgemm(monkeypatch):
    """dx = g W and dW = gᵀ x are pyblasgemm products (counted), not PyTorch's."""
    calls = []
    real = pyblasgemm.matmul

    def counting(a, b, *args, **kw):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return real(a, b, *args, **kw)

    pbt._fused_epilogue(torch.device("cpu"))      # the probe's own call, before counting
    monkeypatch.setattr(pbt, "_matmul", counting)
    x, w, b = _tensors((2, 3, 4), 5, torch.float64)
    y = pbt.linear(x, w, b, activation="gelu")
    assert calls == [((6, 4), (4, 5))]
    y.sum().backward()
    assert sorted(calls[1:]) == sorted([((6, 5), (5, 4)), ((5, 6), (6, 4))])


X = np.array([-30.0, -3.0, -1.0, -0.5, -1e-3, 0.0, 1e-3, 0.5, 1.0, 3.0, 30.0])


@pytest.mark.parametrize("act", ACTS)
def test_activation_table_derivatives(act):
    """Each row's derivative is autograd's derivative of PyTorch's activation of that name."""
    forward, derivative = pbt._ACTIVATION_TABLE[act]
    p = torch.tensor(X, requires_grad=True)
    torch.testing.assert_close(forward(p), REFERENCE[act](p), rtol=0, atol=0)
    (want,) = torch.autograd.grad(REFERENCE[act](p).sum(), p)
    torch.testing.assert_close(derivative(p.detach()), want, rtol=1e-14, atol=1e-15)


def test_activation_table_has_one_row_per_name():
    assert tuple(pbt._ACTIVATION_TABLE) == pbt.ACTIVATIONS == tuple(ACTS)
    assert set(pbt.ACTIVATIONS) - {"none"} == set(pyblasgemm.epilogue.ACTIVATIONS)


def test_plain_matmul_takes_the_differentiable_route():
    """What the docs say: pyblasgemm.matmul with a tensor that requires grad is
    pyblasgemm.torch.matmul (issue 31: it detached silently); keywords the differentiable
    product does not take are refused, gemm says it is not differentiable; under no_grad the
    plain product runs."""
    a = torch.ones(2, 3, requires_grad=True)
    b = torch.ones(3, 2)
    y = pyblasgemm.matmul(a, b)
    assert y.grad_fn is not None and pbt.matmul(a, b).grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(a.grad, torch.full((2, 3), 2.0))
    with pytest.raises(TypeError, match="compute='fp32' with tensors that require grad"):
        pyblasgemm.matmul(a, b, compute="fp32")
    with pytest.raises(TypeError, match="gemm: a or b requires grad"):
        pyblasgemm.gemm("N", "N", a, b)
    with torch.no_grad():
        assert pyblasgemm.matmul(a, b).grad_fn is None


# --- the fused epilogue route ----------------------------------------------------------------


def _numpy_view(t):
    if t is None or not isinstance(t, torch.Tensor):
        return t
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.detach().numpy()


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_fused_epilogue_route(monkeypatch, dtype, act):
    """Where pyblasgemm.matmul's epilogue takes tensors (asked once per device type), the op
    hands it bias, activation and preactivation_out in one call. Simulated on the host by a
    matmul that views the tensors as NumPy arrays: both routes give the same values."""
    real = pyblasgemm.matmul
    seen = []

    def tensor_epilogue(a, b, out=None, **kw):
        seen.append(sorted(k for k, v in kw.items() if v is not None))
        kw = {k: _numpy_view(v) for k, v in kw.items()}
        real(_numpy_view(a), _numpy_view(b), _numpy_view(out), **kw)
        return out

    x, w, b = _tensors((2, 3, 32), 8, dtype)
    with torch.no_grad():
        unfused = OPS.linear_with_preactivation(x, w, b, act)
        monkeypatch.setattr(pbt, "_matmul", tensor_epilogue)
        monkeypatch.setitem(pbt._FUSED_EPILOGUE, "cpu", True)
        fused = OPS.linear_with_preactivation(x, w, b, act)
    want = ["activation", "bias", "preactivation_out"] if act != "none" else ["bias", "preactivation_out"]
    assert seen == [want]
    for ours, theirs in zip(fused, unfused):
        _assert_within_ulps(ours, theirs, 4)


def test_probe_finds_this_releases_epilogue(monkeypatch):
    """The probe answers what pyblasgemm.matmul does with tensors and an epilogue."""
    monkeypatch.setattr(pbt, "_FUSED_EPILOGUE", {})
    one = torch.ones(1, 1)
    try:
        pyblasgemm.matmul(one, one, bias=torch.zeros(1), activation="relu")
        takes = True
    except TypeError:
        takes = False
    assert pbt._fused_epilogue(torch.device("cpu")) is takes
    assert pbt._FUSED_EPILOGUE == {"cpu": takes}


# --- errors: named, before any work --------------------------------------------------------


ERRORS = [
    (lambda: pbt.linear(np.ones((2, 3)), torch.ones(4, 3)), TypeError,
     "x must be a torch.Tensor, got ndarray"),
    (lambda: pbt.linear(torch.ones(2, 3, dtype=torch.int32), torch.ones(4, 3)), TypeError,
     "x has dtype torch.int32; expected one of float16"),
    (lambda: pbt.linear(torch.ones(2, 3), torch.ones(4, 3, dtype=torch.float64)), TypeError,
     "weight has dtype torch.float64 but x has torch.float32"),
    (lambda: pbt.linear(torch.ones(2, 3), torch.ones(4, 3), torch.ones(4, dtype=torch.float16)),
     TypeError, "bias has dtype torch.float16 but x has torch.float32"),
    (lambda: pbt.linear(torch.ones(2, 3), torch.ones(4, 2)), ValueError,
     r"x.shape\[-1\]=3 must equal weight.shape\[1\]=2 \(in_features\)"),
    (lambda: pbt.linear(torch.ones(2, 3), torch.ones(4, 3), torch.ones(3)), ValueError,
     r"bias must have shape \(4,\) \(out_features\), got \(3,\)"),
    (lambda: pbt.linear(torch.ones(2, 3), torch.ones(3)), ValueError, "weight must be 2-D"),
    (lambda: pbt.linear(torch.tensor(1.0), torch.ones(4, 1)), ValueError,
     "x must have at least 1 dimension"),
    (lambda: pbt.linear(torch.ones(2, 3), torch.ones(4, 3), activation="tanh"), ValueError,
     "activation='tanh' is not one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu'"),
    (lambda: pbt.linear(torch.ones(2, 3), torch.ones(4, 3), activation=F.relu), TypeError,
     "activation must be a str or None, got function"),
    (lambda: pbt.matmul(torch.ones(2, 3), torch.ones(2, 3)), ValueError,
     r"a.shape\[-1\]=3 must equal the rows of b \(2\)"),
    (lambda: pbt.matmul(torch.ones(2, 2, 3), torch.ones(3, 3, 4)), ValueError,
     r"the batch dimensions \(2,\) of a and \(3,\) of b do not broadcast"),
    (lambda: pbt.matmul(torch.tensor(2.0), torch.ones(3)), ValueError,
     "a and b must have at least 1 dimension"),
    (lambda: pbt.matmul(torch.ones(2, 3, dtype=torch.complex64),
                        torch.ones(3, 2, dtype=torch.complex64)), TypeError,
     "a has dtype torch.complex64"),
    (lambda: OPS.linear(torch.ones(2, 3), torch.ones(4, 2), None, "relu"), ValueError,
     r"pyblasgemm::linear: x.shape\[-1\]=3"),
    (lambda: OPS.matmul(torch.ones(2, 3), torch.ones(2, 3)), ValueError,
     r"pyblasgemm::matmul: a.shape\[-1\]=3"),
    (lambda: pbt.Linear(4, -3), ValueError, "out_features=-3 must be >= 0"),
    (lambda: pbt.Linear(4.0, 3), TypeError, "in_features must be an int, got float"),
    (lambda: pbt.Linear(4, 3, activation="gelu_erf"), ValueError, "activation='gelu_erf'"),
    (lambda: pbt.Linear(4, 3, dtype=torch.int8), TypeError, "dtype=torch.int8 is not one of"),
]


@pytest.mark.parametrize("call, error, message", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_errors_name_the_argument_before_any_work(monkeypatch, call, error, message):
    def no_product(*a, **k):
        raise AssertionError("a product ran before the arguments were checked")

    monkeypatch.setattr(pbt, "_matmul", no_product)
    with pytest.raises(error, match=message):
        call()


# --- Linear ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_linear_module_is_a_drop_in(bias):
    torch.manual_seed(7)
    theirs = torch.nn.Linear(6, 5, bias=bias, dtype=torch.float64)
    torch.manual_seed(7)
    ours = pbt.Linear(6, 5, bias=bias, dtype=torch.float64)
    assert isinstance(ours, torch.nn.Linear)
    assert (ours.in_features, ours.out_features) == (6, 5)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    for key, value in theirs.state_dict().items():       # the same init draws
        assert torch.equal(ours.state_dict()[key], value) and ours.state_dict()[key].dtype == value.dtype
    x = torch.randn(3, 2, 6, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)
    # a state_dict crosses both ways
    other = pbt.Linear(6, 5, bias=bias, dtype=torch.float64, activation="relu")
    other.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(other(x), F.relu(theirs(x)), rtol=1e-12, atol=1e-12)
    theirs.load_state_dict(other.state_dict())


@pytest.mark.parametrize("act", ACTS)
def test_linear_module_activation_and_grads(act):
    torch.manual_seed(8)
    ours = pbt.Linear(16, 12, activation=act)
    theirs = torch.nn.Linear(16, 12)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(4, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y, ref = ours(x), REFERENCE[act](theirs(x2))
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    y.square().sum().backward()
    ref.square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_linear_module_repr_and_kwargs():
    m = pbt.Linear(3, 2, bias=False, device="cpu", dtype=torch.float16, activation="silu")
    assert repr(m) == "Linear(in_features=3, out_features=2, bias=False, activation='silu')"
    assert m.weight.dtype == torch.float16 and m.bias is None
    assert repr(pbt.Linear(3, 2)) == repr(torch.nn.Linear(3, 2))


# --- torch.compile ------------------------------------------------------------------------


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(pbt.Linear(8, 32, activation="gelu"), pbt.Linear(32, 4))


def test_compile_has_no_graph_break():
    explained = torch._dynamo.explain(_mlp())(torch.randn(5, 8))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    ops = [str(n.target) for g in explained.graphs for n in g.graph.nodes
           if n.op == "call_function"]
    assert ops.count("pyblasgemm.linear_with_preactivation.default") + ops.count(
        "pyblasgemm.linear.default") == 2, ops


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    mlp = _mlp(1)
    compiled = torch.compile(mlp, fullgraph=True)
    x = torch.randn(6, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), mlp(x), rtol=1e-6, atol=1e-6)
    compiled(x).square().sum().backward()
    grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    mlp(x).square().sum().backward()
    for g, p in zip(grads, mlp.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6)


# --- the guide's examples ---------------------------------------------------------------------


def test_guide_examples_run():
    """docs/guide/pytorch.rst marks its examples +SKIP (tests/test_docs.py runs every page
    where PyTorch may be absent); here, with PyTorch, they run and print what the page says."""
    page = ROOT / "docs" / "guide" / "pytorch.rst"
    test = doctest.DocTestParser().get_doctest(page.read_text(), {"__name__": "docs"},
                                               "pytorch.rst", str(page), 0)
    for example in test.examples:
        example.options.pop(doctest.SKIP, None)
    assert len(test.examples) >= 10
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing example(s) in pytorch.rst"


# --- on a GPU -----------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs PyTorch with CUDA")


def _static_linear(dtype, seed=0):
    return [t.detach().cuda() for t in _tensors((64, 256), 128, dtype, seed=seed)]


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("act", ["none", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_cuda_graph_capture_replays_eager_bits(dtype, act):
    x, w, b = _static_linear(dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                   # warm-up (plans, kernel builds) off capture
        for _ in range(2):
            OPS.linear(x, w, b, act)
            OPS.matmul(x, w.t())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # captured on the warm-up's stream: cuBLASLt's workspace is made per stream on its first
    # call, and a stream first met while capturing gets the workspace-free algorithm
    with torch.cuda.graph(graph, stream=side):
        y = OPS.linear(x, w, b, act)
        c = OPS.matmul(x, w.t())
    for seed in (1, 2):                 # new data in the captured buffers
        new_x, new_w, _ = _static_linear(dtype, seed)
        x.copy_(new_x)
        w.copy_(new_w)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, OPS.linear(x, w, b, act))
        assert torch.equal(c, OPS.matmul(x, w.t()))
        _assert_within_ulps(y, _torch_linear(x.float(), w.float(), b.float(), act).to(dtype), 2)


@pytest.mark.gpu
@cuda
def test_reduce_overhead_compile_matches_eager():
    torch._dynamo.reset()
    mlp = _mlp(2).cuda()
    compiled = torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(4):               # warm-up runs, the recording, replays
            x = torch.randn(16, 8, device="cuda")
            torch.testing.assert_close(compiled(x).clone(), mlp(x), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16_bit_backward_matches_torch(dtype, act):
    x, w, b = [t.detach().cuda().requires_grad_() for t in _tensors((4, 32, 256), 192, dtype)]
    y = pbt.linear(x, w, b, activation=act)
    grad = torch.randn_like(y)
    y.backward(grad)
    ours = [t.grad for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    ref = _torch_linear(x, w, b, act)
    ref.backward(grad)
    # within the dtype: each side rounds float32 sums once (the pre-activation too), so the
    # results differ by a few units in the last place of the largest value
    for mine, theirs, ulps in [(y, ref, 4)] + [(m, t.grad, 8) for m, t in zip(ours, (x, w, b))]:
        assert mine.dtype == dtype
        _assert_within_ulps(mine, theirs, ulps)


def test_an_invariant_linear_gives_each_row_its_own_bits_and_still_trains():
    """pyblasgemm.torch.Linear(invariant=True): rows alone and in any batch agree bitwise
    (the forward); its gradients match torch's; opcheck takes the op with the flag."""
    torch.manual_seed(3)
    layer = pbt.Linear(96, 24, activation="silu", invariant=True)
    x = torch.randn(70, 96) * 8
    with torch.no_grad():
        whole = layer(x)
        for start, size in ((0, 1), (5, 3), (17, 40), (69, 1)):
            assert torch.equal(layer(x[start:start + size]), whole[start:start + size])
    xg = x[:9].clone().requires_grad_()
    y = layer(xg)
    y.square().sum().backward()
    ref_layer = torch.nn.Linear(96, 24)
    ref_layer.load_state_dict(layer.state_dict())
    xr = x[:9].clone().requires_grad_()
    torch.nn.functional.silu(ref_layer(xr)).square().sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(layer.weight.grad, ref_layer.weight.grad, rtol=1e-4, atol=1e-3)
    opcheck(OPS.linear, (x[:4], layer.weight, layer.bias, "silu", True))
    with pytest.raises(TypeError, match="invariant='yes' must be True, False or None"):
        pbt.Linear(4, 4, invariant="yes")
    with pytest.raises(TypeError, match="invariant=1 must be True, False or None"):
        pbt.Linear(4, 4, invariant=1)
