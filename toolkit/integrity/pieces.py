"""Piece plans: which recorded pieces of a file a batch of constant uploads reads, and which bytes of
each piece feed which constant.

Verified staging (:func:`toolkit.upload.stage_pieces`) follows such a plan: each piece is read once
into the process's own staging buffers, hashed there against its digest, and its bytes copied from
there into the constants it feeds, so a batch reads and hashes only the pieces its constants cover.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from toolkit.core.model import FileRecord
from toolkit.integrity.records import record_pieces


@dataclass(frozen=True)
class PieceCopy:
    """Bytes of one piece that one constant holds: ``nbytes`` bytes from ``in_piece`` in the piece
    to ``in_constant`` in constant ``constant`` (its index in the batch)."""

    constant: int
    in_constant: int
    in_piece: int
    nbytes: int


@dataclass(frozen=True)
class PiecePlan:
    """One piece a batch of uploads reads: its number in the file's piece table, its bytes
    ``[start, start + length)``, the digest it must have (None: not hashed) and the copies it feeds."""

    index: int
    start: int
    length: int
    digest: str | None
    copies: tuple[PieceCopy, ...]


def plan_piece_copies(
    pieces: Sequence[tuple[int, int, str | None]], spans: Sequence[tuple[int, int]]
) -> list[PiecePlan]:
    """For byte ranges ``spans`` ((file offset, length) of each constant of a batch), the pieces
    (sorted, disjoint (start, length, digest) spans of the file) that cover them, each with the
    copies it feeds; pieces no range touches are left out.  ValueError for a byte of a range
    that lies in no piece."""
    starts = [s for s, _, _ in pieces]
    feeds: dict[int, list[PieceCopy]] = {}
    for k, (off, n) in enumerate(spans):
        pos, end = off, off + n
        i = bisect.bisect_right(starts, pos) - 1
        while pos < end:
            if not (0 <= i < len(pieces) and pieces[i][0] <= pos < pieces[i][0] + pieces[i][1]):
                raise ValueError(f"bytes [{pos}, {end}) of constant {k} lie in no piece")
            s, length, _ = pieces[i]
            z = min(end, s + length)
            feeds.setdefault(i, []).append(PieceCopy(k, pos - off, pos - s, z - pos))
            pos, i = z, i + 1
    return [PiecePlan(i, pieces[i][0], pieces[i][1], pieces[i][2], tuple(feeds[i])) for i in sorted(feeds)]


def record_piece_plan(record: FileRecord, path: Path, spans: Sequence[tuple[int, int]]) -> list[PiecePlan]:
    """:func:`plan_piece_copies` over the pieces of ``record`` (:func:`~toolkit.integrity.records.record_pieces`:
    a record without piece digests is one piece, the whole file under its sha256)."""
    return plan_piece_copies(record_pieces(record, path), spans)
