"""The compile worker process (``python -m runtime.execution.compile_worker_main``, started by
``compile_worker.fill_in_worker``): reads its request, a JSON object, from stdin (its priority was
lowered by the lines that started it); fills the disk cache for the program's plan (``compile_worker.fill_cache``). Exit
status 0 when the cache is filled."""
from __future__ import annotations

import json
import sys


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    from runtime.execution.compile_worker import fill_cache
    from runtime.execution.executor import Executable
    from runtime.plugins.registry import default_registry
    from runtime.program.validate import load

    registry = default_registry()
    exe = Executable(load(request["program"], registry, None), request["backend"], registry,
                     request["memory_limit"], tiered=False)
    fill_cache(exe, request["dims"], request["dtypes"], request["resident"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
