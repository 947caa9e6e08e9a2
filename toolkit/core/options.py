"""How a load moves and checks bytes (:class:`LoadOptions`), and :func:`options_from_environment`,
the one place the toolkit reads its environment variables (``load_program`` calls it when given no options)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from toolkit.core.vocab import FirstLoad, UploadMode, parse


@dataclass(frozen=True)
class LoadOptions:
    """How a load moves and checks bytes; ``LoadOptions()`` is the default load."""

    upload: UploadMode = UploadMode.MAPPED
    first_load: FirstLoad = FirstLoad.LOCKED
    host_lock_bytes: int | None = None  # blob pages kept page-locked between loads; None: a quarter of RAM
    check_integrity: bool = True  # every file checked against its size and sha256 before it is used
    rehash: bool = False  # hash every file again, also those verified unchanged earlier in this process
    hash_threads: int | None = None  # threads hashing a file's pieces; None: every core, at most 32
    # True: every byte of every file a load names verified before its first .so is opened (as before
    # issue 25); False: .so files so, a weights blob's pieces as they are read, before that use
    hash_all: bool = False
    # False: a weights blob's pieces hashed from the file itself and its constants uploaded from it,
    # no private copy: trusts that nothing writes or replaces the file between a piece's check and its upload
    integrity_copy: bool = True
    # True: a weights blob's per-constant uploads read each piece once into the process's own pinned staging
    # slots, hash it there and upload from there (toolkit.upload.stage_pieces; no private copy of the file);
    # False: through the sealed private copy (toolkit.integrity.VerifiedCopy), as before
    integrity_staging: bool = True
    # the staging pipeline's slot size (each worker has two): 4 MiB read at 45-55 GB/s on the H200 host, 16 MiB at
    # 34-36, and pinning 16 workers' slots took ~40 ms at 4 MiB, ~200 at 16 (benchmarks/staging_profile.py, 2026-12-02)
    staging_chunk_bytes: int = 4 << 20
    # verified staging's BLAKE3 pieces that land whole in one constant hashed on the device, where they landed
    # (toolkit.integrity.device_digest, Triton): True always, False never (the host hashes every piece), None (default)
    # per batch on CUDA, when the kernels are loaded in this process (device_digest.warm_up) or the batch hashes
    # at least device_digest.MIN_BYTES (16 GiB: a fresh process's first use costs ~0.55 s on the H200)
    device_digest: bool | None = None
    cache_dir: Path | None = None  # the build cache (default ~/.cache/constshare): see cache_folder()

    def __post_init__(self) -> None:
        for name, kind in (("upload", UploadMode), ("first_load", FirstLoad)):
            object.__setattr__(self, name, parse(kind, getattr(self, name), what=f"LoadOptions.{name}"))
        if self.hash_threads is not None and self.hash_threads < 1:
            raise ValueError(f"LoadOptions.hash_threads={self.hash_threads!r}: expected a positive integer or None")
        if self.staging_chunk_bytes < 1:
            raise ValueError(
                f"LoadOptions.staging_chunk_bytes={self.staging_chunk_bytes!r}: expected a positive integer"
            )


DEFAULT_CACHE_DIR = Path.home() / ".cache" / "constshare"


def cache_folder(options: LoadOptions | None = None, part: str = "programs") -> Path:
    """The one build cache (``options.cache_dir``, default: ``CONSTSHARE_CACHE``, else
    ``~/.cache/constshare``): built samples in its ``programs/``, extracted ``.so`` files in ``so/``."""
    options = options_from_environment() if options is None else options
    return Path(options.cache_dir or DEFAULT_CACHE_DIR) / part


_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_VARIABLES = {  # variable: (LoadOptions field, how its text is read, what it must be)
    "CONSTSHARE_UPLOAD": ("upload", str.lower, "one of " + ", ".join(UploadMode)),
    "CONSTSHARE_FIRST_LOAD": ("first_load", str.lower, "one of " + ", ".join(FirstLoad)),
    "CONSTSHARE_HOST_LOCK_GIB": ("host_lock_bytes", lambda s: max(0, int(float(s) * (1 << 30))), "a number of GiB"),
    "CONSTSHARE_REHASH": ("rehash", lambda s: _FLAGS[s.lower()], ", ".join(_FLAGS)),
    "CONSTSHARE_HASH_THREADS": ("hash_threads", int, "a positive integer"),
    "CONSTSHARE_HASH_ALL": ("hash_all", lambda s: _FLAGS[s.lower()], ", ".join(_FLAGS)),
    "CONSTSHARE_INTEGRITY_COPY": ("integrity_copy", lambda s: _FLAGS[s.lower()], ", ".join(_FLAGS)),
    "CONSTSHARE_INTEGRITY_STAGING": ("integrity_staging", lambda s: _FLAGS[s.lower()], ", ".join(_FLAGS)),
    "CONSTSHARE_STAGING_CHUNK_MIB": ("staging_chunk_bytes", lambda s: int(float(s) * (1 << 20)), "a number of MiB"),
    "CONSTSHARE_DEVICE_DIGEST": (
        "device_digest",
        lambda s: None if s.lower() == "auto" else _FLAGS[s.lower()],
        "auto, " + ", ".join(_FLAGS),
    ),
    "CONSTSHARE_CACHE": ("cache_dir", Path, "a folder"),
}


def options_from_environment(environ: Mapping[str, str] | None = None) -> LoadOptions:
    """The :class:`LoadOptions` that ``environ`` (default ``os.environ``) sets; unset or empty
    variables keep the defaults, a value that cannot be read raises ValueError naming its variable.

    * ``CONSTSHARE_UPLOAD``: ``mapped`` (default), ``staged`` or ``unstaged`` (``upload``);
    * ``CONSTSHARE_FIRST_LOAD``: ``locked`` (default), ``staged``, ``hybrid`` or ``pipelined`` (``first_load``);
    * ``CONSTSHARE_HOST_LOCK_GIB``: GiB of blob pages kept page-locked between loads, 0 locks
      nothing (``host_lock_bytes``; default a quarter of physical memory);
    * ``CONSTSHARE_REHASH``: ``1``/``true``/``yes`` hashes every file again (``rehash``);
    * ``CONSTSHARE_HASH_THREADS``: threads hashing a file's pieces (``hash_threads``);
    * ``CONSTSHARE_HASH_ALL``: ``1``/``true``/``yes`` verifies every byte before the first ``.so``
      is opened (``hash_all``);
    * ``CONSTSHARE_INTEGRITY_COPY``: ``0``/``false``/``no`` hashes a blob's pieces in the file and
      uploads from it, no private copy (``integrity_copy``);
    * ``CONSTSHARE_INTEGRITY_STAGING``: ``0``/``false``/``no`` uploads a blob's constants through the
      sealed private copy of its verified pieces (as before 2026-12-02) instead of hashing each piece
      in the process's own pinned staging slots and uploading from there (``integrity_staging``);
    * ``CONSTSHARE_STAGING_CHUNK_MIB``: MiB of each staging slot (``staging_chunk_bytes``, default 4);
    * ``CONSTSHARE_DEVICE_DIGEST``: ``auto`` (default), ``1``/``true``/``yes`` or ``0``/``false``/``no``:
      whether verified staging hashes BLAKE3 pieces on the device (``device_digest``);
    * ``CONSTSHARE_CACHE``: the build cache folder (``cache_dir``; :func:`cache_folder`).
    """
    env = os.environ if environ is None else environ
    values = {}
    for name, (field, read, expected) in _VARIABLES.items():
        raw = env.get(name, "").strip()
        try:
            if raw:  # checked as LoadOptions checks its field
                values[field] = getattr(LoadOptions(**{field: read(raw)}), field)
        except (ValueError, KeyError, OverflowError):
            raise ValueError(f"{name}={raw!r}: expected {expected}") from None
    return LoadOptions(**values)
