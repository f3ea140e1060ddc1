"""Every ``FORMULA_*`` environment setting, declared once: its name, default, parsing, what it
does, why its value, and the command that measured it where one exists.

Modules read a setting through its declaration (``settings.CPU_PARALLEL_MIN.read()``), at the
moment they always did: tuning constants once, at import; behaviour switches per call, so a
changed environment (``monkeypatch.setenv``) takes effect. A malformed value never raises a
bare ``ValueError``: a tuning value is ignored with a warning on the ``runtime.core.settings``
logger naming the setting and what was expected; the two limits that were refused before
(``FORMULA_MAX_PROGRAM_BYTES``, ``FORMULA_MEMORY_LIMIT``) are a ``FormulaError`` (``schema``).

``docs/tuning.md`` is generated from these declarations (``python -m runtime.core.tuning >
docs/tuning.md``); ``tests/test_settings.py`` keeps the two in sync and checks that no other
module of ``runtime/``, ``atoms/`` or ``plugins/formula-norms`` reads a ``FORMULA_*`` variable.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from runtime.core.errors import fail

log = logging.getLogger(__name__)

GROUPS = {
    "tuning": "Tuning: thresholds and sizes of the CPU kernels (read once, at import)",
    "behaviour": "Behaviour: switches and limits (read when used)",
    "tests": "Tests: how hard the test suite tries (read by the tests)",
}
# (name, value) pairs already warned about: settings read per call warn once, not every run
_warned: set[tuple[str, str]] = set()


@attrs.frozen
class Setting:
    """One ``FORMULA_*`` variable. ``parse`` turns the raw text into the value or raises
    ``ValueError``; ``strict`` settings then raise ``FormulaError`` (``schema`` at ``path``),
    the others keep ``default`` and log a warning."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    expected: str  # what a valid value is, for messages and the docs
    group: str  # a key of GROUPS
    read_at: str  # "import" or "call": when its module reads it
    module: str  # where it is read
    does: str
    why: str
    measured: str = ""  # the command (and figures) behind the value, when there is one
    shown: str = ""  # the default as the docs show it, when repr(default) says too little
    strict: bool = False
    path: str = ""  # the FormulaError path of a strict setting ("" → "$env.<name>")

    def read(self) -> Any:
        """The value from the environment now, else the default."""
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError:
            if self.strict:
                fail("schema", self.path or f"$env.{self.name}", f"{self.name} must be {self.expected}, got {raw!r}")
            if (self.name, raw) not in _warned:
                _warned.add((self.name, raw))
                log.warning("%s=%r is not %s: using the default, %s", self.name, raw, self.expected,
                            self.shown or repr(self.default))
            return self.default


SETTINGS: dict[str, Setting] = {}


def declare(setting: Setting) -> Setting:
    if setting.name in SETTINGS or not setting.name.startswith("FORMULA_") or setting.group not in GROUPS:
        raise AssertionError(f"bad declaration of {setting.name}")  # a registry typo, caught on import
    SETTINGS[setting.name] = setting
    return setting


# --- parsers: raise ValueError on a malformed value ----------------------------------------
def integer(raw: str) -> int:
    return int(raw)  # as the modules parsed it: whitespace, a sign and underscores allowed


def decimal(raw: str) -> float:
    return float(raw)


def choice(on: tuple[str, ...], off: tuple[str, ...], normalise: bool = False) -> Callable[[str], bool]:
    """A switch: True for a value in ``on``, False for one in ``off`` (stripped and lower-cased
    first when ``normalise``), anything else malformed."""
    def parse(raw: str) -> bool:
        value = raw.strip().lower() if normalise else raw
        if value in on:
            return True
        if value in off:
            return False
        raise ValueError(raw)
    return parse


def present(raw: str) -> bool:
    """Set to anything non-empty (the variable's presence is the switch)."""
    return bool(raw)


def directory(raw: str) -> Path | None:
    return Path(raw) if raw else None  # empty: as if unset


def positive_integer(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(raw)
    return value


_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_AMOUNT = re.compile(r"^\s*([0-9]+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
BYTES_EXPECTED = "a positive number of bytes (e.g. 4000000000, 512M, 16G)"


def byte_amount(text: str) -> int:
    """Bytes from ``"4000000000"`` or ``"512M"``/``"16GiB"`` (powers of 1024)."""
    m = _AMOUNT.match(text)
    if not m or int(m.group(1)) < 1:
        raise ValueError(text)
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def optional_amount(raw: str) -> int | None:
    return None if not raw.strip() else byte_amount(raw)  # blank: as if unset


EARLIER = "measured earlier (figures in docs/performance.md at commit 3ee2aae; not re-measured since)"


def _tuning(name: str, default: int, module: str, does: str, why: str, measured: str = "", shown: str = "") -> Setting:
    return declare(Setting(name, default, integer, "an integer", "tuning", "import", module, does, why,
                           measured, shown))


# --- tuning ---------------------------------------------------------------------------------
CPU_PARALLEL_MIN = _tuning(
    "FORMULA_CPU_PARALLEL_MIN", 1 << 16, "runtime/backends/cpu_codegen.py (PARALLEL_MIN_ELEMENTS)",
    "Elements of work below which a generated fused elementwise or reduction kernel runs on one thread.",
    "Below it a parallel region costs more than it saves.", EARLIER, "65536 (64 Ki elements)")
CPU_DYNAMIC_CHUNKS = _tuning(
    "FORMULA_CPU_DYNAMIC_CHUNKS", 16, "runtime/backends/cpu_codegen.py (DYNAMIC_CHUNKS)",
    "Chunks of tasks per parallel loop nest of a generated kernel, taken by the workers from an "
    "atomic ticket (runtime/kernels/atomic.py).",
    "Taken dynamically, a worker slowed by a busy core leaves its chunks to the others; "
    "`numba.set_parallel_chunksize`, used before, dealt them out statically under the omp layer, "
    "so such a worker still ran its half.",
    "An earlier experiment (docs/performance.md at commit ff5d359); "
    "`python -m pytest -q tests/test_atomic.py` checks, without timing, that a stalled worker leaves "
    "every task to the other. The count 16 itself has no recorded measurement.")
COPY_PARALLEL_MIN = _tuning(
    "FORMULA_COPY_PARALLEL_MIN", 1 << 16, "atoms/_copy.py (PARALLEL_MIN_ELEMENTS)",
    "Elements below which a strided copy (layout and gather-family atoms) runs on one thread.",
    "Waking the other threads costs more than the copy saves below it.", shown="65536 (64 Ki elements)")
CONTRACT_SCRATCH = _tuning(
    "FORMULA_CONTRACT_SCRATCH", 256 * 1024, "atoms/contract/tiles.py (SCRATCH_BYTES)",
    "Bytes of a row tile's GEMM result ([tm, n] in the accumulation dtype), which sets the rows per tile.",
    "The tile's result stays cache-resident while the epilogue reads it; wide contractions use "
    "FORMULA_CONTRACT_PACK_ROWS instead.", EARLIER, "262144 (256 KiB)")
CONTRACT_PARALLEL_MIN = _tuning(
    "FORMULA_CONTRACT_PARALLEL_MIN", 1 << 21, "atoms/contract/tiles.py (PARALLEL_MIN_MACS)",
    "Multiply-adds below which a contraction runs on one thread.",
    "A parallel region costs about 10 µs or more, more than it saves below it.", shown="2097152 (2 Mi MACs)")
CONTRACT_BLOCKED_TILES = _tuning(
    "FORMULA_CONTRACT_BLOCKED_TILES", 1, "atoms/contract/tiles.py (BLOCKED_TILES_PER_THREAD)",
    "Tiles per thread of the blocked (packed right operand) GEMM.",
    "Every tile streams the whole packed right operand, so at few rows one tile per thread streams "
    "it half as often: the 128-row block 2-4 % faster than at two, with a busy neighbour too, "
    "and the wide MLP and the 512-row block alike.",
    "`python bench/lab/block_settings_ab.py B1-S128 --set FORMULA_CONTRACT_BLOCKED_TILES=1,2 "
    "--reps 40 --rounds 4` (and `--noisy`), the same for B1-S512 and mlp-T4096-D1024-F4096 "
    "(docs/performance.md, tuning log).")
CONTRACT_PACK_ROWS = _tuning(
    "FORMULA_CONTRACT_PACK_ROWS", 512, "atoms/contract/tiles.py (PACK_ROWS)",
    "Least rows of a BLAS row tile when the right operand is too big to stay cached (over "
    "PACKED_RIGHT_BYTES, 1 MiB); 0 turns it off.",
    "Every BLAS call packs the whole right operand, so longer tiles re-pack it less often; 512 keeps "
    "a worker's tile result at 8 MiB for N = 4096.",
    "`python bench/lab/block_settings_ab.py mlp-T4096-D1024-F4096 --reps 5 --set "
    "FORMULA_CONTRACT_PACK_ROWS=0,256,1024` (figures in docs/performance.md at commit a3e1f64).")
REDUCE_PARALLEL_MIN = _tuning(
    "FORMULA_REDUCE_PARALLEL_MIN", 1 << 18, "atoms/reduce.py (PARALLEL_MIN_WORK)",
    "Elements read below which a reduce kernel runs on one thread.",
    "A parallel region costs more than it saves below it.", shown="262144 (256 Ki elements)")
ROWS_PARALLEL_MIN = _tuning(
    "FORMULA_ROWS_PARALLEL_MIN", 1 << 16, "atoms/_rows.py (PARALLEL_MIN_ELEMENTS)",
    "Elements below which a row kernel (scatter@2, segment, window) runs serially.",
    "A parallel launch costs more than it saves below it.", shown="65536 (64 Ki elements)")
ATTENTION_PARALLEL_MIN = _tuning(
    "FORMULA_ATTENTION_PARALLEL_MIN", 1 << 21, "runtime/kernels/attention.py (PARALLEL_MIN_MACS)",
    "Multiply-adds (rows × visible keys × head dim, as if unmasked) below which the fused "
    "attention kernel runs on one thread.",
    "A parallel region costs more than it saves below it.", shown="2097152 (2 Mi MACs)")

# --- behaviour ------------------------------------------------------------------------------
FUSED_ATTENTION = declare(Setting(
    "FORMULA_FUSED_ATTENTION", True, choice(("1",), ("0",)), "0 or 1", "behaviour", "call",
    "runtime/plan/attention.py (find)",
    "`0` keeps attention unfused on cpu: the planner does not replace `contract → [scalar chain] → "
    "masked-softmax → contract` by the fused-attention node.",
    "On: the fused kernel never writes the scores; off gives the unfused plan from the same build, "
    "for comparisons.",
    "The comparison commands in docs/performance.md, *Fused attention on cpu* "
    "(`FORMULA_FUSED_ATTENTION=0|1 python bench/run.py --suites blocks …`).", "1 (fused)"))
FUSED_NORMS = declare(Setting(
    "FORMULA_FUSED_NORMS", True, choice(("1",), ("0",)), "0 or 1", "behaviour", "call",
    "runtime/plan/rmsnorm.py (find)",
    "`0` keeps RMS norms unfused on cpu: the planner does not replace `scale(x, x) → reduce@2 mean → "
    "add → rsqrt → scale [→ scale by a gain]` by the fused-rms-norm node.",
    "On: each row is read while it is in L1 and the square is never written; off gives the unfused "
    "plan from the same build, for comparisons.",
    "`FORMULA_FUSED_NORMS=0|1 python bench/lab/trace_blocks.py B1-S512` (docs/performance.md, "
    "tuning log).", "1 (fused)"))
TIERED = declare(Setting(
    "FORMULA_TIERED", True, choice(("1", "true", "yes", "on", ""), ("0", "false", "no", "off"), normalise=True),
    "one of 0, false, no, off (tiering off) or 1, true, yes, on", "behaviour", "call",
    "runtime/execution/tiers.py (tiered_default)",
    "Tiered first runs on cpu when `compile(tiered=)` is not given: runs whose kernels are not "
    "compiled yet execute on the reference kernels while a background thread compiles them.",
    "On: the first result does not wait for the compiler; off (`0`) when every run must use the "
    "compiled kernels (timing, tests).", shown="on (cpu only)"))
COMPILE_WORKER = declare(Setting(
    "FORMULA_COMPILE_WORKER", True, choice(("1", ""), ("0",), normalise=True), "0 or 1", "behaviour", "call",
    "runtime/execution/tiers.py (Tiers._compile)",
    "`0` compiles a tiered executable's kernels in a thread of the caller's process instead of a "
    "worker process (which fills the disk cache at `FORMULA_COMPILE_NICE`, for the thread to load).",
    "On: Numba holds the GIL while it compiles, and the first tier's runs beside an in-process "
    "compile waited for it at every NumPy call; a worker leaves the caller's GIL to its runs. "
    "Executables of a registry a new process cannot rebuild (plugins registered in code) always "
    "compile in-process.",
    "`FORMULA_COMPILE_WORKER=0|1 python bench/first_tier.py --fresh` (docs/performance.md).", "1 (worker)"))
PIN_THREADS = declare(Setting(
    "FORMULA_PIN_THREADS", False, choice(("1",), ("0", ""), normalise=True), "one of 0, 1", "behaviour", "call",
    "runtime/kernels/threads.py (setting)",
    "`1` pins Numba's worker threads one per CPU of the affinity mask (Linux, omp or workqueue "
    "layer), from a calling thread's third run; the calling thread stays free.",
    "Off: in the benchmark harness's quiet seed runs pinned threads once ran 1.6× slower in three "
    "processes of six, and later a little slower in four alternating pairs of five, for a reason "
    "not found yet; pinned helps beside a busy core.",
    "`python bench/lab/block_settings_ab.py <case> --set FORMULA_PIN_THREADS=0,1 --noisy` and "
    "`FORMULA_PIN_THREADS=0|1 python bench/run.py --suites seed --contenders cpu --coldstart none` "
    "(docs/performance.md).", "0 (not pinned)"))
COMPILE_NICE = declare(Setting(
    "FORMULA_COMPILE_NICE", 10, integer, "an integer (0 to 19 used)", "behaviour", "call",
    "runtime/execution/background.py (compile_nice)",
    "How many nice steps the background compiles (a tier's plan, a plan's drivers) run below "
    "the thread that started them (Linux: each thread's own nice value); 0 leaves them at its "
    "priority.",
    "10: a compile beside runs that fill the cores takes the time they leave rather than a core of "
    "theirs; the seed's runs at T=8192 slowed by a median 1.30x during a background compile at 10, "
    "2.22x at 0 (2 processes each, a shared 2-core machine).",
    "`python bench/background_compile.py --nice 0,10 --rounds 2` (docs/performance.md).", "10"))
CACHE_DIR = declare(Setting(
    "FORMULA_CACHE_DIR", None, directory, "a directory path", "behaviour", "call",
    "runtime/kernels/codegen.py (configured_cache_dir)",
    "Where generated kernel sources, Numba's compiled code (unless NUMBA_CACHE_DIR) and readiness "
    "markers are kept; `formula cache info` shows it.",
    "The user cache dir persists compiled kernels across processes; it must be private to the user "
    "(docs/security.md).", shown="the user cache dir (~/.cache/formula-runtime on Linux)"))
MAX_PROGRAM_BYTES = declare(Setting(
    "FORMULA_MAX_PROGRAM_BYTES", 64 * 1024 * 1024, positive_integer, "a positive integer", "behaviour", "call",
    "runtime/program/loader.py (max_program_bytes)",
    "Cap on program text (bytes) read by `load_program` when `max_bytes=` is not given.",
    "Untrusted text is bounded before it is parsed (docs/security.md); the figure has no recorded measurement.",
    shown="67108864 (64 MiB)", strict=True, path="$"))
MEMORY_LIMIT = declare(Setting(
    "FORMULA_MEMORY_LIMIT", None, optional_amount, BYTES_EXPECTED, "behaviour", "call",
    "runtime/plan/memory.py (memory_limit)",
    "The runtime's memory ceiling for an executable when `compile(memory_limit=)` is not given "
    "(bytes, or with a K/M/G/T suffix, powers of 1024).",
    "A program may raise its own limits but not this one; by default the memory the machine has "
    "available when the executable is made.", shown="the machine's available memory", strict=True))
DEBUG = declare(Setting(
    "FORMULA_DEBUG", False, present, "any non-empty value", "behaviour", "call", "runtime/cli.py (main)",
    "Set: the CLI re-raises an unexpected error with its traceback instead of one line.",
    "Users get one line; developers ask for the traceback.", shown="unset"))
DISABLE_PLUGIN_AUTOLOAD = declare(Setting(
    "FORMULA_DISABLE_PLUGIN_AUTOLOAD", False, present, "any non-empty value", "behaviour", "call",
    "runtime/plugins/registry.py (Registry)",
    "Set: a registry made without `autoload=` loads no entry-point plugins (built-ins only).",
    "Plugins load by default; this isolates a run from installed plugins.", shown="unset"))
REAL_CUDA = declare(Setting(
    "FORMULA_REAL_CUDA", False, choice(("1",), ("0", "")), "0 or 1", "tests", "call",
    "runtime/testing.py (real_cuda: plugins' tests call it), tests/conftest.py",
    "`1`: the tests run CUDA kernels on the device instead of Numba's simulator, with more and "
    "larger cases.",
    "CI has no GPU; `bench/gpu_check.sh` sets it on a GPU machine.", shown="0 (simulator)"))

# --- tests ----------------------------------------------------------------------------------
FUZZ_EXAMPLES = declare(Setting(
    "FORMULA_FUZZ_EXAMPLES", 120, integer, "an integer", "tests", "import", "tests/spec/test_fuzz.py (EXAMPLES)",
    "Hypothesis examples per fuzzing property.", "CI's budget; a long run raises it (docs/security.md)."))
FUZZ_CASES = declare(Setting(
    "FORMULA_FUZZ_CASES", 3000, integer, "an integer", "tests", "import", "tests/spec/test_fuzz.py (CASES)",
    "Cases of the bounded mutation loop.", "CI's budget; a long run raises it (docs/security.md)."))
FUZZ_SECONDS = declare(Setting(
    "FORMULA_FUZZ_SECONDS", 45.0, decimal, "a number of seconds", "tests", "import",
    "tests/spec/test_fuzz.py (BUDGET_S)",
    "Time budget of the bounded mutation loop.", "CI's budget; a long run raises it (docs/security.md)."))
FUZZ_SEED = declare(Setting(
    "FORMULA_FUZZ_SEED", 17, integer, "an integer", "tests", "call", "tests/spec/test_fuzz.py (test_bounded_mutation_loop)",
    "Seed of the bounded mutation loop.", "Fixed, so a failure in CI reproduces; vary it in a long run."))
DRIVER_EXAMPLES = declare(Setting(
    "FORMULA_DRIVER_EXAMPLES", 8, integer, "an integer", "tests", "import", "tests/test_driver.py",
    "Hypothesis examples of the compiled-driver property test.", "Each example compiles a driver: kept small for CI."))

