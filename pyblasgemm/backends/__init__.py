"""Backends: each module runs a validated ``GemmDesc`` on arrays, nothing more.

A backend module exposes ``NAME``, ``supports(desc) -> (ok, reason)``, ``run(desc, a, b, c)``
and, for the GPU backends, ``bind(desc, plan)``: the launch of the problem's class, called with
pointers (``execute`` keeps it in the plan cache; None when the arrays themselves are needed).
In ``run``, ``a``, ``b``, ``c`` are arrays whose first element is the origin of
the stored (column-major) matrix the description talks about. Modules are imported on first use
so that ``import pyblasgemm`` never imports CuPy.
"""
from __future__ import annotations

import importlib

from ..desc import BACKEND_NAMES  # noqa: F401  (accepted values of ``backend=``)

_MODULES = {
    "host": "pyblasgemm.backends.host",
    "cublas": "pyblasgemm.backends.cublas",
    "tensorcore": "pyblasgemm.backends.tensorcore",
}


_loaded: dict = {}


def get_backend(name: str):
    """The backend module for ``name`` ('host', 'cublas' or 'tensorcore'), imported once."""
    module = _loaded.get(name)
    if module is None:
        module = _loaded[name] = importlib.import_module(_MODULES[name])
    return module
