"""What a backend provides to the executor. Atoms bring the kernels; a backend brings memory,
transfers and the generic fused-elementwise kernel."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.core.types import TensorType
from runtime.plugins.kernel import Kernel, KernelRequest


class Backend:
    name: str = "?"
    fuses: bool = False  # whether the planner should form fused groups for this backend
    device_memory: bool = False  # arrays live on a device: host values are copied in and out
    # whether every kernel computes float16/bfloat16 itself; otherwise the planner runs half
    # work in float32 between planner-made conversions (runtime.plan.halves, SPEC §3b.1)
    half_kernels: bool = False

    def unavailable_reason(self) -> str | None:
        """None when the backend can run here, else why not (no GPU, missing extra...)."""
        return None

    # --- memory -------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Any:
        """One arena: a flat byte buffer."""
        raise NotImplementedError

    def view(self, arena: Any, offset: int, t: TensorType) -> Any:
        """A C-contiguous array of type ``t`` at ``offset`` bytes into ``arena``."""
        raise NotImplementedError

    def empty(self, t: TensorType) -> Any:
        """A fresh array for a result handed to the caller."""
        raise NotImplementedError

    def to_backend(self, host_value: Any) -> Any:
        return host_value

    def to_host(self, value: Any) -> Any:
        return value

    def aligner(self, value_type: TensorType, target: TensorType) -> Callable[[Any], Any]:
        """A function giving a value of ``value_type`` in the keepdims form of ``target`` (its
        rank and axis order, extent 1 where broadcast): how fused kernels take their epilogue
        operands. Built once per compiled plan, called on every run."""
        raise NotImplementedError

    # --- kernels ------------------------------------------------------------------------
    def elementwise_kernel(self, request: KernelRequest) -> Kernel:
        """The kernel of an anchorless fused elementwise chain (``request.epilogue``, no node),
        under the one kernel contract (runtime.plugins.kernel): its extras are the epilogue's
        operands in the keepdims form of the output; it counts what its ``counts`` says."""
        raise NotImplementedError

    def synchronize(self) -> None:
        pass

    def entering_run(self) -> None:
        """Called on the thread that runs a plan, before its kernels, on every run."""

    def prepare(self, float_dtypes: set[str]) -> None:
        """Build what runs with float bindings of these dtypes use besides the plan's kernels
        (called when a plan is built, so in the background for tiered runs): the compiled
        finiteness scan of SPEC §4. Until it is built, NumPy checks instead."""
        from runtime.kernels import finite

        finite.prepare(float_dtypes)

