"""The call-signature key: one builder (pyblasgemm.calls.key) for every form and framework, and
keys that tell apart every argument fact the full path read (dtype, shape, strides, device,
alignment class, the form's words) while two calls with the same facts share one key."""
import ast
import pathlib
import types

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import calls

PACKAGE = pathlib.Path(pyblasgemm.__file__).parent


def test_no_module_but_calls_assembles_a_signature_key():
    """A key is a long tuple opening with a signature tag; only calls.py writes one, and nobody
    stores into the cache under a key of their own making (calls.cache.put / get_plan_cache
    with a signature tag elsewhere)."""
    tags = {"call", "host", "torch", "epilogue-call", "grouped-expert-call"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "calls.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Tuple) and len(node.elts) >= 6 and isinstance(node.elts[0], ast.Constant)
                    and node.elts[0].value in tags):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if (isinstance(node, ast.Attribute) and node.attr == "put" and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "cache" and isinstance(node.value.value, ast.Name)
                    and node.value.value.id == "calls"):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} calls.cache.put")
    assert found == [], found


def test_numpy_keys_tell_apart_what_the_full_path_read():
    a = np.ones((3, 4), np.float32)
    b = np.ones((4, 5), np.float32)
    c = np.empty((3, 5), np.float32)
    base = calls.key(("gemm", None), a, b, c)[0]
    assert calls.key(("gemm", None), a.copy(), b.copy(), c.copy())[0] == base     # same facts
    others = [
        calls.key(("gemm", "fp32"), a, b, c),                                     # a keyword
        calls.key(("gemm", None), a.astype(np.float64), b, c),                   # a dtype
        calls.key(("gemm", None), np.ones((3, 4), np.float32, order="F"), b, c),   # strides
        calls.key(("gemm", None), a, b, None),                                   # fresh result
        calls.key(("gemm", None), a[:2], b, c[:2]),                              # shapes
    ]
    assert all(k[0] != base for k in others)
    assert len({k[0] for k in others}) == len(others)


def test_mixed_or_unknown_arrays_are_not_keyed():
    a = np.ones((2, 2), np.float32)
    assert calls.key(("x",), a, [[1.0]]) is None
    assert calls.key(("x",), a, a, [[1.0]]) is None
    assert calls.key(("x",), [[1.0]], a) is None


class _FakeCupy:
    """What the builder reads off a cupy.ndarray: dtype, shape, strides, data.ptr/device_id."""

    def __init__(self, ptr, shape=(8, 8), strides=(16, 2), dtype=np.float16, device=0):
        self.dtype, self.shape, self.strides = np.dtype(dtype), shape, strides
        self.data = types.SimpleNamespace(ptr=ptr, device_id=device)


def test_gpu_keys_hold_device_and_alignment_class(monkeypatch):
    monkeypatch.setattr(calls, "_cupy_ndarray", [_FakeCupy])
    monkeypatch.setattr(calls, "_current_device", lambda: 0)
    a, b = _FakeCupy(0x1000), _FakeCupy(0x2000)
    k, pa, pb, pc = calls.key(("matmul",), a, b)
    assert (pa, pb, pc) == (0x1000, 0x2000, 0)
    assert calls.key(("matmul",), _FakeCupy(0x9000), _FakeCupy(0xA000))[0] == k   # other 16-B pointers
    assert calls.key(("matmul",), _FakeCupy(0x1008), b)[0] != k                  # 8-byte aligned
    assert calls.key(("matmul",), _FakeCupy(0x1000, device=1), b)[0] != k        # another device
    monkeypatch.setattr(calls, "_current_device", lambda: 1)
    assert calls.key(("matmul",), a, b)[0] != k                                  # another current one
    monkeypatch.setattr(calls, "_current_device", lambda: 0)
    # extra arrays (a bias) carry their own class: an 8-byte bias is told from an 8-byte a
    bias = _FakeCupy(0x3000, shape=(8,), strides=(2,))
    with_bias = calls.key(("e",), a, b, None, (bias,))[0]
    odd_bias = calls.key(("e",), a, b, None, (_FakeCupy(0x3008, shape=(8,), strides=(2,)),))[0]
    odd_a = calls.key(("e",), _FakeCupy(0x1008), b, None, (bias,))[0]
    assert len({with_bias, odd_bias, odd_a}) == 3
    assert calls.key(("e",), a, b, None, (None,))[0] != with_bias


class _FakeTensor:
    """What the builder reads off a torch.Tensor."""

    def __init__(self, ptr, device=0, requires_grad=False, shape=(8, 8)):
        self._ptr, self._device, self.requires_grad, self.shape = ptr, device, requires_grad, shape
        self.dtype = "float16"

    def get_device(self):
        return self._device

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return (self.shape[1], 1)


def test_torch_keys_hold_requires_grad_and_refuse_cpu_tensors(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(calls, "torch_tensor", [_FakeTensor])
    a, b = _FakeTensor(0x1000), _FakeTensor(0x2000)
    k = calls.key(("matmul",), a, b)[0]
    assert calls.key(("matmul",), _FakeTensor(0x5000), _FakeTensor(0x6000))[0] == k
    # a tensor that requires grad: no key while autograd records (never a detached replay),
    # its own key under no_grad
    assert calls.key(("matmul",), _FakeTensor(0x1000, requires_grad=True), b) is None
    with torch.no_grad():
        assert calls.key(("matmul",), _FakeTensor(0x1000, requires_grad=True), b)[0] != k
    assert calls.key(("matmul",), _FakeTensor(0x1000, device=-1), b) is None     # a CPU tensor
    out = _FakeTensor(0x7004)
    k_out, _, _, pc = calls.key(("matmul",), a, b, out)
    assert pc == 0x7004 and k_out != k


def test_the_torch_door_uses_the_builder(monkeypatch):
    from pyblasgemm import arrays

    monkeypatch.setattr(calls, "torch_tensor", [_FakeTensor])
    a, b = _FakeTensor(0x1000), _FakeTensor(0x2000)
    key, ptrs = arrays.torch_signature(("matmul", None, None, None), (a, b, None))
    assert key == calls.key(("matmul", None, None, None), a, b, None)[0] and list(ptrs) == [0x1000, 0x2000, 0]


@pytest.mark.parametrize("form", ["sgemm", "gemm", "matmul"])
def test_a_repeated_numpy_call_is_answered_the_same(form):
    """The host signature (the BLAS form's) replays; the other forms' full paths agree."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    for _ in range(3):
        if form == "sgemm":
            af, bf = np.asfortranarray(a).ravel("F"), np.asfortranarray(b).ravel("F")
            c = np.full(20, np.nan, np.float32)
            pyblasgemm.sgemm("N", "N", 5, 4, 3, 1.0, af, 5, bf, 3, 0.0, c, 5)
            got = c.reshape(4, 5).T
        elif form == "gemm":
            got = pyblasgemm.gemm("N", "N", a, b)
        else:
            got = pyblasgemm.matmul(a, b)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("swap", [False, True])
def test_a_recorded_call_runs_its_launch_with_the_pointers_in_its_order(swap):
    """Call.run (calls.ordered, bound when the call is recorded) is the one place the swapped
    order of a problem that ran as Cᵀ = op(B)ᵀ op(A)ᵀ is applied: the replays hand it the
    pointers in the caller's order; unswapped it is the launch itself (no extra call)."""
    seen = []

    def launch(pa, pb, pc, alpha, beta, stream):
        seen.append((pa, pb, pc, alpha, beta, stream))

    a, b, c = np.ones(4, np.float32), np.ones(4, np.float32), np.zeros(4, np.float32)
    key = ("test", "ordered", swap)
    calls.record(key, launch, swap, a, b, c, False, zero=0.0, limit=1.0)
    call = calls.get(key)
    try:
        assert call.swap is swap and call.launch is launch
        assert (call.run is launch) is not swap
        call.run(0xA, 0xB, 0xC, 2.0, 0.5, 7)
        assert seen == [((0xB, 0xA) if swap else (0xA, 0xB)) + (0xC, 2.0, 0.5, 7)]
    finally:
        calls.cache.pop(key)


def test_the_blas_form_rebinds_none_of_its_arguments_before_its_full_path():
    """The raw form's replay branch unpacks the signature into names of its own: a replay that
    falls through (a key miss, C meeting A or B, a scalar out of range) reaches the full path
    with the caller's arguments (``k, pa, pb, pc = sig`` once handed the key tuple to the
    full path as ``k``). Only ``stream`` and ``backend``, normalized for it, are rebound."""
    import ast

    tree = ast.parse((PACKAGE / "blas.py").read_text())
    xgemm, = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "xgemm"]
    params = {a.arg for a in xgemm.args.args + xgemm.args.kwonlyargs}
    rebound = {n.id for n in ast.walk(xgemm) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
               and n.id in params}
    assert rebound == {"stream", "backend"}
