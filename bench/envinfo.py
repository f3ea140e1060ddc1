"""What a benchmark process ran with: the variables and thread pools that change the figures.

Collected inside each contender's process at the end of its session, so the thread pools
listed are the ones that process really loaded (a clean NumPy process shows no libgomp and
no numba). Nothing here imports a heavy library: versions come from package metadata.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ENV_VARS = (
    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "NUMBA_ENABLE_CUDASIM",
    "NUMBA_CACHE_DIR", "FORMULA_CACHE_DIR", "FORMULA_REAL_CUDA", "CUDA_VISIBLE_DEVICES",
)
DISTRIBUTIONS = (
    "numpy", "scipy", "numba", "llvmlite", "numba-cuda", "onnx", "onnxruntime", "torch",
    "threadpoolctl", "pytest", "pytest-benchmark", "intel-cmplr-lib-rt", "formula-runtime",
)
WATCHED_MODULES = ("numba", "scipy", "onnxruntime", "torch", "runtime")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_commit(repo: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def thread_pools() -> list[dict[str, Any]]:
    """Every BLAS/OpenMP pool loaded in this process (threadpoolctl loads nothing new)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"error": "threadpoolctl is not installed"}]
    keep = ("user_api", "internal_api", "prefix", "version", "num_threads", "architecture",
            "threading_layer", "filepath")
    return [{k: info.get(k) for k in keep if k in info} for info in threadpool_info()]


def numba_info() -> dict[str, Any] | None:
    """Numba's threading settings, only if this process imported numba."""
    numba = sys.modules.get("numba")
    if numba is None:
        return None
    info: dict[str, Any] = {"num_threads": numba.config.NUMBA_NUM_THREADS,
                            "threading_layer_config": numba.config.THREADING_LAYER}
    try:
        info["threading_layer"] = numba.threading_layer()
    except ValueError:  # no parallel kernel has run in this process
        info["threading_layer"] = "not initialised (no parallel kernel ran)"
    info["cache_dir"] = numba.config.CACHE_DIR
    return info


def peer_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    ort = sys.modules.get("onnxruntime")
    if ort is not None:
        info["onnxruntime"] = {"device": ort.get_device(),
                               "providers": ort.get_available_providers()}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = {"num_threads": torch.get_num_threads(),
                         "interop_threads": torch.get_num_interop_threads()}
    return info


def collect(repo: Path | None = None) -> dict[str, Any]:
    """Everything above, as one JSON-ready dict."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        affinity = os.cpu_count()
    env = {
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "cpu_affinity": affinity,
        "platform": platform.platform(), "python": sys.version.split()[0],
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ENV_VARS},
        "versions": versions(), "thread_pools": thread_pools(), "numba": numba_info(),
        "peers": peer_info(),
        "modules_loaded": [m for m in WATCHED_MODULES if m in sys.modules],
    }
    if repo is not None:
        env["git"] = git_commit(repo)
    return env
