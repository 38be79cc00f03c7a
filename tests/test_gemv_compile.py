"""CPU-only NVRTC tests of the GEMV kernel (``include/pyblasgemm/gemv/gemv.cuh``): no GPU, no CUDA
context.

Every shipped instantiation (:func:`pyblasgemm.kernels.gemv.all_instantiations`: 6 kinds x 2
weight layouts x 4 token-group counts x 4 load classes = 192) compiles with at most
:data:`~pyblasgemm.kernels.gemv.MAX_REGISTERS` (128) registers per thread, no spill and no stack
frame, for sm_90 (the H100 / H200 the kernel is tuned for) and sm_80. By default a cover (every
mainloop with every token-group count and every load class, every kind on each of its
mainloops: ~18 per arch); all of them with ``PYBLASGEMM_COMPILE_ALL=1``. Each compile runs once,
on every core, beside the other tests (compile_pool.py).
"""
from __future__ import annotations

import os
import re
import sys
from typing import NamedTuple

import pytest

import compile_pool
import nvrtc_under_test

nvrtc_under_test.choose()   # PYBLASGEMM_TEST_NVRTC: before anything loads an NVRTC
pytest.importorskip("cupy")
from cupy.cuda import nvrtc  # noqa: E402

from pyblasgemm.kernels import gemv, jit  # noqa: E402

ALL = os.environ.get("PYBLASGEMM_COMPILE_ALL", "") not in ("", "0")
NVRTC = nvrtc_under_test.label()
ARCHS = ("sm_90", "sm_80")


class Spec(NamedTuple):
    arch: str
    kind: str
    path: str
    token_groups: int
    loads: int
    name: str


def _features(s: Spec) -> set:
    """What one compile checks: its mainloop at its token-group count, its mainloop in its load
    class (vector or element loads of each operand), its kind on its mainloop."""
    return {("path-tg", s.path, s.token_groups), ("path-loads", s.path, s.loads), ("kind-path", s.kind, s.path)}


def _all_specs(arch: str) -> list:
    return [Spec(arch, *inst) for inst in gemv.all_instantiations()]


def _selected(arch: str) -> list:
    specs = _all_specs(arch)
    if ALL:
        return specs
    return sorted(compile_pool.greedy_cover(specs, _features), key=specs.index)


def _compile(arch: str, name: str) -> dict:
    """ptxas's resources of one instantiation, or {"error": ...}."""
    try:
        binary, log, lowered = gemv.compile_offline([name], arch)
    except jit.KernelCompileError as e:
        return {"error": f"{e}\n{e.log}"}
    return {"res": jit.ptxas_resources(log).get(lowered[name]), "log": log, "binary": bool(binary)}


def compile_jobs(items) -> dict:
    """{key: job} for this module's selected instantiation tests (conftest queues them)."""
    jobs = {}
    for item in items:
        if getattr(item, "module", None) is sys.modules[__name__] and \
                item.originalname == "test_instantiation_compiles_within_bounds":
            s = item.callspec.params["spec"]
            jobs[("gemv", s.arch, s.name)] = (lambda s=s: _compile(s.arch, s.name))
    return jobs


def _params():
    out = []
    for arch in ARCHS:
        for s in _selected(arch):
            out.append(pytest.param(s, id=f"{NVRTC}-{arch}-{s.kind}-{s.path}-tg{s.token_groups}-loads{s.loads}"))
    return out


@pytest.mark.parametrize("spec", _params())
def test_instantiation_compiles_within_bounds(spec):
    out = compile_pool.result(("gemv", spec.arch, spec.name), lambda: _compile(spec.arch, spec.name))
    assert "error" not in out, out.get("error")
    r, log = out["res"], out["log"]
    assert out["binary"] and r, f"no cubin or no ptxas report for {spec.name}:\n{log}"
    assert r.get("spill_stores", 0) == 0 and r.get("spill_loads", 0) == 0, f"spill in {spec.name}:\n{log}"
    assert r.get("stack", 0) == 0, f"local memory (stack frame) in {spec.name}:\n{log}"
    assert r["registers"] <= gemv.MAX_REGISTERS, f"{r['registers']} registers in {spec.name}"


def test_cover_reaches_every_feature():
    every, chosen = _all_specs("sm_90"), _selected("sm_90")
    covered = set().union(*(_features(s) for s in chosen))
    assert covered == set().union(*(_features(s) for s in every))
    if not ALL:
        assert len(chosen) <= 24, len(chosen)


def test_register_bound_is_the_headers_launch_bounds():
    text = (jit.INCLUDE_DIR / gemv.HEADER).read_text()
    threads, blocks = map(int, re.search(r"__launch_bounds__\((\d+), (\d+)\)", text).groups())
    assert 65536 // (threads * blocks) == gemv.MAX_REGISTERS
    # every tile's CTA fits the launch bound
    assert max(32 * wr * wk for tiles in gemv.TILES.values() for (_, _, wr, wk) in tiles.values()) <= threads
    # the row-block kernel: up to MAX_ROWS_WARPS warps in one CTA, the same register bound
    threads, blocks = map(int, re.search(r"__launch_bounds__\((\d+), (\d+)\)\ngemv_rows_kernel", text).groups())
    assert threads == 32 * gemv.MAX_ROWS_WARPS and 65536 // (threads * blocks) == gemv.MAX_REGISTERS


def test_wrong_arch_fails_loudly():
    prog = nvrtc.createProgram(f'#include "{gemv.HEADER}"\n', "probe.cu", [], [])
    try:
        with pytest.raises(Exception):
            nvrtc.compileProgram(prog, ["--gpu-architecture=sm_75", "-std=c++17", "-I" + str(jit.INCLUDE_DIR)])
        assert "compute capability 8.0" in nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def test_compile_error_names_the_instantiation():
    with pytest.raises(jit.KernelCompileError) as info:
        gemv.compile_offline(["pyblasgemm::gemv::gemv_kernel<pyblasgemm::gemv::KindF16, 7, 1, 1, 1, 3>"], "sm_90")
    assert "gemv_kernel" in info.value.instantiation and info.value.log
