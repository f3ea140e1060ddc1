"""Seconds from an empty kernel cache to the first result, untiered, in this process (imports
excluded): what a deployment without `formula compile` pays once per program and dtypes.

    python bench/lab/cold_compile.py 256          # the seed at T=256
    python bench/lab/cold_compile.py block 512    # the transformer block (D=512, 8 heads, MLP 2048) at S=512

Run it in each tree to compare (it imports the runtime from the current directory).
"""
import os
import sys
import tempfile
import time

os.environ["FORMULA_CACHE_DIR"] = tempfile.mkdtemp(prefix="formula-cold-")
os.environ["FORMULA_TIERED"] = "0"
sys.path.insert(0, os.getcwd())

args = sys.argv[1:]
if args and args[0] == "block":
    from bench import transformer  # noqa: E402

    import runtime  # noqa: E402

    tokens = int(args[1]) if len(args) > 1 else 512
    dims = {"D": 512, "H": 8, "Dh": 64, "F": 2048}
    program = transformer.transformer_block_program(full=True, dims=dims)
    data = transformer.transformer_block_data(tokens, full=True, dims=dims)
    t0 = time.perf_counter()
    runtime.compile(program, "cpu", tiered=False).run(**data)
    what = f"block S={tokens}"
else:
    from bench.programs import seed_data, seed_program  # noqa: E402

    import runtime  # noqa: E402

    tokens = int(args[0]) if args else 256
    data = seed_data(tokens, "float32")
    t0 = time.perf_counter()
    runtime.compile(seed_program("float32"), "cpu", tiered=False).run(**data)
    what = f"seed T={tokens}"
print(f"{what}: compile and first run from an empty cache {time.perf_counter() - t0:.1f} s")
