"""The kinds table is complete: every public routine x compute mode has a row, every kernel
kind a full row whose C++ structs exist, and the derived tables agree with it."""
import pathlib
import re

import numpy as np
import pytest

from pyblasgemm import kinds
from pyblasgemm._types import BLAS_ROWS, TYPE_ROWS
from pyblasgemm.kinds import KERNEL_KINDS, ROUTES

INCLUDE = pathlib.Path(kinds.__file__).resolve().parent / "kernels" / "include"
_HEADERS = "\n".join(p.read_text() for p in INCLUDE.rglob("*.cuh"))
_DECLARED = set(re.findall(r"(?:struct|typedef [^;]*?)\s+(\w+)\s*(?:[:{;<]|$)", _HEADERS, re.M))

ROUTINE_MODES = [(p, c) for p, row in BLAS_ROWS.items() for c in row.computes]


@pytest.mark.parametrize("prefix, compute", ROUTINE_MODES)
def test_every_routine_and_compute_mode_has_a_complete_row(prefix, compute):
    route = ROUTES[(prefix, compute)]
    row = TYPE_ROWS[prefix]
    assert route.cuda_ab in kinds.CUDA.values() and route.cuda_c in kinds.CUDA.values()
    assert route.cublas_compute is None or route.cublas_compute in kinds.CUBLAS_COMPUTE.values()
    assert route.cublas_compute is not None or route.kernel_kind is not None, "nothing runs it"
    assert route.rtol >= 0 and (route.rtol == 0) == (row.scalar_kind == "int")
    if route.kernel_kind is not None:
        kind = KERNEL_KINDS[route.kernel_kind]
        assert route.accumulator in kind.accumulators
        assert kind.ab_dtype == row.ab_dtype.name and kind.c_dtype == row.c_dtype.name
        assert kind.elem_bytes == row.ab_dtype.itemsize and kind.c_bytes == row.c_dtype.itemsize


def test_no_row_without_a_routine():
    assert set(ROUTES) == set(ROUTINE_MODES)


@pytest.mark.parametrize("name", sorted(KERNEL_KINDS))
def test_every_kernel_kind_names_structs_that_exist(name):
    kind = KERNEL_KINDS[name]
    assert set(kind.mma_struct) == set(kind.accumulators)
    for struct in (*kind.mma_struct.values(), kind.sm90_struct):
        assert struct is None and struct is kind.sm90_struct or struct in _DECLARED, (
            f"{struct} is not declared in kernels/include")
    # a kind the Hopper kernel does not run is one the planner never offers it
    from pyblasgemm.kernels.config import SM90_KINDS
    assert (kind.sm90_struct is None) == (name not in SM90_KINDS)
    assert kind.base_kind in KERNEL_KINDS
    assert np.dtype(kind.ab_dtype.replace("bfloat16", "float16")).itemsize == kind.elem_bytes


def test_derived_tables_are_read_off_the_rows():
    from pyblasgemm.backends import cublas
    from pyblasgemm.kernels import jit, problem, sm90
    from pyblasgemm.planner import problem as planner_problem

    for key, r in ROUTES.items():
        if r.cublas_compute is None:
            assert key not in cublas._TYPES
        else:
            assert cublas._TYPES[key][:3] == (r.cuda_ab, r.cuda_c, r.cublas_compute)
        if r.kernel_kind is None:
            assert key not in planner_problem._KINDS
        else:
            assert planner_problem._KINDS[key] == r.kernel_kind
    for name, k in KERNEL_KINDS.items():
        assert problem.ELEM_BYTES[name] == k.elem_bytes and problem.C_BYTES[name] == k.c_bytes
        assert sm90.TMA_DTYPE[name] == k.tma_ab and sm90.TMA_C_DTYPE[name] == k.tma_c
        assert jit.SM90_KIND[name] == k.sm90_struct
    assert cublas._TYPES[("h", "fp16")][3] == np.float16     # 16F compute: half scalars
