"""Sphinx configuration of pyblasgemm's documentation (furo theme, numpydoc-style docstrings
through napoleon, autodoc/autosummary API reference, doctest-able guides)."""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

import pyblasgemm  # noqa: E402

project = "pyblasgemm"
author = "pyblasgemm developers"
copyright = "2026, pyblasgemm developers"
release = pyblasgemm.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "myst_parser",   # the root CHANGELOG.md, included by changelog.rst
]

# numpydoc-style sections (Parameters, Returns, Raises, Examples) via napoleon
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autosummary_generate = False          # the API page lists and documents every name itself

# The guides' examples run on NumPy arrays (the host backend): `sphinx-build -b doctest`
# runs them, and so does tests/test_docs.py in the ordinary pytest run.
doctest_global_setup = "import numpy as np\nimport pyblasgemm"
doctest_default_flags = (__import__("doctest").NORMALIZE_WHITESPACE
                         | __import__("doctest").ELLIPSIS)

templates_path = []
# design/: developer notes in Markdown (how the code is built), read in the repository
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "design"]
html_theme = "furo"
html_title = f"pyblasgemm {release}"
html_static_path = ["_static"]
pygments_style = "sphinx"
pygments_dark_style = "monokai"


# Tables made from the code's own tables (never written by hand): ``.. activation-table:: kind``
# becomes pyblasgemm.epilogue.activation_table(kind) before the page is parsed.
_ACTIVATION_TABLE = re.compile(r"^\.\. activation-table:: (\w+)[ \t]*$", re.M)


def expand_tables(app, docname, source):
    from pyblasgemm.epilogue import activation_table

    source[0] = _ACTIVATION_TABLE.sub(lambda m: activation_table(m.group(1)), source[0])


def setup(app):
    app.connect("source-read", expand_tables)
