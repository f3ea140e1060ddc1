"""The seed's cpu results for a set of token counts, banks resident and not, saved from one
source tree, to compare two trees bit for bit (a change meant to keep the arithmetic):

    python bench/lab/seed_outputs.py save <tree> <file.npz>
    python bench/lab/seed_outputs.py compare <a.npz> <b.npz>
"""
import sys

import numpy as np

TOKENS = (1, 7, 100, 256, 1000)  # gemv tiles, the dot form, the bcast form


def save(tree: str, path: str) -> None:
    sys.path.insert(0, tree)
    import runtime
    from bench.lab.ab_seed import SEED, seed_values

    results = {}
    for tokens in TOKENS:
        inputs, banks = seed_values(tokens)
        for resident in (True, False):
            exe = runtime.compile(SEED, "cpu", tiered=False)
            run_banks = exe.load_banks(banks) if resident else banks
            for _ in range(3):  # the third run takes the compiled driver
                result = exe.run(inputs=inputs, banks=run_banks)["%4"].copy()
            results[f"T{tokens}-{'resident' if resident else 'arrays'}"] = result
    np.savez(path, **results)
    print(f"saved {len(results)} results of {runtime.__file__}")


def compare(a: str, b: str) -> None:
    x, y = np.load(a), np.load(b)
    same = sorted(x.files) == sorted(y.files) and all(np.array_equal(x[k], y[k]) for k in x.files)
    print("bitwise the same" if same else "DIFFERENT", sorted(x.files))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    (save if sys.argv[1] == "save" else compare)(*sys.argv[2:])
