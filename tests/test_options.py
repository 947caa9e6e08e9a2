"""Options, not environment: one typed LoadOptions per load, the environment read once at the edge
(toolkit.core.options.options_from_environment), and nowhere else in the toolkit."""

from __future__ import annotations

import ast
import itertools
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from toolkit import integrity, upload
from toolkit.core.options import (
    ALIASES,
    OPTIONS,
    LoadOptions,
    cache_folder,
    integrity_from_flags,
    options_from_environment,
    options_markdown,
)
from toolkit.core.vocab import FirstLoad, Integrity, UploadMode, UploadPath
from toolkit.engine.session import load_program
from toolkit.runtimes.aoti import AotiRuntime

TOOLKIT = Path(__file__).resolve().parents[1] / "toolkit"


def test_the_defaults_are_the_default_load():
    assert options_from_environment({}) == LoadOptions()
    o = LoadOptions()
    assert (o.upload, o.first_load, o.host_lock_bytes, o.integrity, o.rehash, o.hash_threads, o.cache_dir) == (
        UploadMode.MAPPED,
        FirstLoad.LOCKED,
        None,
        Integrity.STAGED,
        False,
        None,
        None,
    )


def test_every_variable_is_read_into_its_field(tmp_path):
    env = {
        "CONSTSHARE_UPLOAD": " Staged ",
        "CONSTSHARE_FIRST_LOAD": "hybrid",
        "CONSTSHARE_HOST_LOCK_GIB": "1.5",
        "CONSTSHARE_REHASH": "yes",
        "CONSTSHARE_HASH_THREADS": "3",
        "CONSTSHARE_INTEGRITY": "Files-First",
        "CONSTSHARE_CACHE": str(tmp_path),
        "UNRELATED": "x",
    }
    assert options_from_environment(env) == LoadOptions(
        upload=UploadMode.STAGED,
        first_load=FirstLoad.HYBRID,
        host_lock_bytes=3 << 29,
        rehash=True,
        hash_threads=3,
        integrity=Integrity.FILES_FIRST,
        cache_dir=tmp_path,
    )
    assert options_from_environment({"CONSTSHARE_REHASH": "0", "CONSTSHARE_UPLOAD": ""}) == LoadOptions()


@pytest.mark.parametrize(
    "name,bad,expected",
    [
        ("CONSTSHARE_UPLOAD", "turbo", "one of mapped, staged, unstaged"),
        ("CONSTSHARE_FIRST_LOAD", "telepathy", "one of staged, locked, hybrid, pipelined"),
        ("CONSTSHARE_HOST_LOCK_GIB", "lots", "a number of GiB"),
        ("CONSTSHARE_REHASH", "maybe", "1, true, yes, 0, false, no"),
        ("CONSTSHARE_HASH_THREADS", "0", "a positive integer"),
        ("CONSTSHARE_HASH_THREADS", "many", "a positive integer"),
        ("CONSTSHARE_INTEGRITY", "sometimes", "one of staged, copy, in-place, files-first, off"),
        ("CONSTSHARE_HASH_ALL", "maybe", "1, true, yes, 0, false, no"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_variable(name, bad, expected):
    with pytest.raises(ValueError, match=f"^{name}='{bad}': expected {expected}$"):
        options_from_environment({name: bad})


def test_options_are_checked_at_construction_naming_the_field():
    with pytest.raises(ValueError, match="LoadOptions.first_load 'telepathy'"):
        LoadOptions(first_load="telepathy")
    with pytest.raises(ValueError, match="LoadOptions.hash_threads=0"):
        LoadOptions(hash_threads=0)
    with pytest.raises(ValueError, match="LoadOptions.integrity 'sometimes'"):
        LoadOptions(integrity="sometimes")
    assert LoadOptions(upload="unstaged").upload is UploadMode.UNSTAGED  # strings become the enum


def test_the_build_cache_folder_comes_from_the_options(monkeypatch, tmp_path):
    from toolkit.build.samples import cache_root

    monkeypatch.setenv("CONSTSHARE_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "programs"
    assert cache_folder(LoadOptions(cache_dir=tmp_path / "x"), "so") == tmp_path / "x" / "so"
    monkeypatch.delenv("CONSTSHARE_CACHE")
    assert cache_root() == Path.home() / ".cache" / "constshare" / "programs"
    assert cache_folder(LoadOptions(), "so") == Path.home() / ".cache" / "constshare" / "so"  # one root, two parts


def test_a_load_keeps_its_options_and_check_integrity_sets_their_integrity(built_sample, monkeypatch):
    prog = built_sample("total_collision")
    s = load_program(
        prog, "fingerprint", device="cpu", options=LoadOptions(integrity="off", rehash=True), check_integrity=True
    )
    assert s.status == "loaded" and s.options == LoadOptions(rehash=True) and s.check_integrity
    assert s.runtime.options.rehash  # the runtime moves bytes as the same options say
    s.close()
    monkeypatch.setenv("CONSTSHARE_FIRST_LOAD", "hybrid")  # no options: read from the environment, at the call
    s = load_program(prog, "fingerprint", device="cpu", check_integrity=False)
    assert s.options == replace(options_from_environment(), integrity=Integrity.OFF) and not s.check_integrity
    assert s.options.first_load is FirstLoad.HYBRID
    s.close()
    s = load_program(prog, "fingerprint", device="cpu", options=LoadOptions(integrity="copy"), check_integrity=True)
    assert s.options.integrity is Integrity.COPY  # checked already: the path stays
    s.close()


# the only places in toolkit/ that touch the process environment
ALLOWED = {
    ("core/options.py", "options_from_environment"),  # the one reader
    ("workflows/isolation.py", "_run_worker"),  # the child process's environment: a copy handed on, not options
    ("workflows/constant_tables.py", "_run_worker"),  # the same, for the worker that reads tables from a .so
    ("plots/static.py", "static_images_wanted"),  # a display switch for notebook exports, not a load option
    ("runtimes/aoti.py", "AotiRuntime.__init__"),  # AOTInductor's own switch, read by the .so with getenv
}
_ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_uses(root: Path) -> set[tuple[str, str]]:
    """(file, enclosing function) of every ``os.environ``/``os.getenv``-like use under ``root``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()

        def visit(node: ast.AST, where: str) -> None:
            for child in ast.iter_child_nodes(node):
                inner = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner = f"{where}.{child.name}" if where else child.name
                is_env = (
                    isinstance(child, ast.Attribute)
                    and child.attr in _ENV_NAMES
                    and isinstance(child.value, ast.Name)
                    and child.value.id == "os"
                ) or (
                    isinstance(child, ast.ImportFrom)
                    and child.module == "os"
                    and any(a.name in _ENV_NAMES for a in child.names)
                )
                if is_env:
                    found.add((rel, where or "<module>"))
                visit(child, inner)

        visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_the_environment_is_read_only_by_options_from_environment():
    assert environment_uses(TOOLKIT) == ALLOWED


def test_the_environment_check_finds_a_read_anywhere(tmp_path):
    (tmp_path / "deep.py").write_text("import os\nclass A:\n    def f(self):\n        return os.getenv('X')\n")
    (tmp_path / "top.py").write_text("from os import environ\n")
    assert environment_uses(tmp_path) == {("deep.py", "A.f"), ("top.py", "<module>")}


# ----------------------------------------------------------------------------- the table of options

USER_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "user-guide.md"  # where the table of options is
BEGIN = "<!-- options: generated by toolkit.core.options.options_markdown(); tests/test_options.py checks it -->"
END = "<!-- end of options -->"


def test_the_user_guide_shows_the_generated_table_of_options():
    text = USER_GUIDE.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    shown = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert shown.strip("\n") == options_markdown().strip("\n")


def test_every_field_is_in_the_table_once_and_every_alias_is_a_keyword():
    names = [o.field for o in OPTIONS]
    assert sorted(names) == sorted(f.name for f in fields(LoadOptions)) and len(set(names)) == len(names)
    variables = [o.variable for o in (*OPTIONS, *ALIASES) if o.variable]
    assert len(set(variables)) == len(variables) and all(v.startswith("CONSTSHARE_") for v in variables)
    assert not {a.field for a in ALIASES} & set(names)
    for a in ALIASES:  # accepted, and its value other than the default changes the path
        default = a.read(a.default.strip("`"))
        assert LoadOptions(**{a.field: default}) == LoadOptions() != LoadOptions(**{a.field: not default}), a.field
    for o in OPTIONS:
        assert o.variable in options_from_environment.__doc__ and "|" not in o.help


def test_a_default_the_table_shows_as_a_value_is_the_fields_default():
    for o in OPTIONS:
        want = getattr(LoadOptions(), o.field)
        if o.default.startswith("`") and want is not None:
            assert getattr(LoadOptions(**{o.field: o.read(o.default.strip("`"))}), o.field) == want, o.field
    assert options_from_environment({"CONSTSHARE_DEVICE_DIGEST": "auto"}) == LoadOptions()


# ----------------------------------------------------------------------------- the integrity path

BOOLS = ("check_integrity", "hash_all", "integrity_copy", "integrity_staging")
COMBOS = [dict(zip(BOOLS, bits)) for bits in itertools.product((False, True), repeat=4)]
# one combination of the booleans per path
SPELLED = {
    Integrity.STAGED: (True, False, True, True),
    Integrity.COPY: (True, False, True, False),
    Integrity.IN_PLACE: (True, False, False, True),
    Integrity.FILES_FIRST: (True, True, True, True),
    Integrity.OFF: (False, False, True, True),
}


def test_the_boolean_aliases_set_the_integrity_path():
    for combo in COMBOS:
        assert LoadOptions(**combo).integrity is integrity_from_flags(**combo), combo
    assert LoadOptions(hash_all=True, integrity_copy=False).integrity is Integrity.FILES_FIRST  # the first wins
    copy = LoadOptions(integrity="copy")
    assert replace(copy, check_integrity=False).integrity is Integrity.OFF
    assert replace(copy, check_integrity=True) == copy and replace(copy, rehash=True).integrity is Integrity.COPY
    assert replace(LoadOptions(integrity="off"), check_integrity=True) == LoadOptions()
    assert LoadOptions(integrity="in-place", integrity_staging=False).integrity is Integrity.IN_PLACE
    for path, flags in SPELLED.items():
        assert LoadOptions(**dict(zip(BOOLS, flags))) == LoadOptions(integrity=path)


def test_the_old_variables_set_the_integrity_path():
    names = {"hash_all": "CONSTSHARE_HASH_ALL", "integrity_copy": "CONSTSHARE_INTEGRITY_COPY"}
    names["integrity_staging"] = "CONSTSHARE_INTEGRITY_STAGING"
    for bits in itertools.product((False, True), repeat=3):
        flags = dict(zip(names, bits))
        env = {names[k]: "1" if v else "0" for k, v in flags.items()}
        assert options_from_environment(env) == LoadOptions(**flags), env
    assert options_from_environment({"CONSTSHARE_INTEGRITY": "off", "CONSTSHARE_HASH_ALL": "0"}).integrity is (
        Integrity.OFF
    )


def _expected_path(check_integrity, hash_all, integrity_copy, integrity_staging) -> dict:
    """What a load does with the four booleans: files checked or not, every byte first (hash_all), a
    blob's pieces hashed in the file itself (no copy), through the sealed copy, or hashed as staged."""
    host, staged = {UploadPath.HOST}, {UploadPath.VERIFIED_HOST}
    if not check_integrity:
        path = (False, False, set(), False, host, {"file"}, ("file", False))
    elif hash_all:
        path = (True, True, set(), False, host, {"copy"}, ("copy", False))
    elif not integrity_copy:
        path = (True, False, {True}, False, host, {"file"}, ("file", False))
    elif not integrity_staging:
        path = (True, False, {False}, False, host, {"copy"}, ("copy", False))
    else:
        path = (True, False, {False}, True, staged, set(), ("file", True))
    return dict(zip(("checked", "whole", "lazy", "staged", "paths", "read", "cuda"), path))


def _path_taken(prog, options, monkeypatch) -> dict:
    """What a CPU load under ``options`` does with the program's files, observed: whether it checks
    them, verifies every blob whole first, makes a blob's lazy copy (in place or not), hashes uploads
    as staged, the upload paths, where per-constant uploads read; and which way the runtime would send
    a CUDA batch of a blob's constants (under every upload and first load; the staging itself stubbed)."""
    files = {str(prog.path(rel)) for rel in prog.files}
    blobs = {str(prog.path(m.blob_file)) for m in prog.methods}
    seen = {"whole": set(), "lazy": set(), "staged": set(), "read": set()}
    real_copy, real_lazy = integrity.VerifiedFiles.copy, integrity.VerifiedCopy.lazy.__func__
    real_stage, real_const = upload.stage_pieces, upload.upload_constant

    def copy(self, path, record, options=LoadOptions(), ranges=None):
        if ranges is None and str(path) in blobs:
            seen["whole"].add(str(path))
        return real_copy(self, path, record, options, ranges)

    def lazy(cls, *a, in_place=False, **kw):
        seen["lazy"].add(in_place)
        return real_lazy(cls, *a, in_place=in_place, **kw)

    def stage(path, record, *a, **kw):
        seen["staged"].add(record is not None)
        return real_stage(path, record, *a, **kw)

    def upload_constant(path, *a, **kw):
        seen["read"].add("file" if str(path) in files else "copy")
        return real_const(path, *a, **kw)

    integrity.verified_files().clear()
    with monkeypatch.context() as m:
        m.setattr(integrity.VerifiedFiles, "copy", copy)
        m.setattr(integrity.VerifiedCopy, "lazy", classmethod(lazy))
        m.setattr(upload, "stage_pieces", stage)  # the AOTI runtime looks both up per load
        m.setattr(upload, "upload_constant", upload_constant)
        s = load_program(prog, "fingerprint", device="cpu", options=options)
        assert s.status == "loaded", s.error
        taken = {
            "checked": s.check_integrity,
            "whole": seen["whole"] == blobs,
            "lazy": seen["lazy"],
            "staged": True in seen["staged"],
            "paths": {e.path for e in s.log if e.kind.value == "constant_uploaded"},
            "read": seen["read"],
        }
        cuda = set()
        m.setattr(upload, "stage_pieces", lambda path, record, specs, *a, **kw: cuda.add((path, record)) or [])
        decode = prog.method("decode")
        for up, first in itertools.product(UploadMode, FirstLoad):
            rt = AotiRuntime(replace(options, upload=up, first_load=first))
            got = rt.stage_constants(prog, decode.blob_file, list(decode.constants), torch.device("cuda", 0))
            if taken["staged"]:
                assert got is not None and got[1] is UploadPath.VERIFIED_STAGED
            elif up is UploadMode.MAPPED and first is FirstLoad.PIPELINED:
                assert got is not None and got[1] is UploadPath.PIECES
            else:
                assert got is None
        ((path, record),) = cuda
        taken["cuda"] = ("file" if str(path) in files else "copy", record is not None)
        s.close()
    integrity.verified_files().clear()
    return taken


def test_every_combination_of_the_boolean_aliases_takes_its_path(built_sample, monkeypatch):
    prog = built_sample("total_collision")
    for combo in COMBOS:
        assert _path_taken(prog, LoadOptions(**combo), monkeypatch) == _expected_path(**combo), combo
    for path, flags in SPELLED.items():
        assert _path_taken(prog, LoadOptions(integrity=path), monkeypatch) == _expected_path(*flags), path


def test_under_rehash_files_first_reads_its_sealed_copies_again(built_sample, monkeypatch):
    """With ``rehash``, a blob verified whole first is verified again when its constants are read: into a
    sealed copy, which the uploads read, whatever ``integrity_copy`` says (``files-first`` is one path)."""
    prog = built_sample("total_collision")
    for combo in COMBOS:
        want = _expected_path(**combo)
        if combo["check_integrity"] and combo["hash_all"]:
            want["lazy"] = {False}
        assert _path_taken(prog, LoadOptions(rehash=True, **combo), monkeypatch) == want, combo
