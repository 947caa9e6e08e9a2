"""The commands: each parses nothing, calls a workflow, prints its answer and returns the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

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
from toolkit.cli.terminal import EXIT_INTERRUPTED, print_frame, say, say_line, say_native_code, shown, shown_names
from toolkit.core.errors import ToolkitError
from toolkit.core.vocab import BlameStatus, ExitCode, MethodOutcome, Stage


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


def _say_verdict(v) -> None:
    """What a verdict adds under a table: the failure and its reason, methods that cannot run,
    and each constant a method runs (would run) on other data for; one line each, names escaped
    (:func:`~toolkit.cli.terminal.shown_names`: look-alikes of each other told apart)."""
    name = shown_names([*(m.method for m in v.methods), *(x for c in v.constants for x in (c.name, c.fqn))])
    if v.failed_stage is not None:
        say_line(f"{v.policy}: {v.outcome.value} at stage {v.failed_stage.value}: {v.error}")
    for m in v.methods:
        if m.outcome is MethodOutcome.NOT_RUNNABLE:
            say_line(
                f"{v.policy}: {name(m.method)} not runnable (an installed tensor cannot fill its slot; upstream "
                f"would read out of bounds): {m.reason}"
            )
        elif m.outcome is MethodOutcome.FAILED and m.stage is Stage.RUN:
            say_line(f"{v.policy}: {name(m.method)} failed to run: {m.reason}")
    for c in v.constants:
        if c.problem is not None and (c.problem.standalone or c.blame is BlameStatus.CULPRIT):
            say_line(
                f"{v.policy}: {name(c.method)} runs on other data for {name(c.name)}"
                + (f" ({name(c.fqn)})" if c.fqn and c.fqn != c.name else "")
                + f", {c.problem.value}: {c.evidence}"
                + (f" [{c.blame.value}: {c.blame_note}]" if c.blame_note else "")
            )


def cmd_report(a) -> int:
    """One policy: the decisions, the verification (a dry run: the prediction), the verdict; the
    collision report CSV (the same columns for a dry run, ``method_outcome`` predicted)."""
    from toolkit.engine.session import load_program
    from toolkit.reports.collision import to_csv
    from toolkit.workflows.dry_run import dry_run

    check_device(a.device)
    check_output_option(a.csv, a.force, follow_links=a.follow_links)
    check_reports(a)
    refs = references_from(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = program_from(a.program, a.device, a.constant_table)
    if a.dry_run:
        s = dry_run(prog, a.policy, device=a.device, progress=True).session
        say(
            f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {a.policy!r}: "
            f"a prediction, nothing was loaded or run"
        )
    else:
        say_native_code(prog)
        s = load_program(prog, a.policy, device=a.device, progress=True)
        say(s.summary())
    say()
    print_frame(s.decisions[["method", "name", "fqn", "lookup", "decision", "reason"]])
    verification = None if a.dry_run else s.verify(references=refs, oracle=a.oracle, draws=a.draws, seed=a.seed)
    if verification is not None:
        say()
        print_frame(verification.drop(columns=["oracle_detail"]))
    verdict = s.verdict()
    if a.csv:
        to_csv(s, a.csv, verification=verification, **output_options(a))  # verified once, above
        say(f"\ncollision report written to {Path(a.csv).resolve()}")
    if a.html or a.junit:
        from toolkit.reports.html import html_report_of_session

        write_reports(a, [verdict], lambda: html_report_of_session(s, verification))
    s.close()
    say()
    _say_verdict(verdict)
    for m in [*verdict.methods, *verdict.sequences]:
        if m.checked_against and m.checked_against != "prediction":
            say_line(
                f"{getattr(m, 'method', None) or m.sequence}: checked against {m.checked_against}"
                + (f" ({m.oracle_detail})" if m.oracle_detail else "")
            )
    say_line(verdict.headline())
    if verdict.no_reference:
        say_line(
            f"not verified (no reference): {', '.join(verdict.no_reference)}; pass --reference METHOD=FILE.safetensors"
        )
    return int(verdict.exit_code)


def cmd_scan(a) -> int:
    """Dry-run every program under a folder, in parallel worker processes; exit 1 if any method
    would run on wrong data under a policy asked for (a gate for the CI of a model zoo)."""
    from toolkit.core.policies import POLICIES, get_policy
    from toolkit.display.progress import progress_bar
    from toolkit.display.tables import html_table
    from toolkit.reports.html import html_report
    from toolkit.reports.summary import scan_summary
    from toolkit.reports.tabular import write_table
    from toolkit.workflows.scan import scan_folder

    check_output_option(a.csv, a.force, follow_links=a.follow_links)
    check_reports(a)
    policies = [get_policy(p).name.value for p in (a.policies.split(",") if a.policies else POLICIES)]
    bars, finished = [], []  # the progress bar, made once the scan knows how many programs it found

    def on_start(total: int) -> None:
        bars.append(progress_bar(total=total, desc="scanning", unit="program"))  # a bar on a TTY, else a line each

    def on_done(path: str) -> None:
        finished.append(path)
        if bars[0].disable:
            print(f"scanned {len(finished)}/{bars[0].total}: {shown(path)}", file=sys.stderr)
        bars[0].update(1)

    try:
        scan = scan_folder(a.folder, policies, jobs=a.jobs, on_start=on_start, on_done=on_done)
    finally:
        for bar in bars:
            bar.close()
    frame = scan.frame
    summary = scan_summary(frame, scan.root)
    _print_scan(summary, len(frame), a.csv or a.html)
    if a.csv:
        write_table(frame, a.csv, **output_options(a))
        say(f"\nscan written to {Path(a.csv).resolve()}")
    if scan.interrupted:
        say(f"\ninterrupted: {scan.scanned} of {len(scan.paths)} programs scanned (those above)")
        return EXIT_INTERRUPTED
    verdicts, labels = scan.verdicts()
    unreadable = scan.unreadable
    write_reports(
        a,
        verdicts,
        lambda: html_report(
            verdicts,
            labels=labels,
            unreadable=unreadable,
            title=f"constshare scan of {a.folder}",
            tables=[("Programs: the worst outcome of each", html_table(summary, max_rows=len(scan.paths)))],
        ),
        labels,
        unreadable,
    )
    bad = scan.failing
    say(
        f"\n{len(scan.paths)} programs, {len(policies)} policies: "
        + (
            f"{len(bad)} method(s) would fail the gate (run wrong, not run, or not load)"
            if len(bad)
            else "every method would run on its own data"
        )
    )
    return int(scan.exit_code)


def _print_scan(summary: pd.DataFrame, rows: int, detail_in: str | None) -> None:
    """One compact row per program (its worst outcome, failing methods and policies, the first
    error shortened); every row in full goes to the CSV or the HTML report."""
    print_frame(summary)
    if rows > len(summary):
        say(
            f"(one row per program; {'every' if detail_in else 'for every'} program, policy and method "
            + (f"in {detail_in})" if detail_in else "pass --csv FILE or --html FILE)")
        )


def cmd_compare(a) -> int:
    from toolkit.workflows.compare import compare_policies

    check_device(a.device)
    check_output_option(a.csv, a.force, follow_links=a.follow_links)
    check_reports(a)
    policies = a.policies.split(",") if a.policies else None
    if policies:
        from toolkit.core.policies import get_policy

        for p in policies:
            get_policy(p)  # ValueError naming the choices, before any build or load
    refs = references_from(a.reference)
    if refs and a.dry_run:
        raise ToolkitError("--reference: a dry run runs nothing, so there is nothing to verify")
    prog = program_from(a.program, a.device, a.constant_table)
    if a.dry_run:
        return _dry_compare(prog, policies, a)
    say_native_code(prog)
    comparison = compare_policies(prog, policies, device=a.device, progress=True, references=refs)
    return _show_comparison(comparison, a, "comparison")


def _show_comparison(comparison, a, what: str) -> int:
    """A comparison's table, each policy's failures and wrong data with their reasons, the CSV;
    the exit code is the worst policy's."""
    df = comparison.frame
    print_frame(df.drop(columns=[c for c in ("error", "stage", "floor_bytes") if c in df.columns]))
    if a.csv:
        from toolkit.reports.tabular import write_table

        write_table(df, a.csv, **output_options(a))
        say(f"\n{what} written to {Path(a.csv).resolve()}")
    say()
    verdicts = comparison.verdicts()
    for v in verdicts.values():
        _say_verdict(v)
    if a.html or a.junit:
        from toolkit.display.tables import html_table
        from toolkit.reports.html import html_report

        write_reports(
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
    say(f"{len(bad)} of {len(df)} policies {what}: " + ", ".join(bad) if bad else f"no policy {what}")
    return int(comparison.exit_code)


def _dry_compare(prog, policies, a) -> int:
    """Every policy's predicted outcome and memory against the floor, from metadata alone."""
    from toolkit.workflows.compare import compare_policies

    comparison = compare_policies(prog, policies, device=a.device, dry_run=True)
    df = comparison.frame
    floor = int(df["floor_bytes"].iloc[0]) if len(df) else 0
    say(
        f"dry run of {prog.name!r} ({len(prog.methods)} methods, {prog.format}) under {len(df)} policies: "
        f"a prediction, nothing was loaded or run; memory floor M = {floor:,} bytes"
    )
    say()
    return _show_comparison(comparison, a, "dry-run comparison")


def cmd_samples(a) -> int:
    from toolkit.build.samples import sample_module, sample_names

    for name in sample_names():
        first = " ".join(sample_module(name).DESCRIPTION.split())
        say(f"{name:26s} {first[:110]}")
    return 0
