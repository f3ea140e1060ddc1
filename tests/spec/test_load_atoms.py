"""SPEC §3 at load time: attribute values (``atom_attributes``) and operand/declared types
(``type_mismatch``) for every built-in atom. Each program holds one instruction, so the
paths are ``$.instructions[0]...``; the output slot is the last slot.
"""
from __future__ import annotations

import pytest

import runtime

from .atom_cases import VALID, one
from .builders import load_error, under

ACT = "activation"
INS = "$.instructions[0]"


def attr(key):
    return under(f"{INS}.attributes.{key}")


def typed(prog):
    """type_mismatch may point at the instruction (or a part of it) or at its output slot."""
    return under(INS, f"$.slots[{len(prog['slots']) - 1}]")


def F(name, axes, sizes, dtype="float32", domain="anonymous"):
    return (name, axes, sizes, dtype, domain)


def contract(reduce_axes=(("K", "K"),), output_axes=("M", "N"), acc="float32",
             left=F("x", ["M", "K"], [2, 3]), right=F("w", ["N", "K"], [4, 3]),
             out=(["M", "N"], [2, 4]), out_dtype="float32"):
    return one("contract", [left, right],
               {"reduce_axes": [list(p) for p in reduce_axes] if isinstance(reduce_axes, tuple)
                else reduce_axes, "output_axes": list(output_axes) if isinstance(output_axes, tuple)
                else output_axes, "accumulation_dtype": acc}, *out, out_dtype)


def test_every_valid_case_loads():
    for _case, make, _inputs, _expected in VALID:
        runtime.load_program(make())


# ---- attribute values --------------------------------------------------------------------

ATTRIBUTE_CASES = [
    ("contract-empty-reduce", lambda: contract(reduce_axes=()), "reduce_axes"),
    ("contract-axis-lacking", lambda: contract(reduce_axes=(("Z", "K"),)), "reduce_axes"),
    ("contract-axis-lacking-right", lambda: contract(reduce_axes=(("K", "Z"),)), "reduce_axes"),
    ("contract-axis-twice", lambda: contract(reduce_axes=(("K", "K"), ("K", "K"))), "reduce_axes"),
    ("contract-pair-not-pair", lambda: contract(reduce_axes=[["K"]]), "reduce_axes"),
    ("contract-reduce-not-list", lambda: contract(reduce_axes="K"), "reduce_axes"),
    ("contract-out-not-permutation", lambda: contract(output_axes=("M",), out=(["M"], [2])),
     "output_axes"),
    ("contract-out-extra-axis", lambda: contract(output_axes=("M", "N", "K"),
                                                 out=(["M", "N", "K"], [2, 4, 3])), "output_axes"),
    ("contract-acc-unknown", lambda: contract(acc="float16"), "accumulation_dtype"),
    ("contract-acc-float64", lambda: contract(acc="float64"), "accumulation_dtype"),
    ("contract-acc-not-string", lambda: contract(acc=32), "accumulation_dtype"),
    ("scale-factor-axes", lambda: one("scale", [F("v", ["N", "M"], [2, 3]), F("f", ["M"], [3])],
                                      {"factor_axes": [], "accumulation_dtype": ACT},
                                      ["N", "M"], [2, 3]), "factor_axes"),
    ("scale-factor-axes-order", lambda: one(
        "scale", [F("v", ["N", "M"], [2, 3]), F("f", ["N", "M"], [2, 3])],
        {"factor_axes": ["M", "N"], "accumulation_dtype": ACT}, ["N", "M"], [2, 3]),
     "factor_axes"),
    ("add-acc", lambda: one("add", [F("a", ["N"], [2]), F("b", ["N"], [2])],
                            {"accumulation_dtype": "fp32"}, ["N"], [2]), "accumulation_dtype"),
    ("reduce-axis-lacking", lambda: one("reduce", [F("v", ["N", "M"], [2, 3])],
                                        {"axis": "Z", "mode": "sum", "accumulation_dtype": ACT},
                                        ["N", "M"], [2, 3]), "axis"),
    ("reduce-mode", lambda: one("reduce", [F("v", ["N", "M"], [2, 3])],
                                {"axis": "M", "mode": "max", "accumulation_dtype": ACT},
                                ["N"], [2]), "mode"),
    ("reduce-axis-not-string", lambda: one("reduce", [F("v", ["N", "M"], [2, 3])],
                                           {"axis": 1, "mode": "sum", "accumulation_dtype": ACT},
                                           ["N"], [2]), "axis"),
    ("reshape-lengths", lambda: one("reshape", [F("v", ["N", "M"], [2, 3])],
                                    {"output_axes": ["P", "Q"], "output_sizes": [6]},
                                    ["P", "Q"], [6, 1]), ("output_axes", "output_sizes")),
    ("permute-not-permutation", lambda: one("permute", [F("v", ["N", "M"], [2, 3])],
                                            {"output_axes": ["M"]}, ["M"], [3]), "output_axes"),
    ("permute-foreign-axis", lambda: one("permute", [F("v", ["N", "M"], [2, 3])],
                                         {"output_axes": ["M", "Z"]}, ["M", "Z"], [3, 2]),
     "output_axes"),
    ("permute-repeated", lambda: one("permute", [F("v", ["N", "M"], [2, 3])],
                                     {"output_axes": ["M", "M"]}, ["M", "N"], [3, 2]),
     "output_axes"),
    ("gather-axis-lacking", lambda: one("gather", [F("v", ["N", "D"], [4, 2]),
                                                   F("i", ["J"], [3], "int64")],
                                        {"axis": "Z", "index_axis": "J"}, ["J", "D"], [3, 2]),
     "axis"),
    ("scatter-mode", lambda: one("scatter", [F("b", ["N", "D"], [4, 2]), F("i", ["J"], [2], "int64"),
                                             F("u", ["J", "D"], [2, 2])],
                                 {"axis": "N", "index_axis": "J", "mode": "add"},
                                 ["N", "D"], [4, 2]), "mode"),
    ("scalar-map-mode", lambda: one("scalar-map", [F("v", ["N"], [2])], {"mode": "exp"},
                                    ["N"], [2]), "mode"),
    ("scalar-map-mode-type", lambda: one("scalar-map", [F("v", ["N"], [2])], {"mode": 3},
                                         ["N"], [2]), "mode"),
    ("scalar-map-gelu-variant", lambda: one("scalar-map", [F("v", ["N"], [2])],
                                            {"mode": "gelu_tanh"}, ["N"], [2]), "mode"),
    ("lookup-table-axis", lambda: one("lookup", [F("t", ["V", "D"], [5, 2]),
                                                 F("i", ["B"], [3], "int64")],
                                      {"table_axis": "Z", "output_axes": ["B", "D"]},
                                      ["B", "D"], [3, 2]), "table_axis"),
    ("lookup-output-axes", lambda: one("lookup", [F("t", ["V", "D"], [5, 2]),
                                                  F("i", ["B"], [3], "int64")],
                                       {"table_axis": "V", "output_axes": ["B", "V"]},
                                       ["B", "V"], [3, 5]), "output_axes"),
    ("slice-step-zero", lambda: _slice(0, 2, 0), "step"),
    ("slice-step-negative", lambda: _slice(3, 0, -1), "step"),
    ("slice-start-negative", lambda: _slice(-2, None, 1), "start"),
    ("slice-stop-negative", lambda: _slice(0, -1, 1), "stop"),
    ("slice-empty", lambda: _slice(3, 3, 1), ("start", "stop")),
    ("slice-empty-past-end", lambda: _slice(7, None, 1), ("start", "stop")),
    ("slice-axis-lacking", lambda: one("slice", [F("v", ["N"], [5])],
                                       {"axis": "Z", "start": 0, "stop": 1, "step": 1},
                                       ["N"], [1]), "axis"),
    ("slice-start-float", lambda: _slice(0.5, 2, 1), "start"),
    ("softmax-axis-lacking", lambda: one("masked-softmax", [F("l", ["N"], [3]),
                                                            F("m", ["N"], [3], "boolean")],
                                         {"axis": "Z", "accumulation_dtype": ACT}, ["N"], [3]),
     "axis"),
    ("concat-axis-lacking", lambda: one("concat", [F("a", ["N"], [2]), F("b", ["N"], [3])],
                                        {"axis": "Z"}, ["N"], [5]), "axis"),
]


def _slice(start, stop, step):
    return one("slice", [F("v", ["N"], [5])],
               {"axis": "N", "start": start, "stop": stop, "step": step}, ["N"], [1])


@pytest.mark.parametrize("make,keys", [c[1:] for c in ATTRIBUTE_CASES],
                         ids=[c[0] for c in ATTRIBUTE_CASES])
def test_attribute_value_rejected(make, keys):
    keys = (keys,) if isinstance(keys, str) else keys
    load_error("atom_attributes", under(*(f"{INS}.attributes.{k}" for k in keys)), make())


# ---- operand and declared types ----------------------------------------------------------

TYPE_CASES = [
    ("contract-reduced-extents", lambda: contract(right=F("w", ["N", "K"], [4, 5]))),
    ("contract-dtypes", lambda: contract(right=F("w", ["N", "K"], [4, 3], "float64"))),
    ("contract-domains", lambda: contract(right=F("w", ["N", "K"], [4, 3], "float32", "other"))),
    ("contract-batch-extents", lambda: contract(
        left=F("x", ["B", "M", "K"], [2, 2, 3]), right=F("w", ["B", "N", "K"], [3, 4, 3]),
        output_axes=("B", "M", "N"), out=(["B", "M", "N"], [2, 2, 4]))),
    ("contract-declared-sizes", lambda: contract(out=(["M", "N"], [2, 5]))),
    ("contract-declared-dtype", lambda: contract(out_dtype="float64")),
    ("contract-declared-order", lambda: contract(out=(["N", "M"], [4, 2]))),
    ("scale-factor-extent", lambda: one(
        "scale", [F("v", ["N", "M"], [2, 3]), F("f", ["M"], [4])],
        {"factor_axes": ["M"], "accumulation_dtype": ACT}, ["N", "M"], [2, 3])),
    ("scale-dtype", lambda: one(
        "scale", [F("v", ["N"], [2]), F("f", [], [], "float64")],
        {"factor_axes": [], "accumulation_dtype": ACT}, ["N"], [2])),
    ("add-sizes", lambda: one("add", [F("a", ["N"], [2]), F("b", ["N"], [3])],
                              {"accumulation_dtype": ACT}, ["N"], [2])),
    ("add-axis-order", lambda: one("add", [F("a", ["N", "M"], [2, 2]), F("b", ["M", "N"], [2, 2])],
                                   {"accumulation_dtype": ACT}, ["N", "M"], [2, 2])),
    ("add-dtype", lambda: one("add", [F("a", ["N"], [2]), F("b", ["N"], [2], "float16")],
                              {"accumulation_dtype": ACT}, ["N"], [2])),
    ("add-domain", lambda: one("add", [F("a", ["N"], [2]), F("b", ["N"], [2], "float32", "d2")],
                               {"accumulation_dtype": ACT}, ["N"], [2])),
    ("add-symbol-vs-static", lambda: one("add", [F("a", ["N"], ["N"]), F("b", ["N"], [2])],
                                         {"accumulation_dtype": ACT}, ["N"], [2])),
    ("add-declared-domain", lambda: one("add", [F("a", ["N"], [2]), F("b", ["N"], [2])],
                                        {"accumulation_dtype": ACT}, ["N"], [2], "float32", "d2")),
    ("reduce-declared-keeps-axis", lambda: one(
        "reduce", [F("v", ["N", "M"], [2, 3])],
        {"axis": "M", "mode": "sum", "accumulation_dtype": ACT}, ["N", "M"], [2, 1])),
    ("reshape-element-count", lambda: one("reshape", [F("v", ["N", "M"], [2, 3])],
                                          {"output_axes": ["P"], "output_sizes": [5]},
                                          ["P"], [5])),
    ("permute-declared", lambda: one("permute", [F("v", ["N", "M"], [2, 3])],
                                     {"output_axes": ["M", "N"]}, ["M", "N"], [2, 3])),
    ("gather-value-int64", lambda: one("gather", [F("v", ["N"], [4], "int64"),
                                                  F("i", ["J"], [3], "int64")],
                                       {"axis": "N", "index_axis": "J"}, ["J"], [3], "int64")),
    ("gather-indices-float", lambda: one("gather", [F("v", ["N"], [4]), F("i", ["J"], [3])],
                                         {"axis": "N", "index_axis": "J"}, ["J"], [3])),
    ("gather-indices-other-extent", lambda: one(
        "gather", [F("v", ["B", "N"], [2, 4]), F("i", ["B", "J"], [3, 2], "int64")],
        {"axis": "N", "index_axis": "J"}, ["B", "J"], [2, 2])),
    ("gather-two-foreign-axes", lambda: one(
        "gather", [F("v", ["N"], [4]), F("i", ["P", "J"], [2, 2], "int64")],
        {"axis": "N", "index_axis": "J"}, ["J"], [2])),
    ("scatter-updates-type", lambda: one(
        "scatter", [F("b", ["N", "D"], [4, 2]), F("i", ["J"], [2], "int64"),
                    F("u", ["J", "D"], [2, 3])],
        {"axis": "N", "index_axis": "J", "mode": "replace"}, ["N", "D"], [4, 2])),
    ("scalar-map-int", lambda: one("scalar-map", [F("v", ["N"], [2], "int64")], {"mode": "relu"},
                                   ["N"], [2], "int64")),
    ("scalar-map-declared-dtype", lambda: one("scalar-map", [F("v", ["N"], [2])],
                                              {"mode": "relu"}, ["N"], [2], "float64")),
    ("broadcast-non-singleton", lambda: one("broadcast", [F("v", ["N"], [2])],
                                            {"output_axes": ["N"], "output_sizes": [4]},
                                            ["N"], [4])),
    ("select-mask-float", lambda: one("select", [F("m", ["N"], [2]), F("t", ["N"], [2]),
                                                 F("f", ["N"], [2])], {}, ["N"], [2])),
    ("select-branches-differ", lambda: one("select", [F("m", ["N"], [2], "boolean"),
                                                      F("t", ["N"], [2]),
                                                      F("f", ["N"], [2], "float64")],
                                           {}, ["N"], [2])),
    ("select-mask-foreign-axis", lambda: one("select", [F("m", ["Z"], [2], "boolean"),
                                                        F("t", ["N"], [2]), F("f", ["N"], [2])],
                                             {}, ["N"], [2])),
    ("select-mask-extent", lambda: one("select", [F("m", ["N"], [3], "boolean"),
                                                  F("t", ["N"], [2]), F("f", ["N"], [2])],
                                       {}, ["N"], [2])),
    ("lookup-table-int", lambda: one("lookup", [F("t", ["V", "D"], [5, 2], "int64"),
                                                F("i", ["B"], [3], "int64")],
                                     {"table_axis": "V", "output_axes": ["B", "D"]},
                                     ["B", "D"], [3, 2], "int64")),
    ("lookup-indices-float", lambda: one("lookup", [F("t", ["V", "D"], [5, 2]), F("i", ["B"], [3])],
                                         {"table_axis": "V", "output_axes": ["B", "D"]},
                                         ["B", "D"], [3, 2])),
    ("slice-declared-extent", lambda: one("slice", [F("v", ["N"], [5])],
                                          {"axis": "N", "start": 1, "stop": 4, "step": 2},
                                          ["N"], [3])),
    ("concat-other-extent", lambda: one("concat", [F("a", ["N", "M"], [2, 3]),
                                                   F("b", ["N", "M"], [1, 2])],
                                        {"axis": "N"}, ["N", "M"], [3, 3])),
    ("concat-axes-differ", lambda: one("concat", [F("a", ["N", "M"], [2, 3]),
                                                  F("b", ["N", "P"], [1, 3])],
                                       {"axis": "N"}, ["N", "M"], [3, 3])),
    ("concat-dtype", lambda: one("concat", [F("a", ["N"], [2]), F("b", ["N"], [1], "float64")],
                                 {"axis": "N"}, ["N"], [3])),
    ("softmax-mask-float", lambda: one("masked-softmax", [F("l", ["N"], [3]), F("m", ["N"], [3])],
                                       {"axis": "N", "accumulation_dtype": ACT}, ["N"], [3])),
    ("softmax-logits-int", lambda: one("masked-softmax", [F("l", ["N"], [3], "int64"),
                                                          F("m", ["N"], [3], "boolean")],
                                       {"axis": "N", "accumulation_dtype": ACT}, ["N"], [3],
                                       "int64")),
]


@pytest.mark.parametrize("make", [c[1] for c in TYPE_CASES], ids=[c[0] for c in TYPE_CASES])
def test_type_rejected(make):
    prog = make()
    load_error("type_mismatch", typed(prog), prog)


# Rules where SPEC §6 supports either code (a list/set rule on attributes vs operand extents).
EITHER_CASES = [
    ("scale-factor-not-subset", lambda: one(
        "scale", [F("v", ["N", "M"], [2, 3]), F("f", ["Z"], [3])],
        {"factor_axes": ["Z"], "accumulation_dtype": ACT}, ["N", "M"], [2, 3])),
    ("contract-alias-preserved", lambda: contract(
        left=F("x", ["M", "K"], [2, 3]), right=F("w", ["J", "K"], [3, 3]),
        reduce_axes=(("K", "J"),), output_axes=("M", "K"), out=(["M", "K"], [2, 3]))),
    ("broadcast-drops-axis", lambda: one("broadcast", [F("v", ["N", "M"], [1, 3])],
                                         {"output_axes": ["N"], "output_sizes": [4]}, ["N"], [4])),
    ("gather-index-axis-in-value", lambda: one(
        "gather", [F("v", ["N", "D"], [4, 2]), F("i", ["D"], [2], "int64")],
        {"axis": "N", "index_axis": "D"}, ["D"], [2])),
    ("lookup-axes-overlap", lambda: one("lookup", [F("t", ["V", "D"], [5, 2]),
                                                   F("i", ["D"], [2], "int64")],
                                        {"table_axis": "V", "output_axes": ["D", "D"]},
                                        ["D", "E"], [2, 2])),
    ("slice-symbolic-partial", lambda: one("slice", [F("v", ["N"], ["N"])],
                                           {"axis": "N", "start": 1, "stop": None, "step": 1},
                                           ["N"], ["N"])),
    ("concat-symbolic-axis", lambda: one("concat", [F("a", ["N"], ["N"]), F("b", ["N"], [1])],
                                         {"axis": "N"}, ["N"], ["N"])),
    ("reshape-output-size-zero", lambda: one("reshape", [F("v", ["N"], [2])],
                                             {"output_axes": ["P", "Q"], "output_sizes": [2, 0]},
                                             ["P", "Q"], [2, 1])),
]


@pytest.mark.parametrize("make", [c[1] for c in EITHER_CASES], ids=[c[0] for c in EITHER_CASES])
def test_attribute_or_type_rejected(make):
    prog = make()
    load_error(("atom_attributes", "type_mismatch", "invalid_type"), typed(prog), prog)


def test_symbolic_full_slice_allowed():
    runtime.load_program(one("slice", [F("v", ["N"], ["N"])],
                             {"axis": "N", "start": 0, "stop": None, "step": 1}, ["N"], ["N"]))
