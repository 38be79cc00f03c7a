"""The repeated float8 product (issue 36): its call signature (pyblasgemm.calls.key, the one
builder, with the scales and the bias as extra arrays and the float8 words) and its replay
(pyblasgemm.fp8.replay), on the CPU with stand-ins for CuPy arrays and torch tensors: every
fact the full path decides by is a key fact (two calls that differ in one of them never share
a launch), a hit runs the recorded launch on the new pointers in the kernel's order, what the
key cannot prove (a fresh result's alignment, an ``out`` meeting an operand) falls back to the
full path, bad arguments never meet a record, and the launches and records stay bounded.
The GPU side (bits against fresh calls, streams): tests/test_fp8_replay_gpu.py."""
from __future__ import annotations

import importlib
import types

import ml_dtypes
import numpy as np
import pytest

from pyblasgemm import calls, fp8
from pyblasgemm.epilogue import last_route
from pyblasgemm.kernels import fp8 as gpu_fp8
from pyblasgemm.plancache import PlanCache

matmul_module = importlib.import_module("pyblasgemm.matmul")     # (pyblasgemm.matmul is the function)
E4M3, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
WORDS = ("matmul", "float8", None, None, None, None, None, None)


class FakeCupy:
    """What the key builder and the replay read off a ``cupy.ndarray`` (dtype, shape, strides,
    ``data.ptr`` / ``data.device_id``, ``size``, ``flags``); constructed as
    ``FakeCupy(shape, dtype)`` it is a fresh C-ordered result at the next free address."""

    next_ptr = 0x7000_0000

    def __init__(self, shape, dtype, ptr=None, strides=None, device=0):
        self.dtype, self.shape = np.dtype(dtype), tuple(shape)
        isz = self.dtype.itemsize
        if strides is None:
            strides = tuple(int(np.prod(self.shape[i + 1:])) * isz for i in range(len(self.shape)))
        self.strides = tuple(strides)
        if ptr is None:
            ptr, FakeCupy.next_ptr = FakeCupy.next_ptr, FakeCupy.next_ptr + 0x10_0000
        self.data = types.SimpleNamespace(ptr=ptr, device_id=device)
        self.size = int(np.prod(self.shape))
        c_strides = tuple(int(np.prod(self.shape[i + 1:])) * isz for i in range(len(self.shape)))
        self.flags = types.SimpleNamespace(c_contiguous=self.strides == c_strides)


def f_order(shape, dtype, ptr=None):
    isz = np.dtype(dtype).itemsize
    return FakeCupy(shape, dtype, ptr, (isz, shape[0] * isz))


@pytest.fixture
def fake_cupy(monkeypatch):
    """FakeCupy as the CuPy array type of the key builder and of matmul's fast paths; a fresh
    plan cache."""
    monkeypatch.setattr(calls, "_cupy_ndarray", [FakeCupy])
    monkeypatch.setattr(calls, "_current_device", lambda: 0)
    monkeypatch.setattr(matmul_module, "_CUPY", [FakeCupy])
    cache = PlanCache(size=64)
    monkeypatch.setattr(calls, "cache", cache)
    fp8.forget_last()
    return cache


M, N, K = 16, 256, 512


def operands(ptr_a=0x1000_0000, ptr_b=0x2000_0000):
    """a (M x K) row-major, b (K x N) column-major: torch._scaled_mm's layout."""
    return FakeCupy((M, K), E4M3, ptr_a), f_order((K, N), E4M3, ptr_b)


def scales(kind_a="tensor", kind_b="cols", ptr=0x3000_0000):
    shapes_a = {"tensor": (), "tensor1": (1,), "rows": (M,), "blocks": (M, -(-K // 128))}
    shapes_b = {"tensor": (), "cols": (N,), "blocks": (-(-K // 128), -(-N // 128))}
    return FakeCupy(shapes_a[kind_a], np.float32, ptr), FakeCupy(shapes_b[kind_b], np.float32, ptr + 0x1000)


def key_of(words=WORDS, a=None, b=None, out=None, bias=None, sa=None, sb=None):
    """The key fp8.replay looks up (its second answer on a miss)."""
    if a is None:
        a, b = operands()
    if sa is None:
        sa, sb = scales()
    hit, key = fp8.replay(words, a, b, out, bias, sa, sb, 5)
    assert hit is None
    return key


class Launches:
    """A stand-in bound launch that records each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, pa, pb, pc, alpha, beta, stream, bias=0, pre=0, scale_m=0, scale_n=0):
        self.calls.append(((pa, pb, pc, alpha, beta, stream),
                           dict(bias=bias, pre=pre, scale_m=scale_m, scale_n=scale_n)))


def put_record(key, launch, swap=False, shape=(M, N), dtype=np.float32, on_torch=False, strides=None,
               spans=(M * K, K * N, M * N * 4)):
    """What fp8.record stores after a full call that ran as one launch."""
    call = fp8.Fp8Call(launch, swap, types.SimpleNamespace(line="ours: float8 (recorded)"), *spans, on_torch,
                       shape, strides, None if shape is None else np.dtype(dtype) if not on_torch else dtype)
    calls.put(key, call, refers_to=launch)
    return call


# ---------------------------------------------------------------------------------------------
# the key: every fact the full path decides by
# ---------------------------------------------------------------------------------------------

def test_the_float8_key_tells_apart_every_fact_the_full_path_reads(fake_cupy):
    """Scale layout (per tensor as () or (1,), per row / column, per block), scale dtype and
    contiguity, out dtype, operand types and transposition, the result given or fresh and its
    order, alignment of every pointer (operands, scales, bias), bias, activation, backend, the
    kernel family rule, the device: each gives its own key; the same facts on new pointers one
    key."""
    base = key_of()
    a, b = operands(0x5000_0000, 0x6000_0000)
    assert key_of(a=a, b=b, sa=scales(ptr=0x9000_0000)[0], sb=scales(ptr=0x9000_0000)[1]) == base
    ka, kb = -(-K // 128), -(-N // 128)
    sa, sb = scales()
    a, b = operands()
    variants = {
        "scale_a (1,)": key_of(sa=scales("tensor1")[0], sb=sb),
        "scale_a rows": key_of(sa=scales("rows")[0], sb=sb),
        "scale_a blocks": key_of(sa=scales("blocks")[0], sb=sb),
        "scale_b tensor": key_of(sa=sa, sb=scales("tensor", "tensor")[1]),
        "scale_b blocks": key_of(sa=sa, sb=scales("tensor", "blocks")[1]),
        "scale_b float16": key_of(sa=sa, sb=FakeCupy((N,), np.float16, sb.data.ptr)),
        "scale_b strided": key_of(sa=sa, sb=FakeCupy((N,), np.float32, sb.data.ptr, (8,))),
        "scale_a blocks F-ordered": key_of(sa=f_order((M, ka), np.float32, sa.data.ptr), sb=sb),
        "scale_b 8-byte aligned": key_of(sa=sa, sb=FakeCupy((N,), np.float32, sb.data.ptr + 8)),
        "scale_a on device 1": key_of(sa=FakeCupy((), np.float32, sa.data.ptr, device=1), sb=sb),
        "dtype=bfloat16": key_of(("matmul", "float8", "bfloat16") + WORDS[3:], sa=sa, sb=sb),
        "dtype=float16": key_of(("matmul", "float8", np.float16) + WORDS[3:], sa=sa, sb=sb),
        "activation=relu": key_of(WORDS[:5] + ("relu",) + WORDS[6:], sa=sa, sb=sb),
        "backend=tensorcore": key_of(WORDS[:4] + ("tensorcore",) + WORDS[5:], sa=sa, sb=sb),
        "FAMILY=sm80": key_of(WORDS[:7] + ("sm80",), sa=sa, sb=sb),
        "b row-major (transposed)": key_of(a=a, b=FakeCupy((K, N), E4M3, b.data.ptr), sa=sa, sb=sb),
        "a column-major": key_of(a=f_order((M, K), E4M3, a.data.ptr), b=b, sa=sa, sb=sb),
        "b e5m2": key_of(a=a, b=f_order((K, N), E5M2, b.data.ptr), sa=sa, sb=sb),
        "a 8-byte aligned": key_of(a=FakeCupy((M, K), E4M3, a.data.ptr + 8), b=b, sa=sa, sb=sb),
        "a on device 1": key_of(a=FakeCupy((M, K), E4M3, a.data.ptr, device=1), b=b, sa=sa, sb=sb),
        "out= float32 C": key_of(out=FakeCupy((M, N), np.float32), sa=sa, sb=sb),
        "out= float32 F": key_of(out=f_order((M, N), np.float32), sa=sa, sb=sb),
        "out= 8-byte aligned": key_of(out=FakeCupy((M, N), np.float32, 0x4000_0008), sa=sa, sb=sb),
        "bias": key_of(bias=FakeCupy((N,), np.float32), sa=sa, sb=sb),
        "bias float16": key_of(bias=FakeCupy((N,), np.float16), sa=sa, sb=sb),
        "bias 4-byte aligned": key_of(bias=FakeCupy((N,), np.float32, 0x4100_0004), sa=sa, sb=sb),
        "bias rows": key_of(bias=FakeCupy((M, 1), np.float32), sa=sa, sb=sb),
    }
    keys = list(variants.values())
    assert base not in keys, [name for name, k in variants.items() if k == base]
    assert len(set(keys)) == len(keys), "two variants share a key"
    assert kb  # (the block count of b's columns is part of the blocks shape above)


def test_another_current_device_is_another_key(fake_cupy, monkeypatch):
    base = key_of()
    monkeypatch.setattr(calls, "_current_device", lambda: 1)
    assert key_of() != base


def test_scales_of_another_kind_give_no_key(fake_cupy):
    """A NumPy scale beside CuPy operands (copied to the device by the full path), a NumPy
    bias: no key (the full path, which copies them; nothing is recorded); a scale missing: no
    replay (the full path refuses it); never a crash in the builder."""
    a, b = operands()
    sa, sb = scales()
    assert fp8.replay(WORDS, a, b, None, None, np.float32(1), sb, 5) == (None, None)
    assert fp8.replay(WORDS, a, b, None, None, sa, np.ones(N, np.float32), 5) == (None, None)
    assert fp8.replay(WORDS, a, b, None, np.ones(N, np.float32), sa, sb, 5) == (None, None)
    assert calls.key(WORDS, a, b, None, (sa, sb, np.ones(N, np.float32))) is None      # a NumPy bias
    # a scale missing: keyed as an absent extra, never recorded (the full path refuses the call)
    assert fp8.replay(WORDS, a, b, None, None, sa, None, 5)[0] is None
    assert fp8.replay(WORDS, a, b, None, None, None, sb, 5)[0] is None


def test_matmul_words_hold_the_keywords_as_given_and_the_family_rule(monkeypatch):
    words = matmul_module._fp8_words
    base = words(None, None, None, None, None, np.dtype)
    assert base == ("matmul", "float8", None, None, None, None, None, None, None)
    monkeypatch.setattr(gpu_fp8, "FAMILY", "sm80")
    assert words(None, None, None, None, None, np.dtype)[-2] == "sm80"
    monkeypatch.setattr(gpu_fp8, "ROUTE", "cublaslt")     # the route setting (cuBLASLt or ours)
    assert words(None, None, None, None, None, np.dtype)[-1] == "cublaslt"
    assert words(ml_dtypes.bfloat16, None, None, "gelu", True, np.dtype)[2:] == (
        ml_dtypes.bfloat16, None, None, "gelu", True, "sm80", "cublaslt")
    # values a key cannot hold as given: no key (the full path names them in its error)
    assert words(None, None, None, len, None, np.dtype) is None           # activation not a word
    assert words(None, 3, None, None, None, np.dtype) is None             # compute=3
    assert words(1.5, None, None, None, None, np.dtype) is None           # dtype=1.5
    assert words(None, None, None, None, 1, np.dtype)[6] == [1]           # unhashable: never a hit


# ---------------------------------------------------------------------------------------------
# the replay: the recorded launch on new pointers
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("swap", [False, True])
def test_a_hit_runs_the_launch_on_the_new_pointers_in_the_kernels_order(fake_cupy, swap):
    """The operands, result, both scales and the bias on this call's pointers (never the
    recorded ones), b and scale_b first when the product ran as c^T = b^T a^T, alpha 1 and
    beta 0, the given stream, pre 0; a fresh result of the recorded shape and dtype."""
    launch = Launches()
    bias = FakeCupy((N,), np.float32, 0x4400_0000)
    put_record(key_of(bias=bias), launch, swap)
    a, b = operands(0x5100_0000, 0x5200_0000)
    sa, sb = scales(ptr=0x5300_0000)
    bias2 = FakeCupy((N,), np.float32, 0x5400_0000)
    c, key = fp8.replay(WORDS, a, b, None, bias2, sa, sb, 77)
    assert type(c) is FakeCupy and c.shape == (M, N) and c.dtype == np.float32
    (args, ptrs), = launch.calls
    first, second = (b, a) if swap else (a, b)
    s_first, s_second = (sb, sa) if swap else (sa, sb)
    assert args == (first.data.ptr, second.data.ptr, c.data.ptr, 1.0, 0.0, 77)
    assert ptrs == dict(bias=bias2.data.ptr, pre=0, scale_m=s_first.data.ptr, scale_n=s_second.data.ptr)
    assert last_route() == "ours: float8 (recorded)"


def test_what_the_key_cannot_prove_falls_back_to_the_full_path(fake_cupy, monkeypatch):
    """A fresh result that is not 16-byte aligned (a custom allocator), an ``out`` that meets a
    or b: no launch, the key handed back for the full path (which computes via a temporary)."""
    launch = Launches()
    put_record(key_of(), launch)
    a, b = operands()
    sa, sb = scales()

    class OddResult(FakeCupy):
        def __init__(self, shape, dtype):
            super().__init__(shape, dtype, 0x6000_0008)

    monkeypatch.setattr(calls, "_cupy_ndarray", [OddResult])
    odd_a, odd_b = OddResult.__new__(OddResult), OddResult.__new__(OddResult)
    FakeCupy.__init__(odd_a, (M, K), E4M3, a.data.ptr)
    FakeCupy.__init__(odd_b, (K, N), E4M3, b.data.ptr, (1, K))
    odd_sa, odd_sb = OddResult.__new__(OddResult), OddResult.__new__(OddResult)
    FakeCupy.__init__(odd_sa, (), np.float32, sa.data.ptr)
    FakeCupy.__init__(odd_sb, (N,), np.float32, sb.data.ptr)
    put_record(key_of(a=odd_a, b=odd_b, sa=odd_sa, sb=odd_sb), launch)
    hit, key = fp8.replay(WORDS, odd_a, odd_b, None, None, odd_sa, odd_sb, 5)
    assert hit is None and key is not None and launch.calls == []
    monkeypatch.setattr(calls, "_cupy_ndarray", [FakeCupy])

    out = FakeCupy((M, N), np.float32, 0x7100_0000)
    put_record(key_of(out=out), launch, shape=None)
    inside_a = FakeCupy((M, N), np.float32, a.data.ptr + 1024)        # out over a's bytes
    assert fp8.replay(WORDS, a, b, inside_a, None, sa, sb, 5)[0] is None and launch.calls == []
    got, _ = fp8.replay(WORDS, a, b, out, None, sa, sb, 5)
    assert got is out and launch.calls[0][0][2] == out.data.ptr


def test_bad_arguments_never_meet_a_record(fake_cupy):
    """Only a call the full path accepted is recorded, and every argument its checks read is a
    key fact: a call with a bad one (a missing or float64 or misshapen scale, an out of the
    wrong dtype or shape, a bad word) misses and takes the full path, which raises its error
    before any work (tests/test_fp8.py holds those errors)."""
    launch = Launches()
    put_record(key_of(), launch)
    a, b = operands()
    sa, sb = scales()
    bad = [
        (WORDS, a, b, None, None, sa, None),
        (WORDS, a, b, None, None, FakeCupy((), np.float64, sa.data.ptr), sb),
        (WORDS, a, b, None, None, sa, FakeCupy((N + 1,), np.float32, sb.data.ptr)),
        (WORDS, a, b, FakeCupy((M, N), np.float64), None, sa, sb),
        (WORDS, a, b, FakeCupy((N, M), np.float32), None, sa, sb),
        (("matmul", "float8", "int32") + WORDS[3:], a, b, None, None, sa, sb),
        (WORDS[:5] + ("bogus",) + WORDS[6:], a, b, None, None, sa, sb),
        (WORDS[:4] + ("cublas",) + WORDS[5:], a, b, None, None, sa, sb),
        (WORDS, a, FakeCupy((K + 1, N), E4M3), None, None, sa, sb),
        (WORDS, FakeCupy((M, K), np.float16), b, None, None, sa, sb),
    ]
    for words, *args in bad:
        hit, _ = fp8.replay(words, *args[:3], args[3], args[4], args[5], 5)
        assert hit is None
    assert launch.calls == []


def test_the_torch_branch_reads_the_tensors_pointers_and_its_stream(monkeypatch):
    """A record made for tensors: the pointers through ``data_ptr()`` (operands, out, scales,
    bias), the given stream; a CPU tensor gives no key."""
    torch = pytest.importorskip("torch")

    class FakeTensor:
        def __init__(self, ptr, shape, dtype, strides=None, device=0):
            self._ptr, self.shape, self.dtype, self._device = ptr, tuple(shape), dtype, device
            self._strides = strides or tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
            self.requires_grad = False

        def get_device(self):
            return self._device

        def data_ptr(self):
            return self._ptr

        def stride(self):
            return self._strides

    monkeypatch.setattr(calls, "torch_tensor", [FakeTensor])
    monkeypatch.setattr(calls, "cache", PlanCache(size=8))
    monkeypatch.setattr(calls, "_current_device", lambda: 0)
    e4 = torch.float8_e4m3fn

    def tensors(base):
        return (FakeTensor(base, (M, K), e4), FakeTensor(base + 0x10_0000, (K, N), e4, (1, K)),
                FakeTensor(base + 0x20_0000, (M, N), torch.bfloat16), FakeTensor(base + 0x30_0000, (), torch.float32),
                FakeTensor(base + 0x40_0000, (N,), torch.float32), FakeTensor(base + 0x50_0000, (N,), torch.bfloat16))

    a, b, out, sa, sb, bias = tensors(0x1000_0000)
    launch = Launches()
    words = WORDS
    _, key = fp8.replay(words, a, b, out, bias, sa, sb, 3)
    put_record(key, launch, swap=True, shape=None, on_torch=True)
    a, b, out, sa, sb, bias = tensors(0x2000_0000)
    got, _ = fp8.replay(words, a, b, out, bias, sa, sb, 9)
    assert got is out
    (args, ptrs), = launch.calls
    assert args == (b.data_ptr(), a.data_ptr(), out.data_ptr(), 1.0, 0.0, 9)
    assert ptrs == dict(bias=bias.data_ptr(), pre=0, scale_m=sb.data_ptr(), scale_n=sa.data_ptr())
    cpu_scale = FakeTensor(0x3000_0000, (), torch.float32, device=-1)
    assert fp8.replay(words, a, b, out, bias, cpu_scale, sb, 9) == (None, None)


def test_matmul_replays_a_recorded_float8_call_before_any_check(fake_cupy, monkeypatch):
    """``pyblasgemm.matmul`` on CuPy float8 arrays with scales looks its signature up first; a
    hit never reaches scaled_matmul (the full path's checks, plan and launch)."""
    def full_path(*args, **kwargs):
        raise AssertionError("a recorded float8 call took the full path")

    monkeypatch.setattr(matmul_module, "scaled_matmul", full_path)
    launch = Launches()
    a, b = operands()
    sa, sb = scales()
    words = matmul_module._fp8_words(None, None, None, "relu", None, type(a.dtype))
    put_record(key_of(words), launch)
    got = matmul_module.matmul(a, b, scale_a=sa, scale_b=sb, activation="relu", stream=11)
    assert type(got) is FakeCupy and launch.calls[0][0][:2] == (a.data.ptr, b.data.ptr)
    # another activation: a miss, the full path's checks (which take no stand-in arrays)
    with pytest.raises(TypeError, match="an epilogue needs a and b to be NumPy arrays or CuPy arrays"):
        matmul_module.matmul(a, b, scale_a=sa, scale_b=sb, activation="gelu", stream=11)
    assert len(launch.calls) == 1


# ---------------------------------------------------------------------------------------------
# recording, and the bounds
# ---------------------------------------------------------------------------------------------

def test_record_keeps_only_a_one_launch_product(fake_cupy):
    """Nothing recorded without a one-launch product left by the GPU route (a copy, a
    temporary, the degenerate shapes, the host), nor for a key of None; a fresh CuPy result's
    shape and dtype are what a replay allocates."""
    key = key_of()
    result = FakeCupy((M, N), np.float32)
    fp8.record(key, None, result)
    assert calls.cache.get(key) is None
    launch = Launches()
    fp8._last.call = fp8.Fp8Call(launch, True, None, 1, 2, 3, False, None, None, None)
    fp8.record(None, None, result)
    assert len(calls.cache) == 0
    fp8.record(key, None, f_order((M, N), np.float32))          # an F-ordered result: not ours to allocate
    assert calls.cache.get(key) is None
    fp8.record(key, None, result)
    got = calls.cache.get(key)
    assert (got.launch, got.swap, got.shape, got.dtype, got.torch) == (launch, True, (M, N), np.float32, False)
    fp8.forget_last()
    fp8.record(key_of(out=result), result, result)
    assert calls.cache.get(key_of(out=result)) is None


def test_float8_launches_and_records_live_in_the_bounded_plan_cache(monkeypatch):
    """The bound float8 launches are plan-cache entries of execute.launch_for (its size bounds
    them; free() drops their workspace), and a record refers to its launch: evicting the launch
    takes the record with it, never a replay of a launch that is gone. (No GPU: the kernels'
    bind is a stand-in.)"""
    from pyblasgemm import execute
    from pyblasgemm.desc import describe_fp8
    from pyblasgemm.kernels import launch as launch_module
    from pyblasgemm.planner import plan_for
    from pyblasgemm.planner.arch import FAMILIES

    cache = PlanCache(size=4)
    monkeypatch.setattr(execute, "_cache", cache)
    monkeypatch.setattr(calls, "cache", cache)
    bound = []
    monkeypatch.setattr(launch_module, "bind", lambda problem, config, epilogue: bound.append(problem) or Launches())
    launches = []
    for n in (64, 128, 192, 256, 320, 384):
        desc = describe_fp8("matmul", "float8_e4m3fn", "float8_e4m3fn", ("row", 512), ("col", 512), "row", 16, n,
                            512, n, ("tensor", "cols"), "bfloat16", None, None, False, "cupy", 0,
                            (0x1000, 0x2000, 0x3000), 1.0, 0.0)
        plan = plan_for(desc, "tensorcore", arch=FAMILIES["sm_90"], lt_version=None)
        launches.append(execute.launch_for(desc, plan))
        assert execute.launch_for(desc, plan) is launches[-1]          # bound once
        assert len(cache) <= 4
    assert len(bound) == 6 and bound[0].kind == "e4m3" and (bound[0].m, bound[0].n) == (64, 16)
    record_key = ("call", "doc")
    calls.put(record_key, "a record", refers_to=launches[-1])
    (launch_key,) = [k for k in cache._entries if k[0] == "launch" and cache.peek(k) is launches[-1]]
    cache.pop(launch_key)
    assert cache.get(record_key) is None


# ---------------------------------------------------------------------------------------------
# gemm's form (cupy.cublas.gemm's): the same replay, its flags and scalars in the key
# ---------------------------------------------------------------------------------------------

gemm_module = importlib.import_module("pyblasgemm.gemm")


@pytest.fixture
def fake_gemm(fake_cupy, monkeypatch):
    monkeypatch.setattr(gemm_module, "_CUPY", [FakeCupy])
    return fake_cupy


def gemm_key(transa="N", transb="N", alpha=1.0, beta=0.0, out=None, activation=None, bias=None, a=None, b=None,
             sa=None, sb=None):
    """The key gemm's float8 replay looks up (None: a call no key holds)."""
    if a is None:
        a, b = operands()
    if sa is None:
        sa, sb = scales()
    hit, key = gemm_module._fp8_replay(transa, transb, a, b, out, alpha, beta, None, None, 5, bias, activation,
                                       sa, sb, None)
    assert hit is None
    return key


def test_the_gemm_key_holds_the_flags_and_the_scalars_types(fake_gemm):
    """transa / transb as given ('T', 'C', lowercase and cuBLAS's ints each their own), the
    scalars' types (beta's only with out=: gemm reads out only then), the activation, a bias;
    the scalars' values are no key fact. A matmul call on the same arrays never shares gemm's
    key."""
    base = gemm_key()
    assert base is not None and gemm_key(alpha=2.5) == base and gemm_key(beta=3.0) == base
    out = FakeCupy((M, N), np.float32)
    with_out = gemm_key(out=out)
    assert gemm_key(out=out, beta=-1.0) == with_out
    variants = [gemm_key(transa="T", a=FakeCupy((K, M), E4M3, 0x1000_0000)), gemm_key(transb="C"),
                gemm_key(transb="n"), gemm_key(transb=0), gemm_key(alpha=1), with_out, gemm_key(out=out, beta=0),
                gemm_key(activation="relu"), gemm_key(bias=FakeCupy((N,), np.float32)), key_of()]
    keys = [base] + variants
    assert len(set(keys)) == len(keys)


def test_gemm_calls_no_key_holds_take_the_full_path(fake_gemm):
    """Scalars the full path checks or refuses (beyond float32's range, NaN, infinity, bool,
    NumPy or 0-d array scalars), keyword values a key cannot hold as given, flags of other
    types: no key, nothing replayed or recorded."""
    for kw in (dict(alpha=1e39), dict(beta=-1e39), dict(alpha=float("nan")), dict(alpha=float("inf")),
               dict(alpha=True), dict(alpha=np.float32(2)), dict(beta=np.float64(0)), dict(activation=len),
               dict(transa=b"N"), dict(transb=None)):
        assert gemm_key(**kw) is None, kw
    a, b = operands()
    sa, sb = scales()
    assert gemm_module._fp8_replay("N", "N", a, b, None, 1.0, 0.0, 3, None, 5, None, None, sa, sb, None) == \
        (None, None)                                                # compute=3


@pytest.mark.parametrize("swap", [False, True])
def test_a_gemm_hit_runs_the_launch_with_its_alpha_and_beta(fake_gemm, monkeypatch, swap):
    """A recorded gemm runs its launch with this call's alpha (int or float, as a float), beta
    only into a given out (0 for a fresh result, whatever beta says), the pointers in the
    kernel's order; the full path is never reached."""
    def full_path(*args, **kwargs):
        raise AssertionError("a recorded float8 gemm took the full path")

    monkeypatch.setattr(gemm_module, "scaled_matmul", full_path)
    launch = Launches()
    a, b = operands()
    sa, sb = scales()
    put_record(gemm_key(beta=7.0), launch, swap)
    got = gemm_module.gemm("N", "N", a, b, alpha=2.5, beta=7.0, scale_a=sa, scale_b=sb, stream=11)
    assert type(got) is FakeCupy and got.shape == (M, N)
    first, second = (b, a) if swap else (a, b)
    (args, ptrs), = launch.calls
    assert args == (first.data.ptr, second.data.ptr, got.data.ptr, 2.5, 0.0, 11)
    s_first, s_second = (sb, sa) if swap else (sa, sb)
    assert ptrs == dict(bias=0, pre=0, scale_m=s_first.data.ptr, scale_n=s_second.data.ptr)
    out = FakeCupy((M, N), np.float32, 0x7200_0000)
    put_record(gemm_key(out=out, alpha=2), launch, swap, shape=None)
    assert gemm_module.gemm("N", "N", a, b, out, alpha=3, beta=-0.5, scale_a=sa, scale_b=sb, stream=11) is out
    assert launch.calls[1][0][2:5] == (out.data.ptr, 3.0, -0.5)
    inside_b = FakeCupy((M, N), np.float32, b.data.ptr + 64)        # out over b's bytes: the full path
    with pytest.raises(AssertionError, match="full path"):
        gemm_module.gemm("N", "N", a, b, inside_b, alpha=3, beta=-0.5, scale_a=sa, scale_b=sb, stream=11)


def test_a_torch_gemm_replays_before_the_array_door(monkeypatch):
    """gemm on float8 CUDA tensors looks its signature up before converting them: a hit never
    reaches the door; a CPU tensor gives no key (and asks no GPU for a device)."""
    torch = pytest.importorskip("torch")

    class FakeTensor:
        def __init__(self, ptr, shape, dtype, strides=None, device=0):
            self._ptr, self.shape, self.dtype, self._device = ptr, tuple(shape), dtype, device
            self._strides = strides or tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
            self.requires_grad = False

        def get_device(self):
            return self._device

        def data_ptr(self):
            return self._ptr

        def stride(self):
            return self._strides

    def door(*args, **kwargs):
        raise AssertionError("a recorded float8 gemm on tensors went through the array door")

    monkeypatch.setattr(calls, "torch_tensor", [FakeTensor])
    monkeypatch.setattr(calls, "cache", PlanCache(size=8))
    monkeypatch.setattr(calls, "_current_device", lambda: 0)
    monkeypatch.setattr(gemm_module, "_TORCH", [FakeTensor])
    monkeypatch.setattr(fp8, "_TORCH_FP8", [frozenset((torch.float8_e4m3fn, torch.float8_e5m2))])
    monkeypatch.setattr(gemm_module.arrays, "convert", door)
    monkeypatch.setattr(gemm_module.arrays, "is_foreign", lambda *xs: True)     # (a stand-in tensor)
    e4 = torch.float8_e4m3fn
    a, b = FakeTensor(0x1000_0000, (M, K), e4), FakeTensor(0x2000_0000, (K, N), e4, (1, K))
    out = FakeTensor(0x3000_0000, (M, N), torch.float32)
    sa, sb = FakeTensor(0x4000_0000, (), torch.float32), FakeTensor(0x5000_0000, (N,), torch.float32)
    _, key = gemm_module._fp8_replay("N", "N", a, b, out, 1.0, 0.0, None, None, None, None, None, sa, sb, None)
    launch = Launches()
    put_record(key, launch, on_torch=True, shape=None)
    assert gemm_module.gemm("N", "N", a, b, out, alpha=1.0, beta=0.0, scale_a=sa, scale_b=sb, stream=13) is out
    assert launch.calls[0][0] == (a._ptr, b._ptr, out._ptr, 1.0, 0.0, 13)
    cpu_a = FakeTensor(0x1000_0000, (M, K), e4, device=-1)
    assert gemm_module._fp8_replay("N", "N", cpu_a, b, out, 1.0, 0.0, None, None, None, None, None, sa, sb,
                                   None) == (None, None)


def test_the_key_reads_each_pointer_once_and_hands_it_back(fake_cupy):
    """calls.key with the scales and the bias as its extra arrays (the one builder every form's
    signature takes): the operands', result's, scales' and bias' pointers as it read them (the
    replay launches on these, reading none again), 0 for a missing result or bias; a bias given
    where there was none, or none where there was one, is another key."""
    a, b = operands()
    sa, sb = scales()
    bias, out = FakeCupy((N,), np.float32, 0x4400_0000), FakeCupy((M, N), np.float32, 0x4500_0000)
    k, pa, pb, pc, psa, psb, pbias = calls.key(WORDS, a, b, out, (sa, sb, bias))
    assert (pa, pb, pc, psa, psb, pbias) == (a.data.ptr, b.data.ptr, out.data.ptr, sa.data.ptr, sb.data.ptr,
                                             bias.data.ptr)
    plain = calls.key(WORDS, a, b, None, (sa, sb, None))
    assert plain[1:] == (a.data.ptr, b.data.ptr, 0, sa.data.ptr, sb.data.ptr, 0)
    assert len({k, plain[0], calls.key(WORDS, a, b, out, (sa, sb, None))[0],
                calls.key(WORDS, a, b, None, (sa, sb, bias))[0]}) == 4


def test_a_tensor_replay_checks_its_device_and_the_key_refuses_autograd(monkeypatch):
    """Tensors: a record replays only on the device its launch is bound on (the current one when
    it ran: not a key fact for tensors, compared after the lookup as the other tensor replays
    do); a tensor that requires grad while autograd records gives no key (the differentiable
    path), under no_grad its own key; a CPU scale or bias gives no key."""
    torch = pytest.importorskip("torch")

    class FakeTensor:
        def __init__(self, ptr, shape, dtype, device=0, grad=False):
            self._ptr, self.shape, self.dtype, self._device, self.requires_grad = ptr, tuple(shape), dtype, device, grad

        def get_device(self):
            return self._device

        def data_ptr(self):
            return self._ptr

        def stride(self):
            return tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))

    monkeypatch.setattr(calls, "torch_tensor", [FakeTensor])
    monkeypatch.setattr(calls, "cache", PlanCache(size=8))
    device = [0]
    monkeypatch.setattr(calls, "_current_device", lambda: device[0])
    e4 = torch.float8_e4m3fn
    a, b = FakeTensor(0x1000_0000, (M, K), e4), FakeTensor(0x2000_0000, (K, N), e4)
    sa, sb = FakeTensor(0x3000_0000, (), torch.float32), FakeTensor(0x4000_0000, (), torch.float32)
    out = FakeTensor(0x5000_0000, (M, N), torch.float32)
    launch = Launches()
    base = calls.key(WORDS, a, b, out, (sa, sb, None))[0]
    calls.put(base, fp8.Fp8Call(launch, False, None, M * K, K * N, M * N * 4, True, None, None, None, 1))
    assert fp8.replay(WORDS, a, b, out, None, sa, sb, 5) == (None, base)      # bound on device 1: the full path
    device[0] = 1
    assert fp8.replay(WORDS, a, b, out, None, sa, sb, 5) == (out, base) and len(launch.calls) == 1
    grad_sb = FakeTensor(0x4000_0000, (), torch.float32, grad=True)
    assert calls.key(WORDS, a, b, None, (sa, grad_sb, None)) is None
    with torch.no_grad():
        assert calls.key(WORDS, a, b, None, (sa, grad_sb, None))[0] not in (None, base)
    cpu = FakeTensor(0x5000_0000, (N,), torch.float32, device=-1)
    assert calls.key(WORDS, a, b, None, (sa, cpu, None)) is None
    assert calls.key(WORDS, a, b, None, (sa, sb, cpu)) is None


# ---------------------------------------------------------------------------------------------
# The full GPU path's wiring (describe -> plan -> execute), on stand-ins: no GPU
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def gpu_stand_ins(fake_cupy, monkeypatch):
    """The GPU route of fp8.scaled_matmul with its device calls stood in for: no device check,
    device 0, CuPy's current stream 7, the scales already on the device, and execute's
    launch_for handing out recording launches (each with the config it was planned for)."""
    pytest.importorskip("cupy")         # (the array module is looked up; nothing is allocated)
    from pyblasgemm import execute, streams
    from pyblasgemm.backends import cublaslt
    from pyblasgemm.planner import core

    monkeypatch.setattr(gpu_fp8, "check_device", lambda routine: None)
    monkeypatch.setattr(importlib.import_module("pyblasgemm._arrays"), "_get_device", [lambda: 0])
    monkeypatch.setattr(streams, "_get_current_stream", lambda: types.SimpleNamespace(ptr=7))
    monkeypatch.setattr(core, "loaded_version", lambda: 130100)
    monkeypatch.setattr(execute, "device_scale", lambda cp, s: s)
    monkeypatch.setattr(cublaslt, "device_scale", lambda cp, s: s)
    bound = {}

    def launch_for(desc, plan):
        launch = bound.setdefault((desc.key, plan.backend), Launches())
        launch.config, launch.plan = plan.config, plan
        return launch

    monkeypatch.setattr(execute, "launch_for", launch_for)
    return bound


@pytest.mark.parametrize("backend, route, layouts", [("tensorcore", "ours", ("tensor", "cols")),
                                                      ("cublas", "cublaslt", ("tensor", "tensor")),
                                                      (None, "ours", ("tensor", "tensor"))])
def test_the_gpu_route_describes_plans_and_runs_through_execute(gpu_stand_ins, backend, route, layouts):
    """The GPU route of scaled_matmul on (stand-in) CuPy arrays: the product described as c^T = b^T a^T (a
    row-major result), planned (decode rows: our kernels unless cuBLASLt is forced) and run
    through execute.execute_fp8 (b's pointers first, the scales in the kernel's order); one
    launch on the caller's memory, so its call is left for the signature's record."""
    a, b = operands()
    sa, sb = scales(*layouts)
    out = FakeCupy((M, N), ml_dtypes.bfloat16, 0x4000_0000)
    from pyblasgemm.epilogue import Epilogue

    # (past scaled_matmul's checks, which these stand-ins do not pass: the GPU route itself)
    got = fp8._on_gpu("matmul", a, b, out, out.dtype, Epilogue(None, None, False, False), layouts, None,
                      None, sa, sb, 1.0, 0.0, None, backend)
    assert got is out
    (launch,) = gpu_stand_ins.values()
    ((pointers, kw),) = launch.calls
    assert pointers == (b.data.ptr, a.data.ptr, out.data.ptr, 1.0, 0.0, 7)
    assert kw["scale_m"] == sb.data.ptr and kw["scale_n"] == sa.data.ptr and kw["bias"] == 0
    desc = launch.plan.problem
    assert (desc.prefix, desc.swap, desc.m, desc.n, desc.k, desc.epilogue.dequantize) == \
        ("e4m3", True, N, M, K, "bfloat16")
    line = last_route()
    assert line.startswith("ours: float8 on" if route == "ours" else "cuBLASLt: float8 TN"), line
    assert line.endswith(launch.plan.reason)
    call = fp8.last_call()
    assert call.launch is launch and call.swap and call.route.line == line
