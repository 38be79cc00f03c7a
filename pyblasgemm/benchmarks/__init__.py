"""The benchmark suite (``python -m pyblasgemm bench``) and its plots, shipped in the package so
that an installed wheel runs them (``bench/`` in the source tree holds the measurement scripts
and ``bench/results/``)."""
