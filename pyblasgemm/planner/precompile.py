"""``pyblasgemm.precompile(problems)``: compile ahead of time the kernels the planner picks, so
that the first call of a problem does not wait for NVRTC (seconds per sm_90a kernel)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Tuple, Union

if TYPE_CHECKING:     # types only
    from .plan import Plan

__all__ = ["precompile"]

#: one problem: ``(m, n, k, dtype)``, or :func:`pyblasgemm.plan`'s keywords
Problem = Union[Tuple[int, int, int, Any], Mapping[str, Any]]


def precompile(problems: Iterable[Problem], *, progress: bool = True,
               workers: int | None = None,
               compiler: Callable[[Any], Any] | None = None) -> list[Plan]:
    """Plan every problem and compile the kernels of the plans that run ours (sm_90a cubins
    land in the kernel cache, so later processes load them); returns the plans.

    ``problems``: an iterable of ``(m, n, k, dtype)`` tuples or of dicts of
    :func:`pyblasgemm.plan`'s keywords (``{"m": 4096, "n": 4096, "k": 4096, "dtype": "f16",
    "transa": "T"}``). Every problem is planned (and checked) before the first compile. A
    ``tqdm`` progress bar counts the kernels (``progress=False``: none); ``workers`` threads
    compile in parallel (NVRTC releases the GIL). Needs CuPy and a GPU (``RuntimeError``
    without one), unless ``compiler``, a callable of one kernel spec (tests), replaces the
    compile. Plans of cuBLAS or the host compile nothing.

    Example::

        >>> import pyblasgemm
        >>> plans = pyblasgemm.precompile([(8192, 8192, 8192, "3xtf32"), (64, 64, 64, "f16")],
        ...                               progress=False)              # doctest: +SKIP
        >>> [p.backend for p in plans]                                 # doctest: +SKIP
        ['tensorcore', 'cublas']
    """
    from ..kernels.config import KernelConfig
    from . import plan as plan_of
    from .candidates import kernel_problem_for
    from .problem import make_desc

    if isinstance(problems, (str, bytes, dict)) or not hasattr(problems, "__iter__"):
        raise TypeError(f"precompile: problems={problems!r} must be an iterable of (m, n, k, "
                        f"dtype) tuples or dicts of plan()'s keywords")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool)
                                or workers < 1):
        raise ValueError(f"precompile: workers={workers!r} must be an int >= 1")
    if compiler is None:
        compiler = _gpu_compiler()          # before any work: no GPU, no compile
    plans: list[Plan] = []
    specs: dict[tuple, None] = {}          # (an ordered set: each kernel once)
    for i, prob in enumerate(problems):
        if isinstance(prob, dict):
            kw = dict(prob)
        elif isinstance(prob, (tuple, list)) and len(prob) == 4:
            kw = dict(zip(("m", "n", "k", "dtype"), prob))
        else:
            raise TypeError(f"precompile: problems[{i}]={prob!r} must be an (m, n, k, dtype) "
                            f"tuple or a dict of plan()'s keywords")
        p = plan_of(**kw)
        plans.append(p)
        if p.backend == "tensorcore" and isinstance(p.config, KernelConfig):
            desc_kw = {k: v for k, v in kw.items() if k not in ("backend", "autotune", "arch")}
            kp = kernel_problem_for(make_desc(**desc_kw))
            specs.setdefault((p.config, kp.kind, kp.transa, kp.transb, kp.acc,
                              kp.operands_vectorizable()), None)
    bar = None
    if progress and specs:
        from tqdm.auto import tqdm     # a dependency (pyproject.toml)

        bar = tqdm(total=len(specs), desc="pyblasgemm: compiling kernels", unit="kernel")
    try:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers or 4) as ex:
            for _ in ex.map(compiler, specs):
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return plans


def _gpu_compiler():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:          # no CuPy, no driver, no device
        raise RuntimeError(f"precompile: needs CuPy and a GPU ({type(exc).__name__}: "
                           f"{str(exc)[:160]})") from None
    from ..kernels.jit import get_kernels

    return lambda spec: get_kernels(*spec)
