"""The package's one warning base and its logger.

Every warning pyblasgemm issues derives from :class:`PyblasgemmWarning`, so one filter silences
(or turns into errors) all of them::

    >>> import warnings, pyblasgemm
    >>> warnings.simplefilter("ignore", pyblasgemm.PyblasgemmWarning)    # doctest: +SKIP
    >>> from pyblasgemm.planner.autotune import CacheWarning
    >>> issubclass(CacheWarning, pyblasgemm.PyblasgemmWarning)
    True

``log`` is ``logging.getLogger("pyblasgemm")``: cold paths only (a plan made, a fallback, a
kernel compiled with its duration, a kernel-cache miss or an unusable entry), at DEBUG/INFO; a
repeated call with the same signature logs nothing (the fast paths never touch it).
"""
from __future__ import annotations

import logging

__all__ = ["PyblasgemmWarning", "log"]

#: the package's logger; child loggers (``pyblasgemm.dask``) propagate to it
log = logging.getLogger("pyblasgemm")


class PyblasgemmWarning(UserWarning):
    """Base of every warning pyblasgemm issues (cache, choice-table and kernel-cache warnings):
    one filter silences or raises them all.

    >>> import warnings, pyblasgemm
    >>> from pyblasgemm.planner.autotune import CacheWarning
    >>> issubclass(CacheWarning, pyblasgemm.PyblasgemmWarning)
    True
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", pyblasgemm.PyblasgemmWarning)
    ...     try:
    ...         warnings.warn("stale entry", CacheWarning)
    ...     except pyblasgemm.PyblasgemmWarning as w:
    ...         print(type(w).__name__, w)
    CacheWarning stale entry
    """
