"""Integrity before execution: one flipped byte in any .so is refused before any .so is
opened or any byte uploaded; one in a weights blob before any byte of it is uploaded (its
method's .so may be open by then: a blob's pieces are verified as they are read), and with
``LoadOptions(integrity="files-first")`` before any .so is opened too.

"Opened" is checked two ways: the runtime adapter's container factory is never called,
and no file of the copied program appears in this process's memory maps.  The strongest
form: a .so that segfaults on open, planted without updating the manifest, is refused and
the test process is still here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_errors import SAMPLE, clone
from test_isolation import build_crashing_so, mapped_files

from toolkit import upload
from toolkit.core.errors import IntegrityError
from toolkit.core.options import LoadOptions
from toolkit.core.policies import POLICIES, get_policy
from toolkit.engine.devices import resolve_devices
from toolkit.engine.session import Session, load_program
from toolkit.runtimes import aoti as runtime
from toolkit.sources import open_program

FILES = [
    "methods/prefill/model.so",
    "methods/decode/model.so",
    "methods/prefill/weights.blob",
    "methods/decode/weights.blob",
    "methods/decode/reference.safetensors",
]


@pytest.fixture(scope="module")
def base(built_sample):
    return built_sample(SAMPLE)


@pytest.fixture
def opened(monkeypatch):
    """Records every .so the loader opens and every byte it uploads (and still does it)."""
    calls: list[str] = []
    real_create, real_blob, real_const = (
        runtime.AotiContainer.create,
        runtime.AotiContainer.upload_blob,
        upload.upload_constant,
    )

    def create(cls, so_path, device):
        calls.append(f"open {so_path}")
        return real_create.__func__(cls, so_path, device)

    def upload_blob(self, blob_path):
        calls.append(f"blob {blob_path}")
        return real_blob(self, blob_path)

    def upload_constant(blob_path, spec, *a, **kw):
        calls.append(f"constant {blob_path}")
        return real_const(blob_path, spec, *a, **kw)

    monkeypatch.setattr(runtime.AotiContainer, "create", classmethod(create))
    monkeypatch.setattr(runtime.AotiContainer, "upload_blob", upload_blob)
    monkeypatch.setattr(upload, "upload_constant", upload_constant)  # the AOTI runtime looks it up per load
    return calls


def flip_byte(path: Path, where: float = 0.5) -> int:
    data = bytearray(path.read_bytes())
    i = min(int(len(data) * where), len(data) - 1)
    data[i] ^= 0x01
    path.write_bytes(bytes(data))
    return i


@pytest.mark.parametrize("files_first", [False, True], ids=["default", "files-first"])
@pytest.mark.parametrize("rel", FILES)
@pytest.mark.parametrize("where", [0.0, 0.5, 1.0], ids=["first", "middle", "last"])
def test_one_flipped_byte_is_refused_before_anything_runs(base, tmp_path, opened, rel, where, files_first):
    root = clone(base, tmp_path / "p")
    flip_byte(root / rel, where)
    program = open_program(root)  # reading the manifest opens nothing
    s = load_program(program, "fingerprint", options=LoadOptions(integrity="files-first" if files_first else "staged"))
    method = rel.split("/")[1]
    assert s.status == "failed"
    assert s.failed_method == method
    assert isinstance(s.exception, IntegrityError)
    assert s.exception.path == str(root / rel)
    assert "does not match the program's record" in s.error and str(root / rel) in s.error
    assert str(root) not in mapped_files()
    assert method not in s.methods
    if rel.endswith(".blob") and not files_first:  # verified as read: before any byte of its method is uploaded
        at = max(i for i, c in enumerate(opened) if c.startswith("open "))  # the failing method's .so
        assert opened[at + 1 :] == [], "bytes of the method were uploaded before its blob was verified"
        assert len([c for c in opened if c.startswith("open ")]) == [m.name for m in program.methods].index(method) + 1
        return
    assert opened == [], "a .so was opened or bytes uploaded before the integrity check"
    assert not s.methods and len(s.cache) == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_load_method_alone_checks_its_files_first(base, tmp_path, opened, policy):
    """Session.load_method (used directly, e.g. from threads) checks before it opens."""
    root = clone(base, tmp_path / "p")
    flip_byte(root / "methods/decode/weights.blob")
    program = open_program(root)
    s = Session(program, get_policy(policy), resolve_devices(program, None))
    if policy == "fqn-weight-cache":  # 1.5.x's exporter refuses this program: no method of it exists
        from toolkit.core.errors import LoadError

        for m in ("prefill", "decode"):
            with pytest.raises(LoadError, match="Duplicate key"):
                s.load_method(m)
        assert opened == [] and not s.methods
        return
    s.load_method("prefill")
    opened.clear()
    try:  # the blob's pieces are verified as they are read: a policy that reads none of it loads
        s.load_method("decode")
    except IntegrityError as e:
        assert "does not match the program's record" in str(e)
    else:
        assert "decode" in s.methods
    # decode's .so may be open by then; nothing of the tampered blob was uploaded
    assert [c for c in opened if not c.startswith("open ")] == []
    # with files-first, every byte is checked before decode's .so is opened, whatever the policy reads
    s = Session(
        program, get_policy(policy), resolve_devices(program, None), options=LoadOptions(integrity="files-first")
    )
    s.load_method("prefill")
    opened.clear()
    with pytest.raises(IntegrityError, match="does not match the program.s record"):
        s.load_method("decode")
    assert opened == []
    assert list(s.methods) == ["prefill"]


def test_planted_crashing_so_is_refused_in_process(base, tmp_path, opened):
    """Without isolation: the digest check is what keeps this process alive."""
    root = clone(base, tmp_path / "p")
    so = root / "methods/decode/model.so"
    so.unlink()
    build_crashing_so(so)
    s = load_program(root, "fingerprint")
    assert s.status == "failed" and s.failed_method == "decode"
    assert isinstance(s.exception, IntegrityError)
    assert opened == []  # not even prefill's (intact) .so: every file is checked first
    assert str(root) not in mapped_files()


def test_intact_copy_loads_from_its_verified_copies(base, tmp_path, opened):
    """The control: the same copy, untouched, opens both .so files and loads; what it opens,
    uploads and maps are the sealed copies it verified, never the program's own files."""
    root = clone(base, tmp_path / "p")
    s = load_program(root, "fingerprint")
    assert s.status == "loaded"
    so = [c.removeprefix("open ") for c in opened if c.startswith("open")]
    assert [Path(p).read_bytes() for p in so] == [
        (root / f"methods/{m}/model.so").read_bytes() for m in ("prefill", "decode")
    ]
    assert all(p.startswith("/proc/self/fd/") for p in so)
    assert all(c.split(" ", 1)[1].startswith("/proc/self/fd/") for c in opened)
    assert str(root) not in mapped_files()
    s.close()
    s = load_program(root, "fingerprint", check_integrity=False)  # the control's control: the files themselves
    assert s.status == "loaded" and str(root) in mapped_files()


def test_integrity_check_can_be_disabled_explicitly(base, tmp_path):
    """check_integrity=False (integrity "off") is an explicit opt-out: the flipped byte then goes unnoticed."""
    root = clone(base, tmp_path / "p")
    flip_byte(root / "methods/decode/weights.blob")
    s = load_program(root, "no-sharing", check_integrity=False)
    assert s.status == "loaded"
