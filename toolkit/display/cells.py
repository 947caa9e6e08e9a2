"""The text a table cell shows: any value as display text, byte counts in binary units, digests shortened.

Every renderer (HTML tables, plots, the explorer) turns a value into text here first, so a
missing value, an Enum or a list reads the same everywhere, and escaping happens on text only.

Names come from programs, which may be hostile, so every surface shows them through
:func:`escape_text`: a character nobody can see (controls, line breaks, zero-width and bidi
controls, non-ASCII spaces, default-ignorable code points) or that no UTF-8 or XML file can hold
(lone surrogates, non-characters) is written as a Python-style escape (``\\x0a``, ``\\u200b``,
``\\U000e0041``), and a name that looks like another one beside it (NFC/NFD, homoglyphs:
:func:`lookalikes`) has every non-ASCII character escaped.  A backslash that would read as an
escape is itself escaped (``\\x5c``), so :func:`unescape_text` gives back the exact text: the
CSV and Excel exports use the same escaping and :func:`~toolkit.reports.collision.read_report`
undoes it.  Only pandas and the standard library.
"""

from __future__ import annotations

import enum
import html
import math
import re
import unicodedata
from typing import Any, Iterable

import pandas as pd

DIGEST_RE = re.compile(r"[0-9a-f]{64}")
DIGEST_SHOWN = 12  # characters of a digest shown


def is_missing(v: Any) -> bool:
    """Whether ``v`` is None, NaN, ``pd.NA`` or ``pd.NaT`` (a cell shown empty)."""
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    try:
        return bool(pd.api.types.is_scalar(v) and pd.isna(v))
    except (TypeError, ValueError):
        return False


def cell_text(v: Any) -> str:
    """The text a cell shows (not yet escaped): '' for None / NaN / NA, an Enum by its
    value, a list / tuple / set as comma-joined text (sets sorted), anything else ``str``."""
    if isinstance(v, enum.Enum):
        return cell_text(v.value)
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)):
        return ", ".join(cell_text(x) for x in v)
    if isinstance(v, (set, frozenset)):
        return ", ".join(sorted(cell_text(x) for x in v))
    if is_missing(v):
        return ""
    return str(v)


def escaped(v: Any) -> str:
    """``v``'s cell text, HTML-escaped (quotes too), characters nobody can see escaped
    (:func:`one_line`; tabs and newlines kept: HTML shows them as spaces)."""
    return html.escape(one_line(cell_text(v), keep="\t\n"), quote=True)


def format_bytes(n: Any) -> str:
    """``16384`` -> ``"16 KiB"``, ``1536`` -> ``"1.5 KiB"``; ``"?"`` for a missing value."""
    if is_missing(n):
        return "?"
    try:
        n = float(n)
    except (TypeError, ValueError):
        return cell_text(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - the loop always returns


def is_digest(text: str) -> bool:
    """Whether ``text`` is a sha256 hex digest (64 lowercase hex characters)."""
    return bool(DIGEST_RE.fullmatch(text))


def shorten_digests(text: str, width: int = DIGEST_SHOWN) -> str:
    """``text`` with every sha256 digest inside it (a storage key, a blob name) cut to its
    first ``width`` characters and an ellipsis."""
    return DIGEST_RE.sub(lambda m: m.group(0)[:width] + "\u2026", text)


def short_digest(digest: str, other: str | None = None, width: int = DIGEST_SHOWN) -> str:
    """``digest`` shortened to about ``width`` characters, the difference kept visible.

    Alone, or beside an equal digest: its first ``width`` characters and an ellipsis.  Beside
    a different one that shares the first characters, the start, an ellipsis, then the
    characters from the first one that differs: ``'1a2b…7f03c9e1…'``.
    """
    if len(digest) <= width + 1:
        return digest
    if other is None or other == digest:
        return digest[:width] + "\u2026"
    first = next((i for i, (a, b) in enumerate(zip(digest, other)) if a != b), min(len(digest), len(other)))
    if first < width - 2:
        return digest[:width] + "\u2026"
    return digest[:4] + "\u2026" + digest[first : first + width - 4] + "\u2026"


# ------------------------------------------------------------------ hostile text: seen as it is

# Default-ignorable code points that are not format characters (a combining grapheme joiner, Hangul
# fillers, variation selectors, Mongolian selectors, musical format symbols, tags) and the blank braille
# pattern: drawn as nothing, so a name holding one looks like the name without it.
_INVISIBLE_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
# controls, format characters (zero-width, bidi controls, soft hyphen, BOM), surrogates, line and
# paragraph separators, spaces other than U+0020
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Zs"})
# a backslash that an unescaper would read as the start of an escape
_ESCAPE_AHEAD = r"(?=x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})"
_UNESCAPE = re.compile(r"\\(?:x([0-9a-f]{2})|u([0-9a-f]{4})|U([0-9a-f]{8}))")


def is_hidden(ch: str) -> bool:
    """Whether the character ``ch`` is one nobody can see or no UTF-8/XML file can hold (see the module
    docstring): :func:`escape_text` writes it as an escape."""
    o = ord(ch)
    if 0x20 <= o < 0x7F:
        return False
    if o < 0xA0 or 0xFDD0 <= o <= 0xFDEF or (o & 0xFFFE) == 0xFFFE:  # C0, DEL, C1; non-characters
        return True
    return unicodedata.category(ch) in _HIDDEN_CATEGORIES or any(lo <= o <= hi for lo, hi in _INVISIBLE_RANGES)


_PATTERNS: dict[tuple[str, bool, bool], re.Pattern] = {}  # built on first use: a pass over the code points


def _hidden_class() -> str:
    """A regex character class of every hidden character."""
    category = unicodedata.category
    points = {o for o in range(0xA0, 0x110000) if category(chr(o)) in _HIDDEN_CATEGORIES}
    points |= {*range(0x20), *range(0x7F, 0xA0), *range(0xFDD0, 0xFDF0)}
    points |= {plane | low for plane in range(0, 0x110000, 0x10000) for low in (0xFFFE, 0xFFFF)}
    points |= {o for lo, hi in _INVISIBLE_RANGES for o in range(lo, hi + 1)}
    ranges: list[list[int]] = []
    for o in sorted(points):
        if ranges and ranges[-1][1] == o - 1:
            ranges[-1][1] = o
        else:
            ranges.append([o, o])
    return "".join(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges)


def _pattern(keep: str, backslash: bool, spell_out: bool) -> re.Pattern:
    key = (keep, backslash, spell_out)
    if key not in _PATTERNS:
        if not _PATTERNS:
            _PATTERNS[("", False, False)] = re.compile(f"[{_hidden_class()}]")
        hidden = _PATTERNS[("", False, False)].pattern
        kept = "".join(f"\\U{ord(c):08x}" for c in keep)
        parts = [rf"\\{_ESCAPE_AHEAD}"] if backslash else []
        parts += [f"(?![{kept}]){hidden}" if kept else hidden] + ([r"[^\x00-\x7f]"] if spell_out else [])
        _PATTERNS[key] = re.compile("|".join(parts))
    return _PATTERNS[key]


def _escape_char(m: re.Match) -> str:
    o = ord(m.group())
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def escape_text(text: str, *, keep: str = "", spell_out: bool = False) -> str:
    """``text`` with every hidden character (:func:`is_hidden`) but those in ``keep`` written as an
    escape, and a backslash that would read as one as ``\\x5c``; ``spell_out``: every non-ASCII
    character escaped too (a name that looks like another, :func:`lookalikes`).  Reversible:
    :func:`unescape_text` gives back ``text``."""
    if text.isascii() and text.isprintable() and "\\" not in text:
        return text  # the common case, at the cost of one scan
    return _pattern(keep, True, spell_out).sub(_escape_char, text)


def unescape_text(text: str) -> str:
    """The inverse of :func:`escape_text` (whatever its ``keep`` and ``spell_out``)."""
    if "\\" not in text:
        return text

    def char(m: re.Match) -> str:
        o = int(next(g for g in m.groups() if g), 16)
        return chr(o) if o < 0x110000 else m.group()  # escape_text never writes one past U+10FFFF

    return _UNESCAPE.sub(char, text)


def one_line(text: object, *, keep: str = "") -> str:
    """``text`` (a message, a line of its own) with every hidden character but those in ``keep`` escaped,
    line breaks too, so it prints as one line and no bidi control reorders it; backslashes stay (a
    message may quote a ``repr``), so this is for showing, not for data (:func:`escape_text`)."""
    text = str(text)
    if text.isascii() and text.isprintable():
        return text
    return _pattern(keep, False, False).sub(_escape_char, text)


def escape_note(text: str, spelled_out: bool = False) -> str:
    """Why :func:`escape_text` changed ``text`` (``spelled_out``: it was a look-alike), for a hover title."""
    if spelled_out:
        return "shown escaped: it looks like another name here (its non-ASCII characters as \\u escapes)"
    found = list(dict.fromkeys(c for c in text if is_hidden(c)))
    if not found:
        return "shown escaped: a backslash that would read as an escape is written \\x5c"
    named = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}" for c in found[:4])
    return f"shown escaped: holds characters that cannot be seen ({named}{', ...' if len(found) > 4 else ''})"


# Letters of other scripts drawn like Latin ones (Cyrillic, Greek, Armenian, Cherokee, Latin variants),
# and punctuation drawn like the separators of an FQN or a path: the skeleton of a name maps them to the
# Latin letter or ASCII sign they look like.  NFKC already folds full-width and mathematical letters.
_HOMOGLYPHS = str.maketrans(
    {
        **dict(zip("аеіјорсуѕԁԛԝһӏх", "aeijopcysdqwhlx", strict=True)),
        **dict(zip("АВЕКМНОРСТХУЅІЈԚԜҮҺӀԌ", "ABEKMHOPCTXYSIJQWYHIG", strict=True)),
        **dict(zip("αεικνορτυχϲϳΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "aeikvoptuxcjABEZHIKMNOPTYX", strict=True)),
        **dict(zip("օսհոզ", "ouhnq", strict=True)),
        **dict(zip("ᎪᏴᏟᎬᎻᎫᏦᎷᏢᏚᎢᏔᏃ", "ABCEHJKMPSTWZ", strict=True)),
        **dict(zip("ıɑɡɩʟ", "iagiL", strict=True)),
        **dict(zip("\u2010\u2011\u2012\u2013\u2212\u2215\u2044\u00b7\u0589\u02d0\u2024", "-----//.::.", strict=True)),
    }
)
# scripts whose letters pass for Latin ones: a word mixing one with Latin letters is a disguise
_LOOKALIKE_SCRIPTS = frozenset({"CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE", "COPTIC"})
_WORD = re.compile(r"[^\W\d_]+")


def _skeleton(text: str) -> str:
    """What ``text`` looks like: composed (NFKC), hidden characters dropped, homoglyphs as Latin."""
    hidden = _pattern("", False, False)  # dropped before NFKC too, which turns a no-break space into a space
    return hidden.sub("", unicodedata.normalize("NFKC", hidden.sub("", text))).translate(_HOMOGLYPHS)


def _mixes_scripts(text: str) -> bool:
    for word in _WORD.findall(text):
        if word.isascii():
            continue
        scripts = {unicodedata.name(c, "?").split(" ", 1)[0] for c in set(word)}
        if "LATIN" in scripts and scripts & _LOOKALIKE_SCRIPTS:
            return True
    return False


def lookalikes(texts: Iterable[str]) -> set[str]:
    """The texts among ``texts`` a reader could take for another one of them (equal once composed,
    without hidden characters, homoglyphs read as the Latin letters they look like), and those
    mixing Latin letters with look-alike letters of another script in one word: shown with every
    non-ASCII character escaped (``escape_text(t, spell_out=True)``).  ASCII texts are never in it:
    their twin is.  Linear in the length of the non-ASCII texts."""
    present = set(texts)
    by_skeleton: dict[str, set[str]] = {}
    out: set[str] = set()
    for t in present:
        if t.isascii():
            continue
        if _mixes_scripts(t):
            out.add(t)
        by_skeleton.setdefault(_skeleton(t), set()).add(t)
    for skeleton, group in by_skeleton.items():
        if len(group) > 1 or (skeleton in present and skeleton not in group):
            out |= group
    return out
