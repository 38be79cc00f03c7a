"""One constraints module: the backends' ``supports``, the planner and autotune all ask it."""
import pytest

import pyblasgemm
from pyblasgemm import constraints
from pyblasgemm.backends import cublas, host, tensorcore
from pyblasgemm.planner import make_desc, plan


def test_backends_supports_are_the_constraints():
    d = make_desc(64, 64, 64, "f16")
    for module in (cublas, host, tensorcore):
        assert module.supports(d) == constraints.backend_supports(module.NAME, d)
    assert constraints.backend_supports("host", d) == (False, "the host backend runs on NumPy arrays only")
    assert constraints.backend_supports("tensorcore", make_desc(8, 8, 8, "c64", transa="C"))[0] is False


def test_planner_obeys_a_changed_constraint(monkeypatch):
    """Refuse cuBLAS in the constraints module alone: the planner's choice and its reason follow."""
    monkeypatch.setitem(constraints.BACKENDS, "cublas", lambda desc: (False, "refused by a test"))
    pyblasgemm.clear_plan_cache()
    p = plan(4096, 4096, 4096, "f16", arch="sm_90")
    assert p.backend == "tensorcore"
    assert any(c.rejected == "refused by a test" for c in p.candidates if c.backend == "cublas")
    with pytest.raises(NotImplementedError, match="refused by a test"):
        plan(4096, 4096, 4096, "f16", arch="sm_90", backend="cublas")
    monkeypatch.undo()
    pyblasgemm.clear_plan_cache()


def test_kernel_problem_carries_the_problem_alignment():
    p = constraints.kernel_problem(make_desc(64, 64, 64, "i8", align=1))
    assert (p.a_ptr, p.b_ptr, p.c_ptr) == (1, 1, 4)      # an int32 C is 4-byte aligned at least
    assert constraints.kernel_problem(make_desc(64, 64, 64, "f16")).a_ptr == 16


def test_config_valid_adds_the_arch_rules():
    from pyblasgemm.planner import FAMILIES

    p = plan(4096, 4096, 4096, "f16", arch="sm_90", backend="tensorcore")
    prob = constraints.kernel_problem(p.problem)
    assert constraints.config_valid(p.config, prob, FAMILIES["sm_90"])[0]
    if p.config.family == "sm90a":
        ok, why = constraints.config_valid(p.config, prob, FAMILIES["sm_80"])
        assert not ok and "9.0" in why


def test_one_gemmdesc_constructor():
    """Every form describes its problem through desc.describe (the only ``GemmDesc(`` call)."""
    import pathlib
    import re

    root = pathlib.Path(pyblasgemm.__file__).resolve().parent
    calls = [(p.relative_to(root).as_posix(), line) for p in root.rglob("*.py")
             for line in p.read_text().splitlines()
             if re.search(r"\bGemmDesc\(", line) and not line.lstrip().startswith(("class ", "#"))]
    assert calls == [("desc.py", calls[0][1])] and "return GemmDesc(" in calls[0][1], calls
