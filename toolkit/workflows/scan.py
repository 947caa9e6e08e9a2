"""The scan: a dry run of every program under a folder, each in a worker process, under each policy.

A gate for the CI of a model zoo.  A worker that dies on a hostile file costs that file its row,
never the scan; an interrupt keeps what finished.  A link out of the scanned folder (a
``manifest.json``, ``.pte`` or ``.pt2``, or a file a ``.pte`` reads beside it) is not followed: its
program gets a row saying so, and nothing of the target is read, so no error text can quote it.  A
file name that is not UTF-8 is kept as Python decodes it (lone surrogates); every report escapes it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from toolkit.core.errors import ToolkitError
from toolkit.core.verdict import BAD_OUTCOMES, Verdict
from toolkit.core.vocab import UNREADABLE, ExitCode


def program_labels(paths, root: Path) -> dict[str, str]:
    """Each scanned program's name in the terminal and every report, by its path under ``root``: that
    path without a generic file name (``bart/prog.pte`` is ``bart``;
    :data:`~toolkit.sources.naming.GENERIC_STEMS`), unless two programs would then be named alike."""
    from toolkit.sources.naming import GENERIC_STEMS

    rel = [Path(p).relative_to(root) for p in paths]
    short = {str(r): str(r.parent) if r.stem.lower() in GENERIC_STEMS and str(r.parent) != "." else str(r) for r in rel}
    taken = Counter(short.values())
    return {r: s if taken[s] == 1 else r for r, s in short.items()}


@dataclass
class Scan:
    """What :func:`scan_folder` found: one row per (program, policy, method), or one per unreadable program."""

    root: Path
    policies: list[str]
    paths: list[str]  # every program found, in scan order
    rows: list[dict] = field(default_factory=list)  # rows of SCAN_COLUMNS, each with its policy's ``verdict``
    scanned: int = 0  # programs finished: fewer than ``len(paths)`` when interrupted

    @property
    def interrupted(self) -> bool:
        return self.scanned < len(self.paths)

    @functools.cached_property
    def frame(self) -> pd.DataFrame:  # built once: the CLI reads it, the failing rows and the exit code
        return pd.DataFrame(self.rows, columns=SCAN_COLUMNS)

    @functools.cached_property
    def _labels(self) -> dict[str, str]:
        return program_labels(self.paths, self.root)

    def label(self, path: str) -> str:
        """What every report calls the program at ``path`` (:func:`program_labels`)."""
        rel = str(Path(path).relative_to(self.root))
        return self._labels.get(rel, rel)

    def verdicts(self) -> tuple[list[Verdict], list[str]]:
        """One verdict per (program, policy) that could be read, and its label (the program's path under the root)."""
        by_policy = {(r["path"], r["policy"]): r["verdict"] for r in self.rows if "verdict" in r}
        return list(by_policy.values()), [self.label(p) for p, _policy in by_policy]

    def dry_runs(self) -> list[tuple[pd.DataFrame | None, int]]:
        """Beside each of :meth:`verdicts`: its dry run's decisions (kept for the first policy of a program
        with a finding, what a report draws its collision matrix from; else None) and the constant bytes it
        would put on the device."""
        by_policy = {(r["path"], r["policy"]): (r.get("decisions"), r.get("device_bytes", 0)) for r in self.rows}
        return [by_policy[key] for key in {(r["path"], r["policy"]): None for r in self.rows if "verdict" in r}]

    @property
    def unreadable(self) -> dict[str, str]:
        """Label -> error of each program that could not be read."""
        return {self.label(r["path"]): r["error"] for r in self.rows if r["outcome"] == UNREADABLE}

    @functools.cached_property
    def failing(self) -> pd.DataFrame:
        """The rows that fail the gate: a method that would run wrong, not run or not load, or an unreadable file."""
        frame = self.frame
        return frame[frame["outcome"].isin([*BAD_OUTCOMES, UNREADABLE])]

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.PROBLEM if len(self.failing) else ExitCode.OK


def scan_folder(
    folder: str | Path,
    policies: list[str],
    *,
    jobs: int = 2,
    on_start: Callable[[int], None] | None = None,
    on_done: Callable[[str], None] | None = None,
) -> Scan:
    """Dry-run every program under ``folder`` under each of ``policies``, ``jobs`` worker processes at a time.

    ``on_start(n)`` is called once the ``n`` programs are found, ``on_done(path)`` as each finishes.
    Ctrl-C stops the scan at once and returns
    what finished (:attr:`Scan.interrupted`)."""
    root = Path(folder)
    if not root.is_dir():
        raise ToolkitError(f"{folder}: not a folder")
    found = find_programs(root)
    paths = [str(p) for p in found]
    if not paths:
        raise ToolkitError(f"{folder}: no program found (program directories, .pte or .pt2 files)")
    if on_start is not None:
        on_start(len(paths))
    done: dict[str, list[dict]] = {}
    for p in found:  # links out of the folder: a row each, nothing opened
        link = link_out(p, root)
        if link is not None:
            done[str(p)] = [failed_row(str(p), f"{link}: {LINK_OUT}")]
            if on_done is not None:
                on_done(str(p))
    try:
        rest = [p for p in paths if p not in done]
        if rest:
            scan_rows(rest, policies, jobs, results=done, on_done=on_done)
    except KeyboardInterrupt:
        pass  # what finished is returned; the caller says it was interrupted
    rows = [r for path in paths for r in done.get(path, [])]
    return Scan(root, list(policies), paths, rows, scanned=len(done))


SCAN_COLUMNS = [
    "program",
    "path",
    "policy",
    "executorch",
    "status",
    "method",
    "outcome",
    "wrong_data",
    "error",
    "not_checked",
]


LINK_OUT = "a link out of the folder, not followed"
# what a .pte reads beside it (its .ptd, constant table, sequences, references): a link out among them is one
# out of the program
PTE_SIDE_FILES = ("*.ptd", "constant_table.json", "sequence_*.safetensors", "reference_*.safetensors")


def find_programs(root: Path) -> list[Path]:
    """Program directories (holding manifest.json), .pte and .pt2 files under ``root``, sorted; a
    ``.pte``/``.pt2`` that is a link out of ``root`` too, whatever it leads to (:func:`link_out`)."""
    from toolkit.sources.directory import MANIFEST_FILE

    found = {p.parent for p in root.rglob(MANIFEST_FILE)}
    found |= {
        p
        for p in root.rglob("*")
        if p.suffix in (".pte", ".pt2") and (p.is_file() or (p.is_symlink() and leads_out(p, root)))
    }
    return sorted(found)


def leads_out(path: Path, root: Path) -> bool:
    """Whether ``path`` (a link, or a path through one) resolves outside ``root``: only the links are read
    (``realpath``), never the target."""
    try:
        return not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))
    except (OSError, ValueError):  # a loop of links, a name too long: not followed either
        return True


def link_out(program: Path, root: Path) -> Path | None:
    """The file of ``program`` (found under ``root``) that is a link out of ``root``, if any: its
    ``manifest.json``, the ``.pte`` or ``.pt2`` itself, or a file a ``.pte`` reads beside it."""
    from toolkit.sources.directory import MANIFEST_FILE

    candidates = [program, *([program / MANIFEST_FILE] if program.is_dir() else [])]
    if program.suffix == ".pte":
        candidates += [p for pattern in PTE_SIDE_FILES for p in sorted(program.parent.glob(pattern))]
    return next((p for p in candidates if p.is_symlink() and leads_out(p, root)), None)


def failed_row(path: str, error: str) -> dict:
    return {
        "program": "",
        "path": path,
        "policy": "",
        "executorch": "",
        "status": UNREADABLE,
        "method": "",
        "outcome": UNREADABLE,
        "wrong_data": False,
        "error": error,
        "not_checked": "",
    }  # (runs on no data; fails the gate)


def scan_program(path: str, policies: list[str]) -> list[dict]:
    """Dry-run one program under each policy (run in a worker process): rows of SCAN_COLUMNS.

    ``outcome`` is the method's predicted outcome (its verdict), ``unreadable`` for a program that
    cannot be opened; ``wrong_data`` marks an outcome that fails the gate (exit code 1) because it
    would run wrong, not at all, or its load would fail (a program that cannot be read fails the gate
    too, yet runs on no data).  Each row also carries its policy's ``verdict``, ``device_bytes`` and, for the
    first policy under which the program has a finding, its ``decisions`` (not CSV columns)."""
    from toolkit.core.policies.releases import executorch_releases
    from toolkit.core.verdict import BAD_OUTCOMES
    from toolkit.sources import open_program
    from toolkit.workflows.dry_run import dry_run

    try:
        program = open_program(path)
        rows = []
        kept = False  # the decisions of one policy per program, the first with a finding (for a report's matrix)
        for policy in policies:
            s = dry_run(program, policy).session
            verdict = s.verdict()
            found = not kept and (
                verdict.exit_code is ExitCode.PROBLEM
                or any(c.problem is not None and c.problem.standalone for c in verdict.constants)
            )
            kept = kept or found
            for m in verdict.methods:
                rows.append(
                    {
                        "program": program.name,
                        "path": path,
                        "policy": policy,
                        "executorch": executorch_releases(policy),
                        "status": str(s.status),
                        "method": m.method,
                        "outcome": m.outcome.value,
                        "wrong_data": m.outcome in BAD_OUTCOMES,
                        "error": m.reason if m.outcome in BAD_OUTCOMES else "",
                        "not_checked": verdict.gaps(m.method),
                        "verdict": verdict,
                        "decisions": s.decisions if found else None,
                        "device_bytes": s.device_bytes,
                    }
                )
        return rows
    except ToolkitError as e:
        return [failed_row(path, str(e))]
    except Exception as e:  # a toolkit bug on a hostile file: this program's row fails, the scan goes on
        return [failed_row(path, f"{type(e).__name__}: {str(e)[:300]}")]


def scan_rows(
    paths: list[str],
    policies: list[str],
    jobs: int,
    scan=scan_program,
    results: dict[str, list[dict]] | None = None,
    on_done=None,
) -> list[dict]:
    """``scan``'s rows of every program, in ``paths`` order, from worker processes.

    ``results`` (path -> rows) fills as programs finish (``on_done(path)`` after each), so a
    caller interrupted by Ctrl-C keeps what finished; the interrupt kills the workers at once.
    A worker that dies (killed by a signal) breaks its pool and every program in flight there;
    those run again, one worker at a time, so the program that kills it again is known: its row
    fails and the scan carries on."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    results = {} if results is None else results

    def run(batch: list[str], workers: int) -> list[str]:  # the programs the pool broke on, in batch order
        broken = set()
        # spawn, not fork: the calling process may hold torch's threads (a notebook, the test suite)
        pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=worker_setup
        )
        try:
            with sigint_blocked():  # in the workers, started here: a Ctrl-C reaches the whole process group
                futures = {pool.submit(scan, p, policies): p for p in batch}
            for f in as_completed(futures):
                try:
                    results[futures[f]] = f.result()
                except BrokenProcessPool:
                    broken.add(futures[f])
                    continue
                if on_done is not None:
                    on_done(futures[f])
        except KeyboardInterrupt:  # stop at once: what is queued is cancelled, what runs is killed
            workers_now = list((pool._processes or {}).values())  # Python < 3.14: no public terminate_workers()
            pool.shutdown(wait=False, cancel_futures=True)
            for w in workers_now:
                w.terminate()
            for w in workers_now:
                w.join()
            raise
        finally:
            pool.shutdown(cancel_futures=True)
        return [p for p in batch if p in broken]

    again = run(paths, max(1, min(jobs, len(paths))))
    while again:  # one worker: the programs before the first broken one finished, so that one killed it
        broken = run(again, 1)
        if broken:
            results[broken[0]] = [failed_row(broken[0], "the worker process reading it died (killed by a signal)")]
            if on_done is not None:
                on_done(broken[0])
        again = broken[1:]
    return [r for p in paths for r in results[p]]


def worker_setup() -> None:
    """A scan worker's setup: its (disabled) progress bars take a thread lock, not tqdm's
    default semaphore, which a worker stopped by Ctrl-C would leave to the resource tracker."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


@contextlib.contextmanager
def sigint_blocked():
    """SIGINT blocked on this thread meanwhile: processes started then inherit it blocked (their owner
    stops them), and a Ctrl-C that comes meanwhile is raised here once it ends (or at once, where
    another thread took it), never lost as an ignored signal would be."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
