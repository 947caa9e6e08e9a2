"""Fuzzing: several hundred mutated programs, each must give a toolkit error or a correct
load; never a crash, a hang, another exception type, or a corrupted cache.

Mutation families (counts in ``FAMILIES``; the total is asserted to be >= 300):

- ``manifest-json`` (hypothesis): delete, replace (any JSON value, or a value taken from
  elsewhere in the manifest), or nudge one node anywhere in the manifest tree;
- ``manifest-text``: raw byte damage to manifest.json (truncate, flip, insert);
- ``manifest-semantic``: edits that still parse (dtypes of equal size, digests, kinds, FQNs,
  offsets, I/O counts, method order, files of one method pointed at another's genuine
  files, same-size relayouts and shrunk layouts of matmul constants);
- ``blob-bytes``, ``blob-length``, ``so-bytes``, ``so-length``, ``file-swap``: tampering
  without updating the manifest.  These are the mutations that would open a tampered .so
  (or upload tampered bytes); they run only through integrity checking, which must refuse
  every one of them before anything is opened;
- ``blob-consistent``, ``reference-consistent``: data tampered *and* digests updated (the
  manifest is the root of trust): the program must load, and verification must say
  whether outputs still match;
- ``layout-lie``: one constant's shape, size or offset changed with its digest recomputed:
  the .so's own slot table refuses it before that method uploads anything (same-size
  relayouts may load);
- ``blob-resize-consistent``: the blob truncated or extended, every record rewritten:
  refused at open or load, never a SIGBUS; ``blob-truncated-unchecked``: the blob cut short
  with integrity checking off, under every policy: a clean IntegrityError;
- ``interrupt``: a KeyboardInterrupt after every event of a load of every sample under
  every policy: the session stays consistent and resumes;
- ``pte-bytes``, ``pte-payload``, ``ptd-bytes``, ``pt2-bytes``: byte damage to the files of
  ExecuTorch programs (the real 1.5.1 exports and the synthetic older generations in
  ``tests/fixtures``) and of torch ``.pt2`` packages (truncate, flip, overwrite a 32-bit
  field with an extreme value, insert, delete), aimed at their structure (the FlatBuffer and
  its headers, the CUDA delegate's payload, the zip directory and headers, the generated
  constant table, the weights config, the nested pickles) and at their data: opening must
  give the model or a ProgramError naming one of the program's files, and a model that
  opens must hold the digests of the bytes it points at and give a dry run under any policy;
  ``pte-sequence``: the same damage to the ``sequence_<name>.safetensors`` beside our 1.5.1
  export of ``shared_state`` (its header, mostly, where the steps are), or its steps rewritten.
- ``side-file-types``: a FIFO, folder, device or dangling link where a ``.pte``'s side file
  goes: refused by name (or the optional file left out), never opened, in time;
  ``pathological-sizes``: long lines and huge declared counts in a ``.pt2``'s generated
  source, 40,000 FQNs with one internal name, 8,000 methods, an 8 GiB sparse ``.ptd``: time
  linear in the real content, no MemoryError;
  ``deep-nesting``: JSON nested up to 200,000 deep in every JSON a program holds.

A correct load means: status "loaded", cache entries owned and used only by loaded
methods, verify() produces a row per method without raising, close() empties the cache.
Outcome counts are printed at the end of the module (visible in the terminal summary).
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_errors import read_json, refresh_digests, write_json

from toolkit.core.errors import IntegrityError, ProgramError, ToolkitError
from toolkit.core.policies import POLICIES
from toolkit.engine.session import load_program
from toolkit.runtimes import aoti as runtime
from toolkit.sources import open_program
from toolkit.sources.directory import MANIFEST_FILE

SAMPLES = ["total_collision", "three_methods"]
FAMILIES = {  # family -> number of cases
    "manifest-json": 200,
    "manifest-text": 30,
    "manifest-semantic": 100,
    "blob-bytes": 20,
    "blob-length": 12,
    "so-bytes": 16,
    "so-length": 8,
    "file-swap": 16,
    "blob-consistent": 12,
    "reference-consistent": 6,
    "layout-lie": 120,
    "blob-resize-consistent": 48,
    "blob-truncated-unchecked": 24,
    "pte-bytes": 80,
    "pte-payload": 60,
    "ptd-bytes": 50,
    "pt2-bytes": 80,
    "pte-sequence": 30,
    "side-file-types": 300,
    "pathological-sizes": 300,
    "deep-nesting": 300,
}
# "interrupt" cases are not drawn: every event of a clean load of every sample under every
# policy is one case (KeyboardInterrupt raised right after that event is recorded).
INTERRUPT_FAMILY = "interrupt"
TAMPER = {"blob-bytes", "blob-length", "so-bytes", "so-length", "file-swap"}
CASE_SECONDS = 30.0  # bound per case; a hang inside native code is caught by pytest-timeout

OUTCOMES: dict[str, Counter] = {}
TIMES: list[float] = []


# ------------------------------------------------------------------------ machinery


BASE_ROOTS: dict = {}


@pytest.fixture(scope="module")
def bases(built_sample):
    BASE_ROOTS.update({name: built_sample(name) for name in SAMPLES})
    return dict(BASE_ROOTS)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module", autouse=True)
def print_counts(request):
    yield
    total = sum(sum(c.values()) for c in OUTCOMES.values())
    lines = [f"fuzz: {total} mutated programs, slowest case {max(TIMES, default=0):.2f} s"]
    overall: Counter = Counter()
    for family in [*FAMILIES, INTERRUPT_FAMILY, "layout-lie-isolated"]:
        c = OUTCOMES.get(family, Counter())
        overall.update(c)
        lines.append(f"  {family:22s} {sum(c.values()):4d}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    lines.append("  all outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(overall.items())))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print("\n" + "\n".join(lines))
    else:
        print("\n".join(lines))


class Opened:
    """Spy on the runtime adapter: every .so opened (the container factory)."""

    def __init__(self):
        self.paths: list[str] = []
        self._real = runtime.AotiContainer.create

    def __enter__(self):
        real = self._real

        def create(cls, so_path, device):
            self.paths.append(str(so_path))
            return real.__func__(cls, so_path, device)

        runtime.AotiContainer.create = classmethod(create)
        return self

    def __exit__(self, *exc):
        runtime.AotiContainer.create = self._real


_counter = iter(range(10**9))


def make_case(base, workdir: Path) -> Path:
    """A private copy of the base program (hard links where the file system allows: the
    program's own files, not symlinks, which the toolkit refuses when they lead outside).
    Call ``own(root, rel)`` before changing a file, so the base is never touched."""
    root = workdir / f"case{next(_counter)}"
    root.mkdir()
    shutil.copy(base.root / MANIFEST_FILE, root / MANIFEST_FILE)
    for rel in base.files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(base.root / rel, root / rel)
        except OSError:  # another file system
            shutil.copyfile(base.root / rel, root / rel)
    return root


def own(root: Path, rel: str) -> Path:
    """``root/rel`` as a file of its own (a hard-linked file would change the base too)."""
    p = root / rel
    if p.stat().st_nlink > 1:
        data = p.read_bytes()
        p.unlink()
        p.write_bytes(data)
    return p


def check_cache(s) -> None:
    loaded = set(s.methods)
    for e in s.cache:
        assert e.owner_method in loaded, f"cache entry {e.fqn!r} owned by {e.owner_method!r}, not loaded"
        assert e.users and e.users <= loaded, f"cache entry {e.fqn!r} used by {e.users}, loaded: {loaded}"
        assert e.tensor is not None
        assert s.cache.find_content(e.digest, e.meta) in list(s.cache)
    if s.status == "failed":
        assert s.failed_method not in loaded and s.error
        assert isinstance(s.exception, ToolkitError)


_BASELINE: dict[tuple[str, str], dict[str, bool]] = {}


def baseline_ok(base, policy: str) -> dict[str, bool]:
    """Which methods of the unmutated sample verify under ``policy`` (some policies are
    unsafe by design: name-only shares total_collision's colliding constant)."""
    key = (base.name, policy)
    if key not in _BASELINE:
        s = load_program(base, policy)
        v = s.verify()
        _BASELINE[key] = dict(zip(v["method"], (bool(x) for x in v["ok"])))
        s.close()
    return _BASELINE[key]


def attempt(root: Path, policy: str) -> tuple[str, "object"]:
    """Open, load and verify one mutated program; return (outcome, session or error)."""
    try:
        program = open_program(root)
    except ToolkitError as e:
        _names_where(e)
        return f"refused at open ({type(e).__name__})", e
    try:
        s = load_program(program, policy)
    except ToolkitError as e:
        _names_where(e)
        return f"refused at load ({type(e).__name__})", e
    check_cache(s)
    if s.status == "failed":
        _names_where(s.exception)
        return f"failed load ({type(s.exception).__name__})", s
    v = s.verify()
    assert list(v["method"]) == program.method_names
    ok = dict(zip(v["method"], (bool(x) for x in v["ok"])))
    base = BASE_ROOTS.get(program.name)
    if all(ok.values()):
        outcome = "loaded, all methods verified"
    elif base is not None and ok == baseline_ok(base, policy):
        outcome = "loaded, verified as unmutated (policy's known wrong outputs)"
    else:
        outcome = "loaded, verification flags the mutation"
    s.close()
    assert len(s.cache) == 0
    return outcome, s


def _names_where(e: ToolkitError) -> None:
    if isinstance(e, ProgramError):
        assert e.path, f"{type(e).__name__} does not name a file: {e}"


def run_case(family: str, root: Path, policy: str, note: str) -> tuple[str, object, list[str]]:
    t0 = time.perf_counter()
    with Opened() as opened:
        try:
            outcome, what = attempt(root, policy)
        except Exception as e:  # any other type is a failure: say which mutation caused it
            raise AssertionError(f"{family} [{note}] under {policy}: {type(e).__name__}: {e}") from e
    dt = time.perf_counter() - t0
    TIMES.append(dt)
    assert dt < CASE_SECONDS, f"{family} [{note}] took {dt:.1f} s"
    OUTCOMES.setdefault(family, Counter())[outcome] += 1
    return outcome, what, opened.paths


# --------------------------------------------------------- manifest-json (hypothesis)


INTERESTING = [
    "",
    ".",
    "..",
    "../x",
    "/etc/passwd",
    "methods/decode/model.so",
    "methods/prefill/weights.blob",
    "float16",
    "int32",
    "bfloat16",
    "uint8",
    "cuda",
    "cpu",
    "prefill",
    "decode",
    "encode",
    "_tensor_constant0",
    "proj.weight",
    "=1+1",
    "a" * 300,
    "0" * 64,
    "lifted_constant",
    "buffer",
    "parameter",
    "2.13.0",
    "constshare-program",
    "\u00e9\u4e2d",
    "\x00",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.integers(-3, 70000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(INTERESTING),
)
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6
)


def tree_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from tree_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from tree_paths(v, prefix + (i,))


def get_at(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def mutate_json(data, draw) -> str:
    paths = [p for p in tree_paths(data) if p]
    path = paths[draw(st.integers(0, len(paths) - 1))]
    parent, key = get_at(data, path[:-1]), path[-1]
    old = parent[key]
    op = draw(st.sampled_from(["delete", "replace", "borrow", "nudge", "rename"]))
    if op == "delete":
        del parent[key]
    elif op == "replace":
        parent[key] = draw(json_values)
    elif op == "borrow":  # a value of the right shape from somewhere else in the manifest
        donors = [get_at(data, p) for p in paths if p != path]
        parent[key] = copy.deepcopy(donors[draw(st.integers(0, len(donors) - 1))])
    elif op == "nudge" and isinstance(old, int) and not isinstance(old, bool):
        parent[key] = old + draw(st.sampled_from([-1, 1, 4, -4, 64, old, -old - 1]))
    elif op == "nudge" and isinstance(old, list) and old:
        parent[key] = old + [copy.deepcopy(old[0])]
    elif op == "rename" and isinstance(parent, dict):
        parent[draw(st.sampled_from(INTERESTING + [str(key) + "x"]))] = parent.pop(key)
    else:
        parent[key] = draw(json_values)
        op = "replace"
    return f"{op} {'.'.join(map(str, path))}"


@settings(
    max_examples=FAMILIES["manifest-json"],
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_manifest_json_mutations(bases, workdir, data):
    sample = data.draw(st.sampled_from(SAMPLES))
    policy = data.draw(st.sampled_from(POLICIES))
    root = make_case(bases[sample], workdir)
    manifest = read_json(root)
    note = mutate_json(manifest, data.draw)
    write_json(root, manifest)
    run_case("manifest-json", root, policy, f"{sample}: {note}")


# ---------------------------------------------------------------- seeded families


def _cases(family: str):
    rng = random.Random(f"constshare-fuzz-{family}")
    return [(i, rng.randrange(1 << 30)) for i in range(FAMILIES[family])]


def loads(sample: str, policy: str) -> bool:
    """Whether the unmutated sample loads under ``policy`` (fqn-weight-cache reproduces
    ExecuTorch 1.5.x's exporter, which refuses both fuzzed samples: see their EXPECTED)."""
    from toolkit.build.samples import sample_module

    return sample_module(sample).EXPECTED[policy].loaded


def _setup(bases, workdir, seed):
    """A case of a sample under a policy that loads the unmutated sample (so a mutation's effect shows)."""
    rng = random.Random(seed)
    sample = rng.choice(SAMPLES)
    policy = rng.choice([p for p in POLICIES if loads(sample, p)])
    return rng, sample, bases[sample], make_case(bases[sample], workdir), policy


@pytest.mark.parametrize("i, seed", _cases("manifest-text"))
def test_manifest_text_damage(bases, workdir, i, seed):
    rng, sample, base, root, policy = _setup(bases, workdir, seed)
    raw = bytearray((root / MANIFEST_FILE).read_bytes())
    op = rng.choice(["truncate", "flip", "insert", "delete"])
    at = rng.randrange(len(raw))
    if op == "truncate":
        raw = raw[:at]
    elif op == "flip":
        raw[at] ^= 1 << rng.randrange(8)
    elif op == "insert":
        raw[at:at] = rng.choice([b"\xff", b"{", b"]", b",", b'"', b"\\", b"9" * 5000, b"\x00"])
    else:
        del raw[at : at + rng.randrange(1, 64)]
    (root / MANIFEST_FILE).write_bytes(bytes(raw))
    run_case("manifest-text", root, policy, f"{sample}: {op} at {at}")


SAME_SIZE_DTYPES = {
    "float32": ["int32"],
    "int32": ["float32"],
    "float16": ["bfloat16", "int16"],
    "bfloat16": ["float16"],
    "int64": ["float64"],
    "float64": ["int64"],
}


def _semantic(rng: random.Random, d: dict, sample: str) -> str:
    methods = d["methods"]
    mi = rng.randrange(len(methods))
    m = methods[mi]
    consts = m["constants"]
    c = rng.choice(consts) if consts else None
    others = [x for x in methods if x is not m]
    other = rng.choice(others)
    ops = [
        "digest",
        "kind",
        "mutated",
        "fqn",
        "fqn-empty",
        "num_inputs",
        "num_outputs",
        "order",
        "so-of-other",
        "blob-of-other",
        "reference-of-other",
        "dtype",
        "offset",
        "relayout",
    ]
    if sample == "total_collision":
        ops.append("shrink")  # only where an extern mm kernel checks the slot's shape (see module doc)
    op = rng.choice(ops)
    if op == "digest" and c:
        digests = [x["digest"] for o in methods for x in o["constants"]]
        c["digest"] = rng.choice(digests + ["%064x" % rng.getrandbits(256)])
    elif op == "kind" and c:
        c["kind"] = rng.choice(["parameter", "buffer", "lifted_constant"])
    elif op == "mutated" and c:
        c["mutated"] = not c["mutated"]
    elif op == "fqn" and c:
        c["fqn"] = rng.choice([x["fqn"] for o in methods for x in o["constants"]] + ["not.in.the.so"])
    elif op == "fqn-empty" and c:
        c["fqn"] = ""
    elif op in ("num_inputs", "num_outputs"):
        m[op] = max(0, m[op] + rng.choice([-1, 1, 2]))
    elif op == "order":
        rng.shuffle(methods)
    elif op.endswith("-of-other"):
        key = {"so": "so_file", "blob": "blob_file", "reference": "reference_file"}[op.split("-")[0]]
        m[key] = other[key]
        if key == "blob_file":
            m["blob_bytes"] = other["blob_bytes"]
    elif op == "dtype" and c and c["dtype"] in SAME_SIZE_DTYPES:
        c["dtype"] = rng.choice(SAME_SIZE_DTYPES[c["dtype"]])
    elif op == "offset" and c and m["blob_bytes"] > c["nbytes"]:
        c["offset"] = rng.randrange(0, (m["blob_bytes"] - c["nbytes"]) // 4 + 1) * 4
    elif op == "relayout" and c and len(c["shape"]) == 2 and c["storage_offset"] == 0:
        rows, cols = c["shape"]
        c["shape"], c["strides"] = rng.choice(
            [([rows * cols], [1]), ([cols, rows], [rows, 1]), ([rows, cols], [1, rows])]
        )
    elif op == "shrink" and c and len(c["shape"]) == 2:
        c.update(shape=[2, 2], strides=[2, 1], storage_offset=0, nbytes=16)
    else:
        op = f"{op} (no-op)"
    return f"{op} in {m['name']}"


@pytest.mark.parametrize("i, seed", _cases("manifest-semantic"))
def test_manifest_semantic_mutations(bases, workdir, i, seed):
    rng, sample, base, root, policy = _setup(bases, workdir, seed)
    d = read_json(root)
    note = _semantic(rng, d, sample)
    write_json(root, d)
    run_case("manifest-semantic", root, policy, f"{sample}: {note}")


def _files(base, kind: str) -> list[str]:
    attr = {"so": "so_file", "blob": "blob_file", "reference": "reference_file"}[kind]
    return [getattr(m, attr) for m in base.methods]


def _tamper(rng: random.Random, base, root: Path, family: str) -> tuple[str, set[str]]:
    """Damage files without touching the manifest; returns (note, files whose content changed)."""
    if family in ("blob-bytes", "so-bytes", "blob-length", "so-length"):
        kind = family.split("-")[0]
        rel = rng.choice(_files(base, kind))
        p = own(root, rel)
        raw = bytearray(p.read_bytes())
        if family.endswith("bytes"):
            flips = rng.choice([1, 1, 2, 16])
            for _ in range(flips):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            note = f"{flips} bit flip(s) in {rel}"
        elif rng.random() < 0.5:
            raw = raw[: rng.randrange(len(raw))]
            note = f"{rel} truncated to {len(raw)}"
        else:
            raw += bytes(rng.randrange(1, 4096))
            note = f"{rel} extended to {len(raw)}"
        p.write_bytes(bytes(raw))
        changed = {rel} if raw != bytearray((base.root / rel).read_bytes()) else set()
        return note, changed
    # file-swap: exchange two files of the program
    every = list(base.files)
    a, b = rng.sample(every, 2)
    pa, pb = own(root, a), own(root, b)
    da, db = pa.read_bytes(), pb.read_bytes()
    pa.write_bytes(db)
    pb.write_bytes(da)
    return f"swap {a} <-> {b}", ({a, b} if da != db else set())


@pytest.mark.parametrize("family, i, seed", [(f, i, s) for f in sorted(TAMPER) for i, s in _cases(f)])
def test_tampering_is_refused_before_anything_is_opened(bases, workdir, family, i, seed):
    rng, sample, base, root, policy = _setup(bases, workdir, seed)
    note, changed = _tamper(rng, base, root, family)
    outcome, what, opened = run_case(family, root, policy, f"{sample}: {note}")
    if not changed:  # e.g. two methods' identical .so files swapped: nothing to refuse
        assert outcome.startswith("loaded"), (note, outcome)
        return
    # a weights blob's pieces are verified as they are read (issue 25; LoadOptions(hash_all=True),
    # tested in test_integrity, checks them first): a load that reads no changed piece loads, and
    # the bytes it used are the verified ones; one that does fails at the method reading it
    blobs_only = changed <= set(_files(base, "blob"))
    if blobs_only and outcome.startswith("loaded"):
        assert outcome != "loaded, verification flags the mutation", (note, outcome)
        return
    assert outcome == "failed load (IntegrityError)", (note, outcome)
    assert what.exception.path in {str(root / rel) for rel in changed}, (note, what.error)
    if blobs_only:
        names = [m.name for m in base.methods]
        assert what.failed_method not in what.methods, note
        assert len(opened) <= names.index(what.failed_method) + 1, f"{note}: opened {opened} before refusing"
        return
    assert opened == [], f"{note}: opened {opened} before refusing"
    assert not what.methods and len(what.cache) == 0


@pytest.mark.parametrize(
    "family, i, seed", [(f, i, s) for f in ("blob-consistent", "reference-consistent") for i, s in _cases(f)]
)
def test_consistent_data_tampering_loads_and_verification_tells(bases, workdir, family, i, seed):
    """Digests updated along with the data: the manifest is the root of trust, so this loads.
    Verification against the eager reference is what shows whether outputs still hold."""
    rng, sample, base, root, policy = _setup(bases, workdir, seed)
    if family == "blob-consistent":
        rel = rng.choice(_files(base, "blob"))
        p = own(root, rel)
        raw = bytearray(p.read_bytes())
        for _ in range(rng.choice([1, 8, 64])):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        p.write_bytes(bytes(raw))
    else:
        a, b = _files(base, "reference")[:2]
        pa, pb = own(root, a), own(root, b)
        da, db = pa.read_bytes(), pb.read_bytes()
        pa.write_bytes(db)
        pb.write_bytes(da)
        rel = f"{a} <-> {b}"
    refresh_digests(root)
    outcome, what, _ = run_case(family, root, policy, f"{sample}: {rel}")
    error = str(getattr(what, "error", what))
    # the file records agree, but a constant's own digest no longer does: a share resting on it is refused
    claim_refused = outcome == "failed load (IntegrityError)" and "rests on the two digests being equal" in error
    assert outcome.startswith("loaded") or claim_refused, (rel, outcome, error)


def test_enough_mutations():
    assert sum(FAMILIES.values()) >= 300


# ------------------------------------------- the promises of issue 13: lies, sizes, interrupts


def _sha(raw: bytes) -> str:
    import hashlib

    return hashlib.sha256(raw).hexdigest()


def _contiguous(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.insert(0, acc)
        acc *= max(n, 1)
    return strides


_ITEM = {
    "float32": 4,
    "int32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
}


def _lie(rng: random.Random, root: Path, d: dict) -> tuple[str, int, str]:
    """One consistent lie about a constant's layout (its digest recomputed from the blob).

    Returns (note, index of the lying method, kind) where kind says what must happen:
    "refuse" (the .so's slot disagrees: refused before anything of that method is uploaded),
    "within-alignment" (a size lie inside the slot's 64-byte rounding, which the .so cannot
    tell: may load, verification tells) or "benign" (same bytes read another way)."""
    mi = rng.randrange(len(d["methods"]))
    m = d["methods"][mi]
    if not m["constants"]:
        return "no constants", mi, "benign"
    c = rng.choice(m["constants"])
    item = _ITEM[c["dtype"]]
    blob = (root / m["blob_file"]).read_bytes()
    n = c["nbytes"] // item
    op = rng.choice(["shrink", "grow", "offset", "flat", "transpose"])
    if op == "shrink" and n > 1:
        shape = [rng.randrange(1, n)]
    elif op == "grow" and c["offset"] + c["nbytes"] + item <= len(blob):
        shape = [n + rng.randrange(1, (len(blob) - c["offset"] - c["nbytes"]) // item + 1)]
    elif op == "offset" and len(blob) > c["nbytes"]:
        choices = [o for o in range(0, len(blob) - c["nbytes"] + 1, 64) if o != c["offset"]]
        if not choices:
            return "no other offset", mi, "benign"
        c["offset"] = rng.choice(choices)
        c["digest"] = _sha(blob[c["offset"] : c["offset"] + c["nbytes"]])
        return f"{m['name']}/{c['name']}: offset -> {c['offset']}", mi, "refuse"
    elif op == "transpose" and len(c["shape"]) == 2 and c["shape"][0] == c["shape"][1]:
        c["strides"] = [c["strides"][1], c["strides"][0]]  # same bytes, read transposed
        return f"{m['name']}/{c['name']}: strides transposed", mi, "benign"
    else:  # the same bytes as a flat vector: same size, other shape
        c.update(shape=[n], strides=[1])
        return f"{m['name']}/{c['name']}: flattened", mi, "benign"
    old_nbytes = c["nbytes"]
    c.update(shape=shape, strides=_contiguous(shape), storage_offset=0, nbytes=shape[0] * item)
    c["digest"] = _sha(blob[c["offset"] : c["offset"] + c["nbytes"]])
    # the .so reports slot sizes rounded to 64 bytes: a lie inside that rounding cannot be told
    kind = "refuse" if -(-old_nbytes // 64) != -(-c["nbytes"] // 64) else "within-alignment"
    return f"{m['name']}/{c['name']}: {op} to {shape}", mi, kind


def _uploads(s, method: str) -> list[str]:
    return [
        e.kind.value
        for e in s.log
        if e.method == method and e.kind.value in ("blob_uploaded", "constant_uploaded", "pairs_installed")
    ]


@pytest.mark.parametrize("i, seed", _cases("layout-lie"))
def test_layout_lies_are_refused_before_anything_of_the_method_is_uploaded(bases, workdir, i, seed):
    """The manifest lies consistently (digest recomputed) about one constant's shape, size or
    offset: the .so's own slot table refuses it before that method uploads or runs anything,
    under every policy.  A same-size relayout reads in-bounds bytes and may load."""
    rng, sample, base, root, policy = _setup(bases, workdir, seed)
    d = read_json(root)
    note, mi, kind = _lie(rng, root, d)
    write_json(root, d)
    outcome, what, _ = run_case("layout-lie", root, policy, f"{sample}: {note}")
    lying = d["methods"][mi]["name"]
    if kind == "refuse":
        assert outcome == "failed load (ProgramError)", (note, outcome)
        assert what.failed_method == lying and "the .so" in what.error, (note, what.error)
        assert _uploads(what, lying) == [], (note, _uploads(what, lying))


@pytest.mark.parametrize("i, seed", _cases("blob-resize-consistent"))
def test_a_resized_blob_with_a_consistent_manifest_never_reaches_aoti(bases, workdir, i, seed):
    """The blob truncated or extended and every record rewritten to match: refused at open
    (a constant outside the blob) or at load (the .so reads another blob size), never a
    SIGBUS, under every policy."""
    rng, sample, base, root, policy = _setup(bases, workdir, seed)
    rel = rng.choice(_files(base, "blob"))
    p = own(root, rel)
    raw = p.read_bytes()
    delta = rng.choice([-1, -7, -64, -len(raw) // 2, 1, 64, 4096])
    p.write_bytes(raw[: max(len(raw) + delta, 0)] if delta < 0 else raw + bytes(delta))
    refresh_digests(root)
    outcome, what, _ = run_case("blob-resize-consistent", root, policy, f"{sample}: {rel} {delta:+d}")
    assert outcome in ("refused at open (ManifestError)", "failed load (ProgramError)"), (rel, delta, outcome)


@pytest.mark.parametrize("i, seed", _cases("blob-truncated-unchecked"))
def test_a_truncated_blob_without_integrity_checking_fails_cleanly(bases, workdir, i, seed):
    """Integrity checking off (a program being edited), the blob cut short: whole-blob
    policies would let AOTInductor read past the end of the mapping (SIGBUS); the file's
    real size is checked first, and own uploads detect the short read."""
    rng = random.Random(seed)
    sample = SAMPLES[i % len(SAMPLES)]
    policy = POLICIES[i % len(POLICIES)]
    base = bases[sample]
    root = make_case(base, workdir)
    rel = rng.choice(_files(base, "blob"))
    p = own(root, rel)
    raw = p.read_bytes()
    p.write_bytes(raw[: rng.randrange(len(raw))])
    t0 = time.perf_counter()
    s = load_program(open_program(root), policy, check_integrity=False)
    TIMES.append(time.perf_counter() - t0)
    check_cache(s)
    if s.status == "failed" and not loads(sample, policy):  # refused before any byte is read
        outcome = f"failed load ({type(s.exception).__name__})"
        assert "with different data" in s.error and s.failed_method in {"decode", "probe"}, s.error
    elif s.status == "failed":
        outcome = f"failed load ({type(s.exception).__name__})"
        assert isinstance(s.exception, IntegrityError) and s.exception.path == str(p), s.error
    else:  # a policy that never reads this blob (every constant shared from another method)
        outcome = "loaded (the truncated blob was never read)"
        method = rel.split("/")[1]  # methods/<method>/weights.blob
        assert not any(e.kind.value in ("blob_uploaded", "constant_uploaded") and e.method == method for e in s.log)
    s.close()
    OUTCOMES.setdefault("blob-truncated-unchecked", Counter())[outcome] += 1


def _cache_view(s) -> dict:
    return {e.fqn: (e.owner_method, frozenset(e.users)) for e in s.cache}


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("policy", POLICIES)
def test_an_interrupt_at_any_event_leaves_a_consistent_session(bases, sample, policy):
    """KeyboardInterrupt right after each event of a load, one case per event: the methods
    loaded before stay loaded, the cache holds only their entries (users included), the
    session stays "not loaded", and load() then resumes and gives the unmutated answers."""
    from toolkit.core.policies import get_policy
    from toolkit.engine.devices import resolve_devices
    from toolkit.engine.session import Session

    base = bases[sample]
    # one case per record the load makes (an event, or a batch of a method's events of one step):
    # EventLog.recorded is called once after each, by every way of recording
    clean = Session(base, get_policy(policy), resolve_devices(base, None))
    n_records = [0]
    clean.log.recorded = lambda start, stop: n_records.__setitem__(0, n_records[0] + 1)
    clean.load()
    del clean.log.recorded  # count the load's records only (verify records its runs too)
    assert n_records[0] > 1 and len(clean.log) >= n_records[0]
    want = dict(zip(clean.verify()["method"], clean.verify()["ok"]))
    want_status, want_error = clean.status, clean.error  # "failed" where the policy refuses the sample
    clean.close()
    for k in range(n_records[0]):
        s = Session(base, get_policy(policy), resolve_devices(base, None))
        count = [0]

        def interrupting(start, stop):
            count[0] += 1
            if count[0] == k + 1:
                raise KeyboardInterrupt(
                    f"after record {k} (events {start} to {stop - 1}: "
                    f"{s.log.event(stop - 1).kind.value} of {s.log.event(stop - 1).method})"
                )

        s.log.recorded = interrupting
        with pytest.raises(KeyboardInterrupt):
            s.load()
        del s.log.recorded  # the class's own hook again
        assert s.status == "not loaded", (k, s.status)
        loaded = set(s.methods)
        for e in s.cache:
            assert e.owner_method in loaded and e.users <= loaded, (k, e.fqn, e.owner_method, e.users, loaded)
        assert all(s.results[m].status == "loaded" for m in loaded)
        s.load()  # resumes with the methods not loaded yet
        assert (s.status, s.error) == (want_status, want_error), (k, s.error)
        got = dict(zip(s.verify()["method"], s.verify()["ok"]))
        assert got == want, (k, got, want)
        s.close()
        assert len(s.cache) == 0 and s.status == "closed"
        OUTCOMES.setdefault(INTERRUPT_FAMILY, Counter())["interrupted, consistent, resumed"] += 1


@pytest.mark.parametrize("policy", ["fingerprint", "decline-on-mismatch"])
def test_layout_lie_runs_isolated(bases, workdir, policy):
    """A manifest that shrinks a Linear weight's layout consistently (shape, strides, nbytes)
    passes every check: the .so's own slot sizes are not visible through the Python AOTI
    runner, and a generated kernel may read the slot past the smaller tensor.  Such
    mutations are not run in-process; through the worker the caller survives whatever
    happens, and the outcome is a failed load or a load whose verification flags it."""
    from toolkit.workflows.isolation import load_isolated

    root = make_case(bases["three_methods"], workdir)
    d = read_json(root)
    c = d["methods"][1]["constants"][0]  # probe's proj.weight, 32x32 float32
    c.update(shape=[2, 2], strides=[2, 1], storage_offset=0, nbytes=16)
    write_json(root, d)
    iso = load_isolated(root, policy, timeout_s=300)
    if iso.status == "failed":
        outcome = f"isolated: failed load ({iso.error_type})"
    else:
        v = iso.verification.set_index("method")
        assert not bool(v.loc["probe", "ok"]), "a shrunk weight cannot reproduce the eager output"
        outcome = "isolated: loaded, verification flags the mutation"
    OUTCOMES.setdefault("layout-lie-isolated", Counter())[outcome] += 1


# ------------------------------------ ExecuTorch .pte/.ptd and torch .pt2: byte damage at open


FIXTURES = Path(__file__).resolve().parent / "fixtures"
# our 1.5.1 exports (unpacked from the committed archive): absolute paths, FIXTURES / p is p
from executorch_fixtures import ROOT as EXPORTS  # noqa: E402
from executorch_fixtures import unpacked  # noqa: E402

GEN1 = str(unpacked("1.2.0") / "shared_ok")  # payload generation 1, exported by executorch 1.2.0
PTE_FIXTURES = [
    "executorch-1.5.1-cuda/shared_ok",
    "executorch-1.5.1-cuda/identical",
    GEN1,
    "synthetic-gen2",
    "synthetic-fqn4",
    "synthetic-fqn5",
    str(EXPORTS / "three_shared"),
    str(EXPORTS / "no_constants"),
]
EXTREMES = [0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, 0xFFFF, 64, 4096]


def _damage(rng: random.Random, raw: bytearray, lo: int, hi: int) -> str:
    """One damage inside raw[lo:hi] (the region a family aims at); returns a note."""
    hi = max(min(hi, len(raw)), lo + 1)
    at = rng.randrange(lo, hi)
    op = rng.choice(["flip", "flip", "u32", "u32", "truncate", "insert", "delete", "zero"])
    if op == "flip":
        raw[at] ^= 1 << rng.randrange(8)
    elif op == "u32" and at + 4 <= len(raw):
        raw[at : at + 4] = rng.choice(EXTREMES).to_bytes(4, "little")
    elif op == "truncate":
        del raw[at:]
    elif op == "insert":
        raw[at:at] = bytes(rng.choice([1, 4, 8, 100]))
    elif op == "delete":
        del raw[at : at + rng.choice([1, 4, 8, 100])]
    else:
        raw[at : at + 16] = bytes(len(raw[at : at + 16]))
        op = "zero"
    return f"{op} at {at}"


def _open_damaged(family: str, path: Path, note: str, files: set[Path], **kw) -> None:
    """Open a damaged program: a ProgramError naming one of its files, or a self-consistent model
    whose dry run works under a policy drawn from the note."""
    from toolkit.workflows.dry_run import dry_run, memory_floor

    t0 = time.perf_counter()
    try:
        try:
            program = open_program(path, **kw)
        except ToolkitError as e:
            assert isinstance(e, ProgramError), f"{family} [{note}]: {type(e).__name__}: {e}"
            assert e.path and Path(e.path).resolve() in {f.resolve() for f in files}, (note, str(e))
            outcome = f"refused at open ({type(e).__name__})"
        else:
            for rel, rec in program.files.items():  # the records are of the bytes as they are now
                assert rec.bytes == program.path(rel).stat().st_size
            for m in program.methods:
                for c in m.constants:
                    data = program.path(c.file).read_bytes()[c.offset : c.offset + c.nbytes]
                    assert len(data) == c.nbytes and _sha(data) == c.digest, (note, m.name, c.name)
            policy = POLICIES[sum(map(ord, note)) % len(POLICIES)]
            a = dry_run(program, policy)
            memory_floor(program)
            outcome = f"opened, dry run {a.status}"
    except AssertionError:
        raise
    except Exception as e:  # any other type is a failure: say which damage caused it
        raise AssertionError(f"{family} [{note}]: {type(e).__name__}: {e}") from e
    dt = time.perf_counter() - t0
    TIMES.append(dt)
    assert dt < CASE_SECONDS, f"{family} [{note}] took {dt:.1f} s"
    OUTCOMES.setdefault(family, Counter())[outcome] += 1


def _pte_case(workdir: Path, folder: str) -> tuple[Path, dict]:
    src = FIXTURES / folder
    root = workdir / f"case{next(_counter)}"
    shutil.copytree(src, root)
    kw = {}
    if (src / "constant_table.json").is_file():
        kw["constant_table"] = json.loads((src / "constant_table.json").read_text())
    return root, kw


@pytest.mark.parametrize("i, seed", _cases("pte-bytes"))
def test_damaged_pte_is_refused_by_name_or_opens_consistently(workdir, i, seed):
    rng = random.Random(seed)
    folder = PTE_FIXTURES[i % len(PTE_FIXTURES)]
    root, kw = _pte_case(workdir, folder)
    p = root / "prog.pte"
    raw = bytearray(p.read_bytes())
    program_size = int.from_bytes(raw[16:24], "little")
    # mostly the FlatBuffer and its header; sometimes the segments (the .so, the named data)
    hi = program_size if rng.random() < 0.8 else len(raw)
    note = f"{folder}/prog.pte: " + _damage(rng, raw, 0, hi)
    p.write_bytes(bytes(raw))
    _open_damaged("pte-bytes", root, note, {p, root / "aoti_cuda_blob.ptd"}, **kw)


@pytest.mark.parametrize("i, seed", _cases("pte-payload"))
def test_damaged_cuda_payload_is_refused_by_name_or_opens_consistently(workdir, i, seed):
    """Damage inside the CUDA delegate's processed bytes (ETCUDAFQN*, or the key text), or to
    the length of the vector holding them."""
    rng = random.Random(seed)
    folder = [f for f in PTE_FIXTURES if f != GEN1][i % (len(PTE_FIXTURES) - 1)]
    root, kw = _pte_case(workdir, folder)
    p = root / "prog.pte"
    raw = bytearray(p.read_bytes())
    from toolkit.sources.binary import MappedFile
    from toolkit.sources.executorch.layout import read_pte

    f = MappedFile(p, "prog.pte")
    payloads = [d.payload for plan in read_pte(f).plans for d in plan.delegates]
    f.close()
    payload = rng.choice(payloads)
    start = raw.find(payload)
    size = len(payload)
    inline = int.from_bytes(raw[start - 4 : start], "little") == size  # a [ubyte] vector, not a segment
    if inline and rng.random() < 0.25:
        new = rng.choice([0, 1, 10, size - 1, size + 1, size + 4096, 0xFFFFFFFF])
        raw[start - 4 : start] = new.to_bytes(4, "little")
        note = f"{folder}: payload length {size} -> {new}"
    else:
        note = f"{folder}: payload " + _damage(rng, raw, start, start + size)
    p.write_bytes(bytes(raw))
    _open_damaged("pte-payload", root, note, {p, root / "aoti_cuda_blob.ptd"}, **kw)


@pytest.mark.parametrize("i, seed", _cases("ptd-bytes"))
def test_damaged_ptd_is_refused_by_name_or_opens_consistently(workdir, i, seed):
    rng = random.Random(seed)
    folder = PTE_FIXTURES[i % len(PTE_FIXTURES)]
    root, kw = _pte_case(workdir, folder)
    p = root / "aoti_cuda_blob.ptd"
    raw = bytearray(p.read_bytes())
    fb_end = int.from_bytes(raw[16:24], "little") + int.from_bytes(raw[24:32], "little")
    hi = fb_end if rng.random() < 0.75 else len(raw)  # header and FlatBuffer, else the data too
    note = f"{folder}/aoti_cuda_blob.ptd: " + _damage(rng, raw, 0, hi)
    p.write_bytes(bytes(raw))
    _open_damaged("ptd-bytes", root, note, {p, root / "prog.pte"}, **kw)


@pytest.mark.parametrize("i, seed", _cases("pte-sequence"))
def test_a_damaged_sequence_file_is_refused_by_name_or_opens_consistently(workdir, i, seed):
    rng = random.Random(seed)
    root, kw = _pte_case(workdir, str(EXPORTS / "shared_state"))
    p = root / "sequence_generate.safetensors"
    raw = bytearray(p.read_bytes())
    header_end = 8 + int.from_bytes(raw[:8], "little")
    if rng.random() < 0.3:  # steps that parse but say something else
        steps = rng.choice(
            [
                "[]",
                '[{"method": "prefill"}]',
                '[{"method": "encode", "num_inputs": 1, "num_outputs": 1}]',
                '{"method": "prefill"}',
                '[{"method": "prefill", "num_inputs": "x", "num_outputs": 1}]',
                '[{"method": "decode", "num_inputs": 1, "num_outputs": 2}]',
            ]
        )
        text = raw[8:header_end].decode()
        start = text.index('"steps":"') + len('"steps":"')
        end = text.index('"', text.index("]", start) if "]" in text[start:] else start)
        new_text = (text[:start] + steps.replace('"', '\\"') + text[end:]).encode()
        raw = bytearray(len(new_text).to_bytes(8, "little") + new_text + raw[header_end:])
        note = f"sequence_generate.safetensors: steps {steps}"
    else:
        hi = header_end if rng.random() < 0.8 else len(raw)
        note = "sequence_generate.safetensors: " + _damage(rng, raw, 0, hi)
    p.write_bytes(bytes(raw))
    _open_damaged("pte-sequence", root, note, {p, root / "prog.pte", root / "aoti_cuda_blob.ptd"}, **kw)


@pytest.fixture(scope="module")
def pt2_files():
    from pt2_packages import packages

    return packages()


def _pt2_regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    import zipfile

    regions: dict[str, list[tuple[int, int]]] = {
        "directory": [],
        "header": [],
        "table": [],
        "config": [],
        "pickle": [],
        "data": [],
    }
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        first_dir = min(i.header_offset for i in z.infolist())
        cd = raw.rindex(b"PK\x01\x02", 0, raw.rindex(b"PK\x05\x06"))
        cd = raw.index(b"PK\x01\x02", first_dir)
        regions["directory"].append((cd, len(raw)))
        for info in z.infolist():
            h = info.header_offset
            start = (
                h + 30 + int.from_bytes(raw[h + 26 : h + 28], "little") + int.from_bytes(raw[h + 28 : h + 30], "little")
            )
            regions["header"].append((h, start))
            end = start + info.file_size
            if info.filename.endswith(".wrapper.cpp"):
                text = raw[start:end]
                j = text.find(b"constants_info_[0]")
                regions["table"].append((start + j, start + text.rfind(b"original_fqn") + 40))
            elif info.filename.endswith("weights_config.json"):
                regions["config"].append((start, end))
            elif "/data/weights/" in info.filename:
                k = raw.find(b"data.pkl", start, end)
                regions["pickle"].append((k, k + 300))
                regions["data"].append((start, end))
    return regions


@pytest.mark.parametrize("i, seed", _cases("pt2-bytes"))
def test_damaged_pt2_is_refused_by_name_or_opens_consistently(workdir, pt2_files, i, seed):
    rng = random.Random(seed)
    fmt = sorted(pt2_files)[i % len(pt2_files)]
    src = pt2_files[fmt]
    regions = _pt2_regions(src)
    kind = rng.choice([k for k, v in regions.items() if v] + ["directory", "header", "table"])
    lo, hi = rng.choice(regions[kind])
    root = workdir / f"case{next(_counter)}"
    root.mkdir()
    p = root / src.name
    raw = bytearray(src.read_bytes())
    if kind == "table" and rng.random() < 0.5:  # an edit that still parses: a digit of the table
        digits = [j for j in range(lo, hi) if 48 <= raw[j] <= 57]
        j = rng.choice(digits)
        raw[j] = rng.choice(b"0123456789")
        note = f"{fmt}.pt2: table digit at {j}"
    else:
        note = f"{fmt}.pt2 ({kind}): " + _damage(rng, raw, lo, hi)
    p.write_bytes(bytes(raw))
    _open_damaged("pt2-bytes", p, note, {p})


# ---------------------------------------------------------------- hostile shapes (issue 21, items 2 and 3)


class _Deadline(Exception):
    pass


def _within(seconds: float, what: str, call):
    """``call()``, failed (not hung) when it takes longer than ``seconds``: a blocking open of a
    FIFO is interrupted too (SIGALRM; PEP 475 lets the handler's exception through)."""
    import signal

    def expire(_sig, _frame):
        raise _Deadline(f"{what}: still running after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _linked_case(workdir: Path, folder: str) -> tuple[Path, dict]:
    """A case folder whose files link to the fixture's (cheap): a case replaces only what it changes."""
    src = FIXTURES / folder
    root = workdir / f"case{next(_counter)}"
    root.mkdir()
    for f in src.iterdir():
        (root / f.name).symlink_to(f)
    kw = {}
    if (src / "constant_table.json").is_file():
        kw["constant_table"] = json.loads((src / "constant_table.json").read_text())
    return root, kw


SIDE_KINDS = ("fifo", "folder", "/dev/zero", "/dev/null", "dangling link", "link to a fifo")


def _not_a_file(path: Path, kind: str) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind.startswith("/dev/"):
        path.symlink_to(kind)
    elif kind == "dangling link":
        path.symlink_to(path.parent / "nowhere")
    else:
        os.mkfifo(path.parent / "elsewhere.fifo")
        path.symlink_to(path.parent / "elsewhere.fifo")


@pytest.mark.parametrize("i, seed", _cases("side-file-types"))
def test_a_side_file_that_is_not_a_regular_file_is_refused_by_name_never_opened(workdir, i, seed):
    """A FIFO, folder, device or dangling link where a program's side file goes (a sequence file,
    the .ptd, a reference, the .pte itself): refused by name, or left out where the file is
    optional; never opened (a FIFO would block, /dev/zero read without end).  Every tenth case
    also goes through ``scan``'s worker function, which must return its rows."""
    from toolkit.workflows.scan import scan_program

    rng = random.Random(seed)
    folder = rng.choice(PTE_FIXTURES + [str(EXPORTS / "shared_state")] * 4)
    root, kw = _linked_case(workdir, folder)
    name = rng.choice(
        [
            "sequence_generate.safetensors",
            f"sequence_s{rng.randrange(100)}.safetensors",
            "aoti_cuda_blob.ptd",
            "reference_decode.safetensors",
            "reference_prefill.safetensors",
            "prog.pte",
        ]
    )
    kind = rng.choice(SIDE_KINDS)
    _not_a_file(root / name, kind)
    note = f"{Path(folder).name}/{name} is a {kind}"
    files = {root / f for f in os.listdir(root)}
    _within(CASE_SECONDS, note, lambda: _open_damaged("side-file-types", root, note, files, **kw))
    if i % 10 == 0 and not kw:
        rows = _within(CASE_SECONDS, note, lambda: scan_program(str(root), ["fingerprint"]))
        assert rows and all(r["path"] == str(root) for r in rows), (note, rows)


def _reference_internal_names(fqns):  # the quadratic rule as graph.allocate_non_dup_const_name states it
    import re

    taken, out = set(), []
    for fqn in fqns:
        prefix = name = re.sub(r"[^a-zA-Z0-9_]", "_", f"constant_{fqn}" if fqn[:1].isdigit() else fqn)
        n = 0
        while name in taken:
            name, n = f"{prefix}_{n}", n + 1
        taken.add(name)
        out.append(name)
    return out


def _many_methods_program(n: int):
    from toolkit.core.model import ConstantSpec, MethodSpec, Program
    from toolkit.core.vocab import ConstantKind

    c = ConstantSpec(
        name="w",
        fqn="w",
        kind=ConstantKind.PARAMETER,
        mutated=False,
        dtype="float32",
        shape=(4,),
        strides=(1,),
        storage_offset=0,
        nbytes=16,
        offset=0,
        digest="0" * 64,
        file="blob.bin",
    )
    return Program(
        name="many",
        description="",
        device="cpu",
        torch_version="2.13",
        created_utc="",
        methods=tuple(
            MethodSpec(
                name=f"m{k}",
                so_file=f"m{k}.so",
                blob_file="blob.bin",
                reference_file="",
                blob_bytes=16,
                num_inputs=1,
                num_outputs=1,
                constants=(c,) if k % 50 == 0 else (),
            )
            for k in range(n)
        ),
    )


def _rewrite_pt2(src: Path, dst: Path, edit) -> None:
    """``src`` with its generated wrapper source edited by ``edit(text) -> text`` (members stay stored)."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".wrapper.cpp"):
                data = edit(data.decode()).encode()
            zout.writestr(info, data)


def _log_size(rng: random.Random, lo: int, hi: int) -> int:
    import math

    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


PATHOLOGICAL = (
    "pt2 long line",
    "pt2 spaced dims",
    "pt2 declared counts",
    "fqn collisions",
    "many methods",
    "sparse ptd",
)


@pytest.mark.parametrize("i, seed", _cases("pathological-sizes"))
def test_pathological_sizes_take_time_linear_in_the_content(workdir, pt2_files, i, seed):
    """Inputs whose size makes a quadratic parser hang: a 600 KiB line in a ``.pt2``'s generated
    source, a shape of 200,000 spaces, 10^12 declared constants (or a count of 25 or 5,000
    digits), 40,000 FQNs with one internal name, 8,000 methods in a dry run, a ``.ptd`` with a hole
    of up to 8 GiB after its data (28 s and 8.3 GB of RSS, once).  Each is refused by
    name or opens, in time linear in its size (the bound allows 4-10x the linear cost; the
    quadratic code took 155 s, 210 s, and 13 s for 10,000 methods)."""
    import re

    from toolkit.sources.executorch import aoti_internal_names
    from toolkit.workflows.dry_run import dry_run

    rng = random.Random(seed)
    kind = PATHOLOGICAL[i % len(PATHOLOGICAL)]
    t0 = time.perf_counter()
    if kind.startswith("pt2"):
        src = pt2_files[sorted(pt2_files)[i % len(pt2_files)]]
        root = workdir / f"case{next(_counter)}"
        root.mkdir()
        p = root / src.name
        if kind == "pt2 long line":
            size = _log_size(rng, 1 << 10, 600 << 10)
            head = rng.choice(["constants_info_[0].name = x", "constants_info_[0].", "AOTInductorModelBase( 1, "])
            line = "// " + head * (size // len(head))  # no ';' ends it: no statement, nothing changes
            _rewrite_pt2(src, p, lambda t: t + "\n" + line + "\n")
        elif kind == "pt2 spaced dims":
            size = _log_size(rng, 1 << 10, 200_000)
            _rewrite_pt2(
                src,
                p,
                lambda t: re.sub(
                    r"(constants_info_\[0\]\.shape = )\{[^}]*\}",
                    lambda m: m.group(1) + "{" + " " * size + "x}",
                    t,
                    count=1,
                ),
            )
        else:
            size = 100
            count = rng.choice(["1000000000000", "9" * 25, "7" * 5000, str((1 << 20) + 1)])
            at = rng.randrange(3)

            def counts(t: str) -> str:
                def put(m):
                    groups = list(m.groups())
                    groups[at] = count
                    return "AOTInductorModelBase(" + ", ".join(groups) + ","

                return re.sub(r"AOTInductorModelBase\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,", put, t, count=1)

            _rewrite_pt2(src, p, counts)
        t0 = time.perf_counter()
        note = f"{src.name}: {kind}, {size}"
        _open_damaged("pathological-sizes", p, note, {p})
        if kind == "pt2 declared counts":
            with pytest.raises(ProgramError, match="at most"):
                open_program(p)
    elif kind == "sparse ptd":  # a hole after the data: nothing reads or hashes it
        size = _log_size(rng, 1 << 10, 8 << 30)
        folder = rng.choice([f for f in PTE_FIXTURES if (FIXTURES / f / "aoti_cuda_blob.ptd").is_file()])
        root, kw = _linked_case(workdir, folder)
        ptd = root / "aoti_cuda_blob.ptd"
        data = ptd.resolve().read_bytes()
        ptd.unlink()
        ptd.write_bytes(data)
        os.truncate(ptd, len(data) + size)
        t0 = time.perf_counter()
        _open_damaged("pathological-sizes", root, f"{folder}: {kind}, {size}", {ptd, root / "prog.pte"}, **kw)
        size = 0  # time bounded by the real content, not by the hole
    elif kind == "fqn collisions":
        size = _log_size(rng, 10, 40_000)
        alphabet = ".-/:"
        fqns = list(dict.fromkeys("w" + "".join(rng.choice(alphabet) for _ in range(12)) for _ in range(size)))
        t0 = time.perf_counter()
        names = aoti_internal_names(fqns)
        elapsed = time.perf_counter() - t0  # the reference below is the quadratic rule: not timed
        assert len(set(names)) == len(names) and names[0] == "w" + "_" * 12
        if len(fqns) <= 2000:
            assert names == _reference_internal_names(fqns)
        OUTCOMES.setdefault("pathological-sizes", Counter())["fqn collisions named"] += 1
    else:
        size = _log_size(rng, 10, 8_000)
        program = _many_methods_program(size)
        t0 = time.perf_counter()
        a = dry_run(program, rng.choice(POLICIES))
        assert len(a.session.verdict().methods) == size
        OUTCOMES.setdefault("pathological-sizes", Counter())["many methods: dry run " + str(a.status)] += 1
    dt = elapsed if kind == "fqn collisions" else time.perf_counter() - t0
    per_unit = {
        "pt2 long line": 2e-6,
        "pt2 spaced dims": 2e-6,
        "pt2 declared counts": 0,
        "fqn collisions": 2e-5,
        "many methods": 2e-4,
        "sparse ptd": 0,
    }[kind]
    assert dt < 1.0 + size * per_unit, f"{kind} of size {size} took {dt:.2f} s"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


NESTED_PLACES = ("sequence header", "sequence steps", "pt2 metadata", "pt2 weights config", "manifest")


@pytest.mark.parametrize("i, seed", _cases("deep-nesting"))
def test_deep_nesting_is_refused_by_name_never_a_recursion_error(workdir, pt2_files, i, seed):
    """JSON nested up to 200,000 deep wherever a program holds JSON: a sequence file's header or
    its steps, a ``.pt2``'s metadata or weights config, a manifest.  Refused by name (or, shallow,
    read as usual): never a RecursionError."""
    import struct
    import zipfile

    from toolkit.core.errors import ManifestError
    from toolkit.sources.directory import read_manifest_file

    rng = random.Random(seed)
    place = NESTED_PLACES[i % len(NESTED_PLACES)]
    depth = _log_size(rng, 10, 200_000)
    note = f"{place} nested {depth} deep"
    if place.startswith("sequence"):
        root, kw = _linked_case(workdir, str(EXPORTS / "shared_state"))
        p = root / "sequence_generate.safetensors"
        raw = p.resolve().read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        if place == "sequence header":
            text = json.dumps(header)[:-1] + ', "deep": ' + _nested(depth) + "}"
        else:
            header["__metadata__"]["steps"] = _nested(depth)
            text = json.dumps(header)
        p.unlink()
        p.write_bytes(struct.pack("<Q", len(text)) + text.encode() + raw[8 + n :])
        _open_damaged("deep-nesting", root, note, {root / f for f in os.listdir(root)}, **kw)
    elif place.startswith("pt2"):
        src = pt2_files["pickle_weights" if place == "pt2 weights config" else sorted(pt2_files)[i % 2]]
        p = workdir / f"case{next(_counter)}.pt2"
        suffix = "weights_config.json" if place == "pt2 weights config" else ".wrapper_metadata.json"
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                data = zin.read(info)
                zout.writestr(info, _nested(depth).encode() if info.filename.endswith(suffix) else data)
        _open_damaged("deep-nesting", p, note, {p})
    else:
        p = workdir / f"case{next(_counter)}" / MANIFEST_FILE
        p.parent.mkdir()
        p.write_text('{"format": "constshare-program", "methods": ' + _nested(depth) + "}")
        with pytest.raises(ManifestError) as e:
            read_manifest_file(p)
        assert e.value.path == str(p), note
        OUTCOMES.setdefault("deep-nesting", Counter())["manifest refused"] += 1
