"""The explorer's model: a traitlets object holding the choices, the results on screen and the
progress of the running action, testable without a browser or a kernel.

Views observe its traits.  Its actions come from mixins, one concern each (:mod:`.loading`,
:mod:`.browsing`, :mod:`.figures`, :mod:`.exports`); none raises for a user error: each sets
:attr:`ExplorerState.error` and returns False.
"""

from __future__ import annotations

import os
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd
import traitlets

from toolkit.build.samples import DEFAULT_SAMPLE, build_sample, sample_names
from toolkit.core.errors import InvalidChoiceError, ToolkitError
from toolkit.core.policies import get_policy
from toolkit.core.verdict import Verdict
from toolkit.core.vocab import MethodOutcome, PolicyName, parse
from toolkit.display.text import markdown_html, markdown_text
from toolkit.explorer.browsing import ALL, DECISION_TABLE_COLUMNS, BrowseMixin
from toolkit.explorer.devices import DEVICE_RE
from toolkit.explorer.exports import EXPORT_SCOPES, ExportMixin
from toolkit.explorer.figures import FigureMixin
from toolkit.explorer.loading import DRY_RUN_REASON, LoadMixin
from toolkit.explorer.text import one_line
from toolkit.reports.collision import CollisionReport

if TYPE_CHECKING:
    from toolkit.core.model import Program
    from toolkit.engine.session import Session

PROGRAM_FROM = ("sample", "path")  # where the explorer takes its program from
INPUTS = ("program_from", "sample", "path", "policy", "device", "dry_run")
BANNER_HEAD = "DRY RUN: a prediction, not a load."


class ExplorerState(LoadMixin, BrowseMixin, FigureMixin, ExportMixin, traitlets.HasTraits):
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

    def fail(self, what: str, e: BaseException, *, scope: str = "", hint: str = "") -> bool:
        """Record a failure: :attr:`error` is the one sentence (what could be done first, when
        there is a ``hint``), the status line says only ``what`` failed; a traceback is kept
        (:attr:`error_detail`) for unexpected errors only, never for a :class:`ToolkitError`."""
        error = f"{what}: " + (f"{hint} ({one_line(e)})" if hint else one_line(e))
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

    # ------------------------------------------------------------------ names
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

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = None
