"""The commands: each parses nothing, calls a workflow, prints its answer and returns the exit code."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from toolkit.cli.answer import answer_line, policy_rows, say_findings, say_not_checked, say_table, say_wrapped
from toolkit.cli.arguments import (
    check_device,
    check_output_option,
    check_reports,
    load_source_module,
    output_options,
    program_from,
    references_from,
    write_reports,
)
from toolkit.cli.policy_choice import policies_for_compare
from toolkit.cli.terminal import EXIT_INTERRUPTED, print_frame, say, say_line, say_native_code, shown
from toolkit.core.errors import ToolkitError
from toolkit.core.vocab import UNREADABLE, ExitCode

QUIET_PROGRESS_S = 30.0  # seconds between scan's progress lines where stderr is not a terminal


def cmd_build(a) -> int:
    from toolkit.build.builder import build_program
    from toolkit.build.samples import build_sample, private_cache_root, sample_names

    if a.source in sample_names() and a.out is None:
        prog = build_sample(a.source, device=a.device, progress=True, rebuild=a.rebuild)
    else:
        mod = load_source_module(a.source)
        out = Path(a.out) if a.out else private_cache_root() / f"{Path(a.source).stem}-{a.device}"
        prog = build_program(
            mod.methods(),
            out,
            device=a.device,
            name=Path(a.source).stem,
            description=(getattr(mod, "DESCRIPTION", "") or "").strip(),
            overwrite=True,
        )
    say(prog.root)
    return 0


def _say_tail(code: int, *, tables: bool, extra: str = "") -> None:
    """The last line: the exit code and what it means, then where the detail is."""
    from toolkit.core.verdict import EXIT_CODE_MEANINGS

    say()
    say_wrapped(f"exit {code}: {EXIT_CODE_MEANINGS[ExitCode(code)]}", rest="  ")
    if not tables:
        say_wrapped(f"(decision tables: --tables{extra})")


def cmd_report(a) -> int:
    """One policy: the answer and its findings first, then each method's outcome; the decisions with
    ``--tables``; the collision report CSV (the same columns for a dry run, ``method_outcome`` predicted)."""
    from toolkit.cli.policy_choice import fix_line, policy_for_report
    from toolkit.engine.session import load_program
    from toolkit.reports.collision import to_csv
    from toolkit.workflows.dry_run import dry_run

    check_device(a.device)
    check_output_option(a.csv, a.force, follow_links=a.follow_links)
    check_reports(a)
    refs = references_from(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = program_from(a.program, a.device, a.constant_table, real_load=not a.dry_run)
    policy, chosen = policy_for_report(prog, a)
    if a.dry_run:
        s = dry_run(prog, policy, device=a.device, progress=True).session
    else:
        say_native_code(prog)
        s = load_program(prog, policy, device=a.device, progress=True)
    verification = None if a.dry_run else s.verify(references=refs, oracle=a.oracle, draws=a.draws, seed=a.seed)
    verdict = s.verdict()
    say_wrapped(verdict.headline(), rest="    ", whole_words=True)
    say_wrapped(chosen, indent="  ", rest="    ")
    say_findings([verdict], None, by_program=False)
    say_not_checked([verdict], None, by_program=False)
    fix = fix_line(prog, verdict, device=a.device)
    if fix:
        say_wrapped(fix)
    say("methods:")
    say_table(method_rows(verdict, verification))
    if a.tables:
        say()
        say(
            f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {policy!r}: "
            "a prediction, nothing was loaded or run"
            if a.dry_run
            else s.summary()
        )
        print_frame(s.decisions[["method", "name", "fqn", "lookup", "decision", "reason"]])
        if verification is not None:
            say()
            print_frame(verification.drop(columns=["oracle_detail"]))
        for m in [*verdict.methods, *verdict.sequences]:
            if m.oracle_detail:
                say_wrapped(f"{getattr(m, 'method', None) or m.sequence}: {m.oracle_detail}")
    if a.csv:
        to_csv(s, a.csv, verification=verification, **output_options(a))  # verified once, above
        say(f"\ncollision report written to {shown(Path(a.csv).resolve())}")
    if a.html or a.junit:
        from toolkit.reports.html import html_report_of_session

        write_reports(a, [verdict], lambda: html_report_of_session(s, verification, csv=a.csv))
    s.close()
    _say_tail(int(verdict.exit_code), tables=a.tables, extra="" if a.csv else "; every row: --csv FILE")
    return int(verdict.exit_code)


def method_rows(verdict, verification) -> pd.DataFrame:
    """One row per method and sequence: its outcome, what it was checked against, its error."""
    errors = {}
    if verification is not None and "max_abs_err" in verification:
        errors = {r["method"]: r["max_abs_err"] for r in verification.to_dict("records")}
    rows = [
        {
            "method": m.method,
            "outcome": m.outcome.value,
            "checked against": m.checked_against,
            "max abs err": "" if pd.isna(errors.get(m.method)) else f"{errors.get(m.method):.3g}",
            "reason": m.reason,
        }
        for m in verdict.methods
    ]
    rows += [
        {
            "method": f"sequence {q.sequence}",
            "outcome": q.outcome.value,
            "checked against": q.checked_against,
            "max abs err": "",
            "reason": q.reason,
        }
        for q in verdict.sequences
    ]
    table = pd.DataFrame(rows, columns=["method", "outcome", "checked against", "max abs err", "reason"])
    return table.drop(columns=[c for c in table.columns if (table[c] == "").all()])


def cmd_scan(a) -> int:
    """Dry-run every program under a folder, in parallel worker processes; exit 1 if any method
    would run on wrong data under a policy asked for (a gate for the CI of a model zoo)."""
    from toolkit.core.policies import POLICIES, get_policy
    from toolkit.display.progress import progress_bar
    from toolkit.display.tables import html_table
    from toolkit.reports.html import LoadFrames, html_report
    from toolkit.reports.summary import scan_summary
    from toolkit.reports.tabular import write_table
    from toolkit.workflows.scan import scan_folder

    check_output_option(a.csv, a.force, follow_links=a.follow_links)
    check_reports(a)
    policies = [get_policy(p).name.value for p in (policies_for_compare(None, a) or POLICIES)]
    bars, finished = [], []  # the progress bar, made once the scan knows how many programs it found

    def on_start(total: int) -> None:
        bars.append(progress_bar(total=total, desc="scanning", unit="program"))  # a bar on a TTY, else a line each

    last = [-QUIET_PROGRESS_S]  # the first program done is said at once

    def on_done(path: str) -> None:
        finished.append(path)
        # not a TTY (a CI log): no bar, and a line only every QUIET_PROGRESS_S, so a long scan shows it lives
        if bars[0].disable and time.monotonic() - last[0] >= QUIET_PROGRESS_S:
            last[0] = time.monotonic()
            print(f"constshare: scanned {len(finished)} of {bars[0].total} programs", file=sys.stderr)
        bars[0].update(1)

    try:
        scan = scan_folder(a.folder, policies, jobs=a.jobs, on_start=on_start, on_done=on_done)
    finally:
        for bar in bars:
            bar.close()
    frame = scan.frame
    summary = scan_summary(frame, scan.root)
    verdicts, labels = scan.verdicts()
    unreadable = scan.unreadable
    if scan.interrupted:
        say(f"interrupted: {scan.scanned} of {len(scan.paths)} programs scanned (those below)")
    say_wrapped(
        f"{len(scan.paths)} programs, {len(policies)} policies: "
        + answer_line_of_scan(summary, unreadable)
        + f"; exit {EXIT_INTERRUPTED if scan.interrupted else int(scan.exit_code)}"
    )
    say_findings(verdicts, labels, by_program=True)
    say_not_checked(verdicts, labels, by_program=True)
    say("programs:")
    say_table(program_rows(summary, verdicts, labels, scan))
    if a.tables:
        say()
        print_frame(summary)
    if a.csv:
        write_table(frame, a.csv, **output_options(a))
        say(f"\nscan written to {shown(Path(a.csv).resolve())}")
    if scan.interrupted:
        return EXIT_INTERRUPTED
    write_reports(
        a,
        verdicts,
        lambda: html_report(
            verdicts,
            labels=labels,
            unreadable=unreadable,
            title=f"constshare scan of {a.folder}",
            tables=[("Programs: the worst outcome of each", html_table(summary, max_rows=len(scan.paths)))],
            loads=[LoadFrames(decisions, None, nbytes) for decisions, nbytes in scan.dry_runs()],
            csv=a.csv,
        ),
        labels,
        unreadable,
    )
    _say_tail(int(scan.exit_code), tables=a.tables, extra="" if a.csv else "; every row: --csv FILE")
    return int(scan.exit_code)


def answer_line_of_scan(summary: pd.DataFrame, unreadable) -> str:
    """How many programs fail the gate under some policy (or cannot be read), or that none does."""
    from toolkit.core.verdict import BAD_OUTCOMES

    bad = summary[summary["outcome"].isin([*BAD_OUTCOMES, UNREADABLE])]
    if not len(bad):
        return "every program would run each method on its own data (predicted)"
    return f"{len(bad)} of {len(summary)} programs would fail the gate under some policy (predicted)"


def program_rows(summary: pd.DataFrame, verdicts, labels, scan) -> pd.DataFrame:
    """scan's compact row per program: its worst outcome, the policies it fails under, what was not checked."""
    gaps: dict[str, list[str]] = {}
    for label, v in zip(labels, verdicts, strict=True):
        gaps.setdefault(label, []).extend(n.gap.value for n in v.not_checked)
    rows = pd.DataFrame(
        {
            "program": [scan.label(scan.root / p) for p in summary["path"]],
            "outcome": summary["outcome"],
            "policies failing": [str(t).split(":", 1)[0] for t in summary["policies failing"]],
        }
    )
    rows["not checked"] = [", ".join(dict.fromkeys(gaps.get(p, []))) for p in rows["program"]]
    return rows.drop(columns=[c for c in rows.columns if (rows[c] == "").all()])


def cmd_compare(a) -> int:
    from toolkit.workflows.compare import compare_policies

    check_device(a.device)
    check_output_option(a.csv, a.force, follow_links=a.follow_links)
    check_reports(a)
    if a.policies:
        from toolkit.core.policies import get_policy

        for p in a.policies.split(","):
            get_policy(p)  # ValueError naming the choices, before any build or load
    refs = references_from(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = program_from(a.program, a.device, a.constant_table, real_load=not a.dry_run)
    policies = policies_for_compare(prog, a)  # --executorch: what that release runs on this file
    if a.dry_run:
        return _dry_compare(prog, policies, a)
    say_native_code(prog)
    comparison = compare_policies(prog, policies, device=a.device, progress=True, references=refs)
    return _show_comparison(comparison, a, "comparison")


def _show_comparison(comparison, a, what: str, *, predicted: bool = False, floor: str = "") -> int:
    """A comparison: the answer, the findings across policies, what was not checked, one row per
    policy; the whole table with ``--tables``; the CSV; the exit code is the worst policy's."""
    df = comparison.frame
    verdicts = comparison.verdicts()
    program = next(iter(verdicts.values())).program if verdicts else a.program
    say_line(f"{program!r}, {answer_line(list(verdicts.values()), 'policies', 'policy', predicted=predicted)}")
    say_findings(list(verdicts.values()), None, by_program=False)
    say_not_checked(list(verdicts.values()), None, by_program=False)
    say("policies:" + (f" (memory floor M = {floor})" if floor else ""))
    say_table(policy_rows(list(verdicts.values()), _memory(df)))
    if a.tables:
        say()
        print_frame(df.drop(columns=[c for c in ("error", "stage", "floor_bytes") if c in df.columns]))
    if a.csv:
        from toolkit.reports.tabular import write_table

        write_table(df, a.csv, **output_options(a))
        say(f"\n{what} written to {shown(Path(a.csv).resolve())}")
    if a.html or a.junit:
        from toolkit.display.tables import html_table
        from toolkit.reports.html import LoadFrames, html_report

        write_reports(
            a,
            list(verdicts.values()),
            lambda: html_report(
                list(verdicts.values()),
                title=f"constshare {what} of {program}",
                tables=[("Policies", html_table(df, max_rows=len(df)))],
                loads=[LoadFrames.of(s) for s in comparison.sessions.values()],
                csv=a.csv,
            ),
        )
    _say_tail(int(comparison.exit_code), tables=a.tables)
    return int(comparison.exit_code)


def _memory(df: pd.DataFrame) -> pd.DataFrame | None:
    """The comparison's memory per policy, as the compact rows show it ("x M": times the floor)."""
    if "device_bytes" not in df:
        return None
    out = pd.DataFrame(index=df["policy"])
    out["memory"] = [f"{int(b):,} B" if pd.notna(b) else "" for b in df["device_bytes"]]
    if "x_floor" in df:
        out["x M"] = [f"{x:.2f}" if pd.notna(x) else "" for x in df["x_floor"]]
    if "max_abs_err" in df:
        out["max abs err"] = [f"{x:.3g}" if pd.notna(x) else "" for x in df["max_abs_err"]]
    return out


def _dry_compare(prog, policies, a) -> int:
    """Every policy's predicted outcome and memory against the floor, from metadata alone."""
    from toolkit.workflows.compare import compare_policies

    comparison = compare_policies(prog, policies, device=a.device, dry_run=True)
    df = comparison.frame
    floor = int(df["floor_bytes"].iloc[0]) if len(df) else 0
    return _show_comparison(comparison, a, "dry-run comparison", predicted=True, floor=f"{floor:,} bytes")


def cmd_samples(a) -> int:
    from toolkit.build.samples import sample_module, sample_names

    for name in sample_names():
        first = " ".join(sample_module(name).DESCRIPTION.split())
        say(f"{name:26s} {first[:110]}")
    return 0


def cmd_policies(a) -> int:
    """The policies, each with the ExecuTorch releases and the setting that run it."""
    from toolkit.core.policies.releases import policy_table

    say_table(pd.DataFrame(policy_table()))
    say()
    say_wrapped(
        "report on a .pte answers for what the releases that read its payload run with sharing on; "
        "--executorch VERSION picks a release, --policy a policy"
    )
    return 0


def cmd_table(a) -> int:
    """Read each method's constant table from its .so (a CUDA machine, a worker process) and write
    constant_table.json beside the .pte, so later dry runs anywhere need no GPU."""
    from types import SimpleNamespace

    from toolkit.workflows.constant_tables import write_constant_tables

    pte = Path(a.pte)
    named = SimpleNamespace(name=pte.stem, root=pte.resolve().parent)
    written = write_constant_tables(pte, a.device or "cuda", force=a.force, notice=lambda: say_native_code(named))
    say_wrapped(written.describe())
    return 0
