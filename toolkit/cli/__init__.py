"""Load multi-method AOTInductor programs with cross-method constant sharing, and check every method.

  constshare build   SOURCE [--device cpu|cuda] [--out DIR]
  constshare report  PROGRAM [--policy P] [--device D] [--csv FILE] [--html FILE] [--junit FILE] [--dry-run]
                     [--reference M=FILE ...] [--constant-table FILE]
  constshare compare PROGRAM [--policies P,P,...] [--device D] [--csv FILE] [--html FILE] [--junit FILE] [--dry-run]
                     [--reference M=FILE ...] [--constant-table FILE]
  constshare scan    FOLDER [--policies P,P,...] [--csv FILE] [--html FILE] [--junit FILE] [--jobs N]
  constshare samples

SOURCE is a sample name (see samples) or a Python file or module defining methods() as the
sample programs do. PROGRAM is a program directory, an ExecuTorch .pte, a torch .pt2, or a
sample name (built on demand into the build cache, CONSTSHARE_CACHE).

Exit codes, the same for report, compare and scan, dry run or not (compare and scan: the worst
over the policies and programs asked for; --dry-run: the prediction's):
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path

import pandas as pd

from toolkit.core.errors import ToolkitError
from toolkit.core.verdict import EXIT_CODE_TABLE
from toolkit.core.vocab import BlameStatus, ExitCode, MethodOutcome, Oracle, Stage

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a command a Ctrl-C stopped

# C0 controls (but newline and tab) and C1 controls: a name holding ESC [ ... could
# rewrite the terminal; they are printed escaped.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}


def printable(text: object) -> str:
    """``text`` with terminal control characters (ESC, NUL, ...) shown as ``\\xNN``."""
    return str(text).translate(_CONTROL)


def _out(text: object = "") -> None:
    print(printable(text))


def _load_source_module(source: str):
    path = Path(source)
    if path.suffix == ".py":
        if not path.is_file():
            raise ToolkitError(f"{path}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # the user's file: say which and why, in one line
            raise ToolkitError(f"{path}: running it failed: {type(e).__name__}: {e}") from None
    else:
        try:
            mod = importlib.import_module(source)
        except ImportError as e:
            raise ToolkitError(f"{source}: not a .py file and not an importable module ({e})") from None
        except Exception as e:
            raise ToolkitError(f"{source}: importing it failed: {type(e).__name__}: {e}") from None
    if not callable(getattr(mod, "methods", None)):
        raise ToolkitError(f"{source}: defines no methods() returning {{name: (module, example_args)}}")
    return mod


def _program(ref: str, device: str | None, constant_table: str | None = None):
    from toolkit.build.samples import build_sample, sample_names
    from toolkit.sources import open_program

    if Path(ref).exists():  # a program directory, or a file of another format (.pte, .pt2)
        return open_program(ref, **({"constant_table": constant_table} if constant_table else {}))
    if ref in sample_names():
        kind = "cuda" if device and device.startswith("cuda") else "cpu"
        return build_sample(ref, device=kind, progress=True)
    raise ToolkitError(f"{ref}: neither a program (directory, .pte or .pt2) nor a sample ({', '.join(sample_names())})")


def _print_frame(df: pd.DataFrame) -> None:
    with pd.option_context(
        "display.width", 200, "display.max_columns", 30, "display.max_colwidth", 70, "display.max_rows", 500
    ):
        _out(df.to_string(index=False))


def _say_native_code(program) -> None:
    """Before a full load: that it runs the program's native code (once per process, on stderr)."""
    from toolkit.reports.collision import native_code_notice

    notice = native_code_notice(program)
    if notice:
        print(f"constshare: {printable(notice)}", file=sys.stderr)


def _check_device(device: str | None) -> None:
    from toolkit.runtimes import parse_device

    if device is not None:
        parse_device(device)  # ValueError naming the choices


def _check_csv(path: str | None, force: bool, option: str = "--csv") -> None:
    """Refuse an output file (``option``) before any work: empty, a folder, a device or FIFO, a
    missing or unwritable folder, or (without --force) a file."""
    from toolkit.reports.collision import check_output

    if path is None:
        return
    if not path.strip():
        raise ToolkitError(f"{option}: an empty path")
    if Path(path).is_dir():
        raise ToolkitError(f"{option} {path}: is a folder; give a file name inside it")
    check_output(path)
    if Path(path).exists() and not force:
        raise ToolkitError(f"{option} {path}: exists already; pass --force to overwrite it")


def _check_reports(a) -> None:
    """--html and --junit, checked as --csv is."""
    _check_csv(a.html, a.force, "--html")
    _check_csv(a.junit, a.force, "--junit")


def _write_reports(a, verdicts, html_of, labels=None, unreadable=None) -> None:
    """The HTML report (``html_of()`` builds it) and the JUnit XML the options ask for."""
    from toolkit.reports.ci import junit_xml
    from toolkit.reports.collision import write_text_atomically

    if a.html:
        write_text_atomically(a.html, html_of())
        _out(f"HTML report written to {Path(a.html).resolve()}")
    if a.junit:
        write_text_atomically(a.junit, junit_xml(verdicts, labels=labels, unreadable=unreadable))
        _out(f"JUnit XML written to {Path(a.junit).resolve()}")


def cmd_build(a) -> int:
    from toolkit.build.builder import build_program
    from toolkit.build.samples import build_sample, cache_root, sample_names

    if a.source in sample_names() and a.out is None:
        prog = build_sample(a.source, device=a.device, progress=True, rebuild=a.rebuild)
    else:
        mod = _load_source_module(a.source)
        out = Path(a.out) if a.out else cache_root() / f"{Path(a.source).stem}-{a.device}"
        prog = build_program(
            mod.methods(),
            out,
            device=a.device,
            name=Path(a.source).stem,
            description=(getattr(mod, "DESCRIPTION", "") or "").strip(),
            overwrite=True,
        )
    _out(prog.root)
    return 0


def _references(items: list[str] | None) -> dict[str, str] | None:
    """``--reference METHOD=FILE`` (repeated) -> {method: file}; checked before any work."""
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        method, sep, path = item.partition("=")
        if not sep or not method or not path:
            raise ToolkitError(f"--reference {item!r}: give METHOD=FILE.safetensors")
        if method in out:
            raise ToolkitError(f"--reference: method {method!r} given twice")
        if not Path(path).is_file():
            raise ToolkitError(f"--reference {item}: {path!r} is not a file")
        out[method] = path
    return out


def _say_verdict(v) -> None:
    """What a verdict adds under a table: the failure and its reason, methods that cannot run,
    and each constant a method runs (would run) on other data for."""
    if v.failed_stage is not None:
        _out(f"{v.policy}: {v.outcome.value} at stage {v.failed_stage.value}: {v.error}")
    for m in v.methods:
        if m.outcome is MethodOutcome.NOT_RUNNABLE:
            _out(
                f"{v.policy}: {m.method} not runnable (an installed tensor cannot fill its slot; upstream would "
                f"read out of bounds): {m.reason}"
            )
        elif m.outcome is MethodOutcome.FAILED and m.stage is Stage.RUN:
            _out(f"{v.policy}: {m.method} failed to run: {m.reason}")
    for c in v.constants:
        if c.problem is not None and (c.problem.standalone or c.blame is BlameStatus.CULPRIT):
            _out(
                f"{v.policy}: {c.method} runs on other data for {c.name}"
                + (f" ({c.fqn})" if c.fqn and c.fqn != c.name else "")
                + f", {c.problem.value}: {c.evidence}"
                + (f" [{c.blame.value}: {c.blame_note}]" if c.blame_note else "")
            )


def cmd_report(a) -> int:
    """One policy: the decisions, the verification (a dry run: the prediction), the verdict; the
    collision report CSV (the same columns for a dry run, ``method_outcome`` predicted)."""
    from toolkit.engine.session import load_program
    from toolkit.reports.collision import to_csv
    from toolkit.workflows.dry_run import run_analysis

    _check_device(a.device)
    _check_csv(a.csv, a.force)
    _check_reports(a)
    refs = _references(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = _program(a.program, a.device, a.constant_table)
    if a.dry_run:
        s = run_analysis(prog, a.policy, device=a.device, progress=True).session
        _out(
            f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {a.policy!r}: "
            f"a prediction, nothing was loaded or run"
        )
    else:
        _say_native_code(prog)
        s = load_program(prog, a.policy, device=a.device, progress=True)
        _out(s.summary())
    _out()
    _print_frame(s.decisions[["method", "name", "fqn", "lookup", "decision", "reason"]])
    verification = None if a.dry_run else s.verify(references=refs, oracle=a.oracle, draws=a.draws, seed=a.seed)
    if verification is not None:
        _out()
        _print_frame(verification.drop(columns=["oracle_detail"]))
    verdict = s.verdict()
    if a.csv:
        to_csv(s, a.csv, verification=verification)  # verified once, above
        _out(f"\ncollision report written to {Path(a.csv).resolve()}")
    if a.html or a.junit:
        from toolkit.reports.ci import session_html_report

        _write_reports(a, [verdict], lambda: session_html_report(s, verification))
    s.close()
    _out()
    _say_verdict(verdict)
    for m in [*verdict.methods, *verdict.sequences]:
        if m.checked_against and m.checked_against != "prediction":
            _out(
                f"{getattr(m, 'method', None) or m.sequence}: checked against {m.checked_against}"
                + (f" ({m.oracle_detail})" if m.oracle_detail else "")
            )
    _out(verdict.headline())
    if verdict.no_reference:
        _out(
            f"not verified (no reference): {', '.join(verdict.no_reference)}; pass --reference METHOD=FILE.safetensors"
        )
    return int(verdict.exit_code)


SCAN_COLUMNS = ["program", "path", "policy", "status", "method", "outcome", "wrong_data", "error"]


def find_programs(root: Path) -> list[Path]:
    """Program directories (holding manifest.json), .pte and .pt2 files under ``root``, sorted."""
    from toolkit.sources.directory import MANIFEST_FILE

    found = {p.parent for p in root.rglob(MANIFEST_FILE)}
    found |= {p for p in root.rglob("*") if p.suffix in (".pte", ".pt2") and p.is_file()}
    return sorted(found)


def _failed_row(path: str, error: str) -> dict:
    from toolkit.reports.ci import UNREADABLE

    return {
        "program": "",
        "path": path,
        "policy": "",
        "status": UNREADABLE,
        "method": "",
        "outcome": UNREADABLE,
        "wrong_data": False,
        "error": error,
    }  # (runs on no data; fails the gate)


def scan_program(path: str, policies: list[str]) -> list[dict]:
    """Dry-run one program under each policy (run in a worker process): rows of SCAN_COLUMNS.

    ``outcome`` is the method's predicted outcome (its verdict), ``unreadable`` for a program that
    cannot be opened; ``wrong_data`` marks an outcome that fails the gate (exit code 1) because it
    would run wrong, not at all, or its load would fail (a program that cannot be read fails the gate
    too, yet runs on no data).  Each row also carries its policy's ``verdict`` (not a CSV column)."""
    from toolkit.core.verdict import BAD_OUTCOMES
    from toolkit.sources import open_program
    from toolkit.workflows.dry_run import run_analysis

    try:
        program = open_program(path)
        rows = []
        for policy in policies:
            s = run_analysis(program, policy).session
            verdict = s.verdict()
            for m in verdict.methods:
                rows.append(
                    {
                        "program": program.name,
                        "path": path,
                        "policy": policy,
                        "status": str(s.status),
                        "method": m.method,
                        "outcome": m.outcome.value,
                        "wrong_data": m.outcome in BAD_OUTCOMES,
                        "error": m.reason if m.outcome in BAD_OUTCOMES else "",
                        "verdict": verdict,
                    }
                )
        return rows
    except ToolkitError as e:
        return [_failed_row(path, str(e))]
    except Exception as e:  # a toolkit bug on a hostile file: this program's row fails, the scan goes on
        return [_failed_row(path, f"{type(e).__name__}: {str(e)[:300]}")]


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
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=_scan_worker
        )
        try:
            with _sigint_ignored():  # by the workers, started here: a Ctrl-C reaches the whole process group
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
            results[broken[0]] = [_failed_row(broken[0], "the worker process reading it died (killed by a signal)")]
            if on_done is not None:
                on_done(broken[0])
        again = broken[1:]
    return [r for p in paths for r in results[p]]


def _scan_worker() -> None:
    """A scan worker's setup: its (disabled) progress bars take a thread lock, not tqdm's
    default semaphore, which a worker stopped by Ctrl-C would leave to the resource tracker."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored in this process meanwhile (on the main thread): processes started then inherit it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def cmd_scan(a) -> int:
    """Dry-run every program under a folder, in parallel worker processes; exit 1 if any method
    would run on wrong data under a policy asked for (a gate for the CI of a model zoo)."""
    from toolkit.core.policies import POLICIES, get_policy
    from toolkit.core.verdict import BAD_OUTCOMES
    from toolkit.display.html import html_table
    from toolkit.display.progress import progress_bar
    from toolkit.reports.ci import UNREADABLE, html_report, scan_summary
    from toolkit.reports.collision import write_table

    _check_csv(a.csv, a.force)
    _check_reports(a)
    root = Path(a.folder)
    if not root.is_dir():
        raise ToolkitError(f"{a.folder}: not a folder")
    policies = [get_policy(p).name.value for p in (a.policies.split(",") if a.policies else POLICIES)]
    paths = [str(p) for p in find_programs(root)]
    if not paths:
        raise ToolkitError(f"{a.folder}: no program found (program directories, .pte or .pt2 files)")
    done: dict[str, list[dict]] = {}
    bar = progress_bar(total=len(paths), desc="scanning", unit="program")  # a bar on a TTY, else a line each

    def finished(path: str) -> None:
        if bar.disable:
            print(f"scanned {len(done)}/{len(paths)}: {printable(path)}", file=sys.stderr)
        bar.update(1)

    try:
        scan_rows(paths, policies, a.jobs, results=done, on_done=finished)
    except KeyboardInterrupt:
        pass  # what finished is reported below, and the exit code says interrupted
    finally:
        bar.close()
    rows = [r for path in paths for r in done.get(path, [])]
    frame = pd.DataFrame(rows, columns=SCAN_COLUMNS)
    summary = scan_summary(frame, root)
    _print_scan(summary, len(frame), a.csv or a.html)
    if a.csv:
        write_table(frame, a.csv)
        _out(f"\nscan written to {Path(a.csv).resolve()}")
    if len(done) < len(paths):
        _out(f"\ninterrupted: {len(done)} of {len(paths)} programs scanned (those above)")
        return EXIT_INTERRUPTED
    by_policy = {(r["path"], r["policy"]): r["verdict"] for r in rows if "verdict" in r}
    verdicts, labels = list(by_policy.values()), [str(Path(p).relative_to(root)) for p, _policy in by_policy]
    unreadable = {str(Path(r["path"]).relative_to(root)): r["error"] for r in rows if r["outcome"] == UNREADABLE}
    _write_reports(
        a,
        verdicts,
        lambda: html_report(
            verdicts,
            labels=labels,
            unreadable=unreadable,
            title=f"constshare scan of {a.folder}",
            tables=[("Programs: the worst outcome of each", html_table(summary, max_rows=len(paths)))],
        ),
        labels,
        unreadable,
    )
    bad = frame[frame["outcome"].isin([*BAD_OUTCOMES, UNREADABLE])]
    _out(
        f"\n{len(paths)} programs, {len(policies)} policies: "
        + (
            f"{len(bad)} method(s) would fail the gate (run wrong, not run, or not load)"
            if len(bad)
            else "every method would run on its own data"
        )
    )
    return int(ExitCode.PROBLEM if len(bad) else ExitCode.OK)


def _print_scan(summary: pd.DataFrame, rows: int, detail_in: str | None) -> None:
    """One compact row per program (its worst outcome, failing methods and policies, the first
    error shortened); every row in full goes to the CSV or the HTML report."""
    _print_frame(summary)
    if rows > len(summary):
        _out(
            f"(one row per program; {'every' if detail_in else 'for every'} program, policy and method "
            + (f"in {detail_in})" if detail_in else "pass --csv FILE or --html FILE)")
        )


def cmd_compare(a) -> int:
    from toolkit.workflows.compare import compare_policies

    _check_device(a.device)
    _check_csv(a.csv, a.force)
    _check_reports(a)
    policies = a.policies.split(",") if a.policies else None
    if policies:
        from toolkit.core.policies import get_policy

        for p in policies:
            get_policy(p)  # ValueError naming the choices, before any build or load
    refs = _references(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = _program(a.program, a.device, a.constant_table)
    if a.dry_run:
        return _dry_compare(prog, policies, a)
    _say_native_code(prog)
    comparison = compare_policies(prog, policies, device=a.device, progress=True, references=refs)
    return _show_comparison(comparison, a, "comparison")


def _show_comparison(comparison, a, what: str) -> int:
    """A comparison's table, each policy's failures and wrong data with their reasons, the CSV;
    the exit code is the worst policy's."""
    df = comparison.frame
    _print_frame(df.drop(columns=[c for c in ("error", "stage", "floor_bytes") if c in df.columns]))
    if a.csv:
        from toolkit.reports.collision import write_table

        write_table(df, a.csv)
        _out(f"\n{what} written to {Path(a.csv).resolve()}")
    _out()
    verdicts = comparison.verdicts()
    for v in verdicts.values():
        _say_verdict(v)
    if a.html or a.junit:
        from toolkit.display.html import html_table
        from toolkit.reports.ci import html_report

        _write_reports(
            a,
            list(verdicts.values()),
            lambda: html_report(
                list(verdicts.values()),
                title=f"constshare {what} of {next(iter(verdicts.values())).program if verdicts else a.program}",
                tables=[("Policies", html_table(df, max_rows=len(df)))],
            ),
        )
    bad = [name for name, v in verdicts.items() if v.exit_code is ExitCode.PROBLEM]
    what = (
        "would fail, run a method on other data or leave one not runnable"
        if what.startswith("dry")
        else "failed, ran a method wrong or left one not runnable"
    )
    _out(f"{len(bad)} of {len(df)} policies {what}: " + ", ".join(bad) if bad else f"no policy {what}")
    return int(comparison.exit_code)


def _dry_compare(prog, policies, a) -> int:
    """Every policy's predicted outcome and memory against the floor, from metadata alone."""
    from toolkit.workflows.compare import predict_policies

    comparison = predict_policies(prog, policies, device=a.device)
    df = comparison.frame
    floor = int(df["floor_bytes"].iloc[0]) if len(df) else 0
    _out(
        f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {len(df)} policies: "
        f"a prediction, nothing was loaded or run; memory floor M = {floor:,} bytes"
    )
    _out()
    return _show_comparison(comparison, a, "dry-run comparison")


def cmd_samples(a) -> int:
    from toolkit.build.samples import sample_module, sample_names

    for name in sample_names():
        first = " ".join(sample_module(name).DESCRIPTION.split())
        _out(f"{name:26s} {first[:110]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from toolkit.core.policies import POLICIES

    p = argparse.ArgumentParser(
        prog="constshare",
        description=__doc__ + EXIT_CODE_TABLE + f"\n  {EXIT_INTERRUPTED}  "
        "interrupted (Ctrl-C); scan writes what it scanned before",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="export and compile a program")
    b.add_argument("source")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    b.add_argument("--out")
    b.add_argument("--rebuild", action="store_true", help="ignore a cached sample build")
    b.set_defaults(fn=cmd_build)

    def report_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--html",
            metavar="FILE",
            help="write one self-contained HTML report (summary, alerts, culprits, tables, plots; opens offline)",
        )
        parser.add_argument(
            "--junit",
            metavar="FILE",
            help="write JUnit XML: a test case per program and method, a wrong one a failure naming its culprit",
        )

    def load_args(parser: argparse.ArgumentParser, csv_help: str, dry_help: str) -> None:
        """What report and compare both take: the program, a device, the CSV, a dry run, references."""
        parser.add_argument("--device")
        parser.add_argument("--csv", help=csv_help)
        parser.add_argument("--force", action="store_true", help="overwrite an existing --csv, --html or --junit file")
        parser.add_argument("--dry-run", action="store_true", help=dry_help)
        parser.add_argument(
            "--reference",
            action="append",
            metavar="METHOD=FILE",
            help="a method's reference (safetensors: input.N, output.N); repeat per method",
        )
        report_args(parser)
        parser.add_argument(
            "--constant-table",
            metavar="FILE",
            help="an ExecuTorch .pte of payload generation "
            "1 or 2: its constant table, JSON (default: constant_table.json beside the .pte)",
        )

    r = sub.add_parser("report", help="load under one policy: decision table and verification")
    r.add_argument("program")
    r.add_argument("--policy", default="fingerprint", choices=POLICIES)
    load_args(
        r,
        "write the collision report CSV here",
        "predict every decision from the program's metadata alone (no GPU; .pte, .pt2 too)",
    )
    r.add_argument(
        "--oracle",
        default="auto",
        choices=[o.value for o in Oracle],
        help="check each method against its reference and, without one, against its own unshared load "
        "on generated inputs (auto); references only; the unshared load for every method; "
        "the unshared load on generated inputs only",
    )
    r.add_argument("--draws", type=int, default=3, help="random input draws of a generated-input check (default 3)")
    r.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    r.set_defaults(fn=cmd_report)
    c = sub.add_parser("compare", help="load under every policy and tabulate")
    c.add_argument("program")
    c.add_argument("--policies", help="comma-separated subset of " + ", ".join(POLICIES))
    load_args(
        c, "write the comparison CSV here", "predict every policy's outcome and memory from the metadata alone (no GPU)"
    )
    c.set_defaults(fn=cmd_compare)
    sc = sub.add_parser("scan", help="dry-run every program under a folder; exit 1 if any would run on wrong data")
    sc.add_argument("folder")
    sc.add_argument("--policies", help="comma-separated subset of " + ", ".join(POLICIES))
    sc.add_argument("--csv", help="one row per program, policy and method")
    sc.add_argument("--force", action="store_true", help="overwrite an existing --csv, --html or --junit file")
    report_args(sc)
    sc.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPUs)")
    sc.set_defaults(fn=cmd_scan)
    s = sub.add_parser("samples", help="list the sample programs")
    s.set_defaults(fn=cmd_samples)
    a = p.parse_args(argv)
    try:
        return a.fn(a)
    except (ToolkitError, ValueError) as e:
        print(f"constshare: error: {printable(e)}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except KeyboardInterrupt:
        print("constshare: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
