"""The tuning registry (runtime/core/settings.py): every ``FORMULA_*`` variable is declared
there and read through it, docs/tuning.md is generated from it, and each module still reads
its setting when it did (tuning at import, the rest per call)."""
from __future__ import annotations

import ast
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.core import settings, tuning
from runtime.core.errors import FormulaError

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [ROOT / "runtime", ROOT / "atoms", ROOT / "plugins" / "formula-norms"]
REGISTRY = ROOT / "runtime" / "core" / "settings.py"
ATTR = {v.name: k for k, v in vars(settings).items() if isinstance(v, settings.Setting)}


def test_docs_tuning_md_is_generated_from_the_registry():
    page = (ROOT / "docs" / "tuning.md").read_text()
    assert page == tuning.render(), "docs/tuning.md is stale: python -m runtime.core.tuning > docs/tuning.md"


def test_tuning_md_is_written_by_python_m_runtime_core_tuning():
    proc = subprocess.run([sys.executable, "-m", "runtime.core.tuning"], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert proc.stdout == tuning.render() and proc.stderr == ""  # no runpy double-import warning


def _env_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of each environment read whose key is a ``FORMULA_*`` literal or not a
    literal at all (a name could hold one)."""
    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
               (isinstance(node, ast.Name) and node.id == "environ")

    def suspect(key: ast.AST | None) -> str | None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value if key.value.startswith("FORMULA_") else None
        return ast.unparse(key) if key is not None else "<none>"

    found = []
    for node in ast.walk(ast.parse(source)):
        key: ast.AST | None = None
        if isinstance(node, ast.Call):
            f = node.func
            reads = (isinstance(f, ast.Attribute) and (f.attr == "getenv" or is_environ(f.value))) or \
                    (isinstance(f, ast.Name) and f.id == "getenv")
            if not reads:
                continue
            key = node.args[0] if node.args else None
            if key is None and isinstance(f, ast.Attribute) and f.attr in ("items", "keys", "values", "copy"):
                continue  # a whole copy of the environment (subprocess envs) names no setting
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            key = node.left
        else:
            continue
        if (what := suspect(key)) is not None:
            found.append((node.lineno, what))
    return sorted(found)


def test_the_scan_finds_every_way_of_reading_a_formula_variable():
    source = """
import os
from os import environ, getenv
a = os.environ.get("FORMULA_A", "1")
b = os.environ["FORMULA_B"]
c = os.getenv("FORMULA_C")
d = environ.get(ENV)
e = "FORMULA_E" in os.environ
f = getenv(name)
ok = os.environ.get("NUMBA_CACHE_DIR"), os.environ["HOME"], dict(os.environ.items())
"""
    assert [k for _, k in _env_reads(source)] == ["FORMULA_A", "FORMULA_B", "FORMULA_C", "ENV", "FORMULA_E", "name"]


def test_no_module_but_the_registry_reads_a_formula_variable():
    offenders = []
    for folder in SCANNED:
        for path in sorted(folder.rglob("*.py")):
            if path == REGISTRY or ".venv" in path.parts:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}: {key}" for line, key in _env_reads(path.read_text())]
    assert offenders == [], "read these through runtime.core.settings:\n" + "\n".join(offenders)


def test_every_formula_variable_named_in_the_tree_is_declared():
    named = set()
    pages = [ROOT / "README.md", *ROOT.glob("docs/*.md")]
    for folder in ("runtime", "atoms", "plugins", "tests", "bench"):
        pages += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".sh")]
    for path in pages:
        if path == Path(__file__).resolve():
            continue  # its scanner's own examples
        named |= {m for m in re.findall(r"\bFORMULA_[A-Z][A-Z0-9_]*", path.read_text()) if m != "FORMULA_"}
    assert named - set(settings.SETTINGS) == set()


@pytest.mark.parametrize("name", sorted(settings.SETTINGS))
def test_each_declaration_is_complete_and_read_where_it_says(name):
    s = settings.SETTINGS[name]
    assert s.does and s.why and s.expected and s.read_at in ("import", "call")
    for place in s.module.split(", "):
        path = ROOT / place.split(" (")[0]
        assert f"{ATTR[name]}.read()" in path.read_text(), f"{path} does not read {name} from the registry"


TUNED = {name: s for name, s in settings.SETTINGS.items() if s.group == "tuning"}


def test_tuning_values_reach_their_module_constants_at_import():
    """A fresh process with every tuning variable set (one malformed) imports each module's
    constant from it; the malformed one keeps its default and says which setting and why."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORMULA_") or k == "FORMULA_CACHE_DIR"}
    wanted, where = {}, {}
    for i, (name, s) in enumerate(sorted(TUNED.items())):
        path, attr = re.fullmatch(r"(\S+)\.py \((\w+)\)", s.module).groups()
        where[name] = (path.replace("/", "."), attr)
        wanted[name] = s.default + 1000 + i
        env[name] = str(wanted[name])
    env["FORMULA_CPU_PARALLEL_MIN"] = "lots"
    wanted["FORMULA_CPU_PARALLEL_MIN"] = settings.CPU_PARALLEL_MIN.default
    code = ("import importlib, json, sys; where = json.loads(sys.argv[1]); "
            "print(json.dumps({n: getattr(importlib.import_module(m), a) for n, (m, a) in where.items()}))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(where)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == wanted
    assert "FORMULA_CPU_PARALLEL_MIN='lots' is not an integer: using the default, 65536" in proc.stderr


def test_a_malformed_tuning_value_warns_once_and_keeps_the_default(monkeypatch, caplog):
    monkeypatch.setenv("FORMULA_CONTRACT_PACK_ROWS", "512 rows")
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        assert settings.CONTRACT_PACK_ROWS.read() == 512
        assert settings.CONTRACT_PACK_ROWS.read() == 512
    warned = [r.getMessage() for r in caplog.records if "FORMULA_CONTRACT_PACK_ROWS" in r.getMessage()]
    assert warned == ["FORMULA_CONTRACT_PACK_ROWS='512 rows' is not an integer: using the default, 512"]
    monkeypatch.setenv("FORMULA_CONTRACT_PACK_ROWS", " 0 ")
    assert settings.CONTRACT_PACK_ROWS.read() == 0  # parsed as int() always did


def test_malformed_limits_are_schema_errors_naming_the_setting(monkeypatch):
    from runtime.plan.memory import memory_limit
    from runtime.program.loader import max_program_bytes

    monkeypatch.setenv("FORMULA_MAX_PROGRAM_BYTES", "big")
    with pytest.raises(FormulaError) as err:
        max_program_bytes()
    assert (err.value.code, err.value.path) == ("schema", "$")
    assert err.value.message == "FORMULA_MAX_PROGRAM_BYTES must be a positive integer, got 'big'"
    monkeypatch.setenv("FORMULA_MAX_PROGRAM_BYTES", "0")
    with pytest.raises(FormulaError):
        max_program_bytes()
    monkeypatch.setenv("FORMULA_MEMORY_LIMIT", "lots")
    with pytest.raises(FormulaError) as err:
        memory_limit()
    assert (err.value.code, err.value.path) == ("schema", "$env.FORMULA_MEMORY_LIMIT")
    assert "FORMULA_MEMORY_LIMIT must be a positive number of bytes" in err.value.message
    monkeypatch.setenv("FORMULA_MEMORY_LIMIT", " 2GiB ")
    assert memory_limit() == 2 << 30
    monkeypatch.setenv("FORMULA_MEMORY_LIMIT", "  ")  # blank: the machine's memory, as before
    assert memory_limit() > 0


def test_switches_are_read_per_call(monkeypatch, tmp_path):
    from runtime.execution.tiers import tiered_default
    from runtime.kernels import codegen, threads
    from runtime.plugins.registry import Registry
    from runtime.testing import real_cuda

    for value, on in (("0", False), (" Off ", False), ("no", False), ("1", True), ("", True)):
        monkeypatch.setenv("FORMULA_TIERED", value)
        assert tiered_default("cpu", None) is on
    monkeypatch.delenv("FORMULA_TIERED")
    assert tiered_default("cpu", None) and not tiered_default("cuda", None)
    monkeypatch.setenv("FORMULA_PIN_THREADS", " 1 ")
    assert threads.setting() == "1"
    monkeypatch.setenv("FORMULA_CACHE_DIR", str(tmp_path))
    assert codegen.configured_cache_dir() == tmp_path
    monkeypatch.setenv("FORMULA_REAL_CUDA", "1")
    assert real_cuda()
    monkeypatch.setenv("FORMULA_REAL_CUDA", "0")
    assert not real_cuda()
    monkeypatch.setenv("FORMULA_FUSED_ATTENTION", "0")
    assert settings.FUSED_ATTENTION.read() is False
    monkeypatch.setenv("FORMULA_FUSED_ATTENTION", "false")  # only 0 turned it off: still on
    assert settings.FUSED_ATTENTION.read() is True
    loads = []
    monkeypatch.setattr(Registry, "_load_entry_points", lambda self: loads.append(self))
    monkeypatch.setenv("FORMULA_DISABLE_PLUGIN_AUTOLOAD", "1")
    Registry()
    monkeypatch.delenv("FORMULA_DISABLE_PLUGIN_AUTOLOAD")
    Registry()
    assert len(loads) == 1


def test_formula_debug_reraises_in_the_cli(monkeypatch, capsys):
    from runtime import cli

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "_atoms", broken)
    monkeypatch.delenv("FORMULA_DEBUG", raising=False)
    assert cli.main(["atoms"]) == 2 and "internal error: RuntimeError: boom" in capsys.readouterr().err
    monkeypatch.setenv("FORMULA_DEBUG", "0")  # any non-empty value, as before
    with pytest.raises(RuntimeError):
        cli.main(["atoms"])
