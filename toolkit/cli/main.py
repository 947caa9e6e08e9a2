"""Load multi-method AOTInductor programs with cross-method constant sharing, and check every method.

  constshare report   PROGRAM [--policy P | --executorch V] [--dry-run] [--device D] [--tables]
                      [--csv FILE] [--html FILE] [--junit FILE] [--reference M=FILE ...] [--constant-table FILE]
  constshare compare  PROGRAM [--policies P,P,... | --executorch V] [--dry-run] [--device D] [--tables]
                      [--csv FILE] [--html FILE] [--junit FILE] [--reference M=FILE ...] [--constant-table FILE]
  constshare scan     FOLDER [--policies P,P,... | --executorch V] [--csv FILE] [--html FILE] [--junit FILE]
                      [--jobs N] [--tables]
  constshare build    SOURCE [--device cpu|cuda] [--out DIR]
  constshare table    PTE [--device cuda:N] [--force]
  constshare policies
  constshare samples

SOURCE is a sample name (see samples) or a Python file or module defining methods() as the
sample programs do. PROGRAM is a program directory, an ExecuTorch .pte, a torch .pt2, or a
sample name (built on demand into the build cache, CONSTSHARE_CACHE).

Exit codes, the same for report, compare and scan, dry run or not (compare and scan: the worst
over the policies and programs asked for; --dry-run: the prediction's):
"""

from __future__ import annotations

import argparse
import os
import sys

from toolkit.cli import commands
from toolkit.cli.terminal import EXIT_INTERRUPTED, EXIT_STDOUT_CLOSED, printable_line
from toolkit.core.errors import ToolkitError
from toolkit.core.verdict import EXIT_CODE_TABLE
from toolkit.core.vocab import ExitCode, Oracle


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, and each option's default after its help, where it has one to show
    (not an unset option's None nor an on/off switch's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action)


DEVICE_HELP = (
    "cpu, cuda or cuda:N (cuda: the current CUDA device); default: the device the program was built for "
    "(a sample name is built for cpu unless --device names cuda)"
)


def _stdout_closed() -> int:
    """stdout was closed before the output ended (``constshare ... | head -1``): stop quietly.  stdout
    then points at the null device, so the interpreter's flush at exit does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind sys.stdout: nothing left to flush there
        pass
    return EXIT_STDOUT_CLOSED


def main(argv: list[str] | None = None) -> int:
    from toolkit.core.policies import POLICIES

    p = argparse.ArgumentParser(
        prog="constshare",
        description=__doc__ + EXIT_CODE_TABLE + f"\n  {EXIT_INTERRUPTED}  "
        "interrupted (Ctrl-C); scan writes what it scanned before"
        f"\n  {EXIT_STDOUT_CLOSED}  stdout closed before the output ended (| head): output cut short, no verdict",
        formatter_class=HelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="export and compile a program", formatter_class=HelpFormatter)
    b.add_argument("source", help="a sample name (see samples), a .py file, or an importable module")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the device to compile for")
    b.add_argument("--out")
    b.add_argument("--rebuild", action="store_true", help="ignore a cached sample build")
    b.set_defaults(fn=commands.cmd_build)

    def follow_links_arg(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--follow-links",
            action="store_true",
            help="write a --csv, --html or --junit path that is a symbolic link to the link's target "
            "(refused by default: a planted link would redirect the report)",
        )

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

    def executorch_arg(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--executorch",
            metavar="VERSION",
            help="answer for what this ExecuTorch release runs (e.g. 1.5.1, 1.4); see `constshare policies`",
        )

    def tables_arg(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--tables", "--verbose", action="store_true", help="also print the full tables after the findings"
        )

    def load_args(parser: argparse.ArgumentParser, csv_help: str, dry_help: str) -> None:
        """What report and compare both take: the program, a device, the CSV, a dry run, references."""
        parser.add_argument("--device", help=DEVICE_HELP)
        parser.add_argument("--csv", help=csv_help)
        parser.add_argument("--force", action="store_true", help="overwrite an existing --csv, --html or --junit file")
        follow_links_arg(parser)
        parser.add_argument("--dry-run", action="store_true", help=dry_help)
        parser.add_argument(
            "--reference",
            action="append",
            metavar="METHOD=FILE",
            help="a method's reference (safetensors: input.N, output.N); repeat per method",
        )
        report_args(parser)
        tables_arg(parser)
        parser.add_argument(
            "--constant-table",
            metavar="FILE",
            help="an ExecuTorch .pte of payload generation "
            "1 or 2: its constant table, JSON (default: constant_table.json beside the .pte)",
        )

    r = sub.add_parser(
        "report", help="load under one policy: decision table and verification", formatter_class=HelpFormatter
    )
    r.add_argument("program")
    r.add_argument(
        "--policy",
        choices=POLICIES,
        help="the constant-sharing policy (default: for a .pte, what the ExecuTorch releases that read its payload "
        "run with sharing on; otherwise fingerprint); see `constshare policies`",
    )
    executorch_arg(r)
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
    r.add_argument("--draws", type=int, default=3, help="random input draws of a generated-input check")
    r.add_argument("--seed", type=int, default=0, help="seed of the generated inputs")
    r.set_defaults(fn=commands.cmd_report)
    c = sub.add_parser("compare", help="load under every policy and tabulate", formatter_class=HelpFormatter)
    c.add_argument("program")
    c.add_argument("--policies", help="comma-separated subset of " + ", ".join(POLICIES) + " (default: all)")
    executorch_arg(c)
    load_args(
        c, "write the comparison CSV here", "predict every policy's outcome and memory from the metadata alone (no GPU)"
    )
    c.set_defaults(fn=commands.cmd_compare)
    sc = sub.add_parser(
        "scan",
        help="dry-run every program under a folder; exit 1 if any would run on wrong data",
        formatter_class=HelpFormatter,
    )
    sc.add_argument("folder")
    sc.add_argument("--policies", help="comma-separated subset of " + ", ".join(POLICIES) + " (default: all)")
    executorch_arg(sc)
    tables_arg(sc)
    sc.add_argument("--csv", help="one row per program, policy and method")
    sc.add_argument("--force", action="store_true", help="overwrite an existing --csv, --html or --junit file")
    follow_links_arg(sc)
    report_args(sc)
    sc.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: the CPUs, %(default)s here)"
    )
    sc.set_defaults(fn=commands.cmd_scan)
    t = sub.add_parser(
        "table",
        help="read a generation-1/2 .pte's constant tables from its .so files (CUDA) into constant_table.json",
        formatter_class=HelpFormatter,
    )
    t.add_argument("pte", help="an ExecuTorch .pte whose payload keeps its constant table only in the .so")
    t.add_argument("--device", help="the CUDA device to read on (cuda or cuda:N; default cuda)")
    t.add_argument("--force", action="store_true", help="replace an existing constant_table.json")
    t.set_defaults(fn=commands.cmd_table)
    pol = sub.add_parser(
        "policies",
        help="list the policies with the ExecuTorch releases and settings that run them",
        formatter_class=HelpFormatter,
    )
    pol.set_defaults(fn=commands.cmd_policies)
    s = sub.add_parser("samples", help="list the sample programs", formatter_class=HelpFormatter)
    s.set_defaults(fn=commands.cmd_samples)
    try:
        a = p.parse_args(argv)
    except BrokenPipeError:  # --help into a closed pipe
        return _stdout_closed()
    # An output path that cannot be checked or written raises OutputError (a ToolkitError) from
    # toolkit.reports.output, so it ends here in one line with exit 2, not in a traceback with exit 1.
    try:
        code = a.fn(a)
        sys.stdout.flush()  # a closed stdout shows here, not in the interpreter's flush at exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except (ToolkitError, ValueError) as e:
        print(f"constshare: error: {printable_line(e)}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except KeyboardInterrupt:
        print("constshare: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
