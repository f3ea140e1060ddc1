"""Epilogues: chains of elementwise atoms rendered as straight-line scalar code.

A fused group is an optional *anchor* (an atom that declares it can absorb an epilogue, e.g.
a contraction) followed by elementwise nodes, each reading the previous node's value once.
Backends turn the epilogue into source for their own kernels, so one planner decision
serves NumPy-free CPU loops and CUDA threads alike.

A kernel reads each epilogue operand's element before it stores the output element at the
same index, and stores nothing else there first: the planner relies on it to let the output
reuse, in place, the buffer of an operand with the output's axes and extents.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs

from runtime.plugins.atomspec import Node, ScalarOp
from runtime.core.types import TensorType, is_float

CHAIN = -1  # operand source: the value flowing down the chain


@attrs.frozen
class EpilogueStep:
    node: Node
    op: ScalarOp
    sources: tuple[int, ...]  # per operand: CHAIN or the index of an extra operand


@attrs.frozen
class Epilogue:
    steps: tuple[EpilogueStep, ...]
    extra_slots: tuple[str, ...]  # slots read by the steps, besides the chain value
    extra_types: tuple[TensorType, ...]

    @property
    def empty(self) -> bool:
        return not self.steps

    @property
    def n_extra(self) -> int:
        return len(self.extra_slots)

    def emit(self, value: str | None, extras: Sequence[str], indent: str = "",
             nonfinite: str | None = None, checked: Sequence[int] = (),
             values: bool = False, cpu: bool = False) -> tuple[list[str], str]:
        """Lines computing the chain from ``value`` (None for a chain with no anchor) and the
        element expressions ``extras``; returns the lines and the name of the result. With
        ``nonfinite`` (a boolean variable of the kernel), the lines also set it when one of the
        ``checked`` extras' elements is NaN or ±inf, and with ``values`` when ``value`` or a
        step's floating value is (the output check, SPEC §3b.3 item 2): branch-free, and a
        boolean OR vectorises at the full vector width, where an int64 count would halve it.
        ``cpu``: each step's ``ScalarOp.cpu`` form where it has one (for generated CPU kernels,
        whose module imports ``runtime.kernels.vmath.IMPORT``)."""
        lines = [f"{indent}_e{k} = {src}" for k, src in enumerate(extras)]
        flag = nonfinite if values else None
        if nonfinite is not None:
            lines += [f"{indent}{nonfinite} |= (_e{k} - _e{k}) != 0" for k in checked]
        if flag is not None and value is not None:
            lines.append(f"{indent}{flag} |= ({value} - {value}) != 0")
        current = value
        for s, step in enumerate(self.steps):
            args = [current if src == CHAIN else f"_e{src}" for src in step.sources]
            if any(a is None for a in args):
                raise ValueError("the first step of an anchorless chain cannot read the chain")
            expr = step.op.cpu if cpu and step.op.cpu is not None else step.op.expr
            lines.append(f"{indent}_v{s} = {expr.format(*args)}")
            if flag is not None and is_float(step.node.output_type.dtype):
                lines.append(f"{indent}{flag} |= (_v{s} - _v{s}) != 0")
            current = f"_v{s}"
        if current is None:
            raise ValueError("empty epilogue without an anchor value")
        return lines, current

    @property
    def key(self) -> str:
        """A stable digest of the scalar code, for naming generated kernels."""
        text = "|".join(f"{s.op.expr}:{s.sources}" for s in self.steps)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


EMPTY_EPILOGUE = Epilogue((), (), ())
