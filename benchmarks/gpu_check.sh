#!/usr/bin/env bash
# One prepared GPU check for a session that has the device tool (one H200):
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=420)
# It runs the CUDA tests, the benchmarks at full size and the paper grid on the GPU,
# writes JSON and logs under $OUT, and stops itself within about five minutes.
# The device image has torch, numpy, scipy, pandas and pytest; diskcache travels as a
# wheel in .whl/ (see benchmarks/RESULTS.md for how to fetch it).
set -uo pipefail
OUT=${OUT:-artifacts/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ENGINE_CACHE_DIR=/tmp/engine-cache
if ! python3 -c "import diskcache" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 -c "import torch; print(torch.__version__)"; } \
  > "$OUT/machine.txt" 2>&1

timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_ntk.py tests/test_bench.py \
  2>&1 | tee "$OUT/cuda_tests.log" | tail -3

timeout 90 python3 -m engine bench --device cuda --no-page --json > "$OUT/bench_gpu.json" 2> "$OUT/bench_gpu.log"
cat "$OUT/bench_gpu.json"

timeout 120 python3 benchmarks/paper_grid.py --device cuda > "$OUT/paper_grid.json" 2> "$OUT/paper_grid.log"
tail -2 "$OUT/paper_grid.log"
