"""The package's version: its one source (pyproject.toml reads it statically; ``pyblasgemm``
re-exports it, and the kernel-cache key imports it from here, a leaf, rather than from the
package that is still importing its submodules)."""

__version__ = "0.1.0"
