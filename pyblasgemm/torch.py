"""PyTorch integration: pyblasgemm's products as ``torch.library`` custom operators.

:func:`pyblasgemm.matmul` takes PyTorch tensors (CPU tensors run on the host backend, CUDA
tensors on the GPU); given one that requires grad while autograd records, it calls
:func:`matmul` here. ``torch.compile`` cannot trace into a plain function. This module registers the products as custom operators, each with a fake
(meta) implementation and a backward, so that they run

* under autograd: :func:`matmul`, :func:`linear` and :class:`Linear` differentiate through
  pyblasgemm's GEMMs (the backward's products are these operators too);
* inside ``torch.compile(fullgraph=True)`` with no graph break, and under
  ``mode="reduce-overhead"``;
* inside ``torch.cuda.graph`` capture (the GPU work goes on PyTorch's current stream, and
  CuPy's temporaries of a call come from PyTorch's caching allocator, so a captured graph owns
  every buffer it replays on).

The operators, in the ``pyblasgemm`` namespace (``torch.ops.pyblasgemm.*``):

``matmul(Tensor a, Tensor b) -> Tensor``
    ``torch.matmul``'s semantics (1-D operands promoted, batch dimensions broadcast);
``linear(Tensor x, Tensor weight, Tensor? bias, str activation) -> Tensor``
    ``act(x @ weight.T + bias)`` for any leading dimensions of ``x``, ``weight`` stored as
    ``torch.nn.Linear`` stores it (out_features x in_features);
``linear_with_preactivation(...) -> (Tensor, Tensor)``
    the same and the value before the activation, which the backward of the smooth
    activations needs (:func:`linear` uses it when a gradient will be asked for).

Operands are float16, bfloat16, float32 or float64, all of one dtype and on one device; the
result has their dtype and is contiguous. The backward needs no double backward of its own: it
is written with these operators and differentiable elementwise PyTorch operations, so second
derivatives come through them (``gradgradcheck`` in the tests, float64).

Requires PyTorch 2.4 or later: ``pip install 'pyblasgemm[torch]'``.

Example
-------
>>> import torch, pyblasgemm.torch as pbt
>>> x = torch.tensor([[1.0, -2.0]], requires_grad=True)
>>> w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], requires_grad=True)
>>> y = pbt.linear(x, w, activation="relu")
>>> y                                                         # doctest: +ELLIPSIS
tensor([[1., 0., 0.]], grad_fn=<...pyblasgemm_linear...>)
>>> y.sum().backward()
>>> x.grad, w.grad
(tensor([[1., 0.]]), tensor([[ 1., -2.],
        [ 0.,  0.],
        [ 0.,  0.]]))
"""
import math
from typing import Optional

import numpy as np

try:
    import torch
except ImportError as error:      # the module is optional: say what to install
    raise ImportError("pyblasgemm.torch needs PyTorch (2.4 or later): "
                      "pip install 'pyblasgemm[torch]'") from error

from . import epilogue
from ._typing import Activation
from .matmul import matmul as _matmul

__all__ = ["ACTIVATIONS", "matmul", "linear", "Linear"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HALF = (torch.float16, torch.bfloat16)


def _rows_of_the_table():
    """(the activation, its derivative) per name, both on the pre-activation tensor, made from
    :data:`pyblasgemm.epilogue.ACTIVATIONS` (the one table: PyTorch's own function of that name,
    and the derivative written once against a math namespace, here ``torch``)."""
    def row(a):
        return (lambda p: a.torch_forward(p, torch)), (lambda p: a.derivative(p, torch))

    return {name: row(a) for name, a in epilogue.ACTIVATIONS.items()}


#: activation name: (the activation, its derivative), both on the pre-activation tensor
_ACTIVATION_TABLE = {"none": (lambda p: p, torch.ones_like), **_rows_of_the_table()}

#: the ``activation=`` names (``None`` means ``'none'``); the epilogue's of :mod:`pyblasgemm.epilogue`
ACTIVATIONS = tuple(_ACTIVATION_TABLE)


# ---------------------------------------------------------------------------------------------
# argument checks: run by the public functions, the real implementations and the fake ones,
# so a bad call is refused before any work wherever it comes from


def _check_tensor(routine, name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{routine}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{routine}: {name} has dtype {t.dtype}; expected one of float16, "
                        f"bfloat16, float32, float64 (pyblasgemm.matmul takes the others, "
                        f"without autograd)")
    if t.device.type not in ("cpu", "cuda", "meta"):
        raise TypeError(f"{routine}: {name} is on device {t.device}; expected cpu or cuda")


def _check_same(routine, first, tensors):
    name0, t0 = first
    for name, t in tensors:
        if t.dtype != t0.dtype:
            raise TypeError(f"{routine}: {name} has dtype {t.dtype} but {name0} has {t0.dtype}; "
                            f"pass them in one dtype")
        if t.device != t0.device:
            raise TypeError(f"{routine}: {name} is on {t.device} but {name0} is on {t0.device}; "
                            f"pass them on one device")


def _activation_name(routine, activation):
    """'none', 'relu', ... for ``activation`` (None is 'none'); refused otherwise."""
    if activation is None:
        return "none"
    if not isinstance(activation, str):
        raise TypeError(f"{routine}: activation must be a str or None, got "
                        f"{type(activation).__name__}")
    if activation not in _ACTIVATION_TABLE:
        raise ValueError(f"{routine}: activation={activation!r} is not one of "
                         f"{', '.join(map(repr, ACTIVATIONS))} (or None)")
    return activation


def _check_linear(routine, x, weight, bias, activation):
    _check_tensor(routine, "x", x)
    _check_tensor(routine, "weight", weight)
    if bias is not None:
        _check_tensor(routine, "bias", bias)
    _check_same(routine, ("x", x), [("weight", weight)] + ([("bias", bias)] if bias is not None else []))
    if x.dim() < 1:
        raise ValueError(f"{routine}: x must have at least 1 dimension, got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(f"{routine}: weight must be 2-D (out_features, in_features), got shape "
                         f"{tuple(weight.shape)}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{routine}: x.shape[-1]={x.shape[-1]} must equal weight.shape[1]="
                         f"{weight.shape[1]} (in_features)")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"{routine}: bias must have shape ({weight.shape[0]},) "
                         f"(out_features), got {tuple(bias.shape)}")
    return _activation_name(routine, activation)


def _matmul_shape(routine, a, b):
    """torch.matmul's result shape for a and b, refused with their shapes if none."""
    _check_tensor(routine, "a", a)
    _check_tensor(routine, "b", b)
    _check_same(routine, ("a", a), [("b", b)])
    if a.dim() < 1 or b.dim() < 1:
        raise ValueError(f"{routine}: a and b must have at least 1 dimension, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    k_b = b.shape[0] if b.dim() == 1 else b.shape[-2]
    if a.shape[-1] != k_b:
        raise ValueError(f"{routine}: a.shape[-1]={a.shape[-1]} must equal the rows of b "
                         f"({k_b}); shapes {tuple(a.shape)} and {tuple(b.shape)}")
    batch_a = tuple(a.shape[:-2])
    batch_b = tuple(b.shape[:-2])
    try:
        batch = tuple(torch.broadcast_shapes(batch_a, batch_b))
    except RuntimeError:
        raise ValueError(f"{routine}: the batch dimensions {batch_a} of a and {batch_b} of b do "
                         f"not broadcast") from None
    return batch + ((a.shape[-2],) if a.dim() > 1 else ()) + ((b.shape[-1],) if b.dim() > 1 else ())


# ---------------------------------------------------------------------------------------------
# running pyblasgemm on tensors


class _TorchAllocation:
    """CuPy allocations of one call taken from PyTorch's caching allocator: on PyTorch's
    current stream, and inside a CUDA-graph capture from the graph's private pool (CuPy's own
    pool would hand a replayed graph's buffers to other work, or cudaMalloc mid-capture)."""

    def __init__(self, device):
        try:
            import cupy
        except ImportError as error:
            raise ImportError("pyblasgemm.torch: CUDA tensors run through CuPy; install "
                              "pyblasgemm[cuda13] or pyblasgemm[cuda12]") from error
        self._cupy, self._device = cupy, device

    def _alloc(self, size):
        cupy = self._cupy
        dev = cupy.cuda.Device().id
        t = torch.empty(max(size, 1), dtype=torch.uint8, device=torch.device("cuda", dev))
        mem = cupy.cuda.UnownedMemory(t.data_ptr(), size, t, device_id=dev)    # t: the owner
        return cupy.cuda.MemoryPointer(mem, 0)

    def __enter__(self):
        cupy = self._cupy
        self._contexts = (cupy.cuda.Device(self._device.index), cupy.cuda.using_allocator(self._alloc))
        for c in self._contexts:
            c.__enter__()
        return self

    def __exit__(self, *exc):
        for c in reversed(self._contexts):
            c.__exit__(*exc)
        return False


def _on(device):
    """The context pyblasgemm runs in for tensors on ``device``."""
    if device.type == "cuda":
        return _TorchAllocation(device)
    return _Nothing()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


#: device type: whether pyblasgemm.matmul's epilogue (bias=, activation=, preactivation_out=)
#: takes tensors of it. Asked once; where it does not, the product is pyblasgemm's and the
#: epilogue PyTorch's (see _epilogue_unfused).
_FUSED_EPILOGUE: dict = {}


def _fused_epilogue(device) -> bool:
    known = _FUSED_EPILOGUE.get(device.type)
    if known is None:
        one = torch.ones((1, 1), device=device)
        try:
            _matmul(one, one, bias=torch.zeros(1, device=device), activation="relu")
            known = True
        except TypeError:       # "an epilogue needs a and b to be NumPy arrays or CuPy arrays"
            known = False
        _FUSED_EPILOGUE[device.type] = known
    return known


def _epilogue_unfused(x2, wt, bias, name, y, pre, invariant=None):
    """y = act(x2 @ wt + bias) with pyblasgemm's product and PyTorch's epilogue, evaluated as the
    fused epilogue is: from the product in the accumulation type (float32 for 16-bit
    operands: their products are exact in float32), rounded to y's dtype once."""
    if y.dtype in _HALF:
        acc = torch.empty(y.shape, dtype=torch.float32, device=y.device)
        _matmul(x2, wt, out=acc, dtype=np.float32, invariant=invariant)
    else:
        acc = _matmul(x2, wt, out=y, invariant=invariant)
    if bias is not None:
        acc.add_(bias)
    if pre is not None:
        pre.copy_(acc)
    if name != "none":
        acc = _ACTIVATION_TABLE[name][0](acc)
    if acc is not y:
        y.copy_(acc)


def _rows(t):
    """t as 2-D (its leading dimensions merged; an explicit count, as -1 is ambiguous for an
    empty t)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _linear_into(x, weight, bias, name, want_pre, invariant=None):
    """(y, pre or None): the real implementation of the linear operators (``invariant``:
    :func:`pyblasgemm.matmul`'s, None the setting)."""
    out_features = weight.shape[0]
    lead = tuple(x.shape[:-1])
    x2 = _rows(x)
    y = torch.empty((x2.shape[0], out_features), dtype=x.dtype, device=x.device)
    pre = torch.empty_like(y) if want_pre else None
    if y.numel():
        wt = weight.t()     # (in, out): nn.Linear's storage, read transposed, not copied
        with _on(x.device):
            if _fused_epilogue(x.device):
                _matmul(x2, wt, out=y, bias=bias, activation=None if name == "none" else name,
                           preactivation_out=pre, invariant=invariant)
            else:
                _epilogue_unfused(x2, wt, bias, name, y, pre, invariant)
    y = y.reshape(lead + (out_features,))
    return y, (None if pre is None else pre.reshape(y.shape))


# ---------------------------------------------------------------------------------------------
# the operators


@torch.library.custom_op("pyblasgemm::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    shape = _matmul_shape("pyblasgemm::matmul", a, b)
    out = torch.empty(shape, dtype=a.dtype, device=a.device)
    if out.numel():
        with _on(a.device):
            _matmul(a, b, out=out)
    return out


@_matmul_op.register_fake
def _(a, b):
    return a.new_empty(_matmul_shape("pyblasgemm::matmul", a, b))


@torch.library.custom_op("pyblasgemm::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               activation: str, invariant: Optional[bool] = None) -> torch.Tensor:
    name = _check_linear("pyblasgemm::linear", x, weight, bias, activation)
    return _linear_into(x, weight, bias, name, False, invariant)[0]


@_linear_op.register_fake
def _(x, weight, bias, activation, invariant=None):
    _check_linear("pyblasgemm::linear", x, weight, bias, activation)
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


@torch.library.custom_op("pyblasgemm::linear_with_preactivation", mutates_args=())
def _linear_pre_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   activation: str, invariant: Optional[bool] = None) -> tuple[torch.Tensor, torch.Tensor]:
    name = _check_linear("pyblasgemm::linear_with_preactivation", x, weight, bias, activation)
    return _linear_into(x, weight, bias, name, True, invariant)


@_linear_pre_op.register_fake
def _(x, weight, bias, activation, invariant=None):
    _check_linear("pyblasgemm::linear_with_preactivation", x, weight, bias, activation)
    shape = tuple(x.shape[:-1]) + (weight.shape[0],)
    return x.new_empty(shape), x.new_empty(shape)


# ---------------------------------------------------------------------------------------------
# backward: the products through the operators above, the rest elementwise


def _reduce_to(g, shape):
    """g summed over the dimensions broadcasting added to ``shape``."""
    return g if tuple(g.shape) == tuple(shape) else g.sum_to_size(shape)


def _matmul_setup(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad
    a1 = a.unsqueeze(0) if a.dim() == 1 else a        # (..., m, k)
    b1 = b.unsqueeze(-1) if b.dim() == 1 else b       # (..., k, n)
    g = grad.unsqueeze(-1) if b.dim() == 1 else grad  # (..., m, n): n's axis, then m's
    if a.dim() == 1:
        g = g.unsqueeze(-2)
    ga = gb = None
    if need_a:
        ga = _reduce_to(_matmul_op(g, b1.mT), a1.shape)
        ga = ga.squeeze(-2) if a.dim() == 1 else ga
    if need_b:
        if b1.dim() == 2 and a1.dim() > 2:
            # b shared by every batch: one product over all the batch's rows (not a batch of
            # products summed afterwards)
            gb = _matmul_op(_rows(a1).mT, _rows(g))
        else:
            gb = _reduce_to(_matmul_op(a1.mT, g), b1.shape)
        gb = gb.squeeze(-1) if b.dim() == 1 else gb
    return ga, gb


_matmul_op.register_autograd(_matmul_backward, setup_context=_matmul_setup)


def _activation_grad(grad, pre, name):
    """grad · act'(pre), in float32 for 16-bit tensors (as PyTorch's own backward computes)."""
    if name == "none":
        return grad                 # act' = 1: no pass over the tensor
    p = pre.float() if pre.dtype in _HALF else pre
    return (grad.to(p.dtype) * _ACTIVATION_TABLE[name][1](p)).to(grad.dtype)


def _linear_grads(ctx, x, weight, g):
    """(dx, dweight, dbias) from g = dL/d(pre) (leading dimensions of x flattened)."""
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    g2 = _rows(g)
    dx = dw = db = None
    if need_x:
        dx = _matmul_op(g2, weight).reshape(x.shape)
    if need_w:
        dw = _matmul_op(g2.mT, _rows(x))
    if ctx.has_bias and need_b:
        db = g2.sum(0)
    return dx, dw, db


def _linear_setup(ctx, inputs, output):
    x, weight, bias, activation = inputs[:4]
    ctx.has_bias, ctx.activation = bias is not None, activation
    ctx.invariant = inputs[4] if len(inputs) > 4 else None
    # relu' from the output (relu(p) > 0 exactly where p > 0); the smooth activations
    # recompute the pre-activation in backward (linear_with_preactivation saves it instead)
    ctx.save_for_backward(x, weight, bias, output if activation == "relu" else None)


def _linear_backward(ctx, grad):
    x, weight, bias, y = ctx.saved_tensors
    name = ctx.activation
    if name == "relu":
        pre = y
    elif name != "none":
        pre = _linear_op(x, weight, bias, "none", ctx.invariant)     # the forward's bits
    else:
        pre = None
    return _linear_grads(ctx, x, weight, _activation_grad(grad, pre, name)) + (None, None)


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


def _linear_pre_setup(ctx, inputs, output):
    x, weight, bias, activation = inputs[:4]
    ctx.has_bias, ctx.activation = bias is not None, activation
    ctx.set_materialize_grads(False)        # an unused pre-activation's gradient stays None
    ctx.save_for_backward(x, weight, output[1])


def _linear_pre_backward(ctx, grad, grad_pre):
    x, weight, pre = ctx.saved_tensors
    g = None if grad is None else _activation_grad(grad, pre, ctx.activation)
    if grad_pre is not None:
        g = grad_pre if g is None else g + grad_pre
    if g is None:
        return None, None, None, None, None
    return _linear_grads(ctx, x, weight, g) + (None, None)


_linear_pre_op.register_autograd(_linear_pre_backward, setup_context=_linear_pre_setup)


# ---------------------------------------------------------------------------------------------
# the public entry points


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)`` through pyblasgemm, differentiable and traceable.

    The autograd-aware counterpart of :func:`pyblasgemm.matmul` (which calls it for tensors
    that require grad):
    1-D operands are promoted, batch dimensions broadcast, and the backward's two products run
    through pyblasgemm too. ``a`` and ``b``: float16, bfloat16, float32 or float64 tensors of
    one dtype, on one device (CPU: the host backend; CUDA: the GPU). The result is contiguous,
    in their dtype (bfloat16 too, where NumPy's rule would give float32 on the host).

    Raises
    ------
    TypeError
        a non-tensor, another dtype, dtypes or devices that differ.
    ValueError
        a 0-d operand, inner dimensions that differ, batch dimensions that do not broadcast.

    Examples
    --------
    >>> import torch, pyblasgemm.torch as pbt
    >>> a = torch.arange(6.0).reshape(2, 3).requires_grad_()
    >>> b = torch.ones(3, 2, dtype=torch.float32)
    >>> c = pbt.matmul(a, b)
    >>> c                                                     # doctest: +ELLIPSIS
    tensor([[ 3.,  3.],
            [12., 12.]], grad_fn=<...pyblasgemm_matmul...>)
    >>> c.sum().backward()
    >>> a.grad
    tensor([[2., 2., 2.],
            [2., 2., 2.]])
    >>> pbt.matmul(a, torch.ones(2, 2))
    Traceback (most recent call last):
    ...
    ValueError: pyblasgemm.torch.matmul: a.shape[-1]=3 must equal the rows of b (2); shapes (2, 3) and (2, 2)
    """
    _matmul_shape("pyblasgemm.torch.matmul", a, b)
    return _matmul_op(a, b)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[Activation] = None, *, invariant: Optional[bool] = None) -> torch.Tensor:
    """``act(x @ weight.T + bias)`` through pyblasgemm: ``torch.nn.functional.linear`` with an
    optional fused activation, differentiable and traceable.

    Parameters
    ----------
    x : Tensor
        (..., in_features): any leading dimensions (a 1-D ``x`` is one row).
    weight : Tensor
        (out_features, in_features), as ``torch.nn.Linear`` stores it.
    bias : Tensor, optional
        (out_features,).
    activation : str or None
        None or ``'none'``, or a name of :data:`pyblasgemm.epilogue.ACTIVATIONS`, applied to
        the sum in the GEMM's epilogue: 'gelu' is the exact (erf) form, 'gelu_tanh' the tanh
        approximation (``torch.nn.functional.gelu``'s two forms).
    invariant : bool, optional
        Batch-invariant forward: each row of the result has the same bits whatever other rows
        ``x`` holds (:func:`pyblasgemm.matmul`'s ``invariant=``; None: the
        ``PYBLASGEMM_INVARIANT`` setting). The backward's products are not made invariant.

    All tensors float16, bfloat16, float32 or float64, of one dtype, on one device. Backward
    runs dx = g·W and dW = gᵀ·x through pyblasgemm, g = grad · act'(x Wᵀ + b) (the
    pre-activation saved by the forward when a gradient will be asked for; relu's from the
    output), and db = g summed over the rows.

    Raises
    ------
    TypeError
        a non-tensor, another dtype, dtypes or devices that differ, a non-str activation.
    ValueError
        shapes that do not match, an unknown activation.

    Examples
    --------
    >>> import torch, pyblasgemm.torch as pbt
    >>> x = torch.tensor([[1.0, -1.0], [0.5, 2.0]])
    >>> w = torch.tensor([[1.0, 1.0], [1.0, -1.0], [0.0, 1.0]])
    >>> pbt.linear(x, w, torch.tensor([0.0, 0.0, -1.0]), activation="relu")
    tensor([[0.0000, 2.0000, 0.0000],
            [2.5000, 0.0000, 1.0000]])
    >>> pbt.linear(x, w, activation="tanh")        # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: pyblasgemm.torch.linear: activation='tanh' is not one of 'none', 'relu', ... (or None)
    """
    routine = "pyblasgemm.torch.linear"
    name = _check_linear(routine, x, weight, bias, activation)
    if name not in ("none", "relu") and torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        # a gradient will be asked for: keep the pre-activation rather than recompute it
        return _linear_pre_op(x, weight, bias, name, invariant)[0]
    return _linear_op(x, weight, bias, name, invariant)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` run by pyblasgemm, with an optional fused activation.

    A drop-in: a subclass with the same constructor (``in_features``, ``out_features``,
    ``bias=True``, ``device=``, ``dtype=``), the same parameters, ``state_dict`` keys and
    initialisation (the same random draws: with one seed both modules hold the same
    weights), plus ``activation=`` and ``invariant=`` (see :func:`linear`): ``forward(x)`` is
    ``linear(x, self.weight, self.bias, self.activation, invariant=self.invariant)``.

    Examples
    --------
    >>> import torch, pyblasgemm.torch as pbt
    >>> _ = torch.manual_seed(0)
    >>> ours = pbt.Linear(4, 3, activation="gelu")
    >>> ours
    Linear(in_features=4, out_features=3, bias=True, activation='gelu')
    >>> _ = torch.manual_seed(0)
    >>> theirs = torch.nn.Linear(4, 3)
    >>> list(ours.state_dict()) == list(theirs.state_dict()), torch.equal(ours.weight, theirs.weight)
    (True, True)
    >>> x = torch.randn(2, 5, 4)
    >>> torch.allclose(ours(x), torch.nn.functional.gelu(theirs(x)), atol=1e-6)
    True
    >>> pbt.Linear(4, -3)
    Traceback (most recent call last):
    ...
    ValueError: pyblasgemm.torch.Linear: out_features=-3 must be >= 0
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *,
                 activation=None, invariant=None):
        routine = "pyblasgemm.torch.Linear"
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{routine}: {name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{routine}: {name}={value} must be >= 0")
        if dtype is not None and dtype not in _DTYPES:
            raise TypeError(f"{routine}: dtype={dtype} is not one of float16, bfloat16, float32, "
                            f"float64")
        activation = _activation_name(routine, activation)
        if not (invariant is None or isinstance(invariant, (bool, np.bool_))):
            raise TypeError(f"{routine}: invariant={invariant!r} must be True, False or None")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation, self.invariant = activation, invariant

    def forward(self, input):
        return linear(input, self.weight, self.bias, self.activation, invariant=self.invariant)

    def extra_repr(self):
        text = super().extra_repr()
        if self.activation != "none":
            text += f", activation={self.activation!r}"
        return text if self.invariant is None else f"{text}, invariant={self.invariant}"
