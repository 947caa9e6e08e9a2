"""The notebook explorer: pick a program, a policy and a device, load, and browse what happened.

Two layers, so the logic is testable without a browser or a kernel:

- :class:`ExplorerState` holds every choice and result and performs the actions (load,
  compare policies, select a constant, export the CSV).  It imports nothing from ipywidgets;
  listeners registered with :meth:`ExplorerState.subscribe` hear what changed.  Actions never
  raise for a user error: they record it in :attr:`ExplorerState.error` and return False.
- :class:`Explorer` is the thin ipywidgets view.  It forwards widget events to the state and
  re-renders on its notifications.  Long actions run on a worker thread so the notebook
  stays responsive; the progress bar shows the step (each method of a cold compile) and the
  elapsed time meanwhile.

What the view promises (each is tested): results that no longer match the inputs (changed
since, or being replaced by a load in progress, or left by a load that failed) are greyed
with a banner saying what they are of; a failed or refused load turns the bar red; export
results and errors appear next to the export button, the latest replacing the previous, with
the file's absolute path; the Decisions grid (itables, when installed) scrolls inside a
bounded box, sorts, searches and pages, and a click on a row selects that constant, whose
detail is shown beside the grid and says in words whether its content differs from the
cached tensor it was checked against.

**Dry run** (``dry_run=True``, the "dry run" checkbox): Load analyses the program instead of
loading it (:func:`toolkit.analysis.run_analysis`: the loader's own decisions over the program
model, no device, nothing run), so a CUDA ``.pte`` or ``.pt2`` can be explored on a CPU; Compare
dry-runs every policy.  What is shown is a prediction, and says so (:attr:`ExplorerState.banner`);
verification reads "not run (dry run)" for every method, and the wrong-output count of a dry
comparison is the methods predicted to run on a shared constant whose content differs.  The path
source takes a program directory, an ExecuTorch ``.pte`` (its ``.ptd`` beside it) or a torch
``.pt2``.  A real load of a program that cannot be loaded here says so and suggests the dry run.

Default export files are named from the program and policy names **sanitised** to plain file
names (the program name comes from the manifest, which may be untrusted: ``../x`` or
``/abs/victim`` must not choose where a file is written), in the chosen export folder
(:attr:`ExplorerState.export_dir`, the working folder by default).  Nothing is overwritten
unless asked: a default name that exists gets a numbered sibling, an explicit path that exists
is refused unless ``overwrite=True``.

ipywidgets, itables and matplotlib are imported lazily: ``import toolkit`` does not need them
(they are the ``notebook`` extra).
"""

from __future__ import annotations

import base64
import html
import os
import re
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd

from .errors import IncompatibleProgramError, ToolkitError
from .policies import POLICIES, get_policy
from .rendering import (
    CULPRIT_STYLE, DECISION_COLOURS, WRONG_COLOUR, cell_text, content_check, culprit_mask, format_bytes, html_table,
    markdown_html, markdown_text, verification_html,
)
from .report import CollisionReport, collision_report
from .samples import DEFAULT_SAMPLE, build_sample, sample_names
from .tables import wrong_methods
from .vocab import PolicyName, parse

if TYPE_CHECKING:
    from .session import Session
    from .model import Program

SOURCES = ("sample", "path")
ALL = ""  # filter value meaning "no filter"
DECISION_TABLE_COLUMNS = ("method", "name", "fqn", "lookup", "decision", "same_content", "culprit", "reason_code",
                          "reason", "shared_from")
PATH_HINT = ("a program directory (holding manifest.json), an ExecuTorch .pte (its .ptd beside it) "
             "or a torch .pt2 file")
DRY_RUN_REASON = "not run (dry run)"
DRY_RUN_HINT = "this program cannot be loaded here: tick “dry run” to analyze it without loading"
MAX_TABLE_ROWS = 300
GRID_HEIGHT = "360px"  # the Decisions grid scrolls inside this height
EXPORT_SUFFIX = "-collisions.csv"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

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


def dry_run_verification(session: "Session") -> pd.DataFrame:
    """The verification frame of a dry-run session: every method "not run (dry run)" (a dry
    run has nothing to run, so nothing is verified; its ``verify()`` is never asked)."""
    from .verification import VERIFY_COLUMNS

    rows = [{"method": m.name, "ran": False, "max_abs_err": float("nan"), "atol": float("nan"),
             "rtol": float("nan"), "ok": False, "reason": DRY_RUN_REASON} for m in session.program.methods]
    return pd.DataFrame(rows, columns=VERIFY_COLUMNS)


def is_dry_session(session: "Session | None") -> bool:
    """Whether ``session`` was made by a runtime that cannot run (the dry run)."""
    return session is not None and not getattr(getattr(session, "runtime", None), "can_run", True)


def _dry_comparison_row(session: "Session") -> dict:
    """One policy's comparison row from a dry run: ``wrong_methods`` are the methods predicted
    to run on a shared constant whose content differs (nothing ran)."""
    from .compare import policy_row
    from .rendering import suspects_by_method

    suspects = suspects_by_method(session.decisions)
    return policy_row(session, wrong_methods=[m.name for m in session.program.methods if m.name in suspects],
                      wrong_sequences=[], no_reference=[])


def safe_file_name(text: str, *, fallback: str = "program", max_len: int = 80) -> str:
    """``text`` as a plain file name: letters, digits, ``.``, ``_`` and ``-`` only (every other
    run of characters, path separators included, becomes ``_``), no leading dot or dash,
    at most ``max_len`` characters; ``fallback`` when nothing is left."""
    name = re.sub(r"\.{2,}", ".", _UNSAFE.sub("_", str(text))).strip("._-")
    name = name[:max_len].rstrip("._-")
    return name or fallback


class ExplorerState:
    """Choices, results and actions of the explorer (no UI code).

    Notifications (the string a listener receives): ``"inputs"``, ``"progress"``, ``"busy"``,
    ``"error"``, ``"session"``, ``"filters"``, ``"selection"``, ``"comparison"``, ``"export"``.

    ``export_dir``: the folder default export files go to, and relative export paths are
    taken from (default: the working folder when the state is made).
    """

    def __init__(self, *, source: str = "sample", sample: str = DEFAULT_SAMPLE, path: str = "",
                 policy: str = PolicyName.FINGERPRINT.value, device: str = "cpu", dry_run: bool = False,
                 build: Callable[..., "Program"] = build_sample, load: Callable[..., "Session"] | None = None,
                 export_dir: str | os.PathLike | None = None):
        self.source = source
        self.sample = sample
        self.path = path
        self.policy = policy
        self.device = device
        self.dry_run = bool(dry_run)
        self._build = build
        self._load = load
        self.session: Session | None = None
        self.program: Program | None = None
        self.verification: pd.DataFrame | None = None
        self.report: CollisionReport | None = None
        self.blame: pd.DataFrame | None = None  # session.blame() of the load on screen (None: not run)
        self.blame_note = ""
        self.comparison: pd.DataFrame | None = None
        self.comparison_memory: pd.DataFrame | None = None
        self.compared_sessions: dict[str, Session] = {}  # closed sessions of the last comparison
        self.comparison_dry = False  # the last comparison was a dry run of every policy
        self.filter_method = ALL
        self.filter_decision = ALL
        self.filter_reason = ALL
        self.selected: tuple[str, str] | None = None
        self.busy = False
        self.loading = False  # a load (not a comparison) is in progress
        self.phase = ""
        self.progress = 0.0
        self.outcome = ""  # of the last action: "ok", "wrong" (outputs differ), "failed" (error or refused load)
        self.message = "choose a program and a policy, then load"
        self.error: str | None = None
        self.error_detail = ""
        self.error_scope = ""  # "export" for an export error (shown next to the export button)
        self.export_dir = Path(export_dir if export_dir is not None else Path.cwd()).expanduser().resolve()
        self.exported: Path | None = None
        self.export_ok: bool | None = None  # outcome of the latest export (None: none yet)
        self.export_message = ""
        self.shown_inputs: tuple | None = None  # the inputs the results on screen were loaded from
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self.set(source=source, sample=sample, path=path, policy=policy, device=device, dry_run=dry_run)

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
        """Change source / sample / path / policy / device / dry_run, validated here (the API boundary)."""
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
            elif key == "dry_run":
                if not isinstance(value, (bool, int)) or isinstance(value, int) and value not in (0, 1):
                    raise ValueError(f"dry_run is True or False, not {value!r}")
                value = bool(value)
            elif key != "path":
                raise TypeError(f"unknown explorer input {key!r}")
            setattr(self, key, value)
        self._notify("inputs")

    def inputs(self) -> tuple:
        """The current choices that a load depends on."""
        where = self.sample if self.source == "sample" else self.path.strip()
        return (self.source, where, self.policy, self.device, self.dry_run)

    @staticmethod
    def describe_inputs(inputs: tuple | None) -> str:
        if inputs is None:
            return "nothing"
        source, where, policy, device, *rest = inputs
        what = f"sample {where!r}" if source == "sample" else f"{where!r}"
        dry = "a dry run of " if rest and rest[0] else ""
        return f"{dry}{what} under {policy!r} on {device}"

    @property
    def is_dry_run(self) -> bool:
        """Whether the results on screen are a dry run (a prediction, nothing loaded or run)."""
        return is_dry_session(self.session)

    @property
    def banner(self) -> str:
        """The sentence saying the results are a prediction, when they are a dry run; '' otherwise."""
        if not self.is_dry_run:
            return ""
        s = self.session
        devices = ", ".join(sorted({str(d) for d in s.devices.values()})) if getattr(s, "devices", None) else ""
        where = f" on {devices}" if devices else ""
        return (f"DRY RUN: a prediction, not a load. The decisions, sharing and memory below are what loading "
                f"{s.program.name!r} under {s.policy.name.value!r}{where} would do, worked out from the "
                f"program's metadata by the loader's own code; nothing was put on a device and nothing ran, "
                f"so no output is verified: every method reads “{DRY_RUN_REASON}”.")

    @property
    def stale(self) -> bool:
        """Whether results are on screen that are not those of the current inputs: the inputs
        changed since they were loaded, or a load to replace them is running (or failed)."""
        return self.session is not None and (self.loading or self.shown_inputs != self.inputs())

    @property
    def stale_reason(self) -> str:
        """One sentence on what the results on screen are, when :attr:`stale`; '' otherwise."""
        if not self.stale:
            return ""
        shown = self.describe_inputs(self.shown_inputs)
        if self.loading:
            return (f"loading {self.describe_inputs(self.inputs())}: the results below are still those of "
                    f"{shown}")
        if self.error and self.error_scope != "export":
            return f"the last load failed: the results below are those of {shown}, not of the current choices"
        return f"the choices changed: the results below are those of {shown}; press Load to update them"

    @property
    def policy_summary(self) -> str:
        p = get_policy(self.policy)
        return f"{p.summary} (reproduces: {p.reproduces_text()})"

    def _description(self) -> str:
        from .samples import sample_module

        return sample_module(self.sample).DESCRIPTION

    @property
    def sample_description(self) -> str:
        """The sample's description as plain text (markdown markup removed)."""
        try:
            return markdown_text(self._description())
        except ToolkitError as e:
            return str(e)

    @property
    def sample_description_html(self) -> str:
        """The sample's description rendered from its markdown (escaped)."""
        try:
            return markdown_html(self._description())
        except ToolkitError as e:
            return f"<p>{html.escape(str(e))}</p>"

    # ------------------------------------------------------------------ progress / errors
    def _step(self, phase: str, fraction: float, message: str) -> None:
        self.phase, self.progress, self.message = phase, fraction, message
        self._notify("progress")

    def _fail(self, what: str, e: BaseException, *, scope: str = "", hint: str = "") -> bool:
        self.error = f"{what}: {_one_line(e)}" + (f" ({hint})" if hint else "")
        self.error_detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        self.error_scope = scope
        if scope == "export":
            self.exported, self.export_ok, self.export_message = None, False, self.error
            self._notify("export")
            self._notify("error")
            return False
        self.outcome = "failed"
        self._step("failed", self.progress, self.error)
        self._notify("error")
        return False

    def clear_error(self) -> None:
        if self.error is not None:
            self.error, self.error_detail, self.error_scope = None, "", ""
            self._notify("error")

    def _begin(self, *, loading: bool = False) -> bool:
        with self._lock:
            if self.busy:
                return False
            self.busy = True
        self.loading = loading
        self.outcome = ""
        self.clear_error()
        self._notify("busy")
        return True

    def _end(self) -> None:
        self.busy = False
        self.loading = False
        self._notify("busy")

    # ------------------------------------------------------------------ actions
    def open_program(self) -> "Program":
        """The chosen program: a sample (built on first use, cached), or a program directory, an
        ExecuTorch ``.pte`` (its ``.ptd`` beside it) or a torch ``.pt2`` file.

        A sample that must be compiled reports each method as it starts (phase
        ``"compile"``): the bar moves from 5 % to 50 % over the methods."""
        from .sources import open_program

        if self.source == "sample":
            sample = self.sample

            def on_method(name: str, i: int, n: int) -> None:
                self._step("compile", 0.05 + 0.45 * i / max(n, 1),
                           f"compiling sample {sample!r}: method {name!r} ({i + 1} of {n}), about 20 s "
                           f"each on a CPU, once (the build is cached)")

            return self._build(sample, device=self.device, progress=False, on_method=on_method)
        if not self.path.strip():
            raise ToolkitError(f"enter the path of a program: {PATH_HINT}")
        where = Path(self.path.strip()).expanduser()
        if where.is_file() and where.name != "manifest.json" and where.suffix.lower() not in (".pte", ".pt2"):
            raise ToolkitError(f"{str(where)!r} is not a program: expected {PATH_HINT}")
        if self.dry_run:  # the model is enough: the .so and blob files need not be here
            from .sources import read_program_model

            return read_program_model(where)
        return open_program(where)

    def analysis_device(self, program: "Program") -> str:
        """Where a dry run places the methods: the chosen device when it is of the kind the
        program was built for, else that kind (a CUDA program is predicted on cuda, even on a CPU)."""
        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        built = "cuda" if program.device == "cuda" else "cpu"
        return self.device if kind == built else built

    def _load_hint(self, program: "Program", e: BaseException) -> str:
        """The dry-run suggestion when ``e`` says the program cannot be loaded on this machine."""
        if isinstance(e, IncompatibleProgramError):
            return DRY_RUN_HINT
        if program.device == "cuda" or self.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                return DRY_RUN_HINT
        return ""

    def load(self) -> bool:
        """Open or build the program, load it under the policy, verify every method, build the
        report.  True on success (a refused load is a result too: True, outcome "failed");
        on failure :attr:`error` says why and the previous results stay, marked stale."""
        if not self._begin(loading=True):
            return False
        target = self.inputs()
        if self.dry_run:
            try:
                return self._dry_load(target)
            finally:
                self._end()
        try:
            program = self._open_step("opening")
            if program is None:
                return False
            self._step("load", 0.5, f"loading {program.name!r} under {self.policy!r} on {self.device}")
            loader = self._load
            if loader is None:
                from .session import load_program as loader
            try:
                session = loader(program, self.policy, device=self.device)
            except Exception as e:  # noqa: BLE001
                return self._fail("could not load the program", e, hint=self._load_hint(program, e))
            self._step("verify", 0.75, "running every method against its eager reference")
            try:
                verification = session.verify()
            except Exception as e:  # noqa: BLE001
                session.close()
                return self._fail("could not verify the program", e)
            blamed = self._blame_step(session, verification)
            try:
                report = collision_report(session, verification)
            except Exception as e:  # noqa: BLE001
                session.close()
                return self._fail("could not verify the program", e)
            self.loading = False
            self._replace_session(program, session, verification, report, target, blame=blamed)
            wrong = report.wrong_methods
            if session.status != "loaded":
                self.outcome = "failed"
                hint = self._load_hint(program, RuntimeError(session.error or ""))
                self._step("failed", 1.0,
                           f"load of {program.name!r} under {self.policy!r} failed in {session.failed_method!r}: "
                           f"{session.error}" + (f" ({hint})" if hint else ""))
            else:
                self.outcome = "wrong" if wrong else "ok"
                culprits = list(dict.fromkeys(n for _m, n in self.blamed()))
                self._step("done", 1.0, f"loaded {program.name!r} under {self.policy!r}: "
                           + (f"WRONG OUTPUT in {', '.join(wrong)}" if wrong
                              else f"not verified, no reference: {', '.join(report.unverified_methods)}"
                              if report.unverified_methods else "every loaded method matches its reference")
                           + (f" (blame: {', '.join(culprits[:5])}{' ...' if len(culprits) > 5 else ''})"
                              if culprits else "") + (f" ({self.blame_note})" if self.blame_note else ""))
            return True
        finally:
            self._end()

    def _blame_step(self, session: "Session", verification: pd.DataFrame) -> pd.DataFrame | None:
        """``session.blame()`` when a method that ran is wrong: which shares make it wrong, by
        experiment (each suspect swapped for the method's own copy, the method re-run).  None
        when every method is right; a failed blame is a note in :attr:`blame_note`, not a
        failed load."""
        self.blame_note = ""
        wrong = wrong_methods(verification)
        if session.status != "loaded" or not wrong:
            return None
        names = ", ".join(wrong)
        self._step("blame", 0.85, f"finding the culprits of {names}: each shared constant swapped for the "
                   f"method's own copy, the method re-run")
        try:
            return session.blame()
        except Exception as e:  # noqa: BLE001 - the load and its verification still stand
            self.blame_note = f"blame could not run: {_one_line(e)}"
            return None

    def blamed(self) -> dict[tuple[str, str], str]:
        """(method, constant) -> blame's evidence, for every share whose undoing fixed its method."""
        b = self.blame
        if b is None or not len(b):
            return {}
        hit = b[b["fixes"].astype(bool)]
        return {(cell_text(m), cell_text(n)): cell_text(e) for m, n, e in zip(hit["method"], hit["name"],
                                                                              hit["evidence"])}

    def _open_step(self, verb: str) -> "Program | None":
        """The open step of a load or a dry run, with its progress; None (and :attr:`error`) on failure."""
        what = (f"opening sample {self.sample!r} (a cold cache compiles every method first)"
                if self.source == "sample" else f"{verb} {self.path!r}")
        self._step("open", 0.05, what)
        try:
            return self.open_program()
        except Exception as e:  # noqa: BLE001 - shown in the widget
            self._fail("could not open the program", e)
            return None

    def _dry_load(self, target: tuple) -> bool:
        """Load's dry run: predict the load (no device, nothing run), verification "not run"."""
        from .analysis import run_analysis

        program = self._open_step("reading")
        if program is None:
            return False
        device = self.analysis_device(program)
        self._step("analyze", 0.5, f"dry run of {program.name!r} under {self.policy!r} on {device}: predicting "
                   f"every decision (nothing is loaded)")
        try:
            session = run_analysis(program, self.policy, device=device).session
            verification = dry_run_verification(session)
            report = collision_report(session, verification)
        except Exception as e:  # noqa: BLE001
            return self._fail("could not analyze the program", e)
        self.loading = False
        self._replace_session(program, session, verification, report, target)
        d = session.decisions
        culprit_methods = set(d.loc[culprit_mask(d), "method"]) if len(d) else set()
        suspects = [m.name for m in program.methods if m.name in culprit_methods]
        head = f"dry run (a prediction, nothing loaded or run) of {program.name!r} under {self.policy!r} on {device}"
        if session.status != "loaded":
            self.outcome = "failed"
            self._step("failed", 1.0, f"{head}: the load would fail in {session.failed_method!r}: {session.error}")
        else:
            self.outcome = "wrong" if suspects else "ok"
            self._step("done", 1.0, f"{head}: " + (
                f"predicted WRONG OUTPUT in {', '.join(suspects)} (shared although the content differs)"
                if suspects else "no constant would be shared with other content; outputs not verified"))
        return True

    def _replace_session(self, program, session, verification, report, inputs, *, blame=None) -> None:
        old = self.session
        self.program, self.session, self.verification, self.report = program, session, verification, report
        self.blame = blame
        self.shown_inputs = inputs
        if self.comparison is not None and (old is None or old.program.root != program.root):
            self.comparison = self.comparison_memory = None
            self.compared_sessions = {}
            self.comparison_dry = False
            self._notify("comparison")
        self.filter_method = self.filter_decision = self.filter_reason = ALL
        self.selected = None
        self.exported, self.export_ok, self.export_message = None, None, ""  # of the previous load
        if old is not None and old is not session:
            old.close()
        self._notify("session")
        self._notify("filters")
        self._notify("export")
        rows = self.filtered_decisions()
        if len(rows):  # start on the first culprit, else the first collision: what the user came to see
            culprits = rows[culprit_mask(rows)]
            hits = rows[rows["lookup"].astype(str) == "hit"]
            first = culprits.iloc[0] if len(culprits) else (hits.iloc[0] if len(hits) else rows.iloc[0])
            self.select(first["method"], first["name"])

    def compare(self) -> bool:
        """Load the current program under every policy: the correctness/memory trade-off.

        In a dry run, every policy is dry-run instead (nothing is loaded)."""
        if not self._begin():
            return False
        try:
            from .compare import compare_policies

            try:
                program = self.program or self.open_program()
            except Exception as e:  # noqa: BLE001
                return self._fail("could not open the program", e)
            if self.dry_run:
                return self._dry_compare(program)

            def on_policy(pol: str, i: int, n: int) -> None:
                self._step("compare", (i + 0.5) / (n + 1), f"loading and verifying under {pol!r} ({i + 1} of {n})")

            try:
                result = compare_policies(program, device=self.device, on_policy=on_policy)
            except Exception as e:  # noqa: BLE001
                return self._fail("could not compare policies", e)
            # one load per policy: the frame, the memory per method and the sessions all come from it
            self.comparison, self.comparison_memory = result.frame, result.memory()
            self.compared_sessions = result.sessions
            self.comparison_dry = False
            self.program = program
            self._notify("comparison")  # results first: "done" means everything is on screen
            self.outcome = "ok"
            self._step("done", 1.0, f"compared {len(POLICIES)} policies on {program.name!r}")
            return True
        finally:
            self._end()

    def _dry_compare(self, program: "Program") -> bool:
        from .analysis import run_analysis
        from .compare import COMPARE_COLUMNS
        from .tables import memory_by_policy_frame

        device = self.analysis_device(program)
        rows, sessions = [], {}
        try:
            for i, name in enumerate(POLICIES):
                self._step("compare", (i + 0.5) / (len(POLICIES) + 1),
                           f"dry run under {name!r} ({i + 1} of {len(POLICIES)}): nothing is loaded")
                s = run_analysis(program, name, device=device).session
                try:
                    rows.append(_dry_comparison_row(s))
                finally:
                    s.close()
                sessions[name] = s
        except Exception as e:  # noqa: BLE001
            return self._fail("could not dry-run the policies", e)
        self.comparison = pd.DataFrame(rows, columns=COMPARE_COLUMNS)
        self.comparison_memory = memory_by_policy_frame(sessions.values())
        self.compared_sessions, self.comparison_dry, self.program = sessions, True, program
        self._notify("comparison")
        self.outcome = "ok"
        self._step("done", 1.0, f"dry-ran {len(POLICIES)} policies on {program.name!r} on {device} "
                   f"(a prediction: nothing was loaded or run)")
        return True

    @property
    def comparison_banner(self) -> str:
        """The sentence saying the comparison is a prediction, when it is a dry run; '' otherwise."""
        if self.comparison is None or not self.comparison_dry:
            return ""
        return ("DRY RUN of every policy: a prediction, nothing was loaded or run. wrong_methods are the methods "
                "predicted to run on a constant shared although its content differs.")

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
        """The decision table under the current filters (a new frame), with ``same_content``
        (cached and new content digests equal; NA: no cache entry)."""
        if self.session is None:
            return pd.DataFrame(columns=list(DECISION_TABLE_COLUMNS))
        d = self.session.decisions
        if self.filter_method:
            d = d[d["method"] == self.filter_method]
        if self.filter_decision:
            d = d[d["decision"].astype(str) == self.filter_decision]
        if self.filter_reason:
            d = d[d["reason_code"].astype(str) == self.filter_reason]
        return content_check(d.reset_index(drop=True))

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

    def content_verdict(self) -> tuple[str, str]:
        """(kind, sentence) on the selected constant's content against the cache entry it was
        checked against: kind ``"culprit"`` (shared although the content differs),
        ``"caught"`` (differs, not shared), ``"same"``, or ``"none"`` (nothing to compare)."""
        d = self.selected_decision()
        if d is None:
            return "none", ""
        new, cached = cell_text(d.get("digest")).strip(), cell_text(d.get("cached_digest")).strip()
        owner = cell_text(d.get("cached_method")) or "another method"
        decision = cell_text(d.get("decision"))
        if not new or not cached:
            return "none", "no cache entry to compare with: this constant was not found in the cache"
        if new != cached:
            if decision == "shared":
                return "culprit", (f"content differs: shared anyway. {d['method']} runs on {owner}'s tensor, "
                                   f"whose bytes are not this constant's (the content digests below disagree)")
            return "caught", (f"content differs: {decision}, so the difference was caught; {d['method']} keeps "
                              f"its own bytes (the content digests below disagree)")
        return "same", f"same content: this constant and {owner}'s cached tensor have equal content digests"

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

    def interactive_matrix(self):
        """The collision matrix of the current results as a plotly figure (hover: each cell's
        decision, reason and blame's verdict), or None before a load or without plotly."""
        if self.session is None:
            return None
        try:
            import plotly  # noqa: F401
        except ImportError:
            return None
        from . import plots

        return plots.interactive_collision_matrix(self.session, verification=self.verification)

    def default_export_name(self) -> str:
        """A plain file name for the report of the current load: program and policy names
        sanitised (:func:`safe_file_name`), never a path."""
        if self.session is None:
            return "collision_report.csv"
        dry = "-dry-run" if self.is_dry_run else ""
        return (f"{safe_file_name(self.session.program.name)}-{safe_file_name(self.session.policy.name.value)}"
                f"{dry}{EXPORT_SUFFIX}")

    def default_export_path(self) -> str:
        """Where the report goes when no path is given: :meth:`default_export_name` in
        :attr:`export_dir`, numbered (``-2``, ``-3`` ...) past files that already exist."""
        first = self.export_dir / self.default_export_name()
        if not first.exists():
            return str(first)
        stem = first.name[: -len(".csv")] if first.name.endswith(".csv") else first.name
        for i in range(2, 10_000):
            candidate = self.export_dir / f"{stem}-{i}.csv"
            if not candidate.exists():
                return str(candidate)
        raise ToolkitError(f"{self.export_dir}: too many reports named {stem}-N.csv")

    def export_csv(self, path: str | Path | None = None, *, overwrite: bool = False) -> bool:
        """Write the collision report of the current load; False (and :attr:`error`) on failure.

        ``path``: a file name or path (relative ones are taken from :attr:`export_dir`); none:
        :meth:`default_export_path`.  An existing file is replaced only with ``overwrite``.
        The outcome, with the absolute path written, is in :attr:`export_message`."""
        self.clear_error()
        if self.report is None:
            return self._fail("nothing to export", ToolkitError("load a program first"), scope="export")
        try:
            target = Path(path).expanduser() if path not in (None, "") else Path(self.default_export_path())
            if not target.is_absolute():
                target = self.export_dir / target
            target = Path(os.path.abspath(target))
        except Exception as e:  # noqa: BLE001
            return self._fail("could not choose the file", e, scope="export")
        try:
            if target.is_dir():
                raise ToolkitError(f"{str(target)!r} is a folder: give a file name")
            if not target.parent.is_dir():
                raise ToolkitError(f"folder {str(target.parent)!r} does not exist")
            if target.exists() and not overwrite:
                raise ToolkitError(f"{str(target)!r} already exists: choose another name, or allow overwriting")
            # "x": never replace a file that appeared since the check above, unless asked
            with open(target, "w" if overwrite else "x", encoding="utf-8", newline="") as fh:
                self.report.to_csv(fh)
        except Exception as e:  # noqa: BLE001
            return self._fail(f"could not write {str(target)!r}", e, scope="export")
        self.exported, self.export_ok = target, True
        dry = (f" (a dry run: predicted decisions, verification {DRY_RUN_REASON!r})" if self.is_dry_run else "")
        self.export_message = f"wrote {len(self.report.frame)} rows to {target}{dry}"
        self._notify("export")
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


def _itable_class():
    """itables' ITable widget (sortable, searchable, paginated, row selection), or None."""
    try:
        from itables.widget import ITable
    except ImportError:
        return None
    return ITable


def _table_html(frame: pd.DataFrame, columns, empty: str) -> str:
    return html_table(frame, columns, max_rows=MAX_TABLE_ROWS, empty=empty,
                      more_hint="narrow the filters to see them")


def _verification_html(v: pd.DataFrame | None, decisions: pd.DataFrame | None = None,
                       blame: pd.DataFrame | None = None) -> str:
    return verification_html(v, empty="no methods", decisions=decisions, blame=blame)


# what decides first (the decision, whether the content differs, why), then the identifiers
GRID_COLUMNS = ("method", "name", "decision", "same content", "reason", "lookup", "bytes", "shared from", "fqn")
BLAME_GRID_COLUMN = "culprit (blame)"  # shown when blame found one: which verification the share breaks


def _span(text: str, cls: str = "", title: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    if title:
        attrs += f' title="{html.escape(title, quote=True)}"'
    return f"<span{attrs}>{html.escape(text, quote=True)}</span>"


def grid_frame(rows: pd.DataFrame, evidence: dict[tuple[str, str], str] | None = None) -> pd.DataFrame:
    """The Decisions grid's cells: escaped HTML, one row per decision (same order as
    ``rows``), decision coloured by class, culprits (shared, content differs) marked, the
    full reason on hover over its code.  When blame named culprits (the ``culprit`` column of
    the decisions, ``evidence`` by (method, name)), a "culprit (blame)" column marks them,
    the evidence on hover."""
    culprit = culprit_mask(rows).tolist() if len(rows) else []
    blamed = [cell_text(x) for x in rows["culprit"]] if "culprit" in rows.columns and len(rows) else []
    with_blame = any(blamed)
    evidence = evidence or {}
    out = []
    wanted = [c for c in ("method", "name", "fqn", "lookup", "decision", "same_content", "reason_code", "reason",
                          "shared_from", "nbytes") if c in rows.columns]
    records = rows[wanted].to_dict("records") if len(rows) else []  # only what the cells show
    for k, (r, bad) in enumerate(zip(records, culprit)):
        blame_text = blamed[k] if with_blame else ""
        bad = bad or bool(blame_text)
        decision = cell_text(r.get("decision"))
        same = r.get("same_content")
        same_text = "" if same is None or same is pd.NA or (isinstance(same, float) and same != same) else (
            "same" if bool(same) else "DIFFERS")
        cls = "cs-culprit" if bad else (f"cs-d-{decision}" if decision in DECISION_COLOURS else "")
        same_cls = "cs-culprit" if bad else ("cs-caught" if same_text == "DIFFERS" else "")
        nbytes = r.get("nbytes")
        out.append({
            "method": _span(cell_text(r.get("method"))), "name": _span(cell_text(r.get("name"))),
            "fqn": _span(cell_text(r.get("fqn"))), "lookup": _span(cell_text(r.get("lookup"))),
            "decision": _span(decision + (" \u2717" if bad else ""), f"cs-tag {cls}",
                              "shared although the content differs: the culprit of a wrong output" if bad else ""),
            "same content": _span(same_text, f"cs-tag {same_cls}" if same_cls else ""),
            "reason": _span(cell_text(r.get("reason_code")), "cs-reason", cell_text(r.get("reason"))),
            "shared from": _span(cell_text(r.get("shared_from"))),
            "bytes": _span(format_bytes(nbytes) if nbytes not in (None, "") else "",
                           title=f"{int(nbytes):,} bytes" if isinstance(nbytes, (int, float)) and nbytes == nbytes
                           else ""),
        })
        if with_blame:
            key = (cell_text(r.get("method")), cell_text(r.get("name")))
            out[-1][BLAME_GRID_COLUMN] = _span(
                f"\u2717 breaks {blame_text}" if blame_text else "", "cs-tag cs-culprit" if blame_text else "",
                f"undoing this share fixes {blame_text}: {evidence.get(key, '')}" if blame_text else "")
    columns = list(GRID_COLUMNS)
    if with_blame:
        columns.insert(columns.index("same content") + 1, BLAME_GRID_COLUMN)
    return pd.DataFrame(out, columns=columns)


_CSS = """<style>
.constshare-explorer table { border-collapse: collapse; font-size: 12px; }
.constshare-explorer th, .constshare-explorer td { border: 1px solid #ccc; padding: 2px 6px; text-align: left;
  line-height: 1.4; }
.constshare-explorer th { background: #f3f3f3; }
.constshare-explorer .constshare-grid table.dataTable td, .constshare-explorer .constshare-grid table.dataTable th {
  border: none; border-bottom: 1px solid #e4e4e4; white-space: nowrap; text-align: left; }
.constshare-explorer .constshare-grid table.dataTable tbody tr { cursor: pointer; }
.constshare-explorer .constshare-grid { max-width: 100%; }
.constshare-explorer .constshare-grid .dt-layout-table > .dt-layout-cell {
  display: block; max-height: """ + GRID_HEIGHT + """; overflow: auto; }
.constshare-explorer .constshare-grid table.dataTable thead th {
  position: sticky; top: 0; z-index: 1; background: #f3f3f3; }
.constshare-error { color: #a00; background: #fdecea; border: 1px solid #f5c2c0; padding: 4px 8px; }
.constshare-ok { color: #274e13; }
.constshare-stale-banner { color: #7f6000; background: #fff8e1; border: 1px solid #f1c232; padding: 4px 8px; }
.constshare-dry-banner { color: #0b3d91; background: #e8f0fe; border: 1px solid #8ab4f8; padding: 4px 8px;
  font-weight: bold; }
.constshare-stale { opacity: 0.45; filter: grayscale(60%); }
.constshare-verdict { padding: 4px 8px; margin: 4px 0; border-radius: 3px; overflow-wrap: anywhere; }
.constshare-explorer .constshare-detail-panel { overflow-x: auto; }
.constshare-verdict-culprit { background: #f4cccc; color: #990000; font-weight: bold; }
.constshare-verdict-caught { background: #fff2cc; }
.constshare-verdict-same { background: #d9ead3; }
.constshare-verdict-none { background: #eeeeee; }
.cs-tag { padding: 0 5px; border-radius: 3px; }
.cs-culprit { background: #f4cccc; color: #990000; font-weight: bold; }
.cs-caught { background: #fff2cc; }
.cs-reason { border-bottom: 1px dotted #999; }
""" + "".join(f".cs-d-{d} {{ background: {c}; }}\n" for d, c in DECISION_COLOURS.items()) + "</style>"


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
        self._grid_keys: list[tuple[str, str]] = []
        s = self.state
        self._widgets: list[Any] = []

        def mk(cls, css: str | None = None, **kw):
            obj = cls(**kw)
            if css:
                obj.add_class(css)
            self._widgets.append(obj)
            return obj

        wide = w.Layout(width="auto")

        def picture():  # natural size, never stretched by the flex box around it; hidden while empty
            return w.Layout(max_width="100%", height="auto", align_self="flex-start", object_fit="contain",
                            display="none")
        self.title = mk(w.HTML, value=_CSS + "<h3 style='margin:4px 0'>constshare explorer</h3>")
        self.source = mk(w.ToggleButtons, "constshare-source", options=list(SOURCES), value=s.source,
                         description="program")
        self.sample = mk(w.Dropdown, "constshare-sample", options=sample_names(), value=s.sample,
                         description="sample")
        self.path = mk(w.Text, "constshare-path", value=s.path, description="path",
                       placeholder="a program directory, a .pte or a .pt2 file", tooltip=PATH_HINT,
                       layout=w.Layout(width="420px"))
        self.sample_info = mk(w.HTML, "constshare-sample-info")
        self.policy = mk(w.Dropdown, "constshare-policy", options=list(POLICIES), value=s.policy,
                         description="policy")
        self.policy_info = mk(w.HTML, "constshare-policy-info")
        self.device = mk(w.Dropdown, "constshare-device", options=_devices(), value=s.device, description="device")
        self.dry_run = mk(w.Checkbox, "constshare-dry-run", value=s.dry_run, indent=False,
                          description="dry run (analyze without loading)",
                          tooltip="predict every decision from the program's metadata: no device, nothing run "
                                  "(explore a CUDA .pte or .pt2 on a CPU)")
        self.load_button = mk(w.Button, "constshare-load", description="Load", button_style="primary", icon="play",
                              tooltip="build or open the program, load it under the policy, verify it")
        self.compare_button = mk(w.Button, "constshare-compare", description="Compare all policies",
                                 icon="balance-scale", tooltip="load under every policy (trade-off plots)",
                                 layout=w.Layout(width="auto", align_self="flex-start"))
        self.progress = mk(w.FloatProgress, "constshare-progress", value=0.0, min=0.0, max=1.0,
                           layout=w.Layout(width="260px"))
        self.status = mk(w.HTML, "constshare-status", value=html.escape(s.message))
        self.error = mk(w.HTML, "constshare-error-box", value="", layout=w.Layout(display="none"))
        self.stale_banner = mk(w.HTML, "constshare-stale-box", value="", layout=w.Layout(display="none"))
        self.dry_banner = mk(w.HTML, "constshare-dry-box", value="", layout=w.Layout(display="none"))
        self.summary = mk(w.HTML, "constshare-summary")
        self.verification = mk(w.HTML, "constshare-verification")
        # the collision matrix: plotly (hover a cell: its decision and reason) in an Output widget,
        # shown by plotly's JupyterLab renderer; the matplotlib one as a PNG download beside it
        self.matrix = mk(w.Output, "constshare-matrix", layout=w.Layout(display="none", max_width="100%"))
        self.matrix_png = mk(w.HTML, "constshare-matrix-png")
        self.filter_method = mk(w.Dropdown, "constshare-filter-method", options=[("all", ALL)], value=ALL,
                                description="method")
        self.filter_decision = mk(w.Dropdown, "constshare-filter-decision", options=[("all", ALL)], value=ALL,
                                  description="decision")
        self.filter_reason = mk(w.Dropdown, "constshare-filter-reason", options=[("all", ALL)], value=ALL,
                                description="reason")
        self.decisions = mk(w.HTML, "constshare-decisions")
        ITable = _itable_class()
        self.grid = None
        if ITable is not None:
            self.grid = mk(ITable, "constshare-grid", df=grid_frame(content_check(pd.DataFrame(
                columns=list(DECISION_TABLE_COLUMNS)))), **self._grid_options())
            self.grid.observe(self._pick_row, names="selected_rows")
        self.constant = mk(w.Dropdown, "constshare-constant", options=[], description="constant",
                           layout=w.Layout(width="100%", max_width="460px"))
        self.constant_detail = mk(w.HTML, "constshare-constant-detail")
        self.timeline = mk(w.Image, "constshare-timeline", format="png", layout=picture())
        self.memory = mk(w.Image, "constshare-memory", format="png", layout=picture())
        self.tradeoff = mk(w.Image, "constshare-tradeoff", format="png", layout=picture())
        self.memory_policies = mk(w.Image, "constshare-memory-policies", format="png", layout=picture())
        self.comparison = mk(w.HTML, "constshare-comparison",
                             value="<p><i>press “Compare all policies” to load the program under every policy</i></p>")
        self.export_folder = mk(w.Text, "constshare-export-folder", value=str(s.export_dir), description="folder",
                                layout=w.Layout(width="520px"))
        self.export_path = mk(w.Text, "constshare-export-path", value="", description="file",
                              placeholder="collision_report.csv", layout=w.Layout(width="520px"))
        self.export_overwrite = mk(w.Checkbox, "constshare-export-overwrite", value=False,
                                   description="replace an existing file", indent=False)
        self.export_button = mk(w.Button, "constshare-export", description="Export CSV", icon="download",
                                layout=w.Layout(width="auto"))
        self.export_result = mk(w.HTML, "constshare-export-result")

        overview = mk(w.HBox, children=[mk(w.VBox, children=[self.summary, self.verification]),
                                        mk(w.VBox, children=[self.matrix, self.matrix_png],
                                           layout=w.Layout(max_width="100%"))],
                      layout=w.Layout(flex_flow="row wrap", align_items="flex-start", grid_gap="16px"))
        left = mk(w.VBox, children=[self.decisions] + ([self.grid] if self.grid is not None else []),
                  layout=w.Layout(flex="1 1 640px", min_width="0", max_width="100%"))
        right = mk(w.VBox, "constshare-detail-panel", children=[self.constant, self.constant_detail],
                   layout=w.Layout(flex="0 1 460px", min_width="320px", max_width="100%"))
        decisions = mk(w.VBox, children=[
            mk(w.HBox, children=[self.filter_method, self.filter_decision, self.filter_reason],
               layout=w.Layout(flex_flow="row wrap")),
            mk(w.HBox, children=[left, right], layout=w.Layout(flex_flow="row wrap", align_items="flex-start",
                                                               grid_gap="16px", width="100%"))])
        timing = mk(w.VBox, children=[self.timeline, self.memory])
        policies = mk(w.VBox, children=[self.compare_button, self.tradeoff, self.memory_policies, self.comparison])
        export = mk(w.VBox, children=[self.export_folder,
                                      mk(w.HBox, children=[self.export_path, self.export_button]),
                                      self.export_overwrite, self.export_result])
        self.tabs = mk(w.Tab, "constshare-tabs", children=[overview, decisions, timing, policies, export])
        for i, t in enumerate(["Overview", "Decisions", "Timeline & memory", "Policies", "Export"]):
            self.tabs.set_title(i, t)
        controls = mk(w.VBox, children=[
            self.source, mk(w.HBox, children=[self.sample, self.path]), self.sample_info,
            mk(w.HBox, children=[self.policy, self.device, self.dry_run]), self.policy_info,
            mk(w.HBox, children=[self.load_button, self.progress, self.status], layout=wide),
            self.error,
        ])
        self.widget = mk(w.VBox, "constshare-explorer", children=[self.title, controls, self.stale_banner,
                                                                     self.dry_banner, self.tabs])

        self.source.observe(lambda ch: self._input(source=ch["new"]), names="value")
        self.sample.observe(lambda ch: self._input(sample=ch["new"]), names="value")
        self.path.observe(lambda ch: self._input(path=ch["new"]), names="value")
        self.policy.observe(lambda ch: self._input(policy=ch["new"]), names="value")
        self.device.observe(lambda ch: self._input(device=ch["new"]), names="value")
        self.dry_run.observe(lambda ch: self._input(dry_run=ch["new"]), names="value")
        for dd, key in ((self.filter_method, "method"), (self.filter_decision, "decision"),
                        (self.filter_reason, "reason")):
            dd.observe(lambda ch, key=key: self._filter(key, ch["new"]), names="value")
        self.constant.observe(self._pick_constant, names="value")
        self.export_folder.observe(self._export_folder, names="value")
        self.load_button.on_click(lambda _b: self._run(self.state.load))
        self.compare_button.on_click(lambda _b: self._run(self.state.compare))
        self.export_button.on_click(lambda _b: self.state.export_csv(self.export_path.value.strip() or None,
                                                                     overwrite=self.export_overwrite.value))
        self._unsubscribe = self.state.subscribe(self._on_state)
        self._render_inputs()

    @staticmethod
    def _grid_options() -> dict[str, Any]:
        # No DataTables scrolling (it sizes its columns when first drawn, and the Decisions tab is
        # hidden then): the page of rows scrolls inside a box of GRID_HEIGHT (CSS below), header sticky.
        return dict(allow_html=True, maxBytes=0, showIndex=False, classes="display compact nowrap",
                    text_in_header_can_be_selected=False, paging=True, pageLength=50,
                    lengthMenu=[25, 50, 100, 500], order=[], select={"style": "single", "items": "row"},
                    # search first, and always there (itables hides its default layout on short tables)
                    layout={"topStart": "search", "topEnd": "pageLength", "bottomStart": "info",
                            "bottomEnd": "paging"},
                    style="width: 100%; margin: 0", autoWidth=False,
                    language={"search": "search:", "info": "_START_-_END_ of _TOTAL_",
                              "emptyTable": "no decision matches the filters"})

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def close(self) -> None:
        """Close every widget of the view (their comms too) and the state's session."""
        self._unsubscribe()
        for obj in reversed(self._widgets):
            # a widget's layout and style are widgets of their own, with their own comms
            for part in (getattr(obj, "layout", None), getattr(obj, "style", None)):
                if part is not None and hasattr(part, "close"):
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

    def _pick_row(self, ch) -> None:
        """A click on a grid row (its position in the grid's frame) selects that constant."""
        rows = list(ch["new"] or [])
        if self._updating or not rows:
            return
        i = rows[0]
        if 0 <= i < len(self._grid_keys) and self._grid_keys[i] != self.state.selected:
            self._guarded(self.state.select, *self._grid_keys[i])

    def _export_folder(self, ch) -> None:
        if self._updating:
            return
        try:
            folder = Path(str(ch["new"]).strip() or ".").expanduser().resolve()
            if not folder.is_dir():
                raise ToolkitError(f"folder {str(folder)!r} does not exist")
        except Exception as e:  # noqa: BLE001
            self.state._fail("invalid export folder", e, scope="export")
            return
        self.state.export_dir = folder
        self.state.clear_error()
        self._render_export()

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
                self._render_stale()
            elif what in ("progress", "busy"):
                self._render_progress()
                self._render_stale()
            elif what == "error":
                self._render_error()
                self._render_stale()
            elif what == "session":
                self._render_session()
                self._render_stale()
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

    @staticmethod
    def _show_png(widget, png: bytes) -> None:
        """An image widget shows its picture, or nothing at all (no broken-image box) when empty."""
        widget.value = png or b""
        widget.layout.display = None if png else "none"

    def _render_inputs(self) -> None:
        s = self.state
        self._set(self.source, value=s.source)
        self._set(self.sample, value=s.sample)
        self._set(self.policy, value=s.policy)
        self._set(self.dry_run, value=s.dry_run)
        if not s.busy:
            self.load_button.description = "Dry run" if s.dry_run else "Load"
        self.sample.layout.display = None if s.source == "sample" else "none"
        self.sample_info.layout.display = None if s.source == "sample" else "none"
        self.path.layout.display = None if s.source == "path" else "none"
        self.sample_info.value = (f"<div style='font-size: 12px; line-height: 1.45; max-width: 110ch'>"
                                  f"{s.sample_description_html}</div>")
        self.policy_info.value = (f"<div style='font-size: 11px; line-height: 1.45; max-width: 130ch'>"
                                  f"<b>{html.escape(s.policy)}</b>: {html.escape(s.policy_summary)}</div>")

    def _render_stale(self) -> None:
        s = self.state
        reason = s.stale_reason
        if reason:
            self.stale_banner.value = f"<div class='constshare-stale-banner'>{html.escape(reason)}</div>"
            self.stale_banner.layout.display = None
            self.tabs.add_class("constshare-stale")
        else:
            self.stale_banner.value, self.stale_banner.layout.display = "", "none"
            self.tabs.remove_class("constshare-stale")

    def _render_progress(self, elapsed: float | None = None) -> None:
        s = self.state
        self.progress.value = s.progress
        if (s.error and s.error_scope != "export") or s.outcome == "failed":
            style = "danger"
        elif s.busy:
            style = "info"
        else:
            style = {"ok": "success", "wrong": "warning"}.get(s.outcome, "info")
        self.progress.bar_style = style
        busy = s.busy
        for b in (self.load_button, self.compare_button, self.export_button):
            b.disabled = busy
        self.load_button.description = "Working…" if busy else ("Dry run" if s.dry_run else "Load")
        clock = f" ({elapsed:.0f} s)" if busy and elapsed is not None and elapsed >= 1 else ""
        colour = "#a00" if style == "danger" else ("#7f6000" if style == "warning" else "")
        text = html.escape(s.message + clock)
        self.status.value = f"<span style='color: {colour}'>{text}</span>" if colour else text

    def _render_error(self) -> None:
        s = self.state
        if not s.error or s.error_scope == "export":  # export errors are shown next to the export button
            self.error.value, self.error.layout.display = "", "none"
            self._render_progress()
            return
        detail = (f"<details><summary>details</summary><pre>{html.escape(s.error_detail[-4000:])}</pre></details>"
                  if s.error_detail else "")
        self.error.value = f"<div class='constshare-error'><b>{html.escape(s.error)}</b>{detail}</div>"
        self.error.layout.display = None
        self._render_progress()

    def _render_session(self) -> None:
        from .plots import figure_png

        s = self.state
        if s.session is None:
            return
        banner = s.banner
        self.dry_banner.value = f"<div class='constshare-dry-banner'>{html.escape(banner)}</div>" if banner else ""
        self.dry_banner.layout.display = None if banner else "none"
        self.summary.value = (f"<div class='constshare-dry-banner'>{html.escape(banner)}</div>" if banner else "") \
            + f"<pre>{html.escape(s.session.summary())}</pre>"
        self.verification.value = "<b>verification</b>" + _verification_html(s.verification, s.session.decisions,
                                                                              s.blame)
        figs = s.figures()
        self._render_matrix(figure_png(figs["collision matrix"]))
        self._show_png(self.timeline, figure_png(figs["timeline"]))
        self._show_png(self.memory, figure_png(figs["memory"]))
        # the grid and the export box follow on their own notifications ("filters", "export"), sent
        # right after "session": rendering them here too would draw 10,000 rows twice

    def _render_matrix(self, png: bytes) -> None:
        """The interactive matrix (plotly), and the matplotlib PNG as a download link; without
        plotly, the PNG itself."""
        s = self.state
        fig = s.interactive_matrix()
        name = html.escape(s.default_export_name().replace(EXPORT_SUFFIX, "-collision-matrix.png"), quote=True)
        data = base64.b64encode(png).decode("ascii")
        if fig is None:
            self.matrix.outputs = ()
            self.matrix.layout.display = "none"
            self.matrix_png.value = (f"<img class='constshare-plot' style='max-width: 100%' "
                                     f"src='data:image/png;base64,{data}'>")
            return
        from .plots import plotly_bundle

        self.matrix.outputs = ({"output_type": "display_data", "data": plotly_bundle(fig), "metadata": {}},)
        self.matrix.layout.display = None
        self.matrix_png.value = (f"<div style='font-size: 12px'>hover a cell for its decision and reason · "
                                 f"<a download=\"{name}\" href=\"data:image/png;base64,{data}\">download as PNG</a>"
                                 f"</div>")

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
        culprits = int(culprit_mask(rows).sum()) if len(rows) else 0
        head = f"<p>{len(rows)} of {total} decisions"
        if culprits:
            head += (f" · <span style='{CULPRIT_STYLE}; padding: 0 5px'>{culprits} shared although the content "
                     f"differs</span>")
        n_blamed = int((rows["culprit"].map(cell_text) != "").sum()) if "culprit" in rows.columns and len(rows) else 0
        if n_blamed:
            head += (f" · <span style='{CULPRIT_STYLE}; padding: 0 5px'>{n_blamed} culprit"
                     f"{'s' if n_blamed != 1 else ''} found by blame</span> (undoing the share fixes the method)")
        head += " · click a row to see that constant</p>" if self.grid is not None and len(rows) else "</p>"
        keys = list(zip(rows["method"], rows["name"]))
        self._grid_keys = keys
        if self.grid is not None:
            self.decisions.value = head
            selected = [keys.index(s.selected)] if s.selected in keys else []
            self._updating = True
            try:
                # every option again: itables' update() forgets those not given (allow_html among them)
                self.grid.update(grid_frame(rows, s.blamed()), selected_rows=selected, **self._grid_options())
            finally:
                self._updating = False
        else:  # no itables: the renderer's table, scrolling inside a bounded box
            self.decisions.value = (head + f"<div style='max-height: {GRID_HEIGHT}; overflow: auto'>"
                                    + _table_html(rows, DECISION_TABLE_COLUMNS, "no decision matches the filters")
                                    + "</div>")
        self._set(self.constant, options=[(f"{m} / {n}", (m, n)) for m, n in keys],
                  value=s.selected if s.selected in set(keys) else None)

    def _render_selection(self) -> None:
        s = self.state
        keys = list(self.constant.options)
        if s.selected is not None and s.selected in [v for _l, v in keys]:
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
        if s.blamed().get((d["method"], d["name"])) is not None:
            kind = "culprit"
        verdict = (f"<div class='constshare-verdict constshare-verdict-{kind}'>{html.escape(sentence)}</div>"
                   if sentence else "")
        facts = [("decision", d["decision"]), ("reason", d["reason"]), ("lookup", d["lookup"] or "not looked up"),
                 ("bytes", f"{format_bytes(d['nbytes'])} ({int(d['nbytes']):,})"),
                 ("cached", f"{d['cached_method']}" if d["cached_method"] else "no cache entry")]
        if d.get("shared_from"):
            facts.append(("runs on", d["shared_from"]))
        blamed = s.blamed().get((d["method"], d["name"]))
        if blamed is not None:
            facts.append(("blame", f"culprit: undoing this share fixes {cell_text(d.get('culprit'))} ({blamed})"))
        head = html_table(pd.DataFrame(facts, columns=["fact", "value"]), max_rows=len(facts),
                          colours={"value": lambda text: WRONG_COLOUR if kind == "culprit" and (
                                   text == "shared" or text.startswith("culprit:")) else ""})
        new, cached = cell_text(d["digest"]), cell_text(d["cached_digest"])
        differs = bool(new and cached and new != cached)
        # one row per side (a narrow table: the detail panel is narrow), the digests shortened
        digests = pd.DataFrame([["this constant (" + cell_text(d["method"]) + ")", new],
                                ["cached (" + (cell_text(d["cached_method"]) or "none") + ")", cached or ""],
                                ["equal", ("NO" if differs else "yes") if new and cached else ""]],
                               columns=["content digest", "value"])
        digest_html = html_table(digests, max_rows=3, colours={
            "value": lambda text: WRONG_COLOUR if differs and text else ""})
        comp = s.selected_comparison()
        if len(comp):
            shown = comp.assign(equal=["yes" if e else "NO" for e in comp["equal"]])
            body = html_table(shown, max_rows=len(shown),
                              colours={"equal": lambda text: WRONG_COLOUR if text == "NO" else ""})
        else:
            body = "<p><i>nothing was compared field by field for this constant (see the reason above)</i></p>"
        self.constant_detail.value = (f"<b>{html.escape(d['method'])} / {html.escape(d['name'])}</b>"
                                      f"{verdict}{head}{digest_html}<b>cached vs new</b>{body}")

    def _render_comparison(self) -> None:
        from .plots import figure_png

        s = self.state
        if s.comparison is None:
            self._show_png(self.tradeoff, b"")
            self._show_png(self.memory_policies, b"")
            self.comparison.value = "<p><i>press “Compare all policies” to load the program under every policy</i></p>"
            return
        figs = s.figures()
        self._show_png(self.tradeoff, figure_png(figs["policy trade-off"]))
        self._show_png(self.memory_policies,
                       figure_png(figs["memory by policy"]) if "memory by policy" in figs else b"")
        # lists (wrong_methods, not_runnable) are shown comma-joined by the renderer
        banner = s.comparison_banner
        self.comparison.value = (f"<div class='constshare-dry-banner'>{html.escape(banner)}</div>" if banner
                                 else "") + _table_html(s.comparison, ["policy", "status", "wrong_methods", "not_runnable",
                                                           "shared", "declined", "device_bytes", "error"],
                                            "no policies")

    def _render_export(self) -> None:
        s = self.state
        self._set(self.export_folder, value=str(s.export_dir))
        try:
            self.export_path.placeholder = s.default_export_path()
        except ToolkitError:
            self.export_path.placeholder = str(s.export_dir / s.default_export_name())
        if s.export_ok is None:
            self.export_result.value = ""
            return
        if not s.export_ok:
            self.export_result.value = f"<div class='constshare-error'>{html.escape(s.export_message)}</div>"
            return
        target = s.exported
        data = base64.b64encode(target.read_bytes()).decode("ascii")
        name = html.escape(target.name, quote=True)
        self.export_result.value = (f"<div class='constshare-ok'>wrote <code>{html.escape(str(target))}</code> "
                                    f"({len(s.report.frame) if s.report is not None else 0} rows) · "
                                    f"<a download=\"{name}\" href=\"data:text/csv;base64,{data}\">download</a></div>")
