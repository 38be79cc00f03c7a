#!/usr/bin/env bash
# The reliability checks on a GPU machine, logs under $OUT (the device tool's folder). Steps run
# in the order given:
#   peer          CuPy's and NumPy's own matmul/gemm tests against pyblasgemm (tests/peer)
#   tests         the API, settings, cache and fuzz tests (fuzz at its default example count)
#   fuzz:MINUTES  the timed hypothesis fuzz (tools/run_fuzz.py), e.g. fuzz:6.5
#   full[:N]      the whole GPU suite, N pytest workers (-k "not compile": those run in CI)
# CuPy's test files must be in tests/peer/_upstream/ first (tools/fetch_peer_tests.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/device.txt"
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
PYTEST="python3 -m pytest -q -p no:cacheprovider -ra"
for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    peer)  $PYTEST tests/peer 2>&1 | tee "$OUT/peer.log" | tail -15 ;;
    tests) $PYTEST tests/test_reliability.py tests/test_settings.py tests/test_caches.py \
             tests/test_fuzz.py tests/test_gemm.py tests/test_matmul.py tests/test_validation.py \
             2>&1 | tee "$OUT/tests.log" | tail -25 ;;
    fuzz:*) python3 tools/run_fuzz.py --minutes "${step#fuzz:}" --json "$OUT/fuzz.json" 2>&1 \
             | tee "$OUT/fuzz.log" | tail -12 ;;
    full*) workers=${step#full}; workers=${workers#:}
           $PYTEST -k "not compile" -n "${workers:-8}" tests 2>&1 | tee "$OUT/full.log" | tail -40 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
