"""The CLI at its edges: outputs that cannot be written, Ctrl-C during a scan, a .so that
does not load, and the notice that a full load runs a program's native code."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from test_csv_safety import hostile_zoo

import toolkit.reports.native_code
import toolkit.reports.output
from toolkit.cli import EXIT_INTERRUPTED, main

ROOT = Path(__file__).resolve().parent.parent
PTE = Path(__file__).parent / "fixtures" / "executorch-1.5.1-cuda" / "shared_ok" / "prog.pte"


@pytest.fixture()
def prog(tmp_path) -> Path:
    return hostile_zoo(tmp_path / "zoo")[0]


def _argv(cmd: str, prog: Path, csv: str) -> list[str]:
    if cmd == "scan":
        return ["scan", str(prog.parent), "--policies", "fingerprint", "--jobs", "1", "--csv", csv, "--force"]
    return [cmd, str(prog), "--dry-run", "--csv", csv, "--force"]


def _one_line_error(capsys, *names: str) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("constshare: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in names), lines[0]
    return lines[0]


@pytest.mark.parametrize("cmd", ["report", "compare", "scan"])
def test_a_device_as_csv_is_one_line_exit_2(prog, cmd, capsys):
    assert main(_argv(cmd, prog, "/dev/full")) == 2
    _one_line_error(capsys, "/dev/full", "not a regular file")


def test_a_fifo_as_csv_does_not_hang(prog, tmp_path):
    """Opening a FIFO for writing blocks until a reader comes: it is refused before any work."""
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    r = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *_argv("report", prog, str(fifo))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{fifo}: is not a regular file" in r.stderr


def _unwritable(folder: Path) -> None:
    """Make ``folder`` unwritable for this process: immutable as root (modes do not bind root), read-only else."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode:
            pytest.skip("running as root without chattr +i here: no folder can be made unwritable")
    else:
        folder.chmod(0o555)


@pytest.mark.parametrize("cmd", ["report", "scan"])
def test_an_unwritable_folder_is_one_line_exit_2(prog, tmp_path, cmd, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _unwritable(out)
    try:
        assert main(_argv(cmd, prog, str(out / "x.csv"))) == 2
        _one_line_error(capsys, str(out), "not writable")
        assert list(out.iterdir()) == []
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(out)])
        out.chmod(0o755)


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EACCES"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(prog, tmp_path, monkeypatch, capsys, errno_name):
    """Disk full or permission denied at the moment of writing: one line, exit 2, the file
    there before unchanged, no half file and no temporary file."""
    import errno

    csv = tmp_path / "out" / "r.csv"
    csv.parent.mkdir()
    csv.write_text("before\n")

    def fail(*a, **k):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    monkeypatch.setattr(toolkit.reports.output.os, "replace", fail)
    assert main(_argv("report", prog, str(csv))) == 2
    _one_line_error(capsys, str(csv), os.strerror(getattr(errno, errno_name)))
    assert [p.name for p in csv.parent.iterdir()] == ["r.csv"] and csv.read_text() == "before\n"


def test_csv_written_atomically_over_an_old_one(prog, tmp_path):
    csv = tmp_path / "r.csv"
    csv.write_text("old\n")
    assert main(_argv("report", prog, str(csv))) == 0
    assert pd.read_csv(csv)["policy"].eq("fingerprint").all()
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["r.csv"]
    assert csv.stat().st_mode & 0o777 == 0o644


def _ctrl_c_heard() -> None:
    """SIGINT's default action in the process about to run the CLI: a suite started as a background
    job of a shell without job control has it ignored, and a process started so keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def ctrl_c_raises():
    """KeyboardInterrupt on SIGINT in this process meanwhile, whatever the suite was started with."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_scan_stops_at_once_and_writes_what_finished(tmp_path):
    """SIGINT to the whole process group (a Ctrl-C) after the first program: exit 130 within
    seconds, no traceback, the CSV holds the programs scanned, and no worker is left."""
    n = 16
    zoo = tmp_path / "zoo"
    hostile_zoo(zoo, n, constants=2000)
    csv = tmp_path / "s.csv"
    p = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "scan", str(zoo), "--jobs", "1", "--csv", str(csv)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_heard,
    )
    try:
        first = p.stderr.readline()
        assert first.startswith("constshare: scanned 1 of 16 programs"), first
        t = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == EXIT_INTERRUPTED, err
    assert time.monotonic() - t < 15
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    scanned = pd.read_csv(csv, keep_default_na=False)
    done = scanned["path"].nunique()
    assert 1 <= done < n and f"interrupted: {done} of {n} programs scanned" in out
    for _ in range(50):  # what it started (the workers, multiprocessing's resource tracker) exits with it
        if subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True).returncode == 1:
            break
        time.sleep(0.1)
    else:
        pytest.fail("a worker outlived the scan")
    assert "leaked" not in err, err


def test_a_ctrl_c_while_scan_workers_start_is_not_lost_and_the_workers_never_see_it(ctrl_c_raises):
    """The window in which a scan starts its workers: a SIGINT then is raised once it ends, not
    dropped (the scan would run to its end and exit 1), and a process started then has it blocked."""
    from toolkit.workflows.scan import sigint_blocked

    with pytest.raises(KeyboardInterrupt):
        with sigint_blocked():
            child = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import signal; print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # raised here where another thread took the signal, else as the block ends
    assert child.stdout.strip() == "True"
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the mask restored


def test_ctrl_c_elsewhere_is_exit_130_without_a_traceback(prog, monkeypatch, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("toolkit.workflows.dry_run.dry_run", interrupted)
    assert main(["report", str(prog), "--dry-run"]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "constshare: interrupted"


# ------------------------------------------------------------------ native code


def test_a_so_that_fails_to_load_leaves_the_so_cache(tmp_path):
    """An embedded .so that dlopen refuses: the load fails and leaves no copy of it on disk (it is
    dlopen'ed from a sealed in-memory copy: nothing is written to the cache folder)."""
    from executorch_fixtures import unpacked

    import toolkit
    from toolkit.core.options import LoadOptions
    from toolkit.runtimes import Device
    from toolkit.runtimes.aoti import AotiMethod, AotiRuntime

    # generation 1 (executorch 1.2.0) keys a .so by its method's name, not by its sha256, so a .pte whose
    # .so bytes are zeroed still opens (the sealed copy of what is then verified is what dlopen gets)
    bad = shutil.copytree(unpacked("1.2.0") / "shared_state", tmp_path / "p") / "prog.pte"
    so = toolkit.open_program(bad).methods[0].location.so
    with open(bad, "r+b") as f:  # not an ELF file any more: dlopen fails
        f.seek(so.offset)
        f.write(b"\0" * so.size)
    program = toolkit.open_program(bad)
    method = program.methods[0]
    cache = tmp_path / "cache"
    runtime = AotiRuntime(LoadOptions(cache_dir=cache))
    with pytest.raises(RuntimeError):
        AotiMethod(runtime, program, method, Device("cpu"))
    assert not (cache / "so").exists() or list((cache / "so").iterdir()) == []


@pytest.fixture()
def fresh_notice(monkeypatch):
    monkeypatch.setattr(toolkit.reports.native_code, "_NATIVE_CODE_NOTICED", [])


def test_a_full_load_says_once_that_it_runs_native_code(fresh_notice, capsys):
    """report and compare (not dry runs) of a file not built here: the notice on stderr before
    the load, once per process (the fixture's CUDA program then fails to load on a CPU, or loads)."""
    main(["report", str(PTE), "--policy", "fingerprint"])
    err = capsys.readouterr().err
    assert f"constshare: loading 'shared_ok' from {PTE.parent.resolve()} runs the native code compiled into it" in err
    main(["compare", str(PTE), "--policies", "fingerprint"])
    assert "runs the native code" not in capsys.readouterr().err
    main(["report", str(PTE), "--dry-run"])
    assert "runs the native code" not in capsys.readouterr().err


def test_no_notice_for_a_program_built_here_nor_for_a_dry_run(fresh_notice, built_sample, prog, monkeypatch):
    from toolkit.build import cache_trust
    from toolkit.reports.native_code import native_code_notice
    from toolkit.sources import open_program

    sample = built_sample("total_collision")
    monkeypatch.setattr(cache_trust, "_BUILT_HERE", set())
    cache_trust.note_built_here(sample.root)  # as build_sample notes its own builds (a reused one is told)
    assert native_code_notice(sample) is None  # built by this process
    assert main(["report", str(prog), "--dry-run"]) == 0 and toolkit.reports.native_code._NATIVE_CODE_NOTICED == []
    assert "runs the native code" in native_code_notice(open_program(prog))
    assert native_code_notice(open_program(prog)) is None  # once per process


def test_the_explorer_says_it_in_its_status_before_loading(fresh_notice):
    from toolkit.explorer import ExplorerState
    from toolkit.sources import open_program

    seen = []

    def load(*a, **k):
        seen.append(state.message)
        raise RuntimeError("stopped here")

    state = ExplorerState(load=load)
    assert state._loaded_session(open_program(PTE)) is None
    assert "runs the native code compiled into it" in seen[0] and "stopped here" in state.error
