"""The explorer's ipywidgets view: widgets linked to an :class:`~toolkit.explorer.state.ExplorerState`'s
choices, its panels (:mod:`.panels`) re-rendered when the state changes, its actions run on a worker
thread so the notebook stays responsive.

ipywidgets and itables are imported when a view is made.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import traitlets

from toolkit.build.samples import sample_names
from toolkit.core.errors import ToolkitError
from toolkit.core.policies import POLICIES
from toolkit.core.policies.releases import executorch_releases
from toolkit.explorer.browsing import ALL, FILTERS
from toolkit.explorer.devices import device_options
from toolkit.explorer.grid import grid_frame, grid_options
from toolkit.explorer.loading import PATH_HINT
from toolkit.explorer.markup import box
from toolkit.explorer.panels import PANELS, TAB_TITLES, PanelsMixin
from toolkit.explorer.state import INPUTS, PROGRAM_FROM, ExplorerState
from toolkit.explorer.style import CSS
from toolkit.explorer.widgets import close_widget, itable_class, require_ipywidgets

MATRIX_HEIGHT = "760px"  # the Overview's matrix scrolls inside this height (a long one: 16 px a name)


def policy_options() -> list[tuple[str, str]]:
    """The policy dropdown's choices: each policy named with the ExecuTorch releases that run it."""
    return [(f"{p} · {executorch_releases(p)}", p) for p in POLICIES]


class Explorer(PanelsMixin):
    """The ipywidgets view of an :class:`ExplorerState`.

    ``Explorer(sample="total_collision", policy="name-only")`` in a notebook cell shows it.
    ``background=False`` runs actions on the calling thread (tests do this).
    """

    def __init__(self, state: ExplorerState | None = None, *, background: bool = True, **state_kw: Any):
        w = require_ipywidgets()
        self.state = state or ExplorerState(**state_kw)
        self.background = background
        self._worker: threading.Thread | None = None
        self._updating = False
        self._grid_keys: list[tuple[str, str]] = []
        self.count = ""  # the Decisions tab's count, "N of M decisions (filtered)", of the grid's own frame
        s = self.state
        self._widgets: list[Any] = []

        def mk(cls, css: str | None = None, **kw):
            obj = cls(**kw)
            if css:
                obj.add_class(css)
            self._widgets.append(obj)
            return obj

        def picture():  # natural size, never stretched by the flex box around it; hidden while empty
            return w.Layout(
                max_width="100%", height="auto", align_self="flex-start", object_fit="contain", display="none"
            )

        self.title = mk(w.HTML, value=CSS + "<h3 style='margin:4px 0'>constshare explorer</h3>")
        self.program_from = mk(
            w.ToggleButtons, "constshare-program-from", options=list(PROGRAM_FROM), description="program"
        )
        self.sample = mk(w.Dropdown, "constshare-sample", options=sample_names(), description="sample")
        self.path = mk(
            w.Text,
            "constshare-path",
            description="path",
            placeholder="a program directory, a .pte or a .pt2 file",
            tooltip=PATH_HINT,
            layout=w.Layout(width="420px"),
        )
        self.policy = mk(
            w.Dropdown,
            "constshare-policy",
            options=policy_options(),
            description="policy",
            layout=w.Layout(width="560px"),  # the longest release label whole
        )
        self.device = mk(
            w.Dropdown, "constshare-device", options=device_options(s.device), value=s.device, description="device"
        )
        self.dry_run = mk(
            w.Checkbox,
            "constshare-dry-run",
            indent=False,
            description="dry run (analyze without loading)",
            tooltip="predict every decision from the program's metadata: no device, nothing run "
            "(explore a CUDA .pte or .pt2 on a CPU)",
        )
        self.load_button = mk(
            w.Button,
            "constshare-load",
            description="Load",
            button_style="primary",
            icon="play",
            tooltip="build or open the program, load it under the policy, verify it",
        )
        self.compare_button = mk(
            w.Button,
            "constshare-compare",
            description="Compare all policies",
            icon="balance-scale",
            tooltip="load under every policy (trade-off plots)",
            layout=w.Layout(width="auto", align_self="flex-start"),
        )
        self.progress = mk(
            w.FloatProgress, "constshare-progress", value=0.0, min=0.0, max=1.0, layout=w.Layout(width="260px")
        )
        # the panels the render methods fill; the collision matrix: plotly (hover a cell: its decision and
        # reason) in an Output widget, shown by plotly's JupyterLab renderer, the matplotlib one as a PNG download
        (
            self.status,
            self.sample_info,
            self.policy_info,
            self.summary,
            self.verification,
            self.matrix_png,
            self.decisions,
            self.constant_detail,
            self.comparison,
            self.export_result,
        ) = (
            mk(w.HTML, f"constshare-{name}")
            for name in (
                "status",
                "sample-info",
                "policy-info",
                "summary",
                "verification",
                "matrix-png",
                "decisions",
                "constant-detail",
                "comparison",
                "export-result",
            )
        )
        self.error, self.stale_banner, self.dry_banner = (
            mk(w.HTML, f"constshare-{name}-box", layout=w.Layout(display="none")) for name in ("error", "stale", "dry")
        )
        # the matrix: a plotly FigureWidget (a click on a cell selects that constant), inside this box
        # (a long one, a row per name, scrolls inside MATRIX_HEIGHT)
        self.matrix = mk(
            w.Box,
            "constshare-matrix",
            layout=w.Layout(display="none", max_width="100%", max_height=MATRIX_HEIGHT, overflow="auto"),
        )
        self.timeline, self.memory, self.tradeoff, self.memory_policies = (
            mk(w.Image, f"constshare-{name}", format="png", layout=picture())
            for name in ("timeline", "memory", "tradeoff", "memory-policies")
        )
        self.filter_method, self.filter_decision, self.filter_reason = (
            mk(w.Dropdown, f"constshare-filter-{key}", options=[("all", ALL)], value=ALL, description=key)
            for key in FILTERS
        )
        self.culprits_only = mk(
            w.Checkbox,
            "constshare-culprits-only",
            value=False,
            indent=False,
            description="culprits only (the constants that run on other data)",
            layout=w.Layout(width="auto"),
        )
        self.export_rows_button = mk(
            w.Button,
            "constshare-export-rows",
            description="Export these rows (CSV)",
            icon="download",
            tooltip="the rows the filters above leave, as CSV",
            layout=w.Layout(width="auto"),
        )
        self.export_rows_excel_button = mk(
            w.Button,
            "constshare-export-rows-excel",
            description="Excel (.xlsx)",
            icon="table",
            layout=w.Layout(width="auto"),
            tooltip="the rows the filters above leave, as an Excel workbook (.xlsx)",
        )
        self.export_rows_result = mk(w.HTML, "constshare-export-rows-result")
        ITable = itable_class()
        self.grid = None
        if ITable is not None:
            self.grid = mk(ITable, "constshare-grid", df=grid_frame(s.rows), **grid_options())
            self.grid.observe(self._pick_row, names="selected_rows")
        self.constant = mk(
            w.Dropdown,
            "constshare-constant",
            options=[],
            description="constant",
            layout=w.Layout(width="100%", max_width="460px"),
        )
        self.export_folder = mk(
            w.Text,
            "constshare-export-folder",
            value=str(s.export_dir),
            description="folder",
            layout=w.Layout(width="520px"),
        )
        self.export_path = mk(
            w.Text,
            "constshare-export-path",
            value="",
            description="file",
            placeholder="collision_report.csv",
            layout=w.Layout(width="520px"),
        )
        self.export_overwrite = mk(
            w.Checkbox, "constshare-export-overwrite", value=False, description="replace an existing file", indent=False
        )
        self.export_button = mk(
            w.Button, "constshare-export", description="Export CSV", icon="download", layout=w.Layout(width="auto")
        )

        overview = mk(
            w.HBox,
            children=[
                mk(w.VBox, children=[self.summary, self.verification]),
                mk(w.VBox, children=[self.matrix, self.matrix_png], layout=w.Layout(max_width="100%")),
            ],
            layout=w.Layout(flex_flow="row wrap", align_items="flex-start", grid_gap="16px"),
        )
        left = mk(
            w.VBox,
            children=[self.decisions] + ([self.grid] if self.grid is not None else []),
            layout=w.Layout(flex="1 1 640px", min_width="0", max_width="100%"),
        )
        right = mk(
            w.VBox,
            "constshare-detail-panel",
            children=[self.constant, self.constant_detail],
            layout=w.Layout(flex="0 1 400px", min_width="320px", max_width="100%"),
        )
        decisions = mk(
            w.VBox,
            children=[
                mk(
                    w.HBox,
                    children=[
                        self.filter_method,
                        self.filter_decision,
                        self.filter_reason,
                        self.culprits_only,
                        self.export_rows_button,
                        self.export_rows_excel_button,
                    ],
                    layout=w.Layout(flex_flow="row wrap", align_items="center"),
                ),
                self.export_rows_result,
                mk(
                    w.HBox,
                    children=[left, right],
                    layout=w.Layout(flex_flow="row wrap", align_items="flex-start", grid_gap="16px", width="100%"),
                ),
            ],
        )
        timing = mk(w.VBox, children=[self.timeline, self.memory])
        policies = mk(w.VBox, children=[self.compare_button, self.tradeoff, self.memory_policies, self.comparison])
        export = mk(
            w.VBox,
            children=[
                self.export_folder,
                mk(w.HBox, children=[self.export_path, self.export_button]),
                self.export_overwrite,
                self.export_result,
            ],
        )
        self.tabs = mk(w.Tab, "constshare-tabs", children=[overview, decisions, timing, policies, export])
        for i, t in enumerate(TAB_TITLES):
            self.tabs.set_title(i, t)
        controls = mk(
            w.VBox,
            children=[
                self.program_from,
                mk(w.HBox, children=[self.sample, self.path]),
                self.sample_info,
                mk(w.HBox, children=[self.policy, self.device, self.dry_run]),
                self.policy_info,
                mk(w.HBox, children=[self.load_button, self.progress, self.status], layout=w.Layout(width="auto")),
                self.error,
            ],
        )
        self.widget = mk(
            w.VBox,
            "constshare-explorer",
            children=[self.title, controls, self.stale_banner, self.dry_banner, self.tabs],
        )

        # the choices: each widget linked to its trait (validated there); the device by hand, a device
        # the menu lacks added to it first
        s.observe(self._device_choice, names="device")
        self.device.observe(lambda ch: self._guarded(setattr, s, "device", ch["new"]), names="value")
        self._links = [traitlets.link((s, name), (getattr(self, name), "value")) for name in INPUTS if name != "device"]
        self.culprits_only.observe(lambda ch: self._filter("culprits_only", ch["new"]), names="value")
        self.export_rows_button.on_click(lambda _b: self.state.export_rows())
        self.export_rows_excel_button.on_click(lambda _b: self._export_rows_excel())
        for key in FILTERS:
            getattr(self, f"filter_{key}").observe(lambda ch, key=key: self._filter(key, ch["new"]), names="value")
        self.constant.observe(self._pick_constant, names="value")
        self.export_folder.observe(self._export_folder, names="value")
        self.load_button.on_click(lambda _b: self._run(self.state.load))
        self.compare_button.on_click(lambda _b: self._run(self.state.compare))
        self.export_button.on_click(
            lambda _b: self.state.export_csv(
                self.export_path.value.strip() or None, overwrite=self.export_overwrite.value
            )
        )
        self._observers = [(self._shown(name), list(traits)) for name, traits in PANELS.items()]
        for handler, names in self._observers:
            s.observe(handler, names=names)
        for name in PANELS:
            getattr(self, name)()

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def close(self) -> None:
        """Close every widget of the view (their comms too) and the state's session."""
        self.state.unobserve(self._device_choice, names="device")
        for handler, names in self._observers:
            self.state.unobserve(handler, names=names)
        for link in self._links:
            link.unlink()
        self._set_matrix(())
        for obj in reversed(self._widgets):
            close_widget(obj)
        self.state.close()

    # ------------------------------------------------------------------ events in
    def _guarded(self, fn, *args, **kw) -> None:
        try:
            fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - a bad choice becomes a message, not a traceback
            self.state.fail("invalid choice", e)

    def _device_choice(self, ch) -> None:
        if ch["new"] not in [v for _l, v in self.device.options]:
            self._set(self.device, options=device_options(ch["new"]))
        self.device.value = ch["new"]

    def _filter(self, key: str, value: str) -> None:
        if not self._updating:
            self._guarded(self.state.set_filters, **{key: value})

    def _pick_constant(self, ch) -> None:
        if not self._updating and ch["new"] is not None:
            self._guarded(self.state.select, *ch["new"])

    def _pick_row(self, ch) -> None:
        """A click on a grid row (its position in the grid's frame) selects that constant."""
        rows = list(ch["new"] or [])
        if self._updating or not rows:
            return
        i = rows[0]
        if 0 <= i < len(self._grid_keys) and self._grid_keys[i] != self.state.selected:
            self._guarded(self.state.select, *self._grid_keys[i])

    def _export_rows_excel(self) -> None:
        """The Excel export of the rows shown: said first (a large workbook takes a while)."""
        self.export_rows_result.value = box(
            "constshare-ok", f"writing {len(self.state.rows):,} rows as an Excel workbook\u2026"
        )
        self.state.export_rows(excel=True)

    def _export_folder(self, ch) -> None:
        if self._updating:
            return
        try:
            folder = Path(str(ch["new"]).strip() or ".").expanduser().resolve()
            if not folder.is_dir():
                raise ToolkitError(f"folder {str(folder)!r} does not exist")
        except Exception as e:  # noqa: BLE001
            self.state.fail("invalid export folder", e, scope="export")
            return
        self.state.clear_error()
        self.state.export_dir = folder

    def _run(self, action: Callable[[], bool]) -> None:
        if self.state.busy:
            return
        if not self.background:
            action()
            return
        start = time.monotonic()

        def tick():
            while self._worker is not None and self._worker.is_alive():
                self._render_progress(time.monotonic() - start)
                time.sleep(0.5)

        self._worker = threading.Thread(target=action, name="constshare-explorer", daemon=True)
        self._worker.start()
        threading.Thread(target=tick, name="constshare-explorer-ticker", daemon=True).start()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the running action finishes (scripts and tests)."""
        if self._worker is not None:
            self._worker.join(timeout)
