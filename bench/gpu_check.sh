#!/usr/bin/env bash
# One short device check for a lent GPU (the `device` tool): no network, no install; the tree
# runs as it is (PYTHONPATH), with entry points written by bench/tree_entry_points.py.
#   1. every CUDA test on the real device (larger cases than the simulator's: runtime.testing.real_cuda)
#   2. the seed at 65,536 tokens against CuPy and PyTorch (bench/gpu_seed.py)
#   3. the seed benchmark's cuda rows (bench/run.py --contenders cuda)
#   4. the whole test suite on that machine's CPU (another CPU model than CI's), in parallel
# Each step has its own time limit and writes under $OUT (default bench/results/gpu).
#   run: bash bench/gpu_check.sh [STEP...]     (from the repository root; default: all four)
#   STEP: cuda-tests gpu-seed bench-cuda all-tests
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results/gpu}"
mkdir -p "$OUT"
EP=/tmp/formula-entry-points
PLUGINS=$(python3 bench/tree_entry_points.py "$EP")
export PYTHONPATH=".:$EP:$PLUGINS" PYTHONUNBUFFERED=1 FORMULA_REAL_CUDA=1 NUMBA_ENABLE_CUDASIM=0
export FORMULA_CACHE_DIR=/tmp/formula-cache
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
STEPS="${*:-cuda-tests gpu-seed bench-cuda all-tests}"
step() {  # step NAME SECONDS COMMAND...: SIGINT at the limit, so pytest still prints its summary
    local name=$1 limit=$2; shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    local t0=$SECONDS
    timeout -s INT -k 20 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$OUT/$name.txt" "$OUT/summary.txt"
    tail -4 "$OUT/$name.txt" | tee -a "$OUT/summary.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400
  python3 -c "import sys, numpy, numba, llvmlite; print(sys.version); print('numpy', numpy.__version__, 'numba', numba.__version__, 'llvmlite', llvmlite.__version__)"
  python3 -m pip list 2>/dev/null | grep -i -E "numba|cuda-bindings|cupy|torch |pytest|hypothesis|pluggy|attrs"
} > "$OUT/env.txt" 2>&1
REAL_DEVICE_TESTS="cuda or anchor_without_kernel_for_the_backend or index_range_is_raised_before_any_kernel"
REAL_DEVICE_TESTS+=" or whole_programs_agree_with_the_reference or device_backend_holds_device_copies"
REAL_DEVICE_TESTS+=" or select_chain_with_broadcast_mask or rank0 or unsupported_dtype_is_backend_unavailable"
REAL_DEVICE_TESTS+=" or simulated_runs_of_random_plans or half_precision or reduce_is_sequential_in_index_order"
REAL_DEVICE_TESTS+=" or masked_softmax_values_and_fully_masked_rows or float64_and_unsupported_dtypes"
REAL_DEVICE_TESTS+=" or backends_by_hand or backends_agree_with_the_reference or plugins_report_rows"
step cuda-tests 150 python3 -m pytest -q -p no:cacheprovider $XDIST --tb=short -rfE --durations=10 \
    -k "$REAL_DEVICE_TESTS" tests plugins/formula-norms/tests
step gpu-seed 100 python3 bench/gpu_seed.py "$OUT/gpu_seed.json"
step bench-cuda 80 python3 bench/run.py --contenders cuda --suites seed --coldstart none \
    --out "$OUT/bench-cuda.json"
step all-tests 200 python3 -m pytest -q -p no:cacheprovider $XDIST --tb=short -rfE tests plugins/formula-norms/tests
