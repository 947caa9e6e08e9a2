"""Hostile names in every report: what no file format holds, what nobody can see, what looks like another name.

Names, paths and errors come from programs and folders, which may be hostile.  Two seeded families of
generated cases (deterministic), each pushed through every writer:

- ``report-formats`` (:data:`FAMILIES`): names built from random mixes of C0 and C1 controls, lone
  surrogates, non-characters, line breaks (``\\n``, ``\\r``, U+0085, U+2028, U+2029), bidi controls,
  zero-width characters, combining marks, homoglyphs, markup, formula triggers and backslash escapes, as a
  program's label and path, a method, a constant's name and FQN, an error: the JUnit XML parses back
  (xml.etree) and names each method as it is; the CSV reads back into the exact text; the HTML holds no raw
  control, invisible character or markup of a name; the Excel workbook (openpyxl) reads back; the CLI
  prints one line per row and one per headline.
- ``invisible-pairs``: two FQNs that differ only in invisible characters, NFC/NFD, homoglyphs or
  compatibility forms: shown apart (in ASCII) in the CSV, the HTML table, the CLI and the JUnit XML, and
  the CSV still reads back into the exact names.

End to end, on synthetic programs (no compiling): ``scan`` of a folder holding names that are not UTF-8,
links out of the folder (a manifest.json, a .pte, a .pt2, a .pte's .ptd, a FIFO) and names holding
newlines; ``report`` of programs with generated hostile names; a ``.pt2`` whose constant names spell lone
surrogates; a 40,000-character Excel cell.
"""

from __future__ import annotations

import contextlib
import csv
import html
import io
import json
import os
import random
import re
import shutil
import unicodedata
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from conftest import require

from toolkit.core.verdict import ConstantFinding, MethodVerdict, Verdict
from toolkit.core.vocab import BlameStatus, DataProblem, MethodOutcome
from toolkit.display.cells import unescape_text
from toolkit.display.tables import html_table
from toolkit.reports.html import html_report
from toolkit.reports.junit import junit_xml
from toolkit.reports.tabular import FORMULA_TRIGGERS, unneutralize, write_table, write_workbook

FAMILIES = {"report-formats": 360, "invisible-pairs": 400, "report-end-to-end": 12}
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# what a generated name is made of; the kinds before "combining" are what must never reach a report raw
PIECES = {
    "c0": [chr(i) for i in range(0x20)] + ["\x7f"],
    "c1": [chr(i) for i in range(0x80, 0xA0)],
    "surrogate": ["\ud800", "\udbff", "\udc00", "\udfff", "\udcff", "\ud83d"],
    "non-character": ["\ufffe", "\uffff", "\ufdd0", "\ufdef", "\U0001fffe", "\U0010ffff"],
    "line break": ["\n", "\r", "\r\n", "\x85", "\u2028", "\u2029", "\x0b", "\x0c"],
    "bidi": [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)), "\u200e", "\u200f", "\u061c"],
    "zero-width": ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u034f", "\u180e", "\u3164"],
    "spaces": ["\u00a0", "\u2007", "\u202f", "\u3000", "\ufe0f", "\U000e0041", "\U000e0100", "\u2800"],
    "combining": ["\u0301", "\u0308", "\u0327", "\u20dd"],
    "homoglyph": ["а", "е", "о", "р", "с", "ο", "ν", "ı", "ｗ", "𝐰"],
    "markup": ["<script>alert(1)</script>", "<i>x</i>", "&amp;", '"', "'", "]]>", "<!--", "-->"],
    "formula": ["=1+1", "+", "-", "@SUM(1)"],
    "backslash": ["\\", "\\u200b", "\\x41", "\\U0001f600", "\\\\", "\\n", "\\x5c"],
    "text": ["layers.0.weight", "lin", "Gewichte.Ü", "自注意力", "🙂", " ", "_", "."],
}
HOSTILE_KINDS = ("c0", "c1", "surrogate", "non-character", "line break", "bidi", "zero-width", "spaces")
NEVER_RAW = frozenset(c for kind in HOSTILE_KINDS for piece in PIECES[kind] for c in piece)
KEPT_IN_CSV = frozenset("\t\n\r")  # a quoted CSV cell holds them (a spreadsheet shows a line break)


def _cases(family: str):
    return [pytest.param(i, id=f"{family}-{i}") for i in range(FAMILIES[family])]


def hostile_name(rng: random.Random, *, surrogates: bool = True) -> str:
    """One to six pieces, the first of a hostile kind."""
    kinds = [k for k in PIECES if surrogates or k != "surrogate"]
    hostile = [k for k in HOSTILE_KINDS if surrogates or k != "surrogate"]
    pieces = [rng.choice(PIECES[rng.choice(hostile)])]
    pieces += [rng.choice(PIECES[rng.choice(kinds)]) for _ in range(rng.randint(0, 5))]
    rng.shuffle(pieces)
    return "".join(pieces)


def unescaped(cell: str) -> str:
    """A CSV or Excel text cell as the text it was written from."""
    return unescape_text(unneutralize(cell))


def raw_hidden(text: str, allowed: frozenset[str] = frozenset()) -> list[str]:
    """The characters of ``text`` no report may hold raw: the generated hostile ones, and any control,
    format character, surrogate, unassigned code point or separator that Unicode itself names."""
    return [
        c
        for c in text
        if c not in allowed
        and (
            c in NEVER_RAW
            or unicodedata.category(c) in ("Cc", "Cf", "Cs", "Cn", "Zl", "Zp")
            or c.isspace()
            and c != " "
        )
    ]


def verdict_of(program: str, method: str, other: str, name: str, fqn: str, error: str) -> Verdict:
    """A verdict whose method ``method`` runs on other data for constant ``name`` (``fqn``), ``other`` ok."""
    return Verdict(
        program=program,
        policy="name-only",
        predicted=True,
        methods=(
            MethodVerdict(method, MethodOutcome.WRONG, reason=error),
            MethodVerdict(other, MethodOutcome.OK),
        ),
        constants=(
            ConstantFinding(
                method,
                name,
                fqn,
                DataProblem.CONTENT_DIFFERS,
                evidence=error,
                shared_from=f"{other}/{name}",
                blame=BlameStatus.CULPRIT,
                blame_note=error,
            ),
        ),
    )


def printed(call) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    return out.getvalue()


# ------------------------------------------------------------------ report-formats


@pytest.mark.parametrize("i", _cases("report-formats"))
def test_hostile_names_cost_no_report_and_read_back(i):
    rng = random.Random(f"report-formats-{i}")
    program, label, path, method, name, fqn, error = (hostile_name(rng) for _ in range(7))
    other = method + "\u200b" if rng.random() < 0.5 else hostile_name(rng)  # a look-alike of method, half the time
    if other == method:
        other += "2"
    v = verdict_of(program, method, other, name, fqn, error)

    # JUnit: well-formed XML 1.0, each method named as it is (escaped), nothing hidden raw
    xml = junit_xml([v], labels=[label], unreadable={path: error})
    root = ET.fromstring(xml.encode("utf-8"))
    values = [x for e in root.iter() for x in (*e.attrib.values(), (e.text or "").strip())]
    assert not [raw_hidden(x) for x in values if raw_hidden(x)]
    cases = {unescape_text(c.get("name")) for c in root.iter("testcase")}
    assert {method, other} <= cases
    suites = [unescape_text(s.get("name")) for s in root.iter("testsuite")]
    assert suites == [path, f"{label} under name-only"]
    assert len(root.findall(".//failure")) == 1 and len(root.findall(".//error")) == 1

    # CSV: UTF-8, one row per record, no formula, each cell back to the exact text
    frame = pd.DataFrame(
        {
            "program": [program, label],
            "method": [method, other],
            "name": [name, name],
            "fqn": [fqn, fqn],
            "error": [error, path],
        }
    )
    buf = io.StringIO()
    write_table(frame, buf)
    text = buf.getvalue()
    text.encode("utf-8")  # no lone surrogate
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert len(rows) == 3 and all(len(r) == 5 for r in rows)
    for row, original in zip(rows[1:], frame.itertuples(index=False, name=None)):
        assert [unescaped(c) for c in row] == list(original)
        assert not any(c.startswith(FORMULA_TRIGGERS) for c in row)
        assert not [raw_hidden(c, KEPT_IN_CSV) for c in row if raw_hidden(c, KEPT_IN_CSV)]

    # HTML: UTF-8, no raw control or invisible character (tab and newline are whitespace), no markup of a name
    if i % 3 == 0:  # the whole page, a third of the cases (it renders three tables)
        page = html_report([v], labels=[label], unreadable={path: error}, title=f"scan of {path}")
    else:
        page = html_table(frame, max_rows=2)
    page.encode("utf-8")
    assert not raw_hidden(page, frozenset("\t\n")), raw_hidden(page, frozenset("\t\n"))[:5]
    assert "<script" not in page and "<i>x" not in page and "<!--" not in page

    # Excel: reads back into the exact texts
    if i % 4 == 0:
        openpyxl = require("openpyxl", "notebook")
        book = io.BytesIO()
        write_workbook(frame, book, "s")
        sheet = openpyxl.load_workbook(io.BytesIO(book.getvalue()))["s"]
        got = [[unescaped(c.value) for c in r] for r in sheet.iter_rows(min_row=2)]
        assert got == [list(r) for r in frame.itertuples(index=False, name=None)]

    # CLI: one line per row and per headline, nothing hidden raw
    from toolkit.cli.terminal import print_frame, say_line

    lines = printed(lambda: print_frame(frame)).splitlines()
    assert len(lines) == 3 and not [raw_hidden(x) for x in lines if raw_hidden(x)]
    lines = printed(lambda: say_line(v.headline())).splitlines()
    assert len(lines) == 1 and not raw_hidden(lines[0])


def test_junit_is_well_formed_for_every_character_xml_cannot_hold():
    """Every C0 control but tab, newline and return, U+FFFE, U+FFFF and lone surrogates, in a folder name,
    a program name, a method name and an error: the XML parses, and each name reads back."""
    bad = [chr(i) for i in range(0x20) if chr(i) not in "\t\n\r"] + ["\ufffe", "\uffff", "\ud800", "\udfff"]
    assert len(bad) == 33
    for c in bad:
        v = verdict_of(f"prog{c}", f"m{c}", "ok", f"w{c}", f"l.w{c}", f"error{c}")
        xml = junit_xml([v], labels=[f"zoo/p{c}"], unreadable={f"zoo/q{c}.pte": f"bad{c}"})
        root = ET.fromstring(xml.encode("utf-8"))
        assert {unescape_text(t.get("name")) for t in root.iter("testcase")} == {"open", f"m{c}", "ok"}, repr(c)
        assert f"zoo/q{c}.pte" in {unescape_text(s.get("name")) for s in root.iter("testsuite")}


# ------------------------------------------------------------------ invisible-pairs

BASES = ["layers.0.weight", "lin.bias", "encoder.attn.proj.weight", "embed_tokens", "model.norm.scale", "buf"]
ACCENTED = ["café.weight", "naïve.bias", "Gewichte.Übersicht", "año.lin", "façade.proj", "Ångström.norm"]
INVISIBLE = [
    *PIECES["zero-width"],
    *PIECES["bidi"],
    "\u00a0",
    "\u2007",
    "\u3000",
    "\ufe0f",
    "\U000e0041",
    "\U000e0100",
    "\u115f",
    "\u17b4",
]
LOOKALIKE = {  # a Latin letter and letters of other scripts (or forms) drawn like it
    "a": "аɑα𝐚ａ",
    "c": "сϲ𝐜ｃ",
    "e": "е𝐞ｅ",
    "i": "іιı𝐢ｉ",
    "j": "јϳ",
    "o": "оοօ𝐨ｏ",
    "p": "рρ𝐩ｐ",
    "s": "ѕ𝐬ｓ",
    "x": "хχ",
    "y": "у",
    "h": "һհ",
    "d": "ԁ",
    "n": "ո",
    "u": "սυ",
    "l": "ӏ",
    "w": "ԝ",
    "g": "ɡ",
    "k": "κ",
    "v": "ν",
}


def invisible_pair(rng: random.Random) -> tuple[str, str, str]:
    """(kind, a, b): two names a reader could take for one."""
    kind = rng.choice(["invisible", "nfc-nfd", "homoglyph", "invisible-both"])
    if kind == "nfc-nfd":
        base = rng.choice(ACCENTED)
        a, b = unicodedata.normalize("NFC", base), unicodedata.normalize("NFD", base)
        return kind, *rng.sample([a, b], 2)
    base = rng.choice(BASES + ACCENTED + ["自注意力.weight", "веса.weight"])

    def insert(text: str) -> str:
        for _ in range(rng.randint(1, 3)):
            k = rng.randrange(len(text) + 1)
            text = text[:k] + rng.choice(INVISIBLE) + text[k:]
        return text

    if kind == "invisible":
        return kind, base, insert(base)
    if kind == "invisible-both":
        a, b = insert(base), insert(base)
        return (kind, a, b) if a != b else (kind, base, a)
    spots = [k for k, c in enumerate(base) if c in LOOKALIKE]
    chars = list(base)
    for k in rng.sample(spots, min(len(spots), rng.randint(1, 2))):
        chars[k] = rng.choice(LOOKALIKE[chars[k]])
    return kind, base, "".join(chars)


def _td_texts(page: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<td[^>]*>(.*?)</td>", page, flags=re.S)]


@pytest.mark.parametrize("i", _cases("invisible-pairs"))
def test_names_that_look_alike_are_shown_apart(i):
    from toolkit.cli.terminal import print_frame

    rng = random.Random(f"invisible-pairs-{i}")
    kind, a, b = invisible_pair(rng)
    assert a != b, (kind, a)
    note = (kind, ascii(a), ascii(b))
    frame = pd.DataFrame({"method": ["m", "m"], "fqn": [a, b], "decision": ["loaded", "loaded"]})

    buf = io.StringIO()
    write_table(frame, buf)
    cells = [row[1] for row in csv.reader(io.StringIO(buf.getvalue(), newline=""))][1:]
    assert cells[0] != cells[1] and all(c.isascii() for c in cells), (note, cells)
    assert [unescaped(c) for c in cells] == [a, b], note

    shown = _td_texts(html_table(frame))[1::3]
    assert shown[0] != shown[1] and all(s.isascii() for s in shown), (note, shown)

    lines = printed(lambda: print_frame(frame)).splitlines()[1:]
    assert lines[0] != lines[1] and all(x.isascii() for x in lines), (note, lines)

    v = verdict_of("p", a, b, "w", "w", "e")
    names = [t.get("name") for t in ET.fromstring(junit_xml([v]).encode("utf-8")).iter("testcase")]
    assert names[0] != names[1] and all(n.isascii() for n in names), (note, names)
    assert [unescape_text(n) for n in names] == [a, b], note


def test_enough_cases():
    assert FAMILIES["report-formats"] >= 300 and FAMILIES["invisible-pairs"] >= 300


# ------------------------------------------------------------------ end to end


def synthetic_program(folder: Path, *, name: str = "p", fqns: list[str] | None = None, seed: int = 0) -> Path:
    """A synthetic program directory (placeholder files: enough for a dry run), its FQNs ``fqns`` in turn."""
    from toolkit.build.synthetic import SyntheticSpec, write_synthetic

    manifest = write_synthetic(
        SyntheticSpec(methods=2, constants=4, content_collision=0.5, device="cpu", hidden=8, seed=seed, name="p"),
        folder,
    )
    d = json.loads(manifest.read_text())
    d["name"] = name
    k = 0
    for m in d["methods"]:
        for c in m["constants"]:
            if fqns:
                c["fqn"] = fqns[k % len(fqns)] + f".{k}"
                k += 1
    manifest.write_text(json.dumps(d))
    for rel, rec in d["files"].items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(b"\0" * rec["bytes"])
    return folder


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    from toolkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def read_reports(tmp_path: Path, kinds=("csv", "html", "xml")) -> dict[str, str]:
    """The CSV, HTML and JUnit a command wrote (each must exist, be UTF-8 and, the XML, parse)."""
    out = {kind: (tmp_path / f"out.{kind}").read_bytes().decode("utf-8") for kind in kinds}
    if "xml" in out:
        ET.fromstring(out["xml"].encode("utf-8"))
    if "html" in out:
        assert not raw_hidden(out["html"], frozenset("\t\n"))
    return out


def outputs(tmp_path: Path, kinds=("csv", "html", "xml")) -> list[str]:
    option = {"csv": "--csv", "html": "--html", "xml": "--junit"}
    return [a for kind in kinds for a in (option[kind], str(tmp_path / f"out.{kind}"))]


FORGED = "'prog' under 'name-only' (predicted): ok"


def test_scan_keeps_a_row_for_a_file_name_that_is_not_utf8(tmp_path):
    """A program folder and a .pte whose names are not UTF-8: each gets its row, the name shown escaped,
    the rest is scanned, and the CSV, HTML and JUnit are written (it was exit 2 and nothing written)."""
    zoo = tmp_path / "zoo"
    synthetic_program(zoo / "good")
    bad = os.fsdecode(os.fsencode(zoo) + b"/b\xffad")
    synthetic_program(Path(bad), seed=1)
    junk = os.fsdecode(os.fsencode(zoo) + b"/x\xfe.pte")
    Path(junk).write_bytes(b"not a program")
    code, out, err = run_cli(["scan", str(zoo), "--policies", "name-only", "--jobs", "1", *outputs(tmp_path)])
    assert code in (0, 1), err
    reports = read_reports(tmp_path)
    rows = list(csv.DictReader(io.StringIO(reports["csv"], newline="")))
    paths = {unescaped(r["path"]) for r in rows}
    assert paths == {str(zoo / "good"), bad, junk}
    assert "b\\udcffad" in reports["csv"] and "x\\udcfe.pte" in reports["csv"]
    assert "b\\udcffad" in out and "\udcff" not in out + err
    assert any(r["outcome"] == "unreadable" and unescaped(r["path"]) == junk for r in rows)


def test_scan_follows_no_link_out_of_the_folder(tmp_path):
    """A manifest.json, a .pte, a .pt2 and a .pte's .ptd that are links out of the scanned folder (one to a
    FIFO, which would block if opened): each program gets a row saying so, and nothing of a target reaches
    a report; a link inside the folder is followed as before."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text('{"format": "SECRET-TOKEN-0123456789", "name": "SECRET-NAME"}')
    (outside / "secret.txt").write_text("ETPASSWORD=SECRET-hunter2")
    os.mkfifo(outside / "pipe")
    zoo = tmp_path / "zoo"
    (zoo / "p").mkdir(parents=True)
    (zoo / "p" / "manifest.json").symlink_to(outside / "secret.json")
    (zoo / "a.pte").symlink_to(outside / "secret.txt")
    (zoo / "b.pt2").symlink_to(outside / "secret.txt")
    (zoo / "fifo.pte").symlink_to(outside / "pipe")
    (zoo / "c").mkdir()
    for f in ("prog.pte", "constant_table.json"):
        shutil.copy(FIXTURES / "synthetic-gen2" / f, zoo / "c" / f)
    (zoo / "c" / "aoti_cuda_blob.ptd").symlink_to(outside / "secret.txt")
    synthetic_program(zoo / "real")
    (zoo / "inside").mkdir()
    (zoo / "inside" / "manifest.json").symlink_to(zoo / "real" / "manifest.json")  # inside: followed
    code, out, err = run_cli(["scan", str(zoo), "--policies", "name-only", "--jobs", "1", *outputs(tmp_path)])
    assert code == 1, err
    reports = read_reports(tmp_path)
    rows = {r["path"]: r for r in csv.DictReader(io.StringIO(reports["csv"], newline=""))}
    for program in ("p", "a.pte", "b.pt2", "fifo.pte", "c/prog.pte"):
        row = rows[str(zoo / program)]
        assert row["outcome"] == "unreadable" and row["error"].endswith("a link out of the folder, not followed"), row
    assert rows[str(zoo / "c/prog.pte")]["error"].startswith(str(zoo / "c" / "aoti_cuda_blob.ptd"))
    assert "a link out" not in rows[str(zoo / "inside")]["error"]  # read (its blob is missing there)
    assert rows[str(zoo / "real")]["outcome"] != "unreadable"
    for text in (*reports.values(), out, err):
        assert "SECRET" not in text and "ETPA" not in text


def test_names_holding_newlines_print_no_forged_line(tmp_path):
    """A folder, a program name and FQNs holding a newline (and U+2028, U+0085) then a line that looks like
    a verdict: report and scan print every name on its line, escaped, and no forged line."""
    zoo = tmp_path / "zoo"
    folder = zoo / f"prog\n{FORGED}"
    synthetic_program(folder, name=f"p\n{FORGED}", fqns=[f"w\n{FORGED}", f"w\u2028{FORGED}", f"w\x85{FORGED}"])
    runs = [
        ["report", str(folder), "--dry-run", "--policy", "name-only", *outputs(tmp_path)],
        ["scan", str(zoo), "--policies", "name-only", "--jobs", "1", "--force", *outputs(tmp_path)],
    ]
    for argv in runs:
        code, out, err = run_cli(argv)
        assert code in (0, 1), err
        for line in (out + err).splitlines():
            assert not line.lstrip().startswith(FORGED.split(":")[0]), (argv[0], line)
        assert "\u2028" not in out + err and "\x85" not in out + err
        assert "\\x0a'prog' under" in out or "\\n'prog' under" in out, argv[0]  # escaped, never a line break
        read_reports(tmp_path)


@pytest.mark.parametrize("i", _cases("report-end-to-end"))
def test_report_of_hostile_manifest_names_writes_every_format(tmp_path, i):
    """A program whose name and FQNs are generated hostile names (manifests refuse lone surrogates): report
    --dry-run writes the CSV, HTML and JUnit, the CSV reads back into the exact names, the XML parses."""
    from toolkit.reports.collision import read_report

    rng = random.Random(f"report-end-to-end-{i}")
    name = hostile_name(rng, surrogates=False)
    fqns = [hostile_name(rng, surrogates=False) for _ in range(3)]
    folder = synthetic_program(tmp_path / "p", name=name, fqns=fqns, seed=i)
    kinds = ("csv", "xml") if i % 4 else ("csv", "html", "xml")  # the HTML (with its plot) a quarter of the cases
    code, out, err = run_cli(["report", str(folder), "--dry-run", "--policy", "name-only", *outputs(tmp_path, kinds)])
    assert code in (0, 1), err
    reports = read_reports(tmp_path, kinds)
    back = read_report(io.StringIO(reports["csv"], newline="")).frame
    assert set(back["program"]) == {name}
    assert {f.rsplit(".", 1)[0] for f in back["fqn"]} == set(fqns)
    assert not [raw_hidden(x) for x in (out + err).splitlines() if raw_hidden(x)]


def test_pt2_constant_names_spelling_lone_surrogates_are_valid_text(tmp_path):
    """A .pt2 whose generated source spells a lone surrogate (``\\ud800``) in a constant's FQN, and whose
    file name is not UTF-8: the FQN is valid text (the surrogate escaped, a surrogate pair joined), and
    report writes every format (the plot, which cannot draw the program's name, said not drawn)."""
    require("torch")
    from pt2_packages import packages

    from toolkit.sources import open_program

    src = packages()["binary_blob"]
    dst = Path(os.fsdecode(os.fsencode(tmp_path) + b"/hostile\xff.pt2"))
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".wrapper.cpp"):
                text = data.decode().replace('"lin.weight"', r'"lin.weight\ud800\x01\u200b"')
                data = text.replace('"lin.bias"', r'"lin.bias\ud83d\ude00"').encode()
            zout.writestr(info, data)
    fqns = {c.fqn for m in open_program(dst).methods for c in m.constants}
    for fqn in fqns:
        fqn.encode("utf-8")  # no lone surrogate
    assert "lin.weight\\ud800\x01\u200b" in fqns and "lin.bias\U0001f600" in fqns
    code, out, err = run_cli(["report", str(dst), "--dry-run", "--policy", "name-only", *outputs(tmp_path)])
    assert code in (0, 1), err
    reports = read_reports(tmp_path)
    assert "hostile\\udcff" in reports["xml"] and "hostile\\udcff" in out


def test_an_excel_cell_too_long_is_cut_visibly_and_listed():
    """A 40,000-character name: its Excel cell is cut to 32,767 characters ending with a marker saying how
    many were cut, and a sheet lists the cut cell; the CSV holds the whole text."""
    openpyxl = require("openpyxl", "notebook")

    long = "w" * 39_990 + "\u200b" * 10
    frame = pd.DataFrame({"fqn": [long, "short"], "n": [1, 2]})
    book = io.BytesIO()
    write_workbook(frame, book, "s")
    wb = openpyxl.load_workbook(io.BytesIO(book.getvalue()))
    cell = wb["s"]["A2"].value
    assert 32_757 <= len(cell) <= 32_767
    cut = int(re.search(r"([\d,]+) more characters cut", cell).group(1).replace(",", ""))
    assert cell.startswith("w" * 30_000) and cut == 40_050 - cell.index(" [... ")
    assert wb["s"]["A3"].value == "short"
    notes = list(wb["notes"].iter_rows(values_only=True))
    assert notes[1][:4] == ("s", 2, "fqn", cut)
    buf = io.StringIO()
    write_table(frame, buf)
    assert unescaped(next(csv.DictReader(io.StringIO(buf.getvalue(), newline="")))["fqn"]) == long
