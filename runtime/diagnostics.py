"""What ``formula atoms`` and ``formula plugins`` print: which plugin gave which atom, what
each atom can do on which backend, and which plugins failed to load and why.

Each report is two steps, data then text (``atoms_table`` → ``format_atoms``,
``plugins_report`` → ``format_plugins``), so tools and tests read the rows and people
read the text. Everything comes from a :class:`runtime.registry.Registry` as it stands;
nothing here calls plugin code.
"""
from __future__ import annotations

import types
from collections.abc import Iterable, Sequence
from typing import Any

from .atomspec import AtomSpec

BACKEND_ORDER = ("reference", "cpu", "cuda")  # the built-in backends first, then by name


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
        rows.append({
            "reference": ref,
            "atom": spec.name,
            "alias_of": spec.ref if ref != spec.ref else None,
            "plugin": owner.name if owner else None,
            "distribution": owner.distribution if owner else None,
            "version": owner.version if owner else None,
            "inputs": list(spec.inputs),
            "attributes": sorted(spec.attributes),
            "backends": _sorted_backends(spec.kernels),
            "elementwise": spec.elementwise is not None,
            "anchor_backends": _sorted_backends(spec.anchors),
            "value_checks": spec.check_values is not None,
            "inplace": spec.inplace,
            "summary": spec.summary,
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
        traits.append(f"in-place on {row['inputs'][row['inplace']]}")
    return ", ".join(traits) or "-"


def _provider(row: dict[str, Any]) -> str:
    if row["distribution"]:
        version = f" {row['version']}" if row["version"] else ""
        return f"{row['distribution']}{version}"
    return row["plugin"] or "?"


def format_atoms(rows: Sequence[dict[str, Any]]) -> str:
    """A table: reference, atom, distribution, backends with kernels, traits."""
    if not rows:
        return "no atoms are registered (is formula-runtime's built-in 'atoms' plugin loadable?)"
    header = ("REFERENCE", "ATOM", "PROVIDED BY", "KERNELS", "TRAITS")
    table = [header]
    for r in rows:
        atom = r["atom"] if r["alias_of"] is None else f"{r['atom']} (alias)"
        table.append((r["reference"], atom, _provider(r), ", ".join(r["backends"]) or "none",
                      _traits(r)))
    widths = [max(len(line[k]) for line in table) for k in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths)) + "  " + line[-1]
             for line in table]
    distinct = len({r["alias_of"] or r["reference"] for r in rows})
    lines.append(f"{len(rows)} references, {distinct} atoms")
    return "\n".join(line.rstrip() for line in lines)


# --- formula plugins --------------------------------------------------------------------
def plugins_report(registry) -> list[dict[str, Any]]:
    """Every registered plugin (registration order) with what it provides, then every plugin
    that failed to load (status ``failed``) with its error."""
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
            "hooks": sorted(h.name for h in registry.pm.get_hookcallers(plugin) or ())
            if plugin is not None else [],
            "atoms": [s.name for s in atoms],
            "references": sorted(refs),
            "kernels": {b: {"implemented": [s.name for s in atoms if b in s.kernels],
                            "missing": [s.name for s in atoms if b not in s.kernels],
                            "registered_backend": b in backend_names}
                        for b in kernel_backends},
            "elementwise": [s.name for s in atoms if s.elementwise is not None],
            "anchors": {s.name: _sorted_backends(s.anchors) for s in atoms if s.anchors},
            "backends": _backends_of(plugin, registry.backends),
            "registered_kernels": sorted(f"{ref} on {backend}" for (ref, backend), e
                                         in registry.kernels.items() if e.owner == info),
        })
    for problem in registry.problems:
        rows.append({"name": problem.plugin, "distribution": None, "version": None,
                     "status": "failed", "error": problem.error, "hooks": [], "atoms": [],
                     "references": [], "kernels": {}, "elementwise": [], "anchors": {},
                     "backends": [], "registered_kernels": []})
    return rows


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
            blocks.append(f"{r['name']}  FAILED\n  error       {r['error']}")
            continue
        head = r["name"]
        if r["distribution"]:
            head += f"  ({r['distribution']} {r['version'] or '(version unknown)'})"
        lines = [head, f"  hooks       {', '.join(r['hooks']) or '-'}"]
        if r["atoms"]:
            lines.append(f"  atoms       {len(r['atoms'])}: {', '.join(r['atoms'])}")
            lines.append(f"  references  {len(r['references'])}: " +
                         "\n              ".join(r["references"]))
            n = len(r["atoms"])
            counts = []
            for backend, k in r["kernels"].items():
                note = "" if k["registered_backend"] else " (no such backend registered)"
                counts.append(f"{backend} {len(k['implemented'])}/{n}{note}")
            lines.append(f"  kernels     {', '.join(counts)}")
            for backend, k in r["kernels"].items():
                if k["missing"]:
                    lines.append(f"  no {backend} kernel: {', '.join(k['missing'])}")
            fusion = []
            if r["elementwise"]:
                fusion.append(f"elementwise: {', '.join(r['elementwise'])}")
            if r["anchors"]:
                fusion.append("anchors: " + ", ".join(f"{a} ({', '.join(b)})"
                                                      for a, b in r["anchors"].items()))
            lines.append(f"  fusion      {'; '.join(fusion) or '-'}")
        if r["backends"]:
            lines.append(f"  backends    {', '.join(r['backends'])}")
        blocks.append("\n".join(lines))
    failed = sum(r["status"] == "failed" for r in rows)
    tail = f"{len(rows) - failed} plugins loaded" + (f", {failed} failed to load" if failed else "")
    return "\n\n".join(blocks) + "\n\n" + tail
