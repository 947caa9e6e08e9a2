"""The notebook explorer: pick a program, a policy and a device, load, and browse what happened.

- :class:`ExplorerState`, a traitlets model (testable without a browser or a kernel): the choices,
  the results on screen and the progress are traits; its actions (load, compare, filter, select,
  export) call :mod:`toolkit.engine.session`, :mod:`toolkit.workflows.dry_run` and :mod:`toolkit.workflows.compare`.  They
  never raise for a user error: they set ``error`` and return False.
- :class:`Explorer`, the ipywidgets view: widgets linked to the choices, each panel re-rendered
  when a trait it shows changes (:data:`PANELS`); actions run on a worker thread.

Everything it says about right and wrong is the session's verdict (a dry run's: the prediction,
said so).  Export file names are sanitised from the (maybe untrusted) program and policy names;
nothing is overwritten unless asked.  ipywidgets, itables and matplotlib are imported when a
view or figure is made.
"""

from __future__ import annotations

import base64
import html
import os
import re
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pandas as pd
import traitlets

from toolkit.build.samples import DEFAULT_SAMPLE, build_sample, sample_names
from toolkit.core.errors import IncompatibleProgramError, InvalidChoiceError, ToolkitError
from toolkit.core.policies import POLICIES, get_policy
from toolkit.core.verdict import ConstantFinding, Verdict
from toolkit.core.vocab import BlameStatus, Lookup, MethodOutcome, PolicyName, parse
from toolkit.display.html import (
    CAUGHT_COLOUR,
    DECISION_COLOURS,
    WRONG_COLOUR,
    cell_text,
    content_check,
    culprit_mask,
    format_bytes,
    html_table,
    markdown_html,
    markdown_text,
    outcome_colour,
    session_facts_html,
    shorten_digests,
    verification_html,
)
from toolkit.reports.collision import XLSX_MIME, CollisionReport, collision_report, native_code_notice

if TYPE_CHECKING:
    from toolkit.core.model import Program
    from toolkit.engine.session import Session

PROGRAM_FROM = ("sample", "path")  # where the explorer takes its program from
INPUTS = ("program_from", "sample", "path", "policy", "device", "dry_run")
ALL = ""  # filter value meaning "no filter"
FILTERS = ("method", "decision", "reason")  # the Decisions tab's filters (state.filter_<key>)
DECISION_TABLE_COLUMNS = (
    "method",
    "name",
    "fqn",
    "lookup",
    "decision",
    "same_content",
    "data_problem",
    "culprit",
    "reason_code",
    "reason",
    "shared_from",
)
PATH_HINT = "a program directory (holding manifest.json), an ExecuTorch .pte (its .ptd beside it) or a torch .pt2 file"
DRY_RUN_REASON = "not run (dry run)"
DRY_RUN_HINT = "this program cannot be loaded here: tick “dry run” to analyze it without loading"
PREDICTION = "dry run (a prediction, nothing loaded or run): "
BANNER_HEAD = "DRY RUN: a prediction, not a load."
MAX_TABLE_ROWS = 300
TAB_TITLES = ("Overview", "Decisions", "Timeline & memory", "Policies", "Export")
DECISIONS_TAB = TAB_TITLES.index("Decisions")
GRID_HEIGHT = "360px"  # the Decisions grid scrolls inside this height
MATRIX_HEIGHT = "760px"  # the Overview's matrix scrolls inside this height (a long one: 16 px a name)
EXPORT_SUFFIX = "-collisions.csv"
EXPORT_SCOPES = ("export", "rows")  # errors of the Export tab's report and of the Decisions tab's rows
COMPARISON_COLUMNS = [
    "policy",
    "outcome",
    "stage",
    "wrong_methods",
    "not_runnable",
    "shared",
    "declined",
    "device_bytes",
    "error",
]
BAR_STYLES = {
    MethodOutcome.OK: "success",
    MethodOutcome.WRONG: "warning",
    MethodOutcome.FAILED: "danger",
    MethodOutcome.REFUSED: "danger",
}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?")
NO_CUDA = "this machine has no CUDA device: choose device cpu, or tick “dry run” to predict the load"
MAX_INLINE_EXPORT = 512 * 1024  # bytes: a larger export is linked by its path, not embedded in the page
SESSION_FIGURES = ("collision matrix", "timeline", "memory")  # a load's figures, drawn in this order
# the bar's share of each step of a load: the constants of a load (then verify, blame), of a dry
# run, and the figures drawn at the end (a 10,000-constant program takes seconds in each)
LOAD_SPAN, DRY_RUN_SPAN, DRAW_SPAN = (0.5, 0.7), (0.1, 0.8), (0.88, 0.98)
PROGRESS_STEP = 0.01  # the constants' progress moves the bar by at least this much (or a new method begins)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(e, ToolkitError):
        return first or type(e).__name__
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


_REBUILD = re.compile(r";?\s*rebuild it with device=\S+")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def dry_run_verification(session: "Session") -> pd.DataFrame:
    """The verification frame of a dry run: every method "not run (dry run)", ``ok`` missing
    (neither ok nor wrong: its outcome is the prediction's verdict; ``verify()`` is never asked)."""
    from toolkit.engine.verification import VERIFY_COLUMNS

    rows = [
        {
            "method": m.name,
            "ran": False,
            "max_abs_err": float("nan"),
            "atol": float("nan"),
            "rtol": float("nan"),
            "ok": pd.NA,
            "reason": DRY_RUN_REASON,
        }
        for m in session.program.methods
    ]
    return pd.DataFrame(rows, columns=VERIFY_COLUMNS)


def safe_file_name(text: str, *, fallback: str = "program", max_len: int = 80) -> str:
    """``text`` as a plain file name: letters, digits, ``.``, ``_`` and ``-`` only (every other
    run of characters, path separators included, becomes ``_``), no leading dot or dash,
    at most ``max_len`` characters; ``fallback`` when nothing is left."""
    name = re.sub(r"\.{2,}", ".", _UNSAFE.sub("_", str(text))).strip("._-")
    name = name[:max_len].rstrip("._-")
    return name or fallback


def count_text(shown: int | str, total: int, filtered: bool) -> str:
    """The Decisions tab's one count, "N of M decisions (filtered)" (the grid's info line says it
    with ``shown`` "_TOTAL_": the rows its search leaves)."""
    n = f"{shown:,}" if isinstance(shown, int) else shown
    return f"{n} of {total:,} decisions" + (" (filtered)" if filtered else "")


def findings_summary(verdict: Verdict | None, keys: set[tuple[str, str]] | None = None) -> str:
    """The constants that run on other data (a finding with a problem, or a culprit), of ``keys``
    only when given, in one sentence: "N run on other data: K culprits, M harmless (why), J not
    tested"; '' when there are none."""
    found = [
        c
        for c in (verdict.constants if verdict is not None else ())
        if (c.problem is not None or c.blame is BlameStatus.CULPRIT) and (keys is None or (c.method, c.name) in keys)
    ]
    if not found:
        return ""
    by = {b: [c for c in found if c.blame is b] for b in BlameStatus}
    parts = []
    if by[BlameStatus.CULPRIT]:
        parts.append(_plural(len(by[BlameStatus.CULPRIT]), "culprit") + " (undoing the share fixes the method)")
    if by[BlameStatus.HARMLESS]:
        notes = Counter(c.blame_note for c in by[BlameStatus.HARMLESS]).most_common()
        why = notes[0][0] if len(notes) == 1 else "; ".join(f"{n:,}: {note}" for note, n in notes)
        parts.append(f"{len(by[BlameStatus.HARMLESS]):,} harmless ({why})")
    if by[BlameStatus.NOT_TESTED]:
        parts.append(
            f"{len(by[BlameStatus.NOT_TESTED]):,} not tested"
            + (" (a prediction: nothing ran)" if verdict.predicted else " (no blame experiment)")
        )
    return f"{_plural(len(found), 'constant')} run on other data: " + ", ".join(parts)


CULPRIT_RANK, RUNS_ON_OTHER_DATA, OF_A_WRONG_METHOD, COLLISION, OTHER = range(5)


def interest_rank(rows: pd.DataFrame, verdict: Verdict | None) -> pd.Series:
    """Each decision row's place in the Decisions grid: culprits (:data:`CULPRIT_RANK`), then the
    other constants that run on other data, then the rows of the wrong methods, then the other
    collisions (names found in the cache), then the rest."""
    culprits, found = set(), set()
    for c in verdict.constants if verdict is not None else ():
        (culprits if c.blame is BlameStatus.CULPRIT else found).add((c.method, c.name))
    wrong = set(verdict.wrong_methods) if verdict is not None else set()
    problem = culprit_mask(rows).tolist()
    hits = (rows["lookup"].map(cell_text) == Lookup.HIT.value).tolist() if "lookup" in rows else [False] * len(rows)
    rank = [
        CULPRIT_RANK
        if k in culprits
        else RUNS_ON_OTHER_DATA
        if p or k in found
        else OF_A_WRONG_METHOD
        if k[0] in wrong
        else COLLISION
        if h
        else OTHER
        for k, p, h in zip(zip(rows["method"].tolist(), rows["name"].tolist()), problem, hits)
    ]
    return pd.Series(rank, index=rows.index, dtype="int64")


def finding_of(verdict: Verdict | None, method: str, name: str) -> ConstantFinding | None:
    """The verdict's finding for one constant (a culprit first), None when it runs on its own data."""
    found = [c for c in verdict.findings(method) if c.name == name] if verdict is not None else []
    return min(found, key=lambda c: c.blame is not BlameStatus.CULPRIT, default=None)


class ExplorerState(traitlets.HasTraits):
    """Choices, results and actions of the explorer (no UI code); views observe its traits.

    ``build``: how a sample is built (default :func:`toolkit.build.samples.build_sample`); ``load``:
    how a program is loaded (default :func:`toolkit.engine.session.load_program`); ``export_dir``:
    where default export files go and relative export paths are taken from (default: the
    working folder when the state is made).  The inputs (:data:`INPUTS`) are validated as set.
    """

    program_from = traitlets.Unicode("sample")
    sample = traitlets.Unicode(DEFAULT_SAMPLE)
    path = traitlets.Unicode("")
    policy = traitlets.Unicode(PolicyName.FINGERPRINT.value)
    device = traitlets.Unicode("cpu")
    dry_run = traitlets.Bool(False)
    # the results on screen, set together by a load (the view renders them on "session")
    program = traitlets.Instance("toolkit.core.model.Program", allow_none=True)
    session = traitlets.Instance("toolkit.engine.session.Session", allow_none=True)
    verification = traitlets.Instance(pd.DataFrame, allow_none=True)
    verdict = traitlets.Instance(Verdict, allow_none=True)
    report = traitlets.Instance(CollisionReport, allow_none=True)
    shown_inputs = traitlets.Tuple(default_value=None, allow_none=True)  # the inputs the results on screen are of
    blame_note = traitlets.Unicode("")  # why blame could not run, '' when it ran or was not needed
    comparison = traitlets.Instance("toolkit.workflows.compare.PolicyComparison", allow_none=True)
    # the Decisions tab: the filters and the rows they leave (what the grid shows and counts)
    filter_method = traitlets.Unicode(ALL)
    filter_decision = traitlets.Unicode(ALL)
    filter_reason = traitlets.Unicode(ALL)
    culprits_only = traitlets.Bool(False)  # only the constants that run on other data (culprits first)
    rows = traitlets.Instance(pd.DataFrame, args=(), kw={"columns": list(DECISION_TABLE_COLUMNS)})
    selected = traitlets.Tuple(default_value=None, allow_none=True)  # (method, name)
    # progress of the running action, and what became of the last one
    busy = traitlets.Bool(False)
    loading = traitlets.Bool(False)  # a load (not a comparison) is in progress
    phase = traitlets.Unicode("")
    progress = traitlets.Float(0.0)
    message = traitlets.Unicode("choose a program and a policy, then load")
    outcome = traitlets.UseEnum(MethodOutcome, default_value=None, allow_none=True)
    error = traitlets.Unicode(None, allow_none=True)
    error_detail = traitlets.Unicode("")
    error_scope = traitlets.Unicode("")  # one of EXPORT_SCOPES: shown next to that export button
    export_dir = traitlets.Instance(Path)
    exported = traitlets.Instance(Path, allow_none=True)
    export_ok = traitlets.Bool(None, allow_none=True)  # the latest export's outcome (None: none yet)
    export_message = traitlets.Unicode("")
    rows_exported = traitlets.Unicode("")  # what the Decisions tab's own export wrote ('' none yet)
    rows_export_file = traitlets.Instance(Path, allow_none=True)  # and where (None: none yet)

    def __init__(
        self,
        *,
        build: Callable[..., "Program"] = build_sample,
        load: Callable[..., "Session"] | None = None,
        export_dir: str | os.PathLike | None = None,
        **inputs: Any,
    ):
        super().__init__(export_dir=Path(export_dir if export_dir is not None else Path.cwd()).expanduser().resolve())
        self._build, self._load = build, load
        self._lock = threading.Lock()
        self._pngs: tuple[Any, dict[str, bytes]] = (None, {})  # (session, its figures' PNGs)
        self.set(**inputs)

    # ------------------------------------------------------------------ inputs
    @traitlets.validate("device")
    def _valid_device(self, proposal) -> str:
        if not DEVICE_RE.fullmatch(proposal.value):
            raise InvalidChoiceError(f"unknown device {proposal.value!r}; choose cpu, cuda or cuda:N")
        return proposal.value

    @traitlets.validate("program_from", "sample", "policy")
    def _valid_choice(self, proposal) -> str:
        name, value = proposal.trait.name, proposal.value
        if name == "policy":
            return parse(PolicyName, value, what="policy").value
        choices = PROGRAM_FROM if name == "program_from" else sample_names()
        if value not in choices:
            raise InvalidChoiceError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
        return value

    def set(self, **choices: Any) -> None:
        """Change several of :data:`INPUTS` (each validated by its trait)."""
        for key, value in choices.items():
            if key not in INPUTS:
                raise TypeError(f"unknown explorer input {key!r}")
            setattr(self, key, str(value) if key == "device" else value)

    def inputs(self) -> tuple:
        """The current choices that a load depends on."""
        where = self.sample if self.program_from == "sample" else self.path.strip()
        return (self.program_from, where, self.policy, self.device, self.dry_run)

    @staticmethod
    def describe_inputs(inputs: tuple | None) -> str:
        if inputs is None:
            return "nothing"
        program_from, where, policy, device, dry = inputs
        what = f"sample {where!r}" if program_from == "sample" else f"{where!r}"
        return f"{'a dry run of ' if dry else ''}{what} under {policy!r} on {device}"

    @property
    def is_dry_run(self) -> bool:
        """Whether the results on screen are a prediction (nothing loaded or run)."""
        return self.verdict is not None and self.verdict.predicted

    @property
    def banner(self) -> str:
        """The sentence saying the results are a prediction, when they are a dry run; '' otherwise."""
        if not self.is_dry_run:
            return ""
        s = self.session
        devices = ", ".join(sorted({str(d) for d in s.devices.values()}))
        return (
            f"{BANNER_HEAD} The decisions, sharing and memory below are what loading "
            f"{self.program_label!r} under {s.policy.name.value!r}{' on ' + devices if devices else ''} would do, "
            f"worked out from the program's metadata by the loader's own code; nothing was put on a device and "
            f"nothing ran: each method's outcome is predicted, its verification “{DRY_RUN_REASON}”."
        )

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
            return f"loading {self.describe_inputs(self.inputs())}: the results below are still those of {shown}"
        if self.error and self.error_scope not in EXPORT_SCOPES:
            return f"the last load failed: the results below are those of {shown}, not of the current choices"
        return f"the choices changed: the results below are those of {shown}; press Load to update them"

    @property
    def policy_summary(self) -> str:
        p = get_policy(self.policy)
        return f"{p.summary} (reproduces: {p.reproduces_text()})"

    def _description(self) -> str:
        from toolkit.build.samples import sample_module

        try:
            return sample_module(self.sample).DESCRIPTION
        except ToolkitError as e:
            return str(e)

    @property
    def sample_description(self) -> str:
        """The sample's description as plain text (markdown markup removed)."""
        return markdown_text(self._description())

    @property
    def sample_description_html(self) -> str:
        """The sample's description rendered from its markdown (escaped)."""
        return markdown_html(self._description())

    # ------------------------------------------------------------------ progress / errors
    def _step(self, phase: str, fraction: float, message: str) -> None:
        with self.hold_trait_notifications():
            self.phase, self.progress, self.message = phase, fraction, message

    def _fail(self, what: str, e: BaseException, *, scope: str = "", hint: str = "") -> bool:
        """Record a failure: :attr:`error` is the one sentence (what could be done first, when
        there is a ``hint``), the status line says only ``what`` failed; a traceback is kept
        (:attr:`error_detail`) for unexpected errors only, never for a :class:`ToolkitError`."""
        error = f"{what}: " + (f"{hint} ({_one_line(e)})" if hint else _one_line(e))
        with self.hold_trait_notifications():
            self.error_detail = (
                "" if isinstance(e, ToolkitError) else "".join(traceback.format_exception(type(e), e, e.__traceback__))
            )
            self.error_scope, self.error = scope, error
            if scope == "export":
                self.exported, self.export_ok, self.export_message = None, False, error
            elif scope == "rows":
                self.rows_exported, self.rows_export_file = "", None
            else:
                self.outcome, self.phase, self.message = MethodOutcome.FAILED, "failed", f"{what} (see below)"
        return False

    def clear_error(self) -> None:
        with self.hold_trait_notifications():
            self.error, self.error_detail, self.error_scope = None, "", ""

    def _begin(self, *, loading: bool = False) -> bool:
        with self._lock:
            if self.busy:
                return False
            with self.hold_trait_notifications():
                self.busy, self.loading, self.outcome = True, loading, None
                self.clear_error()
        return True

    def _end(self) -> None:
        with self.hold_trait_notifications():
            self.busy = self.loading = False

    # ------------------------------------------------------------------ actions
    def open_program(self) -> "Program":
        """The chosen program: a sample (built on first use, cached; a compile moves the bar from 5 %
        to 50 % over the methods, phase ``"compile"``), or a program directory, ``.pte`` or ``.pt2``."""
        from toolkit.sources import open_program, read_program_model

        if self.program_from == "sample":
            sample = self.sample

            def on_method(name: str, i: int, n: int) -> None:
                self._step(
                    "compile",
                    0.05 + 0.45 * i / max(n, 1),
                    f"compiling sample {sample!r}: method {name!r} ({i + 1} of {n}), about 20 s "
                    f"each on a CPU, once (the build is cached)",
                )

            return self._build(sample, device=self.device, progress=False, on_method=on_method)
        if not self.path.strip():
            raise ToolkitError(f"enter the path of a program: {PATH_HINT}")
        where = Path(self.path.strip()).expanduser()
        if where.is_file() and where.name != "manifest.json" and where.suffix.lower() not in (".pte", ".pt2"):
            raise ToolkitError(f"{str(where)!r} is not a program: expected {PATH_HINT}")
        # a dry run needs the model only: the .so and blob files need not be here
        return read_program_model(where) if self.dry_run else open_program(where)

    def analysis_device(self, program: "Program") -> str:
        """Where a dry run places the methods: the chosen device when it is of the kind the
        program was built for, else that kind (a CUDA program is predicted on cuda, even on a CPU)."""
        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        built = "cuda" if program.device == "cuda" else "cpu"
        return self.device if kind == built else built

    def _load_hint(self, program: "Program", e: BaseException | None = None) -> str:
        """The dry-run suggestion when the program cannot be loaded on this machine."""
        if isinstance(e, IncompatibleProgramError):
            return DRY_RUN_HINT
        if (program.device == "cuda" or self.device.startswith("cuda")) and not _cuda_available():
            return DRY_RUN_HINT
        return ""

    def _is_pte(self) -> bool:
        return self.program_from == "path" and Path(self.path.strip()).suffix.lower() == ".pte"

    @property
    def program_label(self) -> str:
        """What the results on screen are called (:meth:`label_of` their program and inputs)."""
        if self.session is None:
            return ""
        return self.label_of(self.session.program, self.shown_inputs)

    @staticmethod
    def label_of(program: "Program", inputs: tuple | None) -> str:
        """What a program opened with ``inputs`` is called: its name, or, for one read from a file
        (a ``.pte`` or ``.pt2``, whose programs are all called alike, "prog"), its folder's name."""
        where = Path(inputs[1]) if inputs and inputs[0] == "path" else None
        if where is not None and where.suffix.lower() in (".pte", ".pt2") and where.resolve().parent.name:
            return where.resolve().parent.name
        return program.name

    def _constants_progress(self, phase: str, span: tuple[float, float], head: str) -> Callable[[int, int, str], None]:
        """The loader's ``on_progress``: the bar moved over ``span`` as the constants are done, at
        least :data:`PROGRESS_STEP` at a time or when a method begins; the status says which method
        and how many constants."""
        start, end = max(span[0], self.progress), span[1]
        last = [-1.0, None]

        def on_progress(done: int, total: int, method: str) -> None:
            fraction = done / total if total else 1.0
            if fraction - last[0] < PROGRESS_STEP and method == last[1] and done < total:
                return
            last[:] = fraction, method
            self._step(
                phase, start + (end - start) * fraction, f"{head}: method {method!r}, {done:,} of {total:,} constants"
            )

        return on_progress

    def _open_step(self) -> "Program | None":
        """The open step of a load, with its progress; None (and :attr:`error`) on failure."""
        self._step(
            "open",
            0.05,
            f"opening sample {self.sample!r} (a cold cache compiles every method first)"
            if self.program_from == "sample"
            else f"{'reading' if self.dry_run else 'opening'} {self.path!r}",
        )
        try:
            return self.open_program()
        except Exception as e:  # noqa: BLE001 - shown in the widget
            self._fail("could not open the program", e)
            return None

    def _loaded_session(self, program: "Program") -> "Session | None":
        """Load, verify (the verdict) and, when a method ran wrong, blame; None (and :attr:`error`) on failure."""
        from toolkit.engine.session import load_program

        notice = native_code_notice(program)
        head = f"loading {self.label_of(program, self.inputs())!r} under {self.policy!r} on {self.device}"
        self._step("load", LOAD_SPAN[0], head + (f" ({notice})" if notice else ""))
        try:
            if self.device.startswith("cuda") and not _cuda_available():
                raise ToolkitError(NO_CUDA)
            session = (self._load or load_program)(
                program, self.policy, device=self.device, on_progress=self._constants_progress("load", LOAD_SPAN, head)
            )
        except Exception as e:  # noqa: BLE001
            hint = self._load_hint(program, e)
            if hint and self._is_pte():  # an ExecuTorch file cannot be rebuilt here: say only what can be done
                e = type(e)(_REBUILD.sub("", str(e)))
            self._fail("could not load the program", e, hint=hint if str(e) != NO_CUDA else "")
            return None
        self._step("verify", 0.75, "running every method and sequence against its eager reference")
        try:
            wrong = session.verdict().wrong_methods
        except Exception as e:  # noqa: BLE001
            session.close()
            self._fail("could not verify the program", e)
            return None
        if wrong:
            self._step(
                "blame",
                0.85,
                f"finding the culprits of {', '.join(wrong)}: each constant that runs on "
                f"other data swapped for the method's own copy, the method re-run",
            )
            try:
                session.blame()
            except Exception as e:  # noqa: BLE001 - the load and its verdict still stand
                self.blame_note = f"blame could not run: {_one_line(e)}"
        return session

    def _predicted_session(self, program: "Program") -> "Session | None":
        from toolkit.workflows.dry_run import run_analysis

        device = self.analysis_device(program)
        head = f"dry run of {self.label_of(program, self.inputs())!r} under {self.policy!r} on {device}"
        self._step(
            "analyze", max(DRY_RUN_SPAN[0], self.progress), f"{head}: predicting every decision (nothing is loaded)"
        )
        try:
            return run_analysis(
                program,
                self.policy,
                device=device,
                on_progress=self._constants_progress(
                    "analyze", DRY_RUN_SPAN, head + ", predicting (nothing is loaded)"
                ),
            ).session
        except Exception as e:  # noqa: BLE001
            self._fail("could not analyze the program", e)
            return None

    def load(self) -> bool:
        """Open or build the program, load it under the policy and take its verdict (verified,
        and blamed when a method ran wrong; a dry run: predicted), build the report.  True on
        success (a refused load is a result too: True, outcome "refused" or "failed"); on
        failure :attr:`error` says why and the previous results stay, marked stale."""
        if not self._begin(loading=True):
            return False
        target = self.inputs()
        self.blame_note = ""
        try:
            program = self._open_step()
            moved = ""
            if program is not None and self.dry_run and self.analysis_device(program) != self.device:
                # the device menu says where the prediction is for: the kind the program was built for
                self.device = self.analysis_device(program)
                target, moved = (
                    self.inputs(),
                    (
                        f"device set to {self.device}: a dry run predicts the load on "
                        f"the device the program was built for"
                    ),
                )
            session = (
                None
                if program is None
                else (self._predicted_session(program) if self.dry_run else self._loaded_session(program))
            )
            if session is None:
                return False
            self._step("report", max(self.progress, DRY_RUN_SPAN[1]), "the verdict and the collision report")
            try:
                verdict = session.verdict()
                verification = dry_run_verification(session) if verdict.predicted else session.verify()
                report = collision_report(session, verification)
            except Exception as e:  # noqa: BLE001
                session.close()
                return self._fail("could not verify the program", e)
            self._pngs = (session, self._draw(session, verdict, self.label_of(program, target)))
            self._show(program, session, verification, verdict, report, target)
            notes = [self.blame_note, moved]
            if verdict.failed_stage is not None and not verdict.predicted:
                notes.append(self._load_hint(program))
            with self.hold_trait_notifications():
                self.outcome = verdict.outcome
                failed = verdict.outcome in (MethodOutcome.FAILED, MethodOutcome.REFUSED)
                self._step(
                    "failed" if failed else "done",
                    1.0,
                    (PREDICTION if verdict.predicted else "")
                    + verdict.headline(name=self.program_label)
                    + "".join(f" ({n})" for n in notes if n),
                )
            return True
        finally:
            self._end()

    def _show(self, program, session, verification, verdict, report, inputs) -> None:
        """Put one load's results on screen (one notification each), the first finding selected."""
        old = self.session
        with self.hold_trait_notifications():
            if self.comparison is not None and (old is None or old.program.root != program.root):
                self.comparison = None
            self.program, self.verification, self.verdict, self.report = program, verification, verdict, report
            self.shown_inputs, self.loading = inputs, False
            self.filter_method = self.filter_decision = self.filter_reason = ALL
            self.exported, self.export_ok, self.export_message = None, None, ""  # of the previous load
            self.rows_exported, self.rows_export_file = "", None
            self.session = session
            self.rows = self._filtered()
            self.selected = self._first_of_interest()
        if old is not None and old is not session:
            old.close()

    def _first_of_interest(self) -> tuple[str, str] | None:
        """Where the Decisions tab starts: the first culprit, else the first constant that runs on
        other data, else the first collision, else the first row."""
        keys = list(zip(self.rows["method"], self.rows["name"]))
        present = set(keys)
        for c in sorted(self.verdict.constants, key=lambda c: c.blame is not BlameStatus.CULPRIT):
            if (c.method, c.name) in present:
                return (c.method, c.name)
        hits = [k for k, lookup in zip(keys, self.rows["lookup"]) if lookup == Lookup.HIT]
        return (hits or keys or [None])[0]

    def compare(self) -> bool:
        """Load and verify the current program under every policy (:func:`toolkit.workflows.compare.compare_policies`);
        in a dry run, predict each (:func:`toolkit.workflows.compare.predict_policies`: nothing is loaded)."""
        if not self._begin():
            return False
        try:
            from toolkit.workflows.compare import compare_policies, predict_policies

            try:
                shown = self.program is not None
                program = self.program or self.open_program()
            except Exception as e:  # noqa: BLE001
                return self._fail("could not open the program", e)
            label = self.label_of(program, self.shown_inputs if shown else self.inputs())
            dry = self.dry_run

            def on_policy(pol: str, i: int, n: int) -> None:
                self._step(
                    "compare",
                    (i + 0.5) / (n + 1),
                    f"dry run under {pol!r} ({i + 1} of {n}): nothing is loaded"
                    if dry
                    else f"loading and verifying under {pol!r} ({i + 1} of {n})",
                )

            try:
                result = (
                    predict_policies(program, device=self.analysis_device(program), on_policy=on_policy)
                    if dry
                    else compare_policies(program, device=self.device, on_policy=on_policy)
                )
            except Exception as e:  # noqa: BLE001
                return self._fail("could not dry-run the policies" if dry else "could not compare policies", e)
            by: dict[str, list[str]] = {}
            for name, v in result.verdicts().items():
                by.setdefault(v.outcome.value, []).append(name)
            chosen = result.verdicts().get(self.policy)
            with self.hold_trait_notifications():
                # the bar says what the chosen policy's verdict is, not that the comparison ran
                self.program, self.comparison = program, result
                self.outcome = chosen.outcome if chosen is not None else MethodOutcome.OK
                self._step(
                    "done",
                    1.0,
                    f"compared {len(result.frame)} policies on {label!r}"
                    + (" as a dry run (a prediction: nothing was loaded or run)" if dry else "")
                    + ": "
                    + "; ".join(f"{o} under {', '.join(names)}" for o, names in by.items())
                    + (f"; the chosen {self.policy!r}: {chosen.outcome.value}" if chosen is not None else ""),
                )
            return True
        finally:
            self._end()

    @property
    def comparison_banner(self) -> str:
        """The sentence saying the comparison is a prediction, when it is a dry run; '' otherwise."""
        if self.comparison is None or not any(v.predicted for v in self.comparison.verdicts().values()):
            return ""
        return (
            "DRY RUN of every policy: a prediction, nothing was loaded or run. Each row is its dry run's "
            "verdict: wrong_methods would run on another constant's data."
        )

    # ------------------------------------------------------------------ browsing
    def filter_options(self) -> dict[str, list[str]]:
        if self.session is None:
            return {key: [] for key in FILTERS}
        d = self.session.decisions
        return {
            "method": [m.name for m in self.session.program.methods if m.name in set(d["method"])],
            "decision": sorted({cell_text(x) for x in d["decision"]}),
            "reason": sorted({cell_text(x) for x in d["reason_code"]}),
        }

    @property
    def filtered(self) -> bool:
        """Whether a filter is set (the Decisions tab's count says "(filtered)")."""
        return any((self.filter_method, self.filter_decision, self.filter_reason, self.culprits_only))

    @property
    def total_decisions(self) -> int:
        return len(self.session.decisions) if self.session is not None else 0

    def set_filters(
        self,
        *,
        method: str | None = None,
        decision: str | None = None,
        reason: str | None = None,
        culprits_only: bool | None = None,
    ) -> None:
        """Set filters (:data:`ALL`: none; ``culprits_only``: only the constants that run on other
        data); the rows follow, and the selection stays among them."""
        opts, chosen = self.filter_options(), {"method": method, "decision": decision, "reason": reason}
        for key, value in chosen.items():
            if value not in (None, ALL, *opts[key]):
                raise InvalidChoiceError(f"no {key} {value!r} in this load; choose one of {opts[key]}")
        with self.hold_trait_notifications():
            for key, value in chosen.items():
                if value is not None:
                    setattr(self, f"filter_{key}", value)
            if culprits_only is not None:
                self.culprits_only = bool(culprits_only)
            self.rows = self._filtered()
            keys = list(zip(self.rows["method"], self.rows["name"]))
            if self.selected not in keys:
                self.selected = keys[0] if keys else None

    def _filtered(self) -> pd.DataFrame:
        """The decisions under the filters (a new frame), with ``same_content`` (see ``content_check``),
        in :func:`interest_rank` order (culprits first), load order within a rank."""
        if self.session is None:
            return pd.DataFrame(columns=list(DECISION_TABLE_COLUMNS))
        d = self.session.decisions
        for column, value in (
            ("method", self.filter_method),
            ("decision", self.filter_decision),
            ("reason_code", self.filter_reason),
        ):
            if value:
                d = d[d[column].map(cell_text) == value]
        rank = interest_rank(d, self.verdict)
        if self.culprits_only:
            d, rank = d[rank <= RUNS_ON_OTHER_DATA], rank[rank <= RUNS_ON_OTHER_DATA]
        order = np.argsort(rank.to_numpy(), kind="stable")
        return content_check(d.iloc[order].reset_index(drop=True))

    def select(self, method: str | None, name: str | None) -> None:
        if method is not None and name is not None:
            d = self.session.decisions if self.session is not None else None
            if d is None or not ((d["method"] == method) & (d["name"] == name)).any():
                raise ValueError(f"no decided constant {name!r} in method {method!r}")
        self.selected = None if method is None or name is None else (method, name)

    def selected_decision(self) -> dict[str, Any] | None:
        """The selected constant's decision, with ``same_content``, enums as their values."""
        if self.selected is None or self.session is None:
            return None
        d = self.session.decisions
        row = content_check(d[(d["method"] == self.selected[0]) & (d["name"] == self.selected[1])])
        return {k: (v.value if hasattr(v, "value") else v) for k, v in row.iloc[0].to_dict().items()}

    def selected_finding(self) -> ConstantFinding | None:
        return finding_of(self.verdict, *self.selected) if self.selected is not None else None

    def content_verdict(self) -> tuple[str, str]:
        """(kind, sentence) on the selected constant.  One that runs on other data: its finding in
        the verdict, kind blame's status (``"culprit"``, ``"harmless"``, ``"not tested"``); else
        the content check: ``"caught"`` (differs, not shared), ``"same"``, or ``"none"`` (no cache entry)."""
        d = self.selected_decision()
        if d is None:
            return "none", ""
        f = self.selected_finding()
        if f is not None:
            runs_on = f"{f.shared_from}'s tensor" if f.shared_from else "other data than its own"
            blame = f"{f.blame.value}: {f.blame_note}" if f.blame_note else f.blame.value
            return f.blame.value, (
                f"{f.problem.value if f.problem else 'no known difference'}: {d['method']} runs "
                f"on {runs_on} ({f.evidence}); blame: {blame}"
            )
        same, owner = d.get("same_content"), cell_text(d.get("cached_method")) or "another method"
        if same is None or same is pd.NA:
            return "none", "no cache entry to compare with: this constant was not found in the cache"
        if not same:
            return "caught", (
                f"content differs: {cell_text(d['decision'])}, so the difference was caught; "
                f"{d['method']} keeps its own bytes (the content digests below disagree)"
            )
        return "same", f"same content: this constant and {owner}'s cached tensor have equal content digests"

    def selected_comparison(self) -> pd.DataFrame:
        """Field-by-field comparison (cached vs new) of the selected constant; empty if none was made."""
        cols = ["field", "cached", "new", "equal"]
        if self.selected is None or self.session is None:
            return pd.DataFrame(columns=cols)
        c = self.session.comparisons
        out = c[(c["method"] == self.selected[0]) & (c["name"] == self.selected[1])][cols].copy()
        out["field"] = out["field"].map(cell_text)
        return out.reset_index(drop=True)

    # ------------------------------------------------------------------ figures / export
    @staticmethod
    def _figure(name: str, session: "Session", verdict: Verdict, label: str):
        """One of :data:`SESSION_FIGURES` of a load (matplotlib), its program called ``label``."""
        from toolkit import plots

        if name == "collision matrix":
            return plots.collision_matrix(session, wrong_methods=verdict.wrong_methods, name=label)
        if name == "timeline":
            return plots.event_timeline(session)
        return plots.memory_by_policy(session)

    def _draw(self, session: "Session", verdict: Verdict, label: str) -> dict[str, bytes]:
        """The PNGs of a load's figures, the bar moving over :data:`DRAW_SPAN` as each is drawn
        (a large program's take seconds); {} when one cannot be drawn (the view says why)."""
        from toolkit.plots import figure_png

        pngs: dict[str, bytes] = {}
        try:
            for i, name in enumerate(SESSION_FIGURES):
                self._step(
                    "draw",
                    DRAW_SPAN[0] + (DRAW_SPAN[1] - DRAW_SPAN[0]) * i / len(SESSION_FIGURES),
                    f"drawing the {name} ({i + 1} of {len(SESSION_FIGURES)})",
                )
                pngs[name] = figure_png(self._figure(name, session, verdict, label))
        except Exception:  # noqa: BLE001 - drawn again by the view, which shows the error
            return {}
        return pngs

    def session_pngs(self) -> dict[str, bytes]:
        """The PNGs of :data:`SESSION_FIGURES` of the load on screen (drawn once, by the load)."""
        from toolkit.plots import figure_png

        if self.session is None:
            return {}
        held, pngs = self._pngs
        if held is not self.session or set(pngs) != set(SESSION_FIGURES):
            pngs = {name: figure_png(fig) for name, fig in self.figures(comparison=False).items()}
            self._pngs = (self.session, pngs)
        return pngs

    def figures(self, *, session: bool = True, comparison: bool = True) -> dict[str, Any]:
        """Matplotlib figures of the results on screen (of the load, of the comparison), by name."""
        from toolkit import plots

        figs: dict[str, Any] = {}
        if session and self.session is not None:
            for name in SESSION_FIGURES:
                figs[name] = self._figure(name, self.session, self.verdict, self.program_label)
        if comparison and self.comparison is not None and self.program is not None:
            floor = plots.minimum_device_bytes(self.program)
            label = self.program_label or self.program.name
            figs["policy trade-off"] = plots.policy_tradeoff(
                self.comparison, minimum=floor, title=f"{label}: correctness vs memory"
            )
            title = f"{label}: device memory per method and policy"
            figs["memory by policy"] = plots.memory_by_policy(self.comparison.memory(), minimum=floor, title=title)
        return figs

    def default_export_name(self) -> str:
        """A plain file name for the report of the current load: program and policy names
        sanitised (:func:`safe_file_name`), never a path."""
        if self.session is None:
            return "collision_report.csv"
        dry = "-dry-run" if self.is_dry_run else ""
        return (
            f"{safe_file_name(self.program_label)}-{safe_file_name(self.session.policy.name.value)}{dry}{EXPORT_SUFFIX}"
        )

    def default_export_path(self, name: str | None = None) -> str:
        """Where the report goes when no path is given: :meth:`default_export_name` (or ``name``) in
        :attr:`export_dir`, numbered (``-2``, ``-3`` ...) past files that already exist."""
        first = self.export_dir / (name or self.default_export_name())
        if not first.exists():
            return str(first)
        suffix = first.suffix
        stem = first.name[: -len(suffix)] if suffix else first.name
        for i in range(2, 10_000):
            candidate = self.export_dir / f"{stem}-{i}{suffix}"
            if not candidate.exists():
                return str(candidate)
        raise ToolkitError(f"{self.export_dir}: too many reports named {stem}-N{suffix}")

    def export_rows(self, path: str | Path | None = None, *, overwrite: bool = False, excel: bool = False) -> bool:
        """Write the collision report's rows of the decisions the Decisions tab shows (:attr:`rows`:
        after its filters, in its order) as CSV, or as an Excel workbook with ``excel`` (one sheet,
        :func:`toolkit.reports.collision.write_xlsx`), through the report's writers (text cells neutralised);
        default name ``<program>-<policy>-decisions[-filtered].csv`` (``.xlsx``).  The outcome is in
        :attr:`rows_exported` and :attr:`rows_export_file`, or :attr:`error` (scope ``"rows"``)."""
        self.clear_error()
        if self.report is None:
            return self._fail("nothing to export", ToolkitError("load a program first"), scope="rows")
        keys = pd.DataFrame({"method": self.rows["method"].tolist(), "name": self.rows["name"].tolist()})
        frame = keys.merge(self.report.frame, on=["method", "name"], how="inner", validate="one_to_many")
        name = self.default_export_name().replace(
            EXPORT_SUFFIX, "-decisions" + ("-filtered" if self.filtered else "") + (".xlsx" if excel else ".csv")
        )
        target = self._write(
            path, overwrite, frame, self.default_export_path(name) if not path else None, "rows", excel=excel
        )
        if target is None:
            return False
        with self.hold_trait_notifications():
            self.rows_export_file = target
            self.rows_exported = f"wrote {_plural(len(frame), 'row')} to {target}"
        return True

    def export_csv(self, path: str | Path | None = None, *, overwrite: bool = False) -> bool:
        """Write the collision report of the current load; False (and :attr:`error`) on failure.

        ``path``: a file name or path (relative ones are taken from :attr:`export_dir`); none:
        :meth:`default_export_path`.  An existing file is replaced only with ``overwrite``.
        The outcome, with the absolute path written, is in :attr:`export_message`."""
        self.clear_error()
        if self.report is None:
            return self._fail("nothing to export", ToolkitError("load a program first"), scope="export")
        target = self._write(path, overwrite, self.report.frame, None, "export")
        if target is None:
            return False
        dry = f" (a dry run: predicted decisions, verification {DRY_RUN_REASON!r})" if self.is_dry_run else ""
        with self.hold_trait_notifications():
            self.exported, self.export_ok = target, True
            self.export_message = f"wrote {len(self.report.frame)} rows to {target}{dry}"
        return True

    def _write(
        self,
        path: str | Path | None,
        overwrite: bool,
        frame: pd.DataFrame,
        default: str | None,
        scope: str,
        *,
        excel: bool = False,
    ) -> Path | None:
        """Write report rows to ``path`` (relative: in :attr:`export_dir`; none: ``default`` or
        :meth:`default_export_path`), as CSV or (``excel``) a workbook; the absolute path written,
        None (and :attr:`error`) on failure."""
        from toolkit.reports.collision import write_csv, write_xlsx

        try:
            target = Path(path).expanduser() if path not in (None, "") else Path(default or self.default_export_path())
            if not target.is_absolute():
                target = self.export_dir / target
            target = Path(os.path.abspath(target))
        except Exception as e:  # noqa: BLE001
            self._fail("could not choose the file", e, scope=scope)
            return None
        try:
            if target.is_dir():
                raise ToolkitError(f"{str(target)!r} is a folder: give a file name")
            if not target.parent.is_dir():
                raise ToolkitError(f"folder {str(target.parent)!r} does not exist")
            if target.exists() and not overwrite:
                raise ToolkitError(f"{str(target)!r} already exists: choose another name, or allow overwriting")
            # "x": never replace a file that appeared since the check above, unless asked
            if excel:
                with open(target, "wb" if overwrite else "xb") as fh:
                    write_xlsx(frame, fh)
            else:
                with open(target, "w" if overwrite else "x", encoding="utf-8", newline="") as fh:
                    write_csv(frame, fh)
        except Exception as e:  # noqa: BLE001
            self._fail(f"could not write {str(target)!r}", e, scope=scope)
            return None
        return target

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = None


# ====================================================================== view


def _device_options(current: str) -> list[tuple[str, str]]:
    """The device menu: cpu and cuda always (a dry run predicts a CUDA load on any machine), the
    current choice too; cuda says so when this machine has none."""
    cuda = "cuda" if _cuda_available() else "cuda (none here: dry run only)"
    return [("cpu", "cpu"), (cuda, "cuda")] + ([(current, current)] if current not in ("cpu", "cuda") else [])


# The grid's JavaScript (DataTables' drawCallback, once per table): a row selected, from Python
# (a matrix click, the constant menu) or by a click, is brought into view: its page shown, the
# grid's own box scrolled to it (never the notebook around it).
SCROLL_TO_SELECTION_JS = """function () {
  const table = this.api().table().node();
  if (table.dataset.csScroll) return;  // once per table element: it outlives each re-created DataTable
  table.dataset.csScroll = '1';
  this.api().on('select', function (e, api, type, indexes) {  // bound on the table element itself
    if (type !== 'row' || !indexes.length) return;
    // after the select event (never inside it: itables syncs the selection there), with the event's
    // own API (an earlier one is destroyed by an update)
    setTimeout(function () { try {
      const at = api.rows({order: 'applied', search: 'applied'}).indexes().toArray().indexOf(indexes[0]);
      const len = api.page.len();
      if (at >= 0 && len > 0 && Math.floor(at / len) !== api.page()) api.page(Math.floor(at / len)).draw(false);
      const row = api.row(indexes[0]).node(), box = row && row.closest('.dt-layout-cell');
      if (!box) return;
      const head = table.tHead ? table.tHead.offsetHeight : 0;
      const top = row.getBoundingClientRect().top - box.getBoundingClientRect().top + box.scrollTop;
      if (top - head < box.scrollTop || top + row.offsetHeight > box.scrollTop + box.clientHeight)
        box.scrollTop = Math.max(0, top - head - 4);
    } catch (err) { console.warn('constshare grid: could not scroll to the selection', err); } }, 0);
  });
}"""


def _scroll_to_selection():
    from itables import JavascriptFunction

    return JavascriptFunction(SCROLL_TO_SELECTION_JS)


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


def _wrong_colour(text: str) -> str:
    return WRONG_COLOUR if text else ""


# the Policies table: the outcome by the verdict, the methods a policy gets wrong or cannot run red
COMPARISON_COLOURS = {
    "outcome": outcome_colour,
    "wrong_methods": _wrong_colour,
    "not_runnable": _wrong_colour,
    "error": _wrong_colour,
}


def comparison_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The policy comparison as shown: storage keys and blob names in errors cut to their first
    characters (a 64-hex key is no message)."""
    if "error" not in frame.columns:
        return frame
    return frame.assign(error=[shorten_digests(cell_text(e)) for e in frame["error"]])


def _table_html(frame: pd.DataFrame, columns, empty: str, **options: Any) -> str:
    return html_table(
        frame, columns, max_rows=MAX_TABLE_ROWS, empty=empty, more_hint="narrow the filters to see them", **options
    )


def _banner(text: str) -> str:
    """The dry-run banner: its first sentence bold, the rest plain; '' for no text."""
    if not text:
        return ""
    head, rest = (BANNER_HEAD, text[len(BANNER_HEAD) :]) if text.startswith(BANNER_HEAD) else ("", text)
    return f"<div class='constshare-dry-banner'><b>{html.escape(head)}</b>{html.escape(rest)}</div>"


def _close_widget(obj) -> None:
    """Close a widget and its layout and style (widgets of their own, with their own comms)."""
    for part in (getattr(obj, "layout", None), getattr(obj, "style", None)):
        if part is not None and hasattr(part, "close"):
            part.close()
    obj.close()


def _download_link(target: Path) -> str:
    """`` · download`` as a link holding the file, for a small one; a large one is only named (its
    bytes are not put in the page: it is on disk, open it from the file browser)."""
    size = target.stat().st_size
    if size > MAX_INLINE_EXPORT:
        return " · too large to put in the page: open it from the file browser"
    data = base64.b64encode(target.read_bytes()).decode("ascii")
    mime = XLSX_MIME if target.suffix.lower() == ".xlsx" else "text/csv"
    return (
        f' · <a class="constshare-download" download="{html.escape(target.name, quote=True)}" '
        f'href="data:{mime};base64,{data}">download</a>'
    )


def _box(cls: str, text: str) -> str:
    """A line of (escaped) text in a styled box; '' for no text."""
    return f"<div class='{cls}'>{html.escape(text)}</div>" if text else ""


# what decides first (the decision, whether the content differs, why), then the identifiers
GRID_COLUMNS = ("method", "constant", "decision", "same content", "reason", "bytes", "shared from")
BLAME_GRID_COLUMN = "blame"  # shown once blame ran: culprit (what it breaks), harmless, not tested; why on hover
FINDING_COLOURS = {
    BlameStatus.CULPRIT: WRONG_COLOUR,
    BlameStatus.NOT_TESTED: WRONG_COLOUR,
    BlameStatus.HARMLESS: CAUGHT_COLOUR,
}  # a constant's detail, by blame's status
BLAME_CLASSES = {BlameStatus.CULPRIT: "cs-culprit", BlameStatus.HARMLESS: "cs-caught", BlameStatus.NOT_TESTED: ""}


def _span(text: str = "", cls: str = "", title: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    if title:
        attrs += f' title="{html.escape(title, quote=True)}"'
    return f"<span{attrs}>{html.escape(text, quote=True)}</span>"


def _constant_cell(r: dict[str, Any]) -> str:
    """A constant as users know it, its FQN, with the program's internal name beside it (smaller),
    when the two differ; wrapped at its dots rather than cut."""
    name, fqn = cell_text(r.get("name")), cell_text(r.get("fqn"))
    if not fqn or fqn == name:
        return _span(name, "cs-wrap cs-fqn")
    return _span(fqn.replace(".", ".\u200b"), "cs-wrap cs-fqn", fqn) + _span(
        _breakable(name), "cs-wrap cs-internal", f"internal name: {name}"
    )


def _breakable(text: str) -> str:
    """``text`` with a zero-width space after each ``_``, ``/`` and ``.``: a long identifier wraps there."""
    return re.sub(r"([_/.])", "\\1\u200b", text)


def grid_frame(rows: pd.DataFrame, verdict: Verdict | None = None) -> pd.DataFrame:
    """The Decisions grid's cells: escaped HTML, one row per decision (same order as ``rows``),
    decision coloured by class; a constant that runs on other data (its ``data_problem``, or a
    culprit of ``verdict``) marked red with its problem on hover, unless blame found it harmless;
    the reason on hover over its code; the constant by its FQN, its internal name beside.  Once
    blame ran (a finding of ``verdict`` not "not tested"), a "blame" column gives each finding's
    status, why on hover."""
    found: dict[tuple[str, str], ConstantFinding] = {}
    for c in verdict.constants if verdict is not None else ():
        if (c.method, c.name) not in found or c.blame is BlameStatus.CULPRIT:
            found[(c.method, c.name)] = c
    with_blame = any(c.blame is not BlameStatus.NOT_TESTED for c in found.values())
    wanted = [
        c
        for c in (
            "method",
            "name",
            "fqn",
            "decision",
            "same_content",
            "data_problem",
            "reason_code",
            "reason",
            "shared_from",
            "nbytes",
        )
        if c in rows.columns
    ]
    records = rows[wanted].to_dict("records") if len(rows) else []  # only what the cells show
    out = []
    for r, problem in zip(records, culprit_mask(rows).tolist() if len(rows) else []):
        f = found.get((cell_text(r.get("method")), cell_text(r.get("name"))))
        bad = (problem or f is not None and f.blame is BlameStatus.CULPRIT) and not (
            f is not None and f.blame is BlameStatus.HARMLESS
        )
        decision, same = cell_text(r.get("decision")), r.get("same_content")
        same_text = "" if same is None or same is pd.NA else ("same" if bool(same) else "DIFFERS")
        cls = "cs-culprit" if bad else (f"cs-d-{decision}" if decision in DECISION_COLOURS else "")
        same_cls = "cs-culprit" if bad else ("cs-caught" if same_text == "DIFFERS" else "")
        nbytes = r.get("nbytes")
        out.append(
            {
                "method": _span(cell_text(r.get("method"))),
                "constant": _constant_cell(r),
                "decision": _span(
                    decision + (" \u2717" if bad else ""),
                    f"cs-tag {cls}",
                    f"runs on other data than its own: {cell_text(r.get('data_problem')) or 'a culprit'}"
                    + (f" ({f.evidence})" if f is not None else "")
                    if bad
                    else "",
                ),
                "same content": _span(same_text, f"cs-tag {same_cls}" if same_cls else ""),
                "reason": _span(cell_text(r.get("reason_code")), "cs-reason", cell_text(r.get("reason"))),
                "shared from": _span(_breakable(cell_text(r.get("shared_from"))), "cs-wrap"),
                "bytes": _span(
                    format_bytes(nbytes) if nbytes not in (None, "") else "",
                    title=f"{int(nbytes):,} bytes" if isinstance(nbytes, (int, float)) and nbytes == nbytes else "",
                ),
            }
        )
        if with_blame:
            out[-1][BLAME_GRID_COLUMN] = (
                _span()
                if f is None
                else _span(
                    f"\u2717 culprit: {f.blame_note}" if f.blame is BlameStatus.CULPRIT else f.blame.value,
                    f"cs-tag cs-wrap {BLAME_CLASSES[f.blame]}",
                    f"{f.blame_note or f.blame.value}: {f.evidence}",
                )
            )
    columns = list(GRID_COLUMNS)
    if with_blame:
        columns.insert(columns.index("same content") + 1, BLAME_GRID_COLUMN)
    return pd.DataFrame(out, columns=columns)


_CSS = (
    """<style>
.constshare-explorer table { border-collapse: collapse; font-size: 12px; }
.constshare-explorer th, .constshare-explorer td { border: 1px solid #ccc; padding: 2px 6px; text-align: left;
  line-height: 1.4; }
.constshare-explorer th { background: #f3f3f3; }
.constshare-explorer .constshare-grid table.dataTable td, .constshare-explorer .constshare-grid table.dataTable th {
  border: none; border-bottom: 1px solid #e4e4e4; white-space: nowrap; text-align: left; }
.constshare-explorer .constshare-grid table.dataTable tbody tr { cursor: pointer; }
.constshare-explorer .constshare-grid table.dataTable > tbody > tr.selected > * {
  box-shadow: inset 0 0 0 9999px #e3edfb !important; color: #222 !important; }
.constshare-explorer .constshare-grid table.dataTable > tbody > tr.selected > td:first-child {
  box-shadow: inset 4px 0 0 #1a73e8, inset 0 0 0 9999px #e3edfb !important; }
.constshare-explorer .constshare-grid table.dataTable > tbody > tr.selected a { color: #0b3d91 !important; }
.constshare-explorer .cs-wrap { display: inline-block; white-space: normal; overflow-wrap: break-word;
  max-width: 30em; vertical-align: top; }
.constshare-explorer .cs-internal { display: block; color: #666; font-size: 11px; max-width: 26em; }
.constshare-explorer .constshare-grid table.dataTable thead th { white-space: normal; }
.constshare-explorer .constshare-grid .cs-tag.cs-wrap { display: inline-block; }
.constshare-explorer .cs-fqn { max-width: 30em; }
.constshare-explorer .constshare-grid { max-width: 100%; }
.constshare-explorer .constshare-grid .dt-layout-table > .dt-layout-cell {
  display: block; max-height: """
    + GRID_HEIGHT
    + """; overflow: auto; }
.constshare-explorer .constshare-grid table.dataTable thead th {
  position: sticky; top: 0; z-index: 1; background: #f3f3f3; }
.constshare-error { color: #a00; background: #fdecea; border: 1px solid #f5c2c0; padding: 4px 8px; }
.constshare-ok { color: #274e13; }
.constshare-stale-banner { color: #7f6000; background: #fff8e1; border: 1px solid #f1c232; padding: 4px 8px; }
.constshare-dry-banner { color: #0b3d91; background: #e8f0fe; border: 1px solid #8ab4f8; padding: 4px 8px; }
.constshare-stale { opacity: 0.45; filter: grayscale(60%); }
.constshare-verdict { padding: 4px 8px; margin: 4px 0; border-radius: 3px; overflow-wrap: anywhere; }
.constshare-explorer .constshare-detail-panel { overflow-x: auto; }
.constshare-verdict-culprit { background: #f4cccc; color: #990000; font-weight: bold; }
.constshare-verdict-not-tested { background: #f4cccc; color: #990000; }
.constshare-verdict-harmless, .constshare-verdict-caught { background: #fff2cc; }
.constshare-verdict-same { background: #d9ead3; }
.constshare-verdict-none { background: #eeeeee; }
.cs-tag { padding: 0 5px; border-radius: 3px; }
.cs-culprit { background: #f4cccc; color: #990000; font-weight: bold; }
.cs-caught { background: #fff2cc; }
.cs-reason { border-bottom: 1px dotted #999; }
"""
    + "".join(f".cs-d-{d} {{ background: {c}; }}\n" for d, c in DECISION_COLOURS.items())
    + "</style>"
)

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

        self.title = mk(w.HTML, value=_CSS + "<h3 style='margin:4px 0'>constshare explorer</h3>")
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
        self.policy = mk(w.Dropdown, "constshare-policy", options=list(POLICIES), description="policy")
        self.device = mk(
            w.Dropdown, "constshare-device", options=_device_options(s.device), value=s.device, description="device"
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
        ITable = _itable_class()
        self.grid = None
        if ITable is not None:
            self.grid = mk(ITable, "constshare-grid", df=grid_frame(s.rows), **self._grid_options())
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

    def _grid_options(self, total: int = 0, filtered: bool = False) -> dict[str, Any]:
        # No DataTables scrolling (it sizes its columns when first drawn, and the Decisions tab is
        # hidden then): the page of rows scrolls inside a box of GRID_HEIGHT (CSS above), header sticky.
        # The info line is the tab's one count: after the filters above and the grid's own search.
        return dict(
            allow_html=True,
            maxBytes=0,
            showIndex=False,
            classes="display compact nowrap",
            text_in_header_can_be_selected=False,
            paging=True,
            pageLength=50,
            lengthMenu=[25, 50, 100, 500],
            order=[],
            select={"style": "single", "items": "row"},
            # search first, and always there (itables hides its default layout on short tables)
            layout={"topStart": "search", "topEnd": "pageLength", "bottomStart": "info", "bottomEnd": "paging"},
            style="width: 100%; margin: 0",
            autoWidth=False,
            drawCallback=_scroll_to_selection(),
            language={
                "search": "search:",
                "emptyTable": "no decision matches the filters",
                "info": "rows _START_-_END_ · " + count_text("_TOTAL_", total, filtered),
                "infoEmpty": count_text(0, total, filtered),
                "infoFiltered": "" if filtered else "(filtered)",
            },
        )  # DataTables adds a space

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
            _close_widget(obj)
        self.state.close()

    # ------------------------------------------------------------------ events in
    def _guarded(self, fn, *args, **kw) -> None:
        try:
            fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - a bad choice becomes a message, not a traceback
            self.state._fail("invalid choice", e)

    def _device_choice(self, ch) -> None:
        if ch["new"] not in [v for _l, v in self.device.options]:
            self._set(self.device, options=_device_options(ch["new"]))
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
        """The Excel export of the rows shown: said first (a workbook of 10,000 rows takes seconds)."""
        self.export_rows_result.value = _box(
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
            self.state._fail("invalid export folder", e, scope="export")
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

    # ------------------------------------------------------------------ state out
    def _shown(self, name: str) -> Callable[[Any], None]:
        """The observer that re-renders panel ``name``: rendering never leaves a traceback wall."""

        def handler(_change) -> None:
            try:
                getattr(self, name)()
            except Exception as e:  # noqa: BLE001
                self.error.value = _box(
                    "constshare-error", f"could not display {name[len('_render_') :]}: {_one_line(e)}"
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
        self.stale_banner.value = _box("constshare-stale-banner", reason)
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
        colour = {"danger": "#a00", "warning": "#7f6000"}.get(style)
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
        self.dry_banner.value = _banner(s.banner)
        self.dry_banner.layout.display = None if s.banner else "none"
        self.summary.value = (
            _box("constshare-verdict", v.headline(name=s.program_label))
            + _box("constshare-findings", findings_summary(v))
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
            _close_widget(fig)

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
            self.decisions.value = _box(
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
                    **self._grid_options(total, filtered),
                )
            finally:
                self._updating = False
        else:  # no itables: the renderer's table, scrolling inside a bounded box
            self.decisions.value = (
                _box("constshare-findings", " · ".join(t for t in (self.count, head) if t))
                + f"<div style='max-height: {GRID_HEIGHT}; overflow: auto'>"
                + _table_html(rows, DECISION_TABLE_COLUMNS, "no decision matches the filters")
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
            + _box(f"constshare-verdict constshare-verdict-{kind.replace(' ', '-')}", sentence)
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
        self.comparison.value = _banner(s.comparison_banner) + _table_html(
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
            self.export_result.value = _box("constshare-error", s.export_message)
        else:
            target = s.exported
            self.export_result.value = (
                f"<div class='constshare-ok'>wrote <code>{html.escape(str(target))}</code> "
                f"({len(s.report.frame) if s.report is not None else 0:,} rows, {format_bytes(target.stat().st_size)})"
                f"{_download_link(target)}</div>"
            )

    def _render_rows_export(self) -> None:
        s = self.state
        if s.error and s.error_scope == "rows":
            self.export_rows_result.value = _box("constshare-error", s.error)
        elif s.rows_exported and s.rows_export_file is not None:
            self.export_rows_result.value = (
                f"<div class='constshare-ok'>{html.escape(s.rows_exported)}{_download_link(s.rows_export_file)}</div>"
            )
        else:
            self.export_rows_result.value = _box("constshare-ok", s.rows_exported)
