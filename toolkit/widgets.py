"""The notebook explorer: pick a program, a policy and a device, load, and browse what happened.

Two layers, so the logic is testable without a browser or a kernel:

- :class:`ExplorerState` holds every choice and result and performs the actions (load,
  compare policies, select a constant, export the CSV).  It imports nothing from ipywidgets;
  listeners registered with :meth:`ExplorerState.subscribe` hear what changed.  Actions never
  raise for a user error: they record it in :attr:`ExplorerState.error` and return False.
- :class:`Explorer` is the thin ipywidgets view.  It forwards widget events to the state and
  re-renders on its notifications.  Long actions run on a worker thread so the notebook
  stays responsive; the progress bar shows the step and the elapsed time meanwhile.

ipywidgets and matplotlib are imported lazily: ``import toolkit`` does not need them (they
are the ``notebook`` extra).
"""

from __future__ import annotations

import base64
import html
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd

from .errors import ToolkitError
from .policies import POLICIES, get_policy
from .rendering import html_table, verification_html
from .report import CollisionReport, collision_report
from .samples import DEFAULT_SAMPLE, build_sample, sample_names
from .vocab import PolicyName, parse

if TYPE_CHECKING:
    from .loader import Session
    from .model import Program

SOURCES = ("sample", "path")
ALL = ""  # filter value meaning "no filter"
DECISION_TABLE_COLUMNS = ("method", "name", "fqn", "lookup", "decision", "reason_code", "reason", "shared_from")
MAX_TABLE_ROWS = 300

Listener = Callable[[str], None]


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(e, ToolkitError):
        return first or type(e).__name__
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _devices() -> list[str]:
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class ExplorerState:
    """Choices, results and actions of the explorer (no UI code).

    Notifications (the string a listener receives): ``"inputs"``, ``"progress"``, ``"busy"``,
    ``"error"``, ``"session"``, ``"filters"``, ``"selection"``, ``"comparison"``, ``"export"``.
    """

    def __init__(self, *, source: str = "sample", sample: str = DEFAULT_SAMPLE, path: str = "",
                 policy: str = PolicyName.FINGERPRINT.value, device: str = "cpu",
                 build: Callable[..., "Program"] = build_sample, load: Callable[..., "Session"] | None = None):
        self.source = source
        self.sample = sample
        self.path = path
        self.policy = policy
        self.device = device
        self._build = build
        self._load = load
        self.session: Session | None = None
        self.program: Program | None = None
        self.verification: pd.DataFrame | None = None
        self.report: CollisionReport | None = None
        self.comparison: pd.DataFrame | None = None
        self.comparison_memory: pd.DataFrame | None = None
        self.compared_sessions: dict[str, Session] = {}  # closed sessions of the last comparison
        self.filter_method = ALL
        self.filter_decision = ALL
        self.filter_reason = ALL
        self.selected: tuple[str, str] | None = None
        self.busy = False
        self.phase = ""
        self.progress = 0.0
        self.message = "choose a program and a policy, then load"
        self.error: str | None = None
        self.error_detail = ""
        self.exported: Path | None = None
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self.set(source=source, sample=sample, path=path, policy=policy, device=device)

    # ------------------------------------------------------------------ observers
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(what)`` on every change; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _notify(self, what: str) -> None:
        for fn in list(self._listeners):
            fn(what)

    # ------------------------------------------------------------------ inputs
    def set(self, **choices: Any) -> None:
        """Change source / sample / path / policy / device, validated here (the API boundary)."""
        for key, value in choices.items():
            if key == "source":
                if value not in SOURCES:
                    raise ValueError(f"unknown source {value!r}; choose one of {SOURCES}")
            elif key == "sample":
                if value not in sample_names():
                    raise ValueError(f"unknown sample {value!r}; available: {', '.join(sample_names())}")
            elif key == "policy":
                value = parse(PolicyName, value, what="policy").value
            elif key == "device":
                value = str(value)
            elif key != "path":
                raise TypeError(f"unknown explorer input {key!r}")
            setattr(self, key, value)
        self._notify("inputs")

    @property
    def policy_summary(self) -> str:
        p = get_policy(self.policy)
        return f"{p.summary} (reproduces: {p.reproduces})"

    @property
    def sample_description(self) -> str:
        from .samples import sample_module

        try:
            return " ".join(sample_module(self.sample).DESCRIPTION.split())
        except ToolkitError as e:
            return str(e)

    # ------------------------------------------------------------------ progress / errors
    def _step(self, phase: str, fraction: float, message: str) -> None:
        self.phase, self.progress, self.message = phase, fraction, message
        self._notify("progress")

    def _fail(self, what: str, e: BaseException) -> bool:
        self.error = f"{what}: {_one_line(e)}"
        self.error_detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        self._step("failed", self.progress, self.error)
        self._notify("error")
        return False

    def clear_error(self) -> None:
        if self.error is not None:
            self.error, self.error_detail = None, ""
            self._notify("error")

    def _begin(self) -> bool:
        with self._lock:
            if self.busy:
                return False
            self.busy = True
        self.clear_error()
        self._notify("busy")
        return True

    def _end(self) -> None:
        self.busy = False
        self._notify("busy")

    # ------------------------------------------------------------------ actions
    def open_program(self) -> "Program":
        """The chosen program: a sample (built on first use, cached) or a program directory."""
        from .sources import open_program

        if self.source == "sample":
            return self._build(self.sample, device=self.device, progress=False)
        if not self.path.strip():
            raise ToolkitError("enter the path of a program directory (one holding manifest.json)")
        return open_program(Path(self.path.strip()).expanduser())

    def load(self) -> bool:
        """Open or build the program, load it under the policy, verify every method, build the
        report.  True on success; on failure :attr:`error` says why and the previous results stay."""
        if not self._begin():
            return False
        try:
            what = (f"building or opening sample {self.sample!r} (first build compiles every method, ~20 s each)"
                    if self.source == "sample" else f"opening {self.path!r}")
            self._step("open", 0.05, what)
            try:
                program = self.open_program()
            except Exception as e:  # noqa: BLE001 - shown in the widget
                return self._fail("could not open the program", e)
            self._step("load", 0.5, f"loading {program.name!r} under {self.policy!r} on {self.device}")
            loader = self._load
            if loader is None:
                from .loader import load_program as loader
            try:
                session = loader(program, self.policy, device=self.device)
            except Exception as e:  # noqa: BLE001
                return self._fail("could not load the program", e)
            self._step("verify", 0.75, "running every method against its eager reference")
            try:
                verification = session.verify()
                report = collision_report(session, verification)
            except Exception as e:  # noqa: BLE001
                session.close()
                return self._fail("could not verify the program", e)
            self._replace_session(program, session, verification, report)
            wrong = report.wrong_methods
            status = (f"loaded {program.name!r} under {self.policy!r}: "
                      + (f"WRONG OUTPUT in {', '.join(wrong)}" if wrong else "every loaded method matches its reference"))
            if session.status != "loaded":
                status = f"load of {program.name!r} failed in {session.failed_method!r}: {session.error}"
            self._step("done", 1.0, status)
            return True
        finally:
            self._end()

    def _replace_session(self, program, session, verification, report) -> None:
        old = self.session
        self.program, self.session, self.verification, self.report = program, session, verification, report
        if self.comparison is not None and (old is None or old.program.root != program.root):
            self.comparison = self.comparison_memory = None
            self.compared_sessions = {}
            self._notify("comparison")
        self.filter_method = self.filter_decision = self.filter_reason = ALL
        self.selected = None
        if old is not None and old is not session:
            old.close()
        self._notify("session")
        self._notify("filters")
        rows = self.filtered_decisions()
        if len(rows):  # start on the first collision: that is what the user came to see
            hits = rows[rows["lookup"].astype(str) == "hit"]
            first = hits.iloc[0] if len(hits) else rows.iloc[0]
            self.select(first["method"], first["name"])

    def compare(self) -> bool:
        """Load the current program under every policy: the correctness/memory trade-off."""
        if not self._begin():
            return False
        try:
            from .compare import compare_policies

            try:
                program = self.program or self.open_program()
            except Exception as e:  # noqa: BLE001
                return self._fail("could not open the program", e)

            def on_policy(pol: str, i: int, n: int) -> None:
                self._step("compare", (i + 0.5) / (n + 1), f"loading and verifying under {pol!r} ({i + 1} of {n})")

            try:
                result = compare_policies(program, device=self.device, on_policy=on_policy)
            except Exception as e:  # noqa: BLE001
                return self._fail("could not compare policies", e)
            # one load per policy: the frame, the memory per method and the sessions all come from it
            self.comparison, self.comparison_memory = result.frame, result.memory()
            self.compared_sessions = result.sessions
            self.program = program
            self._notify("comparison")  # results first: "done" means everything is on screen
            self._step("done", 1.0, f"compared {len(POLICIES)} policies on {program.name!r}")
            return True
        finally:
            self._end()

    # ------------------------------------------------------------------ browsing
    def filter_options(self) -> dict[str, list[str]]:
        d = self.session.decisions if self.session is not None else pd.DataFrame(columns=["method", "decision",
                                                                                        "reason_code"])
        order = [m.name for m in self.session.program.methods] if self.session is not None else []
        return {
            "method": [m for m in order if m in set(d["method"])],
            "decision": sorted({str(x) for x in d["decision"]}),
            "reason": sorted({str(x) for x in d["reason_code"]}),
        }

    def set_filters(self, *, method: str | None = None, decision: str | None = None, reason: str | None = None) -> None:
        opts = self.filter_options()
        for key, value in (("method", method), ("decision", decision), ("reason", reason)):
            if value is None:
                continue
            if value != ALL and value not in opts[key]:
                raise ValueError(f"no {key} {value!r} in this load; choose one of {opts[key]}")
            setattr(self, f"filter_{key}", value)
        self._notify("filters")
        rows = self.filtered_decisions()
        keys = list(zip(rows["method"], rows["name"]))
        if self.selected not in keys:
            self.select(*keys[0]) if keys else self.select(None, None)

    def filtered_decisions(self) -> pd.DataFrame:
        """The decision table under the current filters (a new frame)."""
        if self.session is None:
            return pd.DataFrame(columns=list(DECISION_TABLE_COLUMNS))
        d = self.session.decisions
        if self.filter_method:
            d = d[d["method"] == self.filter_method]
        if self.filter_decision:
            d = d[d["decision"].astype(str) == self.filter_decision]
        if self.filter_reason:
            d = d[d["reason_code"].astype(str) == self.filter_reason]
        return d.reset_index(drop=True)

    def select(self, method: str | None, name: str | None) -> None:
        if method is None or name is None:
            self.selected = None
        else:
            d = self.session.decisions if self.session is not None else None
            if d is None or not ((d["method"] == method) & (d["name"] == name)).any():
                raise ValueError(f"no decided constant {name!r} in method {method!r}")
            self.selected = (method, name)
        self._notify("selection")

    def selected_decision(self) -> dict[str, Any] | None:
        if self.selected is None or self.session is None:
            return None
        d = self.session.decisions
        row = d[(d["method"] == self.selected[0]) & (d["name"] == self.selected[1])]
        return {k: (v.value if hasattr(v, "value") else v) for k, v in row.iloc[0].to_dict().items()}

    def selected_comparison(self) -> pd.DataFrame:
        """Field-by-field comparison (cached vs new) of the selected constant; empty if none was made."""
        cols = ["field", "cached", "new", "equal"]
        if self.selected is None or self.session is None:
            return pd.DataFrame(columns=cols)
        c = self.session.comparisons
        c = c[(c["method"] == self.selected[0]) & (c["name"] == self.selected[1])]
        out = c[cols].copy()
        out["field"] = out["field"].map(lambda v: getattr(v, "value", v))
        return out.reset_index(drop=True)

    # ------------------------------------------------------------------ figures / export
    def figures(self) -> dict[str, Any]:
        """Matplotlib figures of the current results, by name (empty before a load)."""
        from . import plots

        figs: dict[str, Any] = {}
        if self.session is not None:
            figs["collision matrix"] = plots.collision_matrix(self.session, verification=self.verification)
            figs["timeline"] = plots.event_timeline(self.session)
            figs["memory"] = plots.memory_by_policy(self.session)
        if self.comparison is not None and self.program is not None:
            floor = plots.minimum_device_bytes(self.program)
            figs["policy trade-off"] = plots.policy_tradeoff(self.comparison, minimum=floor,
                                                             title=f"{self.program.name}: correctness vs memory")
            if self.comparison_memory is not None:
                figs["memory by policy"] = plots.memory_by_policy(
                    self.comparison_memory, minimum=floor,
                    title=f"{self.program.name}: device memory per method and policy")
        return figs

    def default_export_path(self) -> str:
        if self.session is None:
            return "collision_report.csv"
        return f"{self.session.program.name}-{self.session.policy.name.value}-collisions.csv"

    def export_csv(self, path: str | Path | None = None) -> bool:
        """Write the collision report of the current load; False (and :attr:`error`) on failure."""
        self.clear_error()
        if self.report is None:
            return self._fail("nothing to export", ToolkitError("load a program first"))
        target = Path(path or self.default_export_path()).expanduser()
        try:
            if target.parent and not target.parent.exists():
                raise ToolkitError(f"folder {str(target.parent)!r} does not exist")
            self.report.to_csv(target)
        except Exception as e:  # noqa: BLE001
            return self._fail(f"could not write {str(target)!r}", e)
        self.exported = target
        self.message = f"wrote {len(self.report.frame)} rows to {str(target)!r}"
        self._notify("export")
        self._notify("progress")
        return True

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = None
        self._listeners.clear()


# ====================================================================== view


def _require_ipywidgets():
    try:
        import ipywidgets
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("the explorer needs ipywidgets 8: pip install 'constshare-toolkit[notebook]'") from None
    return ipywidgets


def _table_html(frame: pd.DataFrame, columns, empty: str) -> str:
    return html_table(frame, columns, max_rows=MAX_TABLE_ROWS, empty=empty,
                      more_hint="narrow the filters to see them")


def _verification_html(v: pd.DataFrame | None) -> str:
    return verification_html(v, empty="no methods")


_CSS = """<style>
.constshare-explorer table { border-collapse: collapse; font-size: 12px; }
.constshare-explorer th, .constshare-explorer td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
.constshare-explorer th { background: #f3f3f3; }
.constshare-error { color: #a00; background: #fdecea; border: 1px solid #f5c2c0; padding: 4px 8px; }
</style>"""


class Explorer:
    """The ipywidgets view of an :class:`ExplorerState`.

    ``Explorer(sample="total_collision", policy="name-only")`` in a notebook cell shows it.
    ``background=False`` runs actions on the calling thread (tests do this).
    """

    def __init__(self, state: ExplorerState | None = None, *, background: bool = True, **state_kw: Any):
        w = _require_ipywidgets()
        self.state = state or ExplorerState(**state_kw)
        self.background = background
        self._worker: threading.Thread | None = None
        self._updating = False
        s = self.state
        self._widgets: list[Any] = []

        def mk(cls, css: str | None = None, **kw):
            obj = cls(**kw)
            if css:
                obj.add_class(css)
            self._widgets.append(obj)
            return obj

        wide = w.Layout(width="auto")

        def picture():  # natural size, never stretched by the flex box around it
            return w.Layout(max_width="100%", height="auto", align_self="flex-start", object_fit="contain")
        self.title = mk(w.HTML, value=_CSS + "<h3 style='margin:4px 0'>constshare explorer</h3>")
        self.source = mk(w.ToggleButtons, "constshare-source", options=list(SOURCES), value=s.source,
                         description="program")
        self.sample = mk(w.Dropdown, "constshare-sample", options=sample_names(), value=s.sample,
                         description="sample")
        self.path = mk(w.Text, "constshare-path", value=s.path, description="path",
                       placeholder="a program directory (holding manifest.json)", layout=w.Layout(width="420px"))
        self.sample_info = mk(w.HTML, "constshare-sample-info")
        self.policy = mk(w.Dropdown, "constshare-policy", options=list(POLICIES), value=s.policy,
                         description="policy")
        self.policy_info = mk(w.HTML, "constshare-policy-info")
        self.device = mk(w.Dropdown, "constshare-device", options=_devices(), value=s.device, description="device")
        self.load_button = mk(w.Button, "constshare-load", description="Load", button_style="primary", icon="play",
                              tooltip="build or open the program, load it under the policy, verify it")
        self.compare_button = mk(w.Button, "constshare-compare", description="Compare all policies",
                                 icon="balance-scale", tooltip="load under every policy (trade-off plots)",
                                 layout=w.Layout(width="auto", align_self="flex-start"))
        self.progress = mk(w.FloatProgress, "constshare-progress", value=0.0, min=0.0, max=1.0,
                           layout=w.Layout(width="260px"))
        self.status = mk(w.HTML, "constshare-status", value=html.escape(s.message))
        self.error = mk(w.HTML, "constshare-error-box", value="", layout=w.Layout(display="none"))
        self.summary = mk(w.HTML, "constshare-summary")
        self.verification = mk(w.HTML, "constshare-verification")
        self.matrix = mk(w.Image, "constshare-plot", format="png", layout=picture())
        self.filter_method = mk(w.Dropdown, "constshare-filter-method", options=[("all", ALL)], value=ALL,
                                description="method")
        self.filter_decision = mk(w.Dropdown, "constshare-filter-decision", options=[("all", ALL)], value=ALL,
                                  description="decision")
        self.filter_reason = mk(w.Dropdown, "constshare-filter-reason", options=[("all", ALL)], value=ALL,
                                description="reason")
        self.decisions = mk(w.HTML, "constshare-decisions")
        self.constant = mk(w.Dropdown, "constshare-constant", options=[], description="constant",
                           layout=w.Layout(width="420px"))
        self.constant_detail = mk(w.HTML, "constshare-constant-detail")
        self.timeline = mk(w.Image, "constshare-timeline", format="png", layout=picture())
        self.memory = mk(w.Image, "constshare-memory", format="png", layout=picture())
        self.tradeoff = mk(w.Image, "constshare-tradeoff", format="png", layout=picture())
        self.memory_policies = mk(w.Image, "constshare-memory-policies", format="png", layout=picture())
        self.comparison = mk(w.HTML, "constshare-comparison",
                             value="<p><i>press “Compare all policies” to load the program under every policy</i></p>")
        self.export_path = mk(w.Text, "constshare-export-path", value="", description="file",
                              placeholder="collision_report.csv", layout=w.Layout(width="420px"))
        self.export_button = mk(w.Button, "constshare-export", description="Export CSV", icon="download",
                                layout=w.Layout(width="auto"))
        self.export_result = mk(w.HTML, "constshare-export-result")

        overview = mk(w.HBox, children=[mk(w.VBox, children=[self.summary, self.verification]), self.matrix],
                      layout=w.Layout(flex_flow="row wrap", align_items="flex-start", grid_gap="16px"))
        decisions = mk(w.VBox, children=[mk(w.HBox, children=[self.filter_method, self.filter_decision,
                                                              self.filter_reason]),
                                         self.decisions, self.constant, self.constant_detail])
        timing = mk(w.VBox, children=[self.timeline, self.memory])
        policies = mk(w.VBox, children=[self.compare_button, self.tradeoff, self.memory_policies, self.comparison])
        export = mk(w.VBox, children=[mk(w.HBox, children=[self.export_path, self.export_button]),
                                      self.export_result])
        self.tabs = mk(w.Tab, "constshare-tabs", children=[overview, decisions, timing, policies, export])
        for i, t in enumerate(["Overview", "Decisions", "Timeline & memory", "Policies", "Export"]):
            self.tabs.set_title(i, t)
        controls = mk(w.VBox, children=[
            self.source, mk(w.HBox, children=[self.sample, self.path]), self.sample_info,
            mk(w.HBox, children=[self.policy, self.device]), self.policy_info,
            mk(w.HBox, children=[self.load_button, self.progress, self.status], layout=wide),
            self.error,
        ])
        self.widget = mk(w.VBox, "constshare-explorer", children=[self.title, controls, self.tabs])

        self.source.observe(lambda ch: self._input(source=ch["new"]), names="value")
        self.sample.observe(lambda ch: self._input(sample=ch["new"]), names="value")
        self.path.observe(lambda ch: self._input(path=ch["new"]), names="value")
        self.policy.observe(lambda ch: self._input(policy=ch["new"]), names="value")
        self.device.observe(lambda ch: self._input(device=ch["new"]), names="value")
        for dd, key in ((self.filter_method, "method"), (self.filter_decision, "decision"),
                        (self.filter_reason, "reason")):
            dd.observe(lambda ch, key=key: self._filter(key, ch["new"]), names="value")
        self.constant.observe(self._pick_constant, names="value")
        self.load_button.on_click(lambda _b: self._run(self.state.load))
        self.compare_button.on_click(lambda _b: self._run(self.state.compare))
        self.export_button.on_click(lambda _b: self.state.export_csv(self.export_path.value.strip() or None))
        self._unsubscribe = self.state.subscribe(self._on_state)
        self._render_inputs()

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def close(self) -> None:
        """Close every widget of the view (their comms too) and the state's session."""
        self._unsubscribe()
        for obj in reversed(self._widgets):
            # a widget's layout and style are widgets of their own, with their own comms
            for part in (getattr(obj, "layout", None), getattr(obj, "style", None)):
                if part is not None:
                    part.close()
            obj.close()
        self.state.close()

    # ------------------------------------------------------------------ events in
    def _guarded(self, fn, *args, **kw) -> None:
        try:
            fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - a bad choice becomes a message, not a traceback
            self.state._fail("invalid choice", e)

    def _input(self, **kw) -> None:
        if not self._updating:
            self._guarded(self.state.set, **kw)

    def _filter(self, key: str, value: str) -> None:
        if not self._updating:
            self._guarded(self.state.set_filters, **{key: value})

    def _pick_constant(self, ch) -> None:
        if not self._updating and ch["new"] is not None:
            self._guarded(self.state.select, *ch["new"])

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

    # ------------------------------------------------------------------ state out
    def _on_state(self, what: str) -> None:
        try:
            if what == "inputs":
                self._render_inputs()
            elif what in ("progress", "busy"):
                self._render_progress()
            elif what == "error":
                self._render_error()
            elif what == "session":
                self._render_session()
            elif what == "filters":
                self._render_filters()
            elif what == "selection":
                self._render_selection()
            elif what == "comparison":
                self._render_comparison()
            elif what == "export":
                self._render_export()
        except Exception as e:  # noqa: BLE001 - rendering must never leave a traceback wall
            self.error.value = (f"<div class='constshare-error'>could not display {html.escape(what)}: "
                                f"{html.escape(_one_line(e))}</div>")
            self.error.layout.display = None

    def _set(self, widget, **values) -> None:
        self._updating = True
        try:
            for k, v in values.items():
                setattr(widget, k, v)
        finally:
            self._updating = False

    def _render_inputs(self) -> None:
        s = self.state
        self._set(self.source, value=s.source)
        self._set(self.sample, value=s.sample)
        self._set(self.policy, value=s.policy)
        self.sample.layout.display = None if s.source == "sample" else "none"
        self.sample_info.layout.display = None if s.source == "sample" else "none"
        self.path.layout.display = None if s.source == "path" else "none"
        self.sample_info.value = f"<small>{html.escape(s.sample_description)}</small>"
        self.policy_info.value = f"<small><b>{html.escape(s.policy)}</b>: {html.escape(s.policy_summary)}</small>"

    def _render_progress(self, elapsed: float | None = None) -> None:
        s = self.state
        self.progress.value = s.progress
        self.progress.bar_style = "danger" if s.error else ("success" if s.phase == "done" else "info")
        busy = s.busy
        for b in (self.load_button, self.compare_button, self.export_button):
            b.disabled = busy
        self.load_button.description = "Working…" if busy else "Load"
        clock = f" ({elapsed:.0f} s)" if busy and elapsed is not None and elapsed >= 1 else ""
        self.status.value = html.escape(s.message + clock)

    def _render_error(self) -> None:
        s = self.state
        if not s.error:
            self.error.value, self.error.layout.display = "", "none"
            return
        detail = (f"<details><summary>details</summary><pre>{html.escape(s.error_detail[-4000:])}</pre></details>"
                  if s.error_detail else "")
        self.error.value = f"<div class='constshare-error'><b>{html.escape(s.error)}</b>{detail}</div>"
        self.error.layout.display = None

    def _render_session(self) -> None:
        from .plots import figure_png

        s = self.state
        if s.session is None:
            return
        self.summary.value = f"<pre>{html.escape(s.session.summary())}</pre>"
        self.verification.value = "<b>verification</b>" + _verification_html(s.verification)
        figs = s.figures()
        self.matrix.value = figure_png(figs["collision matrix"])
        self.timeline.value = figure_png(figs["timeline"])
        self.memory.value = figure_png(figs["memory"])
        self.export_path.placeholder = s.default_export_path()
        self._render_filters()

    def _render_filters(self) -> None:
        s = self.state
        opts = s.filter_options()
        self._set(self.filter_method, options=[("all", ALL)] + [(m, m) for m in opts["method"]],
                  value=s.filter_method)
        self._set(self.filter_decision, options=[("all", ALL)] + [(d, d) for d in opts["decision"]],
                  value=s.filter_decision)
        self._set(self.filter_reason, options=[("all", ALL)] + [(r, r) for r in opts["reason"]],
                  value=s.filter_reason)
        rows = s.filtered_decisions()
        total = len(s.session.decisions) if s.session is not None else 0
        self.decisions.value = (f"<p>{len(rows)} of {total} decisions</p>"
                                + _table_html(rows, DECISION_TABLE_COLUMNS, "no decision matches the filters"))
        self._set(self.constant, options=[(f"{m} / {n}", (m, n)) for m, n in zip(rows["method"], rows["name"])],
                  value=s.selected if s.selected in set(zip(rows["method"], rows["name"])) else None)

    def _render_selection(self) -> None:
        s = self.state
        keys = list(self.constant.options)
        if s.selected is not None and s.selected in [v for _l, v in keys]:
            self._set(self.constant, value=s.selected)
        d = s.selected_decision()
        if d is None:
            self.constant_detail.value = ""
            return
        comp = s.selected_comparison()
        facts = [("decision", d["decision"]), ("reason", d["reason"]), ("lookup", d["lookup"] or "not looked up"),
                 ("bytes", f"{int(d['nbytes']):,}"), ("new digest", d["digest"]),
                 ("cached", f"{d['cached_method']}" if d["cached_method"] else "no cache entry"),
                 ("cached digest", d["cached_digest"] or "")]
        from .rendering import WRONG_COLOUR, html_table

        head = html_table(pd.DataFrame(facts, columns=["fact", "value"]), max_rows=len(facts), colours={})
        if len(comp):
            shown = comp.assign(equal=["yes" if e else "NO" for e in comp["equal"]])
            body = html_table(shown, max_rows=len(shown),
                              colours={"equal": lambda text: WRONG_COLOUR if text == "NO" else ""})
        else:
            body = "<p><i>nothing was compared for this constant (see the reason above)</i></p>"
        self.constant_detail.value = (f"<b>{html.escape(d['method'])} / {html.escape(d['name'])}</b>"
                                      f"{head}<b>cached vs new</b>{body}")

    def _render_comparison(self) -> None:
        from .plots import figure_png

        s = self.state
        if s.comparison is None:
            self.tradeoff.value = b""
            self.memory_policies.value = b""
            self.comparison.value = "<p><i>press “Compare all policies” to load the program under every policy</i></p>"
            return
        figs = s.figures()
        self.tradeoff.value = figure_png(figs["policy trade-off"])
        if "memory by policy" in figs:
            self.memory_policies.value = figure_png(figs["memory by policy"])
        # lists (wrong_methods, not_runnable) are shown comma-joined by the renderer
        self.comparison.value = _table_html(s.comparison, ["policy", "status", "wrong_methods", "not_runnable",
                                                           "shared", "declined", "device_bytes", "error"],
                                            "no policies")

    def _render_export(self) -> None:
        s = self.state
        if s.exported is None:
            return
        data = base64.b64encode(s.exported.read_bytes()).decode("ascii")
        name = html.escape(s.exported.name, quote=True)
        self.export_result.value = (f"wrote <code>{html.escape(str(s.exported))}</code> "
                                    f"({len(s.report.frame) if s.report is not None else 0} rows) · "
                                    f"<a download=\"{name}\" href=\"data:text/csv;base64,{data}\">download</a>")
