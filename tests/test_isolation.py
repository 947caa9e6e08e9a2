"""Crash isolation: a segfaulting .so kills the worker, never the caller.

The crashing program is a copy of a built sample whose ``decode`` .so is replaced by a
tiny shared object (compiled here with the system C compiler) whose ELF constructor
dereferences a null pointer: opening it with dlopen, as AOTInductor's runner does,
segfaults at once.  Its manifest digests are updated, as a consistent tamperer would do,
so integrity checking lets it through and only isolation can save the caller.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from test_errors import SAMPLE, clone, refresh_digests

from toolkit.core.errors import IncompatibleProgramError, LoadError, ProgramError, WorkerCrashedError
from toolkit.engine.session import load_program
from toolkit.workflows.isolation import load_isolated

CRASH_C = r"""
/* A .so that segfaults the process that opens it: the constructor runs inside dlopen. */
__attribute__((constructor)) static void crash_on_open(void) {
    volatile int *nowhere = (volatile int *)0;
    *nowhere = 1;
}
"""


def build_crashing_so(dst: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the crashing .so")
    src = dst.with_suffix(".c")
    src.write_text(CRASH_C)
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-o", str(dst), str(src)], check=True, capture_output=True)
    return dst


def mapped_files() -> str:
    """Files this process has mapped: a .so opened with dlopen shows up here."""
    return Path("/proc/self/maps").read_text()


@pytest.fixture(scope="module")
def base(built_sample):
    return built_sample(SAMPLE)


@pytest.fixture(scope="module")
def crashing_program(base, tmp_path_factory) -> Path:
    root = clone(base, tmp_path_factory.mktemp("crash") / "prog")
    build_crashing_so(root / "methods/decode/model.so")
    return refresh_digests(root)


def test_isolated_load_matches_in_process_load(base):
    iso = load_isolated(base, "decline-on-mismatch")
    assert iso.status == "loaded", iso.worker_log
    s = load_program(base, "decline-on-mismatch")
    cols = [c for c in s.decisions.columns if c != "seq"]
    assert iso.decisions[cols].to_dict("records") == s.decisions[cols].to_dict("records")
    v = s.verify()
    assert iso.verification[["method", "ran", "ok"]].to_dict("records") == v[["method", "ran", "ok"]].to_dict("records")
    assert iso.exception() is None and iso.raise_for_status() is iso


def test_segfaulting_so_is_a_failed_load_and_the_caller_survives(crashing_program):
    iso = load_isolated(crashing_program, "fingerprint", timeout_s=300)
    assert iso.status == "failed"
    assert iso.crashed and iso.error_type == "WorkerCrashedError"
    assert iso.failed_method == "decode"
    assert "SIGSEGV" in iso.error and "decode" in iso.error
    assert iso.returncode == -11
    assert "Segmentation fault" in iso.worker_log  # the worker's faulthandler traceback
    # what happened before the crash survives it: prefill was loaded and decided
    d = iso.decisions
    assert d["method"].tolist() == ["prefill"]
    exc = iso.exception()
    assert isinstance(exc, WorkerCrashedError) and isinstance(exc, LoadError)
    with pytest.raises(WorkerCrashedError, match="SIGSEGV"):
        iso.raise_for_status()
    assert "WorkerCrashedError in 'decode'" in repr(iso)
    # and this process never mapped the crashing .so
    assert str(crashing_program) not in mapped_files()


def test_worker_timeout_is_a_failed_load(base):
    """A worker that does not answer in time is killed (a hang, or a slow start as here)."""
    iso = load_isolated(base, "fingerprint", timeout_s=0.5)
    assert iso.status == "failed" and iso.crashed
    assert "did not finish within 0.5 s" in iso.error


def test_bad_manifest_raises_in_the_caller_before_any_worker(base, tmp_path):
    """What load_program raises (malformed or incompatible program), load_isolated raises too."""
    from test_errors import edit_manifest

    from toolkit.core.errors import IncompatibleProgramError, ManifestError

    root = clone(base, tmp_path / "p")
    edit_manifest(root, lambda d: d.update(device="cuda"))
    with pytest.raises(IncompatibleProgramError):
        load_isolated(root, device="cpu")
    (root / "manifest.json").write_text("{")
    with pytest.raises(ManifestError):
        load_isolated(root)


def test_integrity_failure_in_the_worker_keeps_its_type(base, tmp_path):
    root = clone(base, tmp_path / "p")
    blob = root / "methods/decode/weights.blob"
    blob.write_bytes(blob.read_bytes()[:-8])
    iso = load_isolated(root, "fingerprint", verify=False)
    assert (iso.status, iso.error_type, iso.failed_method) == ("failed", "IntegrityError", "decode")
    assert iso.error_path == str(blob.resolve()) and "truncated" in iso.error
    assert not iso.crashed


# ------------------------------------------------------------------ hostile files (issue 21, items 2 and 3)

SHARED_OK = Path(__file__).resolve().parent / "fixtures" / "executorch-1.5.1-cuda" / "shared_ok"


def _pte_with_fifo(dst: Path) -> tuple[Path, Path]:
    shutil.copytree(SHARED_OK, dst)
    fifo = dst / "sequence_generate.safetensors"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes: forever
    return dst / "prog.pte", fifo


def test_load_isolated_reads_the_program_only_in_the_worker(tmp_path, monkeypatch):
    """Reading a program runs in the worker, under the timeout (a FIFO beside a .pte hung the
    caller); what the worker refuses at open is raised here as load_program raises it."""
    import toolkit.sources

    def not_here(*_a, **_k):
        raise AssertionError("the caller read the program")

    monkeypatch.setattr(toolkit.sources, "open_program", not_here)
    pte, fifo = _pte_with_fifo(tmp_path / "p")
    t0 = time.perf_counter()
    with pytest.raises(ProgramError, match="not a regular file") as e:
        load_isolated(pte, timeout_s=120)
    assert e.value.path == str(fifo) and time.perf_counter() - t0 < 120
    with pytest.raises(IncompatibleProgramError):  # a CUDA program on this CPU-only machine
        load_isolated(SHARED_OK / "prog.pte", device="cpu", timeout_s=120)


def kill_on_crash(path: str, policies: list[str]) -> list[dict]:
    """scan's worker function, but the worker of a path holding 'crash' dies by SIGKILL."""
    if "crash" in path:
        os.kill(os.getpid(), signal.SIGKILL)
    from toolkit.workflows.scan import scan_program

    return scan_program(path, policies)


def test_scan_fails_the_row_of_a_program_whose_worker_dies_and_carries_on(tmp_path):
    from toolkit.workflows.scan import scan_rows

    paths = []
    for name in ("a", "crash", "b", "c"):
        shutil.copytree(SHARED_OK, tmp_path / name)
        paths.append(str(tmp_path / name))
    rows = scan_rows(paths, ["fingerprint"], 2, scan=kill_on_crash)
    by_path = {}
    for r in rows:
        by_path.setdefault(r["path"], []).append(r)
    assert list(by_path) == paths
    crashed = by_path[str(tmp_path / "crash")]
    assert len(crashed) == 1 and crashed[0]["outcome"] == "unreadable" and "died" in crashed[0]["error"]
    for name in ("a", "b", "c"):
        assert all(r["outcome"] != "unreadable" for r in by_path[str(tmp_path / name)]), by_path[str(tmp_path / name)]


def test_scan_reports_a_hostile_program_as_a_failed_row_with_csv_and_exit_code(tmp_path, monkeypatch, capsys):
    """A FIFO beside a .pte made scan hang; an unexpected exception in one program killed the run."""
    import toolkit.sources
    from toolkit.cli import main
    from toolkit.workflows.scan import scan_program

    _pte_with_fifo(tmp_path / "zoo" / "fifo")
    shutil.copytree(SHARED_OK, tmp_path / "zoo" / "good")
    csv = tmp_path / "scan.csv"
    assert main(["scan", str(tmp_path / "zoo"), "--policies", "fingerprint", "--csv", str(csv), "--jobs", "2"]) == 1
    frame = pd.read_csv(csv)
    bad = frame[frame["path"].str.contains("/fifo/")]
    assert len(bad) == 1 and bad["outcome"].tolist() == ["unreadable"] and "not a regular file" in bad["error"].iloc[0]
    good = frame[frame["path"].str.contains("/good/")]
    assert len(good) and (good["outcome"] != "unreadable").all()

    def blow_up(*_a, **_k):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(toolkit.sources, "open_program", blow_up)
    rows = scan_program(str(tmp_path / "zoo" / "good"), ["fingerprint"])
    assert [(r["outcome"], r["wrong_data"]) for r in rows] == [("unreadable", False)]  # fails the gate by its outcome
    assert rows[0]["error"].startswith("RecursionError")
