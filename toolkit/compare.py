"""Load one program under several policies, each with a fresh cache, and tabulate."""

from __future__ import annotations

from typing import Iterable, Mapping

import pandas as pd

from .loader import load_program
from .manifest import Program
from .policies import POLICIES, get_policy
from .program import open_program

COMPARE_COLUMNS = [
    "policy", "loaded", "status", "error", "wrong_methods", "not_runnable", "shared", "declined", "loaded_constants",
    "private", "refused", "device_bytes", "load_seconds",
]


def compare_policies(program: "Program | str", policies: Iterable[str] | None = None, *,
                     device: "str | Mapping[str, str] | None" = None, progress: bool = False) -> pd.DataFrame:
    """One row per policy: did it load, which methods came out wrong, what it shared, what it cost.

    ``wrong_methods`` lists methods that ran and disagreed with the eager reference;
    ``not_runnable`` those blocked by the out-of-bounds guard.
    """
    from tqdm.auto import tqdm

    prog = open_program(program)
    names = [get_policy(p).name.value for p in (policies or POLICIES)]
    rows = []
    for name in tqdm(names, desc="comparing policies", disable=not progress):
        s = load_program(prog, name, device=device)
        v = s.verify()
        d = s.decisions
        counts = d["decision"].value_counts() if len(d) else pd.Series(dtype=int)
        ran_wrong = v[(v["ran"]) & (~v["ok"])]["method"].tolist()
        not_runnable = [m for m, lm in s.methods.items() if not lm.runnable]
        rows.append({
            "policy": name, "loaded": s.status == "loaded", "status": s.status, "error": s.error or "",
            "wrong_methods": ran_wrong, "not_runnable": not_runnable,
            "shared": int(counts.get("shared", 0)), "declined": int(counts.get("declined", 0)),
            "loaded_constants": int(counts.get("loaded", 0)), "private": int(counts.get("private", 0)),
            "refused": int(counts.get("refused", 0)), "device_bytes": s.device_bytes,
            "load_seconds": round(s.load_seconds, 4),
        })
        s.close()
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)
