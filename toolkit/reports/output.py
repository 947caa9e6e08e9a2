"""Output files: checked before any work, written whole or not at all, never through a link unasked.

A command that writes a report checks its path first (:func:`check_output`), so a bad path is
refused before a long load; the file is then written into a temporary file beside it and
renamed over it (:func:`write_text_atomically`), so a failed write never leaves half a report.

Links: a symbolic link at the output path itself is refused unless the caller asks to write its
target (``follow_links=True``, ``--follow-links``), because a link planted in a shared folder
(even a dangling one) would otherwise make the toolkit create or replace a file the user never
named.  Links in the folders above the file are followed, as for any path.  Without
``follow_links`` the rename replaces the name given, never what a link planted there later
points to; the temporary file is created with ``O_EXCL | O_NOFOLLOW`` under a random name.

Modes: a file replaced keeps its permission bits; a new file gets ``0o666`` less the umask (and
the folder's default ACL), as :func:`open` gives it, since the kernel applies both at creation.

Every failure, while checking or writing (a name too long, a folder without permission, a
read-only file system, a full disk), is an :class:`~toolkit.core.errors.OutputError` naming the
path and the OS error, which the CLI reports in one line with exit code 2.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import NamedTuple

from toolkit.core.errors import OutputError


class Switches(NamedTuple):
    """How the caller says "replace an existing file" and "write through a link", for the messages."""

    overwrite: str
    follow_links: str


PYTHON_SWITCHES = Switches("overwrite=True", "follow_links=True")
CLI_SWITCHES = Switches("--force", "--follow-links")

# The longest file name most Linux file systems take, in bytes; a folder's own limit is asked too.
NAME_MAX = 255
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
# Errors of os.link that mean "this file system has no hard links", not "the name is taken".
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS, errno.EXDEV}


def _os_error(path: "str | os.PathLike[str]", e: OSError) -> OutputError:
    return OutputError(f"cannot be written: {e.strerror or e}", path=path)


def _inspect(
    path: "str | os.PathLike[str]", overwrite: bool, follow_links: bool, switches: Switches
) -> tuple[Path, "os.stat_result | None"]:
    """The file to write (absolute; a link's target only with ``follow_links``) and the status of
    the file there (None: none), once it may be written; else an :class:`OutputError`."""
    given = os.fspath(path)
    if not given:
        raise OutputError("an empty path: give a file path", path="''")
    try:
        st: os.stat_result | None = os.lstat(given)
    except FileNotFoundError:
        st = None
    except OSError as e:  # ENAMETOOLONG, EACCES on a folder above, ENOTDIR, ELOOP
        raise _os_error(path, e) from None
    target = Path(given).absolute()  # not normalised: "link/.." means what the kernel says
    if st is not None and stat.S_ISLNK(st.st_mode):
        if not follow_links:
            raise OutputError(f"is a symbolic link; pass {switches.follow_links} to write its target", path=path)
        try:
            st = os.stat(given)
        except FileNotFoundError:  # a dangling link: its target is created
            st = None
        except OSError as e:
            raise _os_error(path, e) from None
        target = Path(os.path.realpath(given))
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise OutputError("is not a regular file (a folder, device, FIFO or socket): give a file path", path=path)
        if not overwrite:
            raise OutputError(f"exists already; pass {switches.overwrite} to overwrite it", path=path)
    folder = target.parent
    try:
        folder_st = os.stat(folder)
    except FileNotFoundError:
        raise OutputError(f"folder {str(folder)!r} does not exist", path=path) from None
    except OSError as e:
        raise _os_error(path, e) from None
    if not stat.S_ISDIR(folder_st.st_mode):
        raise OutputError(f"{str(folder)!r} is not a folder", path=path)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"folder {str(folder)!r} is not writable (read-only or immutable)", path=path)
    return target, st


def check_output(
    path: "str | os.PathLike[str]",
    *,
    overwrite: bool = True,
    follow_links: bool = False,
    switches: Switches = PYTHON_SWITCHES,
) -> Path:
    """The absolute path of the file ``path`` names, once it can be written: a regular file (only
    with ``overwrite``) or nothing, in a folder this process may write; a symbolic link at ``path``
    only with ``follow_links`` (then its target is returned).  Else an
    :class:`~toolkit.core.errors.OutputError` naming ``path``; ``switches`` name the options in it."""
    return _inspect(path, overwrite, follow_links, switches)[0]


def _name_max(folder: Path) -> int:
    try:
        return min(NAME_MAX, os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX


def _temporary_name(target: Path, name_max: int) -> str:
    """A random hidden name beside ``target`` that fits in ``name_max`` bytes (``target``'s own name
    may already take all of them)."""
    token = secrets.token_hex(8)
    stem = target.name
    budget = name_max - len(f"..{token}.tmp")
    while len(os.fsencode(stem)) > budget:
        stem = stem[:-1]
    return str(target.parent / f".{stem}.{token}.tmp")


def _create_temporary(target: Path) -> tuple[int, str]:
    """A new file beside ``target``, open for writing: never an existing file or link (O_EXCL,
    O_NOFOLLOW), mode 0o666 less the umask as the kernel applies it."""
    name_max = _name_max(target.parent)
    for _ in range(100):
        name = _temporary_name(target, name_max)
        try:
            return os.open(name, _OPEN_FLAGS, 0o666), name
        except FileExistsError:  # a clash with a random name: someone else's file, left alone
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(target.parent))


def _place_new(tmp: str, target: Path, path: "str | os.PathLike[str]", switches: Switches) -> None:
    """Give ``tmp`` the name ``target`` only if that name is free (a file or link that appeared since
    the check is kept): a hard link, which fails on an existing name, then the temporary name removed."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise OutputError(
            f"exists already (it appeared while this ran); pass {switches.overwrite} to overwrite it", path=path
        ) from None
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        # no hard links here (FAT, some network file systems): the check just before is the guard
        if os.path.lexists(target):
            raise OutputError(f"exists already; pass {switches.overwrite} to overwrite it", path=path) from None
        os.replace(tmp, target)
        return
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def write_bytes_atomically(
    path: "str | os.PathLike[str]",
    data: bytes,
    *,
    overwrite: bool = True,
    follow_links: bool = False,
    switches: Switches = PYTHON_SWITCHES,
) -> Path:
    """Write ``data`` to ``path`` (checked as :func:`check_output` says): into a temporary file in the
    same folder, then renamed over it, so a failed write (disk full, read-only folder) leaves the
    old file or none, never half a file; a file replaced keeps its permission bits, a new one gets
    0o666 less the umask.  Returns the absolute path written; a failure is an
    :class:`~toolkit.core.errors.OutputError`."""
    target, st = _inspect(path, overwrite, follow_links, switches)
    tmp = None
    try:
        fd, tmp = _create_temporary(target)
        try:
            if st is not None:  # before any byte is written, so the content is never more readable than the old file
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, target)
        else:
            _place_new(tmp, target, path, switches)
        tmp = None
    except BaseException as e:  # an interrupt too: no temporary file is left behind
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError):
            raise _os_error(path, e) from None
        raise
    return target


def write_text_atomically(
    path: "str | os.PathLike[str]",
    text: str,
    *,
    overwrite: bool = True,
    follow_links: bool = False,
    switches: Switches = PYTHON_SWITCHES,
) -> Path:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` as :func:`write_bytes_atomically` does."""
    return write_bytes_atomically(
        path, text.encode("utf-8"), overwrite=overwrite, follow_links=follow_links, switches=switches
    )
