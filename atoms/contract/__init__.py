"""The contract atom (SPEC §3): a sum over reduced axis pairs, by axis name.

One module per idea: ``infer`` (the atom's rules), ``reference`` (``np.einsum`` in the
accumulation dtype, the oracle), ``lowering`` (any axis layout as a batched GEMM and the
operands' addressing), ``tiles`` (the CPU tile plan), ``render`` (the generated CPU source),
``factory`` (the CPU kernel), ``micro`` (the register-blocked micro-kernel tiles), ``blas``
(scipy's BLAS from njit code) and ``cuda`` (the CUDA kernel). The cpu and cuda kernels are the
anchors of fused groups: the plain kernel is the anchor with the empty epilogue.
"""
from __future__ import annotations

from runtime.plugins.atomspec import AtomSpec, Linear, Node

from .._refs import refs_for
from .cuda import cuda_anchor
from .factory import cpu_anchor
from .infer import infer_contract
from .reference import reference_kernel


def free_contract(node: Node) -> frozenset[str]:
    """The kept axes (batch and either side's own); a name reduced on either side is tied."""
    reduced = {a for pair in node.attributes["reduce_axes"] for a in pair}
    return frozenset(node.output_type.axes) - reduced


def linear_contract(node: Node) -> Linear:
    """Linear in each operand alone; a sum over each reduce pair."""
    return Linear((0, 1), False, tuple(((0, left), (1, right)) for left, right in node.attributes["reduce_axes"]))


SPECS = [
    AtomSpec(name="contract", refs=refs_for("contract"), inputs=("left", "right"),
             dtypes={"left": "numeric", "right": "numeric"},
             attributes=frozenset({"reduce_axes", "output_axes", "accumulation_dtype"}),
             infer=infer_contract,
             kernels={"reference": reference_kernel, "cpu": cpu_anchor, "cuda": cuda_anchor},
             anchors=frozenset({"cpu", "cuda"}), free_axes=free_contract, role="contraction",
             linear=linear_contract,
             summary="sum over reduced axis pairs by name (batched GEMM; anchors epilogues)"),
]
