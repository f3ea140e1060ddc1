"""Seconds from an empty kernel cache to the seed's first result, untiered, in this process
(imports excluded): what a deployment without `formula compile` pays once per shape set.

    python bench/tools/cold_compile.py 256
"""
import os
import sys
import tempfile
import time

os.environ["FORMULA_CACHE_DIR"] = tempfile.mkdtemp(prefix="formula-cold-")
os.environ["FORMULA_TIERED"] = "0"
sys.path.insert(0, os.getcwd())

from bench.contenders import prepare_seed  # noqa: E402
from bench.programs import seed_data, seed_program  # noqa: E402

tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 256
t0 = time.perf_counter()
prepare_seed("cpu", seed_program("float32"), seed_data(tokens, "float32"))()
print(f"seed T={tokens}: compile and first run from an empty cache {time.perf_counter() - t0:.1f} s")
