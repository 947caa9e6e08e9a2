"""The programs exported by ExecuTorch 1.5.1's CUDA backend on the H200, and what we expect of them.

Written by ``fixtures/make_executorch_fixtures.py`` (run on the H200, see its docstring) into
``executorch-1.5.1-cuda/<name>/``, committed packed as ``fixtures/executorch-1.5.1-cuda-exports.tar.xz``
and unpacked on first use into ``fixtures/.unpacked/`` (:func:`unpacked`): every attempt has a
``result.json``; an exported
program has ``prog.pte`` + ``aoti_cuda_blob.ptd``; a refused one has ``refusal.txt`` (the
exporter's message, verbatim).  ``MANIFEST`` lists the folders the script wrote.

The tests parametrize over the folders present.  Before the script has run there, none is
present and ``MANIFEST`` is missing: the manifest test then skips, saying so.  Once ``MANIFEST``
is there, every program of :data:`EXPECTED` must be listed and present (a fixture that was not
committed fails), and every folder present must have its expectations stated here.

Expectations, stated per fixture from what the modules are (``PROGRAMS`` in the script):

* ``status``: what 1.5.1's exporter does (the script's own ``expect``);
* ``methods``: the ``.pte``'s execution plans, in the file's order (ExecuTorch writes them
  sorted by name: the two older fixtures have ``decode`` before ``prefill``);
* ``decisions(policy)``: ``{(method, fqn): decision}`` of the dry run for the constants
  worth naming (the first method's constants are ``loaded``, or ``private`` under no-sharing);
* ``wrong(policy)``: methods that run alone on another method's data (a shared constant
  whose content differs), the same on CPU (dry run) and GPU (verify);
* ``sequence_ok(policy)``: ``{sequence: ok}`` of the eager sequences run in order with state
  carried (GPU); ``refusal_key``: the storage key the exporter refuses (a refused program).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
UNPACKED = HERE / "fixtures" / ".unpacked"  # git-ignored


def unpacked(version: str, kind: str = "cuda") -> Path:
    """``fixtures/executorch-<version>-<kind>-exports.tar.xz`` (what the script's ``--pack`` wrote on
    the device, recompressed here with ``tar -cJf``: xz finds what the .so files have in common,
    3.5 MB where gzip needed 13 MB) unpacked once into ``fixtures/.unpacked/executorch-<version>-<kind>``;
    again whenever the archive changes."""
    import shutil
    import tarfile
    import tempfile

    packed = HERE / "fixtures" / f"executorch-{version}-{kind}-exports.tar.xz"
    root = UNPACKED / f"executorch-{version}-{kind}"
    if not packed.is_file():
        return root
    digest = hashlib.sha256(packed.read_bytes()).hexdigest()
    stamp = root / ".archive-sha256"
    if stamp.is_file() and stamp.read_text() == digest:
        return root
    UNPACKED.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=UNPACKED, prefix=".tmp-"))
    with tarfile.open(packed) as tar:
        tar.extractall(tmp, filter="data")
    (tmp / root.name / stamp.name).write_text(digest)
    shutil.rmtree(root, ignore_errors=True)
    (tmp / root.name).rename(root)  # complete or not there: never half-unpacked
    shutil.rmtree(tmp, ignore_errors=True)
    return root


# CONSTSHARE_ET_FIXTURES: read the fixtures from another folder (e.g. the script's --out on the H200)
ROOT = Path(os.environ.get("CONSTSHARE_ET_FIXTURES") or unpacked("1.5.1"))
SCRIPT = HERE / "fixtures" / "make_executorch_fixtures.py"
MANIFEST = ROOT / "MANIFEST"
RUN_COMMAND = "python tests/fixtures/make_executorch_fixtures.py   (on the H200, executorch 1.5.1 installed)"

POLICY_NAMES = (
    "no-sharing",
    "name-only",
    "refuse-on-mismatch",
    "decline-on-mismatch",
    "verify-always",
    "fingerprint",
    "content-dedup",
    "blind-share",
    "fqn-weight-cache",
)
# share a constant whose name hits without comparing its content
NAME_SHARING = ("name-only", "refuse-on-mismatch", "decline-on-mismatch", "verify-always", "blind-share")
SHARING = tuple(p for p in POLICY_NAMES if p != "no-sharing")


@functools.lru_cache(maxsize=1)
def script():
    """The fixture script as a module (it is not a package member)."""
    name = "make_executorch_fixtures"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def present() -> list[str]:
    """Folders the script wrote (a result.json), sorted."""
    if not ROOT.is_dir():
        return []
    return sorted(p.name for p in ROOT.iterdir() if (p / "result.json").is_file())


def manifest() -> list[str] | None:
    return [n for n in MANIFEST.read_text().split() if n] if MANIFEST.is_file() else None


def result(name: str) -> dict:
    return json.loads((ROOT / name / "result.json").read_text())


def exported() -> list[str]:
    return [n for n in present() if result(n).get("status") == "exported"]


def refused() -> list[str]:
    return [n for n in present() if result(n).get("status") == "refused"]


def first_loaded(policy: str) -> str:
    return "private" if policy == "no-sharing" else "loaded"


def hit(policy: str) -> str:
    return "private" if policy == "no-sharing" else "shared"


@dataclass(frozen=True)
class Expect:
    status: str
    methods: tuple[str, ...] = ()
    decisions: Callable[[str], dict] = lambda policy: {}
    wrong: Callable[[str], set] = lambda policy: set()
    sequence_ok: Callable[[str], dict] = lambda policy: {}
    refusal_key: Callable[[dict], str] | None = None  # from result.json
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _state_decisions(weight: str, kv: str):
    # decode is loaded first (file order); prefill then hits both names, same content (kv: zeros)
    return lambda p: {
        ("decode", weight): first_loaded(p),
        ("decode", kv): first_loaded(p),
        ("prefill", weight): hit(p),
        ("prefill", kv): hit(p),
    }


def _so_key(r: dict, method: str) -> str:
    return next(m["so_key"] for m in r["exporter_record"]["methods"] if m["method"] == method)


EXPECTED: dict[str, Expect] = {
    # core.kv of ONE module: sharing it is what the eager sequence does; no-sharing gives decode zeros
    "shared_state": Expect(
        "exported",
        ("decode", "prefill"),
        _state_decisions("core.proj.weight", "core.kv"),
        sequence_ok=lambda p: {"generate": p != "no-sharing"},
        notes="one .ptd entry cuda_fqn_weight:cuda:core.kv for both methods",
    ),
    # two kv buffers, equal initial bytes, one FQN: the exporter stores them once (one key, same
    # data), so 1.5.1 itself shares them, and prefill's writes leak into decode's sequence
    # (fingerprint and content-dedup share kv here too: a .pte does not record which weights are
    # buffers a method writes, so there is no provenance to keep them apart; our directory build
    # of the same modules declines it)
    "mutated_buffer": Expect(
        "exported",
        ("decode", "prefill"),
        _state_decisions("proj.weight", "kv"),
        sequence_ok=lambda p: {"generate": p == "no-sharing"},
        notes="the exporter merges two distinct buffers into one storage key",
    ),
    "no_constants": Expect("exported", ("gate", "project"), lambda p: {("project", "weight"): first_loaded(p)}),
    "three_shared": Expect(
        "exported",
        ("classify", "encode", "encode_again"),
        lambda p: {
            ("classify", "core.proj.weight"): first_loaded(p),
            ("classify", "head.weight"): first_loaded(p),
            # another FQN, the same content: only content-dedup shares it; blind-share (#18667)
            # re-points names of the FIRST method only (classify's): encode's and encode_again's
            # proj.weight stay their own
            ("encode", "proj.weight"): {"content-dedup": "shared", "blind-share": "private"}.get(p, first_loaded(p)),
            ("encode_again", "proj.weight"): "private" if p == "blind-share" else hit(p),
        },
    ),
    # one model in both methods: every named weight is genuinely shared (lifted _tensor_constant*
    # are checked against the dry run only, see the tests)
    "llama_prefill_decode": Expect("exported", ("decode", "prefill")),
    # expected refused (upstream.md measured byte-identical .so files for the seed's case), but
    # 1.5.1 exported it on the H200 (2026-12-01): the two CUDA .so files differ (build-id, an
    # embedded generated-source path, 6.4 KB of code), so the lifted constants' namespaced keys
    # differ and nothing collides.  Loaded, decode comes first (file order): prefill's
    # _tensor_constant0 hits decode's by name with other data
    "total_collision": Expect(
        "exported",
        ("decode", "prefill"),
        lambda p: {
            ("decode", "_tensor_constant0"): first_loaded(p),
            ("prefill", "_tensor_constant0"): "shared"
            if p in NAME_SHARING
            else {"no-sharing": "private", "fingerprint": "declined", "content-dedup": "declined"}.get(p, "loaded"),
        },
        wrong=lambda p: {"prefill"} if p in NAME_SHARING else set(),
        notes="two different .so files: two namespacing keys, exported",
    ),
    "bart_encoder_decoder": Expect(
        "refused",
        wrong=lambda p: {"decoder"} if p in NAME_SHARING else set(),
        refusal_key=None,
        notes="same FQNs (model.layers.0...), other data",
    ),
    "three_methods": Expect(
        "refused",
        wrong=lambda p: {"probe"} if p in NAME_SHARING else set(),
        refusal_key=lambda r: "cuda_fqn_weight:cuda:proj.weight",
    ),
}


# ------------------------------------------------------------------ the program built from the same modules


def _cache_key(name: str) -> str:
    import torch

    from toolkit.build import builder

    h = hashlib.sha256()
    h.update(SCRIPT.read_bytes())
    h.update(inspect.getsource(builder).encode())
    h.update(torch.__version__.encode())
    h.update(name.encode())
    return h.hexdigest()[:12]


def built_program(name: str, order: list[str] | None = None):
    """The fixture's modules built by our builder on the CPU (cached like the samples), methods
    in ``order`` (the order the exporter processed them)."""
    from toolkit.build.builder import build_program
    from toolkit.build.samples import cache_root
    from toolkit.sources import open_program

    pdef = script().PROGRAMS[name]
    out = cache_root() / f"etfix-{name}-cpu-{_cache_key(name)}"
    program = None
    if (out / "manifest.json").is_file():
        try:
            program = open_program(out)
        except Exception:
            program = None
    if program is None:
        sequences = pdef.sequences() if pdef.sequences else None
        program = build_program(
            pdef.methods(),
            out,
            name=name,
            description=pdef.description,
            progress=False,
            overwrite=True,
            sequences=sequences,
        )
    if order is not None and list(order) != program.method_names:
        program = replace(program, methods=tuple(program.method(m) for m in order))
    return program


def with_so_keys(program, keys: dict[str, str]):
    """``program`` with its lifted constants' ``.so`` key replaced by the one the exporter computed
    for the CUDA ``.so`` (ours was compiled for the CPU)."""
    methods = []
    for m in program.methods:
        k = keys[m.name]
        consts = tuple(replace(c, so_key=k) if c.fqn.startswith("_tensor_constant") else c for c in m.constants)
        methods.append(replace(m, constants=consts))
    return replace(program, methods=tuple(methods))
