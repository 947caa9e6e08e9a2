"""The explorer's panels: each re-rendered from the state when a trait it shows changes
(:data:`PANELS`), the collision matrix with its clicks included.

A mixin of :class:`toolkit.explorer.view.Explorer` (its widgets and state).  Rendering never leaves
a traceback wall: a panel that cannot be shown says so in the error box.
"""

from __future__ import annotations

import base64
import html
from typing import Any, Callable

import pandas as pd

from toolkit.core.errors import ToolkitError
from toolkit.core.policies.releases import executorch_releases
from toolkit.core.vocab import MethodOutcome
from toolkit.display.cells import cell_text, format_bytes
from toolkit.display.findings import verification_html
from toolkit.display.palette import ERROR_TEXT, WARNING_TEXT, WRONG_COLOUR
from toolkit.display.session import session_facts_html
from toolkit.display.tables import html_table
from toolkit.display.text import markdown_html
from toolkit.explorer.browsing import ALL, DECISION_TABLE_COLUMNS, FILTERS
from toolkit.explorer.exports import EXPORT_SCOPES, EXPORT_SUFFIX
from toolkit.explorer.findings import findings_summary
from toolkit.explorer.grid import GRID_HEIGHT, count_text, grid_frame, grid_options
from toolkit.explorer.markup import (
    COMPARISON_COLOURS,
    COMPARISON_COLUMNS,
    FINDING_COLOURS,
    banner,
    box,
    comparison_display,
    download_link,
    table_html,
)
from toolkit.explorer.state import INPUTS
from toolkit.explorer.text import one_line
from toolkit.explorer.widgets import close_widget

TAB_TITLES = ("Overview", "Decisions", "Timeline & memory", "Policies", "Export")
DECISIONS_TAB = TAB_TITLES.index("Decisions")
BAR_STYLES = {
    MethodOutcome.OK: "success",
    MethodOutcome.WRONG: "warning",
    MethodOutcome.FAILED: "danger",
    MethodOutcome.REFUSED: "danger",
}

# each panel of the view, and the state's traits it shows (re-rendered when one changes)
PANELS = {
    "_render_inputs": INPUTS,
    "_render_stale": INPUTS + ("session", "shown_inputs", "loading", "error"),
    "_render_progress": ("busy", "progress", "message", "outcome", "error"),
    "_render_error": ("error",),
    "_render_session": ("session",),
    "_render_decisions": ("rows",),
    "_render_selection": ("selected",),
    "_render_comparison": ("comparison",),
    "_render_export": ("session", "export_dir", "export_ok", "export_message"),
    "_render_rows_export": ("rows_exported", "rows_export_file", "error"),
}


class PanelsMixin:
    """The view's render methods, one a panel, and the widget updates they make."""

    def _shown(self, name: str) -> Callable[[Any], None]:
        """The observer that re-renders panel ``name``: rendering never leaves a traceback wall."""

        def handler(_change) -> None:
            try:
                getattr(self, name)()
            except Exception as e:  # noqa: BLE001
                self.error.value = box(
                    "constshare-error", f"could not display {name[len('_render_') :]}: {one_line(e)}"
                )
                self.error.layout.display = None

        return handler

    def _set(self, widget, **values) -> None:
        self._updating = True
        try:
            for k, v in values.items():
                setattr(widget, k, v)
        finally:
            self._updating = False

    @staticmethod
    def _show_png(widget, png: bytes) -> None:
        """An image widget shows its picture, or nothing at all (no broken-image box) when empty."""
        widget.value = png or b""
        widget.layout.display = None if png else "none"

    def _render_inputs(self) -> None:
        s = self.state
        if not s.busy:
            self.load_button.description = "Dry run" if s.dry_run else "Load"
        for widget, shown in (
            (self.sample, s.program_from == "sample"),
            (self.sample_info, s.program_from == "sample"),
            (self.path, s.program_from == "path"),
        ):
            widget.layout.display = None if shown else "none"
        self.sample_info.value = (
            f"<div style='font-size: 12px; line-height: 1.45; max-width: 110ch'>{s.sample_description_html}</div>"
        )
        self.policy_info.value = (
            f"<div style='font-size: 11px; line-height: 1.45; max-width: 130ch'>"
            f"{markdown_html(f'**{s.policy}**: {s.policy_summary}')}</div>"
        )

    def _render_stale(self) -> None:
        reason = self.state.stale_reason
        (self.tabs.add_class if reason else self.tabs.remove_class)("constshare-stale")  # before the banner says so
        self.stale_banner.value = box("constshare-stale-banner", reason)
        self.stale_banner.layout.display = None if reason else "none"

    def _render_progress(self, elapsed: float | None = None) -> None:
        s = self.state
        self.progress.value = s.progress
        failed = bool(s.error and s.error_scope not in EXPORT_SCOPES)
        style = "danger" if failed else ("info" if s.busy else BAR_STYLES.get(s.outcome, "info"))
        self.progress.bar_style = style
        for b in (
            self.load_button,
            self.compare_button,
            self.export_button,
            self.export_rows_button,
            self.export_rows_excel_button,
        ):
            b.disabled = s.busy
        self.load_button.description = "Working…" if s.busy else ("Dry run" if s.dry_run else "Load")
        clock = f" ({elapsed:.0f} s)" if s.busy and elapsed is not None and elapsed >= 1 else ""
        colour = {"danger": ERROR_TEXT, "warning": WARNING_TEXT}.get(style)
        text = html.escape(s.message + clock)
        self.status.value = f"<span style='color: {colour}'>{text}</span>" if colour else text

    def _render_error(self) -> None:
        s = self.state
        if not s.error or s.error_scope in EXPORT_SCOPES:  # export errors are shown next to their button
            self.error.value, self.error.layout.display = "", "none"
            return
        detail = (
            f"<details><summary>details</summary><pre>{html.escape(s.error_detail[-4000:])}</pre></details>"
            if s.error_detail
            else ""
        )
        self.error.value = f"<div class='constshare-error'><b>{html.escape(s.error)}</b>{detail}</div>"
        self.error.layout.display = None

    def _render_session(self) -> None:
        s = self.state
        if s.session is None:
            return
        v = s.verdict
        self.dry_banner.value = banner(s.banner)
        self.dry_banner.layout.display = None if s.banner else "none"
        self.summary.value = (
            box("constshare-verdict", v.headline(name=s.program_label))
            + box("constshare-releases", f"{v.policy}: {executorch_releases(v.policy)}")
            + box("constshare-not-checked", f"not checked: {v.gaps()}" if v.not_checked else "")
            + box("constshare-findings", findings_summary(v))
            + session_facts_html(s.session, predicted=v.predicted, name=s.program_label)
        )
        self.verification.value = f"<b>{'prediction' if v.predicted else 'verification'}</b>" + verification_html(
            s.verification, v, empty="no methods"
        )
        pngs = s.session_pngs()
        self._render_matrix(pngs["collision matrix"])
        self._show_png(self.timeline, pngs["timeline"])
        self._show_png(self.memory, pngs["memory"])

    def _render_matrix(self, png: bytes) -> None:
        """The interactive matrix (plotly: hover a cell for its decision, reason and blame's verdict),
        and the matplotlib PNG as a download link; without plotly, the PNG itself."""
        s = self.state
        name = html.escape(s.default_export_name().replace(EXPORT_SUFFIX, "-collision-matrix.png"), quote=True)
        data = base64.b64encode(png).decode("ascii")
        try:
            import plotly.graph_objects as go

            from toolkit.plots import interactive_collision_matrix

            fig = go.FigureWidget(
                interactive_collision_matrix(s.session, wrong_methods=s.verdict.wrong_methods, name=s.program_label)
            )
        except ImportError:  # no plotly
            self._set_matrix(())
            self.matrix.layout.display = "none"
            self.matrix_png.value = (
                f"<img class='constshare-plot' style='max-width: 100%' src='data:image/png;base64,{data}'>"
            )
            return
        if fig.data:
            fig.data[0].on_click(self._matrix_click)
        self._set_matrix((fig,))
        self.matrix.layout.display = None
        self.matrix_png.value = (
            f"<div style='font-size: 12px'>hover a cell for its decision and reason, "
            f"click it to see that constant in Decisions · "
            f'<a download="{name}" href="data:image/png;base64,{data}">download as PNG</a>'
            f"</div>"
        )

    def _set_matrix(self, children: tuple) -> None:
        old, self.matrix.children = self.matrix.children, children
        for fig in old:
            close_widget(fig)

    def _matrix_click(self, trace, points, _state=None) -> None:
        """A click on a matrix cell: that constant selected (the filters cleared when they hide it)
        and the Decisions tab shown, grid row and detail panel on it."""
        if not points.xs:
            return
        meta = trace.meta or {}
        x = points.xs[0]
        if meta.get("long"):  # a long matrix: a column per method, a row per name (a header row: none)
            i, j = list(trace.x).index(x), meta["rows"][int(points.ys[0])]
            if j < 0:
                return
        else:
            if isinstance(x, (list, tuple)):  # a matrix grouped by layer: (layer, label) columns
                columns, x = list(zip(*trace.x)), tuple(x)
            else:
                columns = list(trace.x)
            i, j = list(trace.y).index(points.ys[0]), columns.index(x)
        method, name = meta["methods"][i], meta["names"][i][j]
        if not name:  # a method without that constant
            return
        key = (method, name)
        s = self.state
        if key not in set(zip(s.rows["method"], s.rows["name"])):
            self._guarded(s.set_filters, method=ALL, decision=ALL, reason=ALL, culprits_only=False)
        self._guarded(s.select, method, name)
        self.tabs.selected_index = DECISIONS_TAB

    def _render_decisions(self) -> None:
        """The filters, the grid (or, without itables, a table) and the count: all of ``state.rows``."""
        s = self.state
        opts = s.filter_options()
        for key in FILTERS:
            self._set(
                getattr(self, f"filter_{key}"),
                options=[("all", ALL)] + [(o, o) for o in opts[key]],
                value=getattr(s, f"filter_{key}"),
            )
        self._set(self.culprits_only, value=s.culprits_only)
        rows = s.rows
        keys = list(zip(rows["method"], rows["name"]))
        self._grid_keys = keys
        head = findings_summary(s.verdict, set(keys))
        # the count and the grid from one frame, total and "(filtered)" read once: they cannot disagree
        frame, total, filtered = grid_frame(rows, s.verdict), s.total_decisions, s.filtered
        self.count = count_text(len(frame), total, filtered)
        if self.grid is not None:
            self.decisions.value = box(
                "constshare-findings",
                " · ".join(t for t in (head, "click a row to see that constant" if keys else "") if t),
            )
            self._updating = True
            try:
                # every option again: itables' update() forgets those not given (allow_html among them);
                # the count is the grid's info line (its _TOTAL_: the frame's rows its own search leaves)
                self.grid.update(
                    frame,
                    selected_rows=[keys.index(s.selected)] if s.selected in keys else [],
                    **grid_options(total, filtered),
                )
            finally:
                self._updating = False
        else:  # no itables: the renderer's table, scrolling inside a bounded box
            self.decisions.value = (
                box("constshare-findings", " · ".join(t for t in (self.count, head) if t))
                + f"<div style='max-height: {GRID_HEIGHT}; overflow: auto'>"
                + table_html(rows, DECISION_TABLE_COLUMNS, "no decision matches the filters")
                + "</div>"
            )
        self._set(
            self.constant,
            options=[(f"{m} / {n}", (m, n)) for m, n in keys],
            value=s.selected if s.selected in set(keys) else None,
        )

    def _render_selection(self) -> None:
        s = self.state
        if s.selected in [v for _l, v in self.constant.options]:
            self._set(self.constant, value=s.selected)
        if self.grid is not None:
            selected = [self._grid_keys.index(s.selected)] if s.selected in self._grid_keys else []
            if list(self.grid.selected_rows) != selected:
                self._set(self.grid, selected_rows=selected)
        d = s.selected_decision()
        if d is None:
            self.constant_detail.value = ""
            return
        kind, sentence = s.content_verdict()
        f = s.selected_finding()
        same = d.get("same_content")
        facts = [
            ("decision", d["decision"]),
            ("reason", d["reason"]),
            ("lookup", d["lookup"] or "not looked up"),
            ("bytes", f"{format_bytes(d['nbytes'])} ({int(d['nbytes']):,})"),
            ("cached", d["cached_method"] or "no cache entry"),
            ("runs on", d.get("shared_from")),
            ("content digest", d["digest"]),
            ("cached digest", d["cached_digest"]),
            ("same content", "" if same is None or same is pd.NA else "yes" if same else "NO"),
        ]
        blame = "" if f is None else f"{f.blame.value}: {f.blame_note}" if f.blame_note else f.blame.value
        if f is not None:
            problem = f.problem.value if f.problem else "no known difference"
            facts += [("runs on other data", f"{problem}: {f.evidence}"), ("blame", blame)]
        facts = pd.DataFrame([(k, v) for k, v in facts if cell_text(v)], columns=["fact", "value"])
        colour = FINDING_COLOURS.get(kind, "")
        marked = {cell_text(d["decision"]), blame} if colour else set()
        head = html_table(
            facts,
            max_rows=len(facts),
            colours={"value": lambda text: WRONG_COLOUR if text == "NO" else (colour if text in marked else "")},
        )
        comp = s.selected_comparison()
        body = html_table(
            comp.assign(equal=["yes" if e else "NO" for e in comp["equal"]]),
            max_rows=len(comp),
            empty="nothing was compared field by field for this constant (see the reason above)",
            colours={"equal": lambda text: WRONG_COLOUR if text == "NO" else ""},
        )
        self.constant_detail.value = (
            f"<b>{html.escape(d['method'])} / {html.escape(d['name'])}</b>"
            + box(f"constshare-verdict constshare-verdict-{kind.replace(' ', '-')}", sentence)
            + head
            + "<b>cached vs new</b>"
            + body
        )

    def _render_comparison(self) -> None:
        from toolkit.plots import figure_png

        s = self.state
        if s.comparison is None:
            self._show_png(self.tradeoff, b"")
            self._show_png(self.memory_policies, b"")
            self.comparison.value = markdown_html("*press “Compare all policies” to load it under every policy*")
            return
        figs = s.figures(session=False)
        self._show_png(self.tradeoff, figure_png(figs["policy trade-off"]))
        self._show_png(self.memory_policies, figure_png(figs["memory by policy"]))
        # each row is the policy's verdict (compare.policy_row); lists shown comma-joined by the renderer
        self.comparison.value = banner(s.comparison_banner) + table_html(
            comparison_display(s.comparison.frame), COMPARISON_COLUMNS, "no policies", colours=COMPARISON_COLOURS
        )

    def _render_export(self) -> None:
        s = self.state
        self._set(self.export_folder, value=str(s.export_dir))
        try:
            self.export_path.placeholder = s.default_export_path()
        except ToolkitError:
            self.export_path.placeholder = str(s.export_dir / s.default_export_name())
        if s.export_ok is None:
            self.export_result.value = ""
        elif not s.export_ok:
            self.export_result.value = box("constshare-error", s.export_message)
        else:
            target = s.exported
            self.export_result.value = (
                f"<div class='constshare-ok'>wrote <code>{html.escape(str(target))}</code> "
                f"({len(s.report.frame) if s.report is not None else 0:,} rows, {format_bytes(target.stat().st_size)})"
                f"{download_link(target)}</div>"
            )

    def _render_rows_export(self) -> None:
        s = self.state
        if s.error and s.error_scope == "rows":
            self.export_rows_result.value = box("constshare-error", s.error)
        elif s.rows_exported and s.rows_export_file is not None:
            self.export_rows_result.value = (
                f"<div class='constshare-ok'>{html.escape(s.rows_exported)}{download_link(s.rows_export_file)}</div>"
            )
        else:
            self.export_rows_result.value = box("constshare-ok", s.rows_exported)
