"""Issue 38, item 3: a ``constant_table.json`` cannot move a constant outside its method's blob.

Generations 1 and 2 keep the constant table inside the ``.so``, which a dry run never opens: the
table beside the ``.pte`` (or ``--constant-table``) is the caller's copy, checked as untrusted input
(``toolkit/sources/executorch/table_schema.py`` and ``constant_table.blob_constants``).  A seeded
generator mutates the real tables (the 1.2.0 exports and ``synthetic-gen2``) and opens the program
with each.  Every case ends one of three ways, and never in any other exception:

* ``refuse``: a ProgramError naming the table file and the field at fault;
* ``same``: a harmless change (key or method order, an offset or default spelt out, an unused
  method) opens to the very same program model and dry-run verdict;
* ``either``: a claim only the ``.so`` could contradict (a kind, a name, the order of equal-size
  rows) is refused or opens; opened, every constant reads bytes of its own method's blob.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import time
from collections import Counter
from pathlib import Path

import executorch_fixtures as et
import pytest

from toolkit.core.errors import ProgramError
from toolkit.core.policies import POLICIES
from toolkit.sources import open_program
from toolkit.sources.executorch import AotiConstant
from toolkit.workflows.dry_run import dry_run

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GEN1 = et.unpacked("1.2.0")
FOLDERS = sorted(p.parent for p in GEN1.glob("*/constant_table.json")) + [FIXTURES / "synthetic-gen2"]
TABLE = "constant_table.json"
CASES = 360
SEED = 38_003
BAD_NUMBERS = ["0", "16", [0], [], {}, True, False, 1.0, 0.5, None, float("nan"), float("inf"), -1, -(1 << 40)]
HUGE_NUMBERS = [1 << 63, 1 << 64, 10**30]
OUTCOMES: dict[str, Counter] = {}


# ------------------------------------------------------------------ the originals


class Base:
    """A fixture opened with its own table: the model, its bytes and its verdict per policy (computed once)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.table = json.loads((folder / TABLE).read_text())
        self.program = open_program(folder / "prog.pte", constant_table=str(folder / TABLE))
        self.data = {rel: self.program.path(rel).read_bytes() for rel in self.program.files}
        self.verdicts: dict[str, tuple] = {}
        # each row's offset in its blob under AOTInductor's layout rule, as the original opened it
        self.offsets = {
            m.name: [c.offset - m.location.weights.offset for c in m.constants] for m in self.program.methods
        }

    def verdict(self, program, policy: str) -> tuple:
        v = dry_run(program, policy).verdict
        return int(v.exit_code), tuple((m.method, str(m.outcome)) for m in v.methods)

    def base_verdict(self, policy: str) -> tuple:
        if policy not in self.verdicts:
            self.verdicts[policy] = self.verdict(self.program, policy)
        return self.verdicts[policy]


_BASES: dict[Path, Base] = {}


def base(folder: Path) -> Base:
    if folder not in _BASES:
        _BASES[folder] = Base(folder)
    return _BASES[folder]


# ------------------------------------------------------------------ the mutations
# Each takes (rng, table, base) and returns (the table, or the file's text; expectation; note).


def _row(rng, table, b, *, nonempty=True):
    """(method, index, row) of a random row of a method that has rows."""
    methods = [m for m in table if table[m]] if nonempty else list(table)
    m = rng.choice(methods)
    i = rng.randrange(len(table[m]))
    return m, i, table[m][i]


def _other_method(rng, table, m):
    others = [o for o in table if o != m]
    return rng.choice(others) if others else None


def harmless(rng, table, b):
    kind = rng.randrange(6)
    if kind == 0:  # keys of every row in another order
        for m in table:
            table[m] = [dict(rng.sample(sorted(r.items()), len(r))) for r in table[m]]
        return table, "same", "row keys reordered"
    if kind == 1:  # methods in another order
        return dict(rng.sample(sorted(table.items()), len(table))), "same", "methods reordered"
    if kind == 2:  # offsets spelt out as the layout rule places them
        for m in table:
            for i, r in enumerate(table[m]):
                if rng.random() < 0.6:
                    r["offset"] = b.offsets[m][i]
        return table, "same", "offsets spelt out"
    if kind == 3:  # defaults spelt out
        for m in table:
            for r in table[m]:
                r.setdefault("storage_offset", 0)
                r.setdefault("kind", "parameter")
                r.setdefault("mutated", False)
        return table, "same", "defaults spelt out"
    if kind == 4:  # an entry for a method the program does not have
        name = rng.choice(["unused", "méthode_ünïcode", "日本語", "x" * 300])
        table[name] = copy.deepcopy(table[rng.choice(sorted(table))])
        return table, "same", f"extra method {name[:20]!r}"
    return json.dumps(table, indent=rng.choice([None, 0, 4]), sort_keys=rng.random() < 0.5), "same", "reformatted"


def numeric_field(rng, table, b):
    m, i, r = _row(rng, table, b)
    field = rng.choice(["offset", "data_size", "storage_offset"])
    value = rng.choice(BAD_NUMBERS + HUGE_NUMBERS)
    r[field] = value
    # a null offset or data_size asks for the default: a claim; every other value is malformed or out of range
    expect = "either" if value is None and field in ("offset", "data_size") else "refuse"
    return table, expect, f"{m}[{i}].{field} = {value!r}"


def dims_field(rng, table, b):
    m, i, r = _row(rng, table, b)
    field = rng.choice(["shape", "strides"])
    kind = rng.randrange(5)
    if kind == 0 and r[field]:  # one element of another type, or negative, or huge
        j = rng.randrange(len(r[field]))
        value = rng.choice([v for v in BAD_NUMBERS + HUGE_NUMBERS if not isinstance(v, int) or v < 0 or v >= 1 << 63])
        r[field][j] = value
        return table, "refuse", f"{m}[{i}].{field}[{j}] = {value!r}"
    if kind == 1:  # the field itself of another type
        value = rng.choice(["64", 64, None, {}, [[64]], True, "[64, 1]"])
        r[field] = value
        return table, "refuse", f"{m}[{i}].{field} = {value!r}"
    if kind == 2:  # one rank more or less on one side
        r[field] = r[field] + [1] if rng.random() < 0.5 or not r[field] else r[field][:-1]
        return table, "refuse", f"{m}[{i}].{field} rank changed"
    if kind == 3:  # more dimensions than any tensor has
        r["shape"], r["strides"] = [1] * 65, [1] * 65
        return table, "refuse", f"{m}[{i}] of rank 65"
    # another layout of the same rank: refused when it reads past its storage, else a claim
    if not r[field]:
        r[field] = [rng.randrange(4)]
        return table, "refuse", f"{m}[{i}].{field} rank changed"
    j = rng.randrange(len(r[field]))
    r[field][j] = rng.choice([0, 1, r[field][j] * 2 + 1, r[field][j] // 2])
    return table, "either", f"{m}[{i}].{field}[{j}] = {r[field][j]}"


def text_field(rng, table, b):
    m, i, r = _row(rng, table, b)
    field = rng.choice(["name", "fqn", "dtype", "kind", "mutated"])
    bad = {
        "name": [1, None, [], True, "", "\ud800", {"a": 1}],
        "fqn": [1, None, [], False, "lin\udfff.weight", 2.5],
        "dtype": ["float33", "Float32", "", 1, None, ["float32"], "torch.float32"],
        "kind": ["weight", "PARAMETER", 1, None, True, ""],
        "mutated": [0, 1, "true", None, "false", 1.0],
    }[field]
    claim = {
        "name": ["lin_weight_renamed", "ünïcödé_name", "名前", "a" * 500, "x\u200by", "zero\u2028line"],
        "fqn": ["", "renamed.weight", "ünïcödé.fqn", "fqn with spaces", "e\u0301", "<script>"],
        "dtype": ["float16", "int32", "uint8", "float64", "bfloat16"],
        "kind": ["parameter", "buffer", "lifted_constant"],
        "mutated": [True, False],
    }[field]
    if rng.random() < 0.6:
        value = rng.choice(bad)
        r[field] = value
        return table, "refuse", f"{m}[{i}].{field} = {value!r}"
    value = rng.choice(claim)
    r[field] = value
    return table, "either", f"{m}[{i}].{field} = {value!r}"


def fields_changed(rng, table, b):
    m, i, r = _row(rng, table, b)
    kind = rng.randrange(4)
    if kind == 0:
        field = rng.choice(["name", "fqn", "dtype", "shape", "strides"])
        del r[field]
        return table, "refuse", f"{m}[{i}] without {field}"
    if kind == 1:
        field = rng.choice([f for f in ("storage_offset", "kind", "mutated", "data_size") if f in r] or ["kind"])
        r.pop(field, None)
        return table, "either", f"{m}[{i}] without {field} (its default)"
    if kind == 2:
        field = rng.choice(["ofset", "nbytes", "digest", "file", "so_key", "storage", "", "Offset"])
        r[field] = rng.choice([0, "x", None])
        return table, "refuse", f"{m}[{i}] with unknown field {field!r}"
    # a field given twice: JSON keeps the last silently, the table is refused
    field = rng.choice(["offset", "name", "data_size"])
    r["__twice__"] = 0
    text = json.dumps(table).replace('"__twice__": 0', f'"{field}": 0, "{field}": {rng.choice([-16, 0, 1 << 20])}')
    return text, "refuse", f"{m}[{i}].{field} given twice"


def offsets(rng, table, b):
    m, i, r = _row(rng, table, b)
    blob = b.program.method(m).location.weights
    size = r.get("data_size") or (b.program.method(m).constants[i].nbytes)
    kind = rng.randrange(8)
    if kind == 0:  # at another method's blob, reached from this one's start
        o = _other_method(rng, table, m)
        other = b.program.method(o).location.weights
        r["offset"] = other.offset - blob.offset
        expect = "same" if r["offset"] == b.offsets[m][i] else "refuse"  # an empty blob where this one starts
        return table, expect, f"{m}[{i}].offset into {o}'s blob ({r['offset']})"
    if kind == 1:  # the case: before the blob, with a storage large enough to end inside it
        r["offset"] = -rng.choice([1, 64, blob.offset, blob.size])
        r["data_size"] = size - r["offset"]
        return table, "refuse", f"{m}[{i}].offset = {r['offset']}, data_size {r['data_size']}"
    if kind == 2:  # at or past the end
        r["offset"] = blob.size + rng.choice([0, 1, 64, 1 << 32]) - rng.choice([0, 1]) * min(size, blob.size) // 2
        return table, "refuse", f"{m}[{i}].offset = {r['offset']} of {blob.size}"
    if kind == 3 and len(table[m]) > 1:  # onto another row's slot
        j = rng.choice([j for j in range(len(table[m])) if j != i])
        r["offset"] = b.offsets[m][j]
        return table, "refuse", f"{m}[{i}].offset onto row {j}"
    if kind == 4:  # shifted by a few bytes
        r["offset"] = b.offsets[m][i] + rng.choice([-64, -4, -1, 1, 4, 64])
        return table, "refuse", f"{m}[{i}].offset = {r['offset']} (layout {b.offsets[m][i]})"
    if kind == 5:  # a storage of another size
        r["data_size"] = size + rng.choice([-size // 2 or -1, -1, 1, 64, size])
        return table, "refuse", f"{m}[{i}].data_size = {r['data_size']} (was {size})"
    if kind == 6:  # two rows of one size trade places: only the .so knows which is which
        same = [j for j, s in enumerate(table[m]) if j != i and b.program.method(m).constants[j].nbytes == size]
        if same and "data_size" in r:
            j = rng.choice(same)
            for k, row in enumerate(table[m]):
                row["offset"] = b.offsets[m][k]
            r["offset"], table[m][j]["offset"] = b.offsets[m][j], b.offsets[m][i]
            return table, "either", f"{m}[{i}] and [{j}] trade offsets"
    # every offset of the method spelt out, then one row moved to where another method's rows start
    for j, row in enumerate(table[m]):
        row["offset"] = b.offsets[m][j]
    r["offset"] = rng.choice([-1, -blob.offset, blob.size, 2 * blob.size])
    return table, "refuse", f"{m}[{i}].offset = {r['offset']} with the others spelt out"


def rows_changed(rng, table, b):
    kind = rng.randrange(7)
    m, i, r = _row(rng, table, b)
    if kind == 0:
        del table[m][i]
        return table, "refuse", f"{m}[{i}] dropped"
    if kind == 1:
        table[m].append(copy.deepcopy(r))
        return table, "refuse", f"{m}[{i}] twice"
    if kind == 2:
        rng.shuffle(table[m])  # the layout follows the rows' order: equal sizes trade places, others do not fit
        return table, "either", f"{m} rows shuffled"
    if kind == 3:
        o = _other_method(rng, table, m)
        if o is not None:
            table[m], table[o] = table[o], table[m]
            return table, "either", f"{m} and {o} swapped"
        return table, "same", "nothing to swap"
    if kind == 4:
        table[m] = rng.choice([{}, "lin_weight", 5, None, [[]], [None], [1], ["row"], [[1, 2]], True])
        return table, "refuse", f"{m} rows = {table[m]!r}"
    if kind == 5:
        del table[m]
        return table, "refuse", f"{m} missing"
    o = _other_method(rng, table, m)
    if o is not None:  # another method's row: its name or FQN is this method's already, or it lays out wrong
        table[m].append(copy.deepcopy(rng.choice(table[o] or [r])))
        return table, "refuse", f"{m} with a row of {o}"
    table[m][i]["__x__"] = 1
    return table, "refuse", f"{m}[{i}] with an unknown field"


def whole(rng, table, b):
    kind = rng.randrange(7)
    text = json.dumps(table)
    if kind == 0:
        return rng.choice(["[]", '"table"', "5", "null", "{}", "true"]), "refuse", "not an object of methods"
    if kind == 1:
        return text[: rng.randrange(1, len(text))], "refuse", "cut short"
    if kind == 2:
        return "[" * 100_000 + "]" * 100_000, "refuse", "nested 100000 deep"
    if kind == 3:
        m = rng.choice(sorted(table))
        return text.replace(f'"{m}": ', f'"{m}": [], "{m}": ', 1), "refuse", f"method {m} given twice"
    if kind == 4:
        m, i, r = _row(rng, table, b)
        r["offset"] = 0
        return json.dumps(table).replace('"offset": 0', '"offset": ' + "9" * 5000), "refuse", "a 5000-digit offset"
    if kind == 5:
        return text.encode("utf-8").replace(b'"', b'"\xff', 1).decode("latin-1"), "refuse", "not UTF-8"
    return text.replace("{", "{\n// comment\n", 1), "refuse", "a comment"


MUTATIONS = [harmless, numeric_field, dims_field, text_field, fields_changed, offsets, rows_changed, whole]


def _cases():
    return [(i, SEED + i) for i in range(CASES)]


# ------------------------------------------------------------------ the checks


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("tables")


def _accepted_within_blobs(b: Base, program, note: str) -> None:
    """Opened: every method keeps its blob, and every constant reads bytes of that blob, as its digest says."""
    blobs = {m.name: m.location.weights for m in b.program.methods}
    where = {m: (r.file, r.offset, r.size) for m, r in blobs.items()}  # two keys may name the same bytes
    assert [m.name for m in program.methods] == [m.name for m in b.program.methods], note
    for m in program.methods:
        blob = m.location.weights
        assert blob == blobs[m.name], (note, m.name)
        for c in m.constants:
            assert c.file == blob.file and blob.offset <= c.offset <= c.offset + c.nbytes <= blob.offset + blob.size, (
                note,
                m.name,
                c.name,
            )
            data = b.data[c.file][c.offset : c.offset + c.nbytes]
            assert len(data) == c.nbytes and hashlib.sha256(data).hexdigest() == c.digest, (note, m.name, c.name)
            for o, other in blobs.items():  # never another method's bytes (a blob two methods share is both's)
                if o != m.name and where[o] != where[m.name] and other.file == c.file and c.nbytes:
                    assert c.offset + c.nbytes <= other.offset or other.offset + other.size <= c.offset, (note, o)


@pytest.mark.parametrize("i, seed", _cases())
def test_a_mutated_table_is_refused_by_field_or_opens_within_its_blobs(workdir, i, seed):
    rng = random.Random(seed)
    b = base(FOLDERS[i % len(FOLDERS)])
    mutate = MUTATIONS[i % len(MUTATIONS)] if i < 2 * len(MUTATIONS) else rng.choice(MUTATIONS)
    table, expect, note = mutate(rng, copy.deepcopy(b.table), b)
    path = workdir / f"case{i}-{TABLE}"
    if isinstance(table, str):
        path.write_bytes(table.encode("latin-1") if note == "not UTF-8" else table.encode("utf-8", "surrogatepass"))
    else:
        path.write_bytes(json.dumps(table).encode("utf-8", "surrogatepass"))
    policy = POLICIES[rng.randrange(len(POLICIES))]
    note = f"{b.folder.name}: {note}"
    t0 = time.perf_counter()
    try:
        program = open_program(b.folder / "prog.pte", constant_table=str(path))
    except ProgramError as e:
        assert expect in ("refuse", "either"), f"{note}: refused a harmless change: {e}"
        assert e.path == str(path), f"{note}: {e}"
        # a file that is not JSON at all has no field to name; everything else names the table's field
        assert e.field or "cannot be read" in str(e), f"{note}: {e}"
        assert e.field is None or e.field.startswith("constant_table"), f"{note}: {e}"
        outcome = "refused"
    except Exception as e:  # noqa: BLE001 (any other type is the failure this test is for)
        raise AssertionError(f"{note}: {type(e).__name__}: {e}") from e
    else:
        assert expect != "refuse", f"{note}: accepted"
        _accepted_within_blobs(b, program, note)
        got = b.verdict(program, policy)
        if expect == "same":
            assert program == b.program, note
            assert got == b.base_verdict(policy), note
        outcome = "opened, same verdict" if got == b.base_verdict(policy) else "opened, another verdict"
    assert time.perf_counter() - t0 < 5, note
    OUTCOMES.setdefault(expect, Counter())[outcome] += 1


def test_every_kind_of_mutation_was_seen():
    """Runs after the cases (file order): the generator reached each expectation and each outcome."""
    if sum(sum(c.values()) for c in OUTCOMES.values()) < CASES:
        pytest.skip("run with the cases (the whole file)")
    assert OUTCOMES["refuse"]["refused"] >= 150, OUTCOMES
    assert OUTCOMES["same"]["opened, same verdict"] >= 20, OUTCOMES
    assert OUTCOMES["either"]["refused"] and sum(OUTCOMES["either"].values()) >= 20, OUTCOMES


# ------------------------------------------------------------------ the cases of the issue


def _exploit(table: dict, b: Base) -> dict:
    """decode's constant moved onto prefill's bytes: an offset before its blob, a storage long enough to end in it."""
    dec, pre = b.program.method("decode").location.weights, b.program.method("prefill").location.weights
    row = table["decode"][0]
    row["offset"] = pre.offset - dec.offset
    row["data_size"] = row["data_size"] - row["offset"]
    return table


def test_pointing_a_constant_at_another_methods_bytes_is_refused(tmp_path):
    # total_collision runs wrong under name-only (its two methods' constants differ): the dry run exits 1
    b = base(GEN1 / "total_collision")
    assert b.base_verdict("name-only")[0] == 1
    path = tmp_path / TABLE
    path.write_text(json.dumps(_exploit(copy.deepcopy(b.table), b)))
    with pytest.raises(ProgramError, match="greater than or equal to 0") as e:
        open_program(b.folder / "prog.pte", constant_table=str(path))  # opened with exit 0 before
    assert e.value.path == str(path) and e.value.field == "constant_table['decode'][0].offset"


@pytest.mark.parametrize(
    "value, match",
    [
        ("16", "valid integer, got '16'"),
        ([16], "valid integer, got \\[16\\]"),
        (True, "valid integer, got True"),
        (16.0, "valid integer, got 16.0"),
        (-16, "greater than or equal to 0"),
        (1 << 64, "less than 9223372036854775808"),
    ],
)
def test_an_offset_of_another_type_or_range_names_its_field(tmp_path, value, match):
    b = base(GEN1 / "shared_ok")
    table = copy.deepcopy(b.table)
    table["prefill"][1]["offset"] = value
    (tmp_path / TABLE).write_text(json.dumps(table))
    with pytest.raises(ProgramError, match=match) as e:  # a TypeError before
        open_program(b.folder / "prog.pte", constant_table=str(tmp_path / TABLE))
    assert e.value.path == str(tmp_path / TABLE) and e.value.field == "constant_table['prefill'][1].offset"


def test_strides_that_are_not_integers_name_their_field(tmp_path):
    b = base(GEN1 / "shared_ok")
    table = copy.deepcopy(b.table)
    table["decode"][0]["strides"] = [64.5, 1]
    (tmp_path / TABLE).write_text(json.dumps(table))
    with pytest.raises(ProgramError, match="valid integer") as e:
        open_program(b.folder / "prog.pte", constant_table=str(tmp_path / TABLE))
    assert e.value.field == "constant_table['decode'][0].strides[0]"


def test_overlapping_slots_are_refused_unless_they_are_one_view(tmp_path):
    b = base(GEN1 / "shared_ok")
    table = copy.deepcopy(b.table)
    for m in table:
        for i, r in enumerate(table[m]):
            r["offset"] = b.offsets[m][i]
    table["prefill"][2]["offset"] = b.offsets["prefill"][0]  # the same size and view as row 0: a gap is left
    (tmp_path / TABLE).write_text(json.dumps(table))
    with pytest.raises(ProgramError, match="to no constant|lays out") as e:
        open_program(b.folder / "prog.pte", constant_table=str(tmp_path / TABLE))
    assert e.value.field.startswith("constant_table['prefill']")
    table["prefill"][2]["offset"] = b.offsets["prefill"][2] - 64  # into row 1's slot
    (tmp_path / TABLE).write_text(json.dumps(table))
    with pytest.raises(ProgramError, match="overlaps the slot of constant") as e:
        open_program(b.folder / "prog.pte", constant_table=str(tmp_path / TABLE))
    assert e.value.field == "constant_table['prefill'][2].offset"


def test_a_table_given_in_python_is_checked_the_same_and_named_by_the_pte():
    b = base(GEN1 / "total_collision")
    rows = {
        m: [AotiConstant(**{**r, "shape": tuple(r["shape"]), "strides": tuple(r["strides"])}) for r in rs]
        for m, rs in _exploit(copy.deepcopy(b.table), b).items()
    }
    with pytest.raises(ProgramError, match="greater than or equal to 0") as e:
        open_program(b.folder / "prog.pte", constant_table=rows)
    assert e.value.path == str(b.folder / "prog.pte") and e.value.field == "constant_table['decode'][0].offset"
    with pytest.raises(ProgramError, match="valid integer") as e:
        open_program(b.folder / "prog.pte", constant_table=lambda m, so: [{**b.table[m][0], "data_size": "16384"}])
    assert e.value.field == "constant_table['decode'][0].data_size"


def test_names_are_unique_per_method(tmp_path):
    b = base(GEN1 / "shared_ok")
    table = copy.deepcopy(b.table)
    table["decode"][2]["name"] = table["decode"][0]["name"]
    (tmp_path / TABLE).write_text(json.dumps(table))
    with pytest.raises(ProgramError, match="is also row 0's") as e:
        open_program(b.folder / "prog.pte", constant_table=str(tmp_path / TABLE))
    assert e.value.field == "constant_table['decode'][2].name"


def test_methods_blobs_overlap_only_when_they_are_the_same_bytes():
    from types import SimpleNamespace

    from toolkit.core.model import Region
    from toolkit.sources.executorch.constant_table import ConstantTable

    files = {"aoti_cuda_blob.ptd": SimpleNamespace(path=Path("aoti_cuda_blob.ptd"))}
    t = ConstantTable(None, Path("."), Path("prog.pte"))
    t.claim("prefill", Region("aoti_cuda_blob.ptd", 256, 1024, "prefill_weights_blob"), files)
    t.claim("decode", Region("aoti_cuda_blob.ptd", 256, 1024, "decode_weights_blob"), files)  # one blob, two keys
    t.claim("other", Region("aoti_cuda_blob.ptd", 1280, 64, "other_weights_blob"), files)
    with pytest.raises(ProgramError, match="overlaps method 'prefill'") as e:
        t.claim("probe", Region("aoti_cuda_blob.ptd", 512, 1024, "probe_weights_blob"), files)
    assert e.value.field == "named_data['probe_weights_blob']"
