set -o pipefail
cd .dev/wt-dask
export PYTHONPATH=.:bench XDG_CACHE_HOME=/tmp/xdg GIT_SHA=7725cb0
t0=$(date +%s)
pip install --no-deps --no-index ../whl-dask/*.whl > $OUT/info.txt 2>&1 || echo "pip failed" >> $OUT/info.txt
mkdir -p /tmp/xdg && cp -r ../kc/xdg/. /tmp/xdg/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader >> $OUT/info.txt
nvidia-smi topo -m >> $OUT/info.txt 2>&1
python3 -c "import dask, distributed, dask_cuda, cupy; print('dask', dask.__version__, 'distributed', distributed.__version__, 'dask_cuda', dask_cuda.__version__, 'cupy', cupy.__version__)" >> $OUT/info.txt 2>&1
echo "setup $(( $(date +%s)-t0 )) s" >> $OUT/info.txt
timeout 250 python3 bench/dask_scaling.py --gpus 1,2 --transport ipc --cases "32768^3 float16,32768^3 bfloat16,16384^3 float64" --schedule start,runs --latency --trace --reps 5 --threaded-check "32768^3 float16" --dask-array-cases "32768^3 float16" --budget-s 240 --out $OUT/dask_scaling.json > $OUT/bench.log 2>&1
echo "bench rc $? at $(( $(date +%s)-t0 )) s" >> $OUT/info.txt
grep -v "^  trace\|^wrote" $OUT/bench.log | tail -45
timeout 140 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_dask_gpu.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $? at $(( $(date +%s)-t0 )) s" >> $OUT/info.txt
tail -25 $OUT/gpu_tests.log; cat $OUT/info.txt | tail -8
