"""One bench/blocks.py case on the cpu backend under several environment settings, each in
fresh processes, alternating, medians of ``--reps`` calls per process; ``--noisy`` runs a
CPU-bound process pinned to one core meanwhile (bench/run.py's neighbour).

    python bench/lab/block_settings_ab.py B1-S128 --noisy
    python bench/lab/block_settings_ab.py mlp-T4096-D1024-F4096 --set FORMULA_CONTRACT_PACK_ROWS=0,256,1024
    python bench/lab/block_settings_ab.py B1-S128 --trees ../base   # this tree against another checkout
    python bench/lab/block_settings_ab.py atom-reduce@2-amax-last --trees ../base  # a bench/atom_cases.py case

Default settings: as is; every parallel threshold raised so that every kernel runs serially;
``NUMBA_NUM_THREADS=1``. With ``--trees``, the settings are this tree and each other checkout
(of this repository, at another commit), as is, each with its own kernel cache under
``$FORMULA_CACHE_DIR`` (default: a ``formula-ab`` folder in the temporary directory). A case
that another checkout's bench/blocks.py lacks is taken from this one's, run on that checkout's
runtime; ``atom-<name>`` is a bench/atom_cases.py case (this tree's).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.run import neighbour  # noqa: E402

CHILD = r"""
import importlib.util, sys, time
import numpy as np
sys.path.insert(0, sys.argv[3])
import atoms, runtime  # (the checkout's, bound before this tree's bench modules are loaded)

def here(module):
    # this tree's bench module (a case the checkout lacks), run on the checkout's runtime
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location(f"bench.{module}_ab", f"{sys.argv[4]}/bench/{module}.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    sys.path[:] = path
    return loaded

if sys.argv[1].startswith("atom-"):
    from bench.contenders import prepare_runtime
    case = next(c for c in here("atom_cases").CASES if c.name == sys.argv[1][5:])
    v, p = case.data(np.random.default_rng(0)), case.build()
    run = prepare_runtime("cpu", p, v["inputs"], v["banks"], p["outputs"][0])
else:
    from bench import blocks
    if not any(c.name == sys.argv[1] for c in blocks.cases()):
        blocks = here("blocks")
    case = next(c for c in blocks.cases() if c.name == sys.argv[1])
    run = blocks.prepare("cpu", case, blocks.data(case))
run(); run()
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
print(np.median(times))
"""
SERIAL = {f"FORMULA_{name}_PARALLEL_MIN": str(1 << 40)
          for name in ("CPU", "CONTRACT", "ATTENTION", "COPY", "REDUCE", "ROWS")}
DEFAULT = {"as is": {}, "serial": SERIAL, "one thread": {"NUMBA_NUM_THREADS": "1"}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case")
    p.add_argument("--set", default=None, help="VAR=v1,v2,...: settings of one variable instead of the defaults")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--noisy", action="store_true")
    p.add_argument("--trees", default=None, help="PATH,...: other checkouts to run beside this one")
    args = p.parse_args()
    settings = {name: (env, REPO) for name, env in DEFAULT.items()}
    if args.set:
        var, values = args.set.split("=", 1)
        settings = {f"{var}={v}": ({var: v}, REPO) for v in values.split(",")}
    if args.trees:
        caches = Path(os.environ.get("FORMULA_CACHE_DIR") or Path(tempfile.gettempdir()) / "formula-ab")
        trees = [REPO, *(Path(t).resolve() for t in args.trees.split(","))]
        settings = {f"tree {t}": ({"FORMULA_CACHE_DIR": str(caches / f"tree{k}")}, t) for k, t in enumerate(trees)}
    medians: dict[str, list] = {k: [] for k in settings}
    with neighbour(args.noisy):
        for _ in range(args.rounds):
            for name, (env, repo) in settings.items():
                proc = subprocess.run([sys.executable, "-c", CHILD, args.case, str(args.reps), str(repo), str(REPO)],
                                      env=dict(os.environ, **env), capture_output=True, text=True)
                out = proc.stdout.strip().splitlines()
                medians[name].append(round(float(out[-1]) * 1e3, 2) if proc.returncode == 0 and out
                                     else proc.stderr.strip()[-200:])
    print(json.dumps({"case": args.case, "noisy": args.noisy, "median ms per round": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
