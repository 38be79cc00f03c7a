"""PYBLASGEMM_* variables: one table, validated on first use, errors that name the variable."""
import os
import subprocess
import sys

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import settings
from pyblasgemm._types import FP32_DEFAULTS, TYPE_ROWS
from pyblasgemm.backends import BACKEND_NAMES
from pyblasgemm.kernels.config import DECOMPOSITIONS
from pyblasgemm.planner.arch import FAMILIES
from pyblasgemm.settings import SettingError

#: the choice variables' words, from the tables that own them (as the package passes them)
OPTIONS = {"PYBLASGEMM_BACKEND": BACKEND_NAMES, "PYBLASGEMM_DECOMPOSITION": DECOMPOSITIONS,
           "PYBLASGEMM_ARCH": tuple(FAMILIES), "PYBLASGEMM_FP32_COMPUTE": FP32_DEFAULTS}

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


@pytest.mark.parametrize("name", ["PYBLASGEMM_BACKEND", "PYBLASGEMM_FP32_COMPUTE", "PYBLASGEMM_SPLITS",
                                  "PYBLASGEMM_CONFIG"])
def test_a_long_or_control_character_value_is_quoted_escaped_and_clipped(monkeypatch, name):
    """The environment is untrusted input: a refused value is quoted escaped (no terminal
    control sequence reaches a log) and clipped to SHOWN_CHARS characters with its length;
    the error keeps the whole value in ``.value``."""
    value = "\x1b[31m" + "x" * 5000
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as info:
        if name == "PYBLASGEMM_CONFIG":
            from pyblasgemm.planner.overrides import _read_settings
            _read_settings()
        else:
            settings.get(name, OPTIONS.get(name))
    message = str(info.value)
    assert message.startswith(f"{name}='\\x1b[31mxxx") and "\x1b" not in message
    assert f"... ({len(value)} characters) is not allowed: " in message and len(message) < 600
    assert info.value.value == value


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


# --- the ecosystem's words (issue 35 item 7): the variables read the tables backend= and
# compute= read, and set_default_compute too ----------------------------------------------------

def test_backend_variable_takes_the_backend_aliases(monkeypatch):
    from pyblasgemm.desc import BACKEND_ALIASES
    from pyblasgemm.planner.overrides import current_settings

    for alias, word in BACKEND_ALIASES.items():
        monkeypatch.setenv("PYBLASGEMM_BACKEND", alias.upper())
        pyblasgemm.clear_plan_cache()
        assert current_settings().backend == word
    a = np.ones(4, np.float32)
    # the alias forces our kernels, which run on CuPy arrays: named as the variable's word
    with pytest.raises(ValueError, match="PYBLASGEMM_BACKEND='tensorcore' runs on CuPy arrays"):
        pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, a, 2, a, 2, 0.0, np.zeros(4, np.float32), 2)


def test_backend_variable_refusal_lists_the_aliases(monkeypatch):
    from pyblasgemm.planner.overrides import current_settings

    monkeypatch.setenv("PYBLASGEMM_BACKEND", "gpu")
    pyblasgemm.clear_plan_cache()
    with pytest.raises(SettingError, match=r"'host', or 'pyblasgemm' \('tensorcore'\)"):
        current_settings()


@pytest.mark.parametrize("alias", ["tf32x3", "IEEE", "highest", "High"])
def test_fp32_compute_variable_takes_the_compute_aliases(monkeypatch, alias):
    from pyblasgemm._types import COMPUTE_ALIASES

    monkeypatch.setenv("PYBLASGEMM_FP32_COMPUTE", alias)
    monkeypatch.setattr("pyblasgemm._types._default_compute_fp32", None)
    assert pyblasgemm.get_default_compute() == COMPUTE_ALIASES[alias.lower()]["s"]


def test_fp32_compute_variable_refusal_lists_the_aliases(monkeypatch):
    monkeypatch.setenv("PYBLASGEMM_FP32_COMPUTE", "fp64")      # not a float32 mode
    monkeypatch.setattr("pyblasgemm._types._default_compute_fp32", None)
    with pytest.raises(SettingError, match=r"'3xtf32', or 'tf32x3' \('3xtf32'\), 'ieee' \('fp32'\)"):
        pyblasgemm.get_default_compute()


def test_every_reader_of_compute_words_reads_one_table(monkeypatch):
    """compute=, PYBLASGEMM_FP32_COMPUTE and set_default_compute accept the same words."""
    from pyblasgemm._types import COMPUTE_ALIASES, resolve_compute

    words = set(FP32_DEFAULTS) | {a for a, modes in COMPUTE_ALIASES.items() if "s" in modes}
    for word in sorted(words):
        mode = resolve_compute(TYPE_ROWS["s"], word, "sgemm")
        pyblasgemm.set_default_compute(word.upper())
        assert pyblasgemm.get_default_compute() == mode
        monkeypatch.setenv("PYBLASGEMM_FP32_COMPUTE", word)
        monkeypatch.setattr("pyblasgemm._types._default_compute_fp32", None)
        assert pyblasgemm.get_default_compute() == mode
    for bad in ("fp64", "int8-ozaki", "fp16", 3, None):
        with pytest.raises(ValueError, match=f"set_default_compute: mode={bad!r} must be one of "
                                             r"'fp32', 'tf32', '3xtf32' or an alias"):
            pyblasgemm.set_default_compute(bad)


def test_a_repeated_call_runs_the_new_default():
    """A call signature remembered with no compute= ran the old default: changing the default
    forgets it (a repeated sgemm kept computing fp32 after set_default_compute('tf32'))."""
    a = np.full(4, 1 + 2**-15, dtype=np.float32)   # 1 + 2^-15 rounds to 1 in tf32
    c = np.zeros(1, dtype=np.float32)
    for _ in range(2):                               # the second call is a remembered one
        pyblasgemm.sgemm("T", "N", 1, 1, 4, 1.0, a, 4, a, 4, 0.0, c, 1)
        assert c[0] > 4.0
    pyblasgemm.set_default_compute("tf32")
    pyblasgemm.sgemm("T", "N", 1, 1, 4, 1.0, a, 4, a, 4, 0.0, c, 1)
    assert c[0] == 4.0
    pyblasgemm.set_default_compute("ieee")           # fp32 again, by its alias
    pyblasgemm.sgemm("T", "N", 1, 1, 4, 1.0, a, 4, a, 4, 0.0, c, 1)
    assert c[0] > 4.0
    x = a.reshape(2, 2)
    want = pyblasgemm.matmul(x, x)                   # matmul's remembered signatures too
    pyblasgemm.set_default_compute("tf32")
    assert not np.array_equal(pyblasgemm.matmul(x, x), want)
