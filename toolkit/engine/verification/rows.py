"""The verification row: its columns, the empty row each check starts from, and how a run fills it.

Every check (a method against its oracle, a sequence's step, the unshared side of the
differential oracle) runs a method and copies its outputs to the host, and a run that fails
gives its row a reason rather than an exception.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from toolkit.engine.loader import ProgramLoad as Session

VERIFY_COLUMNS = ["method", "ran", "max_abs_err", "atol", "rtol", "ok", "reason", "oracle", "oracle_detail", "draws"]
SEQUENCE_COLUMNS = ["sequence", "step", *VERIFY_COLUMNS]
# the reason of a method nothing can be checked against; its ``ok`` is pd.NA (neither ok nor wrong)
NO_REFERENCE = "no reference"


def empty_row(**fields: Any) -> dict[str, Any]:
    return {
        "ran": False,
        "max_abs_err": math.nan,
        "atol": math.nan,
        "rtol": math.nan,
        "ok": False,
        "reason": "",
        "oracle": "",
        "oracle_detail": "",
        "draws": "",
        **fields,
    }


def first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def run_failed(e: RuntimeError) -> str:
    return f"run failed: {first_line(e)}"


def host_outputs(session: "Session", method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [o.detach().cpu().clone() for o in session.run(method, inputs)]
