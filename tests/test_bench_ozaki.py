"""bench/ozaki.py and bench/ozaki_passes.py without a GPU: the command lines, the case groups
and every new group's code path end to end on NumPy / CPU-torch stand-ins at 64³ (issue 34's
closing runs: sgemm int8-ozaki, the native routes, igemm, 16384³ dgemm; the per-pass profile
for --bits and --dtype), so the device run is right the first time."""
from __future__ import annotations

import contextlib
import json
import pathlib
import sys
import types

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import ozaki  # noqa: E402


class _Rs:
    """cupy.random.RandomState on NumPy (the calls the bench makes)."""

    def __init__(self, seed):
        self._g = np.random.default_rng(seed)

    def standard_normal(self, shape, dtype=np.float64):
        return self._g.standard_normal(shape).astype(dtype)

    def randint(self, low, high, size, dtype=np.int64):
        return self._g.integers(low, high, size=size).astype(dtype)


_NOOP = types.SimpleNamespace(free_all_blocks=lambda: None)
FAKE_CP = types.SimpleNamespace(
    float32=np.float32, float64=np.float64, int8=np.int8, int32=np.int32,
    asarray=np.asarray, asnumpy=np.asarray, array_equal=np.array_equal, empty=np.empty,
    random=types.SimpleNamespace(RandomState=_Rs),
    cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None)),
    get_default_memory_pool=lambda: _NOOP)


def _fake_torch():
    """PyTorch on the CPU behind the names the bench calls (``device='cuda'`` dropped)."""
    torch = pytest.importorskip("torch")
    matmul = types.SimpleNamespace(allow_tf32=True)
    return types.SimpleNamespace(as_tensor=lambda x, device=None: torch.as_tensor(x), _int_mm=torch._int_mm,
                                 backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul)),
                                 cuda=types.SimpleNamespace(empty_cache=lambda: None))


def _fake_pb():
    """pyblasgemm's host backend behind the GPU calls: ``backend=`` dropped (the host takes
    neither 'tensorcore' nor 'cublas'); plans on the datasheet sm_90."""
    import pyblasgemm

    def drop(fn):
        return lambda *a, backend=None, **kw: fn(*a, **kw)

    return types.SimpleNamespace(
        matmul=drop(pyblasgemm.matmul), igemm=drop(pyblasgemm.igemm), dgemm=drop(pyblasgemm.dgemm),
        sgemm=drop(pyblasgemm.sgemm), zgemm=drop(pyblasgemm.zgemm),
        plan=lambda *a, **kw: pyblasgemm.plan(*a, arch="sm_90", **kw))


@pytest.fixture
def stand_ins(monkeypatch):
    """The closing groups at 64³ with a fake clock (1 ms a call)."""
    monkeypatch.setattr(ozaki, "interleaved_median_s",
                        lambda fns, inner=1, samples=1, warmup=0: {name: (fn(), 1e-3)[1] for name, fn in fns.items()})
    monkeypatch.setattr(ozaki, "_single_s", lambda cp, fn, n=5: (fn(), 2e-3)[1])
    for name, value in (("BIG", 64), ("SSIZES", [64]), ("NATIVE_SIZE", 64), ("ISIZES", [64])):
        monkeypatch.setattr(ozaki, name, value)
    return FAKE_CP, _fake_torch(), _fake_pb()


def test_cases_name_groups_and_sets_and_refuse_a_typo(capsys):
    assert ozaki.parse_cases("guide") == ("dgemm", "layouts", "zgemm", "cgemm")     # the default
    assert ozaki.parse_cases("igemm,guide") == ("dgemm", "layouts", "zgemm", "cgemm", "igemm")
    assert ozaki.parse_cases("all") == ozaki.GROUPS
    for bad, word in (("", "names no group"), ("sgemm,nativ", "'nativ' is not a group")):
        with pytest.raises(ValueError, match=word):
            ozaki.parse_cases(bad)
    with pytest.raises(SystemExit):
        ozaki.main(["--out", "x.json", "--cases", "int8"])
    err = capsys.readouterr().err
    assert "argument --cases: 'int8' is not a group" in err and "--cases: --cases" not in err


def test_every_group_has_a_branch_and_an_estimate_in_the_docstring():
    for group in ozaki.GROUPS:
        assert f"{group} " in ozaki.__doc__.split("Cases (group")[0], group      # its seconds
    with pytest.raises(ValueError, match="group='bogus'"):
        next(ozaki.run_group("bogus", None, None, None, None, False))


def test_the_long_double_reference_is_computed_once_and_gives_the_same_errors():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 40)), rng.standard_normal((40, 6))
    z = a + 1j * rng.standard_normal((4, 40))
    for x, y in ((a, b), (z, b + 0.5j)):
        got = (x @ y) * (1 + 1e-12)
        assert ozaki._ld_error(got, x, y) == ozaki._ld_error(got, x, y, ozaki._ld_reference(x, y)) > 0


def test_gpu_operands_take_only_the_normal_layout_without_the_child():
    with pytest.raises(ValueError, match="layout='normal' and child=False, got layout='row scales'"):
        ozaki.dgemm_case(None, None, None, 64, None, [], "row scales", child=False, gpu_operands=True)
    with pytest.raises(ValueError, match="child=True"):
        ozaki.dgemm_case(None, None, None, 64, None, [], gpu_operands=True)


def test_the_closing_groups_run_end_to_end_on_stand_ins(stand_ins, tmp_path):
    cp, torch, pb = stand_ins
    rng = np.random.default_rng(1)
    cases = {g: list(ozaki.run_group(g, cp, torch, pb, rng, False)) for g in ozaki.SETS["closing"]}
    (big,) = cases["dgemm16k"]
    assert (big["case"], big["layout"], big["m"]) == ("dgemm", "normal", 64)
    assert set(big["contenders"]) == {"torch.matmul (DGEMM)", "cupy.matmul (DGEMM)",
                                      "pyblasgemm int8-ozaki (default)", "pyblasgemm int8-ozaki-40"}
    assert big["contenders"]["cupy.matmul (DGEMM)"]["max_rel_err_vs_longdouble"] < 1e-15

    (sg,) = cases["sgemm"]
    c = sg["contenders"]
    assert sg["case"] == "sgemm" and torch.backends.cuda.matmul.allow_tf32 is False      # SGEMM, not TF32
    assert c["pyblasgemm int8-ozaki (default)"]["err_over_sgemm"] <= 1.0               # the bar
    assert min(c[n]["err_over_sgemm"] for n in ("torch.matmul (SGEMM)", "cupy.matmul (SGEMM)")) == 1.0
    assert c["pyblasgemm 3xtf32"]["route"].startswith("plan: backend 'tensorcore' config ")
    # the host emulates without the GPU's composite route: each records its plan instead (the
    # forced one the composition, the planner's choice at 64³ native SGEMM)
    assert "Ozaki II with 8 moduli" in c["pyblasgemm int8-ozaki (default)"]["route"]
    assert c["pyblasgemm int8-ozaki (planner's choice)"]["route"].startswith("no composition ran; plan: backend 'cublas'")
    assert all(v["ratio_steady_vs_native"] > 0 and v["ratio_single_vs_native"] > 0 for v in c.values())

    assert [r["dtype"] for r in cases["native"]] == ["float64", "complex128", "float32"]
    for row in cases["native"]:
        routine = dict((d, r) for d, r, _ in ozaki.NATIVE_TYPES)[row["dtype"]]
        raw = row["contenders"][f"pyblasgemm.{routine} (raw form)"]
        # the raw form's C = A @ B (its B-first column-major call): the reference's error
        assert raw["max_rel_err_vs_longdouble"] < (1e-6 if row["dtype"] == "float32" else 1e-15)
        assert raw["ratio_steady_vs_cublas"] == 1.0 and "same_bits_as_cupy" in raw
        assert row["contenders"]["pyblasgemm.matmul"]["route"].startswith("plan: backend")

    (ig,) = cases["igemm"]
    assert all(v["same_bits_as_int_mm"] for v in ig["contenders"].values()), ig
    assert ig["contenders"]["pyblasgemm.igemm (planned)"]["TOPS_steady"] == pytest.approx(2 * 64**3 / 1e-3 / 1e12)
    assert ig["contenders"]["pyblasgemm.igemm backend='cublas' (cublasGemmEx)"]["route"].startswith("plan: backend 'cublas'")
    assert "ratio_steady_vs_int_mm" in ig["contenders"]["pyblasgemm.matmul(w, x.T, dtype=int32)"]
    out = tmp_path / "doc.json"
    ozaki.write_doc({"cases": [r for rows in cases.values() for r in rows]}, out)
    json.loads(out.read_text())              # every field serializes


def test_the_guide_figure_still_takes_the_dial_sweep_when_a_16384_row_follows():
    """dial_points reads the dgemm row with the dial sweep (8192³), not the last normal dgemm
    row: a --cases all run ends in the 16384³ row with one dial."""
    res = ROOT / "bench" / "results"
    doc = json.loads((res / "ozaki_h200_2026-11-27_a8ba380.json").read_text())
    before = ozaki.dial_points(doc)
    big = json.loads(json.dumps([c for c in doc["cases"] if c["case"] == "dgemm" and c["m"] == 8192
                                 and c["layout"] == "normal"][0]))
    big["m"] = big["n"] = big["k"] = 16384
    big["contenders"] = {k: v for k, v in big["contenders"].items() if not k.startswith("pyblasgemm int8-ozaki-")
                         or k.endswith("-40")}
    doc["cases"].append(big)
    assert ozaki.dial_points(doc) == before and before[2] == 8192 and len(before[0]) == len(ozaki.BITS)


def test_the_guide_groups_run_on_stand_ins_and_a_failed_child_is_recorded(stand_ins, monkeypatch, capsys):
    """The guide's groups (sizes shrunk) through the changed reference and sampling code; the
    cuBLAS-emulation child failing (no GPU here) leaves an error row, not a crash."""
    cp, torch, pb = stand_ins
    for name, value in (("SIZES", [32, 64]), ("ZSIZES", [64]), ("LSIZE", 64), ("GSIZE", 64), ("CSIZE", 64),
                        ("BITS", [24, 56])):
        monkeypatch.setattr(ozaki, name, value)
    monkeypatch.setattr(ozaki, "_cublas_emulation", lambda *a: {"cuBLAS emulation": {"side": "theirs",
                                                                                      "error": "no GPU"}})
    rng = np.random.default_rng(2)
    rows = [r for g in ozaki.SETS["guide"] for r in ozaki.run_group(g, cp, torch, pb, rng, False)]
    assert [(r["case"], r.get("layout"), r["m"]) for r in rows] == [
        ("dgemm", "normal", 32), ("dgemm", "normal", 64), ("dgemm", "row scales", 64),
        ("dgemm", "element spread", 64), ("dgemm", "graded 2^-30", 64), ("dgemm", "graded 2^-20", 64),
        ("zgemm", None, 64), ("cgemm", None, 64)]
    sweep = rows[1]["contenders"]
    assert sweep["cuBLAS emulation"] == {"side": "theirs", "error": "no GPU"}
    assert sweep["pyblasgemm int8-ozaki-56"]["max_rel_err_vs_longdouble"] < 1e-16
    assert sweep["pyblasgemm int8-ozaki-24"]["max_rel_err_vs_longdouble"] > 1e-9        # the dial bites
    assert rows[6]["contenders"]["pyblasgemm int8-ozaki (default)"]["max_rel_err_vs_longdouble"] < 1e-16
    assert rows[7]["contenders"]["pyblasgemm 3xtf32"]["max_rel_err_vs_complex128"] < 1e-6
    for r in rows:
        ozaki._show(r)
    assert "error" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# bench/ozaki_passes.py


def test_passes_command_line_takes_dtype_and_bits_and_refuses_bad_values(capsys):
    from bench import ozaki_passes as op

    a = op.parse_args([])
    assert (a.sizes, a.dtype, a.bits) == ([4096, 8192, 16384], "float64", None)
    assert op.compute_of(a.bits) == "int8-ozaki" and op.compute_of(40) == "int8-ozaki-40"
    for argv, word in ((["--bits", "0"], "--bits: 0 is outside 1..62"), (["--bits", "63"], "outside 1..62"),
                       (["--dtype", "float16"], "invalid choice: 'float16'"),
                       (["--sizes", "8192,x"], "--sizes: '8192,x' is not a comma list of integers"),
                       (["--sizes", "0"], "holds a size below 1")):
        with pytest.raises(SystemExit):
            op.parse_args(argv)
        assert word in capsys.readouterr().err, argv


def test_passes_memory_estimate_keeps_16384_for_real_types_and_skips_complex_there():
    """An H200 (139 GiB, 0.8 of it usable): 16384² runs for float64 (the committed profile) and
    float32; complex128 (4x the planes and products) runs at 8192 only."""
    from bench import ozaki_passes as op
    from pyblasgemm.planner import make_desc, plan_for

    usable = 0.8 * 139 * 2**30
    for dtype, bits, fits_16384 in (("float64", None, True), ("float64", 40, True), ("float32", None, True),
                                    ("complex128", None, False)):
        planes = plan_for(make_desc(16384, 16384, 16384, dtype, compute=op.compute_of(bits)),
                          "tensorcore").launch.setting.planes
        assert (op.bytes_per_element(dtype, planes) * 16384**2 < usable) == fits_16384, dtype
        assert op.bytes_per_element(dtype, planes) * 8192**2 < usable


def test_passes_record_catches_the_complex_stacking_and_puts_every_hook_back(monkeypatch):
    from bench import ozaki_passes as op
    from pyblasgemm import composite
    from pyblasgemm.kernels import ozaki_kernels as ok

    before = {n: getattr(ok.OzakiPasses, n) for n in ("scale", "residues", "guard_count", "reconstruct")}
    monkeypatch.setattr(composite, "_stack", lambda *a: ("stacked", a[1:]))

    digit_launch = composite._digit_launch

    def run(desc, a, b, c, plan, inner):
        assert composite._stack(desc, "A", "B", "d") == ("stacked", ("A", "B", "d"))
        assert ok.OzakiPasses.scale is not before["scale"]          # wrapped while it runs
        assert composite._digit_launch is not digit_launch and plan.launch.digits is None
        composite._last["route"] = f"ran {desc.prefix} {plan.launch.setting.count}"

    monkeypatch.setattr(composite, "run", run)
    calls, plan, route, c = op._record(FAKE_CP, None, 64, "complex128", 40, digits=False)
    from pyblasgemm.planner import composite as planned
    assert composite._digit_launch is digit_launch and planned.DIGITS is True
    assert [n for n, *_ in calls] == ["stack"] and route == "ran z 12" and c.dtype == np.complex128
    assert plan.launch.setting.bits == 40 and not plan.launch.setting.guard
    stand_in = composite._stack
    assert {n: getattr(ok.OzakiPasses, n) for n in before} == before and stand_in(0, 1) == ("stacked", (1,))
    a, b, c = op._operands(FAKE_CP, 8, "complex128", 3)
    assert a.dtype == np.complex128 and a.shape == (64,) and np.all(a.imag != 0)
    assert op._operands(FAKE_CP, 8, "float32", 3)[0].dtype == np.float32


def test_the_scripts_examples_run():
    """The docstring examples of the two scripts and of the shared command line they use."""
    import doctest

    from bench import heldout, ozaki_passes

    for module in (ozaki, ozaki_passes, heldout):
        got = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert got.failed == 0 and got.attempted >= 4, (module.__name__, got)


def test_the_ncu_driver_names_its_cases_before_any_gpu_work():
    """bench/ncu_close.py (the int8 and FP8 kernels under Nsight Compute): a wrong or missing
    case is refused with the usage, before CuPy is imported."""
    from bench import ncu_close

    for argv in ([], ["int4"], ["int8", "fp8"]):
        with pytest.raises(SystemExit, match="usage: ncu_close.py CASE, CASE one of int8, fp8"):
            ncu_close.main(argv)


def test_interleaved_timing_rotates_the_contenders_and_enters_their_knobs(monkeypatch):
    """bench.timing.interleaved_median_s under a fake CUDA clock whose calls slow by 1 ms a
    bracket (a GPU warming up): each round starts with the next contender, so the drift lands
    on all of them alike (medians 13-15 ms; one after the other: 11, 14 and 17). A
    contender's ``enter`` wraps its warmup and each bracket; each bracket starts with one call
    before its events."""
    import contextlib
    import sys

    from bench import timing

    clock = {"now": 0.0, "records": 0}
    log = []

    class Event:
        def record(self):
            self.t = clock["now"]
            clock["records"] += 1

        def synchronize(self):
            pass

    def elapsed(start, stop):
        return stop.t - start.t

    def fn(name, ms):
        def call():
            log.append(name)
            clock["now"] += ms + clock["records"] // 2      # bracket b's calls: ms + b
        return call

    cuda = types.SimpleNamespace(Event=Event, get_elapsed_time=elapsed,
                                 get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    knob = []

    @contextlib.contextmanager
    def switched():
        knob.append("in")
        yield
        knob.append("out")

    got = timing.interleaved_median_s({"a": fn("a", 10.0), "b": fn("b", 10.0), "c": fn("c", 10.0)}, inner=2,
                                      samples=3, warmup=1, enter={"c": switched})
    # warmups in order, then rounds a b c / b c a / c a b (each bracket: one call, then 2 timed)
    assert log == ["a", "b", "c"] + [x for name in "abcbcacab" for x in [name] * 3]
    assert knob == ["in", "out"] * 4
    # brackets 0-8 in that order: a 10, 15, 17 ms; b 11, 13, 18; c 12, 14, 16
    assert got == {"a": pytest.approx(0.015), "b": pytest.approx(0.013), "c": pytest.approx(0.014)}


def test_end_to_end_row_times_every_contender_together_with_its_knob(monkeypatch):
    """bench/ozaki_passes.end_to_end_row on the host backend (64³): one interleaved timing of
    CuPy's product, each residue kernel (its RESIDUES_DEFAULT set while it runs) and the int32
    planes (the planner's DIGITS off while it runs), every knob put back; the ratios and the
    digit store's speedup from that one timing."""
    from bench import ozaki_passes as op
    from pyblasgemm.kernels import ozaki_kernels as ok
    from pyblasgemm.planner import composite as planned

    rng = np.random.default_rng(3)
    monkeypatch.setattr(op, "_operands", lambda cp, size, dtype, seed: (
        rng.standard_normal(size * size), rng.standard_normal(size * size), None))
    seen = {}

    def fake_interleaved(fns, inner, samples, enter):
        for name, fn in fns.items():
            with enter.get(name, contextlib.nullcontext)():
                seen[name] = (ok.RESIDUES_DEFAULT, planned.DIGITS)
                fn()
        return {name: 1e-3 * (2 if "int32" in name else 1) for name in fns}

    monkeypatch.setattr(op, "interleaved_median_s", fake_interleaved)
    cp = types.SimpleNamespace(matmul=np.matmul, array_equal=np.array_equal)
    before = (ok.RESIDUES_DEFAULT, planned.DIGITS)
    row = op.end_to_end_row(cp, _fake_pb(), 64)
    assert (ok.RESIDUES_DEFAULT, planned.DIGITS) == before
    names = [n for n in seen if "residues" in n]
    assert [seen[n][0] for n in names] == list(ok.RESIDUE_KERNELS) and all(seen[n][1] == before[1] for n in names)
    assert seen["pyblasgemm int8-ozaki (default), int32 planes"] == (before[0], False)
    assert row["digit_store_speedup"] == 2.0 and row["ratio_vs_native"]["int32 planes"] == 0.5
    assert row["bits_equal_across_kernels"] and set(row["ratio_vs_dgemm"]) == {*ok.RESIDUE_KERNELS, "int32 planes"}


def test_sustained_clock_parses_nvidia_smi_and_drops_the_ramp():
    """bench/sustained_clock.py's two host-side pieces (its doctests: a line of nvidia-smi's
    CSV, and the samples' summary without the first RAMP_S seconds), so its device run reads
    the clock right the first time."""
    import doctest

    from bench import sustained_clock

    result = doctest.testmod(sustained_clock)
    assert result.attempted >= 5 and result.failed == 0
    assert sustained_clock.parse_line("1980, 100.0, 700.0, 40", 0.0) is None     # a field missing
    assert sustained_clock.summarize([], 0.0) == {"samples": 0, "reasons": []}
