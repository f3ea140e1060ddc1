"""Compiling generated kernel source so that Numba's on-disk cache works for it.

Numba caches only functions defined in real files, so generated source is written to a file
named by its digest under the cache directory and imported from there: a second process
finds both the file and Numba's compiled cache next to it, and skips compilation.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from pathlib import Path

_lock = threading.Lock()
_modules: dict[str, object] = {}


def cache_dir() -> Path:
    """``FORMULA_CACHE_DIR``, else the user cache dir (e.g. ~/.cache/formula-runtime)."""
    env = os.environ.get("FORMULA_CACHE_DIR")
    if env:
        return Path(env)
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("formula-runtime"))
    except ImportError:  # platformdirs is a dependency; this only guards odd installs
        return Path.home() / ".cache" / "formula-runtime"


def configure_numba_cache() -> None:
    """Point Numba's cache at ours unless the user chose one (must precede @njit(cache=True)).

    Does not import numba: importing ``runtime`` must leave numba's import-time settings
    (``NUMBA_ENABLE_CUDASIM`` above all) to whoever sets them later."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    path = str(cache_dir() / "numba")
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.CACHE_DIR = path
    else:
        os.environ["NUMBA_CACHE_DIR"] = path


def load_generated(source: str, prefix: str = "gen"):
    """Import generated ``source`` as a module (memoised per process) and return it."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"_formula_{prefix}_{digest}"
    with _lock:
        mod = _modules.get(name)
        if mod is not None:
            return mod
        folder = cache_dir() / "generated"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _modules[name] = mod
        return mod
