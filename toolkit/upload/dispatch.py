"""Choosing a device's uploader from the load's options, and uploading one constant through it.

On CPU a constant's bytes are read into a plain tensor; on CUDA through the device's uploader
(:func:`make_uploader`), a given pinned buffer, or a fresh pinned buffer for this constant alone.
Every path returns bytes equal to the blob's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from toolkit.core.model import ConstantSpec
from toolkit.core.options import LoadOptions
from toolkit.core.vocab import UploadMode
from toolkit.upload.host_stager import HostStager
from toolkit.upload.lock_cache import host_locks, lock_budget
from toolkit.upload.mapped import MappedBlobUploader
from toolkit.upload.reading import as_constant, read_constant_bytes, read_constant_into


def make_uploader(device: torch.device, options: LoadOptions) -> MappedBlobUploader | HostStager | None:
    """The loader's uploader for one CUDA device, as ``options.upload`` says: a
    :class:`MappedBlobUploader` over :func:`host_locks` (given ``options.host_lock_bytes`` as
    budget), a :class:`HostStager`, or None (``unstaged``: a pinned buffer per constant)."""
    if options.upload is UploadMode.MAPPED:
        locks = host_locks()
        locks.budget_bytes = lock_budget(options.host_lock_bytes)
        return MappedBlobUploader(device, locks=locks, first_load=options.first_load)
    return HostStager(device) if options.upload is UploadMode.STAGED else None


def upload_constant(
    blob_path: Path,
    spec: ConstantSpec,
    device: torch.device,
    staging: MappedBlobUploader | HostStager | torch.Tensor | None = None,
) -> torch.Tensor:
    """Upload exactly one constant from the host blob into a tensor the toolkit owns.

    ``staging`` is the device's uploader (:class:`MappedBlobUploader` or :class:`HostStager`,
    what the loader passes), a pinned uint8 buffer at least as large as the constant, or
    None (a pinned buffer is allocated for this constant alone).
    """
    if device.type == "cpu":
        return as_constant(read_constant_bytes(blob_path, spec), spec)
    if isinstance(staging, (MappedBlobUploader, HostStager)):
        return as_constant(staging.upload(blob_path, spec), spec)
    if staging is None or staging.numel() < spec.nbytes:
        host = read_constant_bytes(blob_path, spec, pin=True)
    else:
        host = read_constant_into(blob_path, spec, staging[: spec.nbytes])
    dev = torch.empty(spec.nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.current_stream(device).synchronize()
    return as_constant(dev, spec)
