"""Entry points for running from a source tree that is not installed (the lent GPU machine
has no package index, so nothing is pip-installed there).

``formula-runtime`` finds third-party plugins, and pytest finds ``runtime.testing``, only
through installed entry points. This writes a minimal ``*.dist-info`` (METADATA and
entry_points.txt, read from each ``pyproject.toml``) for the project and for every plugin
under ``plugins/`` into argv[1]; put that folder, the tree and the plugin folders on
``PYTHONPATH``. Prints the plugin folders, ``:``-separated, for the caller to add.
"""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_dist_info(pyproject: Path, target: Path) -> None:
    project = tomllib.loads(pyproject.read_text())["project"]
    name, version = project["name"], project["version"]
    info = target / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, points in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in points.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))


def main(target: str) -> None:
    out = Path(target)
    write_dist_info(ROOT / "pyproject.toml", out)
    plugin_dirs = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))
    for folder in plugin_dirs:
        write_dist_info(folder / "pyproject.toml", out)
    print(":".join(str(p) for p in plugin_dirs))


if __name__ == "__main__":
    main(sys.argv[1])
