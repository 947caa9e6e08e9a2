"""The HTML report: one self-contained page a CI can keep, read from verdicts.

Summary and alerts first (as profiling reports do), then the culprits, the tables
(:func:`toolkit.display.tables.html_table`, coloured as in a notebook) and the plots as inline SVG.
No script, no stylesheet or font from a network: it opens offline.  :func:`html_report` makes the
page of any verdicts (a scan, a comparison); :func:`html_report_of_session` the page of one load.

Every text is escaped twice over: as HTML (autoescape), and for what nobody can see or UTF-8 cannot
hold (:func:`~toolkit.display.cells.one_line` on every line of text, the tables through
:func:`~toolkit.display.tables.html_table`); what a figure's SVG carries of a name is cleaned the same
way (:func:`html_safe`), so a hostile name costs neither the page nor its readability.
"""

from __future__ import annotations

import io
from collections import Counter
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import jinja2
import pandas as pd
from markupsafe import Markup

from toolkit.core.verdict import BAD_OUTCOMES, EXIT_CODE_MEANINGS, Verdict
from toolkit.core.vocab import UNREADABLE, ExitCode, MethodOutcome
from toolkit.display.cells import one_line
from toolkit.display.findings import verification_html
from toolkit.display.palette import CULPRIT_TEXT, NOT_RUN_COLOUR, WARNING_TEXT, outcome_colour
from toolkit.display.tables import html_table
from toolkit.reports.summary import (
    culprits_frame,
    failure_message,
    labelled,
    outcome_rank,
    verdicts_frame,
    worst_outcome,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from toolkit.engine.session import Session


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
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; max-width: 110em; color: #222 }
h1 { font-size: 1.4em } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd }
.outcome { font-weight: bold; padding: 2px 8px; border-radius: 3px }
.alerts li { margin: 0.3em 0 } .alert-bad { color: {{ bad_text }} } .alert-note { color: {{ note_text }} }
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
{% if alerts %}<ul class="alerts">{% for cls, text in alerts %}<li class="alert-{{ cls }}">{{ text }}</li>\
{% endfor %}</ul>
{% else %}<p>none: every method runs on its own data</p>{% endif %}
</section>
<section id="culprits"><h2>Culprits: constants a method runs on other data for</h2>{{ culprits }}</section>
{% for heading, body in tables %}<section><h2>{{ heading }}</h2>{{ body }}</section>
{% endfor %}{% if figures %}<section id="plots"><h2>Plots</h2>
{% for caption, svg in figures %}<figure>{{ svg }}<figcaption>{{ caption }}</figcaption></figure>
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
    culprits, before the table of every method's outcome (already rendered, e.g. by
    :func:`~toolkit.display.tables.html_table`); ``figures``: (caption, matplotlib Figure), drawn
    inline as SVG; ``unreadable``: path -> error."""
    unreadable = dict(unreadable or {})
    code = _exit_code(verdicts, unreadable)
    outcomes = Counter(m.outcome for v in verdicts for m in v.methods)
    worst = worst_outcome([*outcomes, *([UNREADABLE] if unreadable else [])] or [MethodOutcome.OK])
    alerts = [("bad", f"{path}: cannot be read: {error}") for path, error in unreadable.items()]
    for label, v in labelled(verdicts, labels):
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
        ("programs", len({label for label, _v in labelled(verdicts, labels)}) + len(unreadable)),
        ("policies", len({v.policy for v in verdicts})),
        *((f"methods {o}", n) for o, n in sorted(outcomes.items(), key=lambda kv: outcome_rank(kv[0]))),
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
    page = _TEMPLATE.render(
        title=title,
        outcome=worst,
        outcome_bg=outcome_colour(worst) or NOT_RUN_COLOUR,
        bad_text=CULPRIT_TEXT,
        note_text=WARNING_TEXT,
        exit_code=int(code),
        exit_meaning=EXIT_CODE_MEANINGS[code],
        counts=counts,
        alerts=alerts,
        culprits=Markup(
            html_table(culprits, max_rows=len(culprits) or 1, empty="none: no method runs on another constant's data")
        ),
        tables=[(h, Markup(b)) for h, b in [*tables, *sections]],
        figures=[_drawn(caption, fig) for caption, fig in figures],
    )
    return html_safe(page)


def _drawn(caption: str, fig: "Figure") -> tuple[str, Markup]:
    """(caption, inline SVG) of a figure; a figure matplotlib cannot draw (a label holding a lone surrogate,
    from a file name that is not UTF-8) costs that figure, said in its caption, never the report."""
    try:
        return caption, Markup(figure_svg(fig))
    except (TypeError, ValueError, RuntimeError) as e:
        return f"{caption}: not drawn ({type(e).__name__}: a name in it cannot be drawn)", Markup("")


def html_report_of_session(session: "Session", verification: pd.DataFrame | None = None) -> str:
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
