"""The HTML report: one self-contained page a CI can keep, read from verdicts, its answer in one screen.

The answer first, as pytest-html and profiling reports do: the verdict with counts that say what they
count, one summary table (each program under each policy, the ExecuTorch releases that run the policy
beside its name), the findings once each (a method and a constant, with the policies it holds under), and
what was not checked.  Then each policy's detail collapsed (``<details>``: no script), the
correctness-vs-memory plot and the collision matrices as inline SVG, and the tables a caller hands in.
A table shows its first :data:`DETAIL_ROWS` rows and says where the rest are (the CSV), so a program of
200,000 decisions makes a page of a few hundred kB, not one a browser chokes on.  Columns with nothing in
them are dropped.  No script, no stylesheet or font from a network: it opens offline.
:func:`html_report` makes the page of any verdicts (a scan, a comparison); :func:`html_report_of_session`
the page of one load.

Every text is escaped twice over: as HTML (autoescape), and for what nobody can see or UTF-8 cannot
hold (:func:`~toolkit.display.cells.one_line` on every line of text, the tables through
:func:`~toolkit.display.tables.html_table`); what a figure's SVG carries of a name is cleaned the same
way (:func:`html_safe`), so a hostile name costs neither the page nor its readability.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import jinja2
import pandas as pd
from markupsafe import Markup

from toolkit.core.errors import ToolkitError
from toolkit.core.verdict import BAD_OUTCOMES, EXIT_CODE_MEANINGS, Verdict
from toolkit.core.vocab import UNREADABLE, BlameStatus, ExitCode, MethodOutcome
from toolkit.display.cells import one_line
from toolkit.display.findings import verification_html
from toolkit.display.palette import NOT_RUN_COLOUR, WARNING_TEXT, outcome_colour
from toolkit.display.tables import html_table
from toolkit.reports.summary import (
    culprits_frame,
    findings_frame,
    labelled,
    outcome_rank,
    policies_frame,
    verdicts_frame,
    worst_outcome,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from toolkit.engine.session import Session

SUMMARY_ROWS = 40  # programs in the summary table, the worst first when there are more
OVERVIEW_ROWS = 10  # findings and blind spots shown open; the rest one click away, below them
DETAIL_ROWS = 200  # rows of any detail table; the rest are in the CSV
NAMED = 8  # names listed in one summary cell or line before "and N more"
SAID_CHARS = 400  # characters of a headline above the tables
CELL_CHARS = 160  # characters of a summary cell that lists what was not checked
MATRIX_DECISIONS = 20_000  # decisions past which a matrix is drawn from the names it can show only
MAX_MATRICES = 6  # collision matrices drawn (the programs with findings first)
NOT_CHECKED_COLUMNS = ["program", "concerns", "not checked", "why", "how to check", "policies"]
# what a verdict's outcome says of a program under a policy, in the counts
OUTCOME_PHRASES = {
    MethodOutcome.WRONG: "wrong",
    MethodOutcome.FAILED: "failing to load",
    MethodOutcome.REFUSED: "refused",
    MethodOutcome.NO_REFERENCE: "not verified (no reference)",
    MethodOutcome.OK: "ok",
}


@dataclass(frozen=True)
class LoadFrames:
    """What a report shows of one load beside its verdict: its decisions (the collision matrix, the table
    of a single program's decisions), its verification (``max_abs_err``) and the constant bytes it put on
    its device (the correctness-vs-memory plot).  None where it is not known."""

    decisions: pd.DataFrame | None = None
    verification: pd.DataFrame | None = None
    device_bytes: int | None = None

    @classmethod
    def of(cls, session: "Session", verification: pd.DataFrame | None = None) -> "LoadFrames":
        """A session's frames; a real load's verification read back from the session when not given (a
        comparison's sessions are closed, and keep their last one)."""
        if verification is None and session.runtime.can_run:
            try:
                verification = session.verify()
            except (ToolkitError, ValueError, RuntimeError):  # never verified before it closed: none to show
                verification = None
        return cls(session.decisions, verification, int(session.device_bytes))


def html_safe(text: str) -> str:
    """``text`` (HTML or SVG) with every hidden character but tab and newline written as ``\\xNN``/``\\uNNNN``
    text (:func:`~toolkit.display.cells.one_line`): a last net under the escaping of each value, for what a
    figure's SVG carries of a name in its comments; so the page holds no control character, no lone
    surrogate (which no UTF-8 file holds) and nothing invisible."""
    return one_line(text, keep="\t\n")


def _finalize(value):
    # every {{ value }}: plain text as one line, hidden characters escaped; markup (tables, SVG) as it is
    return value if isinstance(value, Markup) or not isinstance(value, str) else one_line(value)


_TEMPLATE = jinja2.Environment(autoescape=True, finalize=_finalize).from_string("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.2em 2em; max-width: 110em; color: #222; font-size: 15px }
h1 { font-size: 1.35em; margin: 0 0 0.4em }
h2 { font-size: 1.1em; margin: 1.1em 0 0.4em; border-bottom: 1px solid #ddd }
p { margin: 0.4em 0 }
.outcome { font-weight: bold; padding: 2px 8px; border-radius: 3px }
.counts span { display: inline-block; margin-right: 1.4em }
.note { color: {{ note_text }} }
section table { font-size: 0.88em }
section th, section td { padding: 2px 6px !important }
#summary th { white-space: normal !important; vertical-align: bottom; max-width: 6.5em }
#findings td { white-space: normal !important; overflow-wrap: anywhere; max-width: 22em !important }
#findings td:first-child { max-width: 16em !important }
details { margin: 0.3em 0 } details > summary { cursor: pointer; padding: 2px 0 }
details[open] > summary { font-weight: bold }
details > div { margin: 0.2em 0 0.8em 1.2em }
figure { margin: 1em 0 } figure svg { max-width: 100%; height: auto }
</style></head><body>
<h1>{{ title }}</h1>
<section id="verdict"><h2>Verdict</h2>
<p><span class="outcome" style="background-color: {{ outcome_bg }}">{{ outcome }}</span>
exit code {{ exit_code }} ({{ exit_meaning }})</p>
{% for line in headlines %}<p>{{ line }}</p>
{% endfor %}<p class="counts">{% for label, n in counts %}<span>{{ label }}: <b>{{ n }}</b></span>{% endfor %}</p>
</section>
<section id="summary"><h2>{{ summary_heading }}</h2>{{ summary }}
{% for heading, body in open_tables %}<h2>{{ heading }}</h2>{{ body }}{% endfor %}</section>
<section id="findings"><h2>Findings: what runs (would run) on other data, once each, with the policies it \
holds under</h2>{{ findings }}</section>
<section id="not-checked"><h2>Not checked: what this report cannot see, and how to check it</h2>\
{{ not_checked }}</section>
<section id="policies"><h2>Each policy in detail</h2>
{% for label, body in policies %}<details class="policy"><summary>{{ label }}</summary><div>{{ body }}</div></details>
{% endfor %}</section>
{% if figures %}<section id="plots"><h2>Plots</h2>
{% for caption, svg, folded in figures %}{% if folded %}<details class="plot"><summary>{{ caption }}</summary>\
<figure>{{ svg }}</figure></details>{% else %}<figure>{{ svg }}<figcaption>{{ caption }}</figcaption></figure>\
{% endif %}
{% endfor %}{% for line in figure_notes %}<p class="note">{{ line }}</p>{% endfor %}</section>{% endif %}
{% if tables %}<section id="tables"><h2>Tables</h2>
{% for heading, body in tables %}<details class="table"><summary>{{ heading }}</summary><div>{{ body }}</div></details>
{% endfor %}</section>{% endif %}
</body></html>
""")


def figure_svg(fig: "Figure") -> str:
    """A matplotlib figure as an inline ``<svg>`` element (no XML prologue, no external reference)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return html_safe(text[text.index("<svg") :])


def _exit_code(verdicts: Sequence[Verdict], unreadable: Mapping[str, str]) -> ExitCode:
    return ExitCode.worst([*(v.exit_code for v in verdicts), *([ExitCode.PROBLEM] if unreadable else [])])


# ------------------------------------------------------------------ tables


def _blank(value) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return True
    return isinstance(value, (str, list, tuple, set, frozenset)) and not len(value)


def without_empty_columns(frame: pd.DataFrame, keep: Iterable[str] = (), rows: int | None = None) -> pd.DataFrame:
    """``frame`` without the columns that hold nothing in any row (``keep``: kept whatever they hold; ``rows``:
    looking at the first so many only, the rows a page shows)."""
    kept, head = set(keep), frame if rows is None else frame.iloc[:rows]
    return frame[[c for c in frame.columns if c in kept or not head[c].map(_blank).all()]]


def named(text: str, limit: int = NAMED) -> str:
    """A comma-separated list cut after ``limit`` items, "and N more" said (a cell stays one glance)."""
    items = [t for t in str(text).split(", ") if t]
    return text if len(items) <= limit else ", ".join(items[:limit]) + f" and {len(items) - limit:,} more"


def _said(text: str, limit: int = SAID_CHARS, tail: str = " (every name in the tables below)") -> str:
    """A line cut at ``limit`` characters, the cut said: the whole of it is in the tables and the CSV."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026" + tail


def _rest_hint(csv: str | None) -> str:
    return f"every row is in {csv}" if csv else "pass --csv FILE to write every row"


def _table(frame: pd.DataFrame, csv: str | None, *, rows: int = DETAIL_ROWS, empty: str = "none", **options) -> str:
    """``frame`` without its empty columns, its first ``rows`` rows, saying where the rest are."""
    shown = without_empty_columns(frame, rows=rows)
    return html_table(shown, max_rows=rows, empty=empty, more_hint=_rest_hint(csv), **options)


def _folded(frame: pd.DataFrame, csv: str | None, what: str, *, empty: str, **options) -> str:
    """The first :data:`OVERVIEW_ROWS` rows of ``frame`` open, the next ones (up to :data:`DETAIL_ROWS`) one
    click away, in the same columns; where the rest are said."""
    frame = without_empty_columns(frame, rows=OVERVIEW_ROWS + DETAIL_ROWS)
    if len(frame) <= OVERVIEW_ROWS:
        return _table(frame, csv, empty=empty, **options)
    head = html_table(frame, max_rows=OVERVIEW_ROWS, **options).rsplit('<p class="constshare-more', 1)[0]
    rest = frame.iloc[OVERVIEW_ROWS:]
    return (
        head + f"<details><summary>{len(rest):,} more {what}</summary><div>"
        f"{html_table(rest, max_rows=DETAIL_ROWS, more_hint=_rest_hint(csv), **options)}</div></details>"
    )


def _every_policy(names: str, policies: Sequence[str]) -> str:
    """A list of policies, or "every policy (N)" when it is all of them."""
    listed = [p.strip() for p in names.split(",") if p.strip()]
    return f"every policy ({len(policies)})" if len(policies) > 1 and set(listed) == set(policies) else names


def _same_name(constant: str, fqn: str) -> bool:
    """Whether ``fqn`` only spells ``constant`` with dots (the name ExecuTorch gives a weight)."""
    return not fqn or fqn.replace(".", "_") == constant


def findings_table(verdicts: Sequence[Verdict], labels: Sequence[str] | None, csv: str | None) -> str:
    """The findings once each: a method and a constant (or a method that fails with none to name), with the
    policies it holds under; names first, the evidence (which holds digests) last."""
    frame = findings_frame(verdicts, labels)
    policies = list(dict.fromkeys(v.policy for v in verdicts))
    frame["policies"] = [_every_policy(p, policies) for p in frame["policies"]]
    if len({label for label, _v in labelled(verdicts, labels)}) == 1:
        frame = frame.drop(columns=["program"])
    if all(_same_name(c, f) for c, f in zip(frame["constant"], frame["fqn"])):
        frame = frame.drop(columns=["fqn"])
    sources = [str(s).rpartition("/") for s in frame["shared_from"]]
    if all(not s or name == c for (_m, s, name), c in zip(sources, frame["constant"])):
        # each runs on its own name's tensor of another method: that method is what to say
        frame["shared_from"] = [m for m, _s, _n in sources]
        frame = frame.rename(columns={"shared_from": "runs on the tensor of"})
    first = ["program", "method", "constant", "fqn", "problem", "policies", "shared_from", "runs on the tensor of"]
    first = [c for c in first if c in frame]
    frame = frame[first + [c for c in frame.columns if c not in first and c != "evidence"] + ["evidence"]]
    return _folded(
        frame,
        csv,
        "findings",
        empty="none: no method runs (would run) on another constant's data, and none fails",
        colours={"problem": lambda t: outcome_colour("wrong") if t else ""},
        wrap=["policies"],
    )


def not_checked_frame(verdicts: Sequence[Verdict], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Every blind spot once across policies: one row per program, subject, gap and reason, with the
    policies whose verdict has it."""
    rows: dict[tuple, dict] = {}
    for label, v in labelled(verdicts, labels):
        for n in v.not_checked:
            row = rows.setdefault(
                (label, n.subject, n.gap, n.reason, n.how),
                {
                    "program": label,
                    "concerns": n.subject,
                    "not checked": n.gap.value,
                    "why": n.reason,
                    "how to check": n.how,
                    "policies": [],
                },
            )
            if v.policy not in row["policies"]:
                row["policies"].append(v.policy)
    frame = pd.DataFrame(list(rows.values()), columns=NOT_CHECKED_COLUMNS)
    frame["policies"] = [", ".join(p) for p in frame["policies"]]
    return frame


def _not_checked_table(verdicts: Sequence[Verdict], labels: Sequence[str] | None, csv: str | None) -> str:
    frame = not_checked_frame(verdicts, labels)
    policies = list(dict.fromkeys(v.policy for v in verdicts))
    frame["policies"] = [_every_policy(p, policies) for p in frame["policies"]]
    if len({label for label, _v in labelled(verdicts, labels)}) == 1:
        frame = frame.drop(columns=["program"])
    common = [c for c in ("not checked", "concerns", "policies", "how to check") if len(frame) > 1]
    common = [c for c in common if frame[c].nunique() == 1 and frame[c].iloc[0]]
    lead = "".join(
        f"<p>{Markup.escape(c.capitalize())}: {Markup.escape(one_line(str(frame[c].iloc[0])))}</p>" for c in common
    )  # what every row has in common, said once above them
    frame = frame.drop(columns=common)
    return lead + _folded(
        frame,
        csv,
        "blind spots",
        empty="nothing: every method and sequence was checked against a reference or predicted from the file",
        wrap=["policies", "how to check"],
    )


def _max_abs_err(frames: LoadFrames | None) -> float | None:
    """The largest ``max_abs_err`` of the methods that ran (None: nothing ran, or no verification)."""
    f = frames.verification if frames is not None else None
    if f is None or "max_abs_err" not in f or not len(f):
        return None
    ran = f[f["ran"].fillna(False).astype(bool)] if "ran" in f else f
    errs = pd.to_numeric(ran["max_abs_err"], errors="coerce").dropna()
    return float(errs.max()) if len(errs) else None


def summary_table(
    verdicts: Sequence[Verdict],
    labels: Sequence[str] | None,
    loads: Sequence[LoadFrames | None],
    unreadable: Mapping[str, str],
    csv: str | None = None,
) -> tuple[str, str]:
    """(heading, HTML) of the one summary table: one program, a row per policy (ExecuTorch releases,
    outcome, the methods that fail, what was not checked, device bytes, max abs err); several, a row per
    program and a column per policy (headed by its ExecuTorch releases), each cell the outcome."""
    pairs = labelled(verdicts, labels)
    frame = policies_frame(verdicts, labels)
    programs = list(dict.fromkeys(label for label, _v in pairs))
    if len(programs) <= 1 and not unreadable:
        frame = frame.drop(columns=["program"]).rename(columns={"executorch": "ExecuTorch"})
        frame["methods wrong"] = frame["methods wrong"].map(named)
        frame["not checked"] = frame["not checked"].map(lambda t: _said(t, CELL_CHARS, ""))
        frame["device bytes"] = [f.device_bytes if f is not None else None for f in loads]
        frame["max abs err"] = ["" if (e := _max_abs_err(f)) is None else format(e, ".3g") for f in loads]
        return "Summary: each policy", html_table(
            without_empty_columns(frame, keep=["policy", "outcome"]), max_rows=DETAIL_ROWS
        )
    releases = dict(zip(frame["policy"], frame["executorch"]))
    policies = list(dict.fromkeys(frame["policy"]))
    header = {p: f"{p}: {releases[p]}" if releases.get(p) else p for p in policies}
    cells: dict[str, dict[str, str]] = {label: {} for label in programs}
    gaps: dict[str, dict[str, None]] = {label: {} for label in programs}
    for label, v in pairs:
        cells[label][header[v.policy]] = v.outcome.value
        for n in v.not_checked:
            gaps[label][n.gap.value] = None
    rows = [{"program": label, **cells[label], "not checked": ", ".join(gaps[label])} for label in programs]
    rows += [{"program": path, **{header[p]: UNREADABLE for p in policies}} for path in unreadable]
    if len(rows) > SUMMARY_ROWS:  # cut: the worst first, so what is cut is what is ok
        rows.sort(key=lambda r: outcome_rank(worst_outcome([r.get(h) or "ok" for h in header.values()])))
    matrix = pd.DataFrame(rows, columns=["program", *header.values(), "not checked"]).fillna("")
    table = html_table(
        without_empty_columns(matrix, keep=["program"]),
        max_rows=SUMMARY_ROWS,
        colours={h: outcome_colour for h in header.values()},
        more_hint="the worst programs are above; " + _rest_hint(csv),
    )
    return "Summary: each program under each policy (ExecuTorch releases that run it in the header)", table


def _counts(
    verdicts: Sequence[Verdict], labels: Sequence[str] | None, unreadable: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The counts under the verdict, each saying what it counts (methods of one load; policies of one
    program; else programs, by their outcome under some policy)."""
    pairs = labelled(verdicts, labels)
    programs = list(dict.fromkeys(label for label, _v in pairs))
    policies = list(dict.fromkeys(v.policy for _l, v in pairs))
    rank = lambda kv: outcome_rank(kv[0])  # noqa: E731
    if len(pairs) == 1 and not unreadable:
        v = pairs[0][1]
        out = [
            (f"methods {o.value}", f"{n} of {len(v.methods)}")
            for o, n in sorted(Counter(m.outcome for m in v.methods).items(), key=rank)
        ]
        out += [
            (f"sequences {o.value}", f"{n} of {len(v.sequences)}")
            for o, n in sorted(Counter(s.outcome for s in v.sequences).items(), key=rank)
        ]
        named = {(c.method, c.name) for c in v.constants if c.problem is not None}
        return out + [("constants run on other data", str(len(named))), ("not checked", str(len(v.not_checked)))]
    if len(programs) == 1 and not unreadable:
        by = Counter(v.outcome for _l, v in pairs)
        return [("policies", str(len(policies)))] + [
            (f"policies under which it is {OUTCOME_PHRASES.get(o, o.value)}", f"{n} of {len(pairs)}")
            for o, n in sorted(by.items(), key=rank)
        ]
    total = len(programs) + len(unreadable)
    out = [("programs", str(total)), ("policies", str(len(policies)))]
    under: dict[MethodOutcome, set[str]] = {}
    for label, v in pairs:
        under.setdefault(v.outcome, set()).add(label)
    for o, names in sorted(under.items(), key=rank):
        if o is not MethodOutcome.OK:
            out.append((f"programs {OUTCOME_PHRASES.get(o, o.value)} under some policy", f"{len(names)} of {total}"))
    bad = set().union(*(names for o, names in under.items() if o is not MethodOutcome.OK))
    out.append(("programs ok under every policy", f"{len([p for p in programs if p not in bad])} of {total}"))
    if unreadable:
        out.append(("programs that cannot be read", f"{len(unreadable)} of {total}"))
    blind = {label for label, v in pairs if v.not_checked}
    if blind:
        out.append(("programs with something not checked", f"{len(blind)} of {total}"))
    return out


# ------------------------------------------------------------------ each policy


def _policy_detail(
    policy: str,
    verdicts: Sequence[Verdict],
    labels: Sequence[str],
    loads: Sequence[LoadFrames | None],
    releases: str,
    csv: str | None,
    verification: bool = True,
) -> tuple[str, Markup]:
    """(summary line, HTML) of one policy's collapsed detail: its programs' outcomes, every method's,
    the constants run on other data, and where one program was loaded, its verification (unless shown
    above) and decisions."""
    outcomes = Counter(v.outcome for v in verdicts)
    worst = worst_outcome(outcomes) if outcomes else MethodOutcome.OK
    programs = list(dict.fromkeys(labels))
    if len(programs) == 1:
        v = verdicts[0]
        failing = [m.method for m in v.methods if m.outcome in BAD_OUTCOMES] + v.wrong_sequences
        said = f"{worst}" + (f": {named(', '.join(failing))}" if failing else "")
    else:
        said = ", ".join(
            f"{n} of {len(verdicts)} programs {OUTCOME_PHRASES.get(o, o.value)}"
            for o, n in sorted(outcomes.items(), key=lambda kv: outcome_rank(kv[0]))
        )
    line = f"{policy}" + (f" ({releases})" if releases else "") + f": {said}"
    parts = []
    if len(programs) > 1:
        frame = policies_frame(verdicts, labels).drop(columns=["policy", "executorch"])
        frame["methods wrong"] = frame["methods wrong"].map(named)
        frame["not checked"] = frame["not checked"].map(lambda t: _said(t, CELL_CHARS, ""))
        parts.append(("Programs", _table(frame, csv)))
    methods = verdicts_frame(verdicts, labels).drop(columns=["policy"])
    if len(programs) == 1:
        methods = methods.drop(columns=["program"])
    parts.append(("Methods: the outcome of each", _table(methods, csv, empty="no methods")))
    culprits = culprits_frame(verdicts, labels).drop(columns=["policy", *(["program"] if len(programs) == 1 else [])])
    if len(culprits):
        parts.append(("Constants run (would run) on other data", _table(culprits, csv)))
    if len(programs) == 1 and loads and loads[0] is not None:
        f = loads[0]
        if f.verification is not None and verification:
            parts.append(("Verification", verification_html(f.verification, verdicts[0])))
        if f.decisions is not None:
            d = f.decisions
            cols = [c for c in ("method", "name", "fqn", "lookup", "decision", "reason", "data_problem") if c in d]
            parts.append(("Decisions", _table(d[cols], csv, empty="no decisions")))
    body = "".join(f"<h3>{Markup.escape(h)}</h3>{t}" for h, t in parts)
    return line, Markup(body)


# ------------------------------------------------------------------ plots


def _drawn(caption: str, fig: "Figure") -> tuple[str, Markup]:
    """(caption, inline SVG) of a figure; a figure matplotlib cannot draw (a label holding a lone surrogate,
    from a file name that is not UTF-8) costs that figure, said in its caption, never the report."""
    try:
        return caption, Markup(figure_svg(fig))
    except (TypeError, ValueError, RuntimeError) as e:
        return f"{caption}: not drawn ({type(e).__name__}: a name in it cannot be drawn)", Markup("")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def tradeoff_frame(verdicts: Sequence[Verdict], labels: Sequence[str], loads: Sequence[LoadFrames | None]):
    """One row per policy as :func:`~toolkit.plots.policy_tradeoff` reads it, summed over the programs
    (None when a load's device bytes are not known)."""
    rows: dict[str, dict] = {}
    for label, v, f in zip(labels, verdicts, loads):
        if f is None or f.device_bytes is None:
            return None
        r = rows.setdefault(
            v.policy, {"policy": v.policy, "device_bytes": 0, "wrong_methods": [], "not_runnable": [], "loaded": True}
        )
        r["device_bytes"] += f.device_bytes
        r["wrong_methods"] += [f"{label}/{m}" for m in v.wrong_methods]
        r["not_runnable"] += [f"{label}/{m}" for m in v.not_runnable]
        r["loaded"] = r["loaded"] and v.failed_stage is None
    return pd.DataFrame(list(rows.values()))


def _figures(
    verdicts: Sequence[Verdict], labels: Sequence[str], loads: Sequence[LoadFrames | None]
) -> tuple[list[tuple[str, "Figure", bool]], list[str]]:
    """The correctness-vs-memory plot (several policies) and the collision matrix of each program with a
    finding, under the first policy that has one (one program: always drawn); (caption, figure, folded)."""
    programs = list(dict.fromkeys(labels))
    figures: list[tuple[str, "Figure", bool]] = []
    notes: list[str] = []
    if not any(f is not None for f in loads):
        return figures, notes
    try:
        from toolkit.plots import collision_matrix, policy_tradeoff
    except ImportError:  # matplotlib is the [plots] extra
        return figures, ["plots not drawn: matplotlib is not installed (pip install 'constshare-toolkit[plots]')"]
    trade = tradeoff_frame(verdicts, labels, loads)
    if trade is not None and len(trade) > 1:
        over = f", summed over {len(programs)} programs" if len(programs) > 1 else ""
        figures.append(
            (
                f"correctness vs memory, one point per policy{over}: lower and further left is better",
                policy_tradeoff(trade, title=f"correctness vs memory, one point per policy{over}"),
                False,
            )
        )
    chosen: dict[str, tuple[Verdict, LoadFrames]] = {}
    for label, v, f in zip(labels, verdicts, loads):
        if f is None or f.decisions is None:
            continue
        found = _has_finding(v)
        if found and (label not in chosen or not _has_finding(chosen[label][0])):
            chosen[label] = (v, f)
        elif len(programs) == 1 and label not in chosen:
            chosen[label] = (v, f)
    chosen = {k: vf for k, vf in chosen.items() if len(programs) == 1 or _has_finding(vf[0])}
    drawn = list(chosen.items())[:MAX_MATRICES]
    for label, (v, f) in drawn:
        decisions, cut = matrix_rows(f.decisions)
        figures.append(
            (
                f"collision matrix of {label} under {v.policy}: methods x constants, each cell coloured by "
                "decision; red with a cross: the method runs on other data for it" + cut,
                collision_matrix(
                    decisions, verification=f.verification, wrong_methods=v.wrong_methods, title=f"{label}: {v.policy}"
                ),
                len(drawn) > 1,
            )
        )
    if len(chosen) > len(drawn):
        notes.append(
            f"{len(chosen) - len(drawn)} more programs with findings: their collision matrices are not drawn here "
            "(constshare report PROGRAM --policy POLICY --html FILE draws one)"
        )
    return figures, notes


def matrix_rows(decisions: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The decisions a page's collision matrix is drawn from, and what its caption says of the cut: past
    :data:`MATRIX_DECISIONS` rows, those of the first names a matrix can show (those run on other data first,
    then those declined or refused, then the rest in load order), so a program of 200,000 decisions is drawn
    in seconds, not a minute; the matrix picks among them as it always does."""
    if len(decisions) <= MATRIX_DECISIONS or "name" not in decisions:
        return decisions, ""
    from toolkit.plots.matrix_view import MAX_MATRIX_COLUMNS

    names = decisions["name"].astype(str)
    bad = decisions["data_problem"].astype(str).ne("") if "data_problem" in decisions else names.eq("\0")
    caught = ~decisions["decision"].astype(str).isin(["shared", "loaded"]) if "decision" in decisions else bad
    order = pd.concat([names[bad], names[caught & ~bad], names]).drop_duplicates()
    chosen = set(order.iloc[: 2 * MAX_MATRIX_COLUMNS])
    return decisions[names.isin(chosen)], (
        f" (drawn from {len(chosen):,} of {names.nunique():,} names, those run on other data first; every "
        "decision is in the CSV)"
    )


def _has_finding(v: Verdict) -> bool:
    """Whether the findings list something of ``v``: a method that fails, or a constant it runs on other data for."""
    return v.exit_code is ExitCode.PROBLEM or any(
        c.problem is not None and (c.problem.standalone or c.blame is BlameStatus.CULPRIT) for c in v.constants
    )


# ------------------------------------------------------------------ the page


def html_report(
    verdicts: Sequence[Verdict],
    *,
    title: str,
    labels: Sequence[str] | None = None,
    unreadable: Mapping[str, str] | None = None,
    tables: Iterable[tuple[str, str]] = (),
    figures: Iterable[tuple[str, "Figure"]] = (),
    loads: Sequence[LoadFrames | None] | None = None,
    csv: str | None = None,
) -> str:
    """The whole report as one HTML document.

    ``labels``: what names each verdict's program (its path in a scan; default its name); ``loads``: beside
    each verdict, its load's frames (:class:`LoadFrames`: the plots, ``max_abs_err``, a single program's
    decisions); ``tables``: more (heading, HTML) sections, collapsed at the end (already rendered, e.g. by
    :func:`~toolkit.display.tables.html_table`); ``figures``: more (caption, matplotlib Figure), drawn
    inline as SVG; ``unreadable``: path -> error; ``csv``: where every row is (said under a cut table)."""
    unreadable = dict(unreadable or {})
    pairs = labelled(verdicts, labels)
    names = [label for label, _v in pairs]
    loads = list(loads) if loads is not None else [None] * len(verdicts)
    if len(loads) != len(verdicts):
        raise ValueError(f"loads: {len(loads)} given for {len(verdicts)} verdicts; one each (None where unknown)")
    code = _exit_code(verdicts, unreadable)
    outcomes = [v.outcome for v in verdicts] + ([UNREADABLE] if unreadable else [])
    worst = worst_outcome(outcomes or [MethodOutcome.OK])
    headlines = [f"{path}: cannot be read: {error}" for path, error in list(unreadable.items())[:OVERVIEW_ROWS]]
    if len(verdicts) == 1:
        label, v = pairs[0]
        headlines.insert(0, _said(v.headline(label if label != v.program else None)))
    summary_heading, summary = summary_table(verdicts, labels, loads, unreadable, csv)
    open_tables = []
    if len(verdicts) == 1 and loads[0] is not None and loads[0].verification is not None:
        open_tables.append(
            (
                "Verification: each method against its oracle",
                Markup(verification_html(loads[0].verification, verdicts[0])),
            )
        )
    if unreadable:
        frame = pd.DataFrame({"path": list(unreadable), "error": list(unreadable.values())})
        open_tables.append(("Programs that cannot be read", Markup(_table(frame, csv))))
    policy_names = list(dict.fromkeys(v.policy for v in verdicts))
    releases = dict(zip(*(lambda f: (f["policy"], f["executorch"]))(policies_frame(verdicts, labels))))
    policies = []
    for p in policy_names:
        at = [i for i, v in enumerate(verdicts) if v.policy == p]
        policies.append(
            _policy_detail(
                p,
                [verdicts[i] for i in at],
                [names[i] for i in at],
                [loads[i] for i in at],
                releases.get(p, ""),
                csv,
                verification=len(verdicts) > 1,  # one load: its verification is shown above
            )
        )
    drawn, figure_notes = _figures(verdicts, names, loads)
    shown = [(*_drawn(caption, fig), folded) for caption, fig, folded in drawn]
    shown += [(*_drawn(caption, fig), False) for caption, fig in figures]
    page = _TEMPLATE.render(
        title=title,
        outcome=worst,
        outcome_bg=outcome_colour(worst) or NOT_RUN_COLOUR,
        note_text=WARNING_TEXT,
        exit_code=int(code),
        exit_meaning=EXIT_CODE_MEANINGS[code],
        headlines=headlines,
        counts=_counts(verdicts, labels, unreadable),
        summary_heading=summary_heading,
        summary=Markup(summary),
        open_tables=open_tables,
        findings=Markup(findings_table(verdicts, labels, csv)),
        not_checked=Markup(_not_checked_table(verdicts, labels, csv)),
        policies=policies,
        figures=shown,
        figure_notes=figure_notes,
        tables=[(h, Markup(b)) for h, b in tables],
    )
    return html_safe(page)


def html_report_of_session(
    session: "Session", verification: pd.DataFrame | None = None, *, csv: str | None = None
) -> str:
    """:func:`html_report` of one load (or dry run): its verdict, verification, decisions and the
    collision matrix (when matplotlib is installed)."""
    v = session.verdict()
    kind = "dry run (a prediction)" if v.predicted else "load"
    return html_report(
        [v],
        title=f"constshare: {session.program.name} under {v.policy}, {kind}",
        loads=[LoadFrames.of(session, verification)],
        csv=csv,
    )
