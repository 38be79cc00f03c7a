#!/usr/bin/env bash
# One device call: every GPU test, then the measurements, logs and JSON under $OUT.
# Usage (on the GPU machine, repo root): OUT=/some/dir bash bench/run_all_gpu.sh [planner budget s]
set -o pipefail
export PYTHONPATH=.:bench PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pytest -q --tb=short --maxfail=30 -p no:cacheprovider -k "not compile" tests \
    2>&1 | tee "$OUT/gpu_tests.log" | tail -12
python3 bench/bench_foundation.py "$OUT/foundation.json" 2>&1 | tail -9
python3 bench/bench_backends.py "$OUT/backends.json" 2>&1 | tail -15
python3 bench/profile_host.py 2>&1 | tee "$OUT/profile_host.log" | head -12
python3 -m pyblasgemm tune 1000 1000 1001 --dtype i8 --trans TN --top 3 --repeats 5 2>&1 | tail -4
python3 bench/bench_planner.py "$OUT/planner.json" --budget "${1:-120}" 2>&1 | tail -15
python3 bench/bench_sm90.py --out "$OUT/sm90.json" 2>&1 | tail -16
