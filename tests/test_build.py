"""runtime.build: the public program builder works without pytest installed."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_program_builder_needs_no_pytest():
    script = textwrap.dedent("""
        import sys
        sys.modules["pytest"] = None  # as if pytest were not installed: importing it fails
        import numpy as np
        import runtime
        from runtime.build import ProgramBuilder

        assert runtime.ProgramBuilder is ProgramBuilder
        b = ProgramBuilder()
        x = b.input("x", {"T": "T", "D": 4})
        y = b.op("scalar-map", [x], {"mode": "relu"})
        out = runtime.execute(b.build(outputs=[y]), inputs={"x": np.full((2, 4), -1.0, np.float32)},
                              backend="reference")[y]
        assert (out == 0).all()
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_an_atom_is_named_by_its_name_its_name_and_version_or_its_whole_reference():
    from runtime.build import ProgramBuilder

    b = ProgramBuilder()
    x = b.input("x", {"T": 3, "D": 4})
    b.op("reduce", [x], {"axis": "D", "mode": "sum", "accumulation_dtype": "float32"})
    b.op("reduce@2", [x], {"axis": "D", "mode": "mean", "accumulation_dtype": "float32"})
    b.op("scalar-map", [x], {"mode": "relu"}, ref="arti/formula-atom-scalar-map@1")
    b.op("arti/formula-atom-reduce@2", [x], {"axis": "T", "mode": "amax", "accumulation_dtype": "float32"})
    refs = [ins["atom_ref"] for ins in b.build(outputs=["%3"])["instructions"]]
    assert refs == ["arti/formula-atom-reduce@1", "arti/formula-atom-reduce@2", "arti/formula-atom-scalar-map@1",
                    "arti/formula-atom-reduce@2"]
