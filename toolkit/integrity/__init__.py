"""Integrity checking: every file a load uses against the size and digests its program records.

Opening a ``.so`` runs its code, so this runs before any ``.so`` is opened or byte uploaded, and
what the load uses is what was verified: a private sealed copy, or bytes hashed in the process's
own staging buffers.  :mod:`~toolkit.integrity.reading` reads a program file safely,
:mod:`~toolkit.integrity.records` computes and compares digests, :mod:`~toolkit.integrity.pieces`
plans a batch's pieces, :mod:`~toolkit.integrity.copies` holds verified copies,
:mod:`~toolkit.integrity.checks` is the process's record of verified files, and
:mod:`~toolkit.integrity.device_digest` hashes pieces on the device they were uploaded to, and
:mod:`~toolkit.integrity.claims` checks the constant digests a decision rests on.
"""

from toolkit.integrity.checks import (
    VerifiedFiles,
    check_claimed_sha256,
    check_files,
    check_sha256,
    file_identity,
    verified_files,
)
from toolkit.integrity.claims import ClaimedConstant, ContentClaim, check_content_claims, derived_equal
from toolkit.integrity.copies import VerifiedCopy, copy_region, keep_for_process
from toolkit.integrity.pieces import PieceCopy, PiecePlan, plan_piece_copies, record_piece_plan
from toolkit.integrity.records import chunk_digests, chunk_sha256s, file_record, hash_threads

__all__ = [
    "ClaimedConstant",
    "ContentClaim",
    "PieceCopy",
    "PiecePlan",
    "VerifiedCopy",
    "VerifiedFiles",
    "check_claimed_sha256",
    "check_content_claims",
    "check_files",
    "check_sha256",
    "chunk_digests",
    "chunk_sha256s",
    "copy_region",
    "derived_equal",
    "file_identity",
    "file_record",
    "hash_threads",
    "keep_for_process",
    "plan_piece_copies",
    "record_piece_plan",
    "verified_files",
]
