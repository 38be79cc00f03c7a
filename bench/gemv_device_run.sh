#!/bin/bash
# One device call for the GEMV ring work (issue 33, part 1): GPU tests, ring sweep, the full
# bench with the sweep's picks, and Nsight Compute on the gate/up layer. Logs under $OUT (at most
# 8 files). Run from the repository root: GIT_SHA=<sha> bash bench/gemv_device_run.sh
set -u
O=${OUT:-/tmp/gemv_out}; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH=.:bench
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)"
  echo "== tests"; T0=$(date +%s)
  timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider -x tests/test_gemv_gpu.py 2>&1 | tail -25
  echo "tests took $(( $(date +%s) - T0 )) s"
  echo "== sweep"; T0=$(date +%s)
  timeout ${SWEEP_S:-150} python3 bench/gemv_sweep.py --out "$O/sweep.json" --picks "$O/picks.json" 2>&1 | tail -40
  echo "sweep took $(( $(date +%s) - T0 )) s"
  if [ ! -s "$O/picks.json" ]; then echo '{"1": [2,1,1,4,0,null], "2": [2,1,2,2,0,null]}' > "$O/picks.json"; echo "no picks: base"; fi
  cat "$O/picks.json"; echo
  echo "== bench"; T0=$(date +%s)
  timeout ${BENCH_S:-150} python3 bench/gemv_bench.py --out "$O/bench_bf16.json" --tiles-json "$O/picks.json" \
      --tokens 1,2,4,8,16 --dtypes bfloat16 2>&1 | tail -40
  timeout ${BENCH16_S:-90} python3 bench/gemv_bench.py --out "$O/bench_fp16.json" --tiles-json "$O/picks.json" \
      --tokens 1,4,16 --dtypes float16 --layers "llama3-8b o,llama3-8b gate/up,llama3-8b down,qwen2-7b qkv" 2>&1 | tail -16
  echo "bench took $(( $(date +%s) - T0 )) s"
  echo "== ncu"; T0=$(date +%s)
  timeout ${NCU_S:-90} ncu --clock-control none --profile-from-start off --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
      python3 bench/gemv_ncu.py --picks "$O/picks.json" > "$O/ncu.txt" 2>&1
  echo "ncu rc=$? took $(( $(date +%s) - T0 )) s"
  grep -E "profiled:|gemv_kernel|DRAM Throughput|Memory Throughput|Achieved Occupancy|Duration|Registers Per|Stall|==PROF==|Error" "$O/ncu.txt" | head -60
  date -u
} 2>&1 | tee "$O/run.log"
