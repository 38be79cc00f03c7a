"""The cuBLASLt FP8 route on the CPU (pyblasgemm/backends/cublaslt.py ``LtFp8Launch``,
pyblasgemm/planner/fp8.py ``lt_refusal`` / ``choose_route`` / ``plan``): its enum values against
cublasLt.h and nvmath, the descriptor attributes a launch sets before the heuristic and per call,
the route each case takes (layout, scale kind, activation, bias, output type, sm, cuBLAS
version, alignment), the refusals and fallbacks and their messages, and the bounded cache of
bound launches. No GPU: the launch's cuBLASLt calls are recorded, not made."""
from __future__ import annotations

import ctypes as ct
import re

import pytest

from pyblasgemm.backends import cublaslt
from pyblasgemm.desc import describe_fp8
from pyblasgemm.kernels import fp8 as gpu_fp8
from pyblasgemm.planner import fp8 as planner_fp8
from pyblasgemm.planner.fp8 import lt_refusal, plan

E4, E5 = "float8_e4m3fn", "float8_e5m2"
H100, ADA = (9, 0), (8, 9)
V13, V12_8 = 130100, 120800


def choose_route(refusal, layouts, backend=None, rows=None):
    """The planner's route rule under kernels.fp8.ROUTE (as plan_for reads it)."""
    return planner_fp8.choose_route(refusal, layouts, backend, rows, gpu_fp8.ROUTE)


def _refusal(la=("row", 4096), lb=("col", 4096), target="row", k=4096, ldc=4096, out="bfloat16",
             layouts=("tensor", "tensor"), act=0, bias_axis=None, pre=False, aligned=True, cc=H100, version=V13,
             a=E4, b=E4):
    return lt_refusal(a, b, la, lb, target, k, ldc, out, layouts, act, bias_axis, pre, aligned, cc, version)


# ---- enum values -------------------------------------------------------------------------------

def _header() -> str:
    from test_bindings import _cublaslt_header

    return _cublaslt_header()


def _enum(header, prefix):
    return {m.group(1): int(m.group(2)) for m in re.finditer(rf"^\s*{prefix}(\w+)\s*=\s*(\d+),", header, re.M)}


def test_the_fp8_enum_values_are_cublasLt_h_s():
    header = _header()
    desc = _enum(header, "CUBLASLT_MATMUL_DESC_")
    for name in ("A_SCALE_POINTER", "B_SCALE_POINTER", "FAST_ACCUM", "BIAS_DATA_TYPE", "A_SCALE_MODE",
                 "B_SCALE_MODE"):
        assert cublaslt.DESC_ATTR[name] == desc[name], name
    assert cublaslt.MATRIX_SCALE == {k: v for k, v in _enum(header, "CUBLASLT_MATMUL_MATRIX_SCALE_").items()
                                     if k in cublaslt.MATRIX_SCALE}
    assert len(cublaslt.MATRIX_SCALE) == 4


def test_the_fp8_enum_values_are_nvmaths():
    try:
        import nvmath.bindings.cublasLt as lt
        import nvmath.bindings.cublas as cb
    except ImportError:
        pytest.skip("nvmath-python is not installed (the header test checks the values)")
    assert cublaslt.MATRIX_SCALE == {k: int(getattr(lt.MatmulMatrixScale, k)) for k in cublaslt.MATRIX_SCALE}
    assert cublaslt.COMPUTE_32F == int(cb.ComputeType.COMPUTE_32F)
    assert cublaslt.DESC_ATTR["FAST_ACCUM"] == int(lt.MatmulDescAttribute.FAST_ACCUM)


def test_the_cuda_data_types_are_library_types_h_s():
    from pathlib import Path

    pathfinder = pytest.importorskip("cuda.pathfinder")
    folder = pathfinder.find_nvidia_header_directory("cublas")
    path = None if folder is None else Path(folder) / "library_types.h"
    if path is None or not path.is_file():
        pytest.skip("no library_types.h here")
    values = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*(CUDA_R_\w+)\s*=\s*(\d+),", path.read_text(), re.M)}
    assert cublaslt.FP8_DATA_TYPE == {"float8_e4m3fn": values["CUDA_R_8F_E4M3"], "float8_e5m2": values["CUDA_R_8F_E5M2"],
                                      "float16": values["CUDA_R_16F"], "bfloat16": values["CUDA_R_16BF"],
                                      "float32": values["CUDA_R_32F"]}


def test_fast_accumulation_is_off_as_in_torch_scaled_mm():
    assert cublaslt.FAST_ACCUM == 0


# ---- the descriptor a launch builds ------------------------------------------------------------

def _configured(scale_modes, epilogue=0, out="bfloat16"):
    """The attributes LtFp8Launch._configure sets before the heuristic: [(name, value)]."""
    calls = []
    cls = type("Rec", (cublaslt.LtFp8Launch,), {"_set_desc": lambda self, n, c: calls.append((n, c.value))})
    object.__new__(cls)._configure(cublaslt.Fp8Desc(64, 32, 128, 128, 128, 64, E4, E4, out, scale_modes, epilogue))
    return calls


def test_per_tensor_scales_keep_the_default_mode_and_set_both_pointers():
    calls = dict(_configured(("SCALAR_32F", "SCALAR_32F")))
    assert "A_SCALE_MODE" not in calls and "B_SCALE_MODE" not in calls     # cuBLAS < 12.9 has no such attribute
    assert calls["A_SCALE_POINTER"] and calls["B_SCALE_POINTER"]
    assert calls["FAST_ACCUM"] == 0 and "BIAS_DATA_TYPE" not in calls


@pytest.mark.parametrize("modes", [("OUTER_VEC_32F", "OUTER_VEC_32F"), ("BLK128x128_32F", "VEC128_32F")])
def test_vector_and_block_scales_set_their_modes(modes):
    calls = dict(_configured(modes))
    assert calls["A_SCALE_MODE"] == cublaslt.MATRIX_SCALE[modes[0]]
    assert calls["B_SCALE_MODE"] == cublaslt.MATRIX_SCALE[modes[1]]
    assert (calls["A_SCALE_MODE"], calls["B_SCALE_MODE"]) in {(3, 3), (5, 4)}


@pytest.mark.parametrize("out, dtype", [("bfloat16", 14), ("float16", 2)])
def test_a_bias_epilogue_sets_the_bias_type_to_the_output_s(out, dtype):
    calls = dict(_configured(("SCALAR_32F", "SCALAR_32F"), cublaslt.EPILOGUE["RELU_BIAS"], out))
    assert calls["BIAS_DATA_TYPE"] == dtype


def _recording_launch(calls, epilogue, fail=()):
    """An LtFp8Launch whose descriptor sets and matmul calls are recorded (no library); a set of
    an attribute named in ``fail`` raises once."""
    import threading

    failing = set(fail)

    def set_desc(self, name, cell):
        if name in failing:
            failing.discard(name)
            raise cublaslt.LtUnavailable(f"{name} refused")
        calls.append((name, cell.value))

    cls = type("Rec", (cublaslt.LtFp8Launch,), {
        "_set_desc": set_desc, "_matmul": lambda self, *args: calls.append(("matmul", args))})
    launch = object.__new__(cls)
    launch._scale_cells, launch._bias_cell = (ct.c_uint64(0), ct.c_uint64(0)), ct.c_uint64(0)
    launch._lock, launch.epilogue = threading.Lock(), epilogue
    launch._held = [None, None, None if epilogue & cublaslt._BIAS_BIT else 0]
    return launch


def test_a_call_sets_the_scale_and_bias_pointers_under_the_lock(monkeypatch):
    calls = []
    launch = _recording_launch(calls, cublaslt.EPILOGUE["BIAS"])
    launch(0xA0, 0xB0, 0xC0, 2.0, 0.5, 7, bias=0x100, scale_a=0x200, scale_b=0x300)
    assert calls == [("A_SCALE_POINTER", 0x200), ("B_SCALE_POINTER", 0x300), ("BIAS_POINTER", 0x100),
                     ("matmul", (0xA0, 0xB0, 0xC0, 2.0, 0.5, 7))]


def test_the_pointers_are_set_only_when_they_change():
    """The descriptor keeps the scale and bias pointers it was given: a call with the same ones
    sets nothing (the replay's steady state: one weight scale, one activation scale buffer), a
    call with one changed sets that one; the kernel-order entry (a recorded product's replay:
    scale_m / scale_n, pre ignored) shares the held pointers; a set that fails is tried again
    by the next call (never taken as held)."""
    calls = []
    launch = _recording_launch(calls, cublaslt.EPILOGUE["BIAS"])
    launch(0xA0, 0xB0, 0xC0, 1.0, 0.0, 7, bias=0x100, scale_a=0x200, scale_b=0x300)
    calls.clear()
    launch(0xA1, 0xB1, 0xC1, 1.0, 0.0, 7, bias=0x100, scale_a=0x200, scale_b=0x300)
    assert calls == [("matmul", (0xA1, 0xB1, 0xC1, 1.0, 0.0, 7))]
    calls.clear()
    launch.kernel_order(0xA2, 0xB2, 0xC2, 1.0, 0.0, 9, 0x100, 0, 0x200, 0x310)
    assert calls == [("B_SCALE_POINTER", 0x310), ("matmul", (0xA2, 0xB2, 0xC2, 1.0, 0.0, 9))]
    calls.clear()
    launch.kernel_order(0xA2, 0xB2, 0xC2, 1.0, 0.0, 9, 0x180, 0, 0x200, 0x310)
    assert calls == [("BIAS_POINTER", 0x180), ("matmul", (0xA2, 0xB2, 0xC2, 1.0, 0.0, 9))]

    # no bias epilogue: the bias is never set, and a call with bias 0 sets nothing
    calls.clear()
    plain = _recording_launch(calls, 0)
    plain.kernel_order(1, 2, 3, 1.0, 0.0, 7, 0, 0, 0x200, 0x300)
    plain.kernel_order(4, 5, 6, 1.0, 0.0, 7, 0, 0, 0x200, 0x300)
    assert calls == [("A_SCALE_POINTER", 0x200), ("B_SCALE_POINTER", 0x300), ("matmul", (1, 2, 3, 1.0, 0.0, 7)),
                     ("matmul", (4, 5, 6, 1.0, 0.0, 7))]

    # a failed set: the call raises before its matmul; the next call sets it again
    calls.clear()
    flaky = _recording_launch(calls, 0, fail=("B_SCALE_POINTER",))
    with pytest.raises(cublaslt.LtUnavailable):
        flaky(1, 2, 3, 1.0, 0.0, 7, scale_a=0x200, scale_b=0x300)
    flaky(1, 2, 3, 1.0, 0.0, 7, scale_a=0x200, scale_b=0x300)
    assert calls == [("A_SCALE_POINTER", 0x200), ("B_SCALE_POINTER", 0x300), ("matmul", (1, 2, 3, 1.0, 0.0, 7))]


def test_the_fp8_desc_is_tn():
    d = cublaslt.Fp8Desc(64, 32, 128, 128, 128, 64, E4, E5, "float32", ("SCALAR_32F", "SCALAR_32F"))
    assert (d.transa, d.transb, d.a_shape(), d.b_shape(), d.align) == ("T", "N", (128, 64), (128, 32), 16)


# ---- the bounded cache -------------------------------------------------------------------------

def test_the_launch_cache_is_bounded_and_keeps_refusals(monkeypatch):
    made = []

    class Fake:
        def __init__(self, desc, device):
            if desc.m == 999:
                raise cublaslt.LtUnavailable("cuBLASLt has no algorithm for this problem")
            made.append(desc)

    monkeypatch.setattr(cublaslt, "LtFp8Launch", Fake)
    monkeypatch.setattr(cublaslt, "_fp8_launches", {})
    monkeypatch.setattr(cublaslt, "MAX_FP8_LAUNCHES", 4)

    def desc(m):
        return cublaslt.Fp8Desc(m, 16, 64, 64, 64, 16, E4, E4, "bfloat16", ("SCALAR_32F", "SCALAR_32F"))
    first = cublaslt.fp8_launch(desc(16), 0)
    assert cublaslt.fp8_launch(desc(16), 0) is first and len(made) == 1
    for m in (32, 48, 64, 80, 96):
        cublaslt.fp8_launch(desc(m), 0)
    assert len(cublaslt._fp8_launches) == 4 and (0, desc(16)) not in cublaslt._fp8_launches
    for _ in range(2):
        with pytest.raises(cublaslt.LtUnavailable, match="cuBLASLt refused it: .*no algorithm"):
            cublaslt.fp8_launch(desc(999), 0)
    assert len(made) == 6                    # the refusal was asked once
    assert len(cublaslt._fp8_launches) == 4


# ---- the route each case takes -----------------------------------------------------------------

def test_torch_scaled_mm_s_case_goes_to_cublaslt():
    assert _refusal() is None
    assert _refusal(layouts=("rows", "cols"), out="float32") is None
    assert _refusal(layouts=("tensor", "tensor"), cc=ADA, version=V12_8) is None
    assert _refusal(a=E4, b=E5) is None and _refusal(a=E5, b=E4) is None
    assert _refusal(act=1, bias_axis="cols") is None                     # RELU_BIAS
    assert _refusal(act=3) is None                                       # GELU (tanh)
    assert _refusal(target="col", bias_axis="rows", act=3) is None       # F-ordered: bias along rows
    assert choose_route(None, ("rows", "cols")) == ("cublaslt", planner_fp8._LT_FASTER)


REFUSED = [  # (keyword arguments of _refusal, words of the reason)
    (dict(version=None), "could not be loaded"),
    (dict(cc=(8, 6)), "sm_89+"),
    (dict(a=E5, b=E5), "e5m2 x e5m2"),
    (dict(lb=("row", 4096)), "TN form .* b is row-major"),
    (dict(la=("col", 16)), "TN form .* a is column-major"),
    (dict(la=("col", 16), lb=("row", 64)), "a is column-major and b is row-major"),
    (dict(k=4008, la=("row", 4008), lb=("col", 4008)), "multiples of 16 bytes; k=4008"),
    (dict(la=("row", 4104)), "lda=4104"),
    (dict(ldc=4100), r"ldc=4100 \(2-byte"),
    (dict(aligned=False), "16-byte aligned pointers"),
    (dict(layouts=("tensor", "cols")), "scale pairs of one kind .* tensor/cols"),
    (dict(layouts=("blocks", "tensor")), "blocks/tensor"),
    (dict(layouts=("rows", "cols"), cc=ADA), "row/column FP8 scales need sm_90 and cuBLAS 12.9\\+; this is sm_89"),
    (dict(layouts=("rows", "cols"), version=V12_8), "cuBLAS 120800"),
    (dict(layouts=("blocks", "blocks"), cc=ADA), "128-block FP8 scales need sm_90"),
    (dict(layouts=("blocks", "blocks"), target="col"), "row-major .* result only"),
    (dict(pre=True, act=3), "preactivation_out"),
    (dict(act=4), "no silu"),
    (dict(act=2, bias_axis="cols"), "no gelu "),
    (dict(act=5), "no sigmoid"),
    (dict(bias_axis="cols", out="float32"), "no float32 result"),
    (dict(bias_axis="rows"), "along the result's columns .* bias_axis is 'rows'"),
    (dict(bias_axis="cols", target="col"), "along the result's rows .* bias_axis is 'cols'"),
]


@pytest.mark.parametrize("kw, words", REFUSED, ids=[w.split(" ")[0] + str(i) for i, (_, w) in enumerate(REFUSED)])
def test_what_cublaslt_cannot_take_goes_to_our_kernels_saying_why(kw, words):
    why = _refusal(**kw)
    assert why is not None and re.search(words, why), why
    assert choose_route(why, kw.get("layouts", ("tensor", "tensor"))) == ("ours", why)
    with pytest.raises(ValueError, match=f"backend='cublas' cannot run this float8 product: .*{words}"):
        choose_route(why, ("tensor", "tensor"), "cublas")


def test_block_scales_go_to_cublaslt_past_decode_as_the_other_scales():
    assert _refusal(layouts=("blocks", "blocks")) is None
    route, why = choose_route(None, ("blocks", "blocks"))
    assert route == "cublaslt" and "2.15-2.44x ours" in why and "capturable" in why
    assert choose_route(None, ("blocks", "blocks"), rows=planner_fp8.DECODE_ROWS)[0] == "ours"
    assert choose_route(None, ("blocks", "blocks"), rows=planner_fp8.DECODE_ROWS + 1)[0] == "cublaslt"
    assert choose_route(None, ("blocks", "blocks"), "tensorcore") == ("ours", "forced by backend='tensorcore'")


def test_forcing_either_route(monkeypatch):
    assert choose_route(None, ("tensor", "tensor"), "tensorcore") == ("ours", "forced by backend='tensorcore'")
    assert choose_route("cuBLASLt has no e5m2 x e5m2 FP8 GEMM", ("tensor", "tensor"), "tensorcore")[0] == "ours"
    monkeypatch.setattr(gpu_fp8, "ROUTE", "ours")
    assert choose_route(None, ("tensor", "tensor")) == ("ours", "forced by pyblasgemm.kernels.fp8.ROUTE='ours'")
    assert choose_route(None, ("tensor", "tensor"), "cublas")[0] == "cublaslt"     # backend= wins
    monkeypatch.setattr(gpu_fp8, "ROUTE", "cublaslt")
    with pytest.raises(ValueError, match="ROUTE='cublaslt' cannot run .* TN form"):
        choose_route(_refusal(lb=("row", 64)), ("tensor", "tensor"))
    monkeypatch.setattr(gpu_fp8, "ROUTE", "cublas")
    with pytest.raises(ValueError, match="ROUTE='cublas' must be None, 'cublaslt' or 'ours'"):
        choose_route(None, ("tensor", "tensor"))


def test_the_plan_carries_the_route_and_says_why():
    args = (16, 4096, 4096, E4, E4, ("row", 4096), ("col", 4096), "row", 4096, ("rows", "cols"), "bfloat16", 0,
            None, 132, H100)
    p = plan(*args, lt_version=V13)                     # 16 rows: decode, our kernels
    assert p.route == "ours" and p.why == planner_fp8._OURS_FOR_DECODE and p.config is not None
    p = plan(*((65,) + args[1:]), lt_version=V13)       # one row past DECODE_ROWS: cuBLASLt
    assert p.route == "cublaslt" and p.explain().startswith("cublaslt: cuBLASLt takes this case")
    p = plan(*((4096, 64) + args[2:]), lt_version=V13)  # the smaller side counts (n)
    assert p.route == "ours"
    p = plan(*args)                                      # cuBLASLt not loaded: ours, and our kernel's plan
    assert p.route == "ours" and "could not be loaded" in p.explain() and p.config is not None
    p = plan(*args, lt_version=V13, has_pre=True)
    assert p.route == "ours" and "preactivation_out" in p.why
    p = plan(*args, lt_version=V13, backend="tensorcore")
    assert p.route == "ours" and p.why == "forced by backend='tensorcore'"
    with pytest.raises(ValueError, match="backend='cublas' cannot run .* 16-byte aligned"):
        plan(*args, lt_version=V13, backend="cublas", aligned=False)


def test_the_lt_desc_follows_the_plan_s_orientation():
    d = cublaslt.fp8_desc_of(describe_fp8("t", E4, E5, ("row", 256), ("col", 256), "row", 16, 48, 256, 48,
                                          ("blocks", "blocks"), "bfloat16", "relu", "cols", False, "cupy", 0, (256,),
                                          1.0, 0.0))
    # c^T = b^T a^T: cuBLASLt's A is b (its 128 x 128 block scales), B is a (1 x 128)
    assert (d.m, d.n, d.k, d.lda, d.ldb, d.ldc) == (48, 16, 256, 256, 256, 48)
    assert (d.a_type, d.b_type, d.scale_modes) == (E5, E4, ("BLK128x128_32F", "VEC128_32F"))
    assert d.epilogue == cublaslt.EPILOGUE["RELU_BIAS"]
    d = cublaslt.fp8_desc_of(describe_fp8("t", E4, E5, ("row", 256), ("col", 256), "col", 16, 48, 256, 16,
                                          ("rows", "cols"), "float32", None, None, False, "cupy", 0, (256,), 1.0, 0.0))
    assert (d.m, d.n, d.a_type, d.b_type, d.epilogue) == (16, 48, E4, E5, 0)
