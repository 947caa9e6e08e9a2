"""Command line: ``python -m toolkit`` or ``constshare``.

    constshare build   SOURCE [--device cpu|cuda] [--out DIR]
    constshare report  PROGRAM [--policy P] [--device D] [--csv FILE] [--dry-run] [--reference M=FILE ...]
    constshare compare PROGRAM [--policies P,P,...] [--device D] [--csv FILE] [--dry-run] [--reference M=FILE ...]
    constshare scan    FOLDER [--policies P,P,...] [--csv FILE] [--jobs N]
    constshare samples

SOURCE is a sample name (see ``samples``) or a Python file / module defining
``methods()`` like the sample programs do.  PROGRAM is a program directory, an ExecuTorch
``.pte`` or a torch ``.pt2``, or a sample name, which is built on demand into the cache
(CONSTSHARE_CACHE).

Exit codes: 0 every check passed; 1 a load failed, or a method ran wrong (with ``--dry-run``:
a load would fail, or a method would run on a shared constant whose content differs); 2 bad
arguments or a program that cannot be read; 3 (``report`` of a real load) nothing wrong was
found, but some method had no reference to check against (pass ``--reference``).
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


EXIT_NO_REFERENCE = 3


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


def cmd_report(a) -> int:
    from .loader import load_program

    _check_device(a.device)
    _check_csv(a.csv, a.force)
    refs = _references(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = _program(a.program, a.device)
    if a.dry_run:
        return _dry_report(prog, a)
    s = load_program(prog, a.policy, device=a.device, progress=True)
    _out(s.summary())
    _out()
    _print_frame(s.decisions[["method", "name", "fqn", "lookup", "decision", "reason"]])
    _out()
    verdict = s.verify(references=refs)
    _print_frame(verdict)
    if a.csv:
        from .report import to_csv

        to_csv(s, a.csv, verification=verdict)  # verified once, above
        _out(f"\ncollision report written to {Path(a.csv).resolve()}")
    s.close()
    ok = verdict["ok"]
    if s.load_outcome != "loaded" or ok.eq(False).any():
        return 1
    if ok.isna().any():  # nothing wrong found, but not everything was checked: not a pass
        _out(f"\nnot verified (no reference): {', '.join(verdict[ok.isna()]['method'])}; pass --reference "
             "METHOD=FILE.safetensors")
        return EXIT_NO_REFERENCE
    return 0


def _dry_report(prog, a) -> int:
    """Every decision a load would take, from the program's metadata alone (no GPU, nothing run).

    Exits 1 when the load would fail, some method would run on a shared constant whose content
    differs (the silent corruption a dry run can see), or a method would be not runnable (an
    installed tensor cannot fill its slot: upstream reads out of bounds); 0 otherwise."""
    from .analysis import run_analysis

    r = run_analysis(prog, a.policy, device=a.device)
    d = r.decisions
    _out(f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {a.policy!r}: {r.status}")
    _out()
    _print_frame(d[["method", "name", "fqn", "lookup", "decision", "reason"]])
    blocked = {m.method for m in r.methods if str(m.status) == "loaded" and not m.runnable}  # never run
    suspect = d[(d["decision"] == "shared") & (d["cached_digest"] != "") & (d["cached_digest"] != d["digest"])
                & ~d["method"].isin(blocked)]
    if len(suspect):
        _out(f"\n{len(suspect)} shared although the content differs: "
             + ", ".join(f"{m}/{n}" for m, n in zip(suspect["method"], suspect["name"])))
    if blocked:
        _out(f"\nnot runnable (an installed tensor cannot fill its slot; upstream would read out of bounds): "
             + ", ".join(sorted(blocked)))
    if a.csv:
        d.to_csv(a.csv, index=False)
        _out(f"\ndry-run decisions written to {Path(a.csv).resolve()}")
    return 0 if r.status == "loaded" and not len(suspect) and not blocked else 1


SCAN_COLUMNS = ["program", "path", "policy", "status", "method", "method_status", "wrong_data", "error"]


def find_programs(root: Path) -> list[Path]:
    """Program directories (holding manifest.json), .pte and .pt2 files under ``root``, sorted."""
    from .sources.directory import MANIFEST_FILE

    found = {p.parent for p in root.rglob(MANIFEST_FILE)}
    found |= {p for p in root.rglob("*") if p.suffix in (".pte", ".pt2") and p.is_file()}
    return sorted(found)


def scan_program(path: str, policies: list[str]) -> list[dict]:
    """Dry-run one program under each policy (run in a worker process): rows of SCAN_COLUMNS.

    ``wrong_data`` marks a method that would run on a shared constant whose content differs,
    or an unknown outcome (a program that cannot be read, a refused load)."""
    from .analysis import run_analysis
    from .sources import open_program

    rows = []
    try:
        program = open_program(path)
    except ToolkitError as e:
        return [{"program": "", "path": path, "policy": "", "status": "unreadable", "method": "",
                 "method_status": "", "wrong_data": True, "error": str(e)}]
    for policy in policies:
        r = run_analysis(program, policy)
        d = r.decisions
        for m in r.methods:
            rows_m = d[d["method"] == m.method]
            # a method the toolkit's guard blocks would, upstream, read a tensor that cannot fill its slot
            blocked = str(m.status) == "loaded" and not m.runnable
            wrong = blocked or bool(((rows_m["decision"] == "shared") & (rows_m["cached_digest"] != "")
                                     & (rows_m["cached_digest"] != rows_m["digest"])).any())
            rows.append({"program": program.name, "path": path, "policy": policy, "status": str(r.status),
                         "method": m.method, "method_status": str(m.status), "wrong_data": wrong,
                         "error": m.error})
    return rows


def cmd_scan(a) -> int:
    """Dry-run every program under a folder, in parallel worker processes; exit 1 if any method
    would run on wrong data under a policy asked for (a gate for the CI of a model zoo)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from .policies import POLICIES, get_policy

    _check_csv(a.csv, a.force)
    root = Path(a.folder)
    if not root.is_dir():
        raise ToolkitError(f"{a.folder}: not a folder")
    policies = [get_policy(p).name.value for p in (a.policies.split(",") if a.policies else POLICIES)]
    paths = [str(p) for p in find_programs(root)]
    if not paths:
        raise ToolkitError(f"{a.folder}: no program found (program directories, .pte or .pt2 files)")
    # spawn, not fork: the calling process may hold torch's threads (a notebook, the test suite)
    with ProcessPoolExecutor(max_workers=max(1, min(a.jobs, len(paths))),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = [r for result in pool.map(scan_program, paths, [policies] * len(paths)) for r in result]
    frame = pd.DataFrame(rows, columns=SCAN_COLUMNS)
    _print_frame(frame.drop(columns=["program"]))  # the path says which program
    if a.csv:
        frame.to_csv(a.csv, index=False)
        _out(f"\nscan written to {Path(a.csv).resolve()}")
    bad = frame[frame["wrong_data"]]
    _out(f"\n{len(paths)} programs, {len(policies)} policies: "
         + (f"{len(bad)} method(s) would run on wrong data" if len(bad) else "no method would run on wrong data"))
    return 1 if len(bad) else 0


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
    df = compare_policies(prog, policies, device=a.device, progress=True, references=refs).frame
    _print_frame(df.drop(columns=["error"]))
    if a.csv:
        df.to_csv(a.csv, index=False)
        _out(f"\ncomparison written to {Path(a.csv).resolve()}")
    return 0


def _dry_compare(prog, policies, a) -> int:
    """Every policy's predicted outcome and memory against the floor, from metadata alone.

    Exits 1 when some policy's load would fail, would run a method on a shared constant whose
    content differs, or would leave a method not runnable (as ``report --dry-run`` does for one
    policy); 0 otherwise."""
    from .compare import predict_policies

    df = predict_policies(prog, policies, device=a.device).frame
    floor = int(df["floor_bytes"].iloc[0]) if len(df) else 0
    _out(f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {len(df)} policies; "
         f"memory floor M = {floor:,} bytes")
    _out()
    _print_frame(df.drop(columns=["error", "floor_bytes"]))
    for r in df[df["error"] != ""].itertuples():
        _out(f"\n{r.policy}: fails at stage {r.stage!r}: {r.error}")
    if a.csv:
        df.to_csv(a.csv, index=False)
        _out(f"\ndry-run comparison written to {Path(a.csv).resolve()}")
    bad = df[(df["status"] != "loaded") | df["runs_on_other_data"].map(bool) | df["not_runnable"].map(bool)]
    what = "fail, run a method on other data or leave one not runnable"
    _out("\n" + (f"{len(bad)} of {len(df)} policies would {what}: " + ", ".join(bad["policy"]) if len(bad)
                 else f"no policy would {what}"))
    if df["not_runnable"].map(bool).any():
        _out("(not runnable: an installed tensor cannot fill its slot; upstream would read out of bounds)")
    return 1 if len(bad) else 0


def cmd_samples(a) -> int:
    from .samples import sample_module, sample_names

    for name in sample_names():
        first = " ".join(sample_module(name).DESCRIPTION.split())
        _out(f"{name:26s} {first[:110]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .policies import POLICIES

    p = argparse.ArgumentParser(prog="constshare", description=__doc__.split("\n\n")[0])
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
        return 2


if __name__ == "__main__":
    sys.exit(main())
