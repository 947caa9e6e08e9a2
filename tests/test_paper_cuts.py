"""Small CLI faults from one issue, each pinned: a closed stdout, the CPU-machine hint for a CUDA
program, --help's defaults, and build's SOURCE (a sample name, a .py file in a package folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.cli.terminal import EXIT_STDOUT_CLOSED

ROOT = Path(__file__).resolve().parent.parent


def _report(program: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "toolkit", "report", str(program), "--dry-run"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def test_a_closed_stdout_ends_quietly_with_141(built_sample):
    """stdout's reader gone before anything is written: no traceback, no "Exception ignored", not exit 1."""
    read, write = os.pipe()
    os.close(read)
    try:
        p = _report(built_sample("total_collision").root, stdout=write)
    finally:
        os.close(write)
    _, err = p.communicate(timeout=300)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert p.returncode == EXIT_STDOUT_CLOSED, err


def test_report_into_head_1_ends_quietly(built_sample):
    """``constshare report PROGRAM --dry-run | head -1``: one line read, the pipe closed."""
    p = _report(built_sample("total_collision").root, stdout=subprocess.PIPE)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=300)
    assert first.strip(), err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert p.returncode in (0, EXIT_STDOUT_CLOSED), err  # 0: all was written before the pipe closed


def test_a_cuda_program_on_a_cpu_machine_names_the_cli_switch_and_the_function(built_sample, monkeypatch):
    from toolkit.core.errors import IncompatibleProgramError
    from toolkit.runtimes import Device, aoti

    monkeypatch.setattr(aoti, "check_compatible", lambda *a: None)  # as if built for cuda
    monkeypatch.setattr(aoti.torch.cuda, "is_available", lambda: False)
    with pytest.raises(IncompatibleProgramError) as e:
        aoti.AotiRuntime().check_available(built_sample("total_collision"), Device("cuda", 0))
    assert "pass --dry-run, or call toolkit.dry_run(...)" in str(e.value)


def _option_help(text: str) -> dict[str, str]:
    """--help's text per option: its line and the lines under it, joined."""
    blocks: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^  (-[-\w]+)", line)
        if m:
            name = m.group(1)
            blocks[name] = line
        elif name is not None and line.startswith("    "):
            blocks[name] += " " + line.strip()
        else:
            name = None
    return blocks


def test_report_help_shows_the_defaults(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        main(["report", "--help"])
    assert e.value.code == 0
    blocks = _option_help(capsys.readouterr().out)
    for option in ("--device", "--draws", "--seed", "--oracle", "--policy"):
        assert "default" in blocks.get(option, ""), (option, blocks.get(option))
    assert "(default: 3)" in blocks["--draws"] and "otherwise fingerprint" in blocks["--policy"]
    assert "cuda:N" in blocks["--device"]
    assert "(default: None)" not in str(blocks) and "(default: False)" not in str(blocks)


def test_help_lists_the_closed_stdout_exit_code(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"{EXIT_STDOUT_CLOSED}  stdout closed" in capsys.readouterr().out


@pytest.mark.parametrize("source", ["total_collision", "sample_programs/total_collision.py"])
def test_build_source_a_sample_name_or_a_file_with_relative_imports(source, monkeypatch):
    from toolkit.cli.arguments import load_source_module

    monkeypatch.chdir(ROOT)
    mod = load_source_module(source)
    assert callable(mod.methods)
    assert Path(mod.__file__).resolve() == ROOT / "sample_programs" / "total_collision.py"


def test_a_py_file_outside_a_package_still_loads(tmp_path):
    from toolkit.cli.arguments import load_source_module

    f = tmp_path / "mine.py"
    f.write_text("def methods():\n    return {}\n")
    assert callable(load_source_module(str(f)).methods)
