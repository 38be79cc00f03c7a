"""Backends: each module runs a validated ``GemmDesc`` on arrays, nothing more.

A backend module exposes ``NAME``, ``supports(desc) -> (ok, reason)`` and
``run(desc, a, b, c)``, where ``a``, ``b``, ``c`` are arrays whose first element is the origin of
the stored (column-major) matrix the description talks about. Modules are imported on first use
so that ``import pyblasgemm`` never imports CuPy.
"""
from __future__ import annotations

import importlib

#: accepted values of ``backend=``; 'auto' lets the planner choose
BACKEND_NAMES = ("auto", "tensorcore", "cublas", "host")

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
