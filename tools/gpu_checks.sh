#!/usr/bin/env bash
# The reliability checks on a GPU machine, logs under $OUT (the device tool's folder):
#   tools/gpu_checks.sh tests          peer suites (NumPy's, CuPy's) and the API/fuzz tests
#   tools/gpu_checks.sh fuzz MINUTES   the timed hypothesis fuzz (tools/run_fuzz.py)
#   tools/gpu_checks.sh full           the whole GPU suite (-k "not compile": those run in CI)
# CuPy's test files must be in tests/peer/_upstream/ first (tools/fetch_peer_tests.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
case "${1:-tests}" in
  tests)
    python3 -m pytest -q -p no:cacheprovider -ra tests/peer tests/test_reliability.py \
      tests/test_settings.py tests/test_caches.py tests/test_fuzz.py tests/test_gemm.py \
      tests/test_matmul.py tests/test_validation.py 2>&1 | tee "$OUT/tests.log" | tail -60 ;;
  fuzz)
    python3 tools/run_fuzz.py --minutes "${2:-10}" --json "$OUT/fuzz.json" 2>&1 \
      | tee "$OUT/fuzz.log" | tail -25 ;;
  full)
    python3 -m pytest -q -p no:cacheprovider -ra -k "not compile" -n "${2:-8}" tests 2>&1 \
      | tee "$OUT/full.log" | tail -60 ;;
esac
