"""Markdown report from bench/run.py's merged JSON: ``python bench/report.py RUN.json -o docs/performance.md``.

Per case the median milliseconds of every contender, and how many times faster the ``cpu``
backend is than each peer (peer median / cpu median; below 1 means the peer wins). Cases or
contenders that did not run are shown as "—" and listed with the reason they were skipped.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ORDER = ("cpu", "reference", "cuda", "numpy", "numpy_inplace", "onnxruntime", "torch")
PEERS = ("numpy", "numpy_inplace", "onnxruntime", "torch")
BASELINE = "cpu"
LABELS = {"cpu": "formula cpu", "reference": "formula reference", "cuda": "formula cuda",
          "numpy": "NumPy (as written)", "numpy_inplace": "NumPy (in place)",
          "onnxruntime": "ONNX Runtime", "torch": "PyTorch"}

METHOD = """\
## Method

- **Clean processes.** `bench/run.py` runs `pytest` once per contender
  (`--bench-contenders=<name>`), so each process loads only its own thread pools: NumPy's
  OpenBLAS, scipy's OpenBLAS and Numba's libgomp (runtime backends), or ONNX Runtime's pool.
  In one shared process NumPy measured 11.6 ms at T=2048 next to Numba against 2.6–4.0 ms
  alone, so no two contenders ever share one. Peer processes run with `-p no:formula_runtime`, and each
  process records which thread pools it actually loaded (table below).
- **Default environment.** Nothing is set by the driver: `OPENBLAS_CORETYPE`,
  `OPENBLAS_L2_SIZE` and thread counts are whatever the machine has, and are recorded.
- **What is timed.** One call computing the seed output `%4 = base + gain·(silu(x·Aᵀ)·Bᵀ)`
  for B=1, S=T, Din=Dout=1024, R=32 (or one atom for the micro-benchmarks), inputs already
  in memory. Compilation, session creation, buffer allocation and one warm-up call are
  excluded (cold/warm first-run costs are reported separately). pytest-benchmark defaults:
  calibrated rounds, at least 5, about 1 s per case; the figure is the median.
- **Contenders.** formula `cpu` (Numba), `reference` (NumPy oracle), `cuda` (real GPU
  only); NumPy as written (every step allocates); NumPy with preallocated buffers and
  in-place ufuncs; ONNX Runtime CPU (MatMul→Sigmoid→Mul→MatMul→Mul→Add, default
  optimisations, banks as transposed initializers, io_binding onto kept-alive arrays and a
  preallocated output); PyTorch eager (inference mode). The runtime returns a fresh output
  array per call; the in-place NumPy and ONNX Runtime contenders reuse theirs.
- **Checked.** Every contender's output is compared with a float64 NumPy evaluation of
  sampled rows (written with `einsum`, no BLAS, so the check wakes no BLAS pool), also in
  the quick mode `pytest bench --benchmark-disable`.
- **Caveats.** The machine is shared and noisy: treat differences under ~15 % as noise and
  rerun before relying on one. threadpoolctl does not see ONNX Runtime's own pool (default
  intra-op threads). The `numpy` atom process also loads scipy (for `erf` in gelu), hence
  a second, idle OpenBLAS pool there.
"""


def _fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _fmt_ratio(num: float | None, den: float | None) -> str:
    if not num or not den:
        return "—"
    return f"{num / den:.2f}×"


def medians(merged: dict[str, Any], suite: str) -> dict[str, dict[str, float]]:
    """group -> contender -> median seconds."""
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for b in merged.get("benchmarks", []):
        if b.get("suite") == suite and b.get("stats", {}).get("median") is not None:
            name = b["contender"] + (" (shared process)" if b.get("shared_process") else "")
            table[b["group"]][name] = b["stats"]["median"]
    return table


def _group_key(group: str):
    m = re.match(r"seed-(\w+)-T(\d+)$", group)
    if m:
        return (m.group(1), int(m.group(2)))
    m = re.match(r"block-B(\d+)-S(\d+)$", group)  # blocks by tokens, before the other cases
    return ("", int(m.group(1)) * int(m.group(2))) if m else (group, 0)


def noisy_table(quiet: dict[str, dict[str, float]], noisy: dict[str, dict[str, float]]) -> list[str]:
    """Per case and contender: quiet and noisy-neighbour medians and the slowdown."""
    present = [c for c in ORDER if any(c in row for row in noisy.values())]
    head = ["case", *[f"{LABELS.get(c, c)} slowdown" for c in present]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in sorted(noisy, key=_group_key):
        cells = [group.removeprefix("block-")]
        for c in present:
            q, n = quiet.get(group, {}).get(c), noisy[group].get(c)
            cells.append(f"{_fmt_ratio(n, q)} ({_fmt_ms(q)} → {_fmt_ms(n)} ms)" if q and n else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def rss_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| contender | peak RSS MiB | RSS after data MiB |", "|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {LABELS.get(r['contender'], r['contender'])} | failed: {r['error'][:100]} | |")
        else:
            lines.append(f"| {LABELS.get(r['contender'], r['contender'])} | {r['peak_rss_mib']} | {r['data_rss_mib']} |")
    return lines


def case_table(table: dict[str, dict[str, float]], first_col: str, label=lambda g: g) -> list[str]:
    present = [c for c in ORDER if any(c in row for row in table.values())]
    present += sorted({c for row in table.values() for c in row} - set(present))
    peers = [p for p in present if p in PEERS] if BASELINE in present else []
    head = [first_col, *[f"{LABELS.get(c, c)} ms" for c in present]]
    head += [f"cpu vs {LABELS.get(p, p)}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in sorted(table, key=_group_key):
        row = table[group]
        cells = [label(group), *[_fmt_ms(row.get(c)) for c in present]]
        cells += [_fmt_ratio(row.get(p), row.get(BASELINE)) for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    if BASELINE not in present:
        lines += ["", f"No speed-up column: the `{BASELINE}` backend was not timed in this run "
                      "(see *Not measured*)."]
    return lines


def skip_summary(merged: dict[str, Any]) -> list[str]:
    lines = []
    for proc in merged.get("processes", []):
        reasons: dict[str, int] = defaultdict(int)
        for s in proc.get("skipped", []):
            reasons[re.sub(r"^Skipped: ", "", s["reason"])] += 1
        for reason, n in sorted(reasons.items()):
            lines.append(f"- `{proc['contender']}`: {n} case(s) skipped: {reason}")
        if proc.get("failed"):
            ids = ", ".join(f"`{f['nodeid']}`" for f in proc["failed"][:5])
            lines.append(f"- `{proc['contender']}`: FAILED {len(proc['failed'])}: {ids}")
        if proc.get("returncode") not in (0, 5, None) and not proc.get("failed"):
            lines.append(f"- `{proc['contender']}`: process exited with {proc['returncode']}")
    return lines


def _pools(env: dict[str, Any] | None) -> str:
    if not env:
        return "not recorded"
    parts = []
    for p in env.get("thread_pools", []):
        if "error" in p:
            return p["error"]
        name = Path(p.get("filepath") or p.get("prefix") or "?").name
        arch = f", {p['architecture']}" if p.get("architecture") else ""
        parts.append(f"{p.get('internal_api')} {p.get('version') or ''} ({name}{arch}, {p.get('num_threads')} thr)")
    numba = env.get("numba")
    if numba:
        parts.append(f"numba layer {numba.get('threading_layer')}, {numba.get('num_threads')} thr")
    return "; ".join(parts) or "none loaded"


def environment(merged: dict[str, Any]) -> list[str]:
    env = merged.get("environment") or {}
    v = env.get("versions", {})
    shown = ", ".join(f"{k} {v[k]}" for k in ("numpy", "scipy", "numba", "llvmlite", "onnxruntime",
                                                "torch", "pytest-benchmark") if v.get(k))
    variables = ", ".join(f"`{k}={val}`" for k, val in env.get("env", {}).items() if val) or "none set"
    git = env.get("git") or {}
    lines = [f"- CPU: {env.get('cpu_model')}, {env.get('cpu_count')} logical CPUs "
             f"({env.get('cpu_affinity')} usable); {env.get('platform')}; Python {env.get('python')}",
             f"- Versions: {shown}",
             f"- Environment variables: {variables}",
             f"- Commit: `{git.get('commit')}`{' (uncommitted changes)' if git.get('dirty') else ''}",
             "", "| process | thread pools loaded | other heavy modules |", "|---|---|---|"]
    for proc in merged.get("processes", []):
        penv = proc.get("environment") or {}
        mods = ", ".join(penv.get("modules_loaded", [])) or "—"
        lines.append(f"| {proc['contender']} | {_pools(penv)} | {mods} |")
    return lines


def coldstart(merged: dict[str, Any]) -> list[str]:
    rows = merged.get("coldstart") or []
    if not rows:
        return ["Not measured in this run (`bench/run.py --coldstart cpu`)."]
    lines = ["| backend | T | cache | compile s | first run s | second run s | steady ms | process wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            last = (r.get("stderr_tail") or "").strip().splitlines()[-1:] or ["?"]
            lines.append(f"| {r['backend']} | {r['tokens']} | {r.get('cache')} | failed: {last[0][:120]} | | | | |")
            continue
        lines.append(f"| {r['backend']} | {r['tokens']} | {r['cache']} | {r['compile_s']:.3f} | "
                     f"{r['first_run_s']:.3f} | {r['second_run_s']:.4f} | {r['steady_median_s'] * 1e3:.3f} | "
                     f"{r['process_wall_s']:.2f} |")
    return lines


def method(merged: dict[str, Any]) -> str:
    rounds = merged.get("rounds", 1)
    if rounds <= 1:
        return METHOD
    return METHOD.rstrip("\n") + (f"\n- **Rounds.** Every contender ran in {rounds} rounds of fresh "
                                  "processes, in a rotated order; each figure is the median round's median.\n\n")


def reproduce_command(recorded: str) -> str:
    """The recorded bench/run.py command as a clone can type it: ``python`` for the
    interpreter that ran it, ``bench/results/run.json`` for its output, no ``--report``."""
    words = shlex.split(recorded)[1:]
    out, k = ["python"], 0
    while k < len(words):
        if words[k] in ("--out", "--report"):
            k += 2  # the flag and its value
            continue
        if not words[k].startswith(("--out=", "--report=")):
            out.append(words[k])
        k += 1
    out += ["--out", "bench/results/run.json"]
    return shlex.join(out)


# --- gradients and training (bench/training.py; suites grad, train, remat) ---------------------------

GRAD_TARGETS = {"seed": 1.0, "mlp": 1.0, "block": 0.9}  # issues 33 and 34: torch eager / cpu at least this


def _by_mode(merged: dict[str, Any], suite: str, key: str) -> dict[str, dict[tuple[str, str], float]]:
    """group -> (contender, extra_info[key]) -> median seconds."""
    table: dict[str, dict[tuple[str, str], float]] = defaultdict(dict)
    for b in merged.get("benchmarks", []):
        if b.get("suite") == suite and b.get("stats", {}).get("median") is not None:
            table[b["group"]][(b["contender"], str(b.get("extra_info", {}).get(key)))] = b["stats"]["median"]
    return table


def _case_order(group: str):
    name = group.split("-", 1)[1]
    kind = name.split("-", 1)[0]
    return (("seed", "mlp", "block").index(kind) if kind in ("seed", "mlp", "block") else 9,
            [int(n) for n in re.findall(r"\d+", name)])


def _fresh(merged: dict[str, Any], contender: str, case: str, remat: str | None, cache: str | None = None):
    for r in merged.get("training_fresh") or []:
        if r.get("contender") == contender and r.get("case") == case and not r.get("error") and \
                (contender == "torch" or r.get("remat") == remat) and (cache is None or r.get("cache") == cache):
            return r
    return None


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2 ** 20:.1f}"


def grad_table(merged: dict[str, Any]) -> list[str]:
    table = _by_mode(merged, "grad", "mode")
    if not table:
        return []
    head = ["case", "cpu forward ms", "cpu backward ms", "cpu fwd+bwd ms (vjp program)", "cpu split ms",
            "torch forward ms", "torch fwd+bwd ms", "torch backward ms", "cpu backward / forward (≤ 2)",
            "torch / cpu fwd+bwd (target)", "torch fwd+bwd / cpu split"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in sorted(table, key=_case_order):
        row, name = table[group], group.removeprefix("grad-")
        cpu = {m: row.get(("cpu", m)) for m in ("forward", "backward", "fwdbwd", "split")}
        tor = {m: row.get(("torch", m)) for m in ("forward", "fwdbwd", "backward")}
        target = GRAD_TARGETS.get(name.split("-", 1)[0])
        lines.append("| " + " | ".join([
            name, *[_fmt_ms(cpu[m]) for m in ("forward", "backward", "fwdbwd", "split")],
            *[_fmt_ms(tor[m]) for m in ("forward", "fwdbwd", "backward")],
            _fmt_ratio(cpu["backward"], cpu["forward"]),
            f"{_fmt_ratio(tor['fwdbwd'], cpu['fwdbwd'])} (≥ {target})" if target else _fmt_ratio(tor["fwdbwd"], cpu["fwdbwd"]),
            _fmt_ratio(tor["fwdbwd"], cpu["split"])]) + " |")
    return lines


def train_table(merged: dict[str, Any]) -> list[str]:
    table = _by_mode(merged, "train", "case")
    if not table:
        return []
    head = ["case", "cpu step ms", "torch step ms", "torch / cpu (target)", "cpu first step s",
            "torch first step s", "cpu peak RSS MiB", "torch peak RSS MiB", "cpu saved MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in sorted(table, key=_case_order):
        name = group.removeprefix("train-")
        cpu, tor = table[group].get(("cpu", name)), table[group].get(("torch", name))
        fc = _fresh(merged, "cpu", name, "save-all", "warm") or _fresh(merged, "cpu", name, "save-all", "as-is")
        cold = _fresh(merged, "cpu", name, "save-all", "cold")
        ft = _fresh(merged, "torch", name, None)
        target = GRAD_TARGETS.get(name.split("-", 1)[0])
        first = f"{fc['first_step_s']:.2f}" if fc else "—"
        lines.append("| " + " | ".join([
            name, _fmt_ms(cpu), _fmt_ms(tor), f"{_fmt_ratio(tor, cpu)} (≥ {target})",
            first + (f" (cold caches {cold['first_step_s']:.2f})" if cold else ""),
            f"{ft['first_step_s']:.2f}" if ft else "—",
            str(fc["peak_rss_mib"]) if fc else "—", str(ft["peak_rss_mib"]) if ft else "—",
            _mib(fc["saved_bytes"]) if fc else "—"]) + " |")
    return lines


def remat_table(merged: dict[str, Any]) -> list[str]:
    table = _by_mode(merged, "remat", "remat")
    if not table:
        return []
    head = ["policy", "step ms", "saved MiB", "peak RSS MiB", "first step s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in sorted(table):
        case = group.removeprefix("remat-")
        for (contender, remat), median in sorted(table[group].items(), key=lambda kv: kv[0][0] == "torch"):
            fresh = _fresh(merged, contender, case, None if contender == "torch" else remat)
            saved = next((b["extra_info"].get("saved_bytes") for b in merged["benchmarks"]
                          if b.get("suite") == "remat" and b["contender"] == contender
                          and str(b["extra_info"].get("remat")) == remat), None)
            label = "torch eager (autograd)" if contender == "torch" else f"{contender} `{remat}`"
            lines.append("| " + " | ".join([
                label, _fmt_ms(median), _mib(saved), str(fresh["peak_rss_mib"]) if fresh else "—",
                f"{fresh['first_step_s']:.2f}" if fresh else "—"]) + " |")
    return lines


def training_sections(merged: dict[str, Any]) -> list[str]:
    """The gradient, training-step and recompute-policy tables, where the run has them."""
    out: list[str] = []
    grad = grad_table(merged)
    if grad:
        out += ["", "## Forward+backward (median ms per call; bench/test_grad.py)", "",
                "Gradients for every floating bank with one fixed cotangent; torch eager on the same "
                "threads (`torch.autograd.grad`). *split*: the forward that keeps what the backward "
                "reads, then the backward (what `runtime.torch.Module` runs); *backward*: that backward "
                "alone.", ""] + grad
    train = train_table(merged)
    if train:
        out += ["", "## A training step (forward, MSE, backward, AdamW; bench/test_train.py)", "",
                "`runtime.torch.Module` (save-all) against the same model in torch eager. First step "
                "(the runtime's vjp, split, compile and kernels, with the kernel caches as they are; "
                "`--fresh-cold` adds a first step with empty ones) and peak RSS: a fresh process per "
                "row (`--fresh`).", ""] + train
    remat = remat_table(merged)
    if remat:
        out += ["", "## Recompute policies on the block (bench/test_remat.py)", "",
                "A `runtime.torch.Module` step under each `remat` policy; saved: the bytes kept for the "
                "backward; peak RSS and first step from fresh processes (`--fresh`).", ""] + remat
    return out


def render(merged: dict[str, Any], source: str = "(merged JSON)",
           noisy: dict[str, Any] | None = None) -> str:
    """The whole docs/performance.md text."""
    out = ["# Performance", "",
           f"Generated by `bench/report.py` from `{source}` ({merged.get('created')}). "
           "Regenerate with the commands below; do not edit the tables by hand.", "",
           "## Reproduce", "",
           "From a clone, in the virtual environment of the README's test command (the run "
           "writes its merged JSON under `bench/results/`, which is not committed):", "", "```sh",
           reproduce_command(merged.get("command", "python bench/run.py")),
           "python bench/report.py bench/results/run.json -o docs/performance.md", "```", "",
           method(merged)]
    seed = medians(merged, "seed")
    out += ["## The seed program (median ms per call; B=1, S=T)", ""]
    out += case_table(seed, "case", lambda g: "{} T={}".format(*_group_key(g))) if seed else ["No seed case was timed."]
    atoms = medians(merged, "atoms")
    out += ["", "## One atom per program (median ms per call)", ""]
    out += case_table(atoms, "atom case", lambda g: g.removeprefix("atom-")) if atoms else ["No atom case was timed."]
    blocks = medians(merged, "blocks")
    if blocks:
        out += ["", "## General programs (median ms per call; bench/blocks.py)", ""]
        out += case_table(blocks, "case", lambda g: g.removeprefix("block-"))
    overhead = medians(merged, "overhead")
    if overhead:
        out += ["", "## One run's own cost (median ms per call; bench/test_overhead.py)", ""]
        out += case_table(overhead, "case", lambda g: g.removeprefix("overhead-"))
    if merged.get("peak_rss"):
        out += ["", "## Peak RSS on the block at (B, S) = (4, 512) (fresh process per contender)", ""]
        out += rss_table(merged["peak_rss"])
    out += training_sections(merged)
    if noisy:
        out += ["", "## Noisy neighbour (a CPU-bound process pinned to one core; noisy median / quiet median)", "",
                f"Quiet: this report's run; noisy: `{noisy.get('command')}` ({noisy.get('created')}).", ""]
        out += noisy_table(blocks, medians(noisy, "blocks"))
    out += ["", "## Cold and warm first run (fresh process, seed, float32)", "",
            "Cold: empty `FORMULA_CACHE_DIR` and `NUMBA_CACHE_DIR`; warm: the same directories "
            "again in a new process.", ""]
    out += coldstart(merged)
    out += ["", "## Machine and environment", ""] + environment(merged)
    skips = skip_summary(merged)
    out += ["", "## Not measured", ""] + (skips or ["Everything selected ran."])
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("merged", type=Path)
    p.add_argument("-o", "--output", type=Path, default=None, help="write here instead of stdout")
    p.add_argument("--noisy", type=Path, default=None,
                   help="merged JSON of a bench/run.py --noisy run: adds the slowdown table")
    p.add_argument("--training", action="store_true",
                   help="only the gradient, training-step and recompute-policy tables (a fragment)")
    args = p.parse_args(argv)
    merged = json.loads(args.merged.read_text())
    noisy = json.loads(args.noisy.read_text()) if args.noisy else None
    if args.training:
        text = "\n".join([f"<!-- bench/report.py --training {args.merged} ({merged.get('created')}): "
                          f"{reproduce_command(merged.get('command', 'python bench/run.py'))} -->",
                          *training_sections(merged)]) + "\n"
    else:
        text = render(merged, source=str(args.merged), noisy=noisy)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
