"""CUDA launch configuration: blocks and threads for ``n`` work items (imports no numba)."""
from __future__ import annotations

THREADS_PER_BLOCK = 128
MAX_BLOCKS = 8192  # grid-stride beyond this: enough blocks to fill any current GPU


def launch_config(n: int, threads_per_block: int = THREADS_PER_BLOCK,
                  max_blocks: int | None = MAX_BLOCKS) -> tuple[int, int]:
    """``(blocks, threads)`` for ``n`` work items: whole warps, at most ``threads_per_block``
    threads a block, so small grids stay small (the CUDA simulator runs every thread in
    Python). ``max_blocks`` caps the grid for a grid-stride kernel; None gives one thread per
    item, for a kernel that is not one. At least one of each, ``n == 0`` included."""
    threads = max(1, min(threads_per_block, 32 * -(-n // 32)))
    blocks = max(1, -(-n // threads))
    return (blocks if max_blocks is None else min(max_blocks, blocks)), threads
