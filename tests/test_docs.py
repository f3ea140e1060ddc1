"""The documentation a clone ships: the contract is in docs/, identical to the shared copy
when one is beside the repository; every "SPEC §N" resolves to it; no link leaves the tree."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "docs" / "spec.md"
SHARED = ROOT.parent / "shared" / "SPEC.md"
PAGES = sorted(p for p in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("bench/*.md"),
                           *ROOT.glob("plugins/*/README.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def links(text: str) -> list[str]:
    """Markdown link targets outside code."""
    return LINK.findall(CODE.sub("", text))


def test_spec_matches_the_shared_contract():
    if not SHARED.is_file():
        pytest.skip("no ../shared/SPEC.md beside this clone")
    assert SPEC.read_bytes() == SHARED.read_bytes(), "docs/spec.md differs from ../shared/SPEC.md: copy it"


def spec_sections() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^#+\s*(\d+[a-z]?(?:\.\d+)?)\.?\s", SPEC.read_text(), re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_spec_citations_resolve_to_docs_spec(page: Path):
    text = page.read_text()
    cited = set(re.findall(r"SPEC §(\d+[a-z]?(?:\.\d+)?)", text))
    if page == SPEC or not cited:
        return
    assert cited <= spec_sections(), f"{page.name} cites sections docs/spec.md lacks: {cited - spec_sections()}"
    targets = {(page.parent / link.split("#")[0]).resolve() for link in links(text)}
    assert SPEC in targets, f"{page.name} cites SPEC §… but never links docs/spec.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_in_the_repository(page: Path):
    for link in links(page.read_text()):
        if link.startswith(("http://", "https://", "#", "mailto:")):
            continue
        target = (page.parent / link.split("#")[0]).resolve()
        assert target.is_relative_to(ROOT), f"{page.name}: {link} leaves the repository"
        assert target.exists(), f"{page.name}: {link} names nothing in the repository"


def test_ci_runs_the_readme_test_command_and_nothing_that_installs():
    """.ci/run takes its command from the README, so the README's is what CI proves; it may
    not add an install step (an upgraded pip once hid a command that failed on stock pip)."""
    import subprocess

    script = (ROOT / ".ci" / "run").read_text()
    assert "pip install" not in script and "--upgrade" not in script
    extract = script.split("command=$(", 1)[1].split(")\n", 1)[0]
    found = subprocess.run(["bash", "-c", extract], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert found.startswith("python3 -m venv .venv && ") and "python -m pytest -n auto --dist loadfile tests" in found
    assert found in (ROOT / "README.md").read_text()


def test_coming_from_arti_maps_to_codes_that_exist():
    """Every code the arti page's FF2_* table names on our side is a SPEC §6 code."""
    from runtime.core.errors import CODES

    text = (ROOT / "docs" / "coming-from-arti.md").read_text()
    table = text.split("| arti | formula-runtime |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(" | ", 1) for line in table.splitlines()[2:]]
    assert rows and all(left.startswith("| `FF2_") for left, _ in rows)
    ours = {code for _, right in rows for code in re.findall(r"`([a-z_]+)`", right)}
    assert ours and ours <= CODES, ours - CODES
    assert "kernel_failed" in text and "coming-from-arti.md" in (ROOT / "README.md").read_text()
