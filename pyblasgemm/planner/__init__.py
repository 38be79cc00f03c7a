"""The planner: which backend, kernel config and decomposition runs a GEMM, and why.

For every problem (a validated ``GemmDesc``) the planner enumerates our kernels' candidate
configs (tile shapes x decompositions: sliced-k, serial/parallel split-k, stream-k, hybrid),
rejects the invalid ones with the reason (one predicate: ``KernelConfig.validate`` with the
device's limits), scores the rest and cuBLAS with an analytic cost model calibrated on the
H100 measurements in ``bench/results/`` (``calibration_h100.json``; see
:mod:`pyblasgemm.planner.model` and ``tools/calibrate.py``), and returns a frozen
:class:`Plan`. On the measured device (an H100 SXM), a table of measured choices
(:mod:`pyblasgemm.planner.measured`) overrides the model at and near the public suite's shapes. Plans are memoized per (device, problem); ``autotune=True`` / :func:`tune` time
the top candidates on the GPU and persist the winners on disk.

Public API::

    plan(m, n, k, dtype, *, compute, transa, transb, lda, ldb, ldc, batch, ..., backend,
         autotune, arch) -> Plan
    tune(m, n, k, dtype, *, ..., top, repeats, warmup, cache) -> Plan
    plan_for(desc, backend=None, *, autotune=None, arch=None) -> Plan      (internal form)
    clear_plan_cache()
    Plan.explain(limit=12) -> str

Example::

    >>> import pyblasgemm
    >>> p = pyblasgemm.plan(512, 512, 32768, "float16", transa="T")
    >>> p.backend                               # calibrated: cuBLAS is faster on an H100
    'cublas'
    >>> q = pyblasgemm.plan(512, 512, 32768, "float16", transa="T", backend="tensorcore")
    >>> q.decomposition.startswith("splitk")    # few output tiles, long K
    True

Environment variables (all ``PYBLASGEMM_*``; parsed and validated by
:mod:`pyblasgemm.settings`, read on first use, re-read after :func:`clear_plan_cache`; a bad
value raises ``SettingError`` naming the variable, the value and what is allowed; booleans take
1/0, true/false, yes/no, on/off):

``PYBLASGEMM_BACKEND``          'auto' (default), 'tensorcore', 'cublas' or 'host' (or
                                'pyblasgemm', the alias ``backend=`` takes for 'tensorcore'):
                                force a backend for every call without ``backend=``.
``PYBLASGEMM_DECOMPOSITION``    force our kernels' decomposition: 'sliced', 'splitk_serial',
                                'splitk_parallel', 'streamk' or 'hybrid' (candidates of other
                                decompositions are not considered).
``PYBLASGEMM_SPLITS``           with a split-k decomposition: force the split count.
``PYBLASGEMM_CONFIG``           force one kernel config by name, e.g.
                                ``hybrid_128x128x32_w2x2_s4_g8`` (``KernelConfig.name``).
``PYBLASGEMM_PRINT_PLANS``      '1': print ``Plan.explain()`` to stderr for every new plan.
``PYBLASGEMM_NO_PLAN_CACHE``    '1': do not memoize plans in memory (plan every call).
``PYBLASGEMM_PLAN_CACHE_SIZE``  entries the plan cache keeps (plans, bound launches with their
                                workspace, call signatures; default 1024; least recently used
                                go first; see ``pyblasgemm.get_plan_cache()``).
``PYBLASGEMM_AUTOTUNE``         '1': autotune every new problem on the GPU (as ``autotune=True``).
``PYBLASGEMM_INVARIANT``        '1': batch-invariant results for every call without
                                ``invariant=`` (:mod:`pyblasgemm.planner.invariant`).
``PYBLASGEMM_NO_MEASURED_CHOICES`` '1': ignore the measured-choice table
                                (``choices_sm90_h100.json``, :mod:`pyblasgemm.planner.measured`):
                                the cost model alone decides.
``PYBLASGEMM_CACHE_DIR``        directory of the autotune cache (default
                                ``$XDG_CACHE_HOME/pyblasgemm/``, else ``~/.cache/pyblasgemm/``);
                                compiled sm_90a kernels go under ``kernels/`` there.
``PYBLASGEMM_CACHE_MAX_MB``     MiB each disk cache keeps (default 1024); the oldest entries go
                                after a write (``python -m pyblasgemm cache info|clear``).
``PYBLASGEMM_NO_KERNEL_CACHE``  '1': compile sm_90a kernels anew in every process.
``PYBLASGEMM_NO_TUNE_CACHE``    '1': neither read nor write autotuned winners on disk.
``PYBLASGEMM_ARCH``             'sm_80', 'sm_86', 'sm_89' or 'sm_90': plan with that family's
                                datasheet spec instead of the device's (default without a GPU:
                                sm_90, the H100).
``PYBLASGEMM_FP32_COMPUTE``     default ``compute=`` of float32 problems ('fp32', 'tf32',
                                '3xtf32', or the aliases ``compute=`` takes: 'ieee', 'highest',
                                'tf32x3', 'high'; see ``pyblasgemm.set_default_compute``).
``PYBLASGEMM_RESULTS_DIR``      where ``bench`` writes its results without ``--out`` (default
                                ``~/.local/share/pyblasgemm/bench/``).

Logging: every new plan (never a memoized one) is logged at DEBUG on the ``pyblasgemm`` logger
with its problem and reason, kernel compiles at INFO with their duration, an autotune miss
and its winner at INFO, an unusable kernel- or autotune-cache entry at INFO beside its warning; ``pyblasgemm.explain(a, b)`` gives the plan of a
call from its arrays. Warnings derive from ``pyblasgemm.PyblasgemmWarning``.

Command line: ``python -m pyblasgemm plan M N K --dtype f16 --trans NT`` prints the explanation
(without a GPU it plans for the default H100 spec and says so); ``python -m pyblasgemm tune ...``
tunes on the GPU and stores the winner.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal

from .core import Candidate, Plan, clear_plan_cache, plan_for
from .arch import ArchSpec, FAMILIES
from .problem import make_desc
from .precompile import precompile

if TYPE_CHECKING:     # types only (pyblasgemm._typing)
    from .._typing import Activation, Backend, Compute, Trans

__all__ = ["Plan", "Candidate", "ArchSpec", "FAMILIES", "plan", "tune", "plan_for",
           "clear_plan_cache", "make_desc", "precompile"]


def _arch_arg(arch):
    if arch is None or isinstance(arch, ArchSpec):
        return arch
    if isinstance(arch, str) and arch.lower() in FAMILIES:
        return FAMILIES[arch.lower()]
    raise ValueError(f"arch={arch!r} must be an ArchSpec or one of {tuple(FAMILIES)}")


def plan(m: int, n: int, k: int, dtype: Any = "float16", *, compute: Compute | None = None,
         transa: Trans = "N", transb: Trans = "N", lda: int | None = None,
         ldb: int | None = None, ldc: int | None = None, batch: int = 1,
         stride_a: int | None = None, stride_b: int | None = None, stride_c: int | None = None,
         device: int = 0, align: int = 16, backend: Backend | None = None,
         autotune: bool = False, arch: ArchSpec | str | None = None,
         activation: Activation | None = None, bias: Literal["m", "n"] | None = None,
         preactivation: bool = False, invariant: bool | None = None) -> Plan:
    """The plan the library would use for a column-major GEMM of these sizes on the GPU.

    ``dtype``: float16, bfloat16, float32, float64, int8, complex64, complex128 (or 'f16',
    'bf16', 'f32', 'f64', 'i8', 'c64', 'c128'; 'tf32' and '3xtf32' mean float32 with that
    compute). ``transa``/``transb``: 'N', 'T' ('C' for complex). Leading dimensions default to
    the tight ones, batch strides to packed matrices; ``align`` is the pointers' byte
    alignment. ``backend`` forces one; ``autotune=True`` measures (GPU only); ``arch`` ('sm_80',
    ..., or an ``ArchSpec``) plans for another GPU. Without a GPU the H100 spec is used.
    ``activation``, ``bias`` (``'m'``: one value per row of C, ``'n'``: per column) and
    ``preactivation``: an epilogue, whose route (fused in our kernel's store, in cuBLASLt's
    epilogue, or unfused) the plan records in ``Plan.epilogue`` and ``explain()`` prints.
    ``invariant=True``: a batch-invariant plan (:mod:`pyblasgemm.planner.invariant`; None: the
    ``PYBLASGEMM_INVARIANT`` setting).

    Example::

        >>> import pyblasgemm
        >>> p = pyblasgemm.plan(8192, 8192, 8192, "f32", compute="3xtf32")
        >>> p.backend, p.config.bm > 0                 # cuBLAS has no 3xTF32 mode
        ('tensorcore', True)
        >>> print(p.explain())                         # doctest: +ELLIPSIS
        problem: ...
        >>> q = pyblasgemm.plan(4096, 4096, 4096, "f16", activation="relu", bias="m", backend="cublas")
        >>> q.epilogue.line
        'cuBLASLt epilogue RELU_BIAS (fused in the GEMM)'
    """
    from ..desc import check_backend
    from .overrides import resolve_invariant

    desc = make_desc(m, n, k, dtype, compute=compute, transa=transa, transb=transb, lda=lda,
                     ldb=ldb, ldc=ldc, batch=batch, stride_a=stride_a, stride_b=stride_b,
                     stride_c=stride_c, device=device, align=align, activation=activation, bias=bias,
                     preactivation=preactivation, invariant=resolve_invariant("plan", invariant))
    return plan_for(desc, check_backend("plan", backend), autotune=autotune, arch=_arch_arg(arch))


def tune(m: int, n: int, k: int, dtype: Any = "float16", *, compute: Compute | None = None,
         transa: Trans = "N", transb: Trans = "N", lda: int | None = None,
         ldb: int | None = None, ldc: int | None = None, batch: int = 1,
         stride_a: int | None = None, stride_b: int | None = None, stride_c: int | None = None,
         device: int = 0, align: int = 16, top: int = 8, repeats: int = 20,
         warmup: int = 3, cache: bool = True, include_cublas: bool = True, progress: bool = True,
         timer: Callable[[Any, Any], float] | None = None) -> Plan:
    """Autotune one problem on the GPU: time the ``top`` candidates the cost model ranks best
    (plus cuBLAS), honestly (warm-up, L2 flushed before each timed call, shuffled order, median
    of ``repeats``), persist the winner in the autotune cache and return its plan.

    Needs a GPU (raises ``RuntimeError`` without one) unless ``timer`` is given: a callable
    ``timer(candidate, desc) -> seconds`` that replaces the measurement (tests use a fake one).

    Example::

        >>> import pyblasgemm
        >>> p = pyblasgemm.tune(4096, 4096, 4096, "f16")        # doctest: +SKIP
        >>> p.source                                            # doctest: +SKIP
        'autotune'
    """
    from .autotune import tune_desc

    desc = make_desc(m, n, k, dtype, compute=compute, transa=transa, transb=transb, lda=lda,
                     ldb=ldb, ldc=ldc, batch=batch, stride_a=stride_a, stride_b=stride_b,
                     stride_c=stride_c, device=device, align=align)
    plan = tune_desc(desc, top=top, repeats=repeats, warmup=warmup, cache=cache,
                     include_cublas=include_cublas, progress=progress, timer=timer)
    clear_memo_for(desc)
    return plan


def clear_memo_for(desc) -> None:
    """Drop the memoized plans, launches and call signatures of one problem, with or without
    an epilogue (after tuning it: its launch may change). Call signatures are keyed by
    arguments, not problems, so all of them go."""
    from ..desc import GemmDesc
    from ..plancache import get_plan_cache

    # the problem is the key's fields before the epilogue; the epilogue, the group and the
    # invariance that follow it vary between calls of one problem, and all go with it
    cut = GemmDesc._fields.index("epilogue")
    product = desc.key[:cut]

    def of_problem(k):
        return (k[0] in ("plan", "launch") and isinstance(k[1], tuple) and len(k[1]) == len(desc.key)
                and k[1][:cut] == product)

    get_plan_cache().discard_where(lambda k: of_problem(k) or k[0] == "call")
