"""One table for the activations (pyblasgemm.epilogue.ACTIVATIONS): adding one touches that
table, one ``case`` of the device header and its tests, nothing else. Everything else that
knows the activations is derived from the table and checked here: the header's enum and
switch, PyTorch's forward and derivative table, the NumPy derivatives, the docs' tables and
lists."""
import math
import pathlib
import re

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm.epilogue import ACTIVATIONS, HOST_MATH, activation_table
from pyblasgemm.kernels.jit import INCLUDE_DIR

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = (INCLUDE_DIR / "pyblasgemm/epilogue/activation.cuh").read_text()


def _enum(name):
    return "kAct" + "".join(part.capitalize() for part in name.split("_"))    # gelu_tanh -> kActGeluTanh


def test_every_row_has_its_device_code_and_the_header_nothing_else():
    codes = [a.code for a in ACTIVATIONS.values()]
    assert len(set(codes)) == len(codes) and 0 not in codes
    enum = dict(re.findall(r"(kAct\w+) = (\d+)", HEADER))
    cases = set(re.findall(r"case (kAct\w+):", HEADER))
    want = {_enum(a.name): str(a.code) for a in ACTIVATIONS.values()}
    assert {k: v for k, v in enum.items() if k != "kActNone"} == want
    assert cases == set(want)            # one case per row, no case without a row


def test_the_host_derivatives_are_the_forward_formulas_derivatives():
    """Each row's derivative (written once for NumPy and PyTorch) against a central difference
    of its own host definition, in float64."""
    p = np.array([-6.0, -2.5, -1.0, -0.3, 0.2, 0.7, 1.5, 4.0])
    h = 1e-6
    for a in ACTIVATIONS.values():
        numeric = (a.host(p + h) - a.host(p - h)) / (2 * h)
        np.testing.assert_allclose(a.derivative(p, HOST_MATH), numeric, rtol=1e-6, atol=1e-8,
                                   err_msg=a.name)


def test_pytorch_takes_its_table_from_this_one():
    torch = pytest.importorskip("torch")
    import pyblasgemm.torch as pbt

    assert pbt.ACTIVATIONS == ("none", *ACTIVATIONS)
    p = torch.linspace(-3, 3, 13, dtype=torch.float64)
    for name, a in ACTIVATIONS.items():
        forward, derivative = pbt._ACTIVATION_TABLE[name]
        torch.testing.assert_close(forward(p), a.torch_forward(p, torch), rtol=0, atol=0)
        torch.testing.assert_close(derivative(p), a.derivative(p, torch), rtol=0, atol=0)
        # and the table's PyTorch forward is PyTorch's own function of that name
        torch.testing.assert_close(a.torch_forward(p, torch),
                                   torch.from_numpy(a.host(p.numpy())), rtol=1e-12, atol=1e-15)


def test_the_docs_tables_are_made_from_the_table():
    """The guides hold a marker the docs build expands (docs/conf.py), never a hand table or a
    hand list of the names: one more row shows up in every page by itself."""
    conf = (ROOT / "docs/conf.py").read_text()
    assert "activation_table" in conf and "source-read" in conf
    pages = {p: p.read_text() for p in (ROOT / "docs").rglob("*.rst") if "_build" not in p.parts}
    markers = {p.name: re.findall(r"^\.\. activation-table:: (\w+)", t, re.M) for p, t in pages.items()}
    assert markers["fusion.rst"] == ["definition"] and markers["pytorch.rst"] == ["derivative"]
    names = list(ACTIVATIONS)
    for path, text in list(pages.items()) + [(ROOT / "README.md", (ROOT / "README.md").read_text())]:
        for line in text.splitlines():
            listed = [n for n in names if re.search(rf"['\"`]{n}['\"`]", line)]
            assert len(listed) < 3, f"{path.name}: a hand-written list of activations: {line.strip()}"
    for kind in ("definition", "derivative"):
        table = activation_table(kind)
        assert all(f"``{n!r}``" in table for n in names), kind
        rules = [line for line in table.splitlines() if set(line) <= {"=", " "}]
        assert len(rules) == 3          # a simple reST table: head rule, head, rule, rows, rule


def test_the_doc_tables_expand_in_the_docs_build():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_conf", ROOT / "docs/conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    source = ["text\n\n.. activation-table:: definition\n\nmore\n"]
    conf.expand_tables(None, "guide/fusion", source)
    assert ".. activation-table" not in source[0] and all(n in source[0] for n in ACTIVATIONS)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_every_activation_runs_through_matmul_on_the_host(name):
    x = np.array([[1.0, -2.0], [0.5, 3.0]])
    w = np.array([[1.0, 0.5], [-1.0, 2.0]])
    y = pyblasgemm.matmul(x, w, activation=name)
    np.testing.assert_allclose(y, ACTIVATIONS[name].host(x @ w), rtol=1e-15, atol=1e-15)
    assert math.isfinite(float(y.sum()))
