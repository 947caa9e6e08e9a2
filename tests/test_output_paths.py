"""Output paths: never written through a symbolic link unasked, modes kept, every OS error one line.

A seeded family of cases runs on the writers directly (``write_text_atomically``,
``write_bytes_atomically``, ``write_table``, ``write_csv``, ``to_csv``, ``CollisionReport.to_csv``,
``write_xlsx`` when openpyxl is installed): dangling and live links, relative and absolute, chains
and loops, links to folders, symlinked parent folders, existing files of modes 0600/0640/0644/0400,
umasks 000/022/077, ``overwrite`` and ``follow_links`` on and off, names of 255/256/300 bytes,
missing folders, unwritable folders, read-only file systems and full disks (as root by failing
``os.open``/``os.write``, since modes do not bind root), links planted after the check and at the
temporary name.  Each case checks: nothing is written through a link unless asked, what a link
points to is untouched, a replaced file keeps its mode and a new one gets the umask, no temporary
file is left, and the error is an :class:`OutputError` naming the path.

Then the command line: ``report``, ``compare`` and ``scan`` refuse such paths before any work in
one line with exit 2, and a write that fails after the work is one line with exit 2 too.
"""

from __future__ import annotations

import errno
import importlib.util
import io
import os
import random
import stat
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest

import toolkit.reports.output as output
from toolkit.cli import main
from toolkit.core.errors import OutputError
from toolkit.reports.collision import REPORT_COLUMNS, CollisionReport, to_csv, typed_frame, write_csv, write_xlsx
from toolkit.reports.tabular import write_table

SAMPLE = "total_collision"
SEED = 38
CASES = 400
ROOT = os.geteuid() == 0
OLD = b"old content\n"


def _report() -> CollisionReport:
    return CollisionReport(typed_frame(pd.DataFrame(columns=list(REPORT_COLUMNS))))


def _text(path, **kw):
    output.write_text_atomically(path, "text report\n", **kw)


def _bytes(path, **kw):
    output.write_bytes_atomically(path, b"\x00binary report\n", **kw)


def _table(path, **kw):
    write_table(pd.DataFrame({"a": [1, 2], "b": ["=x", "y"]}), path, **kw)


def _write_csv(path, **kw):
    write_csv(_report().frame, path, **kw)


def _to_csv(path, **kw):
    to_csv(_report(), path, **kw)


def _method_to_csv(path, **kw):
    _report().to_csv(path, **kw)


def _xlsx(path, **kw):
    write_xlsx(_report().frame, path, **kw)


WRITERS = {
    "write_text_atomically": _text,
    "write_bytes_atomically": _bytes,
    "write_table": _table,
    "write_csv": _write_csv,
    "to_csv": _to_csv,
    "CollisionReport.to_csv": _method_to_csv,
}
if importlib.util.find_spec("openpyxl") is not None:
    WRITERS["write_xlsx"] = _xlsx


def _expected_start(writer: str) -> bytes:
    return {
        "write_text_atomically": b"text report\n",
        "write_bytes_atomically": b"\x00binary report\n",
        "write_table": b"a,b\r\n",
        "write_xlsx": b"PK",
    }.get(writer, b"program,policy,")


LAYOUTS = (
    "new",
    "existing",
    "dangling-rel",
    "dangling-abs",
    "live-rel",
    "live-abs",
    "chain",
    "loop",
    "link-to-folder",
    "parent-link-new",
    "parent-link-existing",
    "name-255",
    "name-256",
    "name-300",
    "missing-folder",
    "parent-is-file",
    "unwritable",
    "read-only-fs",
    "disk-full",
    "planted-after-check",
    "planted-temp",
)
MODES = (0o600, 0o640, 0o644, 0o400)
UMASKS = (0o000, 0o022, 0o077)


def _cases():
    rng = random.Random(SEED)
    writers = sorted(WRITERS)
    out = []
    for i in range(CASES):
        # every layout at least a dozen times, the rest drawn
        layout = LAYOUTS[i % len(LAYOUTS)] if i < 12 * len(LAYOUTS) else rng.choice(LAYOUTS)
        out.append(
            (
                i,
                rng.choice(writers),
                layout,
                rng.choice(MODES),
                rng.choice(UMASKS),
                rng.random() < 0.5,
                rng.random() < 0.5,
            )
        )
    return out


@contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _snapshot(folder: Path) -> dict:
    """Every entry under ``folder``: a link as its target, a file as (mode, bytes), a folder as its mode."""
    seen = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            seen[str(p)] = ("link", os.readlink(p))
        elif p.is_file():
            seen[str(p)] = ("file", stat.S_IMODE(p.stat().st_mode), p.read_bytes())
        elif p.is_dir():
            seen[str(p)] = ("dir",)
    return seen


def _fail_in(folder: Path, name: str, exc: OSError):
    """A patched ``os.<name>`` raising ``exc`` for paths under ``folder`` (the writer's own calls), real elsewhere."""
    real = getattr(os, name)

    def fake(p, *a, **k):
        if str(p).startswith(str(folder)):
            raise exc
        return real(p, *a, **k)

    return mock.patch.object(output.os, name, fake)


def _run_case(base: Path, i, writer, layout, mode, umask, overwrite, follow):
    """Build the case's layout under ``base``, write, and check; returns a description for failures."""
    base.mkdir()
    out = base / "out"
    out.mkdir()
    other = base / "other"  # where links point: never written unless follow_links
    other.mkdir()
    victim = other / "victim.csv"
    path: Path = out / "r.csv"
    patch = None
    # what should happen: "written" at ``written_at`` (mode ``want_mode``, None: by the umask), or an error matching
    written_at: Path | None = path
    want_mode = None
    error = None

    def existing(p: Path):
        p.write_bytes(OLD)
        p.chmod(mode)

    if layout == "existing":
        existing(path)
        want_mode = mode
        if not overwrite:
            written_at, error = None, "exists already"
    elif layout in ("dangling-rel", "dangling-abs", "live-rel", "live-abs", "chain"):
        if layout.startswith("live"):
            existing(victim)
        link_to = os.path.relpath(victim, out) if layout.endswith("rel") else str(victim)
        if layout == "chain":
            existing(victim)
            os.symlink(str(victim), other / "hop")
            link_to = str(other / "hop")
        os.symlink(link_to, path)
        if not follow:
            written_at, error = None, "is a symbolic link"
        elif victim.exists() and not overwrite:
            written_at, error = None, "exists already"
        else:
            written_at = victim
            want_mode = mode if victim.exists() else None
    elif layout == "loop":
        os.symlink("r.csv", path)
        written_at, error = None, ("Too many levels of symbolic links" if follow else "is a symbolic link")
    elif layout == "link-to-folder":
        os.symlink(str(other), path)
        written_at, error = None, ("not a regular file" if follow else "is a symbolic link")
    elif layout in ("parent-link-new", "parent-link-existing"):
        # a link in the folders above is followed as for any path: the file lands in the real folder
        os.symlink(str(other), base / "via")
        path = base / "via" / "r.csv"
        written_at = other / "r.csv"
        if layout == "parent-link-existing":
            existing(written_at)
            want_mode = mode
            if not overwrite:
                written_at, error = None, "exists already"
    elif layout.startswith("name-"):
        n = int(layout.split("-")[1])
        path = out / ("n" * n)
        if n > 255:
            written_at, error = None, "File name too long"
        else:
            written_at = path
    elif layout == "missing-folder":
        path = out / "missing" / "r.csv"
        written_at, error = None, "does not exist"
    elif layout == "parent-is-file":
        (out / "file").write_bytes(OLD)
        path = out / "file" / "r.csv"
        written_at, error = None, "Not a directory"
    elif layout in ("unwritable", "read-only-fs"):
        existing(path)
        written_at = None
        if layout == "unwritable" and not ROOT:
            out.chmod(0o555)
            error = "not writable"
        else:  # modes do not bind root: the file system's answer, as os.open would give it
            code = errno.EACCES if layout == "unwritable" else errno.EROFS
            patch = _fail_in(out, "open", OSError(code, os.strerror(code)))
            error = os.strerror(code)
        if not overwrite:
            error = "exists already"
    elif layout == "disk-full":
        existing(path)
        written_at = None
        error = "exists already" if not overwrite else os.strerror(errno.ENOSPC)

        def full(*a, **k):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        patch = mock.patch.object(output.os, "write", full)
    elif layout == "planted-after-check":
        # a link appears at the path between the check and the rename: it is replaced (or, without
        # overwrite, refused), never written through
        existing(victim)
        real_create = output._create_temporary

        def plant(target):
            os.symlink(str(victim), path)
            return real_create(target)

        patch = mock.patch.object(output, "_create_temporary", plant)
        if not overwrite:
            written_at, error = None, "appeared while this ran"
    elif layout == "planted-temp":
        # a link waiting at the first temporary name: O_EXCL | O_NOFOLLOW refuses it, the next name is used
        existing(victim)
        tokens = iter(["0" * 16, "1" * 16])
        os.symlink(str(victim), out / f".r.csv.{'0' * 16}.tmp")
        patch = mock.patch.object(output.secrets, "token_hex", lambda n: next(tokens))

    what = f"case {i}: {writer} {layout} mode={oct(mode)} umask={oct(umask)} overwrite={overwrite} follow={follow}"
    before = _snapshot(base)
    with _umask(umask):
        try:
            if patch is not None:
                with patch:
                    WRITERS[writer](str(path), overwrite=overwrite, follow_links=follow)
            else:
                WRITERS[writer](str(path), overwrite=overwrite, follow_links=follow)
            raised = None
        except OutputError as e:
            raised = e
        finally:
            if layout == "unwritable" and not ROOT:
                out.chmod(0o755)
    after = _snapshot(base)
    leftovers = [p for p in after if p.endswith(".tmp") and p not in before]
    assert not leftovers, f"{what}: temporary files left: {leftovers}"
    if error is not None:
        assert raised is not None, f"{what}: wrote, expected an error with {error!r}"
        text = str(raised)
        assert error in text and str(path) in text and "\n" not in text, f"{what}: {text}"
        if layout == "planted-after-check":  # the link planted is the other party's, left where it is
            assert after.pop(str(path)) == ("link", str(victim)), what
        assert after == before, f"{what}: a refused write changed the files"
        return
    assert raised is None, f"{what}: {raised}"
    assert written_at is not None and written_at.is_file() and not written_at.is_symlink(), what
    assert written_at.read_bytes().startswith(_expected_start(writer)), what
    got_mode = stat.S_IMODE(written_at.stat().st_mode)
    expect = want_mode if want_mode is not None else 0o666 & ~umask
    assert got_mode == expect, f"{what}: mode {oct(got_mode)}, expected {oct(expect)}"
    # nothing else changed: links stay links pointing where they did, other files keep bytes and modes
    for p, entry in before.items():
        if Path(p) == written_at or (layout == "planted-after-check" and Path(p) == path):
            continue
        assert after.get(p) == entry, f"{what}: {p} changed: {entry} -> {after.get(p)}"
    if layout == "planted-after-check":
        assert victim.read_bytes() == OLD and stat.S_IMODE(victim.stat().st_mode) == mode, what
    if written_at != path and Path(path).is_symlink():
        assert os.readlink(path) == before[str(path)][1], what


def test_the_family_covers_every_layout_and_switch():
    cases = _cases()
    assert len(cases) >= 300
    assert {c[2] for c in cases} == set(LAYOUTS)
    assert {c[1] for c in cases} == set(WRITERS)
    assert {(c[5], c[6]) for c in cases} == {(a, b) for a in (True, False) for b in (True, False)}
    assert {c[3] for c in cases} == set(MODES) and {c[4] for c in cases} == set(UMASKS)


def test_output_path_family(tmp_path):
    """Every case of the seeded family (one test, so the 400 cases cost well under a minute)."""
    failures = []
    for case in _cases():
        try:
            _run_case(tmp_path / f"c{case[0]}", *case)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0])
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(failures[:30])


# ---------------------------------------------------------------- single promises, named


def test_a_dangling_link_is_not_followed_and_nothing_is_created(tmp_path):
    os.symlink(tmp_path / "elsewhere.csv", tmp_path / "r.csv")
    with pytest.raises(OutputError, match="is a symbolic link; pass follow_links=True to write its target"):
        to_csv(_report(), tmp_path / "r.csv")
    assert not (tmp_path / "elsewhere.csv").exists()


def test_replacing_a_private_file_keeps_it_private(tmp_path):
    p = tmp_path / "r.csv"
    p.write_bytes(OLD)
    p.chmod(0o600)
    with _umask(0o000):
        to_csv(_report(), p)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600 and p.read_bytes().startswith(b"program,")


@pytest.mark.parametrize("umask", UMASKS)
def test_a_new_file_gets_the_umask(tmp_path, umask):
    with _umask(umask):
        output.write_text_atomically(tmp_path / "r.csv", "x")
    assert stat.S_IMODE((tmp_path / "r.csv").stat().st_mode) == 0o666 & ~umask


def test_a_handle_is_written_as_given(tmp_path):
    buf = io.StringIO()
    to_csv(_report(), buf)
    assert buf.getvalue().startswith("program,")


# ---------------------------------------------------------------- the command line


def _one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("constshare: error:") and all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.fixture()
def sample_root(built_sample) -> str:
    return str(built_sample(SAMPLE).root)


def _no_work(monkeypatch):
    """Fail the test if a command gets as far as opening a program: the path is checked first."""
    import toolkit.cli.commands as commands

    monkeypatch.setattr(commands, "program_from", lambda *a, **k: pytest.fail("worked before checking the path"))
    import toolkit.workflows.scan as scan

    monkeypatch.setattr(scan, "scan_folder", lambda *a, **k: pytest.fail("scanned before checking the path"))


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("option", ["--csv", "--html", "--junit"])
def test_cli_refuses_a_dangling_link(sample_root, tmp_path, capsys, monkeypatch, option, force):
    _no_work(monkeypatch)
    link = tmp_path / "r.out"
    os.symlink(tmp_path / "target.out", link)
    argv = ["report", sample_root, "--dry-run", option, str(link)] + (["--force"] if force else [])
    assert main(argv) == 2
    _one_line(capsys, option, str(link), "is a symbolic link; pass --follow-links to write its target")
    assert not (tmp_path / "target.out").exists() and link.is_symlink()


def test_cli_follow_links_writes_the_target_and_keeps_its_mode(sample_root, tmp_path, capsys):
    target = tmp_path / "target.csv"
    target.write_bytes(OLD)
    target.chmod(0o600)
    os.symlink(target, tmp_path / "r.csv")
    argv = ["report", sample_root, "--dry-run", "--csv", str(tmp_path / "r.csv"), "--follow-links"]
    assert main(argv) == 2  # the target exists: --force still needed
    _one_line(capsys, "exists already; pass --force")
    assert main([*argv, "--force"]) in (0, 1)
    assert (tmp_path / "r.csv").is_symlink() and target.read_bytes().startswith(b"program,")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("cmd", ["report", "compare", "scan"])
@pytest.mark.parametrize("option", ["--csv", "--html", "--junit"])
def test_cli_a_name_too_long_is_one_line_exit_2(sample_root, tmp_path, capsys, monkeypatch, cmd, option):
    _no_work(monkeypatch)
    bad = str(tmp_path / ("x" * 300))
    argv = [cmd, str(tmp_path) if cmd == "scan" else sample_root, option, bad]
    assert main(argv if cmd == "scan" else [*argv, "--dry-run"]) == 2
    _one_line(capsys, option, bad, "cannot be written: File name too long")


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.ENOSPC])
def test_cli_a_write_failing_after_the_work_is_one_line_exit_2(sample_root, tmp_path, capsys, code):
    """The check passed (as root a folder's mode does not bind), the write then fails: one line, exit 2,
    nothing left behind."""
    out = tmp_path / "out"
    out.mkdir()
    with _fail_in(out, "open", OSError(code, os.strerror(code))):
        assert main(["report", sample_root, "--dry-run", "--csv", str(out / "r.csv")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("constshare: error:") == 1, err
    line = next(ln for ln in err.splitlines() if ln.startswith("constshare: error:"))
    assert str(out / "r.csv") in line and os.strerror(code) in line, line
    assert list(out.iterdir()) == []


def test_cli_a_link_planted_during_the_run_is_not_written_through(sample_root, tmp_path, capsys, monkeypatch):
    """Checked when absent, a dangling link planted before the write: without --force it is refused
    (one line, exit 2) and the link's target is never created."""
    import toolkit.workflows.dry_run as dry_run_module

    victim = tmp_path / "victim.csv"
    csv = tmp_path / "r.csv"
    real = dry_run_module.dry_run

    def dry_run_then_plant(*a, **k):
        result = real(*a, **k)
        os.symlink(victim, csv)
        return result

    monkeypatch.setattr(dry_run_module, "dry_run", dry_run_then_plant)
    assert main(["report", sample_root, "--dry-run", "--csv", str(csv)]) == 2
    line = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("constshare: error:")]
    assert len(line) == 1 and str(csv) in line[0], line
    assert not victim.exists() and csv.is_symlink()


def test_cli_two_reports_to_one_file_are_refused_before_any_work(sample_root, tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    same = str(tmp_path / "r.out")
    assert main(["report", sample_root, "--dry-run", "--csv", same, "--junit", same]) == 2
    _one_line(capsys, "--junit", same, "the same file as --csv")
    assert not os.path.exists(same)


def test_a_scanned_program_is_named_by_its_folder_unless_two_would_share_a_name(tmp_path):
    from toolkit.workflows.scan import program_labels

    paths = ["bart/prog.pte", "a/prog.pte", "a/model.pte", "b", "b/prog.pte", "c/whisper.pte", "prog.pte"]
    got = program_labels([tmp_path / p for p in paths], tmp_path)
    assert got == {
        "bart/prog.pte": "bart",  # a generic file name says nothing: its folder does
        "a/prog.pte": "a/prog.pte",  # two generic names in one folder: each keeps its path
        "a/model.pte": "a/model.pte",
        "b": "b",  # a program folder and a .pte inside it: both keep their paths
        "b/prog.pte": "b/prog.pte",
        "c/whisper.pte": "c/whisper.pte",
        "prog.pte": "prog.pte",  # at the top: nothing shorter to call it
    }
