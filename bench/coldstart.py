"""First-run cost of the seed in a fresh process: ``python bench/coldstart.py --backend cpu``.

Prints one JSON object: seconds to import ``runtime``, to ``compile``, for the first run
(where kernels are generated, compiled or loaded from the on-disk cache), for the second
run, and the median of a few steady runs. Run it with an empty ``FORMULA_CACHE_DIR`` and
``NUMBA_CACHE_DIR`` for the cold figure and again with the same directories for the warm
one; ``cold_and_warm`` below does both in subprocesses.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_T0 = time.perf_counter()
REPO = Path(__file__).resolve().parent.parent


def measure(backend: str, tokens: int, dtype: str, steady: int = 5) -> dict:
    sys.path.insert(0, str(REPO))
    import numpy as np

    from bench import programs

    data = programs.seed_data(tokens, dtype)
    program = programs.seed_program(dtype)
    t = time.perf_counter()
    import runtime
    t_import = time.perf_counter() - t
    t = time.perf_counter()
    exe = runtime.compile(program, backend=backend)
    t_compile = time.perf_counter() - t
    times = []
    result = None
    for _ in range(2 + steady):
        t = time.perf_counter()
        result = exe.run(inputs=data["inputs"], banks=data["banks"])["%4"]
        times.append(time.perf_counter() - t)
    rows = programs.sample_rows(tokens)
    np.testing.assert_allclose(np.asarray(result)[0, rows], programs.seed_expected_rows(data, rows),
                               **programs.tolerance(dtype))
    return {"backend": backend, "tokens": tokens, "dtype": dtype,
            "import_s": t_import, "compile_s": t_compile, "first_run_s": times[0],
            "second_run_s": times[1], "steady_median_s": statistics.median(times[2:]),
            "script_total_s": time.perf_counter() - _T0,
            "numba_loaded": "numba" in sys.modules,
            "cache_dir": os.environ.get("FORMULA_CACHE_DIR"),
            "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR")}


def run_once(backend: str, tokens: int, dtype: str, cache: Path, timeout: float = 900) -> dict:
    """One fresh interpreter with the given cache directory; wall time includes startup."""
    env = dict(os.environ, FORMULA_CACHE_DIR=str(cache), NUMBA_CACHE_DIR=str(cache / "numba"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--backend", backend,
           "--tokens", str(tokens), "--dtype", dtype]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"backend": backend, "tokens": tokens, "dtype": dtype, "error": True,
                "returncode": proc.returncode, "process_wall_s": wall,
                "stderr_tail": proc.stderr[-2000:]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    return result


def cold_and_warm(backend: str, tokens: int = 256, dtype: str = "float32", warm_runs: int = 1,
                  cache: Path | None = None) -> list[dict]:
    """Cold (empty cache dirs) then warm (same dirs) runs, each in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="formula-coldstart-") as tmp:
        cache = cache or Path(tmp)
        results = []
        for i in range(1 + warm_runs):
            r = run_once(backend, tokens, dtype, cache)
            r["cache"] = "cold" if i == 0 else "warm"
            results.append(r)
            if r.get("error"):
                break
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--cold-and-warm", action="store_true",
                        help="run cold then warm in fresh subprocesses with a temporary cache")
    args = parser.parse_args(argv)
    if args.cold_and_warm:
        print(json.dumps(cold_and_warm(args.backend, args.tokens, args.dtype), indent=2))
    else:
        print(json.dumps(measure(args.backend, args.tokens, args.dtype)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
