"""Reports a CI can keep: one self-contained HTML file and JUnit XML, read from verdicts.

Both are built from :class:`~toolkit.core.verdict.Verdict` objects and the frames and plots the
other surfaces show; nothing is decided here again.

- :func:`html_report`: summary and alerts first (as profiling reports do), then the culprits,
  the tables (:func:`toolkit.display.html.html_table`, coloured as in a notebook) and the plots as
  inline SVG.  No script, no stylesheet or font from a network: it opens offline.
- :func:`junit_xml`: a ``<testsuite>`` per program and policy, a ``<testcase>`` per method
  (``classname`` the program and policy); a method that runs wrong, is not runnable, failed or
  was refused is a ``<failure>`` whose message names the constants it runs on other data for;
  a method without a reference is ``<skipped>``; a program that cannot be read is an ``<error>``.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import jinja2
import pandas as pd
from markupsafe import Markup

from toolkit.core.verdict import BAD_OUTCOMES, EXIT_CODE_MEANINGS, Verdict
from toolkit.core.vocab import BlameStatus, ExitCode, MethodOutcome
from toolkit.display.html import findings_text, html_table, outcome_colour, verification_html

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from toolkit.engine.session import Session

UNREADABLE = "unreadable"  # scan's outcome for a program that cannot be opened
# worst first: what one program's row in scan's summary shows as its outcome
SEVERITY = ("wrong", "not runnable", "failed", UNREADABLE, "refused", "not reached", "no reference", "ok")
SHORT_TEXT = 48  # characters of an error or a list shown in a summary row; the whole text is in the CSV / HTML

_TEMPLATE = jinja2.Environment(autoescape=True).from_string("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; max-width: 110em; color: #222 }
h1 { font-size: 1.4em } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd }
.outcome { font-weight: bold; padding: 2px 8px; border-radius: 3px }
.alerts li { margin: 0.3em 0 } .alert-bad { color: #990000 } .alert-note { color: #7f6000 }
.counts span { display: inline-block; margin-right: 1.2em }
figure { margin: 1em 0 } figure svg { max-width: 100%; height: auto }
</style></head><body>
<h1>{{ title }}</h1>
<section id="summary"><h2>Summary</h2>
<p><span class="outcome" style="background-color: {{ outcome_bg }}">{{ outcome }}</span>
exit code {{ exit_code }} ({{ exit_meaning }})</p>
<p class="counts">{% for label, n in counts %}<span>{{ label }}: <b>{{ n }}</b></span>{% endfor %}</p>
</section>
<section id="alerts"><h2>Alerts</h2>
{% if alerts %}<ul class="alerts">{% for cls, text in alerts %}<li class="alert-{{ cls }}">{{ text }}</li>{% endfor %}</ul>
{% else %}<p>none: every method runs on its own data</p>{% endif %}
</section>
<section id="culprits"><h2>Culprits: constants a method runs on other data for</h2>{{ culprits }}</section>
{% for heading, body in tables %}<section><h2>{{ heading }}</h2>{{ body }}</section>
{% endfor %}{% if figures %}<section id="plots"><h2>Plots</h2>
{% for caption, svg in figures %}<figure>{{ svg }}<figcaption>{{ caption }}</figcaption></figure>
{% endfor %}</section>{% endif %}
</body></html>
""")


def _culprit_findings(v: Verdict) -> list:
    """The findings a surface lists: culprits, and problems that make a method wrong on their own."""
    return [
        c for c in v.constants if c.problem is not None and (c.problem.standalone or c.blame is BlameStatus.CULPRIT)
    ]


def failure_message(v: Verdict, method: str) -> str:
    """One line: a method's outcome, its reason, and the constants it runs on other data for."""
    m = v.method(method)
    found = findings_text(v, method)
    return (
        f"{method} {m.outcome.value} under {v.policy!r}"
        + (f": {m.reason}" if m.reason else "")
        + (f"; runs on other data for {found}" if found else "")
    )


def _labelled(verdicts: Sequence[Verdict], labels: Sequence[str] | None) -> list[tuple[str, Verdict]]:
    """Each verdict with the name that tells its program apart (``labels``: e.g. paths; default the program's name)."""
    return list(zip(labels if labels is not None else [v.program for v in verdicts], verdicts, strict=True))


def verdicts_frame(verdicts: Sequence[Verdict], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per program, policy and method: its outcome and the failure message."""
    return pd.DataFrame(
        [
            {
                "program": label,
                "policy": v.policy,
                "method": m.method,
                "outcome": m.outcome.value,
                "message": failure_message(v, m.method) if m.outcome in BAD_OUTCOMES else m.reason,
            }
            for label, v in _labelled(verdicts, labels)
            for m in v.methods
        ],
        columns=["program", "policy", "method", "outcome", "message"],
    )


def culprits_frame(verdicts: Sequence[Verdict], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Every constant some method runs (would run) on other data for, across the verdicts."""
    return pd.DataFrame(
        [
            {
                "program": label,
                "policy": v.policy,
                "method": c.method,
                "name": c.name,
                "fqn": c.fqn,
                "data_problem": c.problem.value if c.problem else "",
                "evidence": c.evidence,
                "shared_from": c.shared_from,
                "blame": c.blame.value,
                "blame_note": c.blame_note,
            }
            for label, v in _labelled(verdicts, labels)
            for c in _culprit_findings(v)
        ],
        columns=[
            "program",
            "policy",
            "method",
            "name",
            "fqn",
            "data_problem",
            "evidence",
            "shared_from",
            "blame",
            "blame_note",
        ],
    )


def figure_svg(fig: "Figure") -> str:
    """A matplotlib figure as an inline ``<svg>`` element (no XML prologue, no external reference)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _exit_code(verdicts: Sequence[Verdict], unreadable: Mapping[str, str]) -> ExitCode:
    return ExitCode.worst([*(v.exit_code for v in verdicts), *([ExitCode.PROBLEM] if unreadable else [])])


def html_report(
    verdicts: Sequence[Verdict],
    *,
    title: str,
    labels: Sequence[str] | None = None,
    unreadable: Mapping[str, str] | None = None,
    tables: Iterable[tuple[str, str]] = (),
    figures: Iterable[tuple[str, "Figure"]] = (),
) -> str:
    """The whole report as one HTML document.  ``labels``: what names each verdict's program
    (its path in a scan; default its name); ``tables``: (heading, HTML) sections after the
    culprits, before the table of every method's outcome (already rendered, e.g. by :func:`~toolkit.display.html.html_table`); ``figures``:
    (caption, matplotlib Figure), drawn inline as SVG; ``unreadable``: path -> error."""
    unreadable = dict(unreadable or {})
    code = _exit_code(verdicts, unreadable)
    outcomes = Counter(m.outcome.value for v in verdicts for m in v.methods)
    worst = _worst([*outcomes, *([UNREADABLE] if unreadable else [])] or ["ok"])
    alerts = [("bad", f"{path}: cannot be read: {error}") for path, error in unreadable.items()]
    for label, v in _labelled(verdicts, labels):
        if v.exit_code is ExitCode.PROBLEM:
            alerts.append(("bad", (f"{label}: " if label != v.program else "") + v.headline()))
            alerts += [
                ("bad", (f"{label}: " if label != v.program else "") + failure_message(v, m.method))
                for m in v.methods
                if m.outcome in BAD_OUTCOMES
            ]
        elif v.exit_code is ExitCode.NOT_VERIFIED:
            alerts.append(("note", v.headline()))
    counts = [
        ("programs", len({label for label, _v in _labelled(verdicts, labels)}) + len(unreadable)),
        ("policies", len({v.policy for v in verdicts})),
        *((f"methods {o}", n) for o, n in sorted(outcomes.items(), key=lambda kv: _rank(kv[0]))),
    ]
    culprits = culprits_frame(verdicts, labels)
    methods = verdicts_frame(verdicts, labels)
    sections = [("Methods: the outcome of each (the verdict)", html_table(methods, max_rows=len(methods) or 1))]
    if unreadable:
        sections.append(
            (
                "Programs that cannot be read",
                html_table(
                    pd.DataFrame({"path": list(unreadable), "error": list(unreadable.values())}),
                    max_rows=len(unreadable),
                ),
            )
        )
    return _TEMPLATE.render(
        title=title,
        outcome=worst,
        outcome_bg=outcome_colour(worst) or "#eeeeee",
        exit_code=int(code),
        exit_meaning=EXIT_CODE_MEANINGS[code],
        counts=counts,
        alerts=alerts,
        culprits=Markup(
            html_table(culprits, max_rows=len(culprits) or 1, empty="none: no method runs on another constant's data")
        ),
        tables=[(h, Markup(b)) for h, b in [*tables, *sections]],
        figures=[(caption, Markup(figure_svg(fig))) for caption, fig in figures],
    )


def session_html_report(session: "Session", verification: pd.DataFrame | None = None) -> str:
    """:func:`html_report` of one load (or dry run): its decisions, its verification, and the
    collision matrix (when matplotlib is installed)."""
    v = session.verdict()
    d = session.decisions
    tables = [
        (
            "Decisions",
            html_table(
                d,
                [
                    c
                    for c in ("method", "name", "fqn", "lookup", "decision", "reason", "data_problem")
                    if c in d.columns
                ],
                max_rows=max(len(d), 1),
            ),
        )
    ]
    if verification is not None:
        tables.insert(0, ("Verification", verification_html(verification, v)))
    figures = []
    try:
        from toolkit.plots import collision_matrix

        figures.append(
            (
                "methods x constants, each cell coloured by decision; red with a cross: the method runs on "
                "other data for it",
                collision_matrix(session, verification=verification),
            )
        )
    except ImportError:  # matplotlib is the [plots] extra
        tables.append(
            ("Plots", "<p>not drawn: matplotlib is not installed (pip install 'constshare-toolkit[plots]')</p>")
        )
    kind = "dry run (a prediction)" if v.predicted else "load"
    return html_report(
        [v], title=f"constshare: {session.program.name} under {v.policy}, {kind}", tables=tables, figures=figures
    )


def junit_xml(
    verdicts: Sequence[Verdict],
    *,
    labels: Sequence[str] | None = None,
    unreadable: Mapping[str, str] | None = None,
    name: str = "constshare",
) -> str:
    """JUnit XML (the ``testsuites/testsuite/testcase`` shape CI systems read): see the module
    docstring; ``labels`` as :func:`html_report`'s."""
    root = ET.Element("testsuites", name=name)
    totals = Counter()
    for path, error in (unreadable or {}).items():
        suite = ET.SubElement(root, "testsuite", name=path, tests="1", failures="0", errors="1", skipped="0")
        case = ET.SubElement(suite, "testcase", name="open", classname=path)
        ET.SubElement(case, "error", message=f"cannot be read: {error}", type=UNREADABLE).text = error
        totals.update(tests=1, errors=1)
    for label, v in _labelled(verdicts, labels):
        suite = ET.SubElement(root, "testsuite", name=f"{label} under {v.policy}")
        counts = Counter(tests=len(v.methods))
        for m in v.methods:
            case = ET.SubElement(suite, "testcase", name=m.method, classname=f"{label} under {v.policy}")
            if m.outcome in BAD_OUTCOMES:
                message = failure_message(v, m.method)
                ET.SubElement(case, "failure", message=message, type=m.outcome.value).text = message
                counts.update(failures=1)
            elif m.outcome is MethodOutcome.NO_REFERENCE:
                ET.SubElement(case, "skipped", message=f"no reference: {m.reason}" if m.reason else "no reference")
                counts.update(skipped=1)
        for key in ("tests", "failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
        totals.update(counts)
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(totals[key]))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def scan_summary(frame: pd.DataFrame, root: "str | Path | None" = None) -> pd.DataFrame:
    """scan's rows (one per program, policy and method) as one row per program: its worst outcome,
    the methods that fail the gate, the policies under which any does, and the first error,
    shortened; paths relative to ``root`` (the folder scanned)."""
    rows = []
    for path, g in frame.groupby("path", sort=False):
        shown = str(Path(path).relative_to(root)) if root is not None and Path(path).is_relative_to(root) else path
        bad = g[g["outcome"].isin([*BAD_OUTCOMES, UNREADABLE])]
        policies = list(dict.fromkeys(p for p in bad["policy"] if p))
        asked = list(dict.fromkeys(p for p in g["policy"] if p))
        errors = [e.removeprefix(f"{path}: ") for e in g["error"] if e]  # the path is in its own column
        rows.append(
            {
                "path": shown,
                "outcome": _worst(g["outcome"]),
                "failing methods": _short(", ".join(dict.fromkeys(m for m in bad["method"] if m))),
                "policies failing": f"{len(policies)} of {len(asked)}"
                + (f": {_short(', '.join(policies))}" if policies else "")
                if asked
                else "",
                "first error": _short(errors[0]) if errors else "",
            }
        )
    return pd.DataFrame(rows, columns=["path", "outcome", "failing methods", "policies failing", "first error"])


def _rank(outcome: str) -> int:
    return SEVERITY.index(outcome) if outcome in SEVERITY else 0  # an outcome this module does not know: the worst


def _worst(outcomes: Iterable[str]) -> str:
    return min(outcomes, key=_rank)


def _short(text: str, width: int = SHORT_TEXT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"
