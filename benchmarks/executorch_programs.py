"""Every real ExecuTorch program under every policy: the dry run's prediction beside a real load.

    python3 benchmarks/executorch_programs.py [--root DIR ...] [--device cuda|cpu] [--out [DIR]] [--tag NAME]

For every folder under the roots (default: ``tests/fixtures/executorch-1.5.1-cuda``) that holds a
``prog.pte`` (exported) or a ``result.json`` saying the exporter refused it, and for every policy:

* exported: the dry run (``dry_run``) on the CPU, then, where the device is there, a real
  load through torch's AOTInductor runtime, each method verified alone against
  ``reference_<method>.safetensors`` and against the differential oracle (the method loaded alone on
  its own bytes, on the reference's inputs: ``oracle_wrong``), and each sequence
  (``sequence_<name>.safetensors``, state carried) step by step, each in a fresh session;
  ``decisions_match`` says whether the load made exactly the decisions the dry run predicted;
* refused: the exporter's own message (``refusal.txt``), for every policy, since no program exists.

One row per (program, policy); ``--out`` writes ``executorch_programs/<date>-<machine>[-<tag>].csv``
(machine columns appended) and the same table as markdown (``.md``) into DIR, by default
``benchmarks/results``.  Exits 1 when a real load disagrees with its dry run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
from _common import REPO, result_path, write_results

import toolkit
from toolkit.engine.frames import wrong_methods
from toolkit.workflows.dry_run import dry_run

DEFAULT_ROOT = REPO / "tests" / "fixtures" / "executorch-1.5.1-cuda"
COLUMNS = [
    "program",
    "policy",
    "exporter",
    "dry_status",
    "predicted_wrong",
    "status",
    "wrong_alone",
    "oracle_wrong",
    "sequences",
    "decisions_match",
    "device_bytes",
    "load_s",
    "error",
]


def folders(roots: list[Path]) -> list[Path]:
    found = []
    for root in roots:
        for d in sorted(p for p in root.iterdir() if p.is_dir()):
            if (d / "prog.pte").is_file() or (d / "result.json").is_file():
                found.append(d)
    return found


def _names(xs) -> str:
    return ",".join(sorted(xs)) or "-"


def program_rows(folder: Path, policies: list[str], device: str | None) -> list[dict]:
    pte = folder / "prog.pte"
    if not pte.is_file():
        result = json.loads((folder / "result.json").read_text())
        msg = result.get("message", "")
        return [
            {
                "program": folder.name,
                "policy": p,
                "exporter": "refused",
                "dry_status": "",
                "predicted_wrong": "",
                "status": "no program",
                "wrong_alone": "",
                "oracle_wrong": "",
                "sequences": "",
                "decisions_match": None,
                "device_bytes": 0,
                "load_s": 0.0,
                "error": msg,
            }
            for p in policies
        ]
    rows = []
    table = folder / "constant_table.json"  # generation 1/2: the table only the .so holds
    program = toolkit.open_program(pte, constant_table=json.loads(table.read_text()) if table.is_file() else None)
    cols = ["method", "name", "decision", "origin"]
    for policy in policies:
        dry = dry_run(program, policy)
        row = {
            "program": folder.name,
            "policy": policy,
            "exporter": "exported",
            "dry_status": str(dry.status),
            "predicted_wrong": _names(dry.verdict.wrong_methods),
            "status": "",
            "wrong_alone": "",
            "oracle_wrong": "",
            "sequences": "",
            "decisions_match": None,
            "device_bytes": 0,
            "load_s": 0.0,
            "error": "",
        }
        if device is None:
            rows.append(row)
            continue
        s = toolkit.load_program(program, policy, device=device)
        try:
            row.update(
                status=str(s.status), device_bytes=s.device_bytes, load_s=round(s.load_seconds, 4), error=s.error or ""
            )
            row["decisions_match"] = bool(
                s.decisions[cols]
                .reset_index(drop=True)
                .astype(str)
                .equals(dry.decisions[cols].reset_index(drop=True).astype(str))
            )
            if s.status == "loaded":
                row["wrong_alone"] = _names(wrong_methods(s.verify(oracle="reference")))
                row["oracle_wrong"] = _names(wrong_methods(s.verify(oracle="unshared")))
        finally:
            s.close()
        seqs = []
        for q in program.sequences:  # a fresh session per sequence: nothing left from the runs above
            s = toolkit.load_program(program, policy, device=device)
            try:
                f = s.verify(sequence=q.name)
                bad = f[~f["ok"].fillna(False).astype(bool)]["step"].tolist()
                seqs.append(f"{q.name}: " + ("ok" if not bad else f"wrong from step {bad[0]}"))
            finally:
                s.close()
        row["sequences"] = "; ".join(seqs) or "-"
        rows.append(row)
    return rows


def markdown(frame: pd.DataFrame) -> str:
    shown = [
        "program",
        "policy",
        "exporter",
        "predicted_wrong",
        "status",
        "wrong_alone",
        "oracle_wrong",
        "sequences",
        "decisions_match",
    ]
    lines = ["| " + " | ".join(shown) + " |", "| " + " | ".join("---" for _ in shown) + " |"]
    for _, r in frame.iterrows():
        cells = [str(r[c]) if r[c] is not None else "" for c in shown]
        if r["exporter"] == "refused":
            cells[4] = "refused at export: " + str(r["error"])[:90].replace("|", "\\|")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, action="append", default=None, help="folder of program folders (repeat)")
    ap.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda" if torch.cuda.is_available() else None,
        help="load for real on this device (default: cuda when there is one, else dry runs only)",
    )
    ap.add_argument("--policies", default=",".join(toolkit.POLICIES))
    ap.add_argument("--out", nargs="?", const="", default=None, help="write the table (default benchmarks/results)")
    ap.add_argument("--tag", default=None, help="ends the output files' name (e.g. the export set)")
    a = ap.parse_args(argv)
    policies = [p for p in a.policies.split(",") if p]
    found = folders(a.root or [DEFAULT_ROOT])
    print(
        f"{len(found)} program(s) x {len(policies)} policies, real loads on {a.device or 'nothing (dry runs)'}",
        flush=True,
    )
    rows, t0 = [], time.perf_counter()
    for i, folder in enumerate(found, 1):
        try:
            got = program_rows(folder, policies, a.device)
        except Exception as e:  # one program's failure is a row, not the end of the table
            got = [
                {"program": folder.name, "policy": p, "status": "script error", "error": f"{type(e).__name__}: {e}"}
                for p in policies
            ]
        rows += got
        print(f"[{i}/{len(found)}] {folder.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    with pd.option_context("display.width", 250, "display.max_colwidth", 60, "display.max_rows", 500):
        print(frame.drop(columns=["error"]).to_string(index=False))
    if a.out is not None:
        path = write_results("executorch_programs", frame, a.out or None, a.tag)
        md = result_path("executorch_programs", ".md", a.out or None, a.tag)
        md.write_text(markdown(frame))
        print(f"wrote {path} and {md}")
    real = frame[frame["exporter"].eq("exported") & frame["status"].ne("")]
    loaded = real["status"].eq("loaded")  # (a failed load ran nothing: no wrong methods to compare)
    bad = real[
        (loaded & (real["predicted_wrong"] != real["wrong_alone"]))
        | real["decisions_match"].eq(False)
        | real["dry_status"].ne(real["status"])
    ]
    if len(bad):
        print(f"{len(bad)} real load(s) disagree with the dry run:\n{bad.to_string(index=False)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
