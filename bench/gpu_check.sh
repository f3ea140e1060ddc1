#!/usr/bin/env bash
# One short device check for a lent GPU (the `device` tool): no network, no install.
# Runs the CUDA tests on the real device, then the seed at 65,536 tokens; results under $OUT.
#   run: bash bench/gpu_check.sh      (from the repository root; PYTHONPATH=. is set here)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results/gpu}"
mkdir -p "$OUT"
export PYTHONPATH=. FORMULA_REAL_CUDA=1 NUMBA_ENABLE_CUDASIM=0 FORMULA_CACHE_DIR="$OUT/cache"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python -m pytest -q -p no:cacheprovider -k cuda tests plugins/formula-norms/tests \
    > "$OUT/cuda-tests.txt" 2>&1
echo "cuda tests exit $?" >> "$OUT/cuda-tests.txt"
tail -3 "$OUT/cuda-tests.txt"
python bench/gpu_seed.py "$OUT/gpu_seed.json" > "$OUT/gpu_seed.log" 2>&1
echo "gpu_seed exit $?"; cat "$OUT/gpu_seed.json" 2>/dev/null || tail -20 "$OUT/gpu_seed.log"
rm -rf "$OUT/cache"
