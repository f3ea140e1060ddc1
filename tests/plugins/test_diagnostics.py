"""`formula atoms` / `formula plugins` data and text, on registries built for the test."""
from __future__ import annotations

from runtime.plugins import diagnostics
from runtime.plugins.atomspec import AtomSpec
from runtime.plugins.hookspecs import hookimpl
from runtime.plugins.registry import PluginInfo, PluginProblem, Registry


def _infer(ctx):
    return ctx.operands[0]


def _kernel(node):
    return lambda inputs, out: None


class PartialPlugin:
    """Two atoms: one with cpu and a backend nobody registered, one reference-only alias pair."""

    @hookimpl
    def formula_register_atoms(self, register):
        register(AtomSpec(name="twice", refs=("diag-test/formula-atom-twice@1",
                                               "diag-test/formula-atom-twice@2"),
                          inputs=("value",), attributes=frozenset(), infer=_infer,
                          kernels={"reference": _kernel, "cpu": _kernel, "rocm": _kernel},
                          elementwise=lambda node: None, inplace=0, summary="2x"))
        register(AtomSpec(name="only-ref", refs=("diag-test/formula-atom-only-ref@1",),
                          inputs=("a", "b"), attributes=frozenset({"k"}), infer=_infer,
                          kernels={"reference": _kernel}, anchors=frozenset({"cpu"}),
                          check_values=lambda node, arrays: None, checked_inputs=(1,)))


def _registry() -> Registry:
    registry = Registry(autoload=False, builtins=("runtime.backends",))
    registry.register(PartialPlugin(), PluginInfo("partial", "diag-dist", "3.1"))
    registry.problems.append(PluginProblem("busted (busted-dist 0.2)", "import failed: ImportError: nope"))
    return registry


def test_atoms_table_rows():
    rows = {r["reference"]: r for r in diagnostics.atoms_table(_registry())}
    assert set(rows) == {"diag-test/formula-atom-twice@1", "diag-test/formula-atom-twice@2",
                         "diag-test/formula-atom-only-ref@1"}
    twice = rows["diag-test/formula-atom-twice@1"]
    assert twice["alias_of"] is None and rows["diag-test/formula-atom-twice@2"]["alias_of"] == \
        "diag-test/formula-atom-twice@1"
    assert (twice["plugin"], twice["distribution"], twice["version"]) == ("partial", "diag-dist", "3.1")
    # cuda fuses: the elementwise atom runs there through the chain kernel of its expression
    assert twice["backends"] == ["reference", "cpu", "cuda", "rocm"] and twice["fused_backends"] == ["cuda"]
    assert twice["elementwise"] and twice["inplace"] == 0 and not twice["value_checks"]
    only = rows["diag-test/formula-atom-only-ref@1"]
    assert only["backends"] == ["reference"] and only["anchor_backends"] == ["cpu"] and not only["fused_backends"]
    assert only["value_checks"] and only["attributes"] == ["k"] and only["inputs"] == ["a", "b"]


def test_format_atoms_text():
    text = diagnostics.format_atoms(diagnostics.atoms_table(_registry()))
    lines = text.splitlines()
    assert lines[0].split() == ["REFERENCE", "ATOM", "PROVIDED", "BY", "RUNS", "ON"]
    k = next(i for i, line in enumerate(lines) if line.startswith("diag-test/formula-atom-twice@2"))
    assert "twice (alias)" in lines[k] and "diag-dist" in lines[k]
    assert "reference, cpu, cuda (fused), rocm" in lines[k]
    assert lines[k + 1] == "    elementwise (fusable), in-place on value"  # traits below their row
    # these atoms declare no dtypes: no dtypes line and no legend
    k = next(i for i, line in enumerate(lines) if line.startswith("diag-test/formula-atom-only-ref@1"))
    assert lines[k + 1] == "    anchor (cpu), value checks"
    assert lines[k + 2] == "    attributes k"  # the keys an instruction must give
    assert lines[-1] == "3 references, 2 atoms"
    assert "dtypes" not in text
    assert "no atoms" in diagnostics.format_atoms([])


def test_reports_fit_100_columns_and_never_cut_a_reference_or_distribution():
    """Long rows move their backends, then atom and distribution, to lines of their own; long
    lists wrap; only a reference longer than the page passes column 100, whole."""
    rows = diagnostics.atoms_table(_registry())
    long_ref = "diag-test/formula-atom-twice@sha256:" + "ab" * 32
    long_dist = "a-very-long-distribution-name-indeed"
    rows.append({**rows[0], "reference": long_ref, "alias_of": rows[0]["reference"],
                 "atom": "a-rather-long-atom-name", "distribution": long_dist,
                 "backends": ["reference", "cpu", "cuda", "rocm", "metal"], "fused_backends": ["cuda"]})
    text = diagnostics.format_atoms(rows)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100 and "…" not in text
    k = lines.index(long_ref)
    assert lines[k + 1] == f"    a-rather-long-atom-name (alias), provided by {long_dist}"
    assert lines[k + 2] == "    runs on reference, cpu, cuda (fused), rocm, metal"
    report = diagnostics.plugins_report(_registry())
    report[1]["atoms"] = [f"atom-number-{k}" for k in range(30)]
    report[1]["references"].append(long_ref + "cd" * 20)
    text = diagnostics.format_plugins(report)
    assert f"    {long_ref + 'cd' * 20}" in text.splitlines() and "atom-number-29" in text
    assert max(len(line) for line in text.splitlines() if long_ref not in line) <= 100


def test_plugins_report_rows():
    rows = {r["name"]: r for r in diagnostics.plugins_report(_registry())}
    assert set(rows) == {"runtime.backends", "partial", "busted (busted-dist 0.2)"}
    backends = rows["runtime.backends"]
    assert backends["backends"] == ["reference", "cpu", "cuda"] and backends["atoms"] == []
    assert backends["hooks"] == ["formula_register_backends"]
    partial = rows["partial"]
    assert partial["status"] == "loaded" and partial["hooks"] == ["formula_register_atoms"]
    assert partial["atoms"] == ["only-ref", "twice"] and len(partial["references"]) == 3
    k = partial["kernels"]
    assert list(k) == ["reference", "cpu", "cuda", "rocm"]
    assert k["reference"]["implemented"] == ["only-ref", "twice"]
    assert k["cpu"] == {"implemented": ["twice"], "fused": [], "missing": ["only-ref"],
                        "registered_backend": True}
    # an elementwise atom without a cuda kernel still runs there, fused into a generated chain
    assert k["cuda"]["fused"] == ["twice"] and k["cuda"]["missing"] == ["only-ref"]
    assert k["reference"]["fused"] == []  # the reference backend never fuses
    assert k["rocm"]["registered_backend"] is False
    assert partial["elementwise"] == ["twice"] and partial["anchors"] == {"only-ref": ["cpu"]}
    busted = rows["busted (busted-dist 0.2)"]
    assert busted["status"] == "failed" and busted["error"] == "import failed: ImportError: nope"


def test_format_plugins_text():
    text = diagnostics.format_plugins(diagnostics.plugins_report(_registry()))
    assert "partial  (diag-dist 3.1)" in text
    assert "kernels     reference 2/2, cpu 1/2, cuda 1/2 (1 fused), rocm 1/2 (no such backend registered)" in text
    assert "no cpu kernel: only-ref" in text and "no cuda kernel: only-ref\n" in text
    assert "fused on cuda (no kernel of their own): twice" in text
    assert "fusion      elementwise: twice; anchors: only-ref (cpu)" in text
    assert "busted (busted-dist 0.2)  FAILED\n  error       import failed: ImportError: nope" in text
    assert text.endswith("2 plugins loaded, 1 failed to load")


def test_cli_commands_print_the_reports(capsys):
    from runtime.cli import main

    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "atoms  (formula-runtime" in out and "runtime.backends" in out
    assert main(["atoms"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("REFERENCE") and "arti/formula-atom-contract@1" in out
