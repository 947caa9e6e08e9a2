"""Crash isolation: a segfaulting .so kills the worker, never the caller.

The crashing program is a copy of a built sample whose ``decode`` .so is replaced by a
tiny shared object (compiled here with the system C compiler) whose ELF constructor
dereferences a null pointer: opening it with dlopen, as AOTInductor's runner does,
segfaults at once.  Its manifest digests are updated, as a consistent tamperer would do,
so integrity checking lets it through and only isolation can save the caller.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from test_errors import SAMPLE, clone, refresh_digests
from toolkit.errors import LoadError, WorkerCrashedError
from toolkit.isolation import load_isolated
from toolkit.session import load_program

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
    from toolkit.errors import IncompatibleProgramError, ManifestError
    from test_errors import edit_manifest

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
