"""Loading, the state's main action: open or build the program, load it under the policy (or
predict the load: a dry run), take its verdict (verified, blamed when a method ran wrong) and its
collision report, and put them on screen; comparing every policy on the same program.

A mixin of :class:`toolkit.explorer.state.ExplorerState` (its traits, progress and errors).  The bar
moves over each step's share of it, the status line saying what runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pandas as pd

from toolkit.core.errors import IncompatibleProgramError, ToolkitError
from toolkit.core.vocab import MethodOutcome
from toolkit.explorer import devices
from toolkit.explorer.browsing import ALL
from toolkit.explorer.devices import NO_CUDA
from toolkit.explorer.findings import first_of_interest
from toolkit.explorer.text import one_line
from toolkit.reports.collision import collision_report
from toolkit.reports.native_code import native_code_notice

if TYPE_CHECKING:
    from toolkit.core.model import Program
    from toolkit.engine.session import Session

PATH_HINT = "a program directory (holding manifest.json), an ExecuTorch .pte (its .ptd beside it) or a torch .pt2 file"
DRY_RUN_REASON = "not run (dry run)"
DRY_RUN_HINT = "this program cannot be loaded here: tick “dry run” to analyze it without loading"
PREDICTION = "dry run (a prediction, nothing loaded or run): "
# the bar's share of each step of a load: the constants of a load (then verify, blame), of a dry
# run, and the figures drawn at the end (a large program spends a while in each)
LOAD_SPAN, DRY_RUN_SPAN, DRAW_SPAN = (0.5, 0.7), (0.1, 0.8), (0.88, 0.98)
PROGRESS_STEP = 0.01  # the constants' progress moves the bar by at least this much (or a new method begins)
# a load error's advice to rebuild, dropped for an ExecuTorch file (it cannot be rebuilt here)
_REBUILD = re.compile(r";?\s*rebuild it with device=\S+")


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


class LoadMixin:
    """The actions that put results on screen: :meth:`load` and :meth:`compare`."""

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
        if (program.device == "cuda" or self.device.startswith("cuda")) and not devices.cuda_available():
            return DRY_RUN_HINT
        return ""

    def _is_pte(self) -> bool:
        return self.program_from == "path" and Path(self.path.strip()).suffix.lower() == ".pte"

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
            self.fail("could not open the program", e)
            return None

    def _loaded_session(self, program: "Program") -> "Session | None":
        """Load, verify (the verdict) and, when a method ran wrong, blame; None (and :attr:`error`) on failure."""
        from toolkit.engine.session import load_program

        notice = native_code_notice(program)
        head = f"loading {self.label_of(program, self.inputs())!r} under {self.policy!r} on {self.device}"
        self._step("load", LOAD_SPAN[0], head + (f" ({notice})" if notice else ""))
        try:
            if self.device.startswith("cuda") and not devices.cuda_available():
                raise ToolkitError(NO_CUDA)
            session = (self._load or load_program)(
                program, self.policy, device=self.device, on_progress=self._constants_progress("load", LOAD_SPAN, head)
            )
        except Exception as e:  # noqa: BLE001
            hint = self._load_hint(program, e)
            if hint and self._is_pte():  # an ExecuTorch file cannot be rebuilt here: say only what can be done
                e = type(e)(_REBUILD.sub("", str(e)))
            self.fail("could not load the program", e, hint=hint if str(e) != NO_CUDA else "")
            return None
        self._step("verify", 0.75, "running every method and sequence against its eager reference")
        try:
            wrong = session.verdict().wrong_methods
        except Exception as e:  # noqa: BLE001
            session.close()
            self.fail("could not verify the program", e)
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
                self.blame_note = f"blame could not run: {one_line(e)}"
        return session

    def _predicted_session(self, program: "Program") -> "Session | None":
        from toolkit.workflows.dry_run import dry_run

        device = self.analysis_device(program)
        head = f"dry run of {self.label_of(program, self.inputs())!r} under {self.policy!r} on {device}"
        self._step(
            "analyze", max(DRY_RUN_SPAN[0], self.progress), f"{head}: predicting every decision (nothing is loaded)"
        )
        try:
            return dry_run(
                program,
                self.policy,
                device=device,
                on_progress=self._constants_progress(
                    "analyze", DRY_RUN_SPAN, head + ", predicting (nothing is loaded)"
                ),
            ).session
        except Exception as e:  # noqa: BLE001
            self.fail("could not analyze the program", e)
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
                return self.fail("could not verify the program", e)
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
            self.selected = first_of_interest(self.rows, self.verdict)
        if old is not None and old is not session:
            old.close()

    def compare(self) -> bool:
        """Load and verify the current program under every policy (:func:`toolkit.workflows.compare.compare_policies`);
        in a dry run, predict each (``compare_policies(dry_run=True)``: nothing is loaded)."""
        if not self._begin():
            return False
        try:
            from toolkit.workflows.compare import compare_policies

            try:
                shown = self.program is not None
                program = self.program or self.open_program()
            except Exception as e:  # noqa: BLE001
                return self.fail("could not open the program", e)
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
                    compare_policies(program, device=self.analysis_device(program), on_policy=on_policy, dry_run=True)
                    if dry
                    else compare_policies(program, device=self.device, on_policy=on_policy)
                )
            except Exception as e:  # noqa: BLE001
                return self.fail("could not dry-run the policies" if dry else "could not compare policies", e)
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
