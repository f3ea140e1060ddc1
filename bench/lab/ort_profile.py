"""ONNX Runtime's own per-node profile of one bench/blocks.py case (the graph and session
options of its contender): median ms per node over the calls after the first 20, largest
first. Compare with ``python bench/lab/trace_blocks.py <case>`` for the runtime's kernel groups.

    python bench/lab/ort_profile.py B1-S512 [--calls 220] [--threads 1]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import blocks  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", help=f"of: {', '.join(c.name for c in blocks.cases())}")
    p.add_argument("--calls", type=int, default=220)
    p.add_argument("--threads", type=int, default=None, help="ORT's intra-op threads (default: one per core)")
    args = p.parse_args()
    case = next(c for c in blocks.cases() if c.name == args.case)
    values = blocks.data(case)
    session = blocks.onnxruntime_session(case, values, str(Path(tempfile.mkdtemp(prefix="ort-profile-")) / "ort"),
                                          args.threads)
    feeds = blocks.onnxruntime_feeds(session, values)
    for _ in range(args.calls):
        session.run(None, feeds)
    per: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for event in json.loads(Path(session.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per[(event["name"].removesuffix("_kernel_time"), event["args"].get("op_name", "?"))].append(event["dur"])
    rows = sorted(((k, float(np.median(d[20:] or d)) / 1e3) for k, d in per.items()), key=lambda r: -r[1])
    print(f"{case.name}: {len(rows)} nodes, {sum(ms for _, ms in rows):.2f} ms in all")
    for (name, op), ms in rows:
        print(f"  {ms:8.3f} ms  {op:<12} {name}")


if __name__ == "__main__":
    main()
