"""The public session: a load (:class:`toolkit.engine.loader.ProgramLoad`) with its checks and its verdict.

Verification, blame and the verdict are operations over a loaded program, built on the
load's public operations (``run``, ``reset_state``, ``swap_constant``); this module composes
them and attaches the notebook display, so the loader below imports none of them.  Torch
and pandas are imported when a check runs: a dry run imports neither.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from toolkit.core.errors import LoadError
from toolkit.core.model import Program
from toolkit.core.options import LoadOptions, options_from_environment
from toolkit.core.policies import Policy, get_policy
from toolkit.core.verdict import BlameRow, MethodFacts, Verdict, build_verdict
from toolkit.core.vocab import DataProblem, Oracle, SessionStatus, parse
from toolkit.engine.blind_spots import blind_spots
from toolkit.engine.devices import default_runtime, resolve_devices
from toolkit.engine.frames import check_rows
from toolkit.engine.loader import ProgramLoad
from toolkit.runtimes import Runtime
from toolkit.sources import open_program

if TYPE_CHECKING:
    import pandas as pd


class Session(ProgramLoad):
    """One load of one program under one policy: its tables, verification, blame and verdict.

    Constructing it does no I/O; :meth:`load` does.  Tables, :attr:`method_results`, the last
    :meth:`verify` answers and the verdict outlive :meth:`close`.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._verifications: dict[str | None, tuple[tuple, Any]] = {}  # sequence (None: each method alone)
        self._blames: dict[str | None, "pd.DataFrame"] = {}
        self._verdict: tuple[tuple, Verdict] | None = None

    def reference(self, method: str):
        """(inputs, expected outputs) the eager module gave at build time."""
        from toolkit.engine import verification

        return verification.read_reference(
            self.program, self.program.method(method), check_integrity=self.check_integrity
        )

    def run(self, method: str, inputs: list | None = None) -> list:
        """Run a loaded method on ``inputs`` (default: its reference inputs)."""
        if inputs is None and method in self.methods and self.methods[method].runnable and self.runtime.can_run:
            inputs, _ = self.reference(method)
        return super().run(method, inputs if inputs is not None else [])

    def verify(
        self,
        sequence: str | None = None,
        references: "Mapping[str, Any] | None" = None,
        *,
        oracle: str = "auto",
        draws: int = 3,
        seed: int = 0,
    ) -> "pd.DataFrame":
        """Run the program against its oracles and compare outputs (a frame, computed once per
        set of loaded methods, references and oracle; a closed session answers with its last one).

        Without ``sequence``: every loaded method alone, from its initial state.  With
        ``sequence``: its steps in order, state carried as the loaded program carries it.
        ``oracle`` (each row's ``oracle`` column names what it used): ``"auto"`` checks a method
        against its reference and, where it has none, against the same method loaded alone on its
        own bytes, on ``draws`` inputs generated from the program (``seed``);
        ``"reference"`` references only; ``"unshared"`` the unshared load for every method (on the
        reference's inputs where there is one; a sequence on an unshared load holding the
        program's intended shared state).  ``references`` replace the program's own, per method
        (see :func:`toolkit.engine.verification.resolve_references`); ones that do not fit raise
        ``ReferenceDataError``.  A method that did not run has ``ok`` ``pd.NA``, neither ok nor
        wrong, and ``reason`` says why.
        """
        from toolkit.engine import verification

        if draws < 1:
            raise ValueError(f"draws must be at least 1, got {draws!r}")
        parse(Oracle, oracle, what="oracle")  # before anything runs
        if sequence is not None:
            self.program.sequence(sequence)  # KeyError naming the sequences there are
            if references is not None:
                raise ValueError(
                    "references= applies to methods run alone; a sequence is checked against the "
                    "eager sequence the program stores"
                )
        key = self._verification_key(sequence) + (oracle, draws, seed)
        hit = self._verifications.get(sequence)
        if references is not None:  # checked and run every time: the caller may change them in place
            if self.status is SessionStatus.CLOSED:
                raise LoadError("the session is closed: verify with references before close()")
            hit = (
                key + ("references",),
                verification.verify_session(self, references, oracle=oracle, draws=draws, seed=seed),
            )
            self._verifications[sequence] = hit
            return hit[1].copy()
        if self.status is SessionStatus.CLOSED and hit is not None:
            return hit[1].copy()
        if hit is None or hit[0] != key:
            hit = (
                key,
                verification.verify_session(self, oracle=oracle, draws=draws, seed=seed)
                if sequence is None
                else verification.verify_sequence(self, sequence, oracle=oracle),
            )
            self._verifications[sequence] = hit
        return hit[1].copy()

    def _verification_key(self, sequence: str | None) -> tuple:
        return sequence, tuple(sorted((n, id(lm)) for n, lm in self.methods.items()))

    def _last_verification(self, sequence: str | None) -> "pd.DataFrame":
        """The last verification of the loaded methods (whatever its oracle and references), run if there is none."""
        hit = self._verifications.get(sequence)
        if hit is not None and (self.status is SessionStatus.CLOSED or hit[0][:2] == self._verification_key(sequence)):
            return hit[1]
        return self.verify(sequence=sequence)

    def repeatability(self, runs: int = 3) -> "pd.DataFrame":
        """Which outputs change between repeated runs, and why (:func:`toolkit.engine.verification.repeatability`)."""
        from toolkit.engine import verification

        return verification.repeatability(self, runs)

    def blame(self, sequence: str | None = None) -> "pd.DataFrame":
        """Which sharing decisions make a method wrong (see :mod:`toolkit.engine.blame`); kept for the verdict."""
        from toolkit.engine import blame as blame_ops

        if not self.runtime.can_run:
            raise LoadError("blame needs a real load: a dry run has nothing to run")
        frame = blame_ops.blame(self, sequence, self.verify(sequence=sequence))
        self._blames[sequence] = frame
        return frame.copy()

    # ------------------------------------------------------------------ the verdict
    def known_verdict(self) -> Verdict | None:
        """The verdict where it needs nothing run (a dry run, or a load already verified); else None."""
        if not self.runtime.can_run or None in self._verifications:
            return self.verdict()
        return None

    def verdict(self) -> Verdict:
        """What ran wrong, why, and which constant (:class:`toolkit.core.verdict.Verdict`).

        A real load is verified first (each method alone, then every sequence the program
        stores), unless it already was; a dry run's verdict is the prediction.  Blame's
        experiments, once :meth:`blame` ran, confirm or clear each constant.  Computed once per
        set of verifications and blames."""
        predicted = not self.runtime.can_run
        verified = not predicted and (self.status is not SessionStatus.CLOSED or None in self._verifications)
        standalone = self._last_verification(None) if verified else None  # each frame computed once (memoized)
        sequences = {}
        if verified and self.load_outcome is SessionStatus.LOADED:
            sequences = {
                q.name: self._last_verification(q.name)
                for q in self.program.sequences
                if self.status is not SessionStatus.CLOSED or q.name in self._verifications
            }
        key = (
            tuple((k, id(v[1])) for k, v in self._verifications.items()),
            tuple(id(b) for b in self._blames.values()),
            self.load_outcome,
        )
        if self._verdict is not None and self._verdict[0] == key:
            return self._verdict[1]  # nothing new since: no frame is read again
        blamed = [
            BlameRow(
                r["verification"],
                r["method"],
                r["name"],
                r["fqn"],
                bool(r["fixes"]),
                DataProblem(r["problem"]) if r["problem"] else None,
                r["evidence"],
                r["shared_from"],
            )
            for b in self._blames.values()
            for r in b.to_dict("records")
            if r["swap"]
        ]
        v = build_verdict(
            program=self.program.name,
            policy=self.policy.name.value,
            predicted=predicted,
            methods=[
                MethodFacts(r.method, r.status, r.runnable, r.problems, r.error, r.findings)
                for r in self.results.values()
            ],
            checks=check_rows(standalone) if standalone is not None else None,
            sequences={name: check_rows(frame) for name, frame in sequences.items()},
            blame=blamed,
            error=self.error or "",
            failed_stage=self.failed_stage,
            not_checked=blind_spots(self.program, predicted=predicted, sequences=sequences),
        )
        self._verdict = (key, v)
        return v

    # ------------------------------------------------------------------ display
    def summary(self) -> str:
        from toolkit.display.session import session_text

        return session_text(self)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        from toolkit.display.session import session_html

        return session_html(self)


def load_program(
    program_or_path: "Program | str | Path",
    policy: "str | Policy" = "fingerprint",
    device: "str | Any | Mapping[str, str] | None" = None,
    *,
    record: bool = True,
    progress: bool = False,
    check_integrity: bool | None = None,
    runtime: Runtime | None = None,
    options: LoadOptions | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> Session:
    """Load every method of a program under ``policy`` and return the session.

    A method that fails leaves the session with ``status == "failed"`` and ``error`` set,
    not an exception, so the decisions up to the failure can be inspected.  ``options``: how
    bytes move and are checked (:class:`~toolkit.core.options.LoadOptions`); None reads them from
    the environment (:func:`~toolkit.core.options.options_from_environment`), here at the edge.
    ``check_integrity``, when given, sets the options' integrity path as the ``LoadOptions`` alias
    of that name does (False: ``integrity="off"``).
    ``on_progress(done, total, method)``: the constants loaded so far (:meth:`ProgramLoad.load`).
    """
    options = options if options is not None else options_from_environment()
    if check_integrity is not None:  # the runtime reads verified copies only when the load checks
        options = replace(options, check_integrity=check_integrity)
    program = open_program(program_or_path)
    pol = get_policy(policy)
    rt = runtime if runtime is not None else default_runtime(options)
    devices = resolve_devices(program, device, rt)
    for d in set(devices.values()):
        rt.check_available(program, d)
    return Session(program, pol, devices, record=record, runtime=rt, options=options).load(
        progress=progress, on_progress=on_progress
    )
