"""Load multi-method AOTInductor programs with cross-method constant sharing, and check every method.

  constshare build   SOURCE [--device cpu|cuda] [--out DIR]
  constshare report  PROGRAM [--policy P] [--device D] [--csv FILE] [--dry-run] [--reference M=FILE ...]
  constshare compare PROGRAM [--policies P,P,...] [--device D] [--csv FILE] [--dry-run] [--reference M=FILE ...]
  constshare scan    FOLDER [--policies P,P,...] [--csv FILE] [--jobs N]
  constshare samples

SOURCE is a sample name (see samples) or a Python file or module defining methods() as the
sample programs do. PROGRAM is a program directory, an ExecuTorch .pte, a torch .pt2, or a
sample name (built on demand into the build cache, CONSTSHARE_CACHE).

Exit codes, the same for report, compare and scan, dry run or not (compare and scan: the worst
over the policies and programs asked for; --dry-run: the prediction's):
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pandas as pd

from .errors import ToolkitError
from .verdict import EXIT_CODE_TABLE, BlameStatus, ExitCode, MethodOutcome
from .vocab import Stage

# C0 controls (but newline and tab) and C1 controls: a name holding ESC [ ... could
# rewrite the terminal; they are printed escaped.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]}


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


def _program(ref: str, device: str | None):
    from .sources import open_program
    from .samples import build_sample, sample_names

    if Path(ref).exists():  # a program directory, or a file of another format (.pte, .pt2)
        return open_program(ref)
    if ref in sample_names():
        kind = "cuda" if device and device.startswith("cuda") else "cpu"
        return build_sample(ref, device=kind, progress=True)
    raise ToolkitError(f"{ref}: neither a program (directory, .pte or .pt2) nor a sample "
                       f"({', '.join(sample_names())})")


def _print_frame(df: pd.DataFrame) -> None:
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 70,
                           "display.max_rows", 500):
        _out(df.to_string(index=False))


def _check_device(device: str | None) -> None:
    from .runtimes import parse_device

    if device is not None:
        parse_device(device)  # ValueError naming the choices


def _check_csv(path: str | None, force: bool) -> None:
    """Refuse a CSV target before any work: empty, a folder, a missing folder, or (without --force) a file."""
    if path is None:
        return
    if not path.strip():
        raise ToolkitError("--csv: an empty path")
    p = Path(path)
    if p.is_dir():
        raise ToolkitError(f"--csv {path}: is a folder; give a file name inside it")
    if not p.parent.is_dir():
        raise ToolkitError(f"--csv {path}: folder {str(p.parent)!r} does not exist")
    if p.exists() and not force:
        raise ToolkitError(f"--csv {path}: exists already; pass --force to overwrite it")


def cmd_build(a) -> int:
    from .builder import build_program
    from .samples import build_sample, cache_root, sample_names

    if a.source in sample_names() and a.out is None:
        prog = build_sample(a.source, device=a.device, progress=True, rebuild=a.rebuild)
    else:
        mod = _load_source_module(a.source)
        out = Path(a.out) if a.out else cache_root() / f"{Path(a.source).stem}-{a.device}"
        prog = build_program(mod.methods(), out, device=a.device, name=Path(a.source).stem,
                             description=(getattr(mod, "DESCRIPTION", "") or "").strip(), overwrite=True)
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
            _out(f"{v.policy}: {m.method} not runnable (an installed tensor cannot fill its slot; upstream would "
                 f"read out of bounds): {m.reason}")
        elif m.outcome is MethodOutcome.FAILED and m.stage is Stage.RUN:
            _out(f"{v.policy}: {m.method} failed to run: {m.reason}")
    for c in v.constants:
        if c.problem is not None and (c.problem.standalone or c.blame is BlameStatus.CULPRIT):
            _out(f"{v.policy}: {c.method} runs on other data for {c.name}"
                 + (f" ({c.fqn})" if c.fqn and c.fqn != c.name else "") + f", {c.problem.value}: {c.evidence}"
                 + (f" [{c.blame.value}: {c.blame_note}]" if c.blame_note else ""))


def cmd_report(a) -> int:
    """One policy: the decisions, the verification (a dry run: the prediction), the verdict; the
    collision report CSV (the same columns for a dry run, ``method_outcome`` predicted)."""
    from .analysis import run_analysis
    from .report import to_csv
    from .session import load_program

    _check_device(a.device)
    _check_csv(a.csv, a.force)
    refs = _references(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = _program(a.program, a.device)
    if a.dry_run:
        s = run_analysis(prog, a.policy, device=a.device).session
        _out(f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {a.policy!r}: "
             f"a prediction, nothing was loaded or run")
    else:
        s = load_program(prog, a.policy, device=a.device, progress=True)
        _out(s.summary())
    _out()
    _print_frame(s.decisions[["method", "name", "fqn", "lookup", "decision", "reason"]])
    verification = None if a.dry_run else s.verify(references=refs)
    if verification is not None:
        _out()
        _print_frame(verification)
    verdict = s.verdict()
    if a.csv:
        to_csv(s, a.csv, verification=verification)  # verified once, above
        _out(f"\ncollision report written to {Path(a.csv).resolve()}")
    s.close()
    _out()
    _say_verdict(verdict)
    _out(verdict.headline())
    if verdict.no_reference:
        _out(f"not verified (no reference): {', '.join(verdict.no_reference)}; pass --reference "
             "METHOD=FILE.safetensors")
    return int(verdict.exit_code)


SCAN_COLUMNS = ["program", "path", "policy", "status", "method", "outcome", "wrong_data", "error"]


def find_programs(root: Path) -> list[Path]:
    """Program directories (holding manifest.json), .pte and .pt2 files under ``root``, sorted."""
    from .sources.directory import MANIFEST_FILE

    found = {p.parent for p in root.rglob(MANIFEST_FILE)}
    found |= {p for p in root.rglob("*") if p.suffix in (".pte", ".pt2") and p.is_file()}
    return sorted(found)


def _failed_row(path: str, error: str) -> dict:
    return {"program": "", "path": path, "policy": "", "status": "unreadable", "method": "",
            "outcome": "unreadable", "wrong_data": True, "error": error}


def scan_program(path: str, policies: list[str]) -> list[dict]:
    """Dry-run one program under each policy (run in a worker process): rows of SCAN_COLUMNS.

    ``outcome`` is the method's predicted outcome (its verdict); ``wrong_data`` marks an outcome
    that fails the gate (exit code 1): it would run wrong or not at all, its load would fail,
    or the program cannot be read."""
    from .analysis import run_analysis
    from .sources import open_program
    from .verdict import BAD_OUTCOMES

    try:
        program = open_program(path)
        rows = []
        for policy in policies:
            s = run_analysis(program, policy).session
            for m in s.verdict().methods:
                rows.append({"program": program.name, "path": path, "policy": policy, "status": str(s.status),
                             "method": m.method, "outcome": m.outcome.value, "wrong_data": m.outcome in BAD_OUTCOMES,
                             "error": m.reason if m.outcome in BAD_OUTCOMES else ""})
        return rows
    except ToolkitError as e:
        return [_failed_row(path, str(e))]
    except Exception as e:  # a toolkit bug on a hostile file: this program's row fails, the scan goes on
        return [_failed_row(path, f"{type(e).__name__}: {str(e)[:300]}")]


def scan_rows(paths: list[str], policies: list[str], jobs: int, scan=scan_program) -> list[dict]:
    """``scan``'s rows of every program, in ``paths`` order, from worker processes.

    A worker that dies (killed by a signal) breaks its pool and every program in flight there;
    those run again, one worker at a time, so the program that kills it again is known: its row
    fails and the scan carries on."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    results: dict[str, list[dict]] = {}

    def run(batch: list[str], workers: int) -> list[str]:  # the programs the pool broke on, in order
        broken = []
        # spawn, not fork: the calling process may hold torch's threads (a notebook, the test suite)
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for path, future in [(p, pool.submit(scan, p, policies)) for p in batch]:
                try:
                    results[path] = future.result()
                except BrokenProcessPool:
                    broken.append(path)
        return broken

    again = run(paths, max(1, min(jobs, len(paths))))
    while again:  # one worker: the programs before the first broken one finished, so that one killed it
        broken = run(again, 1)
        if broken:
            results[broken[0]] = [_failed_row(broken[0], "the worker process reading it died (killed by a signal)")]
        again = broken[1:]
    return [r for p in paths for r in results[p]]


def cmd_scan(a) -> int:
    """Dry-run every program under a folder, in parallel worker processes; exit 1 if any method
    would run on wrong data under a policy asked for (a gate for the CI of a model zoo)."""
    from .policies import POLICIES, get_policy

    _check_csv(a.csv, a.force)
    root = Path(a.folder)
    if not root.is_dir():
        raise ToolkitError(f"{a.folder}: not a folder")
    policies = [get_policy(p).name.value for p in (a.policies.split(",") if a.policies else POLICIES)]
    paths = [str(p) for p in find_programs(root)]
    if not paths:
        raise ToolkitError(f"{a.folder}: no program found (program directories, .pte or .pt2 files)")
    rows = scan_rows(paths, policies, a.jobs)
    frame = pd.DataFrame(rows, columns=SCAN_COLUMNS)
    _print_frame(frame.drop(columns=["program"]))  # the path says which program
    if a.csv:
        frame.to_csv(a.csv, index=False)
        _out(f"\nscan written to {Path(a.csv).resolve()}")
    bad = frame[frame["wrong_data"]]
    _out(f"\n{len(paths)} programs, {len(policies)} policies: "
         + (f"{len(bad)} method(s) would fail the gate (run wrong, not run, or not load)" if len(bad)
            else "every method would run on its own data"))
    return int(ExitCode.PROBLEM if len(bad) else ExitCode.OK)


def cmd_compare(a) -> int:
    from .compare import compare_policies

    _check_device(a.device)
    _check_csv(a.csv, a.force)
    policies = a.policies.split(",") if a.policies else None
    if policies:
        from .policies import get_policy

        for p in policies:
            get_policy(p)  # ValueError naming the choices, before any build or load
    refs = _references(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = _program(a.program, a.device)
    if a.dry_run:
        return _dry_compare(prog, policies, a)
    comparison = compare_policies(prog, policies, device=a.device, progress=True, references=refs)
    return _show_comparison(comparison, a, "comparison")


def _show_comparison(comparison, a, what: str) -> int:
    """A comparison's table, each policy's failures and wrong data with their reasons, the CSV;
    the exit code is the worst policy's."""
    df = comparison.frame
    _print_frame(df.drop(columns=[c for c in ("error", "stage", "floor_bytes") if c in df.columns]))
    if a.csv:
        df.to_csv(a.csv, index=False)
        _out(f"\n{what} written to {Path(a.csv).resolve()}")
    _out()
    verdicts = comparison.verdicts()
    for v in verdicts.values():
        _say_verdict(v)
    bad = [name for name, v in verdicts.items() if v.exit_code is ExitCode.PROBLEM]
    what = "would fail, run a method on other data or leave one not runnable" if what.startswith("dry") else \
        "failed, ran a method wrong or left one not runnable"
    _out(f"{len(bad)} of {len(df)} policies {what}: " + ", ".join(bad) if bad else f"no policy {what}")
    return int(comparison.exit_code)


def _dry_compare(prog, policies, a) -> int:
    """Every policy's predicted outcome and memory against the floor, from metadata alone."""
    from .compare import predict_policies

    comparison = predict_policies(prog, policies, device=a.device)
    df = comparison.frame
    floor = int(df["floor_bytes"].iloc[0]) if len(df) else 0
    _out(f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {len(df)} policies: "
         f"a prediction, nothing was loaded or run; memory floor M = {floor:,} bytes")
    _out()
    return _show_comparison(comparison, a, "dry-run comparison")


def cmd_samples(a) -> int:
    from .samples import sample_module, sample_names

    for name in sample_names():
        first = " ".join(sample_module(name).DESCRIPTION.split())
        _out(f"{name:26s} {first[:110]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .policies import POLICIES

    p = argparse.ArgumentParser(prog="constshare", description=__doc__ + EXIT_CODE_TABLE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="export and compile a program")
    b.add_argument("source")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    b.add_argument("--out")
    b.add_argument("--rebuild", action="store_true", help="ignore a cached sample build")
    b.set_defaults(fn=cmd_build)
    def load_args(parser: argparse.ArgumentParser, csv_help: str, dry_help: str) -> None:
        """What report and compare both take: the program, a device, the CSV, a dry run, references."""
        parser.add_argument("--device")
        parser.add_argument("--csv", help=csv_help)
        parser.add_argument("--force", action="store_true", help="overwrite an existing --csv file")
        parser.add_argument("--dry-run", action="store_true", help=dry_help)
        parser.add_argument("--reference", action="append", metavar="METHOD=FILE",
                            help="a method's reference (safetensors: input.N, output.N); repeat per method")

    r = sub.add_parser("report", help="load under one policy: decision table and verification")
    r.add_argument("program")
    r.add_argument("--policy", default="fingerprint", choices=POLICIES)
    load_args(r, "write the collision report CSV here",
              "predict every decision from the program's metadata alone (no GPU; .pte, .pt2 too)")
    r.set_defaults(fn=cmd_report)
    c = sub.add_parser("compare", help="load under every policy and tabulate")
    c.add_argument("program")
    c.add_argument("--policies", help="comma-separated subset of " + ", ".join(POLICIES))
    load_args(c, "write the comparison CSV here",
              "predict every policy's outcome and memory from the metadata alone (no GPU)")
    c.set_defaults(fn=cmd_compare)
    sc = sub.add_parser("scan", help="dry-run every program under a folder; exit 1 if any would run on wrong data")
    sc.add_argument("folder")
    sc.add_argument("--policies", help="comma-separated subset of " + ", ".join(POLICIES))
    sc.add_argument("--csv", help="one row per program, policy and method")
    sc.add_argument("--force", action="store_true", help="overwrite an existing --csv file")
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


if __name__ == "__main__":
    sys.exit(main())
