"""Results computed once: every file hashed once per load (and, kept as a sealed copy, not again while
unchanged; a blob's pieces staged by verified staging are hashed by each load),
tables built once per load, verification run once, the CLI verifying once."""

from __future__ import annotations

import os

import pytest

from toolkit import compare_policies, integrity, load_program, upload
from toolkit.core.options import LoadOptions
from toolkit.integrity import verified_files

pytestmark = pytest.mark.slow  # loads a (cached) sample program


@pytest.fixture
def hashes(monkeypatch):
    """Every path hashed (whole, or piece by piece), in order: once per read."""
    seen: list[str] = []

    real = integrity.VerifiedCopy.read.__func__

    def count(cls, src_fd, source, *a, **kw):  # every file a load reads is read (and hashed) into its copy here
        seen.append(str(source))
        return real(cls, src_fd, source, *a, **kw)

    monkeypatch.setattr(integrity.VerifiedCopy, "read", classmethod(count))
    real_ensure = integrity.VerifiedCopy.ensure

    def ensure(self, ranges=None):  # a weights blob: its pieces read (and hashed) when asked for
        hashed = real_ensure(self, ranges)
        if hashed:
            seen.append(str(self.source))
        return hashed

    monkeypatch.setattr(integrity.VerifiedCopy, "ensure", ensure)
    real_stage = upload.stage_pieces

    def stage(path, record, *a, **kw):  # verified staging: a blob's pieces hashed as they are uploaded
        if record is not None:
            seen.append(str(path))
        return real_stage(path, record, *a, **kw)

    monkeypatch.setattr(upload, "stage_pieces", stage)
    verified_files().clear()
    yield seen
    verified_files().clear()


def test_every_file_is_hashed_once_per_load(built_sample, hashes):
    prog = built_sample("total_collision")
    s = load_program(prog, "fingerprint")
    assert s.status == "loaded"
    files = [str(prog.root / rel) for m in prog.methods for rel in m.files]
    assert sorted(hashes) == sorted(set(files)) and len(hashes) == len(files)
    s.close()


def test_staged_blobs_are_hashed_by_every_load_and_kept_files_once(built_sample, hashes, tmp_path):
    """Verified staging keeps nothing: each load hashes the blob pieces it stages; the .so and
    reference files (kept as sealed copies) are hashed once in the process."""
    import shutil

    root = tmp_path / "p"
    shutil.copytree(built_sample("total_collision").root, root)
    load_program(root, "fingerprint").close()
    first = list(hashes)
    assert any(h.endswith("weights.blob") for h in first) and any(h.endswith("model.so") for h in first)
    load_program(root, "fingerprint").close()
    again = hashes[len(first) :]
    assert sorted(again) == sorted(h for h in first if h.endswith("weights.blob")), again


def test_an_unchanged_file_is_not_hashed_again_in_this_process(built_sample, hashes, tmp_path):
    """Through the sealed copies (``integrity="copy"``): a copy verified once serves every later
    load in the process while the file's identity is unchanged."""
    import shutil

    copies = LoadOptions(integrity="copy")
    root = tmp_path / "p"
    shutil.copytree(built_sample("total_collision").root, root)
    load_program(root, "fingerprint", options=copies).close()
    first = len(hashes)
    load_program(root, "name-only", options=copies).close()
    assert len(hashes) == first, "a second load re-hashed unchanged files"
    # touching a file (new mtime and ctime) makes it suspect again: hashed on the next load
    blob = root / "methods/decode/weights.blob"
    st = blob.stat()
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    load_program(root, "fingerprint", options=copies).close()
    assert hashes[first:] == [str(blob)]
    # setting the old mtime back does not hide the change: ctime moved on
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    data = bytearray(blob.read_bytes())
    data[0] ^= 1
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    s = load_program(root, "fingerprint")
    assert s.status == "failed" and "does not match the program's record" in s.error


def test_tables_and_verification_are_computed_once(built_sample, monkeypatch):
    from toolkit.engine import frames as tables
    from toolkit.engine import verification

    s = load_program(built_sample("total_collision"), "name-only")
    built, ran = [], []
    real_frame, real_verify = tables.decisions_frame, verification.verify_session
    monkeypatch.setattr(tables, "decisions_frame", lambda log: built.append(1) or real_frame(log))
    monkeypatch.setattr(
        verification, "verify_session", lambda sess, *a, **kw: ran.append(1) or real_verify(sess, *a, **kw)
    )
    a, b = s.decisions, s.decisions
    assert len(built) == 1 and a.equals(b) and a is not b  # each caller gets its own copy
    a.loc[0, "decision"] = "tampered"
    assert s.decisions.loc[0, "decision"] != "tampered"
    v1, v2 = s.verify(), s.verify()
    assert len(ran) == 1 and v1.equals(v2)
    s.unload("decode")  # the set of loaded methods changed: verified again, decode now not loaded
    v3 = s.verify()
    assert len(ran) == 2 and not v3.set_index("method").loc["decode", "ran"]
    s.close()
    assert len(s.decisions) == 2 and s.device_bytes == 16384  # results outlive the device memory


def test_compare_policies_keeps_its_sessions(built_sample):
    c = compare_policies(built_sample("total_collision"), ["name-only", "fingerprint"])
    assert list(c.sessions) == ["name-only", "fingerprint"]
    s = c.session("fingerprint")
    assert not s.methods  # closed
    v = s.verify()  # the verification made during the comparison, not a new run
    assert v["ok"].all()
    assert c.frame.set_index("policy").loc["name-only", "wrong_methods"] == ["decode"]
    with pytest.raises(KeyError, match="was not compared"):
        c.session("no-sharing")


def test_cli_report_verifies_once(built_sample, tmp_path, monkeypatch):
    from toolkit.cli import main
    from toolkit.engine import verification

    ran = []
    real = verification.verify_session
    monkeypatch.setattr(verification, "verify_session", lambda s, *a, **kw: ran.append(1) or real(s, *a, **kw))
    csv = tmp_path / "r.csv"
    main(["report", str(built_sample("total_collision").root), "--policy", "fingerprint", "--csv", str(csv)])
    assert csv.is_file() and len(ran) == 1


def test_keyboard_interrupt_leaves_the_cache_as_before(built_sample):
    """A BaseException raised after decode's cache insertions rolls them back like any failure."""
    from toolkit.core import events as ev
    from toolkit.core.policies import get_policy
    from toolkit.engine.devices import resolve_devices
    from toolkit.engine.session import Session

    prog = built_sample("total_collision")
    s = Session(prog, get_policy("fingerprint"), resolve_devices(prog, None))
    s.load_method("prefill")
    before = {e.fqn: (e.owner_method, frozenset(e.users)) for e in s.cache}
    real = s.log.record

    def interrupting(event_type, method, **kw):
        real(event_type, method, **kw)
        if event_type is ev.MemorySampled and method == "decode" and kw.get("phase") == "after":
            raise KeyboardInterrupt

    s.log.record = interrupting
    with pytest.raises(KeyboardInterrupt):
        s.load_method("decode")
    assert {e.fqn: (e.owner_method, frozenset(e.users)) for e in s.cache} == before
    assert list(s.methods) == ["prefill"] and s.results["decode"].status == "failed"
    s.log.record = real
    s.load_method("decode")
    assert s.verify()["ok"].all()
    s.close()


def test_plots_take_the_comparison_itself(built_sample):
    from conftest import require

    require("matplotlib", extra="plots")
    from toolkit import plots

    c = compare_policies(built_sample("total_collision"), ["no-sharing", "fingerprint"])
    assert plots.policy_tradeoff(c).axes and plots.memory_by_policy(c).axes


def test_a_program_that_exists_only_in_memory_is_analysed_not_loaded():
    from toolkit import LoadError, dry_run
    from toolkit.build.synthetic import SyntheticSpec, generate

    p = generate(SyntheticSpec(methods=2, constants=10, device="cpu"))
    assert len(dry_run(p, "fingerprint").decisions) == 20
    with pytest.raises(LoadError, match="exists only in memory"):
        load_program(p, "fingerprint")
