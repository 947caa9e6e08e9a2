"""Sample programs: small modules in ``sample_programs/``, built on demand into a cache.

Each sample module defines ``DESCRIPTION``, ``methods()`` (ordered ``name -> (module,
example_args)``) and ``EXPECTED`` (policy name -> :class:`Expected`).  The cache key is
a digest of the sample's source, the builder's source and the torch version, so an edit
to either rebuilds; nothing is cached implicitly.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import torch

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


def build_sample(
    name: str,
    device: str = "cpu",
    *,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    rebuild: bool = False,
    on_method=None,
) -> Program:
    """The sample built for ``device``, from the cache when an up-to-date build is there.

    ``on_method(name, index, count)`` is called before each method is compiled (for progress UIs).
    """
    from toolkit.build.builder import build_program
    from toolkit.sources import open_program

    mod = sample_module(name)
    kind = torch.device(device).type
    out = Path(cache_dir or cache_root()) / f"{name}-{kind}-{_cache_key(mod, kind)}"
    if out.is_dir() and (out / "manifest.json").is_file() and not rebuild:
        try:
            return open_program(out)
        except ToolkitError:
            pass  # a damaged cache entry is rebuilt below
    sequences = mod.sequences() if callable(getattr(mod, "sequences", None)) else None
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
