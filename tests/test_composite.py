"""The composite routes on the host: the compute modes they add, their plans (for an H100,
without a GPU), the host backend's arithmetic for them, and the GPU passes' compile."""
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.kinds import ROUTES, route_of
from pyblasgemm.planner import FAMILIES, make_desc, plan_for

H100 = FAMILIES["sm_90"]


def test_the_dial_is_part_of_the_mode_and_checked():
    assert route_of("d", "int8-ozaki-40") is ROUTES[("d", "int8-ozaki")]
    a = np.ones((2, 3))
    for bad in ("int8-ozaki-0", "int8-ozaki-63", "int8-ozaki-x", "int8-ozaki-"):
        with pytest.raises(ValueError, match="int8-ozaki-<bits>"):
            pyblasgemm.matmul(a, a.T, compute=bad)
    # float32 and complex64 have the mode (issue 34 item 2); 16-bit types do not
    assert route_of("s", "int8-ozaki-20") is ROUTES[("s", "int8-ozaki")]
    with pytest.raises(ValueError, match="compute='int8-ozaki' is not available for float16"):
        pyblasgemm.matmul(a.astype(np.float16), a.T.astype(np.float16), compute="int8-ozaki")


@pytest.mark.parametrize("dtype,compute", [("float64", "int8-ozaki"), ("complex128", "int8-ozaki"),
                                           ("complex64", "3xtf32")])
def test_large_products_plan_the_composition_and_explain_it(dtype, compute):
    p = plan_for(make_desc(8192, 8192, 8192, dtype, compute=compute), arch=H100)
    text = p.explain()
    assert p.backend == "tensorcore" and p.decomposition in ("ozaki", "complex"), text
    assert "composite:" in text and "inner GEMM" in text and "predicted" in text


def test_small_products_plan_native_and_say_why():
    p = plan_for(make_desc(64, 64, 64, "float64", compute="int8-ozaki"), arch=H100)
    assert p.backend == "cublas" and p.reason.startswith("native DGEMM predicted faster")
    forced = plan_for(make_desc(64, 64, 64, "float64", compute="int8-ozaki"), "tensorcore", arch=H100)
    assert forced.backend == "tensorcore" and forced.source == "forced"
    theirs = plan_for(make_desc(8192, 8192, 8192, "float64", compute="int8-ozaki"), "cublas", arch=H100)
    assert theirs.backend == "cublas" and "native DGEMM" in theirs.reason


def test_k_beyond_int32_exactness_runs_natively():
    long_k = plan_for(make_desc(64, 64, 2**17, "float64", compute="int8-ozaki"), arch=H100)
    assert long_k.backend == "cublas" and "exact in int32" in long_k.reason
    with pytest.raises(NotImplementedError, match="exact in int32"):
        plan_for(make_desc(64, 64, 2**17, "float64", compute="int8-ozaki"), "tensorcore", arch=H100)


def test_host_ozaki_is_the_ozaki_module_and_honours_the_dial():
    from pyblasgemm import ozaki

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((9, 70)), rng.standard_normal((70, 5))
    for compute, bits in (("int8-ozaki", None), ("int8-ozaki-30", 30)):
        got = pyblasgemm.matmul(a, b, compute=compute)
        np.testing.assert_array_equal(got, ozaki.dgemm_ozaki(a, b, bits=bits)[0])
    z = a[:, :35] + 1j * a[:, 35:]
    w = b[:35] - 2j * b[35:]
    np.testing.assert_array_equal(pyblasgemm.matmul(z, w, compute="int8-ozaki"), ozaki.zgemm_ozaki(z, w)[0])


@pytest.mark.parametrize("compute,rtol", [("tf32", 3e-3), ("3xtf32", 2e-5)])
def test_host_complex_on_tensor_core_arithmetic(compute, rtol):
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((7, 40)) + 1j * rng.standard_normal((7, 40))).astype(np.complex64)
    b = (rng.standard_normal((40, 6)) + 1j * rng.standard_normal((40, 6))).astype(np.complex64)
    got = pyblasgemm.matmul(a, b, compute=compute)
    ref = a.astype(np.complex128) @ b.astype(np.complex128)
    scale = np.abs(a) @ np.abs(b)
    assert got.dtype == np.complex64 and np.all(np.abs(got - ref) <= rtol * scale)
    if compute == "tf32":      # tf32 rounds the operands: measurably worse than float32
        assert np.max(np.abs(got - ref) / scale) > 1e-5


def test_gpu_tables_are_the_ozaki_modules():
    from pyblasgemm import ozaki
    from pyblasgemm.kernels.ozaki_kernels import table_values, tables_source

    t = table_values(16)
    crt = ozaki.crt_tables(16)
    assert t["kOzMod"] == list(ozaki.MODULI[:16]) and t["kOzCrtY"] == crt["y"]
    assert t["kOzCrtM"] == [list(c) for c in crt["m"]] and t["kOzCrtP"] == list(crt["p"])
    for p, magic in zip(t["kOzMod"], t["kOzMagic"]):       # exact quotients below 2^30
        for x in (0, p - 1, p, 2**30 - 1, 2**30 - 1 - (2**30 - 1) % p):
            assert (x * magic) >> 38 == x // p
    src = tables_source(16)
    assert "constexpr int kOzChunks = 4;" in src and repr(crt["inv_p"]) in src


@pytest.mark.parametrize("count,element", [(1, "double"), (16, "double"), (34, "double"), (7, "float"),
                                           (9, "float"), (34, "float")])
def test_ozaki_kernels_compile_spill_free(count, element):
    pytest.importorskip("cupy")
    from pyblasgemm.kernels import jit
    from pyblasgemm.kernels.ozaki_kernels import compile_offline, kernel_names, one_pass_names

    for arch in ("sm_80", "sm_90a"):
        _, log = compile_offline(count, arch, element)
        if "ptxas" not in log:      # NVRTC 13.0 (the H100 machine's) leaves ptxas's report out
            from cupy.cuda import nvrtc
            pytest.skip(f"NVRTC {nvrtc.getVersion()} puts no ptxas report in the program log "
                        f"(CI's NVRTC 13.5 does)")
        res = jit.ptxas_resources(log)
        assert len(res) == len(kernel_names(count, element) + one_pass_names(count, element, arch)), res
        for name, r in res.items():
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (arch, name, r)


def test_precision_guide_quotes_the_measured_table():
    """The guide's table and figure are bench/ozaki.py's guide_table and plot of the committed
    guide run (one H200, interleaved timing, cuBLAS's emulation in the same run)."""
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from bench.ozaki import guide_table

    files = [root / "bench/results/ozaki_h200_2026-11-29_082ba57.json"]
    text = (root / "docs/guide/precision.rst").read_text()
    assert guide_table(files) in text
    assert "ozaki_bits_2026-11-29.png" in text and (root / "docs/_static/perf/ozaki_bits_2026-11-29.png").exists()


def test_readme_and_guide_quote_the_guide_run():
    """The README's and the precision guide's 8192³ float64 numbers (the default with its guard,
    40 bits, cuBLAS's own emulation, graded data) are the guide run's,
    bench/results/ozaki_h200_2026-11-29_082ba57.json."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    doc = json.loads((root / "bench/results/ozaki_h200_2026-11-29_082ba57.json").read_text())
    assert doc["device"]["name"] == "NVIDIA H200" and doc["git_sha"] == "082ba57"
    rows = {(c["case"], c.get("layout"), c["m"]): c["contenders"] for c in doc["cases"]}
    d8 = rows[("dgemm", "normal", 8192)]
    dflt, forty = d8["pyblasgemm int8-ozaki (default)"], d8["pyblasgemm int8-ozaki-40"]
    assert "one for the guard" in dflt["route"]
    emulation = [v["steady_s"] / dflt["steady_s"] for n, v in d8.items() if n.startswith("cuBLAS emulation")]
    readme = " ".join((root / "README.md").read_text().split())
    guide = " ".join((root / "docs/guide/precision.rst").read_text().split())
    said = (f"runs {dflt['ratio_steady_vs_native']:.2f}x native DGEMM at 8192³ "
            f"({forty['ratio_steady_vs_native']:.2f}x at 40 bits), {min(emulation):.1f}x faster than "
            "cuBLAS's own emulation")
    assert said in readme, said
    assert f"the default here is {min(emulation):.1f}-{max(emulation):.1f}x faster" in guide
    assert f"40 bits run {forty['ratio_steady_vs_native']:.2f}x native DGEMM" in guide
    graded = rows[("dgemm", "graded 2^-30", 8192)]
    ours = graded["pyblasgemm int8-ozaki (default)"]
    native = min(v["max_rel_err_vs_longdouble"] for v in graded.values() if v["side"] == "native")
    assert ours["max_rel_err_vs_longdouble"] <= native        # the guarantee, on the GPU
    assert f"then native: {ours['ratio_steady_vs_native']:.2f}x, native's error" in guide


def test_readme_quotes_complex_tf32_against_both_cublas_yardsticks():
    """The README's complex64 tf32 ranges are the e859705 runs' ratios against cuBLAS's full
    CGEMM and against its own TF32 CGEMM (issue 34: say both)."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    full, tf32 = [], []
    for gpu in ("h100", "h200"):
        doc = json.loads((root / f"bench/results/ozaki_{gpu}_2026-11-25_e859705.json").read_text())
        ct = next(c for c in doc["cases"] if c["case"] == "cgemm")["contenders"]
        ours = ct["pyblasgemm tf32"]
        full.append(ours["ratio_steady_vs_cgemm"])
        tf32.append(ct["cuBLAS TF32 CGEMM"]["steady_s"] / ours["steady_s"])
    readme = " ".join((root / "README.md").read_text().split())
    assert f"runs {min(full):.1f}-{max(full):.1f}x cuBLAS's full-precision CGEMM" in readme
    assert f"{min(tf32):.1f}-{max(tf32):.1f}x its TF32 CGEMM" in readme


def test_readme_quotes_the_closing_run():
    """The README's (and the precision guide's) 16384³ float64, float32-from-int8 and int8
    numbers are bench/results/ozaki_closing_h200_2026-11-29_082ba57.json's (issue 34's closing
    groups)."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    doc = json.loads((root / "bench/results/ozaki_closing_h200_2026-11-29_082ba57.json").read_text())
    assert doc["device"]["name"] == "NVIDIA H200" and doc["git_sha"] == "082ba57"

    def row(case, m):
        return next(c for c in doc["cases"] if c["case"] == case and c["m"] == m)["contenders"]

    readme = " ".join((root / "README.md").read_text().split())
    d16 = row("dgemm", 16384)
    assert (f"At 16384³ the default runs {d16['pyblasgemm int8-ozaki (default)']['ratio_steady_vs_native']:.2f}x "
            f"native DGEMM and 40 bits {d16['pyblasgemm int8-ozaki-40']['ratio_steady_vs_native']:.2f}x") in readme
    s8, s16 = row("sgemm", 8192), row("sgemm", 16384)
    ours8 = s8["pyblasgemm int8-ozaki (default)"]
    assert ours8["err_over_sgemm"] <= 1 and s16["pyblasgemm int8-ozaki (default)"]["err_over_sgemm"] <= 1
    assert (f"runs {ours8['ratio_steady_vs_native']:.2f}x SGEMM at 8192³ "
            f"({s16['pyblasgemm int8-ozaki (default)']['ratio_steady_vs_native']:.2f}x at 16384³; "
            f"3xTF32 {s8['pyblasgemm 3xtf32']['ratio_steady_vs_native']:.2f}x) with "
            f"{ours8['err_over_sgemm']:.3f}x SGEMM's error") in readme
    guide = " ".join((root / "docs/guide/precision.rst").read_text().split())
    assert (f"the default ran {ours8['ratio_steady_vs_native']:.2f}x cuBLAS SGEMM at 8192³ and "
            f"{s16['pyblasgemm int8-ozaki (default)']['ratio_steady_vs_native']:.2f}x at 16384³, with "
            f"{ours8['err_over_sgemm']:.3f}x and {s16['pyblasgemm int8-ozaki (default)']['err_over_sgemm']:.3f}x "
            f"SGEMM's largest error") in guide
    assert (f"at 16384³ the default ran {d16['pyblasgemm int8-ozaki (default)']['ratio_steady_vs_native']:.2f}x "
            f"native DGEMM and 40 bits {d16['pyblasgemm int8-ozaki-40']['ratio_steady_vs_native']:.2f}x") in guide
    i8 = row("igemm", 8192)
    ours, theirs = i8["pyblasgemm.igemm (planned)"], i8["torch._int_mm (cuBLASLt)"]
    assert ours["same_bits_as_int_mm"]
    assert (f"int8 reaches {ours['TOPS_steady']:,.0f} TOPS at 8192³, "
            f"{theirs['steady_s'] / ours['steady_s']:.2f}x `torch._int_mm`") in readme


def test_guide_quotes_the_int8_profile_and_the_sustained_clock():
    """The precision guide's int8 ceiling (issue 34's 1,500 TOPS target): the Nsight Compute
    profile of our kernel and the sustained-clock probe, as the committed files hold them."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    ncu = json.loads((root / "bench/results/ncu_int8_h200_2026-11-29_082ba57.json").read_text())
    clock = json.loads((root / "bench/results/sustained_clock_h200_2026-11-29_60cb555.json").read_text())
    assert ncu["device"]["name"] == clock["device"]["name"] == "NVIDIA H200"
    guide = " ".join((root / "docs/guide/precision.rst").read_text().split())
    sol = ncu["sections"]["GPU Speed Of Light Throughput"]
    assert (f"at {ncu['derived']['TOPS_in_profile']:,.0f} TOPS in one launch at {sol['SM Frequency [Ghz]']:.2f} GHz: "
            f"{ncu['derived']['fraction_of_dense_int8_peak_per_cycle']:.0%} of the dense int8 peak") in guide
    ours, theirs = clock["cases"]["int8 ours"], clock["cases"]["int8 cuBLAS"]
    assert ours["reasons"] == ["0x4"] and ours["power.limit"]["median"] == 700.0     # the software power cap
    assert (f"it ran {ours['tera_ops_per_s']:,.0f} TOPS with the SM clock at a median "
            f"{ours['clocks.sm']['median']:,.0f} MHz, the board drawing {ours['power.draw']['median']:.0f} W") in guide
    assert (f"cuBLAS's int8 GEMM ran {theirs['tera_ops_per_s']:,.0f} TOPS at {theirs['clocks.sm']['median']:,.0f} MHz"
            in guide)
    peak = 8192 * clock["device"]["sm_count"] * ours["clocks.sm"]["median"] * 1e6 / 1e12
    assert f"At {ours['clocks.sm']['median']:,.0f} MHz the dense int8 peak is {peak:,.0f} TOPS" in guide
    assert f"would need {1500 / peak:.0%} of it" in guide


def test_ozaki_planes_rows_are_whole_16_byte_lines_so_the_moduli_gemm_never_packs(monkeypatch):
    """k = 1000 (and complex's stacked 2k = 2000, already whole): the planes' rows are rounded
    up to planner.composite.PLANE_ROW, so the moduli GEMM's operands are TMA-aligned as they lie
    (no packed copy of 17 planes) and, on sm_90 with a digit tile, the digit store runs."""
    from pyblasgemm.ozaki import setting
    from pyblasgemm.planner import composite as planned

    for dtype, k, row in (("float64", 1000, 1008), ("float32", 1001, 1008), ("complex128", 1000, 2000),
                          ("float64", 1024, 1024), ("float64", 1, 16)):
        inner = planned.inner_problem(make_desc(520, 264, k, dtype, compute="int8-ozaki"), setting(k))
        assert (inner.k, inner.lda, inner.ldb) == (row, row, row), (dtype, k)
    monkeypatch.setenv("PYBLASGEMM_CONFIG", "sm90a_sliced_128x128x128_w2x1_s6_g8")
    pyblasgemm.clear_plan_cache()
    try:
        spec = plan_for(make_desc(520, 264, 1000, "float64", compute="int8-ozaki"), "tensorcore",
                        arch=FAMILIES["sm_90"]).launch
    finally:
        monkeypatch.delenv("PYBLASGEMM_CONFIG")
        pyblasgemm.clear_plan_cache()
    assert spec.inner_plan.pack == () and spec.digits is not None
