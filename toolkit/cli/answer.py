"""What a command prints first: the answer, the findings and what was not checked, within 100 columns.

The person at the terminal asks "is my program safe under the ExecuTorch I ship, and if not, which
constant?", so ``report``, ``compare`` and ``scan`` open with one answer line, then one line per
finding (method, constant, problem, the policies and ExecuTorch releases it holds under, names
before hashes), then the blind spots, then one compact row per method, policy or program.  The
decision tables come only with ``--tables``.  Long texts wrap under their line rather than run past
:data:`WIDTH`; every name is escaped as :mod:`toolkit.cli.terminal` escapes it.
"""

from __future__ import annotations

import textwrap
from typing import Sequence

import pandas as pd

from toolkit.cli.terminal import say, say_line, shown_frame, shown_names
from toolkit.core.verdict import Verdict
from toolkit.reports.summary import findings_frame, policies_frame

WIDTH = 100  # columns of the default output
INDENT = "    "
MAX_FINDINGS = 30  # finding lines before "and N more" (every one is in the CSV and the HTML report)


def wrapped(text: str, *, indent: str = "", rest: str = INDENT + "  ", whole_words: bool = False) -> list[str]:
    """``text`` as lines of at most :data:`WIDTH` columns, later lines indented by ``rest``; a word longer
    than a line is cut unless ``whole_words`` (a headline, which must read back joined by spaces)."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=rest,
        break_on_hyphens=False,
        break_long_words=not whole_words,
    ) or [indent]


def say_wrapped(text: str, **kw) -> None:
    for line in wrapped(text, **kw):
        say_line(line)


def fitted(df: pd.DataFrame, width: int = WIDTH) -> str:
    """``df`` as a text table of at most ``width`` columns: the widest text column is cut (with "…")
    until it fits; numbers are never cut."""
    cells = {c: ["" if pd.isna(v) else str(v) for v in df[c]] for c in df.columns}
    widths = {c: max([len(str(c)), *(len(v) for v in cells[c])]) for c in df.columns}
    texts = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])]

    def total() -> int:
        return sum(widths.values()) + 2 * (len(widths) - 1)

    while total() > width and texts:
        widest = max(texts, key=lambda c: widths[c])
        floor = max(len(str(widest)), 8)
        if widths[widest] <= floor:
            texts.remove(widest)
            continue
        widths[widest] = max(floor, widths[widest] - (total() - width))

    def cut(v: str, w: int) -> str:
        return v if len(v) <= w else v[: w - 1] + "\u2026"

    numeric = {c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])}

    def row(values: Sequence[str]) -> str:
        return "  ".join(
            cut(v, widths[c]).rjust(widths[c]) if c in numeric else cut(v, widths[c]).ljust(widths[c])
            for c, v in zip(df.columns, values)
        ).rstrip()

    lines = [row([str(c) for c in df.columns])]
    lines += [row([cells[c][i] for c in df.columns]) for i in range(len(df))]
    return "\n".join(lines)


def say_table(df: pd.DataFrame) -> None:
    """``df`` fitted to the terminal, every name escaped (look-alikes spelled out)."""
    for line in fitted(shown_frame(df)).splitlines():
        say(line)


def cut(text: str, width: int = WIDTH) -> str:
    """``text`` on one line of at most ``width`` columns (the whole of it is in the CSV and HTML)."""
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def say_findings(verdicts: Sequence[Verdict], labels: Sequence[str] | None, *, by_program: bool) -> int:
    """Every finding once across ``verdicts``, grouped by program and by the policies it holds under: one
    line each, names first, its evidence beneath when one policy is asked (``report``); returns how many."""
    found = findings_frame(verdicts, labels)
    if not len(found):
        return 0
    show = shown_names([v for c in ("method", "constant", "fqn", "shared_from") for v in found[c]])
    single = len({v.policy for v in verdicts}) == 1 and not by_program
    say(f"findings ({len(found)}):")
    shown_rows = found.head(MAX_FINDINGS)
    for program, in_program in shown_rows.groupby("program", sort=False):
        indent = "  "
        if by_program:
            say_line(cut(f"  {show(program)}"))
            indent = "    "
        for policies, group in in_program.groupby("policies", sort=False):
            if not single:
                say_wrapped(f"under {policies}:", indent=indent, rest=indent + "  ")
            for r in group.to_dict("records"):
                what = (show(r["method"]) or "the program") + (f"/{show(r['constant'])}" if r["constant"] else "")
                fqn = f" ({show(r['fqn'])})" if r["fqn"] and single else ""
                owner, _, name = str(r["shared_from"]).rpartition("/")
                source = show(owner) if name == r["constant"] else show(r["shared_from"])
                source = f", runs on {source}'s data" if r["shared_from"] else ""
                blame = f" [{r['blame']}]" if r["blame"] else ""
                runs = r["method_outcome"]
                also = f"; {show(r['method'])} {runs}" if r["constant"] and runs not in ("", "wrong") else ""
                if also and runs == "not runnable":
                    also += " (an installed tensor cannot fill its slot; upstream would read out of bounds)"
                line = f"{what}{fqn}: {r['problem']}{source}{blame}{also}"
                if single or not r["constant"]:  # a failure without a constant: its reason is the finding
                    at = indent if single else indent + "  "
                    say_wrapped(line, indent=at)
                    if r["evidence"]:
                        say_wrapped(r["evidence"], indent=at + "  ", rest=at + "  ")
                else:
                    say_line(cut(f"{indent}  {line}"))
    if len(found) > MAX_FINDINGS:
        say(f"  ... and {len(found) - MAX_FINDINGS} more (every one in --csv FILE or --html FILE)")
    return len(found)


def say_not_checked(verdicts: Sequence[Verdict], labels: Sequence[str] | None, *, by_program: bool) -> None:
    """Each blind spot once, with how to check it: an "ok" above never hides one.  Over many programs
    (``scan``), one line each, cut to the terminal, and each way to check said once at the end."""
    seen: dict[tuple, list[str]] = {}
    for label, v in zip(labels if labels is not None else [v.program for v in verdicts], verdicts, strict=True):
        for n in v.not_checked:
            seen.setdefault((label if by_program else "", n.subject, n.gap, n.reason, n.how), []).append(v.policy)
    if not seen:
        return
    say(f"not checked ({len(seen)}):")
    hows: list[str] = []
    show = shown_names([k[0] for k in seen] + [k[1] for k in seen])
    for label, subject, gap, reason, how in seen:
        if by_program:
            say_line(cut(f"  {show(label)}: {gap.value} ({show(subject)}): {reason}"))
            if how and how not in hows:
                hows.append(how)
            continue
        say_wrapped(f"{show(subject)}: {gap.value}: {reason}", indent="  ")
        if how:
            say_wrapped(f"how: {how}", indent=INDENT, rest=INDENT + "  ")
    for how in hows:
        say_wrapped(f"how: {how}", indent="  ", rest=INDENT)


def answer_line(verdicts: Sequence[Verdict], what: str, one: str, *, predicted: bool) -> str:
    """The first line: how many of ``verdicts`` fail the gate, and the exit code it means."""
    from toolkit.core.vocab import ExitCode

    bad = [v for v in verdicts if v.exit_code is ExitCode.PROBLEM]
    code = max((int(v.exit_code) for v in verdicts), default=0)
    unverified = sum(v.exit_code is ExitCode.NOT_VERIFIED for v in verdicts)
    state = (
        f"{len(bad)} of {len(verdicts)} {what} fail"
        if bad
        else (f"{unverified} of {len(verdicts)} {what} not verified" if unverified else f"every {one} ok")
    )
    return f"{state}{' (predicted: nothing was loaded or run)' if predicted else ''}; exit {code}"


def policy_rows(verdicts: Sequence[Verdict], extra: pd.DataFrame | None = None) -> pd.DataFrame:
    """One compact row per policy: its ExecuTorch releases, outcome, the methods that fail; ``extra``
    (indexed by policy) adds columns such as memory."""
    rows = policies_frame(verdicts).drop(columns=["program", "not checked"])
    rows = rows.rename(columns={"methods wrong": "fails"})
    if extra is not None:
        rows = rows.join(extra, on="policy")
    return rows
