"""The real ExecuTorch exports the notebooks learn from: found from an installed package (shipped as
package data), unpacked once into the build cache, read as what the exporter did."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import toolkit
from toolkit.core.errors import ProgramError
from toolkit.sources.executorch import examples

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CONSTSHARE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_shipped_exports_say_what_executorch_1_5_1_did(cache):
    exports = {e.name: e for e in toolkit.example_exports()}
    assert {"total_collision", "three_methods", "bart_encoder_decoder", "mutated_buffer"} <= set(exports)
    assert all(e.exporter == "executorch 1.5.1" for e in exports.values())
    refused = {n for n, e in exports.items() if e.status == "refused"}
    assert refused == {"three_methods", "bart_encoder_decoder"}
    for name in refused:
        e = exports[name]
        assert e.pte is None and e.message.startswith("Duplicate key cuda_fqn_weight:cuda:")
        with pytest.raises(ProgramError, match="refused"):
            e.open()
    collision = exports["total_collision"]
    # exported because its two CUDA .so files differ: two keys for the lifted constants
    assert collision.status == "exported" and len(set(collision.so_keys)) == 2 and all(collision.so_keys)
    program = collision.open()
    assert set(program.method_names) == set(collision.methods) == {"prefill", "decode"}
    assert (cache / "examples" / "executorch-1.5.1-cuda" / "total_collision" / "prog.pte").is_file()


def test_the_archive_is_package_data():
    """The package carries the archive where pyproject's package-data says, without the checkout."""
    pyproject = (REPO / "pyproject.toml").read_text()
    section = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    line = next(x for x in section.splitlines() if x.startswith('"toolkit.sources.executorch"'))
    patterns = json.loads(line.split("=", 1)[1])
    package = Path(examples.__file__).parent
    shipped = {p.resolve() for pattern in patterns for p in package.glob(pattern)}
    assert examples.example_archive().resolve() in shipped
    assert examples.example_archive().parent == examples.PACKAGED


def _archive(path: Path, folder: str, records: dict[str, dict]) -> None:
    with tarfile.open(path, "w:xz") as tar:
        for name, record in records.items():
            data = json.dumps(record).encode()
            info = tarfile.TarInfo(f"{folder}/{name}/result.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _record(status: str, message: str = "") -> dict:
    return {
        "program": "p",
        "status": status,
        "message": message,
        "methods": ["a", "b"],
        "environment": {"executorch": "9.9"},
        "exporter_record": {"methods": [{"method": "b", "so_key": "kb"}, {"method": "a", "so_key": "ka"}]},
    }


def test_an_archive_is_unpacked_once_and_again_when_it_changes(cache, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(examples, "PACKAGED", shipped)
    archive = shipped / examples.archive_name("9.9", "cuda")
    _archive(archive, "executorch-9.9-cuda", {"one": _record("refused", "no")})
    [e] = examples.example_exports("9.9")
    assert (e.exporter, e.status, e.message, e.so_keys) == ("executorch 9.9", "refused", "no", ("ka", "kb"))
    stamp = cache / "examples" / "executorch-9.9-cuda" / examples.STAMP_FILE
    before = stamp.stat().st_mtime_ns
    examples.example_exports("9.9")
    assert stamp.stat().st_mtime_ns == before  # not unpacked again
    _archive(archive, "executorch-9.9-cuda", {"one": _record("exported"), "two": _record("exported")})
    assert [e.status for e in examples.example_exports("9.9")] == ["exported", "exported"]
    assert not [p for p in (cache / "examples").iterdir() if p.name.startswith(".tmp-")]


def test_a_bad_record_names_its_file(cache, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(examples, "PACKAGED", shipped)
    _archive(shipped / examples.archive_name("9.9", "cuda"), "executorch-9.9-cuda", {"one": _record("maybe")})
    with pytest.raises(ProgramError, match=r"one/result\.json.*'maybe'"):
        examples.example_exports("9.9")
    _archive(shipped / examples.archive_name("9.9", "cuda"), "executorch-9.9-cuda", {"one": {"status": "exported"}})
    with pytest.raises(ProgramError, match=r"one/result\.json: not an export record"):
        examples.example_exports("9.9")


def test_an_archive_not_shipped_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(examples, "PACKAGED", tmp_path / "none")
    monkeypatch.setattr(examples, "CHECKOUT", tmp_path / "none")
    with pytest.raises(ProgramError, match=r"tests/fixtures/executorch-1\.2\.0-cuda-exports\.tar\.xz"):
        examples.example_exports("1.2.0")


def test_a_clone_finds_the_archives_the_package_does_not_ship(cache):
    if not (examples.CHECKOUT / examples.archive_name("1.2.0", "cuda")).is_file():
        pytest.fail("the repository's tests/fixtures/ lacks executorch-1.2.0-cuda-exports.tar.xz")
    assert examples.example_archive("1.2.0").parent == examples.CHECKOUT


@pytest.mark.slow
def test_a_wheel_carries_the_exports(tmp_path):
    """A wheel built from the tree holds the archive itself (the link followed), so an installed
    package finds the exports with no checkout beside it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("toolkit", "sample_programs"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "tests" / "fixtures").mkdir(parents=True)
    archive = examples.archive_name("1.5.1", "cuda")
    shutil.copy(REPO / "tests" / "fixtures" / archive, src / "tests" / "fixtures" / archive)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w", str(tmp_path)],
        cwd=src,
        check=True,
        env=env,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo(f"toolkit/sources/executorch/example_exports/{archive}")
        assert info.file_size == (REPO / "tests" / "fixtures" / archive).stat().st_size
        # and the device digest's precompiled kernels, which an installed package loads without Triton
        for shipped in (REPO / "toolkit" / "integrity" / "cubins").glob("*/*"):
            assert z.read(shipped.relative_to(REPO).as_posix()) == shipped.read_bytes()
