"""Kernels that come as a serial and a parallel variant (chosen by the extents) have both
built by ``warm()``: an extent that crosses the parallel threshold afterwards compiles
nothing (a compile counter, not a timing)."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.build import ProgramBuilder
from runtime.kernels import compilelog

D, J = 256, 96
ACC = {"accumulation_dtype": "float32"}


def _at(name: str, version: int = 1) -> str:
    return f"arti/formula-atom-{name}@{version}"


def _indices(b):
    return b.input("idx", {"J": J}, "int64")


CASES = {
    "reduce@1": lambda b, x: b.op("reduce", [x], {"axis": "D", "mode": "sum", **ACC}),
    "reduce@2 sum": lambda b, x: b.op(_at("reduce", 2), [x], {"axis": "D", "mode": "sum", **ACC}),
    "reduce@2 logsumexp": lambda b, x: b.op(_at("reduce", 2), [x], {"axis": "D", "mode": "logsumexp", **ACC}),
    "window@1": lambda b, x: b.op(_at("window"), [x], {
        "axis": "T", "output_axis": "P", "window_axis": "K", "kernel_size": 2, "stride": 1, "dilation": 1,
        "padding": [1, 0], "output_size": "T"}),
    "permute": lambda b, x: b.op("permute", [x], {"output_axes": ["D", "T"]}),
    "gather@2": lambda b, x: b.op(_at("gather", 2), [x, _indices(b)], {"axis": "D", "index_axis": "J"}),
    "scatter@2": lambda b, x: b.op(_at("scatter", 2), [x, _indices(b), b.input("upd", {"T": "T", "J": J})],
                                   {"axis": "D", "index_axis": "J", "mode": "add", **ACC}),
    "segment@1": lambda b, x: b.op(_at("segment"), [x, b.input("ids", {"D": D}, "int64"),
                                                    b.input("mask", {"D": D}, "boolean")],
                                   {"axis": "D", "segment_axis": "G", "num_segments": 4, "mode": "sum", **ACC}),
}


def _inputs(program, tokens: int, rng) -> dict[str, np.ndarray]:
    values = {"x": rng.standard_normal((tokens, D), dtype=np.float32),
              "idx": rng.integers(0, D, J), "upd": rng.standard_normal((tokens, J), dtype=np.float32),
              "ids": rng.integers(0, 4, D), "mask": rng.random(D) < 0.7}
    names = {b["name"] for b in program["bindings"]}
    return {k: v for k, v in values.items() if k in names}


@pytest.mark.parametrize("case", sorted(CASES))
def test_warm_builds_the_parallel_twin(case):
    b = ProgramBuilder()
    program = b.build(outputs=[CASES[case](b, b.input("x", {"T": "T", "D": D}))])
    exe = runtime.compile(program, "cpu", tiered=False)
    ref = runtime.compile(program, "reference")
    rng = np.random.default_rng(0)
    exe.run(inputs=_inputs(program, 2, rng))  # small: the serial variant
    exe.warm()
    before = compilelog.specialisations()
    inputs = _inputs(program, 4096, rng)  # large: the parallel one
    got = exe.run(inputs=inputs)
    assert compilelog.specialisations() == before
    want = ref.run(inputs=inputs)
    for slot in want:
        np.testing.assert_allclose(got[slot], want[slot], rtol=1e-5, atol=1e-5)


def test_twins_pick_and_warm():
    from atoms.reduce import SUM

    assert SUM.pick(False) is SUM.serial and SUM.pick(True) is SUM.parallel
    x, out = np.arange(6, dtype=np.float64), np.empty(2)
    SUM.serial(x, out, 2, 3, 1, 1024, 1)
    SUM.warm()  # the parallel twin built for the serial one's signature
    assert set(SUM.serial.signatures) <= set(SUM.parallel.signatures)
    np.testing.assert_array_equal(out, [3, 12])


def test_no_module_writes_its_globals():
    """Kernels are module-level functions (``runtime.kernels.twins``), never dispatchers or
    intrinsics written into a module's globals() (runtime/__init__.py's lazy names aside)."""
    from pathlib import Path

    root = Path(runtime.__file__).parent.parent
    found = [f"{path.relative_to(root)}:{n}" for folder in ("runtime", "atoms", "plugins")
             for path in sorted((root / folder).rglob("*.py")) if path != root / "runtime" / "__init__.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if "globals()" in line]
    assert not found
