"""The table of real exported programs (docs/real-exports.md) under every policy, from the GPU runs' CSVs.

    python3 benchmarks/reports/real_exports_table.py        # prints the markdown table

One row per exported program (by export set, then name), one column per policy; a later run of an
export set replaces an earlier run's row.  A cell is what loading it on the GPU measured
(``benchmarks/executorch_programs.py``): ``ok``, the methods that ran wrong alone (the same by their
references and by the differential oracle where the run has both), ``seq wrong`` (a sequence with
state carried went wrong), ``failed`` or ``refused`` (at export).
``tests/test_real_exports.py`` checks that docs/real-exports.md holds exactly this table.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

RESULTS = Path(__file__).resolve().parents[1] / "results" / "executorch_programs"
# (export set's label, the GPU run that loaded it, the rows of that run's ``export`` column, or None: all)
RUNS = (
    ("executorch 1.5.1", RESULTS / "2026-12-01-h200.csv", None),
    ("executorch 1.2.0 (generation 1)", RESULTS / "2026-12-01-h200-generations.csv", "executorch-1.2.0-cuda"),
    ("executorch 1.5.1, model families", RESULTS / "2026-12-01-h200-generations.csv", "executorch-1.5.1-families"),
    ("executorch 1.5.1, model families", RESULTS / "2026-12-05-h200-1.5.1-families.csv", None),
    ("executorch 1.2.0, model families", RESULTS / "2026-12-05-h200-1.2.0-families.csv", None),
    ("executorch 1.5.1, model families", RESULTS / "2026-12-06-h100-80gb-hbm3-1.5.1-families.csv", None),
)
POLICIES = [
    "no-sharing",
    "name-only",
    "refuse-on-mismatch",
    "decline-on-mismatch",
    "verify-always",
    "blind-share",
    "fqn-weight-cache",
    "fingerprint",
    "content-dedup",
]


def cell(r) -> str:
    if r["exporter"] == "refused" or r["status"] == "no program":
        return "refused"
    if r["status"] != "loaded":
        return str(r["status"])
    parts = [] if r["wrong_alone"] in ("", "-") else [f"**{r['wrong_alone']}**"]
    if "wrong" in str(r["sequences"]):
        parts.append("**seq wrong**")
    return ", ".join(parts) or "ok"


def table() -> str:
    rows: dict[tuple[str, str], str] = {}  # (label, program) -> its cells
    for label, csv, export in RUNS:
        if not csv.is_file():
            continue
        f = pd.read_csv(csv, keep_default_na=False)
        if export is not None:
            f = f[f["export"] == export]
        for program, got in f.groupby("program", sort=True):
            by = {r["policy"]: cell(r) for r in got.to_dict("records")}
            if set(by.values()) == {"script error"}:
                continue
            rows[(label, program)] = " | ".join(by.get(p, "") for p in POLICIES)
    head = [
        "| export | program | " + " | ".join(f"`{p}`" for p in POLICIES) + " |",
        "| --- | --- | " + " | ".join("---" for _ in POLICIES) + " |",
    ]
    labels = list(dict.fromkeys(label for label, _ in rows))  # export sets in RUNS' order, programs by name
    order = sorted(rows, key=lambda k: (labels.index(k[0]), k[1]))
    return "\n".join(head + [f"| {label} | `{program}` | {rows[(label, program)]} |" for label, program in order])


if __name__ == "__main__":
    print(table())
