"""A concurrent writer never makes a load use bytes other than those it verified, nor kills it.

Each family runs in a child process with a timeout, a writer process beside it (forked there):
the child must exit by itself (a negative return code is a signal: SIGBUS, SIGSEGV) and report
no case that passed the check with bytes other than the recorded ones ("verified but wrong").
Families: tamper through a shared mapping whose page is already dirty (no mtime/ctime change);
a writer swapping the file every 0.5 ms; a shrink and regrow during the read; a shrink while a
source reads (and hashes) a sparse file as ``open_program`` does; and whole loads of a built
program under a swapper and after a tamper by mapping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_errors import SAMPLE, clone

REPO = Path(__file__).resolve().parents[1]

PRELUDE = '''
import hashlib, json, mmap, os, signal, sys, time
from pathlib import Path
from toolkit.core.errors import ToolkitError
from toolkit.integrity import VerifiedFiles, chunk_sha256s
from toolkit.core.model import FileRecord
from toolkit.core.options import LoadOptions

REHASH = LoadOptions(rehash=True)

def writer(loop):
    """Fork a process that runs loop() every 0.5 ms until killed; returns its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            while True:
                loop()
                time.sleep(0.0005)
        finally:
            os._exit(0)
    return pid

def stop(pid):
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)

def record(data, chunk=64 << 10):
    return FileRecord(hashlib.sha256(data).hexdigest(), len(data), chunk,
                      tuple(hashlib.sha256(data[i:i + chunk]).hexdigest() for i in range(0, len(data), chunk)))
'''


def run_child(body: str, tmp_path: Path, timeout: float = 120) -> dict:
    """Run ``body`` (after PRELUDE) in a fresh interpreter; its last stdout line is a JSON summary."""
    code = PRELUDE + textwrap.dedent(body)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [
                str(REPO),
                str(REPO / "tests"),  # (and what the parent has)
                *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
            ]
        ),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"child ended with {proc.returncode} (negative: a signal)\n{proc.stderr[-3000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(got)  # the counts, shown with pytest -s
    return got


def test_a_write_through_an_already_dirty_mapping_never_reaches_a_verified_load(tmp_path):
    got = run_child(
        """
    p = Path(sys.argv[1]) / "blob"
    vf, cases, wrong, invisible, refused = VerifiedFiles(), 0, 0, 0, 0
    for i in range(300):
        good = os.urandom(1 << 18)
        p.write_bytes(good)
        rec = record(good)
        fd = os.open(p, os.O_RDWR)
        mm = mmap.mmap(fd, len(good))
        at = (i * 4099) % len(good)
        mm[at] = mm[at]  # the page is dirty now: later writes through the mapping change no timestamp
        vf.copy(p, rec)  # verified
        before = os.stat(p)
        mm[at] = mm[at] ^ 0xFF  # the tamper
        after = os.stat(p)
        invisible += (before.st_mtime_ns, before.st_ctime_ns) == (after.st_mtime_ns, after.st_ctime_ns)
        used = vf.copy(p, rec).path.read_bytes()  # what a second load in this process reads
        wrong += used != good
        try:
            vf.copy(p, rec, REHASH)
            wrong += 1  # the tampered file itself passed
        except ToolkitError:
            refused += 1
        mm.close(); os.close(fd); vf.clear()
        cases += 1
    print(json.dumps(dict(cases=cases, wrong=wrong, invisible=invisible, refused=refused)))
    """,
        tmp_path,
    )
    assert got["cases"] >= 300 and got["wrong"] == 0 and got["refused"] == got["cases"]
    assert got["invisible"] > 0, "the tamper always changed a timestamp: the attack was not reproduced"


def test_a_writer_swapping_the_file_every_half_millisecond(tmp_path):
    got = run_child(
        """
    d = Path(sys.argv[1]); p = d / "blob"
    good = os.urandom(1 << 20)
    bad = bytearray(good); bad[len(bad) // 2] ^= 1; bad = bytes(bad)
    (d / "good").write_bytes(good); (d / "bad").write_bytes(bad); p.write_bytes(good)
    n = [0]
    def swap():  # by rename (a new inode) and in place (the same one), alternately
        n[0] += 1
        src = d / ("bad" if n[0] % 2 else "good")
        if n[0] % 4 < 2:
            os.link(src, d / "tmp"); os.replace(d / "tmp", p)
        else:
            with open(p, "r+b") as f:
                f.seek(len(good) // 2); f.write((bad if n[0] % 2 else good)[len(good) // 2:len(good) // 2 + 1])
    pid = writer(swap)
    rec, vf, right, wrong, refused = record(good), VerifiedFiles(), 0, 0, 0
    try:
        for i in range(300):
            try:
                used = vf.copy(p, rec, REHASH).path.read_bytes()
            except ToolkitError:
                refused += 1
                continue
            right += used == good
            wrong += used != good
    finally:
        stop(pid)
    print(json.dumps(dict(cases=right + wrong + refused, right=right, wrong=wrong, refused=refused)))
    """,
        tmp_path,
    )
    assert got["cases"] >= 300 and got["wrong"] == 0


def test_a_shrink_and_regrow_during_the_read_is_a_clean_error(tmp_path):
    got = run_child(
        """
    from toolkit.core.model import ConstantSpec
    from toolkit.upload import read_constant_bytes
    p = Path(sys.argv[1]) / "blob"
    good = os.urandom(4 << 20)
    p.write_bytes(good)
    flip = [0]
    def shrink_regrow():
        flip[0] ^= 1
        fd = os.open(p, os.O_WRONLY)
        if flip[0]:
            os.ftruncate(fd, 4096)
        else:
            os.pwrite(fd, good[4096:], 4096)
        os.close(fd)
    pid = writer(shrink_regrow)
    rec, vf, right, wrong, refused, unchecked = record(good), VerifiedFiles(), 0, 0, 0, 0
    tail = ConstantSpec(name="c", fqn="c", kind="buffer", mutated=False, dtype="uint8", shape=(1 << 20,),
                        strides=(1,), storage_offset=0, nbytes=1 << 20, offset=3 << 20, digest="")
    try:
        for i in range(300):
            try:
                used = vf.copy(p, rec, REHASH).path.read_bytes()
                right += used == good
                wrong += used != good
            except ToolkitError:
                refused += 1
            try:  # integrity off: the per-constant read of a shrinking file is an error, not a signal
                read_constant_bytes(p, tail)
                unchecked += 1
            except ToolkitError:
                unchecked += 1
    finally:
        stop(pid)
    print(json.dumps(dict(cases=right + wrong + refused, wrong=wrong, refused=refused, unchecked=unchecked)))
    """,
        tmp_path,
    )
    assert got["cases"] >= 300 and got["wrong"] == 0 and got["unchecked"] == 300


def test_a_shrink_while_a_source_hashes_a_sparse_file(tmp_path):
    """open_program's readers (MappedFile) on a sparse .ptd-like file cut short while read: a clean
    error, or a record that describes exactly the bytes the parsers then read."""
    got = run_child(
        """
    from toolkit.sources.binary import MappedFile
    p = Path(sys.argv[1]) / "weights.ptd"
    size = 32 << 20
    def make():
        with open(p, "wb") as f:
            f.truncate(size); f.seek(size // 2); f.write(b"data" * 1024)
    make()
    flip = [0]
    def shrink_regrow():
        flip[0] ^= 1
        os.truncate(p, 4096 if flip[0] else size)
    pid = writer(shrink_regrow)
    ok, wrong, refused = 0, 0, 0
    try:
        for i in range(300):
            try:
                f = MappedFile(p, "weights.ptd", VerifiedFiles())
            except ToolkitError:
                refused += 1
                continue
            seen = hashlib.sha256(f.bytes.data).hexdigest()  # every page read, as a parser could
            wrong += seen != f.record().sha256 or len(f.bytes) != f.record().bytes
            ok += 1
            f.close()
    finally:
        stop(pid)
    print(json.dumps(dict(cases=ok + wrong + refused, wrong=wrong, refused=refused)))
    """,
        tmp_path,
    )
    assert got["cases"] >= 300 and got["wrong"] == 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_whole_loads_under_a_swapper_and_after_a_tamper_by_mapping(built_sample, tmp_path, device):
    """Real loads: each either refused by the integrity check or loaded and right (uploads hashed
    in staging slots; after the tamper by mapping, also through the sealed copy a load kept)."""
    clone(built_sample(SAMPLE, device), tmp_path / "p")
    got = run_child(
        """
    from toolkit.engine.session import load_program
    root = Path(sys.argv[1]) / "p"
    blob = root / "methods/decode/weights.blob"
    good = blob.read_bytes()
    from toolkit import open_program
    c = open_program(root).method("decode").constants[0]  # float32: flip an exponent bit of one value
    at = c.offset + c.nbytes // 8 * 4 + 3
    bad = bytearray(good); bad[at] ^= 0x40; bad = bytes(bad)
    (root / "bad.bin").write_bytes(bad); (root / "good.bin").write_bytes(good)
    n = [0]
    def swap():
        n[0] += 1
        os.link(root / ("bad.bin" if n[0] % 2 else "good.bin"), root / "tmp.bin"); os.replace(root / "tmp.bin", blob)
    def verdict(s):
        frame = s.verify()
        return bool(frame["ok"].all())
    pid = writer(swap)
    right, wrong, refused = 0, 0, 0
    try:
        for i in range(8):
            from toolkit.integrity import verified_files
            verified_files().clear()
            s = load_program(root, "fingerprint")
            if s.status != "loaded":
                refused += 1
            elif verdict(s):
                right += 1
            else:
                wrong += 1
            s.close()
    finally:
        stop(pid)
    blob.unlink(); blob.write_bytes(good)  # a file of its own (not a link to good.bin)
    fd = os.open(blob, os.O_RDWR); mm = mmap.mmap(fd, 0)
    mm[at] = mm[at]  # the page is dirty before the load verifies the file
    from toolkit.core.options import LoadOptions
    copied = LoadOptions(integrity_staging=False)  # uploads through the sealed copy, kept in this process
    for options in (copied, LoadOptions()):  # the default (verified staging) keeps nothing
        s = load_program(root, "fingerprint", options=options)
        assert s.status == "loaded" and verdict(s)
        s.close()
    st = os.stat(blob)
    mm[at] ^= 0x40  # the tamper: no timestamp changes
    s = load_program(root, "fingerprint", options=copied)
    status = str(s.status)
    tampered_right = s.status == "loaded" and verdict(s)
    now = os.stat(blob)
    invisible = (st.st_mtime_ns, st.st_ctime_ns) == (now.st_mtime_ns, now.st_ctime_ns)
    tampered = dict(status=status, right=tampered_right, invisible=invisible)
    s.close()
    s = load_program(root, "fingerprint")  # the default, finding the complete verified copy: reads from it
    tampered["kept_copy_right"] = s.status == "loaded" and verdict(s)
    s.close()
    verified_files().clear()  # no copy: staged, the piece is hashed again, and refused
    s = load_program(root, "fingerprint")
    tampered["staged"] = [str(s.status), type(s.exception).__name__, str(getattr(s.exception, "path", ""))]
    s.close()
    s = load_program(root, "fingerprint", check_integrity=False)  # the control: the tampered file runs wrong
    tampered["unchecked_right"] = s.status == "loaded" and verdict(s)
    s.close()
    print(json.dumps(dict(cases=right + wrong + refused, wrong=wrong, refused=refused, tampered=tampered)))
    """,
        tmp_path,
        timeout=300,
    )
    assert got["cases"] == 8 and got["wrong"] == 0
    assert got["tampered"]["invisible"], "the tamper changed a timestamp: the attack was not reproduced"
    assert got["tampered"]["right"], got  # a load through the kept copy used the bytes it verified
    # verified staging keeps nothing: where no load kept a complete copy, the next load hashes the piece
    # again and refuses it (never wrong); where one did, the default load reads that copy's verified bytes
    assert got["tampered"]["kept_copy_right"], got
    assert got["tampered"]["staged"] == ["failed", "IntegrityError", str(tmp_path / "p/methods/decode/weights.blob")], (
        got
    )
    assert not got["tampered"]["unchecked_right"], "the tamper does not change the outputs: the test proves nothing"
