"""The CUDA bindings the package calls (issue 35): NVIDIA's public ``cuda.bindings`` for every
driver call and for NVRTC, cuda-pathfinder to find the libraries, nvmath-python's (else ctypes')
cuBLASLt and cuBLAS, and no CuPy internals (``cupy_backends``) anywhere in the package.

Host tests run everywhere (those that need cuda-bindings, cuda-pathfinder or a CUDA header skip
where the venv has none: the host-only install); GPU tests (marked ``gpu``) launch, zero, copy,
query occupancy and capture state, encode TMA maps, and run the cuBLAS route through each binding.
"""
from __future__ import annotations

import ast
import ctypes as ct
import enum
import logging
import re
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.backends import cublas, cublaslt
from pyblasgemm.kernels import driver

PACKAGE = Path(pyblasgemm.__file__).resolve().parent
gpu = pytest.mark.gpu


# ---- no CuPy internals, no hand-found libraries ---------------------------------------------

#: CuPy's modules that are cupy_backends' under another name (cupy.cuda.nvrtc is
#: cupy_backends.cuda.libs.nvrtc): the public bindings replace them too
_CUPY_INTERNAL_ATTRS = {"nvrtc", "cublas", "driver"}


def _violations(source: str, name: str) -> list[str]:
    """What in ``source`` reaches CuPy's internals or loads a CUDA library by hand."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "cupy_backends" or (
                        alias.name.startswith("cupy.cuda.") and alias.name.split(".")[2] in _CUPY_INTERNAL_ATTRS):
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] == "cupy_backends":
                found.append(f"{where}: from {node.module} import ...")
            elif node.module == "cupy.cuda" and {a.name for a in node.names} & _CUPY_INTERNAL_ATTRS:
                found.append(f"{where}: from cupy.cuda import {[a.name for a in node.names]}")
        elif isinstance(node, ast.Attribute) and node.attr in _CUPY_INTERNAL_ATTRS \
                and isinstance(node.value, ast.Attribute) and node.value.attr == "cuda":
            found.append(f"{where}: .cuda.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                "cupy_backends" in node.value or "/proc/self/maps" in node.value):
            found.append(f"{where}: the string {node.value!r}")
        elif isinstance(node, ast.Call):
            fn = node.func
            callee = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if callee in ("CDLL", "PyDLL", "LoadLibrary") and node.args and isinstance(
                    node.args[0], (ast.Constant, ast.JoinedStr)):
                found.append(f"{where}: {callee} of a library named in the code (cuda-pathfinder finds them)")
    return found


def test_the_checker_sees_each_kind_of_violation():
    """The package test below can fail: every form it looks for is caught in a sample."""
    sample = ("from cupy_backends.cuda.api import driver\nimport cupy_backends.cuda.libs.cublas\n"
              "from cupy.cuda import nvrtc\nv = cupy.cuda.cublas.getVersion(h)\n"
              "import importlib; importlib.import_module('cupy_backends.cuda.api.runtime')\n"
              "open('/proc/self/maps')\nlib = ctypes.CDLL('libcuda.so.1')\nlib = ct.CDLL(f'libnvrtc.so.{v}')\n"
              "ok = ctypes.CDLL(path); from cupy.cuda import runtime, get_current_stream\n")
    found = _violations(sample, "sample.py")
    assert sorted(int(f.split(":")[1]) for f in found) == [1, 2, 3, 4, 5, 6, 7, 8], found


def test_no_module_reaches_cupy_internals_or_loads_a_library_by_name():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50 and PACKAGE / "kernels" / "driver.py" in files
    found = [v for f in files for v in _violations(f.read_text(), str(f.relative_to(PACKAGE.parent)))]
    assert found == []


# ---- cuBLASLt's values: the fallback's copies against cublasLt.h and nvmath ------------------

def _cublaslt_header() -> str:
    pathfinder = pytest.importorskip("cuda.pathfinder")
    folder = pathfinder.find_nvidia_header_directory("cublas")
    if folder is None or not (Path(folder) / "cublasLt.h").is_file():
        pytest.skip("no cublasLt.h here (the nvidia-cublas wheel or a CUDA toolkit brings one)")
    return (Path(folder) / "cublasLt.h").read_text()


def _enum(header: str, prefix: str) -> dict:
    """{name less ``prefix``: value} of an enum's members, those written from earlier members
    (``CUBLASLT_EPILOGUE_GELU_AUX = (CUBLASLT_EPILOGUE_GELU | 128)``) included."""
    values: dict = {}
    for m in re.finditer(rf"^\s*{prefix}(\w+)\s*=\s*([^,\n]+),", header, re.M):
        expr = re.sub(rf"\b{prefix}(\w+)", lambda n: str(values.get(n.group(1), "?")), m.group(2))
        if re.fullmatch(r"[\d\s|()<]+", expr):        # digits, |, << and parentheses only
            values[m.group(1)] = eval(expr)
    return values


def test_the_fallback_values_are_cublasLt_h_s():
    header = _cublaslt_header()
    tables = {"CUBLASLT_MATMUL_DESC_": cublaslt.DESC_ATTR, "CUBLASLT_MATRIX_LAYOUT_": cublaslt.LAYOUT_ATTR,
              "CUBLASLT_MATMUL_PREF_": cublaslt.PREF_ATTR, "CUBLASLT_EPILOGUE_": cublaslt.EPILOGUE}
    for prefix, table in tables.items():
        values = _enum(header, prefix)
        assert {k: values.get(k) for k in table} == table, prefix
    epi = _enum(header, "CUBLASLT_EPILOGUE_")
    assert cublaslt._BIAS_BIT == epi["BIAS"] and cublaslt._AUX_BIT == epi["GELU_AUX"] - epi["GELU"]
    assert set(cublaslt.LT_EPILOGUES.values()) <= set(cublaslt.EPILOGUE.values())
    # the heuristic result: the 64-byte algorithm, then workspaceSize, state, wavesCount, reserved[4]
    body = re.search(r"typedef struct \{([^}]*)\}\s*cublasLtMatmulHeuristicResult_t", header).group(1)
    fields = re.findall(r"^\s*(\w+)\s+(\w+)(\[\d+\])?;", body, re.M)
    assert [(t, n) for t, n, _ in fields] == [("cublasLtMatmulAlgo_t", "algo"), ("size_t", "workspaceSize"),
                                             ("cublasStatus_t", "state"), ("float", "wavesCount"),
                                             ("int", "reserved")]
    assert re.search(r"typedef struct \{\s*uint64_t data\[8\];\s*\}\s*cublasLtMatmulAlgo_t", header)
    layout = [(n, getattr(cublaslt._HeuristicResult, n).offset) for n, _ in cublaslt._HeuristicResult._fields_]
    assert layout == [("algo", 0), ("workspace_size", 64), ("state", 72), ("waves", 76), ("reserved", 80)]
    assert ct.sizeof(cublaslt._HeuristicResult) == 96


def test_the_fallback_values_are_nvmaths_where_it_is_installed():
    try:
        import nvmath.bindings.cublasLt as lt
    except ImportError:
        pytest.skip("nvmath-python is not installed (the header test above checks the values)")
    assert cublaslt.DESC_ATTR == {k: int(getattr(lt.MatmulDescAttribute, k)) for k in cublaslt.DESC_ATTR}
    assert cublaslt.LAYOUT_ATTR == {k: int(getattr(lt.MatrixLayoutAttribute, k)) for k in cublaslt.LAYOUT_ATTR}
    assert cublaslt.PREF_ATTR == {k: int(getattr(lt.MatmulPreferenceAttribute, k)) for k in cublaslt.PREF_ATTR}
    assert cublaslt.EPILOGUE == {k: int(getattr(lt.Epilogue, k)) for k in cublaslt.EPILOGUE}
    dt = lt.matmul_heuristic_result_dtype
    assert dt.itemsize == ct.sizeof(cublaslt._HeuristicResult)
    assert [dt.fields[n][1] for n in ("algo", "workspace_size", "state", "waves_count", "reserved")] == \
        [0, 64, 72, 76, 80]


def test_the_tma_element_types_are_the_bindings():
    cu = pytest.importorskip("cuda.bindings.driver")
    from pyblasgemm import kinds

    for name, value in kinds._TMA.items():
        assert int(getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{name}")) == value, name


# ---- which cuBLASLt binding, and what happens without one ------------------------------------

@pytest.fixture
def fresh_binding():
    """cublaslt's loaded binding forgotten before and after the test."""
    cublaslt.use_binding("auto")
    yield
    cublaslt.use_binding("auto")


def _desc(m=64, n=48, k=40, dtype="float16"):
    return pyblasgemm.plan(m, n, k, dtype, backend="cublas").problem


class _FakeLt:
    """A stand-in for nvmath.bindings.cublasLt: its own enum values (100 above cublasLt.h's, so
    a launch that used the fallback's would show), its own result struct, calls recorded."""

    class cuBLASLtError(Exception):
        def __init__(self, status):
            super().__init__(f"cuBLAS status {status}")
            self.status = status

    def __init__(self, matmul_status=0):
        def shifted(name, table):
            return type(name, (), {k: v + 100 for k, v in table.items()})
        self.MatmulDescAttribute = shifted("MatmulDescAttribute", cublaslt.DESC_ATTR)
        self.MatrixLayoutAttribute = shifted("MatrixLayoutAttribute", cublaslt.LAYOUT_ATTR)
        self.MatmulPreferenceAttribute = shifted("MatmulPreferenceAttribute", cublaslt.PREF_ATTR)
        self.calls, self.results, self.matmul_status = [], [], matmul_status
        fake = self

        class MatmulHeuristicResult:
            def __init__(self):
                self.buf = (ct.c_uint64 * 12)()
                self.ptr = ct.addressof(self.buf)
                self.workspace_size = 0
                fake.results.append(self)
        self.MatmulHeuristicResult = MatmulHeuristicResult
        for name in ("matmul_desc_set_attribute", "matrix_layout_set_attribute", "matmul_preference_set_attribute",
                     "matmul_desc_destroy", "matrix_layout_destroy", "matmul_preference_destroy"):
            setattr(self, name, self._recorder(name))

    def _recorder(self, name):
        def call(*args):
            self.calls.append((name, args))
        call.__name__ = name
        return call

    def get_version(self):
        return 130100

    def create(self):
        return 0x1000

    def matmul_desc_create(self, compute, scale):
        self.calls.append(("matmul_desc_create", (compute, scale)))
        return 0x2000

    def matrix_layout_create(self, dtype, rows, cols, ld):
        self.calls.append(("matrix_layout_create", (dtype, rows, cols, ld)))
        return 0x3000 + sum(name == "matrix_layout_create" for name, _ in self.calls)

    def matmul_preference_create(self):
        return 0x4000

    def matmul_algo_get_heuristic(self, handle, desc, a, b, c, d, pref, count, results, counted):
        ct.c_int.from_address(counted).value = 1

    def matmul(self, *args):
        self.calls.append(("matmul", args))
        if self.matmul_status:
            raise self.cuBLASLtError(self.matmul_status)


def _install_fake_nvmath(monkeypatch, fake):
    bindings = types.ModuleType("nvmath.bindings")
    bindings.cublasLt = fake
    top = types.ModuleType("nvmath")
    top.bindings = bindings
    monkeypatch.setitem(sys.modules, "nvmath", top)
    monkeypatch.setitem(sys.modules, "nvmath.bindings", bindings)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublasLt", fake)


def test_with_nvmath_the_enums_and_the_result_struct_are_nvmaths(monkeypatch, fresh_binding):
    fake = _FakeLt()
    _install_fake_nvmath(monkeypatch, fake)
    assert cublaslt.status()["binding"] == "nvmath"
    launch = cublaslt.LtLaunch(_desc(), cublas._TYPES[("h", "fp32")], 0)
    desc_attrs = [args[1] for name, args in fake.calls if name == "matmul_desc_set_attribute"]
    assert desc_attrs == [cublaslt.DESC_ATTR["TRANSA"] + 100, cublaslt.DESC_ATTR["TRANSB"] + 100]
    pref_attrs = {args[1] for name, args in fake.calls if name == "matmul_preference_set_attribute"}
    assert pref_attrs == {v + 100 for v in cublaslt.PREF_ATTR.values()}
    assert len(fake.results) == 1                        # the heuristic's result is nvmath's struct
    launch(0x10000, 0x20000, 0x30000, 1.0, 0.0, 0x77)
    (name, args), = [c for c in fake.calls if c[0] == "matmul"]
    assert args[:4] == (0x1000, 0x2000, launch._one_zero[1], 0x10000)
    assert args[12:] == (fake.results[0].ptr, 0, 0, 0x77)    # algo, no workspace, the stream


def test_a_failed_nvmath_call_raises_with_the_status(monkeypatch, fresh_binding):
    fake = _FakeLt(matmul_status=7)
    _install_fake_nvmath(monkeypatch, fake)
    launch = cublaslt.LtLaunch(_desc(), cublas._TYPES[("h", "fp32")], 0)
    with pytest.raises(RuntimeError, match="cuBLAS status 7"):
        launch(0x10000, 0x20000, 0x30000, 2.0, 1.0, 0)


def test_without_nvmath_cublaslt_is_the_library_cuda_pathfinder_loads(monkeypatch, fresh_binding):
    pathfinder = pytest.importorskip("cuda.pathfinder")
    try:
        path = pathfinder.load_nvidia_dynamic_lib("cublasLt").abs_path
    except Exception as e:
        pytest.skip(f"no libcublasLt here ({e})")
    monkeypatch.setitem(sys.modules, "nvmath", None)        # import nvmath fails
    st = cublaslt.status()
    assert st["binding"] == "ctypes" and st["library"] == path and st["route"] == "cublasLt"
    assert st["version"] >= 120000 and cublaslt.version() == st["version"]


def test_a_missing_cublaslt_warns_once_logs_and_reports_the_gemmex_route(monkeypatch, caplog, fresh_binding):
    def missing():
        raise cublaslt.LtUnavailable("no libcublasLt in this test")
    monkeypatch.setattr(cublaslt, "_LOADERS", {"nvmath": lambda: None, "ctypes": missing})
    cublaslt.use_binding("auto")
    desc = _desc()
    with caplog.at_level(logging.WARNING, logger="pyblasgemm"), \
            pytest.warns(cublaslt.CublasLtWarning, match="runs cublasGemmEx instead") as caught:
        assert cublas.bind(desc) is None                   # the caller takes the GemmEx route
    assert "no libcublasLt in this test" in str(caught[0].message)
    assert "nvmath: not installed" in str(caught[0].message)
    assert [r.levelno for r in caplog.records if "cuBLASLt could not be loaded" in r.getMessage()] == [logging.WARNING]
    with warnings.catch_warnings():
        warnings.simplefilter("error", cublaslt.CublasLtWarning)    # once per process, not per call
        assert cublas.bind(desc) is None
        st = cublaslt.status()
    assert st == {"binding": None, "library": None, "version": None, "route": "cublasGemmEx",
                  "error": "nvmath: not installed; ctypes: no libcublasLt in this test"}
    from pyblasgemm.__main__ import info_dict

    doc = info_dict()
    assert doc["cublas_route"] in (None, st)                # None: no CuPy in this venv


def test_use_binding_refuses_an_unknown_name():
    with pytest.raises(ValueError, match=r"name='cffi' is not 'auto' or one of \('nvmath', 'ctypes'\)"):
        cublaslt.use_binding("cffi")


# ---- the driver layer, with and without cuda-bindings ---------------------------------------

class _Res(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_INVALID_CONTEXT = 201


class _FakeDriver:
    """cuda.bindings.driver's calls the launch path makes, every call recorded: launches and
    memsets answer ``error`` until a context is made current (for ever with ``always``)."""

    def __init__(self, ctx=0, error=_Res.CUDA_ERROR_INVALID_CONTEXT, always=False):
        self.ctx, self.error, self.always, self.calls = ctx, error, always, []

    def _enqueue(self, name):
        self.calls.append(name)
        fixed = self.error == _Res.CUDA_ERROR_INVALID_CONTEXT and self.ctx and not self.always
        return (_Res.CUDA_SUCCESS if fixed else self.error,)

    def cuLaunchKernel(self, *args):
        return self._enqueue("cuLaunchKernel")

    def cuMemsetD32Async(self, *args):
        return self._enqueue("cuMemsetD32Async")

    def cuCtxGetCurrent(self):
        self.calls.append("cuCtxGetCurrent")
        return _Res.CUDA_SUCCESS, self.ctx

    def cuDeviceGet(self, ordinal):
        self.calls.append(f"cuDeviceGet({ordinal})")
        return _Res.CUDA_SUCCESS, ordinal

    def cuDevicePrimaryCtxRetain(self, dev):
        self.calls.append("cuDevicePrimaryCtxRetain")
        return _Res.CUDA_SUCCESS, 0x77

    def cuCtxSetCurrent(self, ctx):
        self.calls.append("cuCtxSetCurrent")
        self.ctx = ctx
        return (_Res.CUDA_SUCCESS,)


_LAUNCH = (0, "fn", 1, 1, 1, 128, 1, 1, 0, "stream", 0x1000)


@pytest.mark.parametrize("call", ["launch_kernel", "memset_words_async"])
def test_a_thread_without_a_context_gets_the_primary_one_and_calls_again(monkeypatch, call):
    fake = _FakeDriver()
    monkeypatch.setattr(driver, "_CU", fake)
    args = (3,) + _LAUNCH[1:] if call == "launch_kernel" else (3, "ptr", 4, "stream")
    getattr(driver, call)(*args)
    name = "cuLaunchKernel" if call == "launch_kernel" else "cuMemsetD32Async"
    assert fake.calls == [name, "cuCtxGetCurrent", "cuDeviceGet(3)", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                          name]
    assert fake.ctx == 0x77


def test_a_launch_refused_for_another_reason_raises_with_the_driver_s_name(monkeypatch):
    fake = _FakeDriver(ctx=0x55, error=_Res.CUDA_ERROR_INVALID_VALUE)
    monkeypatch.setattr(driver, "_CU", fake)
    with pytest.raises(driver.CudaDriverError, match=r"cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE \(1\)") as e:
        driver.launch_kernel(*_LAUNCH)
    assert e.value.status == 1 and fake.calls == ["cuLaunchKernel"]       # not launched twice


def test_invalid_context_on_a_thread_that_has_one_is_not_retried(monkeypatch):
    fake = _FakeDriver(ctx=0x55, always=True)
    monkeypatch.setattr(driver, "_CU", fake)
    with pytest.raises(driver.CudaDriverError, match=r"CUDA_ERROR_INVALID_CONTEXT \(201\)"):
        driver.launch_kernel(*_LAUNCH)
    assert fake.calls == ["cuLaunchKernel", "cuCtxGetCurrent"]


def test_check_returns_the_values_after_the_status():
    assert driver.check((_Res.CUDA_SUCCESS,), "f") is None
    assert driver.check((_Res.CUDA_SUCCESS, 5), "f") == 5
    assert driver.check((_Res.CUDA_SUCCESS, 5, 6), "f") == (5, 6)
    with pytest.raises(driver.CudaDriverError, match=r"^f failed: CUDA_ERROR_INVALID_VALUE \(1\)$"):
        driver.check((_Res.CUDA_ERROR_INVALID_VALUE, 0), "f")


def test_without_cuda_bindings_the_gpu_path_says_what_to_install(monkeypatch, patch_this_thread):
    monkeypatch.setattr(driver, "_CU", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(driver.BindingsMissing, match=r"cuda-bindings.*pip install 'pyblasgemm\[cuda13\]'"):
        driver.bindings()
    assert issubclass(driver.BindingsMissing, ImportError)
    from pyblasgemm.kernels import nvrtc

    # the module's loaded bindings stay: the compile checks use them in other threads meanwhile
    patch_this_thread(nvrtc, "_bindings", nvrtc._import_bindings)
    with pytest.raises(driver.BindingsMissing, match="cuda.bindings.nvrtc"):
        nvrtc.getVersion()


def test_stream_handles_are_made_once_and_the_cache_is_bounded(monkeypatch):
    pytest.importorskip("cuda.bindings.driver")
    assert driver.stream(7) is driver.stream(7) and int(driver.stream(7)) == 7
    monkeypatch.setattr(driver, "_STREAMS_MAX", 4)
    for h in range(100, 110):
        driver.stream(h)
    assert len(driver._STREAMS) <= 4 and int(driver.stream(109)) == 109


def test_the_cluster_launch_config_carries_grid_block_cluster_and_stream():
    pytest.importorskip("cuda.bindings.driver")
    from pyblasgemm.kernels.sm90 import _cluster_config

    cu = driver.bindings()
    cfg = _cluster_config(132, 200_000, 2, 384, driver.stream(0x5))
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == \
        (132, 1, 1, 384, 1, 1)
    assert cfg.sharedMemBytes == 200_000 and cfg.numAttrs == 1 and int(cfg.hStream) == 5
    attr, = cfg.attrs
    assert attr.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z) == (2, 1, 1)


# ---- NVRTC through cuda.bindings -------------------------------------------------------------

def _nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc")
    from pyblasgemm.kernels import nvrtc

    try:
        nvrtc.getVersion()
    except Exception as e:
        pytest.skip(f"no NVRTC library here ({e})")
    return nvrtc


def test_nvrtc_compiles_names_and_returns_the_whole_cubin():
    nvrtc = _nvrtc()
    nv = nvrtc._bindings()
    prog = nvrtc.createProgram("template <int N> __global__ void k(float* x) { x[threadIdx.x] = N; }", "k.cu")
    try:
        nvrtc.addNameExpression(prog, "k<7>")
        nvrtc.compileProgram(prog, ["--gpu-architecture=sm_90", "--ptxas-options=-v"])
        lowered = nvrtc.getLoweredName(prog, "k<7>")
        cubin = nvrtc.getCUBIN(prog)
        err, size = nv.nvrtcGetCUBINSize(prog)
        assert lowered == "_Z1kILi7EEvPf"
        assert cubin[:4] == b"\x7fELF" and len(cubin) == size      # every byte (CuPy 14.2 dropped one)
        from pyblasgemm.kernels import jit

        assert jit._get_cubin(prog) == cubin
        assert f"Compiling entry function '{lowered}' for 'sm_90'" in nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)
    prog = nvrtc.createProgram('extern "C" __global__ void k(float* x) { x[0] = 1; }', "k.cu")
    try:
        nvrtc.compileProgram(prog, ["--gpu-architecture=compute_90"])
        ptx = nvrtc.getPTX(prog)
        assert ptx.startswith(b"//") and b".visible .entry k(" in ptx and not ptx.endswith(b"\0")
    finally:
        nvrtc.destroyProgram(prog)


def test_nvrtc_errors_name_the_call_and_keep_the_log():
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram("this is not C++", "bad.cu")
    try:
        with pytest.raises(nvrtc.NvrtcError, match=r"nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION \(6\)"):
            nvrtc.compileProgram(prog, [])
        assert "bad.cu(1): error" in nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


# ---- packaging --------------------------------------------------------------------------------

def test_every_gpu_extra_brings_the_bindings_of_its_cuda_major():
    from test_packaging import PROJECT

    extras = PROJECT["optional-dependencies"]
    gpu_extras = {name for name, reqs in extras.items() for r in reqs if r.startswith("cupy-cuda")}
    assert gpu_extras == {"cuda13", "cuda12", "cuda13-lean", "cuda12-lean"}
    for name in gpu_extras:
        major = int(re.search(r"cupy-cuda(\d+)x", " ".join(extras[name])).group(1))
        bindings = [r for r in extras[name] if r.startswith("cuda-bindings")]
        assert bindings == [f"cuda-bindings>={major}.{0 if major == 13 else 8},<{major + 1}"], (name, bindings)
        assert "cuda-pathfinder>=1.1,<2" in extras[name], name
        # CUDA 13: nvmath-python's cuBLASLt binding, 1.3-2.3 us a call less than ctypes (H200 host,
        # bench/results/lt_host_cost_h200_2026-11-28_79032c2.json); CUDA 12 keeps it in the `nvmath` extra
        assert ("nvmath-python>=0.5,<2" in extras[name]) == (major == 13), name
    assert not [r for r in PROJECT["dependencies"] if r.startswith(("cuda-", "nvmath"))]   # host installs: none


# ---- on the GPU ---------------------------------------------------------------------------------

_FILL = r'''extern "C" __global__ void fill(int* x, int v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v + i;
}
extern "C" __global__ void big(int* x) {
    extern __shared__ int s[];
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    x[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}'''


@gpu
def test_launch_memset_occupancy_and_shared_memory_opt_in_on_the_device():
    import cupy

    dev = cupy.cuda.Device()
    mod = cupy.RawModule(code=_FILL)
    fill, big = mod.get_function("fill"), mod.get_function("big")
    s = cupy.cuda.Stream(non_blocking=True)
    n = 1000
    x = cupy.full(1024, -7, np.int32)                       # poisoned past n too
    cells = [ct.c_uint64(x.data.ptr), ct.c_int32(5), ct.c_int32(n)]
    params = (ct.c_void_p * 3)(*[ct.addressof(c) for c in cells])
    driver.launch_kernel(dev.id, driver.function(fill.kernel.ptr), 8, 1, 1, 128, 1, 1, 0, driver.stream(s.ptr),
                         ct.addressof(params))
    s.synchronize()
    want = np.full(1024, -7, np.int32)
    want[:n] = 5 + np.arange(n)
    np.testing.assert_array_equal(x.get(), want)
    driver.memset_words_async(dev.id, driver.device_pointer(x.data.ptr + 4 * 10), 300, driver.stream(s.ptr))
    s.synchronize()
    want[10:310] = 0
    np.testing.assert_array_equal(x.get(), want)
    per_sm = dev.attributes["MaxThreadsPerMultiProcessor"]
    blocks = dev.attributes["MaxBlocksPerMultiprocessor"]
    for threads in (128, 256, 1024):                         # a kernel of few registers, no shared memory
        assert driver.occupancy(fill.kernel.ptr, threads, 0) == min(blocks, per_sm // threads), threads
    # more than 48 KB of dynamic shared memory: refused without the opt-in, run with it
    smem = 100 * 1024
    out = cupy.zeros(256, np.int32)
    cell = ct.c_uint64(out.data.ptr)
    bparams = (ct.c_void_p * 1)(ct.addressof(cell))
    with pytest.raises(driver.CudaDriverError, match="cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE"):
        driver.launch_kernel(dev.id, driver.function(big.kernel.ptr), 1, 1, 1, 256, 1, 1, smem, driver.stream(s.ptr),
                             ct.addressof(bparams))
    driver.set_max_dynamic_shared_memory(big.kernel.ptr, smem)
    driver.launch_kernel(dev.id, driver.function(big.kernel.ptr), 1, 1, 1, 256, 1, 1, smem, driver.stream(s.ptr),
                         ct.addressof(bparams))
    s.synchronize()
    np.testing.assert_array_equal(out.get(), np.arange(256)[::-1])


@gpu
def test_capture_state_and_a_copy_from_pinned_memory():
    import cupy

    dev = cupy.cuda.Device().id
    s = cupy.cuda.Stream(non_blocking=True)
    assert driver.is_capturing(dev, s.ptr) is False
    s.begin_capture()
    try:
        assert driver.is_capturing(dev, s.ptr) is True
    finally:
        s.end_capture()
    assert driver.is_capturing(dev, s.ptr) is False
    host = cupy.cuda.alloc_pinned_memory(64 * 4)
    src = np.frombuffer(host, np.int32, 64)
    src[:] = np.arange(64) * 3
    dst = cupy.full(64, -1, np.int32)
    cupy.cuda.Device().synchronize()     # the fill ran on CuPy's stream, not s: done before the copy
    done = cupy.cuda.Event(block=False, disable_timing=True)
    driver.copy_to_device_async(dev, driver.device_pointer(dst.data.ptr), host.ptr, 64 * 4, driver.stream(s.ptr))
    driver.record_event(dev, done.ptr, driver.stream(s.ptr))
    done.synchronize()
    np.testing.assert_array_equal(dst.get(), np.arange(64) * 3)


@gpu
def test_tma_maps_encode_readdress_and_refuse_a_misaligned_pointer():
    import cupy

    if int(cupy.cuda.Device().compute_capability) < 90:
        pytest.skip("TMA tensor maps need a Hopper GPU (sm_90) or newer")
    from pyblasgemm.kernels.sm90 import encode_tiled

    a = cupy.zeros((256, 256), np.float16)
    tmap = encode_tiled("f16", a.data.ptr, (256, 256, 1), (512, 512 * 256), (64, 64, 1))
    raw = ct.string_at(tmap.getPtr(), 128)
    assert raw != bytes(128)
    cu = driver.bindings()
    driver.check(cu.cuTensorMapReplaceAddress(tmap, a.data.ptr + 256), "cuTensorMapReplaceAddress")
    assert ct.string_at(tmap.getPtr(), 128) != raw
    with pytest.raises(ValueError, match=r"cuTensorMapEncodeTiled failed \(CUDA_ERROR_INVALID_VALUE 1\)"):
        encode_tiled("f16", a.data.ptr + 2, (256, 256, 1), (512, 512 * 256), (64, 64, 1))


def _cublas_case(cupy, seed=3):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((67, 45)).astype(np.float16)     # odd sizes
    b = rng.standard_normal((45, 31)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return cupy.asarray(a), cupy.asarray(b), ref


@gpu
def test_the_cublas_route_runs_through_each_cublaslt_binding_that_loads(fresh_binding):
    import cupy

    a, b, ref = _cublas_case(cupy)
    got = {}
    for name in ("ctypes", "nvmath"):
        cublaslt.use_binding(name)
        if cublaslt.status()["binding"] != name:
            assert name == "nvmath", cublaslt.status()          # ctypes always loads on a GPU machine
            continue
        pyblasgemm.clear_plan_cache()
        z = pyblasgemm.matmul(a, b, backend="cublas")
        got[name] = cupy.asnumpy(z)
        np.testing.assert_allclose(got[name].astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    if len(got) == 2:
        np.testing.assert_array_equal(got["ctypes"], got["nvmath"])     # one library, one algorithm
    pyblasgemm.clear_plan_cache()


@gpu
def test_without_cublaslt_the_cublas_route_is_gemmex_and_says_so(monkeypatch, fresh_binding):
    import cupy

    def missing():
        raise cublaslt.LtUnavailable("hidden by the test")
    monkeypatch.setattr(cublaslt, "_LOADERS", {"ctypes": missing})
    cublaslt.use_binding("auto")
    pyblasgemm.clear_plan_cache()
    a, b, ref = _cublas_case(cupy, seed=4)
    with pytest.warns(cublaslt.CublasLtWarning, match="hidden by the test"):
        z = pyblasgemm.matmul(a, b, backend="cublas")
    np.testing.assert_allclose(cupy.asnumpy(z).astype(np.float64), ref, rtol=2e-2, atol=2e-2)
    # int8 in a layout cuBLAS's integer kernels refuse: rearranged copies, exact int32
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (37, 29)).astype(np.int8)
    y = rng.integers(-128, 128, (29, 23)).astype(np.int8)
    c = pyblasgemm.igemm("N", "N", 37, 23, 29, 1, cupy.asarray(x.T.ravel()), 37, cupy.asarray(y.T.ravel()), 29,
                         0, cupy.zeros(37 * 23, np.int32), 37, backend="cublas")
    want = (x.astype(np.int64) @ y.astype(np.int64)).astype(np.int32)
    np.testing.assert_array_equal(cupy.asnumpy(c).reshape(23, 37).T, want)
    assert cublaslt.status()["route"] == "cublasGemmEx"
    pyblasgemm.clear_plan_cache()


@gpu
def test_info_reports_the_bindings_and_the_cublaslt_route(fresh_binding):
    from pyblasgemm.__main__ import info_dict

    doc = info_dict()
    assert doc["versions"]["cuda_bindings"] and doc["versions"]["cuda_pathfinder"]
    assert doc["cublas_route"]["route"] == "cublasLt" and doc["cublas_route"]["binding"] in ("nvmath", "ctypes")


def _launcher_cases(hopper: bool):
    """(id, kind, accumulate, config, sm_count, ld multiple) of the bound launches whose driver
    calls differ: mma.sync with stream-k flags (a memset per call) and with a split-k reduce
    launch; on Hopper the TMA maps (re-pointed per call), a 2-CTA cluster launch
    (cuLaunchKernelEx), stream-k flags, and the fp32 prep kernel before the GEMM."""
    from dataclasses import replace

    from pyblasgemm.kernels.config import SHIPPED_CONFIGS, SM90_CONFIGS_BY_TILE

    base = SHIPPED_CONFIGS["f16"][0]
    cases = [("mma.sync-streamk", "f16", "f32", replace(base, decomposition="streamk"), 3, 1),
             ("mma.sync-splitk_parallel", "f16", "f32", replace(base, decomposition="splitk_parallel", splits=3),
              None, 1)]
    if hopper:
        h = SM90_CONFIGS_BY_TILE["f16"][128]
        cases += [("sm90-cluster2", "f16", "f32", replace(h, cluster=2), 4, 8),
                  ("sm90-streamk", "f16", "f32", replace(h, decomposition="streamk"), 3, 8),
                  ("sm90-tf32-prep", "tf32", "f32", SM90_CONFIGS_BY_TILE["tf32"][128], None, 1)]
    return cases


@gpu
def test_every_bound_launcher_runs_through_the_bindings_on_two_streams_and_two_outputs():
    """Each launcher kind, bound once, called on a stream of its own with one C buffer and then
    another (new cells, a re-pointed TMA map), then on a second stream (a second slot): every
    result within the kernel tests' bound of the float64 reference, the padding untouched."""
    import cupy

    from kernel_cases import Case
    from pyblasgemm.kernels import jit
    from pyblasgemm.kernels.launch import bind

    hopper = int(cupy.cuda.Device().compute_capability) == 90
    cases = _launcher_cases(hopper)
    rng = np.random.default_rng(11)
    built = []
    for name, kind, acc, cfg, sms, ldm in cases:
        case = Case(kind, acc, "T", "N", 257, 130, 77, pad=8, alpha=0.5, beta=-1.5, rng=rng, ld_multiple=ldm)
        built.append((name, case, cfg, sms))
    jit.warm([(cfg, case.kind, "T", "N", case.acc, case.problem().operands_vectorizable())
              for _, case, cfg, _ in built])                # the compiles in parallel
    for name, case, cfg, sms in built:
        launch = bind(case.problem(), cfg, sm_count=sms)
        ref, cub = case.reference(), case.cublas_out()
        for stream in (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)):
            for _ in range(2):
                c = cupy.asarray(case.c_h)                  # a new C buffer each call
                launch(case.a_d.data.ptr, case.b_d.data.ptr, c.data.ptr, case.alpha, case.beta, stream)
                stream.synchronize()
                case.check(c.get(), ref, cub)
        print(name, "ok")


# ---- the mma.sync launch's replay: cuLaunchKernelEx on a config made once per stream -------

class _ExDriver:
    """cuda.bindings.driver as a BoundLaunch calls it: handles are the ints given, a config is a
    namespace; each cuLaunchKernelEx records the config's fields, the kernel and the argument
    values it reads through the ``void**`` (as the driver copies them at the call)."""

    CUfunction = CUstream = CUdeviceptr = staticmethod(int)
    CUlaunchConfig = types.SimpleNamespace

    def __init__(self, fail_first=0):
        self.launches, self.fail_first, self.calls = [], fail_first, []

    def cuLaunchKernelEx(self, cfg, fn, params, extra):
        self.calls.append("cuLaunchKernelEx")
        if self.fail_first:
            self.fail_first -= 1
            return (_Res.CUDA_ERROR_INVALID_CONTEXT,)
        argv = (ct.c_void_p * 17).from_address(params)
        ptrs = tuple(ct.c_uint64.from_address(argv[i]).value for i in range(3))
        scales = tuple(ct.c_float.from_address(argv[i]).value for i in (15, 16))   # alpha, beta cells
        self.launches.append(((cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.sharedMemBytes,
                               cfg.hStream, cfg.numAttrs), fn, ptrs, scales, extra))
        return (_Res.CUDA_SUCCESS,)

    def cuCtxGetCurrent(self):
        self.calls.append("cuCtxGetCurrent")
        return _Res.CUDA_SUCCESS, 0

    def cuDeviceGet(self, ordinal):
        return _Res.CUDA_SUCCESS, ordinal

    def cuDevicePrimaryCtxRetain(self, dev):
        return _Res.CUDA_SUCCESS, 0x77

    def cuCtxSetCurrent(self, ctx):
        self.calls.append("cuCtxSetCurrent")
        return (_Res.CUDA_SUCCESS,)


def _bound_64(monkeypatch, fake, decomposition=None):
    """A BoundLaunch of the 64³ float16 problem on the planner's sm_90 config (one kernel, no
    workspace), over ``fake`` and a CuPy that only gives a device context."""
    from dataclasses import replace

    from pyblasgemm.kernels.launch import BoundLaunch
    from pyblasgemm.kernels.problem import KernelProblem
    from pyblasgemm.kernels.spec import launch_spec

    monkeypatch.setattr(driver, "_CU", fake)
    monkeypatch.setattr(driver, "_STREAMS", {})
    cuda = types.SimpleNamespace(Device=lambda dev=None: __import__("contextlib").nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda, empty=None, zeros=None))
    config = pyblasgemm.plan(64, 64, 64, "float16", arch="sm_90").config
    if decomposition:
        config = replace(config, decomposition=decomposition)
    problem = KernelProblem("f16", "N", "N", 64, 64, 64, 64, 64, 64, 0x1000, 0x2000, 0x3000)
    spec = launch_spec(problem, config, 132, 1)
    kern = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0xF00))
    return BoundLaunch(problem, spec, kern, None, 0), spec


def test_a_replay_binds_the_operand_cells_in_the_order_the_problem_ran(monkeypatch):
    """``calls.ordered`` takes the launch's own replay: the caller's (pa, pb) reach the kernel as
    (pb, pa) for a swapped problem, one cuLaunchKernelEx on the slot's config (grid, block, shared
    memory and stream of the spec); the scales written once and rewritten when they change, also
    after a plain call of the launch changed them (one memo)."""
    from pyblasgemm import calls

    fake = _ExDriver()
    bl, spec = _bound_64(monkeypatch, fake)
    swapped, plain = calls.ordered(bl, True), calls.ordered(bl, False)
    assert swapped is not bl and plain is not bl and bl.replay(True) is not None
    swapped(0xA00, 0xB00, 0xC00, 1.0, 0.0, 0x50)
    plain(0xA00, 0xB00, 0xC00, 1.0, 0.0, 0x50)
    bl(0xA10, 0xB10, 0xC10, 0.5, 0.25, 0x50)
    swapped(0xA20, 0xB20, 0xC20, 1.0, 0.0, 0x60)            # another stream: its own slot and config
    swapped(0xA30, 0xB30, 0xC30, 1.0, 0.0, 0x50)            # scales back to (1, 0) after the call above
    grid = tuple(spec.geometry["grid"])
    want_cfg = grid + (spec.config.threads, spec.smem)
    assert [launch[0] for launch in fake.launches] == [want_cfg + (s, 0)
                                                       for s in (0x50, 0x50, 0x50, 0x60, 0x50)]
    assert {launch[1] for launch in fake.launches} == {0xF00}
    assert {launch[4] for launch in fake.launches} == {0}
    assert [launch[2] for launch in fake.launches] == [(0xB00, 0xA00, 0xC00), (0xA00, 0xB00, 0xC00),
                                                       (0xA10, 0xB10, 0xC10), (0xB20, 0xA20, 0xC20),
                                                       (0xB30, 0xA30, 0xC30)]
    assert [launch[3] for launch in fake.launches] == [(1.0, 0.0), (1.0, 0.0), (0.5, 0.25), (1.0, 0.0),
                                                       (1.0, 0.0)]


def test_a_replay_launches_again_on_a_fresh_thread_and_the_launch_refuses_pointers_outside_its_class(
        monkeypatch):
    """The replay leaves the alignment class to its caller's key (BoundLaunch.replay); the
    launch's own call refuses a pointer outside it before any driver call."""
    from pyblasgemm import calls

    fake = _ExDriver(fail_first=1)
    bl, _ = _bound_64(monkeypatch, fake)
    run = calls.ordered(bl, True)
    with pytest.raises(ValueError, match=r"pointers 0xa08, 0xb00, 0xc00 are outside the bound alignment"):
        bl(0xA08, 0xB00, 0xC00, 1.0, 0.0, 0x50)
    assert fake.calls == []
    run(0xA00, 0xB00, 0xC00, 1.0, 0.0, 0x50)                # CUDA_ERROR_INVALID_CONTEXT, then a context
    assert fake.calls == ["cuLaunchKernelEx", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuLaunchKernelEx"]
    assert [launch[2] for launch in fake.launches] == [(0xB00, 0xA00, 0xC00)]
    run(0xA00, 0xB00, 0xC00, 1.0, 0.0, 0x50)                # the lock was released after the retry
    assert len(fake.launches) == 2


def test_a_launch_of_more_than_one_kernel_call_is_replayed_through_the_launch_itself(monkeypatch):
    """Stream-k flags (a memset before the kernel): no replay of its own, so ``ordered`` keeps
    the launch (unswapped) or the function that swaps the pointers for it."""
    from pyblasgemm import calls

    bl, spec = _bound_64(monkeypatch, _ExDriver(), decomposition="streamk")
    assert spec.geometry["flags"] and bl.replay(False) is None
    assert calls.ordered(bl, False) is bl and calls.ordered(bl, True).__name__ == "swapped"
