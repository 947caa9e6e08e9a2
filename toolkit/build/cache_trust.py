"""When a built program in the build cache may be opened, and the record that says this toolkit built it.

A cached build is native code a load runs, and its folder name is a hash of public sources, so anyone
able to write the cache could plant one.  A cache entry is trusted only when this user owns the cache
folders, the entry and everything in it, nobody else can write any of them (a sticky bit is not
enough: it still lets others create entries), and the entry's record, an HMAC-SHA256 of its name and
its manifest (which holds every file's size and digests) under a per-user secret key kept 0600 in the
``programs/`` folder, matches.  Folders made here are 0700 whatever the umask.  No torch: the
native-code notice asks :func:`built_by_this_process` before every full load.
"""

from __future__ import annotations

import hmac
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

KEY_FILE = ".constshare-key"  # the per-user secret, in the programs folder (no sample name starts with a dot)
RECORD_SUFFIX = ".record"  # ``<entry>.record`` beside the entry: outside it, so copying an entry copies no record
MANIFEST = "manifest.json"
KEY_BYTES = 32
MAX_ENTRY_ITEMS = 10_000  # files and folders walked in one entry: a sample has a few dozen
MAX_MANIFEST_BYTES = 64 << 20
_RECORD_DOMAIN = b"constshare build cache entry v1\0"

Lstat = Callable[[Path], os.stat_result]

_BUILT_HERE: set[tuple[str, int, int]] = set()  # (real path, device, inode) of program folders this process built


class Untrusted(Exception):
    """Why a cache folder, key or entry must not be used: one line naming the check that failed."""


def shown(path: Path | str) -> str:
    """A path quoted for one line of text: a name holding a newline or ESC cannot forge output."""
    return repr(str(path))


def record_path(entry: Path) -> Path:
    return entry.with_name(entry.name + RECORD_SUFFIX)


def make_private_folders(folder: Path) -> None:
    """``folder`` and every missing folder above it, each created 0700 whatever the umask (existing ones are
    left as they are: their modes are checked, not changed)."""
    missing = []
    p = Path(folder)
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by a concurrent build: checked like any existing folder
        os.chmod(p, 0o700)  # mkdir's mode is narrowed by the umask, never widened: set it exactly


def _owned(path: Path, st: os.stat_result, uid: int, what: str, *, private: bool = False) -> None:
    if st.st_uid != uid:
        raise Untrusted(f"{what} {shown(path)} is owned by uid {st.st_uid}, not by this user (uid {uid})")
    mode = stat.S_IMODE(st.st_mode)
    if mode & (0o077 if private else 0o022):
        can = "read or write" if private else "write"
        raise Untrusted(f"{what} {shown(path)} has mode {mode:#o}: group or others can {can} it")


def check_folders(folders: Sequence[Path], uid: int | None = None, lstat: Lstat | None = None) -> None:
    """Each of ``folders`` (the cache folder, its ``programs/``) is a folder this user owns and nobody
    else can write; a folder given as a symbolic link is judged by its target."""
    uid = os.geteuid() if uid is None else uid
    lstat = lstat or os.lstat
    for folder in folders:
        what = "the build cache folder"
        try:
            st = lstat(Path(folder))
            if stat.S_ISLNK(st.st_mode):
                st = lstat(Path(os.path.realpath(folder)))
        except OSError as e:
            raise Untrusted(f"{what} {shown(folder)} cannot be read ({e.strerror})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise Untrusted(f"{what} {shown(folder)} is not a folder")
        _owned(Path(folder), st, uid, what)


def _read_private(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, never through a symbolic link, at most ``limit``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{shown(path)} is not a regular file")
        if st.st_size > limit:
            raise Untrusted(f"{shown(path)} is larger than {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def read_key(programs: Path, uid: int | None = None, lstat: Lstat | None = None) -> bytes:
    """The per-user secret of the cache folder ``programs``: a 32-byte regular file, this user's, mode 0600 or
    narrower."""
    uid = os.geteuid() if uid is None else uid
    path = Path(programs) / KEY_FILE
    try:
        st = (lstat or os.lstat)(path)
    except FileNotFoundError:
        raise Untrusted(f"the cache has no key file {shown(path)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted(f"the cache's key file {shown(path)} is not a regular file")
    _owned(path, st, uid, "the cache's key file", private=True)
    try:
        key = _read_private(path, KEY_BYTES)
    except OSError as e:
        raise Untrusted(f"the cache's key file {shown(path)} cannot be read ({e.strerror})") from None
    if len(key) != KEY_BYTES:
        raise Untrusted(f"the cache's key file {shown(path)} holds {len(key)} bytes, not {KEY_BYTES}")
    return key


def _write_private(folder: Path, data: bytes, prefix: str) -> str:
    """A new file in ``folder`` holding ``data``, mode 0600 whatever the umask; its path."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=folder)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def ensure_key(programs: Path, uid: int | None = None, lstat: Lstat | None = None) -> str | None:
    """Make the cache's key on first use, and replace one that cannot be trusted (every entry recorded
    under it is then rebuilt once); what was wrong with a replaced key, else None."""
    path = Path(programs) / KEY_FILE
    try:
        read_key(programs, uid, lstat)
        return None
    except Untrusted as e:
        why = None if not os.path.lexists(path) else str(e)
    if why is not None:
        _remove(path)
    tmp = _write_private(Path(programs), secrets.token_bytes(KEY_BYTES), ".key-")
    try:
        os.link(tmp, path)  # appears whole or not at all, and never over a key made meanwhile
    except FileExistsError:
        pass  # a concurrent first use made one: every process uses that one
    finally:
        os.unlink(tmp)
    return why


def entry_record(key: bytes, name: str, manifest: bytes) -> str:
    """What ``<entry>.record`` holds: the HMAC-SHA256 of the entry's name and manifest under the user's key."""
    message = _RECORD_DOMAIN + name.encode("utf-8", "surrogateescape") + b"\0" + manifest
    return hmac.new(key, message, "sha256").hexdigest()


def _walk(entry: Path, uid: int, lstat: Lstat) -> None:
    """Everything inside ``entry`` is a folder or a regular file (no link, device or FIFO), this user's,
    that nobody else can write."""
    seen = 0
    todo = [entry]
    while todo:
        folder = todo.pop()
        try:
            names = sorted(os.listdir(folder))
        except OSError as e:
            raise Untrusted(f"the cache entry's folder {shown(folder)} cannot be listed ({e.strerror})") from None
        for name in names:
            seen += 1
            if seen > MAX_ENTRY_ITEMS:
                raise Untrusted(f"the cache entry {shown(entry)} holds more than {MAX_ENTRY_ITEMS} files")
            path = folder / name
            try:
                st = lstat(path)
            except OSError as e:
                raise Untrusted(f"the cache entry's file {shown(path)} cannot be read ({e.strerror})") from None
            if stat.S_ISLNK(st.st_mode):
                raise Untrusted(f"the cache entry holds a symbolic link {shown(path)}")
            if stat.S_ISDIR(st.st_mode):
                todo.append(path)
            elif not stat.S_ISREG(st.st_mode):
                raise Untrusted(f"the cache entry holds {shown(path)}, neither a file nor a folder")
            _owned(path, st, uid, "the cache entry's " + ("folder" if stat.S_ISDIR(st.st_mode) else "file"))


def check_entry(entry: Path, key: bytes, uid: int | None = None, lstat: Lstat | None = None) -> None:
    """The cache entry ``entry`` is a folder this user owns, nobody else can write it or anything in it, and
    its record (beside it) is the HMAC of its name and manifest under ``key``."""
    uid = os.geteuid() if uid is None else uid
    lstat = lstat or os.lstat
    entry = Path(entry)
    try:
        st = lstat(entry)
    except OSError as e:
        raise Untrusted(f"the cache entry {shown(entry)} cannot be read ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise Untrusted(f"the cache entry {shown(entry)} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"the cache entry {shown(entry)} is not a folder")
    _owned(entry, st, uid, "the cache entry")
    _walk(entry, uid, lstat)
    if not os.path.lexists(entry / MANIFEST):
        raise Untrusted(f"the cache entry {shown(entry)} has no {MANIFEST}")
    record = record_path(entry)
    try:
        rst = lstat(record)
    except FileNotFoundError:
        raise Untrusted(f"the cache entry {shown(entry)} has no record: this toolkit did not build it here") from None
    if not stat.S_ISREG(rst.st_mode):
        raise Untrusted(f"the cache entry's record {shown(record)} is not a regular file")
    _owned(record, rst, uid, "the cache entry's record")
    try:
        manifest = _read_private(entry / MANIFEST, MAX_MANIFEST_BYTES)
        said = _read_private(record, 2 * 64).strip()
    except OSError as e:
        raise Untrusted(f"the cache entry {shown(entry)} cannot be read ({e.strerror})") from None
    if not hmac.compare_digest(said, entry_record(key, entry.name, manifest).encode()):
        raise Untrusted(
            f"the record of the cache entry {shown(entry)} does not match its manifest: changed or forged, "
            "or made with another user's key"
        )


def cache_distrust(
    entry: Path, folders: Sequence[Path], *, uid: int | None = None, lstat: Lstat | None = None
) -> str | None:
    """Why the cache entry ``entry`` must not be opened (one line naming the check that failed), or None when
    it may be: ``folders`` (the cache folder and its ``programs/``, which holds ``entry``) pass
    :func:`check_folders`, the key :func:`read_key`, and the entry :func:`check_entry`.  Opens nothing
    but the key, the manifest and the record."""
    try:
        check_folders(folders, uid, lstat)
        check_entry(entry, read_key(Path(entry).parent, uid, lstat), uid, lstat)
    except Untrusted as e:
        return str(e)
    return None


def seal_entry(entry: Path) -> None:
    """After a build into ``entry``: its folders 0700 and its files writable by no one else (whatever the
    umask the builder ran under), then its record, written 0600 beside it."""
    entry = Path(entry)
    for folder, _folders, files in os.walk(entry):
        os.chmod(folder, 0o700)
        for name in files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
    key = read_key(entry.parent)
    manifest = _read_private(entry / MANIFEST, MAX_MANIFEST_BYTES)
    tmp = _write_private(entry.parent, (entry_record(key, entry.name, manifest) + "\n").encode(), ".record-")
    os.replace(tmp, record_path(entry))


def _remove(path: Path) -> None:
    """Remove a file, link or folder tree at ``path`` (a link is removed, never followed)."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def remove_entry(entry: Path) -> None:
    """Remove an untrusted cache entry and its record."""
    _remove(Path(entry))
    _remove(record_path(Path(entry)))


def _identity(root: Path) -> tuple[str, int, int] | None:
    try:
        st = os.stat(root)
    except OSError:
        return None
    return (os.path.realpath(root), st.st_dev, st.st_ino)


def note_built_here(root: Path) -> None:
    """``root`` holds a program this process has just built: its load needs no native-code notice."""
    ident = _identity(Path(root))
    if ident is not None:
        _BUILT_HERE.add(ident)


def built_by_this_process(root: Path | str | None) -> bool:
    """Whether ``root`` is a program folder this process built (the same folder, not one put in its place)."""
    return root is not None and _identity(Path(root)) in _BUILT_HERE
