"""docs/writing-plugins.md cannot rot: its plugin files are taken from the Markdown, installed
with pip into a temporary path, and its commands run against them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "writing-plugins.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def tutorial_files() -> dict[str, str]:
    """Fenced blocks whose first line is ``# NAME.py`` or ``# NAME.toml``, by NAME."""
    files = {}
    for _lang, body in BLOCK.findall(TUTORIAL.read_text()):
        m = re.fullmatch(r"# (\S+\.(?:py|toml))", body.splitlines()[0])
        if m:
            files[m.group(1)] = body
    return files


def tutorial_commands() -> list[str]:
    """The shell block of "Install and run"."""
    section = TUTORIAL.read_text().split("## 3. Install and run", 1)[1].split("\n## ", 1)[0]
    (body,) = [body for lang, body in BLOCK.findall(section) if lang == "bash"]
    return [line for line in body.splitlines() if line.strip()]


def test_the_tutorial_plugin_installs_and_runs(tmp_path):
    files = tutorial_files()
    assert set(files) == {"formula_softsign.py", "pyproject.toml", "use_softsign.py"}
    assert len(files["formula_softsign.py"].splitlines()) <= 50  # "about 40 lines"
    project = tmp_path / "formula-softsign"
    project.mkdir()
    for name, text in files.items():
        (project / name).write_text(text)
    commands = tutorial_commands()
    assert commands[0] == "pip install -e ."  # replaced below by an install into a path
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                          str(site), str(project)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {**os.environ, "PYTHONPATH": str(site),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    outputs = []
    for command in commands[1:]:
        done = subprocess.run(command, shell=True, cwd=project, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        outputs.append(done.stdout)
    assert (project / "softsign.program.json").is_file()
    run, plugins = outputs[1], outputs[2]
    assert "%0  float32[4, 8]" in run
    assert "formula_softsign  (formula-softsign 0.1.0)" in plugins
    assert "cpu 1/1 (1 fused), cuda 1/1 (1 fused)" in plugins
