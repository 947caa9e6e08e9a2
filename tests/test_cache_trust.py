"""The build cache opens only builds it trusts (issue 38, item 1: build-cache poisoning).

A cached build is native code a full load runs, at a path anyone can compute.  It is opened only when
this user owns the cache folder, its ``programs/`` and the entry, nobody else can write any of them,
and the entry's record (an HMAC of its name and manifest under this user's key) matches; otherwise
it is rebuilt and stderr says which check failed.  Checked three ways: a seeded family of synthetic
caches (random modes, owners, records, keys, links) through the trust check and through
``build_sample`` with the builder and the opener replaced (no compile); a few hostile copies of one
real build; and folder modes under ``umask 000``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

import toolkit.build.builder
import toolkit.engine.session
import toolkit.reports.native_code
import toolkit.sources
from toolkit.build import cache_trust, samples

SAMPLE = "no_constants"  # the cheapest sample: two small methods
CASES = 360
ME = os.geteuid()
OTHER = ME + 4242


def _entry_name() -> str:
    return f"{SAMPLE}-cpu-{samples._cache_key(samples.sample_module(SAMPLE), 'cpu')}"


@pytest.fixture()
def isolated(monkeypatch, tmp_path):
    """No build of an earlier test counts as this process's, private builds go under tmp_path, no atexit."""
    monkeypatch.setattr(cache_trust, "_BUILT_HERE", set())
    monkeypatch.setattr(samples, "_PRIVATE_BUILDS", {})
    private = tmp_path / "private"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    import atexit

    monkeypatch.setattr(atexit, "register", lambda *a, **k: None)
    return private


class Calls:
    """What build_sample asked of the builder and the opener."""

    def __init__(self):
        self.built: list[Path] = []
        self.opened: list[Path] = []


def _write_like_the_builder(stage: Path) -> None:
    """A small program directory, made as the real builder makes one (mkdir and open: the umask decides)."""
    (stage / "methods" / "gate").mkdir(parents=True)
    (stage / "methods" / "gate" / "model.so").write_bytes(b"\x7fELF not really")
    (stage / "methods" / "gate" / "weights.blob").write_bytes(os.urandom(64))
    (stage / "manifest.json").write_text(json.dumps({"name": SAMPLE, "nonce": os.urandom(8).hex()}))


def _fake_builder(calls: Calls, copy_from: Path | None = None, real_open=None):
    """build_program without a compile: the entry built aside and renamed into place, as the builder does."""

    def build_program(methods, out, device="cpu", **kw):
        out = Path(out)
        calls.built.append(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
        if copy_from is not None:
            shutil.copytree(copy_from, stage, dirs_exist_ok=True)
        else:
            _write_like_the_builder(stage)
        if os.path.lexists(out):
            shutil.rmtree(out)
        os.replace(stage, out)
        return real_open(out) if real_open else ("built", out)

    return build_program


@pytest.fixture()
def calls(monkeypatch, isolated):
    """The builder replaced by a fake that writes a small entry, the opener by one that records its path."""
    c = Calls()
    monkeypatch.setattr(toolkit.build.builder, "build_program", _fake_builder(c))

    def open_program(path, **kw):
        c.opened.append(Path(path))
        return ("opened", Path(path))

    monkeypatch.setattr(toolkit.sources, "open_program", open_program)
    return c


# ------------------------------------------------------------------ the generated family


def _where(path) -> str:
    """A path with its folder resolved and its last part not: what an lstat of it looks at."""
    p = os.fspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))


class Case:
    """One synthetic cache: the cache folder R, its programs/ P, an entry E, the key and E's record."""

    def __init__(self, root: Path, seed: int, entry: str):
        self.rng = random.Random(seed)
        self.root = root
        self.cache = root / "cache"
        self.programs = self.cache / "programs"
        self.entry = self.programs / entry
        self.owner: dict[str, int] = {}  # path (parent resolved) -> the uid its lstat says
        self.folder_bad: list[str] = []  # reasons a cache folder fails: the cache is not used at all
        self.entry_bad: list[str] = []  # reasons the entry or key fails: the entry is rebuilt
        self.key_bad = False  # a bad key is replaced, after which the entry's record no longer matches
        self.what: list[str] = []

    # the tree, as a genuine build leaves it
    def make(self) -> None:
        rng = self.rng
        self.cache.mkdir(mode=0o700)
        if rng.random() < 0.1:  # programs/ a link to a private folder elsewhere: judged by its target
            target = self.root / "elsewhere"
            target.mkdir(mode=0o700)
            self.programs.symlink_to(target)
            self.what.append("programs-link")
        else:
            self.programs.mkdir(mode=0o700)
        self.key = os.urandom(32)
        self._write(self.programs / cache_trust.KEY_FILE, self.key, 0o600)
        self.entry.mkdir(mode=0o700)
        _write_like_the_builder(self.entry)
        for p in [self.entry, *self.entry.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        if rng.random() < 0.15:
            self._write(self.entry / "methods" / "gate" / "notes.txt", b"harmless", 0o644)
            self.what.append("extra-file")
        self._record(self.key, self.entry.name, (self.entry / "manifest.json").read_bytes())

    def _write(self, path: Path, data: bytes, mode: int) -> None:
        path.write_bytes(data)
        os.chmod(path, mode)

    def _record(self, key: bytes, name: str, manifest: bytes, suffix: str = "\n") -> None:
        text = cache_trust.entry_record(key, name, manifest) + suffix
        self._write(cache_trust.record_path(self.entry), text.encode(), 0o600)

    def _key_path(self) -> Path:
        return self.programs / cache_trust.KEY_FILE

    def _targets(self) -> list[tuple[str, Path, str]]:
        """(what, path, level) of everything a mode or owner check covers."""
        e = self.entry
        return [
            ("cache", self.cache, "folder"),
            ("programs", Path(os.path.realpath(self.programs)), "folder"),
            ("entry", e, "entry"),
            ("methods", e / "methods", "entry"),
            ("method", e / "methods" / "gate", "entry"),
            ("manifest", e / "manifest.json", "entry"),
            ("so", e / "methods" / "gate" / "model.so", "entry"),
            ("record", cache_trust.record_path(e), "entry"),
            ("key", self._key_path(), "key"),
        ]

    def _bad(self, level: str, reason: str) -> None:
        (self.folder_bad if level == "folder" else self.entry_bad).append(reason)
        self.key_bad |= level == "key"

    # the mutations: each says whether it breaks trust, and which words the reason then holds
    def mutate(self) -> None:
        """Contents first, then modes and owners of what is there, then structure (each structural change
        fails trust by itself, so a mode or owner it replaces does not matter)."""
        rng = self.rng
        if rng.random() < 0.45:
            self.m_content()
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            getattr(self, rng.choice(["m_mode", "m_mode", "m_owner"]))()
        if rng.random() < 0.25:
            getattr(self, rng.choice(["m_link_entry", "m_link_inside", "m_fifo", "m_entry_file", "m_no_manifest"]))()

    def _present(self) -> list[tuple[str, Path, str]]:
        return [t for t in self._targets() if os.path.lexists(t[1]) and not os.path.islink(t[1])]

    def m_mode(self) -> None:
        what, path, level = self.rng.choice(self._present())
        if path.is_dir():
            mode = self.rng.choice([0o700, 0o750, 0o755, 0o711, 0o770, 0o775, 0o777, 0o1777, 0o1733, 0o720, 0o702])
            bad = mode & 0o022
        else:
            mode = self.rng.choice([0o600, 0o400, 0o640, 0o644, 0o604, 0o620, 0o602, 0o660, 0o666])
            bad = mode & (0o077 if level == "key" else 0o022)
        os.chmod(path, mode)
        self.what.append(f"mode {what} {mode:#o}")
        if bad:
            self._bad(level, "mode")

    def m_owner(self) -> None:
        what, path, level = self.rng.choice(self._present())
        self.owner[_where(path)] = OTHER
        self.what.append(f"owner {what}")
        self._bad(level, "owned by")

    def m_content(self) -> None:
        rng = self.rng
        record = cache_trust.record_path(self.entry)
        manifest = self.entry / "manifest.json"
        kind = rng.choice(
            [
                "manifest-edit",
                "manifest-swap",
                "record-missing",
                "record-random",
                "record-other-key",
                "record-other-name",
                "record-upper",
                "record-empty",
                "record-link",
                "record-dir",
                "record-spaces",
                "key-missing",
                "key-short",
                "key-link",
                "key-other",
            ]
        )
        self.what.append(kind)
        if kind == "manifest-edit":  # a copied genuine entry with its manifest changed
            data = bytearray(manifest.read_bytes())
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(7)
            manifest.write_bytes(bytes(data))
            self._bad("entry", "does not match")
        elif kind == "manifest-swap":
            manifest.write_text(json.dumps({"name": "planted"}))
            self._bad("entry", "does not match")
        elif kind == "record-missing":
            if os.path.lexists(record):
                record.unlink()
            self._bad("entry", "no record")
        elif kind == "record-random":
            self._write(record, os.urandom(32).hex().encode(), 0o600)
            self._bad("entry", "does not match")
        elif kind == "record-other-key":  # an entry and its record copied from another user's cache
            self._record(os.urandom(32), self.entry.name, manifest.read_bytes())
            self._bad("entry", "does not match")
        elif kind == "record-other-name":  # a genuine entry and record of another sample, renamed
            self._record(self.key, "total_collision-cpu-000000000000", manifest.read_bytes())
            self._bad("entry", "does not match")
        elif kind == "record-upper":
            text = cache_trust.entry_record(self.key, self.entry.name, manifest.read_bytes()).upper()
            self._write(record, text.encode(), 0o600)
            self._bad("entry", "does not match")
        elif kind == "record-empty":
            self._write(record, b"", 0o600)
            self._bad("entry", "does not match")
        elif kind == "record-link":  # a link to a genuine record: the record itself must be a file
            real = self.root / "genuine.record"
            real.write_text(cache_trust.entry_record(self.key, self.entry.name, manifest.read_bytes()))
            if os.path.lexists(record):
                record.unlink()
            record.symlink_to(real)
            self._bad("entry", "not a regular file")
        elif kind == "record-dir":
            if os.path.lexists(record):
                record.unlink()
            record.mkdir()
            self._bad("entry", "not a regular file")
        elif kind == "record-spaces":  # whitespace around a genuine record is not a forgery
            text = "  " + cache_trust.entry_record(self.key, self.entry.name, manifest.read_bytes()) + "\n\n"
            self._write(record, text.encode(), 0o600)
        elif kind == "key-missing":
            self._key_path().unlink()
            self._bad("key", "no key file")
        elif kind == "key-short":
            self._write(self._key_path(), self.key[:16], 0o600)
            self._bad("key", "holds 16 bytes")
        elif kind == "key-link":
            real = self.root / "key"
            self._write(real, self.key, 0o600)
            self._key_path().unlink()
            self._key_path().symlink_to(real)
            self._bad("key", "not a regular file")
        elif kind == "key-other":  # a key this user did not make: records under it were not made here
            self._write(self._key_path(), os.urandom(32), 0o600)
            self._bad("key", "does not match")

    def m_link_entry(self) -> None:  # the entry a link to a genuine copy, its record genuine
        copy = self.root / "copy"
        shutil.copytree(self.entry, copy, symlinks=True)
        shutil.rmtree(self.entry)
        self.entry.symlink_to(copy)
        self.what.append("entry-link")
        self._bad("entry", "symbolic link")

    def m_link_inside(self) -> None:
        victim = self.rng.choice([self.entry / "manifest.json", self.entry / "methods" / "gate" / "model.so"])
        copy = self.root / ("copy-" + victim.name)
        shutil.copy(victim, copy)
        victim.unlink()
        victim.symlink_to(copy)
        self.what.append(f"link {victim.name}")
        self._bad("entry", "symbolic link")

    def m_fifo(self) -> None:
        os.mkfifo(self.entry / "methods" / "gate" / "pipe")
        self.what.append("fifo")
        self._bad("entry", "neither a file nor a folder")

    def m_entry_file(self) -> None:
        shutil.rmtree(self.entry)
        self.entry.write_bytes(b"planted")
        self.what.append("entry-file")
        self._bad("entry", "not a folder")

    def m_no_manifest(self) -> None:
        (self.entry / "manifest.json").unlink()
        self.what.append("no-manifest")
        self._bad("entry", "has no manifest.json")

    def lstat(self, real_lstat):
        def fake(path, *a, **k):
            st = real_lstat(path, *a, **k)
            uid = None if k.get("dir_fd") is not None else self.owner.get(_where(path))
            if uid is None:
                return st
            fields = list(st)
            fields[4] = uid
            return os.stat_result(fields)

        return fake


def test_the_family_has_cases_of_every_kind():
    """The generator reaches genuine caches, unusable cache folders and planted entries alike."""
    kinds = {"trusted": 0, "folder": 0, "entry": 0}
    with tempfile.TemporaryDirectory() as d:
        for seed in range(CASES):
            case = Case(Path(d) / str(seed), seed, "x-cpu-0")
            case.root.mkdir()
            case.make()
            case.mutate()
            kinds["folder" if case.folder_bad else "entry" if case.entry_bad else "trusted"] += 1
    assert CASES >= 300 and min(kinds.values()) >= 40, kinds


@pytest.mark.parametrize("seed", range(CASES))
def test_a_planted_or_exposed_entry_is_never_opened(seed, tmp_path, monkeypatch, isolated, calls, capsys):
    """Each synthetic cache: the trust check's verdict is the one the mutations call for, with a reason
    naming the failed check; build_sample opens the entry exactly when it is trusted, else rebuilds it
    (into the cache, or outside it when a cache folder is exposed) and says why on stderr."""
    case = Case(tmp_path, seed, _entry_name())
    case.make()
    case.mutate()
    fake = case.lstat(os.lstat)
    why = cache_trust.cache_distrust(case.entry, [case.cache, case.programs], lstat=fake)
    bad = case.folder_bad + case.entry_bad
    assert (why is None) == (not bad), (case.what, why)
    if bad:
        assert "\n" not in why and any(word in why for word in bad), (case.what, why)

    monkeypatch.setenv("CONSTSHARE_CACHE", str(case.cache))
    with monkeypatch.context() as m:
        m.setattr(os, "lstat", fake)
        result = samples.build_sample(SAMPLE, progress=False)
    err = capsys.readouterr().err
    if not bad:
        assert calls.opened == [case.entry] and calls.built == [] and err == "", case.what
        assert result == ("opened", case.entry)
        return
    assert calls.opened == [], case.what  # the planted entry is never opened: rebuilt instead
    assert len(calls.built) == 1 and result == ("built", calls.built[0])
    if case.folder_bad:
        assert calls.built[0].parent.parent == isolated, case.what  # a private folder outside the cache
        assert "constshare: not using the build cache: " in err and "private temporary folder" in err, err
    else:
        assert calls.built[0] == case.entry, case.what
        words = case.entry_bad + (["does not match"] if case.key_bad else [])
        assert "constshare: not opening the cached build" in err and any(w in err for w in words), (case.what, err)
        if not case.owner:  # the rebuilt entry is sealed: the next call reuses it
            calls.opened.clear()
            assert samples.build_sample(SAMPLE, progress=False, cache_dir=case.programs) == ("opened", case.entry)


# ------------------------------------------------------------------ one real build, hostile copies of it


@pytest.fixture()
def genuine(built_sample):
    """The real build of SAMPLE in the build cache (compiled once, or reused)."""
    return built_sample(SAMPLE)


def _forge(entry: Path) -> None:
    cache_trust.record_path(entry).write_text(cache_trust.entry_record(os.urandom(32), entry.name, b"{}"))


def _edit_manifest(entry: Path) -> None:
    manifest = entry / "manifest.json"
    data = json.loads(manifest.read_text())
    data["description"] = "planted"
    manifest.write_text(json.dumps(data))


def _link_entry(entry: Path) -> None:
    moved = entry.with_name("moved")
    entry.rename(moved)
    entry.symlink_to(moved)


def _other_owner(entry: Path, monkeypatch) -> None:
    if ME == 0:
        for p in [entry, *entry.rglob("*")]:
            os.chown(p, OTHER, -1, follow_symlinks=False)
        return
    real = os.lstat

    def lstat(path, *a, **k):
        st = real(path, *a, **k)
        ours = k.get("dir_fd") is None and os.fspath(path) == str(entry)
        return os.stat_result([*list(st)[:4], OTHER, *list(st)[5:]]) if ours else st

    monkeypatch.setattr(os, "lstat", lstat)


HOSTILE = {
    "manifest changed": (lambda e, mp: _edit_manifest(e), "does not match"),
    "no record": (lambda e, mp: cache_trust.record_path(e).unlink(), "has no record"),
    "forged record": (lambda e, mp: _forge(e), "does not match"),
    "entry writable by group": (lambda e, mp: os.chmod(e, 0o770), "group or others can write"),
    "file writable by others": (lambda e, mp: os.chmod(next(e.rglob("model.so")), 0o646), "can write"),
    "folder sticky and world-writable": (lambda e, mp: os.chmod(e.parent, 0o1777), "not using the build cache"),
    "entry owned by another uid": (lambda e, mp: _other_owner(e, mp), "owned by uid"),
    "symlinked entry": (lambda e, mp: _link_entry(e), "is a symbolic link"),
}


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_a_hostile_copy_of_a_real_build_is_rebuilt(hostile, genuine, tmp_path, monkeypatch, isolated, capsys):
    """The real build copied into a cache, recorded by build_sample, then made hostile: the next
    build_sample rebuilds (the copy stands in for the compile) and opens nothing planted."""
    c = Calls()
    real_open = toolkit.sources.open_program
    monkeypatch.setattr(toolkit.build.builder, "build_program", _fake_builder(c, Path(genuine.root), real_open))
    programs = tmp_path / "programs"
    first = samples.build_sample(SAMPLE, cache_dir=programs, progress=False)
    entry = programs / _entry_name()
    assert c.built == [entry] and Path(first.root) == entry
    c.built.clear()

    def opener(path, **kw):
        c.opened.append(Path(path))
        return real_open(path, **kw)

    monkeypatch.setattr(toolkit.sources, "open_program", opener)
    again = samples.build_sample(SAMPLE, cache_dir=programs, progress=False)
    assert c.built == [] and c.opened == [entry] and Path(again.root) == entry  # genuine and recorded: reused
    c.opened.clear()
    capsys.readouterr()

    plant, reason = HOSTILE[hostile]
    plant(entry, monkeypatch)
    program = samples.build_sample(SAMPLE, cache_dir=programs, progress=False)
    err = capsys.readouterr().err
    assert c.opened == [] and len(c.built) == 1, hostile  # the planted entry is never opened
    assert reason in err and err.count("\n") == 1, err
    assert cache_trust.built_by_this_process(program.root)


def test_the_real_cache_reuses_a_genuine_build_without_rebuilding(genuine, monkeypatch, capsys):
    """The build cache the tests and the CLI use: a build there, made or trusted once, is reused."""

    def no_build(*a, **k):
        raise AssertionError("rebuilt a trusted cache entry")

    monkeypatch.setattr(toolkit.build.builder, "build_program", no_build)
    capsys.readouterr()
    program = samples.build_sample(SAMPLE, progress=False)
    assert Path(program.root) == Path(genuine.root) and capsys.readouterr().err == ""
    assert cache_trust.cache_distrust(Path(program.root), samples.cache_folders()) is None


def test_a_cached_build_gets_the_native_code_notice_one_built_here_does_not(
    genuine, tmp_path, monkeypatch, isolated, capsys
):
    """Loading a build reused from the cache runs its .so: the CLI says so on stderr, also the first time;
    a program this process has just built needs no notice."""
    from toolkit.cli import main
    from toolkit.core.errors import ToolkitError
    from toolkit.reports.native_code import native_code_notice

    monkeypatch.setattr(toolkit.reports.native_code, "_NATIVE_CODE_NOTICED", [])

    def stop(*a, **k):
        raise ToolkitError("stopped before the load")

    monkeypatch.setattr(toolkit.engine.session, "load_program", stop)
    assert main(["report", SAMPLE, "--policy", "fingerprint"]) == 2
    err = capsys.readouterr().err
    assert f"constshare: loading {SAMPLE!r} from " in err and "runs the native code compiled into it" in err

    monkeypatch.setattr(toolkit.reports.native_code, "_NATIVE_CODE_NOTICED", [])
    c = Calls()
    monkeypatch.setattr(
        toolkit.build.builder, "build_program", _fake_builder(c, Path(genuine.root), toolkit.sources.open_program)
    )
    built = samples.build_sample(SAMPLE, cache_dir=tmp_path / "programs", progress=False)
    assert c.built and native_code_notice(built) is None  # built by this process
    moved = tmp_path / "moved"
    shutil.copytree(built.root, moved)
    assert "runs the native code" in native_code_notice(toolkit.sources.open_program(moved))  # a copy is not


# ------------------------------------------------------------------ modes under umask 000


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_folders_made_in_the_cache_are_0700_under_umask_000(tmp_path, monkeypatch, calls):
    cache = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("CONSTSHARE_CACHE", str(cache))
    old = os.umask(0)
    try:
        samples.build_sample(SAMPLE, progress=False)
        assert samples.private_cache_root(tmp_path / "c" / "programs") == tmp_path / "c" / "programs"
    finally:
        os.umask(old)
    entry = cache / "programs" / _entry_name()
    assert calls.built == [entry]
    made = [
        tmp_path / "a",
        tmp_path / "a" / "b",
        cache,
        cache / "programs",
        tmp_path / "c",
        tmp_path / "c" / "programs",
    ]
    inside = [entry, *entry.rglob("*")]
    assert {str(p): _mode(p) for p in made + [p for p in inside if p.is_dir()]} == {
        str(p): 0o700 for p in made + [p for p in inside if p.is_dir()]
    }
    assert all(_mode(p) & 0o022 == 0 for p in inside)  # the builder's 0666 files: no longer writable by others
    assert _mode(cache / "programs" / cache_trust.KEY_FILE) == 0o600
    assert _mode(cache_trust.record_path(entry)) == 0o600
    assert samples.build_sample(SAMPLE, progress=False) == ("opened", entry) and calls.built == [entry]


def test_the_record_binds_the_name_and_every_manifest_byte():
    key = hashlib.sha256(b"k").digest()
    base = cache_trust.entry_record(key, "s-cpu-1", b"{}")
    assert base == cache_trust.entry_record(key, "s-cpu-1", b"{}")
    others = {
        cache_trust.entry_record(key, "s-cpu-2", b"{}"),
        cache_trust.entry_record(key, "s-cpu-1", b"{ }"),
        cache_trust.entry_record(hashlib.sha256(b"j").digest(), "s-cpu-1", b"{}"),
        cache_trust.entry_record(key, "s-cpu-1\0{", b"}"),
    }
    assert base not in others and len(others) == 4
