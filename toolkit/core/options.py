"""How a load moves and checks bytes (:class:`LoadOptions`), and :func:`options_from_environment`,
the one place the toolkit reads its environment variables (``load_program`` calls it when given no options).

Each option is described once, in :data:`OPTIONS`: its field, its environment variable, how the
variable's text is read, its default and one line of help.  The environment reader, its docstring
and the user guide's table (:func:`options_markdown`, docs/user-guide.md) are all made from that table.
"""

from __future__ import annotations

import os
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from toolkit.core.vocab import FirstLoad, Integrity, UploadMode, parse

# each integrity path as its four boolean aliases spell it
_FLAGS_OF = {
    Integrity.STAGED: (True, False, True, True),
    Integrity.COPY: (True, False, True, False),
    Integrity.IN_PLACE: (True, False, False, True),
    Integrity.FILES_FIRST: (True, True, True, True),
    Integrity.OFF: (False, False, True, True),
}


def integrity_from_flags(
    check_integrity: bool = True, hash_all: bool = False, integrity_copy: bool = True, integrity_staging: bool = True
) -> Integrity:
    """The integrity path the four boolean aliases select; the first that applies wins: no check is
    ``off``, ``hash_all`` is ``files-first``, no copy is ``in-place``, no staging is ``copy``."""
    if not check_integrity:
        return Integrity.OFF
    if hash_all:
        return Integrity.FILES_FIRST
    if not integrity_copy:
        return Integrity.IN_PLACE
    return Integrity.STAGED if integrity_staging else Integrity.COPY


@dataclass(frozen=True)
class LoadOptions:
    """How a load moves and checks bytes; ``LoadOptions()`` is the default load.  Each field is
    described in :data:`OPTIONS` (the table of options in docs/user-guide.md).

    ``check_integrity``, ``hash_all``, ``integrity_copy`` and ``integrity_staging`` are accepted as
    keyword arguments (also by :func:`dataclasses.replace`): booleans that set ``integrity``
    (:func:`integrity_from_flags`), each given one replacing its part of the path ``integrity`` names.
    Read ``integrity``: as attributes the aliases only hold None.
    """

    upload: UploadMode = UploadMode.MAPPED
    first_load: FirstLoad = FirstLoad.LOCKED
    host_lock_bytes: int | None = None
    integrity: Integrity = Integrity.STAGED
    rehash: bool = False
    hash_threads: int | None = None
    staging_chunk_bytes: int = 16 << 20
    device_digest: bool | None = None
    cache_dir: Path | None = None
    check_integrity: InitVar[bool | None] = None
    hash_all: InitVar[bool | None] = None
    integrity_copy: InitVar[bool | None] = None
    integrity_staging: InitVar[bool | None] = None

    def __post_init__(
        self,
        check_integrity: bool | None,
        hash_all: bool | None,
        integrity_copy: bool | None,
        integrity_staging: bool | None,
    ) -> None:
        for name, kind in (("upload", UploadMode), ("first_load", FirstLoad), ("integrity", Integrity)):
            object.__setattr__(self, name, parse(kind, getattr(self, name), what=f"LoadOptions.{name}"))
        given = (check_integrity, hash_all, integrity_copy, integrity_staging)
        if any(v is not None for v in given):
            flags = [bool(v) if v is not None else was for v, was in zip(given, _FLAGS_OF[self.integrity])]
            object.__setattr__(self, "integrity", integrity_from_flags(*flags))
        if self.hash_threads is not None and self.hash_threads < 1:
            raise ValueError(f"LoadOptions.hash_threads={self.hash_threads!r}: expected a positive integer or None")
        if self.staging_chunk_bytes < 1:
            raise ValueError(
                f"LoadOptions.staging_chunk_bytes={self.staging_chunk_bytes!r}: expected a positive integer"
            )


DEFAULT_CACHE_DIR = Path.home() / ".cache" / "constshare"


def cache_folder(options: LoadOptions | None = None, part: str = "programs") -> Path:
    """The one build cache (``options.cache_dir``, default: ``CONSTSHARE_CACHE``, else
    ``~/.cache/constshare``): built samples in its ``programs/``.  A ``.so`` extracted from a ``.pte`` or ``.pt2``
    is never written there: it lives in a sealed in-memory file (:func:`~toolkit.integrity.copy_region`)."""
    options = options_from_environment() if options is None else options
    return Path(options.cache_dir or DEFAULT_CACHE_DIR) / part


@dataclass(frozen=True)
class Option:
    """One option: the :class:`LoadOptions` keyword it sets, its environment variable, how the
    variable's text is read (``read``) and what that text must be (``expected``, for errors), its
    default as a value of the variable or in words, and one line of help (markdown)."""

    field: str
    variable: str
    read: Callable[[str], Any]
    expected: str
    default: str
    help: str


_BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_FLAG_TEXTS = ", ".join(_BOOLEANS)


def _flag(text: str) -> bool:
    return _BOOLEANS[text.lower()]


def _choices(kind: type) -> str:
    return "one of " + ", ".join(kind)


OPTIONS: tuple[Option, ...] = (
    Option(
        "upload",
        "CONSTSHARE_UPLOAD",
        str.lower,
        _choices(UploadMode),
        "`mapped`",
        "which uploader CUDA uploads go through: `mapped` (pages locked in place, kept locked for reloads), "
        "`staged` (reusable pinned buffers, nothing locked) or `unstaged` (a fresh pinned buffer per constant)",
    ),
    Option(
        "first_load",
        "CONSTSHARE_FIRST_LOAD",
        str.lower,
        _choices(FirstLoad),
        "`locked`",
        "a blob's first load on the mapped path: `locked` (its pages locked as they are copied), `staged` "
        "(staged, then locked in the background), `hybrid` (both at once) or `pipelined` (the staging pipeline, "
        "unhashed, on every integrity path but `staged`)",
    ),
    Option(
        "host_lock_bytes",
        "CONSTSHARE_HOST_LOCK_GIB",
        lambda s: max(0, int(float(s) * (1 << 30))),
        "a number of GiB",
        "a quarter of RAM",
        "blob pages kept page-locked between loads (the variable in GiB); `0` locks nothing",
    ),
    Option(
        "integrity",
        "CONSTSHARE_INTEGRITY",
        str.lower,
        _choices(Integrity),
        "`staged`",
        "how files are checked against their records: `staged` (a blob's pieces hashed "
        "in the process's own staging slots as they are uploaded), `copy` (through the blob's sealed private "
        "copy), `in-place` (hashed in the file itself, no copy), `files-first` (every byte of every file before "
        "the first `.so` is opened) or `off`",
    ),
    Option(
        "rehash",
        "CONSTSHARE_REHASH",
        _flag,
        _FLAG_TEXTS,
        "`0`",
        "`1` hashes every file again, also those verified unchanged earlier in this process",
    ),
    Option(
        "hash_threads",
        "CONSTSHARE_HASH_THREADS",
        int,
        "a positive integer",
        "every core, at most 32",
        "threads hashing a file's pieces",
    ),
    Option(
        "staging_chunk_bytes",
        "CONSTSHARE_STAGING_CHUNK_MIB",
        lambda s: int(float(s) * (1 << 20)),
        "a number of MiB",
        "`16`",
        "size of each staging slot, two per hashing worker (the variable in MiB)",
    ),
    Option(
        "device_digest",
        "CONSTSHARE_DEVICE_DIGEST",
        lambda s: None if s.lower() == "auto" else _flag(s),
        "auto, " + _FLAG_TEXTS,
        "`auto`",
        "whether verified staging hashes BLAKE3 pieces on the device they landed on: `auto` (on an sm90 GPU "
        "always, its kernels precompiled; on another once Triton's are warm, a cold batch of 16 GiB or more "
        "warming them in the background), `1` or `0`",
    ),
    Option(
        "cache_dir",
        "CONSTSHARE_CACHE",
        Path,
        "a folder",
        "`~/.cache/constshare`",
        "the one build cache the CLI, the tests and the notebooks use: built samples in its `programs/` "
        "(`cache_folder()`); a `.so` extracted from a `.pte` or `.pt2` is never written to disk (a sealed "
        "in-memory file)",
    ),
)

# the boolean aliases of ``integrity`` (keywords of LoadOptions, and variables): each sets the part of the path it names
ALIASES: tuple[Option, ...] = (
    Option("check_integrity", "", _flag, _FLAG_TEXTS, "`True`", "`False`: `integrity=off`"),
    Option("hash_all", "CONSTSHARE_HASH_ALL", _flag, _FLAG_TEXTS, "`0`", "`1`: `integrity=files-first`"),
    Option("integrity_copy", "CONSTSHARE_INTEGRITY_COPY", _flag, _FLAG_TEXTS, "`1`", "`0`: `integrity=in-place`"),
    Option("integrity_staging", "CONSTSHARE_INTEGRITY_STAGING", _flag, _FLAG_TEXTS, "`1`", "`0`: `integrity=copy`"),
)


def options_from_environment(environ: Mapping[str, str] | None = None) -> LoadOptions:
    env = os.environ if environ is None else environ
    values = {}
    for opt in (*OPTIONS, *ALIASES):
        raw = env.get(opt.variable, "").strip() if opt.variable else ""
        try:
            if raw:
                value = opt.read(raw)
                LoadOptions(**{opt.field: value})  # checked as LoadOptions checks its field
                values[opt.field] = value
        except (ValueError, KeyError, OverflowError):
            raise ValueError(f"{opt.variable}={raw!r}: expected {opt.expected}") from None
    return LoadOptions(**values)


options_from_environment.__doc__ = (
    """The :class:`LoadOptions` that ``environ`` (default ``os.environ``) sets; unset or empty
    variables keep the defaults, a value that cannot be read raises ValueError naming its variable.

"""
    + "\n".join(f"    * ``{o.variable}`` (``{o.field}``, default {o.default}): {o.help};" for o in OPTIONS).rstrip(";")
    + ".\n\n    The boolean aliases of ``integrity``, each setting the part of the path it names: "
    + ", ".join(f"``{a.variable}`` ({a.help})" for a in ALIASES if a.variable)
    + ".\n    "
)


def options_markdown() -> str:
    """The user guide's table of options (docs/user-guide.md), made from :data:`OPTIONS` and :data:`ALIASES`."""
    rows = ["| `LoadOptions` field | environment variable | default | what it sets |", "| --- | --- | --- | --- |"]
    rows += [f"| `{o.field}` | `{o.variable}` | {o.default} | {o.help} |" for o in OPTIONS]
    aliases = "; ".join(f"`{a.field}` ({f'`{a.variable}`, ' if a.variable else ''}{a.help})" for a in ALIASES)
    return "\n".join(rows) + (
        "\n\nThe boolean aliases of `integrity` are accepted too, as `LoadOptions` keywords and variables, "
        f"each setting the part of the path it names (the first that applies wins, in this order): {aliases}.\n"
    )
