"""PYBLASGEMM_* variables: one table, validated on first use, errors that name the variable."""
import os
import subprocess
import sys

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import settings
from pyblasgemm._types import TYPE_ROWS
from pyblasgemm.backends import BACKEND_NAMES
from pyblasgemm.kernels.config import DECOMPOSITIONS
from pyblasgemm.planner.arch import FAMILIES
from pyblasgemm.settings import SettingError

#: the choice variables' words, from the tables that own them (as the package passes them)
OPTIONS = {"PYBLASGEMM_BACKEND": BACKEND_NAMES, "PYBLASGEMM_DECOMPOSITION": DECOMPOSITIONS,
           "PYBLASGEMM_ARCH": tuple(FAMILIES), "PYBLASGEMM_FP32_COMPUTE": TYPE_ROWS["s"].computes}

BAD_VALUES = [
    ("PYBLASGEMM_FP32_COMPUTE", "garbage"), ("PYBLASGEMM_FP32_COMPUTE", "fp64"),
    ("PYBLASGEMM_SPLITS", "-5"), ("PYBLASGEMM_SPLITS", "0"), ("PYBLASGEMM_SPLITS", "1"),
    ("PYBLASGEMM_SPLITS", "99999999999"), ("PYBLASGEMM_SPLITS", "2.5"), ("PYBLASGEMM_SPLITS", "0x10"),
    ("PYBLASGEMM_PRINT_PLANS", "maybe"), ("PYBLASGEMM_AUTOTUNE", "2"),
    ("PYBLASGEMM_NO_KERNEL_CACHE", "enabled"), ("PYBLASGEMM_BACKEND", "gpu"),
    ("PYBLASGEMM_DECOMPOSITION", "diagonal"), ("PYBLASGEMM_ARCH", "sm_70"),
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in settings.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    pyblasgemm.clear_plan_cache()
    yield
    monkeypatch.undo()
    pyblasgemm.clear_plan_cache()
    pyblasgemm.set_default_compute("fp32")


@pytest.mark.parametrize("name, value", BAD_VALUES)
def test_bad_value_names_variable_value_and_allowed(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as info:
        settings.get(name, OPTIONS.get(name))
    message = str(info.value)
    assert message.startswith(f"{name}={value!r} is not allowed: ")
    assert info.value.name == name and info.value.value == value
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("text, value", [("1", True), ("0", False), ("true", True),
                                         ("FALSE", False), ("Yes", True), ("no", False),
                                         ("ON", True), ("off", False), (" on ", True),
                                         ("", False)])
def test_booleans(monkeypatch, text, value):
    monkeypatch.setenv("PYBLASGEMM_PRINT_PLANS", text)
    assert settings.get("PYBLASGEMM_PRINT_PLANS") is value


def test_print_plans_false_prints_nothing(monkeypatch, capsys):
    """PYBLASGEMM_PRINT_PLANS=false used to print plans (any non-empty value but '0' was true)."""
    monkeypatch.setenv("PYBLASGEMM_PRINT_PLANS", "false")
    pyblasgemm.clear_plan_cache()
    pyblasgemm.plan(640, 640, 640, "f16")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("PYBLASGEMM_PRINT_PLANS", "yes")
    pyblasgemm.clear_plan_cache()
    pyblasgemm.plan(640, 640, 640, "f16")
    assert "candidates" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-5", "0", "1", "99999999999"])
def test_bad_splits_fail_the_first_plan(monkeypatch, value):
    monkeypatch.setenv("PYBLASGEMM_SPLITS", value)
    pyblasgemm.clear_plan_cache()
    with pytest.raises(SettingError, match=f"PYBLASGEMM_SPLITS='{value}'.*from 2 to 65535"):
        pyblasgemm.plan(256, 256, 65536, "f16")


def test_fp32_compute_any_case(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_FP32_COMPUTE", "TF32")
    monkeypatch.setattr("pyblasgemm._types._default_compute_fp32", None)
    assert pyblasgemm.get_default_compute() == "tf32"
    pyblasgemm.set_default_compute("3xTF32")
    assert pyblasgemm.get_default_compute() == "3xtf32"


def test_fp32_compute_garbage_fails_on_first_use_naming_it(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_FP32_COMPUTE", "garbage")
    monkeypatch.setattr("pyblasgemm._types._default_compute_fp32", None)
    a, c = np.ones(4, dtype=np.float32), np.zeros(4, dtype=np.float32)
    with pytest.raises(SettingError, match="PYBLASGEMM_FP32_COMPUTE='garbage'.*'tf32'"):
        pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, a, 2, a, 2, 0.0, c, 2)
    assert np.all(c == 0)


def test_empty_means_default(monkeypatch):
    for name in settings.VARIABLES:
        monkeypatch.setenv(name, "  ")
    assert all(settings.get(n, OPTIONS.get(n)) == settings.VARIABLES[n].default
               for n in settings.VARIABLES)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_choice_errors_list_the_owners_words(monkeypatch, name):
    monkeypatch.setenv(name, "nonsense")
    with pytest.raises(SettingError, match="one of " + ", ".join(repr(o) for o in OPTIONS[name])):
        settings.get(name, OPTIONS[name])


def test_settings_imports_nothing_of_the_package():
    """settings.py is the bottom of the house: the owners pass their words in (no cycle)."""
    import ast
    tree = ast.parse(open(settings.__file__).read())
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert relative == []


def test_import_reads_no_variable():
    """A bad value never fails ``import pyblasgemm``: variables are read on first use, and
    the first call that needs one raises the SettingError."""
    env = dict(os.environ, **{name: "garbage" for name in settings.VARIABLES})
    code = ("import pyblasgemm, numpy as np\n"
            "print('imported')\n"
            "a = np.ones((2, 2), np.float32)\n"
            "try:\n    pyblasgemm.matmul(a, a)\n"
            "except pyblasgemm.settings.SettingError as exc:\n    print('raised', exc.name)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0] == "imported" and lines[1] == "raised" and lines[2].startswith("PYBLASGEMM_")


def test_package_reads_variables_only_through_settings():
    """One place parses PYBLASGEMM_* variables: no other module of the package reads them."""
    root = os.path.dirname(pyblasgemm.__file__)
    offenders = []
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and f != "settings.py":
                text = open(os.path.join(folder, f)).read()
                if "os.environ" in text or "getenv(" in text:
                    offenders.append(f)
    assert offenders == []


def test_every_variable_is_documented():
    from pathlib import Path
    docs = "".join(p.read_text() for p in (Path(__file__).parent.parent / "docs").rglob("*.rst"))
    for name in settings.VARIABLES:
        assert name in pyblasgemm.planner.__doc__, name
        assert name in docs, name
