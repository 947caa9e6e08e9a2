"""Crash isolation: load and run a program in a worker process.

Opening a method's ``.so`` runs its code inside the process that opens it.  A broken or
hostile ``.so`` (or an AOTInductor bug, such as the ``std::regex`` segfault two
libstdc++ copies cause, background.md) kills that process, and in a notebook that is the
kernel.  :func:`load_isolated` instead runs ``python -m toolkit.workflows.isolation`` as a child
process; a worker that dies or hangs becomes a failed load carrying
:class:`~toolkit.core.errors.WorkerCrashedError`, and the caller survives.

Transport is pickle-free: the request is a JSON file, the worker streams every event of
its load as one JSON line (flushed, so the decisions up to a crash survive it) and ends
with a JSON result file.  Nothing the worker sends is ever executed by the parent.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from toolkit.core import errors as _errors
from toolkit.core.errors import ToolkitError, WorkerCrashedError
from toolkit.core.model import Program
from toolkit.core.verdict import Verdict, verdict_from_dict
from toolkit.core.vocab import Integrity, ProgramFormat, SessionStatus
from toolkit.engine.frames import decision_counts

_STATUS_FAILED = SessionStatus.FAILED.value
_VERIFY_COLUMNS = ["method", "ran", "max_abs_err", "atol", "rtol", "ok", "reason"]  # verification.VERIFY_COLUMNS
_LOG_TAIL_CHARS = 4000
_OPEN_STAGE = "opening"  # the worker reads and checks the program (failed_stage of a refused one)
_ERROR_TYPES = {
    name: cls for name, cls in vars(_errors).items() if isinstance(cls, type) and issubclass(cls, ToolkitError)
}


@dataclass
class IsolatedLoad:
    """What a worker process reported about one load (plain data; the worker is gone).

    ``status`` is ``"loaded"`` or ``"failed"``.  On failure ``error`` says why,
    ``error_type`` names the toolkit exception class (``"WorkerCrashedError"`` when the
    worker died or timed out) and ``failed_method`` the method being loaded or run.
    """

    program: str
    policy: str
    status: str
    error: str | None = None
    error_type: str | None = None
    error_path: str | None = None
    error_field: str | None = None
    failed_method: str | None = None
    failed_stage: str | None = None  # "load", "export" (the modelled exporter refused it), "opening" (refused)
    event_rows: list[dict[str, Any]] = field(default_factory=list, repr=False)
    verification: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=_VERIFY_COLUMNS))
    verdict: Verdict | None = None  # the worker session's verdict (None: the worker crashed before it)
    returncode: int | None = None
    seconds: float = 0.0
    worker_log: str = ""  # tail of the worker's stderr (a faulthandler traceback after a crash)

    @property
    def events(self) -> pd.DataFrame:
        """Every event the worker recorded (up to a crash); columns are the union of fields."""
        from toolkit.engine.frames import rows_frame

        return rows_frame(self.event_rows)

    @property
    def decisions(self) -> pd.DataFrame:
        """The decision table, as :attr:`toolkit.Session.decisions` gives it (up to a crash)."""
        from toolkit.engine.frames import decisions_from_rows

        return decisions_from_rows(self.event_rows)

    @property
    def crashed(self) -> bool:
        return self.error_type == WorkerCrashedError.__name__

    def exception(self) -> ToolkitError | None:
        """The failure as a toolkit exception of the class the worker raised, or None."""
        if self.status != _STATUS_FAILED:
            return None
        cls = _ERROR_TYPES.get(self.error_type or "", _errors.LoadError)
        exc = cls.__new__(cls)
        Exception.__init__(exc, self.error or "load failed")
        if isinstance(exc, _errors.ProgramError):
            exc.path, exc.field = self.error_path, self.error_field
        return exc

    def raise_for_status(self) -> "IsolatedLoad":
        exc = self.exception()
        if exc is not None:
            raise exc
        return self

    def summary(self) -> str:
        head = f"program {self.program!r} under policy {self.policy!r} (isolated worker): {self.status}"
        lines = [head]
        if self.status == _STATUS_FAILED:
            lines.append(f"  {self.error_type} in {self.failed_method!r}: {self.error}")
        d = self.decisions
        if len(d):
            lines.append("  decisions: " + ", ".join(f"{k} {v}" for k, v in sorted(decision_counts(d).items())))
        if self.verdict is not None:
            lines.append("  " + self.verdict.headline())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()


def load_isolated(
    program_or_path: "Program | str | Path",
    policy: str = "fingerprint",
    device: "str | Mapping[str, str] | None" = None,
    *,
    verify: bool = True,
    timeout_s: float = 600.0,
    check_integrity: bool = True,
) -> IsolatedLoad:
    """Load (and by default verify) a program in a worker process; never crash the caller.

    Everything that reads the program's files happens in the worker, under ``timeout_s``:
    reading and checking the program (a FIFO or a pathological file cannot hang the caller),
    then the load.  A malformed or incompatible program raises here exactly as
    :func:`toolkit.load_program` does (the worker says which error; nothing it sends is run).
    A worker killed by a signal, exiting without a result, or running past ``timeout_s`` (it
    is then killed, with its whole process group) gives ``status == "failed"`` and
    ``error_type == "WorkerCrashedError"``.
    """
    from toolkit.core.policies import get_policy

    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    pol = get_policy(policy).name.value
    if isinstance(program_or_path, Program):
        target, name = _reopenable(program_or_path), program_or_path.name
    else:
        target = str(Path(program_or_path).resolve())
        name = Path(target).stem if Path(target).suffix in (".pte", ".pt2") else Path(target).name
    request = {
        "program": target,
        "policy": pol,
        "device": dict(device) if isinstance(device, Mapping) else device,
        "verify": verify,
        "check_integrity": check_integrity,
    }
    with tempfile.TemporaryDirectory(prefix="constshare-worker-") as tmp:
        iso = _run_worker(Path(tmp), request, name, pol, timeout_s)
    if iso.failed_stage == _OPEN_STAGE:  # the program was refused before any load: raise as load_program does
        if iso.error_type == ValueError.__name__:
            raise ValueError(iso.error)
        iso.raise_for_status()
    return iso


def _reopenable(program: "Program") -> str:
    """What the worker opens for an in-memory program: its folder (our directories) or its
    ``.pte`` / ``.pt2`` file (other formats keep several programs' files in one folder)."""
    if program.format is not ProgramFormat.DIRECTORY:
        own = [rel for rel in program.files if Path(rel).suffix in (".pte", ".pt2")]
        if len(own) == 1:
            return str((Path(program.root) / own[0]).resolve())
    return str(Path(program.root).resolve())


def _run_worker(tmp: Path, request: dict, program_name: str, policy: str, timeout_s: float) -> IsolatedLoad:
    (tmp / "request.json").write_text(json.dumps(request), encoding="utf-8")
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault leaves a Python traceback in the worker log
    t0 = time.perf_counter()
    timed_out = False
    with open(tmp / "stdout.txt", "wb") as out, open(tmp / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.workflows.isolation", str(tmp)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    seconds = time.perf_counter() - t0
    events, stage = _read_progress(tmp / "progress.jsonl")
    log = (tmp / "stderr.txt").read_text(encoding="utf-8", errors="replace")[-_LOG_TAIL_CHARS:]
    result = None
    if not timed_out and proc.returncode == 0:
        try:
            result = json.loads((tmp / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = None
    base = dict(
        program=program_name,
        policy=policy,
        event_rows=events,
        returncode=proc.returncode,
        seconds=seconds,
        worker_log=log,
    )
    if result is None:
        where = (
            f" while {stage[0]} method {stage[1]!r}"
            if stage and stage[1]
            else f" while {stage[0]} the program"
            if stage
            else " before it loaded any method"
        )
        if timed_out:
            why = f"the worker process did not finish within {timeout_s:g} s and was killed{where}"
        elif proc.returncode is not None and proc.returncode < 0:
            why = f"the worker process was killed by {_signal_name(-proc.returncode)}{where}"
        else:
            why = f"the worker process exited with code {proc.returncode} without a result{where}"
        return IsolatedLoad(
            status=_STATUS_FAILED,
            error=why,
            error_type=WorkerCrashedError.__name__,
            failed_method=(stage[1] or None) if stage else None,
            **base,
        )
    v = result.get("verification")
    verification = pd.DataFrame(v["data"], columns=v["columns"]) if v else pd.DataFrame(columns=_VERIFY_COLUMNS)
    if len(verification):
        verification["ok"] = verification["ok"].astype("boolean")  # null: no reference (pd.NA)
    base["program"] = result.get("program") or program_name
    return IsolatedLoad(
        status=result["status"],
        error=result.get("error"),
        error_type=result.get("error_type"),
        error_path=result.get("error_path"),
        error_field=result.get("error_field"),
        failed_method=result.get("failed_method"),
        failed_stage=result.get("failed_stage"),
        verification=verification,
        verdict=verdict_from_dict(result["verdict"]) if result.get("verdict") else None,
        **base,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _signal_name(num: int) -> str:
    try:
        return f"{signal.Signals(num).name} (signal {num})"
    except ValueError:
        return f"signal {num}"


def _read_progress(path: Path) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """Event rows the worker streamed, and the last (stage, method) it announced."""
    rows: list[dict[str, Any]] = []
    stage = None
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                break  # the line being written when the worker died
            if "event" in item:
                rows.append(item["event"])
            elif "stage" in item:
                stage = (item["stage"], item["method"])
    return rows, stage


# ---------------------------------------------------------------------- worker side


def _jsonable(v: Any) -> Any:
    if v is pd.NA:  # a method with no reference: neither ok nor wrong
        return None
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return v  # json writes NaN/Infinity, and json.loads reads them back
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _frame_json(df: pd.DataFrame) -> dict:
    return {"columns": list(df.columns), "data": [[_jsonable(x) for x in row] for row in df.itertuples(index=False)]}


def _worker(tmp: Path) -> int:
    import torch

    from toolkit.core import events as ev
    from toolkit.core.options import options_from_environment
    from toolkit.core.policies import get_policy
    from toolkit.engine.devices import resolve_devices
    from toolkit.engine.session import Session
    from toolkit.runtimes.aoti import AotiRuntime, check_compatible
    from toolkit.sources import open_program

    req = json.loads((tmp / "request.json").read_text(encoding="utf-8"))
    progress = open(tmp / "progress.jsonl", "a", encoding="utf-8")

    def emit(item: dict) -> None:
        progress.write(json.dumps(item, default=_jsonable) + "\n")
        progress.flush()

    class StreamingLog(ev.EventLog):
        """Writes every event as it is recorded, so what happened before a crash is kept."""

        def record(self, event_type, method, **payload):
            if event_type is ev.LoadStarted:
                emit({"stage": "loading", "method": method})
            super().record(event_type, method, **payload)

        def recorded(self, start, stop):  # every event, one recorded alone or a batch's
            for seq in range(start, stop):
                emit({"event": {k: _jsonable(v) for k, v in self.event(seq).row().items()}})

    class WorkerSession(Session):
        def run(self, method, inputs=None):
            emit({"stage": "running", "method": method})
            return super().run(method, inputs)

    result: dict[str, Any] = {"status": _STATUS_FAILED}
    try:
        try:  # what load_program refuses before loading: the parent raises it as such
            emit({"stage": _OPEN_STAGE, "method": ""})
            program = open_program(req["program"])
            result["program"] = program.name
            options = options_from_environment()  # the worker's edge: the environment it inherited
            if not req["check_integrity"]:
                options = dataclasses.replace(options, integrity=Integrity.OFF)
            runtime = AotiRuntime(options)
            devices = resolve_devices(program, req["device"], runtime)
            for kind in sorted({d.type for d in devices.values()}):
                check_compatible(program, kind, torch.__version__)
            for d in set(devices.values()):
                runtime.check_available(program, d)
        except (ToolkitError, ValueError):
            result["failed_stage"] = _OPEN_STAGE
            raise
        session = WorkerSession(
            program,
            get_policy(req["policy"]),
            devices,
            runtime=runtime,
            options=options,
        )
        session.log = StreamingLog()
        session.load()
        result.update(
            status=session.status,
            error=session.error,
            failed_method=session.failed_method,
            failed_stage=session.failed_stage,
        )
        e = session.exception
        if session.status == _STATUS_FAILED and e is not None:
            result.update(
                error_type=type(e).__name__, error_path=getattr(e, "path", None), error_field=getattr(e, "field", None)
            )
        elif session.status == _STATUS_FAILED:
            result["error_type"] = _errors.LoadError.__name__
        if req["verify"]:
            result["verification"] = _frame_json(session.verify())
            result["verdict"] = dataclasses.asdict(session.verdict())
        session.close()
    except ToolkitError as e:
        result.update(
            status=_STATUS_FAILED,
            error=str(e),
            error_type=type(e).__name__,
            error_path=getattr(e, "path", None),
            error_field=getattr(e, "field", None),
        )
    except ValueError as e:
        error_type = ValueError.__name__ if result.get("failed_stage") == _OPEN_STAGE else "LoadError"
        result.update(status=_STATUS_FAILED, error=str(e), error_type=error_type)
    except Exception as e:  # reported, not raised: the parent turns it into a failed load
        result.update(status=_STATUS_FAILED, error=f"{type(e).__name__}: {e}", error_type="LoadError")
    (tmp / "result.json.part").write_text(json.dumps(result, default=_jsonable), encoding="utf-8")
    os.replace(tmp / "result.json.part", tmp / "result.json")
    progress.close()
    return 0


if __name__ == "__main__":
    sys.exit(_worker(Path(sys.argv[1])))
