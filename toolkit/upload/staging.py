"""Verified staging: a batch of constants read piece by piece into the process's own staging slots,
each piece hashed there (or, with the device digest, on the device) and copied from there; or, where
the device hashes every piece, copied straight out of the file's page-locked pages and hashed where
it landed.

The bytes uploaded are exactly the bytes hashed, in private memory no writer of the file can reach
(the slots, or the device's own memory), and a batch hands out its tensors only once every piece
matched its record.  Without a record the same pipeline runs unhashed (``first_load="pipelined"``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import torch

from toolkit.core.errors import IntegrityError
from toolkit.core.model import ConstantSpec, FileRecord
from toolkit.core.options import LoadOptions
from toolkit.integrity import device_digest as digest_on_device
from toolkit.integrity.pieces import PiecePlan, plan_piece_copies, record_piece_plan
from toolkit.integrity.reading import open_checked, read_range
from toolkit.integrity.records import mismatch, new_hasher
from toolkit.upload.lock_cache import HostLockCache
from toolkit.upload.locking import LockedMapping, device_thread, lock_failed, page_spans, regions_to_lock
from toolkit.upload.reading import blob_too_short
from toolkit.upload.slots import Slots, take_slots


def unhashed_pieces(specs: list[ConstantSpec], size: int, piece_bytes: int = 64 << 20) -> list[tuple[int, int, None]]:
    """Pieces for an unhashed staging (no record to follow): the constants' pages, merged, cut into
    ``piece_bytes`` regions, the last one ending at the file's end (``size``)."""
    regions = regions_to_lock([(c.offset, c.offset + c.nbytes) for c in specs], [], piece_bytes)
    return [(s, min(e, size) - s, None) for s, e in regions]


def stage_pieces(
    path: Path,
    record: FileRecord | None,
    specs: list[ConstantSpec],
    device: torch.device,
    *,
    threads: int,
    chunk_bytes: int = LoadOptions.staging_chunk_bytes,
    on_hashed=None,
    device_digest: bool | None = LoadOptions.device_digest,
    locks: HostLockCache | None = None,
    on_locked=None,
) -> list[torch.Tensor]:
    """The constants' bytes, as uint8 tensors on ``device`` (in ``specs``' order), read from
    ``path`` piece by piece: with ``record``, the record's pieces covering them (:func:`record_piece_plan`),
    each hashed as it is read and compared with its digest; without, their pages unhashed.

    ``threads`` workers take jobs (a piece hashed on the host whole, any other piece in ``chunk_bytes``
    parts: :func:`_run_staging`) and read each in ``chunk_bytes`` sub-chunks
    (:func:`~toolkit.integrity.reading.read_range`: holes read as zeros, a file that ends early is an
    :class:`IntegrityError`) into the process's own staging slots (pinned on CUDA, two per worker,
    reused: :func:`take_slots`), hashing each sub-chunk into the piece's hasher there and then
    copying its parts into the constants' tensors (on CUDA asynchronously on the caller's current
    stream: no side stream; a slot is refilled only once the copy out of it is done).  So the
    bytes uploaded are exactly the bytes hashed, in private memory.  Returns once every piece is
    hashed and matches and every copy is done; a piece that does not match is an IntegrityError
    naming the file and the piece (:func:`~toolkit.integrity.records.mismatch`), and no tensor is returned.
    ``on_hashed(nbytes)`` counts the bytes hashed (also those of a batch that failed).

    **Device digest** (``device_digest``; :mod:`toolkit.integrity.device_digest`): a BLAKE3 piece is not
    hashed on the host but on the device, on a stream of its own once its copies are done: where it
    landed when it lands whole in one constant (4-byte aligned, a multiple of 64 bytes), else in a
    device scratch copy of the whole piece (shared by constants, partly unread, misaligned) from which
    its constants' bytes are then copied on the device, so the bytes hashed are still the bytes used.
    sha256 pieces are hashed on the host as above.  Every digest is compared before this returns, so
    no tensor of a batch with a wrong piece is ever handed out.  ``None``
    (:func:`~toolkit.integrity.device_digest.mode`) hashes on the device where its kernels are
    precompiled (sm90) or already warm; elsewhere a cold batch large enough starts their warm-up in
    the background and hashes on the host each piece it takes before they are warm, so no load waits
    for Triton.

    **Locked pages** (``locks``, the process's :class:`~toolkit.upload.lock_cache.HostLockCache`, which
    the CUDA loader passes under its default ``first_load="locked"``): where the device hashes every
    piece from the first (:func:`_device_hashed`), no slot is used: the pieces' pages of the file are
    page-locked in place within the cache's budget, one piece after another on a locking thread, and
    each piece is copied by the device straight out of them, while the next is locked, into where it
    lands (or its scratch copy) and hashed there (:func:`_run_locked`).  The host never reads those
    pages, so a file shrunk under the load cannot fault it; the device hashes what landed, so a writer
    of the file cannot make the bytes used differ from the bytes hashed.  The pages stay locked for the
    next load of the file, as ``integrity="off"``'s do.  A piece whose pages cannot be locked is staged
    through the slots.  ``on_locked(nbytes)`` counts the bytes of pieces copied from locked pages.
    """
    path = Path(path)
    if record is not None:
        fd, st = open_checked(path, record)
    else:
        fd = os.open(path, os.O_RDONLY)
        st = os.fstat(fd)
    try:
        size = st.st_size
        for c in specs:
            if c.nbytes and (c.offset < 0 or c.offset + c.nbytes > size):
                raise blob_too_short(path, c, f"the file has {size} bytes")
        spans = [(c.offset, c.nbytes) for c in specs]
        plan = (
            record_piece_plan(record, path, spans)
            if record is not None
            else plan_piece_copies(unhashed_pieces(specs, size), spans)
        )
        outs = [torch.empty(c.nbytes, dtype=torch.uint8, device=device) for c in specs]
        if plan and locks is not None and locks.budget_bytes:
            on_device, when_warm = _device_hashed(record, plan, outs, device, device_digest)
            if len(on_device) == len(plan) and not when_warm:
                left, hashed, bad = _run_locked(locks, path, st, plan, outs, device, on_device)
                if on_hashed is not None and hashed:
                    on_hashed(hashed)
                if bad:
                    raise mismatch(record, min(bad), path)
                rest = set(left)
                if on_locked is not None and len(rest) < len(plan):
                    on_locked(sum(p.length for i, p in enumerate(plan) if i not in rest))
                plan = [plan[i] for i in left]
        if plan:
            with take_slots(device, max(1, threads), chunk_bytes) as slots:
                # a fresh process pins its slots while the device digest's kernels load (both take milliseconds)
                parts = sum(-(-p.length // chunk_bytes) for p in plan)
                pinned = slots.prepare(min(max(1, threads), parts))
                on_device, when_warm = _device_hashed(record, plan, outs, device, device_digest)
                wait(pinned)
                _run_staging(fd, path, record, plan, outs, device, slots, chunk_bytes, on_hashed, on_device, when_warm)
        return outs
    finally:
        os.close(fd)


def _in_one_constant(p: PiecePlan, outs: list[torch.Tensor]) -> torch.Tensor | None:
    """The bytes of constant tensor that piece ``p`` fills whole, where the device can hash them in
    place; None for a piece shared, partly unread or misaligned (hashed in a scratch copy)."""
    if len(p.copies) != 1:
        return None
    cp = p.copies[0]
    if cp.in_piece != 0 or cp.nbytes != p.length:
        return None
    view = outs[cp.constant][cp.in_constant : cp.in_constant + cp.nbytes]
    return view if digest_on_device.hashable_in_place(view, p.length) else None


def _device_hashed(
    record: FileRecord | None,
    plan: list[PiecePlan],
    outs: list[torch.Tensor],
    device: torch.device,
    forced: bool | None,
) -> tuple[dict[int, torch.Tensor | None], bool]:
    """For :func:`stage_pieces`: the pieces of ``plan`` (by position) the device may hash, each with
    the bytes it lands in (None: a scratch copy of its own), and whether each waits for the kernels to
    be warm (else it is hashed there in any case): none without a BLAKE3 piece record, when ``forced``
    is False, or where the device has neither precompiled kernels nor Triton
    (:func:`~toolkit.integrity.device_digest.mode`)."""
    if record is None or not record.chunks or record.chunk_digest != "blake3":
        return {}, False
    where = {i: _in_one_constant(p, outs) for i, p in enumerate(plan) if p.digest is not None}
    how = digest_on_device.mode(device, sum(plan[i].length for i in where), forced)
    if how == "host" or not where:
        return {}, False
    if how == "when warm":
        digest_on_device.warm_up_in_background(device)
        return where, True
    if not digest_on_device.available(device):  # last: on the CPU it loads the kernels to see
        return {}, False
    return where, False


def _run_staging(
    fd: int,
    path: Path,
    record: FileRecord | None,
    plan: list[PiecePlan],
    outs: list[torch.Tensor],
    device: torch.device,
    slots: Slots,
    chunk_bytes: int,
    on_hashed,
    on_device: dict[int, torch.Tensor | None],
    when_warm: bool = False,
) -> None:
    """:func:`stage_pieces`' workers over ``plan``; raises the first error or mismatch (lowest piece).
    The pieces of ``on_device`` (by position in ``plan``) are hashed on the device instead: where they
    landed, or (None) in a scratch copy made as their first job is taken; with ``when_warm``, only
    those taken once the kernels are warm on ``device`` (the others on the host).

    A piece hashed on the host is one job (its hasher takes its bytes in order); a piece hashed on the
    device or not at all is cut into ``chunk_bytes`` jobs that any worker takes, so a batch of few
    pieces, or of a piece count just over the workers', still keeps every worker busy.  The last of a
    piece's jobs to be copied starts its hash (and its scratch's copies into the constants)."""
    cuda = device.type == "cuda"
    stream = torch.cuda.current_stream(device) if cuda else None
    # the digest table, made by the first piece hashed on the device (on ``stream``, before its copies)
    table: list[digest_on_device.DeviceDigests | None] = [None]
    hash_stream = torch.cuda.Stream(device) if cuda and on_device else None
    chunk = chunk_bytes
    whole, cut = [], []  # (position in plan, piece, first byte, end): whole pieces first, the longest jobs
    for pos, p in enumerate(plan):
        end = p.start + p.length
        if p.digest is None or (pos in on_device and not when_warm):
            cut += [(pos, p, u, min(u + chunk, end)) for u in range(p.start, end, chunk)]
        else:
            whole.append((pos, p, p.start, end))
    jobs = whole + cut
    left = Counter(pos for pos, *_ in jobs)  # a piece's jobs not yet copied: its last one starts its device hash
    scratch: dict[int, torch.Tensor] = {}  # position -> the device copy of a piece hashed there but not in place
    workers = max(1, min(slots.workers, len(jobs)))
    todo = iter(jobs)
    claim = threading.Lock()
    stop = threading.Event()
    bad: list[int] = []
    hashed = [0]

    def next_job() -> tuple[int, PiecePlan, int, int, bool] | None:
        """The next job, and whether the device hashes its piece (decided before it is read)."""
        with claim:
            job = None if stop.is_set() else next(todo, None)
            if job is None:
                return None
            pos, p = job[0], job[1]
            # a cut piece in ``on_device`` is never ``when_warm``: the device hashes it
            here = pos in on_device and (not when_warm or digest_on_device.ready(device))
            if here and table[0] is None:
                table[0] = digest_on_device.DeviceDigests(device, len(plan))
            if here and on_device[pos] is None and pos not in scratch:
                scratch[pos] = _scratch(p.length, device)  # on ``stream``: before every copy into it
            return (*job, here)

    def hash_on_device(pos: int, p: PiecePlan) -> None:
        """Hash piece ``pos`` once its copies (and the table's zeros) are done: where it landed, or in its
        scratch copy, whose bytes then go on to its constants (on ``stream``, after the copies into it)."""
        data = on_device[pos]
        if data is None:
            with claim:
                data = scratch.pop(pos)
        _hash_landed(table[0], data, pos, p, outs, on_device[pos] is None, stream, hash_stream)

    def run_job(slots: Slots, w: int, k: list[int], pos: int, p: PiecePlan, lo: int, hi: int, here: bool) -> None:
        bufs, events = slots.worker_bufs(w), slots.events[w]
        h = new_hasher(record) if p.digest is not None and not here else None
        into = scratch.get(pos) if here and on_device[pos] is None else None
        for u in range(lo, hi, chunk):
            m = min(chunk, hi - u)
            slot = k[0] % 2
            k[0] += 1
            if events[slot] is not None:
                events[slot].synchronize()  # the copy out of this slot is done: it may be refilled
            buf, view = bufs[slot]
            read_range(fd, view[:m], u, path, h, zero_holes=True)  # a reused slot: holes written as zeros
            if into is not None:
                into[u - p.start : u - p.start + m].copy_(buf[:m], non_blocking=cuda)
            for cp in p.copies if into is None else ():
                fs = p.start + cp.in_piece  # the file's byte the copy starts at
                a, z = max(u, fs), min(u + m, fs + cp.nbytes)
                if a < z:
                    at = cp.in_constant + a - fs
                    outs[cp.constant][at : at + z - a].copy_(buf[a - u : z - u], non_blocking=cuda)
            if cuda:
                if events[slot] is None:
                    events[slot] = torch.cuda.Event()
                events[slot].record(stream)
        if here:
            with claim:  # every other job of the piece enqueued its copies on ``stream`` before this
                left[pos] -= 1
                last = left[pos] == 0
            if last:
                hash_on_device(pos, p)
        if h is not None:
            with claim:
                hashed[0] += p.length
                if h.hexdigest() != p.digest:
                    bad.append(p.index)
                    stop.set()  # the batch fails: the other workers take no new job

    def worker(slots: Slots, w: int) -> None:
        k = [0]
        try:
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                while (job := next_job()) is not None:
                    run_job(slots, w, k, *job)
        except BaseException:
            stop.set()
            raise
        finally:
            for ev in slots.events[w]:
                if ev is not None:
                    ev.synchronize()  # no slot is handed on while a copy out of it may still run

    futs = [slots.pool.submit(worker, slots, w) for w in range(workers)]
    wait(futs)
    scratch.clear()  # a failed batch's unfinished pieces
    if cuda:
        stream.synchronize()  # the copies out of the scratch copies, queued after the last slot's
    digests = table[0]
    if digests is not None:
        if hash_stream is not None:
            hash_stream.synchronize()  # every kernel done: the digests are final
        for pos, hexdigest in digests.hexdigests().items():
            hashed[0] += plan[pos].length
            if hexdigest != plan[pos].digest:
                bad.append(plan[pos].index)
        if cuda and None in on_device.values():
            # the scratch copies' memory back to the driver: the device bytes a load leaves in use (what
            # its memory samples read) stay its constants', not up to a piece per worker more
            with torch.cuda.device(device):  # empty_cache acts on the current device
                torch.cuda.empty_cache()
    if on_hashed is not None and hashed[0]:
        on_hashed(hashed[0])
    for f in futs:
        e = f.exception()
        if isinstance(e, OSError):
            raise IntegrityError(f"file cannot be read: {e.strerror or e}", path=path) from None
        if e is not None:
            raise e
    if bad:
        raise mismatch(record, min(bad), path)


_LOCK_BYTES = 64 << 20  # the regions a verified load locks: one per piece where pieces are 64 MiB and aligned
_SCRATCH_IN_FLIGHT = 4  # scratch copies queued at most: the device memory a batch takes beyond its constants
_THREADS: dict[tuple[str, str], ThreadPoolExecutor] = {}
_THREADS_LOCK = threading.Lock()


def _thread(device: torch.device, name: str) -> ThreadPoolExecutor:
    """The process's one ``name`` thread for ``device`` (locking, unlocking): registering pages there
    leaves a failed call's CUDA last-error on that thread, never the loader's."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (str(device), name)
    with _THREADS_LOCK:
        if key not in _THREADS:
            _THREADS[key] = (
                device_thread(device, name) if device.type == "cuda" else ThreadPoolExecutor(1, thread_name_prefix=name)
            )
        return _THREADS[key]


def _run_locked(
    locks: HostLockCache,
    path: Path,
    st: os.stat_result,
    plan: list[PiecePlan],
    outs: list[torch.Tensor],
    device: torch.device,
    on_device: dict[int, torch.Tensor | None],
) -> tuple[list[int], int, list[int]]:
    """:func:`stage_pieces` out of the file's locked pages, every piece of ``plan`` hashed on the device
    (``on_device``: where it lands whole, or None: a scratch copy).  Returns the plan positions left
    to the slots (every one where the mapping is not of the file ``st`` describes, or locking them
    would exceed the budget; else those whose pages did not lock), the bytes hashed, and the indexes
    of the pieces whose digest differs from their record's."""
    everything = list(range(len(plan)))
    try:
        lm = locks.acquire(path)
    except (OSError, ValueError):  # cannot be mapped: the slots read it
        return everything, 0, []
    try:
        if lm.key != (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) or lm.mapped is None:
            return everything, 0, []  # the path names another file than the one opened (swapped, rewritten)
        spans = [(p.start, p.start + p.length) for p in plan]
        with lm.guard:
            new = regions_to_lock(spans, lm.regions, _LOCK_BYTES)
        if locks.locked_bytes + sum(e - s for s, e in new) > locks.budget_bytes:
            return everything, 0, []
        locker = _thread(device, "constshare-lock")
        for s, e in page_spans(spans):  # merged (pieces of a few pages lock in large regions), in order, on
            lm.lock_missing(s, e, _LOCK_BYTES, locker)  # one thread: the driver serialises locking anyway
        return _copy_locked_pieces(lm, plan, outs, device, on_device)
    finally:
        locks.release(lm, _thread(device, "constshare-unlock"))


def _copy_locked_pieces(
    lm: LockedMapping,
    plan: list[PiecePlan],
    outs: list[torch.Tensor],
    device: torch.device,
    on_device: dict[int, torch.Tensor | None],
) -> tuple[list[int], int, list[int]]:
    """:func:`_run_locked` once its locks are queued: each piece, as its pages' locks hold, copied on the
    current stream into where it lands (or a scratch copy, then into its constants) and hashed on a
    stream of its own after; the digests compared once every kernel is done."""
    cuda = device.type == "cuda"
    stream = torch.cuda.current_stream(device) if cuda else None
    hash_stream = torch.cuda.Stream(device) if cuda else None
    table = digest_on_device.DeviceDigests(device, len(plan))
    left: list[int] = []
    in_flight: deque = deque()  # per scratch copy queued: the events after which its memory is free
    try:
        for pos, p in enumerate(plan):
            s, e = p.start, p.start + p.length
            regions = lm.covering(s, e) or []
            with lm.guard:
                futs = [lm.futures.get(r) for r in regions]
            wait([f for f in futs if f is not None])
            held = [f is not None and not lock_failed(f) for f in futs]
            if not regions or not all(held):
                for r, ok in zip(regions, held):
                    if not ok:
                        lm.forget(r)  # may be locked again by a later load
                left.append(pos)
                continue
            data = on_device[pos]
            if data is None:
                if len(in_flight) >= _SCRATCH_IN_FLIGHT:
                    for ev in in_flight.popleft():
                        ev.synchronize()
                data = _scratch(p.length, device)
            for r0, r1 in regions:  # one copy per region: a copy may not span two registrations
                a, z = max(r0, s), min(r1, e)
                data[a - s : z - s].copy_(lm.mapped[a:z], non_blocking=cuda)
            _hash_landed(table, data, pos, p, outs, on_device[pos] is None, stream, hash_stream)
            if on_device[pos] is None and cuda:
                done = (torch.cuda.Event(), torch.cuda.Event())
                done[0].record(stream)
                done[1].record(hash_stream)
                in_flight.append(done)
    except BaseException:
        if cuda:  # no copy may still read the locked pages once the mapping goes back to the cache
            stream.synchronize()
        raise
    if cuda:
        stream.synchronize()
        hash_stream.synchronize()
    hashed, bad = 0, []
    for pos, hexdigest in table.hexdigests().items():
        hashed += plan[pos].length
        if hexdigest != plan[pos].digest:
            bad.append(plan[pos].index)
    if cuda and None in (on_device[i] for i in range(len(plan)) if i not in left):
        with torch.cuda.device(device):  # the scratch copies' memory back to the driver, as the slots' batch does
            torch.cuda.empty_cache()
    return left, hashed, bad


def _hash_landed(
    table: digest_on_device.DeviceDigests,
    data: torch.Tensor,
    pos: int,
    p: PiecePlan,
    outs: list[torch.Tensor],
    scratch: bool,
    stream,
    hash_stream,
) -> None:
    """Hash piece ``p`` (plan position ``pos``) in ``data`` on ``hash_stream`` once the copies queued on
    ``stream`` so far are done; a ``scratch`` copy's bytes then go on to the piece's constants (on
    ``stream``) and its memory is reused only once the hash has read it.  Streams None: the CPU."""
    cuda = stream is not None
    if cuda:
        landed = torch.cuda.Event()
        landed.record(stream)
        hash_stream.wait_event(landed)
    with torch.cuda.stream(hash_stream) if cuda else contextlib.nullcontext():
        table.hash(data, pos, p.length)
    if scratch:
        for cp in p.copies:
            outs[cp.constant][cp.in_constant : cp.in_constant + cp.nbytes].copy_(
                data[cp.in_piece : cp.in_piece + cp.nbytes], non_blocking=cuda
            )
        if cuda:
            data.record_stream(hash_stream)


def _scratch(n: int, device: torch.device) -> torch.Tensor:
    """Device bytes for a piece of ``n`` bytes to be copied into and hashed there: whole 64-byte blocks,
    the bytes past ``n`` zeros (the kernels read them as the last block's padding)."""
    t = torch.empty(-(-n // 64) * 64, dtype=torch.uint8, device=device)
    t[n:].zero_()
    return t
