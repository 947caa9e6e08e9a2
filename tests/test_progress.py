"""Progress that moves: loads and dry runs count constants (the method in the postfix), builds
methods, scans programs; one line on a terminal, nothing when the output is not a TTY."""

from __future__ import annotations

import io
import re

import pytest

from toolkit.build.synthetic import SyntheticSpec, write_synthetic
from toolkit.workflows.dry_run import dry_run


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return write_synthetic(SyntheticSpec(methods=3, constants=400), tmp_path_factory.mktemp("p") / "syn")


def test_a_dry_run_counts_constants_on_a_terminal(program, monkeypatch):
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    a = dry_run(program, "fingerprint", progress=True)
    text = term.getvalue()
    total = sum(len(m.constants) for m in a.session.program.methods)
    assert "dry run (fingerprint)" in text and f"{total}/{total}" in text
    counts = [int(n) for n in re.findall(rf"(\d+)/{total}", text)]
    assert counts == sorted(counts) and counts[-1] == total
    assert "method_2" in text  # the method being loaded, in the postfix


def test_no_progress_when_not_a_tty_or_not_asked(program, monkeypatch, capsys):
    quiet = io.StringIO()  # a pipe, a CI log
    monkeypatch.setattr("sys.stderr", quiet)
    dry_run(program, "fingerprint", progress=True)
    dry_run(program, "fingerprint")
    assert quiet.getvalue() == ""
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    dry_run(program, "fingerprint")  # progress=False: nothing, even on a terminal
    assert term.getvalue() == ""


def test_scan_shows_a_line_per_program_done_on_a_terminal(program, tmp_path, monkeypatch):
    import shutil

    from toolkit.cli import main

    zoo = tmp_path / "zoo"
    for name in ("a", "b"):
        shutil.copytree(program.parent, zoo / name)
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    main(["scan", str(zoo), "--policies", "fingerprint", "--jobs", "1"])
    assert "scanning" in term.getvalue() and "2/2" in term.getvalue()


def test_on_progress_counts_every_constant_of_every_method_in_order(program):
    calls: list[tuple[int, int, str]] = []
    a = dry_run(program, "fingerprint", on_progress=lambda done, total, method: calls.append((done, total, method)))
    methods = [m.name for m in a.session.program.methods]
    total = sum(len(m.constants) for m in a.session.program.methods)
    assert {t for _d, t, _m in calls} == {total}
    done = [d for d, _t, _m in calls]
    assert done == sorted(done) and done[0] == 0 and done[-1] == total
    assert list(dict.fromkeys(m for _d, _t, m in calls)) == methods  # each method in load order
    # each method begins where the one before ended: its first call says so, before any of its constants
    for i, m in enumerate(methods):
        first = next(d for d, _t, mm in calls if mm == m)
        assert first == sum(len(x.constants) for x in a.session.program.methods[:i])
    assert len(set(done)) > len(methods) + 1  # more than one step per method (the first uploads its own)
