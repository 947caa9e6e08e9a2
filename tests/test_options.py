"""Options, not environment: one typed LoadOptions per load, the environment read once at the edge
(toolkit.core.options.options_from_environment), and nowhere else in the toolkit."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from toolkit.core.options import LoadOptions, cache_folder, options_from_environment
from toolkit.core.vocab import FirstLoad, UploadMode

TOOLKIT = Path(__file__).resolve().parents[1] / "toolkit"


def test_the_defaults_are_the_default_load():
    assert options_from_environment({}) == LoadOptions()
    o = LoadOptions()
    assert (o.upload, o.first_load, o.host_lock_bytes, o.check_integrity, o.rehash, o.hash_threads, o.cache_dir) == (
        UploadMode.MAPPED,
        FirstLoad.LOCKED,
        None,
        True,
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
        "CONSTSHARE_CACHE": str(tmp_path),
        "UNRELATED": "x",
    }
    assert options_from_environment(env) == LoadOptions(
        upload=UploadMode.STAGED,
        first_load=FirstLoad.HYBRID,
        host_lock_bytes=3 << 29,
        rehash=True,
        hash_threads=3,
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
    assert LoadOptions(upload="unstaged").upload is UploadMode.UNSTAGED  # strings become the enum


def test_the_build_cache_folder_comes_from_the_options(monkeypatch, tmp_path):
    from toolkit.build.samples import cache_root

    monkeypatch.setenv("CONSTSHARE_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "programs"
    assert cache_folder(LoadOptions(cache_dir=tmp_path / "x"), "so") == tmp_path / "x" / "so"
    monkeypatch.delenv("CONSTSHARE_CACHE")
    assert cache_root() == Path.home() / ".cache" / "constshare" / "programs"
    assert cache_folder(LoadOptions(), "so") == Path.home() / ".cache" / "constshare" / "so"  # one root, two parts


def test_a_load_keeps_its_options_and_check_integrity_overrides_them(built_sample, monkeypatch):
    from toolkit import load_program

    prog = built_sample("total_collision")
    s = load_program(
        prog, "fingerprint", device="cpu", options=LoadOptions(check_integrity=False, rehash=True), check_integrity=True
    )
    assert s.status == "loaded" and s.options == LoadOptions(rehash=True) and s.check_integrity
    assert s.runtime.options.rehash  # the runtime moves bytes as the same options say
    s.close()
    monkeypatch.setenv("CONSTSHARE_FIRST_LOAD", "hybrid")  # no options: read from the environment, at the call
    s = load_program(prog, "fingerprint", device="cpu", check_integrity=False)
    assert s.options == replace(options_from_environment(), check_integrity=False)
    assert s.options.first_load is FirstLoad.HYBRID
    s.close()


# the only places in toolkit/ that touch the process environment
ALLOWED = {
    ("core/options.py", "options_from_environment"),  # the one reader
    ("workflows/isolation.py", "_run_worker"),  # the child process's environment: a copy handed on, not options
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
