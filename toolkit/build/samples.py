"""Sample programs: small modules in ``sample_programs/``, built on demand into a cache.

Each sample module defines ``DESCRIPTION``, ``methods()`` (ordered ``name -> (module,
example_args)``) and ``EXPECTED`` (policy name -> :class:`Expected`).  The cache key is
a digest of the sample's source, the builder's source and the torch version, so an edit
to either rebuilds; nothing is cached implicitly.  A cached build is opened only when
:mod:`toolkit.build.cache_trust` trusts it; otherwise it is rebuilt, and stderr says why.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import pkgutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from toolkit.build import cache_trust
from toolkit.core.errors import ToolkitError
from toolkit.core.model import Program
from toolkit.core.options import cache_folder
from toolkit.core.policies import POLICIES

DEFAULT_SAMPLE = "total_collision"


@dataclass(frozen=True)
class Expected:
    """The outcome a sample program must give under one policy."""

    loaded: bool = True
    wrong: frozenset[str] = frozenset()  # methods that run and disagree with the eager reference
    not_runnable: frozenset[str] = frozenset()  # methods blocked by the out-of-bounds guard
    min_shared: int = 0  # at least this many "shared" decisions
    declined: int | None = None  # exactly this many "declined" decisions, when set
    sequence_wrong: frozenset[str] = frozenset()  # sequences (sequences()) whose steps diverge from eager

    @classmethod
    def of(
        cls,
        loaded: bool = True,
        wrong=(),
        not_runnable=(),
        min_shared: int = 0,
        declined: int | None = None,
        sequence_wrong=(),
    ):
        return cls(loaded, frozenset(wrong), frozenset(not_runnable), min_shared, declined, frozenset(sequence_wrong))


def sample_names() -> list[str]:
    import sample_programs

    return sorted(m.name for m in pkgutil.iter_modules(sample_programs.__path__) if not m.name.startswith("_"))


def sample_module(name: str):
    if name not in sample_names():
        raise ToolkitError(f"unknown sample program {name!r}; available: {', '.join(sample_names())}")
    mod = importlib.import_module(f"sample_programs.{name}")
    missing = [a for a in ("DESCRIPTION", "methods", "EXPECTED") if not hasattr(mod, a)]
    if missing:
        raise ToolkitError(f"sample program {name!r} lacks {missing}")
    unknown = set(mod.EXPECTED) - set(POLICIES)
    if unknown or set(mod.EXPECTED) != set(POLICIES):
        raise ToolkitError(f"sample program {name!r}: EXPECTED must cover exactly {POLICIES}")
    return mod


def cache_root() -> Path:
    """Where built samples are cached: the build cache's ``programs/`` (:func:`~toolkit.core.options.cache_folder`)."""
    return cache_folder()


def _cache_key(mod, device: str) -> str:
    """What a built sample depends on: its own source and the shared sample code, the builder and
    what writes the program (manifest, file records, constant metadata), torch, the device."""
    from toolkit.build import builder
    from toolkit.core import model
    from toolkit.integrity import reading, records
    from toolkit.sources import directory

    h = hashlib.sha256()
    h.update(inspect.getsource(mod).encode())
    common = Path(inspect.getfile(mod)).with_name("_common.py")
    if common.is_file():
        h.update(common.read_bytes())
    for dep in (builder, directory, records, reading, model):
        h.update(inspect.getsource(dep).encode())
    h.update(torch.__version__.encode())
    h.update(device.encode())
    return h.hexdigest()[:12]


def cache_folders(cache_dir: str | Path | None = None) -> list[Path]:
    """The folders a cached build's trust rests on, the one holding the builds last: the build cache folder
    and its ``programs/`` (:func:`cache_root`), or ``cache_dir`` alone when one is given."""
    if cache_dir is not None:
        return [Path(cache_dir)]
    programs = cache_root()
    return [programs.parent, programs]


def private_cache_root(cache_dir: str | Path | None = None) -> Path:
    """The folder builds are cached in (:func:`cache_folders`), made 0700 with every missing folder above it."""
    folders = cache_folders(cache_dir)
    cache_trust.make_private_folders(folders[-1])
    return folders[-1]


def _say(text: str) -> None:
    print(f"constshare: {text}", file=sys.stderr)


_PRIVATE_BUILDS: dict[tuple[str, str], Path] = {}  # (cache folder, entry name) -> a build of this process outside it


def _build_privately(build, programs: Path, entry: str, rebuild: bool):
    """Build into a fresh 0700 folder outside the cache (once per process), removed when the process exits."""
    from toolkit.sources import open_program

    done = _PRIVATE_BUILDS.get((str(programs), entry))
    if done is not None and not rebuild and cache_trust.built_by_this_process(done):
        return open_program(done)
    import atexit
    import shutil

    folder = tempfile.mkdtemp(prefix="constshare-build-")
    atexit.register(shutil.rmtree, folder, True)
    out = Path(folder) / entry
    program = build(out)
    cache_trust.note_built_here(out)
    _PRIVATE_BUILDS[(str(programs), entry)] = out
    return program


def build_sample(
    name: str,
    device: str = "cpu",
    *,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    rebuild: bool = False,
    on_method=None,
) -> Program:
    """The sample built for ``device``, from the cache when an up-to-date build is there and
    :func:`toolkit.build.cache_trust.cache_distrust` trusts it; else built (into the cache when the
    cache's folders can be trusted, else into a private temporary folder), with one line on stderr
    saying which check failed.

    ``on_method(name, index, count)`` is called before each method is compiled (for progress UIs).
    """
    from toolkit.build.builder import build_program
    from toolkit.sources import open_program

    mod = sample_module(name)
    kind = torch.device(device).type
    entry = f"{name}-{kind}-{_cache_key(mod, kind)}"
    sequences = mod.sequences() if callable(getattr(mod, "sequences", None)) else None

    def build(out: Path) -> Program:
        return build_program(
            mod.methods(),
            out,
            device=device,
            name=name,
            description=mod.DESCRIPTION.strip(),
            progress=progress,
            overwrite=True,
            on_method=on_method,
            sequences=sequences,
        )

    folders = cache_folders(cache_dir)
    programs = folders[-1]
    try:
        private_cache_root(cache_dir)
        cache_trust.check_folders(folders)
        replaced = cache_trust.ensure_key(programs)
    except (cache_trust.Untrusted, OSError) as e:
        why = e if isinstance(e, cache_trust.Untrusted) else f"it cannot be prepared ({e})"
        _say(f"not using the build cache: {why}; building {name!r} in a private temporary folder")
        return _build_privately(build, programs, entry, rebuild)
    if replaced:
        _say(f"{replaced}: made a new key, so every cached build is rebuilt once")
    out = programs / entry
    if os.path.lexists(out):
        why = cache_trust.cache_distrust(out, folders)
        if why is None and not rebuild:
            try:
                return open_program(out)
            except ToolkitError:
                pass  # a damaged cache entry is rebuilt below
        elif why is not None:
            if not rebuild:
                _say(f"not opening the cached build of {name!r}: {why}; rebuilding it")
            try:
                cache_trust.remove_entry(out)  # the builder replaces a folder of ours, not a planted link or file
            except OSError as e:
                _say(f"cannot remove {cache_trust.shown(out)} ({e.strerror}); building {name!r} elsewhere")
                return _build_privately(build, programs, entry, rebuild)
    program = build(out)
    cache_trust.note_built_here(out)
    try:
        cache_trust.seal_entry(out)
    except (cache_trust.Untrusted, OSError) as e:
        _say(f"cannot record the build of {name!r} in the cache ({e}): it is rebuilt next time")
    return program
