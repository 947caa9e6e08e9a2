"""Moving constants' bytes from a host weights blob into device tensors the toolkit owns.

With integrity checking on and a record for the file, a method's per-constant uploads go through
verified staging (:mod:`~toolkit.upload.staging`: each piece hashed in the process's own staging
slots and copied from there).  Otherwise they go through one uploader per CUDA device
(:mod:`~toolkit.upload.dispatch`): the page-locked mapping (:mod:`~toolkit.upload.mapped`, the default:
a reload copies straight out of the page cache), reusable pinned buffers
(:mod:`~toolkit.upload.host_stager`), or a fresh pinned buffer per constant.  On CPU the bytes are
read into a plain tensor (:mod:`~toolkit.upload.reading`).  Every path returns bytes equal to the
blob's (``tests/test_upload.py``, byte for byte).
"""

from toolkit.upload.dispatch import make_uploader, upload_constant
from toolkit.upload.host_stager import HostStager
from toolkit.upload.lock_cache import HostLockCache, host_locks, lock_budget
from toolkit.upload.locking import LockedMapping, page_spans, regions_to_lock
from toolkit.upload.mapped import MappedBlobUploader
from toolkit.upload.reading import as_constant, read_constant_bytes
from toolkit.upload.staging import stage_pieces, unhashed_pieces

__all__ = [
    "HostLockCache",
    "HostStager",
    "LockedMapping",
    "MappedBlobUploader",
    "as_constant",
    "host_locks",
    "lock_budget",
    "make_uploader",
    "page_spans",
    "read_constant_bytes",
    "regions_to_lock",
    "stage_pieces",
    "unhashed_pieces",
    "upload_constant",
]
