"""The repeated float8 product on the GPU (issue 36: pyblasgemm.fp8.replay): a call whose
signature was recorded runs the recorded launch on its own pointers, scales and stream, from
CuPy arrays and CUDA tensors alike. Each replay is forced (the full path and the array door
raise while it runs) and held bit for bit to a fresh call on the same arrays (the plan cache
freed first), on outputs poisoned with NaN; new data at new addresses, a scale rewritten on
the device, calls that alternate between two sets of arrays, and calls that differ from the
recorded one in one key fact (scale layout, out dtype, transposition, alignment) must each
give their own right answer, so a replay on stale pointers or scales, or on a launch recorded
for another form, fails. PyTorch callers: the result from torch's allocator, the launch on
torch's current stream (a side stream held back by a sleep kernel: a launch on any other
stream would read the operand before its rewrite lands).
"""
from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import arrays, fp8
from pyblasgemm.epilogue import last_route
from pyblasgemm.kernels import fp8 as gpu_fp8
from pyblasgemm.planner.fp8 import warm_specs
from test_fp8_gpu import _fp8, check, cp, reference  # noqa: F401 (cp: the sm_89+ CuPy fixture)

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
pytestmark = pytest.mark.gpu

M, N, K = 48, 160, 384
KB, NB = -(-K // 128), -(-N // 128)
#: (scale_a layout, scale_b layout, out dtype, result given as out=)
CASES = [("tensor", "tensor", "bfloat16", False), ("tensor1", "cols", "float32", True),
         ("rows", "cols", "bfloat16", False), ("blocks", "blocks", "float32", False)]
LAYOUT = {"tensor": "tensor", "tensor1": "tensor", "rows": "rows", "cols": "cols", "blocks": "blocks"}


@pytest.fixture(scope="module", autouse=True)
def _warm(cp):
    """Compile these tests' kernels in parallel first (a cold NVRTC cache)."""
    from pyblasgemm.kernels import jit

    dev = cp.cuda.Device()
    cc = (int(dev.compute_capability[:-1]), int(dev.compute_capability[-1]))
    e4 = "float8_e4m3fn"
    cases = [(M, N, K, e4, e4, "C", "F", "C", (LAYOUT[la], LAYOUT[lb]), out, 0, None) for la, lb, out, _ in CASES]
    cases += [(M, N, K, e4, e4, "C", "C", "C", ("tensor", "tensor"), "bfloat16", 0, None),
              (M, N, K, e4, e4, "C", "F", "C", ("rows", "cols"), "float32", 0, None)]
    jit.warm(warm_specs(cases, dev.attributes["MultiProcessorCount"], cc, dev.id))


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def _scale(rng, layout):
    """A float32 scale of ``layout`` (host), never a power of two only (a wrong scale shows)."""
    shapes = {"tensor": (), "tensor1": (1,), "rows": (M,), "cols": (N,), "blocks_a": (M, KB), "blocks_b": (KB, NB)}
    return rng.uniform(0.3, 2.5, shapes[layout]).astype(np.float32)


class Framework:
    """Device arrays of one framework made from host float8 / float32 data."""

    def __init__(self, name, cp):
        self.name, self.cp = name, cp
        self.torch = _torch() if name == "torch" else None

    def operand(self, x, order="C"):
        """A device copy of float8 ``x`` ('F': column-major, the same values)."""
        if self.torch is None:
            y = self.cp.asarray(np.ascontiguousarray(x).view(np.uint8))
            return (y if order == "C" else self.cp.asfortranarray(y)).view(x.dtype)
        t = self.torch
        if order == "C":
            return t.from_numpy(np.ascontiguousarray(x).view(np.uint8)).cuda().view(t.float8_e4m3fn)
        return t.from_numpy(np.ascontiguousarray(x.T).view(np.uint8)).cuda().view(t.float8_e4m3fn).t()

    def offset_operand(self, x, offset):
        """``x`` row-major at ``offset`` bytes into a device buffer (its pointer's alignment)."""
        flat = np.zeros(x.size + 64, np.uint8)
        flat[offset:offset + x.size] = np.ascontiguousarray(x).view(np.uint8).ravel()
        if self.torch is None:
            return self.cp.asarray(flat)[offset:offset + x.size].reshape(x.shape).view(x.dtype)
        t = self.torch
        return t.from_numpy(flat).cuda()[offset:offset + x.size].view(x.shape).view(t.float8_e4m3fn)

    def f32(self, x):
        # (np.array keeps a 0-d scale 0-d; np.ascontiguousarray would make it (1,))
        return self.cp.asarray(x) if self.torch is None else self.torch.from_numpy(np.array(x)).cuda()

    def out_dtype(self, name):
        if self.torch is None:
            return BF16 if name == "bfloat16" else np.dtype(name)
        return getattr(self.torch, name)

    def poisoned(self, name):
        """An (M, N) output of ``name`` filled with NaN (made as its bits: CuPy has no bfloat16
        kernels)."""
        if self.torch is None:
            if name == "bfloat16":
                return self.cp.full((M, N), 0x7FC0, np.uint16).view(BF16)
            return self.cp.full((M, N), np.nan, np.float32)
        return self.torch.full((M, N), float("nan"), dtype=getattr(self.torch, name), device="cuda")

    def poison_the_pool(self, name):
        """Fill a free block of the result's size with NaN (the next fresh result is likely it)."""
        del_me = self.poisoned(name)
        del del_me

    def bits(self, x):
        """The result's bits on the host (uint16 / uint32)."""
        if self.torch is None:
            return self.cp.asnumpy(self.cp.ascontiguousarray(x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])))
        t = self.torch
        return x.contiguous().view({2: t.int16, 4: t.int32}[x.element_size()]).cpu().numpy()

    def values(self, x):
        """The result on the host as float32."""
        if self.torch is None:
            return self.bits(x).view(BF16 if x.dtype == BF16 else np.float32).astype(np.float32)
        return x.float().cpu().numpy()


@pytest.fixture(params=["cupy", "torch"])
def fw(request, cp):
    return Framework(request.param, cp)


def _forced_replay(monkeypatch):
    """While in effect, any call that is not a replay fails: the GPU route's full path
    (fp8._on_gpu: describe, plan, execute) and the array door raise."""
    def full_path(*args, **kwargs):
        raise AssertionError("this call should have replayed its recorded launch, it took the full path")

    monkeypatch.setattr(fp8, "_on_gpu", full_path)
    monkeypatch.setattr(arrays, "convert", full_path)


def _call(fw, a, b, sa, sb, out_name, given_out):
    out = fw.poisoned(out_name) if given_out else None
    got = pyblasgemm.matmul(a, b, scale_a=sa, scale_b=sb, out=out,
                            dtype=None if given_out else fw.out_dtype(out_name))
    if given_out:
        assert got is out
    return got


def _fresh(fw, a, b, sa, sb, out_name, given_out):
    """The same call with nothing recorded (the plan cache freed: launches and signatures)."""
    pyblasgemm.get_plan_cache().free()
    return _call(fw, a, b, sa, sb, out_name, given_out)


@pytest.mark.parametrize("route", [None, "ours"])
@pytest.mark.parametrize("la, lb, out_name, given_out", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}{'-out' if c[3] else ''}" for c in CASES])
def test_a_replay_on_new_arrays_gives_the_fresh_calls_bits(fw, monkeypatch, la, lb, out_name, given_out, route):
    """Recorded on (a1, b1, scales 1), replayed on (a2, b2, scales 2): other values at other
    addresses; the replay's bits equal a fresh call's on the second set, and both are right.
    Both routes: the rule's (cuBLASLt for these TN operands, but for block scales) and ours."""
    monkeypatch.setattr(gpu_fp8, "ROUTE", route)
    rng = np.random.default_rng(zlib.crc32(f"{la}{lb}{out_name}{fw.name}".encode()))
    host = [(_fp8(rng, (M, K), E4M3), _fp8(rng, (K, N), E4M3)) for _ in range(2)]
    sas = [_scale(rng, la if la != "blocks" else "blocks_a") for _ in range(2)]
    sbs = [_scale(rng, lb if lb != "blocks" else "blocks_b") for _ in range(2)]
    dev = [(fw.operand(a), fw.operand(b, "F"), fw.f32(sa), fw.f32(sb)) for (a, b), sa, sb in zip(host, sas, sbs)]
    pyblasgemm.get_plan_cache().free()
    first = _call(fw, *dev[0], out_name, given_out)
    route = last_route()
    if gpu_fp8.ROUTE == "ours":
        assert route.startswith("ours"), route
    _, want, scale = reference(*host[0], sas[0], sbs[0])
    check(fw.values(first), want, scale, out_name)
    with monkeypatch.context() as patch:
        _forced_replay(patch)
        fw.poison_the_pool(out_name)
        again = _call(fw, *dev[1], out_name, given_out)
        assert last_route() == route
    replayed = fw.bits(again)
    fresh = fw.bits(_fresh(fw, *dev[1], out_name, given_out))
    assert np.array_equal(replayed, fresh), f"{(replayed != fresh).sum()} elements differ from a fresh call"
    _, want, scale = reference(*host[1], sas[1], sbs[1])
    check(fw.values(again), want, scale, out_name)
    if fw.torch is not None:
        assert type(again) is fw.torch.Tensor and again.is_cuda and again.dtype == fw.out_dtype(out_name)


def test_replays_follow_the_pointers_and_the_scales_of_each_call(fw, monkeypatch):
    """Two sets of arrays in turn (each replay on its own pointers), then the per-tensor scale
    rewritten on the device (read where it is, as the first call read it): each result equal
    to a fresh call's."""
    rng = np.random.default_rng(31)
    sets = []
    for _ in range(2):
        a, b = _fp8(rng, (M, K), E4M3), _fp8(rng, (K, N), E4M3)
        sets.append((fw.operand(a), fw.operand(b, "F"), fw.f32(_scale(rng, "tensor")), fw.f32(_scale(rng, "cols"))))
    want = [fw.bits(_fresh(fw, *s, "float32", False)) for s in sets]
    _call(fw, *sets[0], "float32", False)                       # recorded
    with monkeypatch.context() as patch:
        _forced_replay(patch)
        got = [fw.bits(_call(fw, *sets[i], "float32", False)) for i in (1, 0, 1, 0)]
        if fw.torch is not None:
            sets[0][2].fill_(4.0)
        else:
            sets[0][2].fill(4.0)
        rescaled = fw.bits(_call(fw, *sets[0], "float32", False))
    for i, g in zip((1, 0, 1, 0), got):
        assert np.array_equal(g, want[i])
    assert np.array_equal(rescaled, fw.bits(_fresh(fw, *sets[0], "float32", False)))
    assert not np.array_equal(rescaled, want[0])


def test_calls_differing_in_one_key_fact_never_share_a_launch(fw):
    """On the same float8 data, one after another (each recorded, then the next differing in
    one fact): the scale layout, the out dtype, b transposed (row-major: the byte-gather path),
    a at an 8-byte offset (not 16-byte aligned: no vectorized loads, no TMA). Each result right
    and equal to a fresh call's, then each again (replayed) still right."""
    rng = np.random.default_rng(32)
    a, b = _fp8(rng, (M, K), E4M3), _fp8(rng, (K, N), E4M3)
    sa_t, sa_r, sb_c = _scale(rng, "tensor"), _scale(rng, "rows"), _scale(rng, "cols")
    da, db = fw.operand(a), fw.operand(b, "F")
    variants = {
        "per-tensor scale_a, float32": (da, db, sa_t, "float32"),
        "per-row scale_a, float32": (da, db, sa_r, "float32"),
        "per-row scale_a, bfloat16": (da, db, sa_r, "bfloat16"),
        "b row-major": (da, fw.operand(b), sa_r, "bfloat16"),
        "a 8-byte aligned": (fw.offset_operand(a, 8), db, sa_r, "bfloat16"),
        "a 16-byte aligned": (fw.offset_operand(a, 16), db, sa_r, "bfloat16"),
    }
    pyblasgemm.get_plan_cache().free()
    for rounds in range(2):
        for name, (x, y, sa, out_name) in variants.items():
            got = _call(fw, x, y, fw.f32(sa), fw.f32(sb_c), out_name, False)
            _, want, scale = reference(a, b, sa, sb_c)
            try:
                check(fw.values(got), want, scale, out_name)
            except AssertionError as e:
                raise AssertionError(f"{name} (round {rounds}): {e}") from None


def test_a_torch_replay_is_ordered_on_torchs_current_stream(cp, monkeypatch):
    """On a side stream held back by a sleep kernel, the operand rewritten, then the replayed
    call: its launch must queue behind the rewrite (a launch on the default stream or CuPy's
    would read the old operand while the side stream sleeps); the result comes from torch's
    allocator."""
    torch = _torch()
    fw = Framework("torch", cp)
    rng = np.random.default_rng(33)
    a1, a2, b = _fp8(rng, (M, K), E4M3), _fp8(rng, (M, K), E4M3), _fp8(rng, (K, N), E4M3)
    x, x2, y = fw.operand(a1), fw.operand(a2), fw.operand(b, "F")
    sa, sb = fw.f32(_scale(rng, "tensor")), fw.f32(_scale(rng, "cols"))
    want = fw.bits(_fresh(fw, x2, y, sa, sb, "bfloat16", False))
    _call(fw, x, y, sa, sb, "bfloat16", False)                  # recorded (x holds a1)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with monkeypatch.context() as patch:
        _forced_replay(patch)
        before = torch.cuda.memory_allocated()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)                      # ~0.1 s of spinning on the side stream
            x.view(torch.uint8).copy_(x2.view(torch.uint8))
            got = pyblasgemm.matmul(x, y, scale_a=sa, scale_b=sb, dtype=torch.bfloat16)
            assert torch.cuda.memory_allocated() > before       # torch's allocator made the result
        side.synchronize()
    assert np.array_equal(fw.bits(got), want)


def test_a_cupy_replay_runs_on_the_given_stream(cp, monkeypatch):
    """``stream=`` on a replay: the launch is queued there, behind a rewrite of the operand on
    that stream (held back by torch's sleep kernel on the same stream where PyTorch is here)."""
    fw = Framework("cupy", cp)
    rng = np.random.default_rng(34)
    a1, a2, b = _fp8(rng, (M, K), E4M3), _fp8(rng, (M, K), E4M3), _fp8(rng, (K, N), E4M3)
    x, x2, y = fw.operand(a1), fw.operand(a2), fw.operand(b, "F")
    sa, sb = fw.f32(_scale(rng, "tensor")), fw.f32(_scale(rng, "cols"))
    want = fw.bits(_fresh(fw, x2, y, sa, sb, "float32", False))
    _call(fw, x, y, sa, sb, "float32", False)
    cp.cuda.Device().synchronize()
    side = cp.cuda.Stream(non_blocking=True)
    with monkeypatch.context() as patch:
        _forced_replay(patch)
        with side:
            try:
                import torch
                if torch.cuda.is_available():
                    with torch.cuda.stream(torch.cuda.ExternalStream(side.ptr)):
                        torch.cuda._sleep(200_000_000)
            except ImportError:
                pass
            x.view(np.uint8)[...] = x2.view(np.uint8)
        got = pyblasgemm.matmul(x, y, scale_a=sa, scale_b=sb, stream=side, dtype=fw.out_dtype("float32"))
        side.synchronize()
    assert np.array_equal(fw.bits(got), want)


def test_a_replay_records_nothing_new_and_the_cache_stays_bounded(cp):
    """Many distinct float8 signatures under a small plan cache: it never holds more than its
    size, and the calls stay right (an evicted launch takes its records with it)."""
    fw = Framework("cupy", cp)
    rng = np.random.default_rng(35)
    cache = pyblasgemm.get_plan_cache()
    old = cache.get_size()
    cache.free()
    cache.set_size(6)
    try:
        for m in (16, 32, 48, 64, 16, 32):
            a, b = _fp8(rng, (m, K), E4M3), _fp8(rng, (K, N), E4M3)
            sa, sb = _scale(rng, "tensor"), _scale(rng, "cols")
            for _ in range(2):
                got = pyblasgemm.matmul(fw.operand(a), fw.operand(b, "F"), scale_a=fw.f32(sa), scale_b=fw.f32(sb))
                _, want, scale = reference(a, b, sa, sb)
                check(fw.values(got), want, scale, "float32")
                assert len(cache) <= 6
    finally:
        cache.set_size(old)
        cache.free()


def test_gemm_float8_replays_with_new_alpha_beta_and_arrays_bitwise(cp):
    """gemm's float8 replay (gemm._fp8_replay): a call recorded once, then repeated on other
    arrays of the same layout with other alpha / beta (beta into out=), gives the bits a fresh
    call (the full path, its plan cache freed) gives; the poisoned result is overwritten."""
    from test_fp8_gpu import dev

    m, n, k = 96, 160, 256
    E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

    def arrays_(seed):
        r = np.random.default_rng(seed)
        return (dev(cp, _fp8(r, (m, k), E4M3)), dev(cp, _fp8(r, (n, k), E4M3)),
                cp.asarray(np.float32(0.5)), cp.asarray(np.float32(2.0)),
                r.standard_normal((m, n)).astype(np.float32))

    def call(a, w, sa, sb, c0, alpha, beta):
        out = cp.asarray(c0)
        got = pyblasgemm.gemm("N", "T", a, w, out=out, alpha=alpha, beta=beta, scale_a=sa, scale_b=sb)
        assert got is out
        return cp.asnumpy(out)

    first, second = arrays_(1), arrays_(2)
    fresh = []
    for args, alpha, beta in ((first, 1.0, 0.5), (second, -0.75, 2.0)):
        pyblasgemm.get_plan_cache().free()
        fresh.append(call(*args, alpha, beta))
    pyblasgemm.get_plan_cache().free()
    call(*first, 1.0, 0.5)                                  # recorded
    hits = pyblasgemm.get_plan_cache().hits
    again = call(*second, -0.75, 2.0)                       # replayed: new pointers, scalars
    assert np.array_equal(again.view(np.uint32), fresh[1].view(np.uint32))
    assert np.array_equal(call(*first, 1.0, 0.5).view(np.uint32), fresh[0].view(np.uint32))
    assert pyblasgemm.get_plan_cache().hits == hits         # (a replay peeks: no plan looked up)
