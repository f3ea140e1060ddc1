"""docs/writing-plugins.md cannot rot: its plugin files are taken from the Markdown, installed
with pip into a temporary path, and its commands run against them."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
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


def install(tmp_path: Path, files: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """The plugin's files written to a project folder and pip-installed into a path of their
    own: (the project folder, the environment that sees the plugin)."""
    project = tmp_path / "formula-softsign"
    project.mkdir()
    for name, text in files.items():
        (project / name).write_text(text)
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                          str(site), str(project)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {**os.environ, "PYTHONPATH": str(site), "FORMULA_TIERED": "1",  # tiered, as users run
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return project, env


def shell(command: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, cwd=project, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_tutorial_plugin_installs_and_runs(tmp_path):
    files = tutorial_files()
    assert set(files) == {"formula_softsign.py", "pyproject.toml", "use_softsign.py"}
    assert len(files["formula_softsign.py"].splitlines()) <= 50  # "about 40 lines"
    # the script checks the cpu backend's own kernel, not a first tiered run's reference one
    assert "tiered=False" in files["use_softsign.py"] and "assert_backends_agree(" in files["use_softsign.py"]
    commands = tutorial_commands()
    assert commands[0] == "pip install -e ."  # replaced below by an install into a path
    project, env = install(tmp_path, files)
    outputs = []
    for command in commands[1:]:
        done = shell(command, project, env)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        outputs.append(done.stdout)
    assert (project / "softsign.program.json").is_file()
    run, plugins = outputs[1], outputs[2]
    assert "%0  float32[4, 8]" in run
    assert "formula_softsign  (formula-softsign 0.1.0)" in plugins
    assert "cpu 1/1 (1 fused), cuda 1/1 (1 fused)" in plugins


EXPRESSION = '"{0} / (1.0 + abs({0}))"'
KERNEL_LINE = "out[...] = x / (1 + np.abs(x))"
ATOM = ("atom formula-softsign/formula-atom-softsign@1 of plugin formula_softsign "
        "(formula-softsign 0.1.0)")


def variant(old: str, new: str) -> dict[str, str]:
    """The tutorial's files with one mistake in the plugin."""
    files = tutorial_files()
    assert files["formula_softsign.py"].count(old) == 1
    files["formula_softsign.py"] = files["formula_softsign.py"].replace(old, new)
    return files


def test_a_broken_expression_is_named_where_it_is_declared(tmp_path):
    """docs/writing-plugins.md §7: the plugin's problem in `formula plugins`, and the plan's
    kernel_failed (atom, plugin and distribution, expression, path) before any run."""
    project, env = install(tmp_path, variant(EXPRESSION, '"{0} +* 1"'))
    why = "its ScalarOp expression '{0} +* 1' is refused: it is not a Python expression: invalid syntax"
    done = shell("python use_softsign.py", project, env)
    assert done.returncode == 1 and f"[kernel_failed] $.instructions[0]: {ATOM}: {why}" in done.stderr
    plugins = shell("formula plugins", project, env)
    assert "  PROBLEM     atom formula-softsign/formula-atom-softsign@1: its ScalarOp" in plugins.stdout
    run = shell("formula run softsign.program.json --random --dim T=4", project, env)  # tiered
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.startswith(f"error [kernel_failed] $.instructions[0]: {ATOM}: {why}")
    assert shell("formula run softsign.program.json --random --dim T=4 --backend reference",
                 project, env).returncode == 0  # its reference kernel still serves


def test_a_raising_kernel_is_named_and_keeps_the_cli_contract(tmp_path):
    project, env = install(tmp_path, variant(KERNEL_LINE, 'raise ValueError("softsign broke")'))
    what = "its 'reference' kernel raised ValueError: softsign broke"
    done = shell("python use_softsign.py", project, env)  # assert_backends_agree runs the oracle
    assert done.returncode == 1 and f"[kernel_failed] $.instructions[0]: {ATOM}: {what}" in done.stderr
    assert "ValueError: softsign broke" in done.stderr  # the cause, in the traceback
    run = shell("formula run softsign.program.json --random --dim T=4 --backend reference --json",
                project, env)
    assert run.returncode == 1, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    assert doc["ok"] is False and doc["error"]["code"] == "kernel_failed"
    assert doc["error"]["path"] == "$.instructions[0]" and doc["error"]["message"].startswith(f"{ATOM}: {what}")


def test_a_kernel_failing_in_the_background_compile_reaches_the_next_one_shot_run(tmp_path):
    """A cpu kernel that raises only once compiled: the one-shot `formula run` answers on the
    reference kernels, the `formula compile` it leaves fails, and the next run prints that
    error once, named (README, "One-shot formula run")."""
    files = variant('    kernels={"reference": reference_kernel},',
                    '    kernels={"reference": reference_kernel, "cpu": broken_cpu_kernel},')
    files["formula_softsign.py"] = files["formula_softsign.py"].replace(
        '    elementwise=lambda node: ScalarOp("{0} / (1.0 + abs({0}))"),  # cpu, cuda: fused\n',
        "").replace("\n\nSOFTSIGN = ", '''


def broken_cpu_kernel(request):
    def run(inputs, out):
        raise ZeroDivisionError("softsign on cpu")
    return plain_kernel(run)


SOFTSIGN = ''', 1)
    assert "broken_cpu_kernel(request)" in files["formula_softsign.py"] and "elementwise=" not in files["formula_softsign.py"]
    project, env = install(tmp_path, files)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env["FORMULA_CACHE_DIR"] = str(cache)  # nothing ready: the first one-shot run is tiered
    what = f"{ATOM}: its 'cpu' kernel raised ZeroDivisionError: softsign on cpu"
    done = shell("python use_softsign.py", project, env)  # writes the program, then runs cpu untiered
    assert done.returncode == 1 and f"[kernel_failed] $.instructions[0]: {what}" in done.stderr
    first = shell("formula run softsign.program.json --random --dim T=4 --json", project, env)
    assert first.returncode == 0, first.stdout + first.stderr
    doc = json.loads(first.stdout)
    assert doc["tier"] == "reference" and doc["filling_cache"]
    deadline = time.monotonic() + 240
    while _alive(doc["filling_cache"]) and time.monotonic() < deadline:  # the compile it left
        time.sleep(0.5)
    second = shell("formula run softsign.program.json --random --dim T=4 --no-fill-cache", project, env)
    assert second.returncode == 0, second.stdout + second.stderr  # (served by reference again)
    assert second.stderr.startswith(f"error [kernel_failed] $.instructions[0]: {what}")
    assert "in the background compile an earlier `formula run` of this program left" in second.stderr
    third = shell("formula run softsign.program.json --random --dim T=4 --no-fill-cache", project, env)
    assert "kernel_failed" not in third.stderr  # printed once


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
