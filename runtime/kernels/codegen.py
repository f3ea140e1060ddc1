"""Compiling generated kernel source so that Numba's on-disk cache works for it.

Numba caches only functions defined in real files, so generated source is written to a file
named by its digest under the cache directory and imported from there: a second process
finds both the file and Numba's compiled cache next to it, and skips compilation.

The cache is trusted (Numba's entries are pickles, run when loaded), so its directory is
created private (0700) and one that other users could write is refused with a warning, as
ssh refuses loose key files; an unusable directory falls back to a private per-process one
(nothing persists). A damaged entry is evicted and recompiled (:func:`heal_numba_cache`).
"""
from __future__ import annotations

import atexit
import functools
import glob
import hashlib
import importlib.util
import logging
import os
import shutil
import stat
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.core import settings
from runtime.kernels.twins import warm_twins  # noqa: F401 (its old home: callers import it from here)

log = logging.getLogger("runtime.cache")
_lock = threading.RLock()
_modules: dict[str, object] = {}
_usable: dict[Path, Path] = {}  # configured dir -> the dir actually used
_healing = False


@functools.lru_cache(maxsize=None)
def file_digest(path: str) -> str:
    """A digest of the file at ``path`` (16 hex digits; "" when it cannot be read), read once."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError:
        return ""


def source_stamp(*files: str | os.PathLike, length: int = 16) -> str:
    """A digest of these source files (name and content): written into generated source by the
    module whose code the generated kernels call or inline, it stands in for a hand-bumped
    version number. Numba's disk cache checks only a function's own (generated) file, so an
    edit of the helpers it calls must rename that file, which this does by itself."""
    text = "|".join(f"{Path(f).name}:{file_digest(str(f))}" for f in files)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def configured_cache_dir() -> Path:
    """``FORMULA_CACHE_DIR``, else the user cache dir (e.g. ~/.cache/formula-runtime)."""
    chosen = settings.CACHE_DIR.read()
    if chosen is not None:
        return chosen
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("formula-runtime"))
    except ImportError:  # platformdirs is a dependency; this only guards odd installs
        return Path.home() / ".cache" / "formula-runtime"


def cache_dir() -> Path:
    """The cache directory in use: the configured one when it is a private directory of this
    user (created 0700 if missing), else a private temporary one for this process."""
    wanted = configured_cache_dir()
    with _lock:
        got = _usable.get(wanted)
        if got is None:
            problem = cache_dir_problem(wanted)
            if problem is None:
                got = wanted
            else:
                got = Path(tempfile.mkdtemp(prefix="formula-cache-"))  # mkdtemp makes it 0700
                atexit.register(shutil.rmtree, got, True)
                log.warning("formula-runtime cache %s is not used: %s; compiling into %s for this "
                            "process only", wanted, problem, got)
            _usable[wanted] = got
        return got


def cache_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot serve as the cache (None when it can); creates it 0700 if missing."""
    if path.exists() and not path.is_dir():
        return "it is not a directory"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(path)
    except OSError as exc:
        return f"it cannot be created or read ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"it is writable by other users (mode {stat.S_IMODE(st.st_mode):o}), and the cache "
                f"holds pickles that run when loaded; chmod go-w {path} to use it")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"it belongs to another user (uid {st.st_uid}), and the cache holds pickles that run when loaded"
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def heal_numba_cache() -> None:
    """Make Numba's disk cache self-healing (once per process): an entry that fails to load
    (truncated or corrupt index or data, an inconsistent pickle, or code compiled for other
    argument types) is evicted with a warning and the function recompiled; a failure to save
    one only costs the cache."""
    global _healing
    with _lock:
        if _healing:
            return
        from numba.core import caching

        load, save = caching.Cache.load_overload, caching.Cache.save_overload

        def load_overload(self, sig, target_context):
            try:
                got = load(self, sig, target_context)
            except Exception as exc:  # numba raises whatever unpickling raised
                _evict(self, exc)
                return None
            args = getattr(getattr(got, "signature", None), "args", None)
            want = getattr(sig, "args", sig)  # (the argument types, or a Signature of them)
            if got is not None and args is not None and isinstance(want, (tuple, list)) \
                    and tuple(args) != tuple(want):
                # another overload's code under this one's entry: two processes saving overloads
                # of one function at once can both take a data file's name (Numba picks the first
                # free one from the index each read), and called with these arguments it failed
                # with "can't unbox array" (a cold cache, two test workers)
                _evict(self, TypeError(f"the entry for {tuple(want)} holds code for {tuple(args)}"))
                return None
            if got is not None:
                from runtime.kernels import compilelog

                compilelog.note_loaded(getattr(self, "_name", "?"))
            return got

        def save_overload(self, sig, data):
            try:
                save(self, sig, data)
            except Exception as exc:
                log.warning("could not save a Numba cache entry for %s (%s: %s); it stays compiled "
                            "in memory", getattr(self, "_name", "?"), type(exc).__name__, exc)

        caching.Cache.load_overload = load_overload
        caching.Cache.save_overload = save_overload
        _healing = True


def _evict(cache, exc: BaseException) -> None:
    index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    removed = []
    if index:
        base = index[: -len(".nbi")]
        for path in [index, *glob.glob(glob.escape(base) + ".*.nbc")]:
            try:
                os.remove(path)
                removed.append(os.path.basename(path))
            except OSError:
                pass
    log.warning("evicted an unreadable Numba cache entry %s (%s: %s; removed %s); recompiling",
                index or "?", type(exc).__name__, exc, ", ".join(removed) or "nothing")


def configure_numba_cache() -> None:
    """Point Numba's cache at ours unless the user chose one (must precede @njit(cache=True)).

    Does not import numba: importing ``runtime`` must leave numba's import-time settings
    (``NUMBA_ENABLE_CUDASIM`` above all) to whoever sets them later."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    path = str(cache_dir() / "numba")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:  # Numba then finds no locator there and caches nothing: still correct
        pass
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.CACHE_DIR = path
    else:
        os.environ["NUMBA_CACHE_DIR"] = path


READY = "ready"  # the cache's folder of readiness markers (ready_marker)


def ready_marker(key: str) -> Path:
    """The file saying that every kernel (and variant) of the plans keyed by ``key`` is in the
    cache: a tiered run that finds it loads them in the foreground instead of running on the
    reference kernels first (see ``runtime.execution.tiers.Tiers``)."""
    return cache_dir() / READY / hashlib.sha256(key.encode()).hexdigest()[:32]


def mark_ready(key: str) -> None:
    """Write ``ready_marker(key)``; a cache that cannot be written just stays unmarked."""
    path = ready_marker(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


def _own_files(root: Path) -> tuple[list[Path], list[Path]]:
    """(generated sources, their bytecode and readiness markers; Numba entries) of the cache
    at ``root``: the only files ``formula cache clear`` removes."""
    generated = []
    folder = root / "generated"
    if folder.is_dir():
        generated = [p for p in folder.glob("_formula_*.py") if p.is_file()]
        pycache = folder / "__pycache__"
        if pycache.is_dir():
            generated += [p for p in pycache.glob("_formula_*.pyc") if p.is_file()]
    if (root / READY).is_dir():
        generated += [p for p in (root / READY).iterdir() if p.is_file() and len(p.name) == 32]
    numba_dir = _numba_dir(root)
    entries = []
    if numba_dir.is_dir():
        entries = [p for p in numba_dir.rglob("*") if p.is_file() and p.suffix in (".nbi", ".nbc")]
    return generated, entries


def _numba_dir(root: Path) -> Path:
    return Path(os.environ["NUMBA_CACHE_DIR"]) if os.environ.get("NUMBA_CACHE_DIR") else root / "numba"


def cache_info() -> dict:
    """Where the cache is and what it holds: ``location``, ``exists``, ``bytes``, ``files``
    (generated sources and Numba entries), ``numba_cache_dir`` (ours unless ``NUMBA_CACHE_DIR``)."""
    root = configured_cache_dir()
    generated, entries = _own_files(root)
    files = generated + entries
    size = 0
    for path in files:
        try:
            size += path.stat().st_size
        except OSError:  # removed meanwhile by another process
            pass
    numba_dir = _numba_dir(root)
    return {"location": str(root), "exists": root.is_dir(), "bytes": size, "files": len(files),
            "generated_files": len(generated), "numba_files": len(entries),
            "numba_cache_dir": str(numba_dir), "numba_cache_is_ours": numba_dir == root / "numba",
            "variable": settings.CACHE_DIR.name}


def clear_cache() -> int:
    """Remove the cache's own files (generated kernel sources and Numba entries under the
    cache directory; a ``NUMBA_CACHE_DIR`` elsewhere is left alone) and the folders they
    leave empty; other files there stay. Returns how many files were removed."""
    root = configured_cache_dir()
    generated, entries = _own_files(root)
    if _numba_dir(root) != root / "numba":
        entries = []
    removed = 0
    for path in generated + entries:
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    for folder in sorted({p.parent for p in generated + entries}, key=lambda p: len(p.parts), reverse=True):
        while folder != root and root in folder.parents:
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break
            folder = folder.parent
    return removed


class Source:
    """Generated source, built in the order it reads: a docstring, its imports (each line once,
    in the order first asked for), then lines, indented by the blocks they are added in.

    ``add`` takes lines (a string without a newline is one line, kept as written), a text
    block (a string with newlines: dedented, its own relative indentation kept), an iterable
    of lines, or another ``Source`` (a fragment: its lines, its imports joined to these);
    each at the current depth. ``block(header)`` adds ``header`` and indents what is added
    inside the ``with``; ``indented(levels)`` indents without a header. ``text()`` is the
    module; ``lines`` the body alone, for a fragment spliced elsewhere."""

    INDENT = "    "

    def __init__(self, doc: str | None = None, imports: Iterable[str] = ()):
        self.doc = doc
        self._imports: dict[str, None] = {}
        self._lines: list[str] = []
        self._depth = 0
        self.imports(*imports)

    def imports(self, *lines: str) -> Source:
        """Import lines (each once; an empty one is skipped)."""
        self._imports.update((line, None) for line in lines if line)
        return self

    def add(self, *parts: str | Iterable[str] | Source) -> Source:
        pad = self.INDENT * self._depth
        for part in parts:
            if isinstance(part, Source):
                self.imports(*part._imports)
                lines = part._lines
            elif isinstance(part, str):
                lines = textwrap.dedent(part).strip("\n").split("\n") if "\n" in part else [part]
            else:
                lines = list(part)
            self._lines += [pad + line if line else line for line in lines]
        return self

    @contextmanager
    def block(self, header: str) -> Iterator[Source]:
        """``header`` (``for ...:``, ``def ...:``), then what the ``with`` adds, one level in."""
        self.add(header)
        with self.indented():
            yield self

    @contextmanager
    def indented(self, levels: int = 1) -> Iterator[Source]:
        self._depth += levels
        try:
            yield self
        finally:
            self._depth -= levels

    @property
    def lines(self) -> list[str]:
        """The body's lines (no docstring, no imports)."""
        return list(self._lines)

    def module_lines(self) -> list[str]:
        """The docstring line, the imports, then the body's lines."""
        return ([f'"""{self.doc}"""'] if self.doc is not None else []) + list(self._imports) + self._lines

    def text(self) -> str:
        return "\n".join(self.module_lines()) + "\n"


def load_generated(source: str, prefix: str = "gen", loaded_only: bool = False):
    """Import generated ``source`` as a module (memoised per process) and return it;
    ``loaded_only``: None unless this process has imported it already."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"_formula_{prefix}_{digest}"
    if loaded_only:
        return _modules.get(name)
    with _lock:
        mod = _modules.get(name)
        if mod is not None:
            return mod
        folder = cache_dir() / "generated"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = folder / f"{name}.py"
        if _stale(path, source):
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _modules[name] = mod
        return mod


def _stale(path: Path, source: str) -> bool:
    """Whether the generated file is missing or differs from ``source`` (damaged included)."""
    try:
        return path.read_text(encoding="utf-8") != source
    except (OSError, ValueError):
        return True
