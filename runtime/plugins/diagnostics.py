"""What ``formula atoms`` and ``formula plugins`` print: which plugin gave which atom, what
each atom can do on which backend, and which plugins failed to load and why.

Each report is two steps, data then text (``atoms_table`` → ``format_atoms``,
``plugins_report`` → ``format_plugins``), so tools and tests read the rows and people
read the text. Everything comes from a :class:`runtime.plugins.registry.Registry` as it stands;
nothing here calls plugin code.
"""
from __future__ import annotations

import types
from collections.abc import Iterable, Sequence
from typing import Any

from runtime.core.types import DTYPE_CLASSES, dtype_class_members
from runtime.plugins.atomspec import AtomSpec

BACKEND_ORDER = ("reference", "cpu", "cuda")  # the built-in backends first, then by name
WIDTH = 100  # the reports fit a 100-column terminal
ATOM_COLUMN_CAPS = (40, 18, 15, 20)  # reference, atom, provided by, runs on: a longer cell pushes, never cut


def _wrapped(prefix: str, text: str, width: int = WIDTH, indent: str | None = None) -> list[str]:
    """``prefix`` + ``text`` wrapped at ``width``, continuation lines indented under the text."""
    import textwrap

    return textwrap.wrap(text, width, initial_indent=prefix, break_on_hyphens=False,
                         subsequent_indent=" " * len(prefix) if indent is None else indent) or [prefix.rstrip()]


def _backend_key(name: str) -> tuple[int, str]:
    return (BACKEND_ORDER.index(name) if name in BACKEND_ORDER else len(BACKEND_ORDER), name)


def _sorted_backends(names: Iterable[str]) -> list[str]:
    return sorted(set(names), key=_backend_key)


# --- formula atoms ----------------------------------------------------------------------
def atoms_table(registry) -> list[dict[str, Any]]:
    """One row per registered reference, sorted by atom name then reference.

    An alias (a second reference of the same spec, like the seed's digest refs) has
    ``alias_of`` set to the spec's primary reference."""
    rows = []
    for ref in registry.atoms:
        spec = registry.atom(ref, "$")  # with kernels other plugins registered for it
        owner = registry.atom_owner.get(ref)
        rule = registry.vjp_rule(spec)
        fused = _sorted_backends(name for name, b in registry.backends.items() if getattr(b, "fuses", False)
                                 and spec.elementwise is not None and name not in spec.kernels)
        rows.append({
            "reference": ref,
            "atom": spec.name,
            "alias_of": spec.ref if ref != spec.ref else None,
            "plugin": owner.name if owner else None,
            "distribution": owner.distribution if owner else None,
            "version": owner.version if owner else None,
            "inputs": list(spec.inputs),
            # operand -> the dtypes it accepts, expanded from the declared class (None: undeclared)
            "dtypes": {op: list(dtype_class_members(spec.dtypes[op])) if op in spec.dtypes else None
                       for op in spec.inputs},
            "dtype_classes": {op: spec.dtypes.get(op) for op in spec.inputs},
            "attributes": sorted(spec.attributes),
            # where it runs: its kernels, and the fusing backends' chain kernels of its expression
            "backends": _sorted_backends([*spec.kernels, *fused]),
            "fused_backends": fused,
            "elementwise": spec.elementwise is not None,
            "anchor_backends": _sorted_backends(spec.anchors),
            "value_checks": spec.check_values is not None,
            "inplace": list(spec.inplace) if isinstance(spec.inplace, tuple) else spec.inplace,
            "view": spec.view,
            "summary": spec.summary,
            # SPEC §3c: the operands its gradient rule serves and who gave the rule (None: no rule)
            "gradient": None if rule is None else {
                "operands": [spec.inputs[i] for i in rule[1] if i < len(spec.inputs)],
                "plugin": rule[2].name if rule[2] else None},
        })
    rows.sort(key=lambda r: (r["atom"], r["alias_of"] is not None, r["reference"]))
    return rows


def _traits(row: dict[str, Any]) -> str:
    traits = []
    if row["elementwise"]:
        traits.append("elementwise (fusable)")
    if row["anchor_backends"]:
        traits.append(f"anchor ({', '.join(row['anchor_backends'])})")
    if row["value_checks"]:
        traits.append("value checks")
    if row["inplace"] is not None:
        on = row["inplace"] if isinstance(row["inplace"], list) else [row["inplace"]]
        traits.append(f"in-place on {' or '.join(row['inputs'][k] for k in on)}")
    if row.get("view"):
        traits.append("view (no copy of a temporary)")
    if row.get("gradient"):
        traits.append(f"gradient for {', '.join(row['gradient']['operands']) or 'no operand'}")
    return ", ".join(traits) or "-"


def _operand_dtypes(row: dict[str, Any]) -> str:
    return "; ".join(f"{op}: {cls or 'undeclared'}" for op, cls in row["dtype_classes"].items())


def format_atoms(rows: Sequence[dict[str, Any]]) -> str:
    """A table within WIDTH columns: reference, atom, distribution and the backends it runs on
    (``(fused)``: by the backend's chain kernel of its expression); below each row, indented,
    the dtypes each operand accepts, the atom's traits and its attribute keys; a legend of the
    dtype classes closes it. A reference or a distribution is never cut (a user copies them): a row too wide for
    the columns moves its backends, then its atom and distribution, to lines of their own."""
    if not rows:
        return "no atoms are registered (is formula-runtime's built-in 'atoms' plugin loadable?)"
    header = ("REFERENCE", "ATOM", "PROVIDED BY", "RUNS ON")
    table = [header]
    for r in rows:
        atom = r["atom"] if r["alias_of"] is None else f"{r['atom']} (alias)"
        fused = set(r.get("fused_backends", ()))
        table.append((r["reference"], atom, r["distribution"] or r["plugin"] or "?",
                      ", ".join(f"{b} (fused)" if b in fused else b for b in r["backends"]) or "none"))
    # each column gets its natural width up to a cap; a longer cell pushes the rest of its line
    widths = [min(max(len(line[k]) for line in table), cap) for k, cap in enumerate(ATOM_COLUMN_CAPS)]
    lines = []
    for line, row in zip(table, [None, *rows]):
        lines += _atom_row(line, widths)
        if row is None:
            continue
        if any(row["dtype_classes"].values()):  # a plugin that declares none gets no line
            lines += _wrapped("    dtypes ", _operand_dtypes(row))
        traits = _traits(row)
        if traits != "-":
            lines += _wrapped("    ", traits)
        if row["attributes"]:  # the exact key set an instruction must give
            lines += _wrapped("    attributes ", ", ".join(row["attributes"]))
    distinct = len({r["alias_of"] or r["reference"] for r in rows})
    lines.append(f"{len(rows)} references, {distinct} atoms")
    used = sorted({part for r in rows for cls in r["dtype_classes"].values() if cls
                   for part in cls.split("|")} & (set(DTYPE_CLASSES) - {"int64", "boolean"}))
    if used:
        lines += _wrapped("dtype classes: ", "; ".join(
            f"{c} = {' '.join(d for d in DTYPE_CLASSES[c] if d != 'floating')}" for c in used))
    return "\n".join(line.rstrip() for line in lines)


def _atom_row(cells: Sequence[str], widths: Sequence[int]) -> list[str]:
    """One table row as lines within WIDTH, no cell cut: the whole row on one line if it fits,
    else its backends below it, else its atom and distribution too."""
    def joined(parts: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(parts, widths)).rstrip()

    whole = joined(cells)
    if len(whole) <= WIDTH:
        return [whole]
    reference, atom, distribution, backends = cells
    head = joined(cells[:3])
    if len(head) <= WIDTH:
        return [head, *_wrapped("    runs on ", backends)]
    return [reference, *_wrapped("    ", f"{atom}, provided by {distribution}"),
            *_wrapped("    runs on ", backends)]


# --- formula plugins --------------------------------------------------------------------
def plugins_report(registry) -> list[dict[str, Any]]:
    """Every registered plugin (registration order) with what it provides and its ``problems``
    (what it registered that is refused, such as a ScalarOp expression), then every plugin that
    failed to load (status ``failed``) with its error."""
    backend_names = set(registry.backends)
    rows = []
    for name, info in registry.plugins.items():
        specs: dict[int, AtomSpec] = {}
        refs = []
        for ref, owner in registry.atom_owner.items():
            if owner == info:
                refs.append(ref)
                spec = registry.atoms[ref]
                specs[id(spec)] = spec
        atoms = sorted(specs.values(), key=lambda s: s.name)
        plugin = registry.pm.get_plugin(name)
        kernel_backends = _sorted_backends(
            backend_names | {b for s in atoms for b in s.kernels}) if atoms else []
        rows.append({
            "name": name,
            "distribution": info.distribution,
            "version": info.version,
            "status": "loaded",
            "error": None,
            # what is wrong with what it registered (a ScalarOp expression refused when it registered)
            "problems": list(registry.atom_problems.get(name, ())),
            "hooks": sorted(h.name for h in registry.pm.get_hookcallers(plugin) or ())
            if plugin is not None else [],
            "atoms": [s.name for s in atoms],
            "references": sorted(refs),
            "kernels": {b: _kernel_coverage(atoms, b, registry.backends.get(b))
                        for b in kernel_backends},
            "elementwise": [s.name for s in atoms if s.elementwise is not None],
            "anchors": {s.name: _sorted_backends(s.anchors) for s in atoms if s.anchors},
            "backends": _backends_of(plugin, registry.backends),
            "registered_kernels": sorted(f"{ref} on {backend}" for (ref, backend), e
                                         in registry.kernels.items() if e.owner == info),
        })
    for problem in registry.problems:
        rows.append({"name": problem.plugin, "distribution": None, "version": None,
                     "status": "failed", "error": problem.error, "problems": [], "hooks": [], "atoms": [],
                     "references": [], "kernels": {}, "elementwise": [], "anchors": {},
                     "backends": [], "registered_kernels": []})
    return rows


def _kernel_coverage(atoms: Sequence[AtomSpec], backend: str, found) -> dict[str, Any]:
    """Which atoms run on ``backend``: by a kernel of their own, or (elementwise atoms on a
    fusing backend) by the chain kernel the backend generates from their scalar definition."""
    fuses = bool(getattr(found, "fuses", False))
    fused = [s.name for s in atoms if backend not in s.kernels and s.elementwise is not None and fuses]
    return {"implemented": [s.name for s in atoms if backend in s.kernels],
            "fused": fused,
            "missing": [s.name for s in atoms if backend not in s.kernels and s.name not in fused],
            "registered_backend": found is not None}


def _backends_of(plugin: object, backends: dict[str, object]) -> list[str]:
    """Backends whose class is defined in the plugin's module (or below it): the registry
    records backends by name only, and this attribution needs no second call into the plugin."""
    if plugin is None:
        return []
    module = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
    return _sorted_backends(
        name for name, b in backends.items()
        if type(b).__module__ == module or type(b).__module__.startswith(module + "."))


def format_plugins(rows: Sequence[dict[str, Any]]) -> str:
    """One block per plugin; failed plugins say FAILED with their error."""
    if not rows:
        return "no plugins are registered"
    blocks = []
    for r in rows:
        if r["status"] == "failed":
            blocks.append("\n".join([f"{r['name']}  FAILED", *_wrapped("  error       ", r["error"])]))
            continue
        head = r["name"]
        if r["distribution"]:
            head += f"  ({r['distribution']} {r['version'] or '(version unknown)'})"
        lines = [head, *_wrapped("  hooks       ", ", ".join(r["hooks"]) or "-")]
        if r["atoms"]:
            lines += _wrapped("  atoms       ", f"{len(r['atoms'])}: {', '.join(r['atoms'])}")
            lines.append(f"  references  {len(r['references'])}:")
            lines += [f"    {ref}" for ref in r["references"]]  # whole, even past WIDTH: copied by users
            n = len(r["atoms"])
            counts = []
            for backend, k in r["kernels"].items():
                note = "" if k["registered_backend"] else " (no such backend registered)"
                fused = f" ({len(k['fused'])} fused)" if k["fused"] else ""
                counts.append(f"{backend} {len(k['implemented']) + len(k['fused'])}/{n}{fused}{note}")
            lines += _wrapped("  kernels     ", ", ".join(counts))
            for backend, k in r["kernels"].items():
                if k["fused"]:
                    lines += _wrapped(f"  fused on {backend} (no kernel of their own): ", ", ".join(k["fused"]))
                if k["missing"]:
                    lines += _wrapped(f"  no {backend} kernel: ", ", ".join(k["missing"]))
            fusion = []
            if r["elementwise"]:
                fusion.append(f"elementwise: {', '.join(r['elementwise'])}")
            if r["anchors"]:
                fusion.append("anchors: " + ", ".join(f"{a} ({', '.join(b)})"
                                                      for a, b in r["anchors"].items()))
            lines += _wrapped("  fusion      ", "; ".join(fusion) or "-")
        for problem in r.get("problems", ()):
            lines += _wrapped("  PROBLEM     ", problem)
        if r["backends"]:
            lines += _wrapped("  backends    ", ", ".join(r["backends"]))
        if r.get("registered_kernels"):
            lines += _wrapped("  gives       ", "kernels for " + ", ".join(r["registered_kernels"]))
        blocks.append("\n".join(lines))
    failed = sum(r["status"] == "failed" for r in rows)
    troubled = sum(bool(r.get("problems")) for r in rows)
    tail = f"{len(rows) - failed} plugins loaded" + (f", {failed} failed to load" if failed else "") + \
        (f", {troubled} with problems" if troubled else "")
    return "\n\n".join(blocks) + "\n\n" + tail
