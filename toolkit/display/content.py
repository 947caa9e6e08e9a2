"""Which decision rows run on other data, and which collisions of different content were caught.

The tables mark these rows, the session view counts them and the collision matrices draw them;
all read the same masks here.  Which rows run on other data is the verdict's (the decisions'
``data_problem``), not this display's; ``same_content`` only shows the digests' comparison.
"""

from __future__ import annotations

import pandas as pd

from toolkit.display.cells import cell_text, is_missing


def content_check(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of decision rows with ``same_content``: whether the constant's content digest
    equals the digest of the cache entry it was checked against (``digest`` vs
    ``cached_digest``); NA where there was no cache entry.  Inserted after ``decision``.
    Which rows run on other data is the verdict's (the ``data_problem`` column,
    :func:`culprit_mask`), not this display's."""
    out = frame.copy()
    if "digest" not in out.columns or "cached_digest" not in out.columns:
        return out
    pairs = [
        (cell_text(n).strip(), cell_text(c).strip())
        for n, c in zip(out["digest"].tolist(), out["cached_digest"].tolist())
    ]
    col = pd.array([a == b if a and b else pd.NA for a, b in pairs], dtype="boolean")
    if "same_content" in out.columns:
        out["same_content"] = col
    else:
        at = list(out.columns).index("decision") + 1 if "decision" in out.columns else len(out.columns)
        out.insert(at, "same_content", col)
    return out


def culprit_mask(frame: pd.DataFrame) -> pd.Series:
    """Rows whose method runs on other data than its own for that constant: a ``data_problem``
    (:func:`toolkit.core.verdict.find_problem`, recorded with each decision)."""
    if "data_problem" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["data_problem"].map(cell_text) != ""


def caught_mask(frame: pd.DataFrame) -> pd.Series:
    """Rows whose content differs and that were not shared (declined, refused, ...)."""
    f = frame if "same_content" in frame.columns else content_check(frame)
    if "same_content" not in f.columns or "decision" not in f.columns:
        return pd.Series(False, index=frame.index)
    differs = f["same_content"].map(lambda v: (not is_missing(v)) and not bool(v)).astype(bool)
    return differs & (f["decision"].map(cell_text) != "shared") & ~culprit_mask(frame)


def content_summary(d: pd.DataFrame) -> tuple[int, int]:
    """(culprits, caught): shares of different content, and collisions of different content declined or refused."""
    if not len(d):
        return 0, 0
    checked = content_check(d)
    return int(culprit_mask(checked).sum()), int(caught_mask(checked).sum())
