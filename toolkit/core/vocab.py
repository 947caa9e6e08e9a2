"""Closed vocabularies of the toolkit.

Every value that appears in a table, a CSV report or an event is one of these
string enums; their ``.value`` is what users see.  They are checked at the API
boundary with :func:`parse`.
"""

from __future__ import annotations

import enum
from typing import Iterable, TypeVar


class PolicyName(enum.StrEnum):
    NO_SHARING = "no-sharing"
    NAME_ONLY = "name-only"
    REFUSE_ON_MISMATCH = "refuse-on-mismatch"
    DECLINE_ON_MISMATCH = "decline-on-mismatch"
    VERIFY_ALWAYS = "verify-always"
    FINGERPRINT = "fingerprint"
    CONTENT_DEDUP = "content-dedup"
    BLIND_SHARE = "blind-share"
    FQN_WEIGHT_CACHE = "fqn-weight-cache"


class SessionStatus(enum.StrEnum):
    """Where a session stands.  Transitions: NOT_LOADED -load()-> LOADED or FAILED;
    any -close()-> CLOSED.  ``load()`` is refused once the session has left NOT_LOADED."""

    NOT_LOADED = "not loaded"  # constructed; load() not called, or interrupted before it ended
    LOADED = "loaded"  # every method loaded (some may be not runnable)
    FAILED = "failed"  # a method failed (the methods before it stay loaded), or the modelled exporter
    #                    refused the program (failed_stage is Stage.EXPORT: nothing is loaded)
    CLOSED = "closed"  # close() released every method; the results stay readable


class Stage(enum.StrEnum):
    """Where a failure lies."""

    EXPORT = "export"  # the modelled exporter refuses the program (fqn-weight-cache): nothing of it exists
    LOAD = "load"  # a method's load (integrity, its .so, the policy's refusal)
    RUN = "run"  # a loaded method's run raised


class MethodStatus(enum.StrEnum):
    """Where one method of a load stands."""

    LOADED = "loaded"
    FAILED = "failed"  # its load failed: nothing of it stayed in the cache
    NOT_REACHED = "not reached"  # an earlier method failed the load first
    UNLOADED = "unloaded"  # loaded, then unloaded (its results stay recorded)


class Decision(enum.StrEnum):
    """What became of one constant of one method."""

    LOADED = "loaded"  # this method's own copy, entered into the shared cache
    SHARED = "shared"  # this method runs on a tensor another method loaded
    DECLINED = "declined"  # a provisional hit was rejected: own copy, left out of the pairs
    PRIVATE = "private"  # own copy, never offered for sharing
    REFUSED = "refused"  # the whole load failed on this constant
    NEVER_FILLED = "never filled"  # upstream writes nothing into the slot: the method cannot run


class Lookup(enum.StrEnum):
    HIT = "hit"
    MISS = "miss"


class ConstantKind(enum.StrEnum):
    PARAMETER = "parameter"
    BUFFER = "buffer"
    LIFTED_CONSTANT = "lifted_constant"


class ProgramFormat(enum.StrEnum):
    """The file format a program was read from (``Program.format``), one per source of programs."""

    DIRECTORY = "constshare-program"  # our program directory: manifest.json beside per-method files
    PTE = "executorch-pte"  # an ExecuTorch .pte and its .ptd
    PT2 = "torch-pt2"  # a torch AOTInductor package


class TensorOrigin(enum.StrEnum):
    """Where the bytes a method runs on came from."""

    WHOLE_BLOB = "whole_blob"  # the container's own allocation, from update_constant_buffer_from_blob
    OWN_UPLOAD = "own_upload"  # a tensor the toolkit uploaded for this constant alone
    CACHE = "cache"  # a tensor another method put into the shared cache


class UploadPath(enum.StrEnum):
    """How one constant's bytes travelled to its device (:mod:`toolkit.upload`)."""

    MAPPED = "page-locked mapping"  # some of the constant's pages were locked for this load
    MAPPED_WARM = "page-locked mapping, already locked"  # every page locked by an earlier load
    LOCKED_NOW = "page-locked during this load"  # a first load that locked its pages as it copied
    HYBRID = "page-locked and pinned staging at once"
    STAGED = "pinned staging"
    # a piece read into the process's own pinned slots, hashed there, uploaded from there (toolkit.upload.stage_pieces)
    VERIFIED_STAGED = "verified pinned staging"
    # a piece copied by the device straight out of the file's page-locked pages and hashed where it landed
    VERIFIED_LOCKED = "verified page-locked"
    VERIFIED_HOST = "verified staging, host"  # the same on the CPU: plain slots, a host destination
    PIECES = "pinned staging by pieces"  # the same pipeline, nothing hashed (first_load="pipelined")
    PINNED_EACH = "pinned buffer per constant"
    HOST = "host read"  # on the CPU


class Reason(enum.StrEnum):
    """Why a decision was taken.  The human-readable sentence travels beside it."""

    SHARING_DISABLED = "sharing_disabled"
    FIRST_SEEN = "first_seen"
    NAME_HIT = "name_hit"
    NAME_HIT_UNCHECKED = "name_hit_unchecked"  # the all-hit branch: nothing to compare against
    METADATA_MATCH = "metadata_match"
    METADATA_MISMATCH = "metadata_mismatch"
    FINGERPRINT_MATCH = "fingerprint_match"
    CONTENT_MISMATCH = "content_mismatch"
    CONTENT_MATCH_OTHER_NAME = "content_match_other_name"
    MUTATED_BUFFER = "mutated_buffer"
    SAME_STATE = "same_state"  # one buffer of the eager program, written by one method, used by another
    OTHER_STATE = "other_state"  # same name, but another buffer of the eager program holds this state
    EMPTY_FQN = "empty_fqn"
    LOAD_REFUSED = "load_refused"
    NO_BLOB_TO_COMPARE = "no_blob_to_compare"
    NOT_IN_FIRST_METHOD = "not_in_first_method"  # blind-share: only the first method's constants are shared
    STORAGE_KEY_HIT = "storage_key_hit"  # fqn-weight-cache: the storage key is cached for this device
    SAME_KEY_IN_METHOD = "same_key_in_method"  # another slot of this method has its FQN (or storage key)
    VIEW_OF_STORAGE = "view_of_storage"  # fqn-weight-cache: its own sizes/strides/offset on a storage cached by key
    BLOB_SKIPPED = "blob_skipped"  # the all-hit branch skips the blob: a slot nothing points at stays empty
    EXPORT_REFUSED = "export_refused"  # fqn-weight-cache: the exporter refuses the program


class EventKind(enum.StrEnum):
    LOAD_STARTED = "load_started"
    CONTAINER_CREATED = "container_created"
    CONSTANT_ENUMERATED = "constant_enumerated"
    CACHE_LOOKUP = "cache_lookup"
    BLOB_UPLOADED = "blob_uploaded"
    CONSTANTS_EXTRACTED = "constants_extracted"
    CONSTANT_UPLOADED = "constant_uploaded"
    FIELD_COMPARED = "field_compared"
    DIGEST_COMPARED = "digest_compared"
    DECIDED = "decided"
    CACHE_ENTRY_ADDED = "cache_entry_added"
    CACHE_ENTRY_LEFT_UPSTREAM = "cache_entry_left_upstream"
    OUT_OF_BOUNDS_ALIAS = "out_of_bounds_alias"
    PAIRS_INSTALLED = "pairs_installed"
    METHOD_LOADED = "method_loaded"
    LOAD_FAILED = "load_failed"
    MEMORY_SAMPLED = "memory_sampled"
    METHOD_UNLOADED = "method_unloaded"
    CULPRIT_TRIED = "culprit_tried"


class MetadataField(enum.StrEnum):
    """The fields ExecuTorch's CUDA backend compares (cuda_backend.cpp), in its order."""

    DTYPE = "dtype"
    RANK = "rank"
    SIZES = "sizes"
    STRIDES = "strides"
    DEVICE_TYPE = "device_type"
    DEVICE_INDEX = "device_index"


class MethodOutcome(enum.StrEnum):
    """What became of one method (in a dry run: what would)."""

    OK = "ok"  # ran and matched its reference (dry run: would run on its own data only)
    WRONG = "wrong"  # ran and differs from its reference (dry run: would run on another constant's data)
    NOT_RUNNABLE = "not runnable"  # the out-of-bounds guard keeps it from running (upstream reads out of bounds)
    NO_REFERENCE = "no reference"  # loaded and runnable, nothing to compare against: neither ok nor wrong
    FAILED = "failed"  # its load (or its run) failed: ``stage`` says where
    REFUSED = "refused"  # the modelled exporter refuses the program: no method of it exists
    NOT_REACHED = "not reached"  # an earlier method failed the load first


UNREADABLE = "unreadable"  # a scanned file that cannot be read: a scan row's outcome, no method's


class DataProblem(enum.StrEnum):
    """Why a method runs on other data than its own for one constant."""

    SLOT_MISMATCH = "slot mismatch"  # the installed tensor cannot fill the slot (shape, dtype, bytes, device)
    CONTENT_DIFFERS = "content differs"  # shared, and the cached content digest is not its own
    STATE_LEAKED = "state leaked"  # shared state that is another buffer of the eager program
    STATE_NOT_SHARED = "state not shared"  # one buffer of the eager program, kept apart by this load
    SLOT_NEVER_FILLED = "slot never filled"  # upstream writes nothing into the slot (it reads garbage)

    @property
    def standalone(self) -> bool:
        """Wrong even when the method runs alone from its initial state (state problems need a writer first)."""
        return self in (DataProblem.SLOT_MISMATCH, DataProblem.CONTENT_DIFFERS, DataProblem.SLOT_NEVER_FILLED)


class BlameStatus(enum.StrEnum):
    CULPRIT = "culprit"  # undoing it (alone, or with its minimal set) made the verification pass
    HARMLESS = "harmless"  # ``blame_note`` says why: the method verifies ok, or undoing it fixes nothing
    INCONCLUSIVE = "inconclusive"  # tried, fixed nothing, and blame found no culprit of that verification
    NOT_TESTED = "not tested"  # no experiment: a dry run, blame not run, or the method not verified


class ExitCode(enum.IntEnum):
    """The CLI's exit codes (``report``, ``compare``, ``scan``, dry run or not)."""

    OK = 0
    PROBLEM = 1
    USAGE = 2
    NOT_VERIFIED = 3

    @staticmethod
    def worst(codes: Iterable["ExitCode"]) -> "ExitCode":
        """Several results as one code: PROBLEM over NOT_VERIFIED over OK."""
        order = (ExitCode.PROBLEM, ExitCode.NOT_VERIFIED)
        found = set(codes)
        return next((c for c in order if c in found), ExitCode.OK)


class UploadMode(enum.StrEnum):
    """Which uploader a load's CUDA uploads go through (:mod:`toolkit.upload`)."""

    MAPPED = "mapped"  # MappedBlobUploader: a reload copies straight from page-locked pages
    STAGED = "staged"  # HostStager alone: nothing is ever page-locked
    UNSTAGED = "unstaged"  # a fresh pinned buffer per constant (for measurements)


class FirstLoad(enum.StrEnum):
    """A blob's first load on the mapped path (:class:`toolkit.upload.MappedBlobUploader`)."""

    STAGED = "staged"
    LOCKED = "locked"
    HYBRID = "hybrid"
    # the staging pipeline of :func:`toolkit.upload.stage_pieces`, unhashed: for uploads not hashed as they are
    # staged (any integrity path but "staged"); its pinned slots are reused, nothing is ever locked
    PIPELINED = "pipelined"


class Integrity(enum.StrEnum):
    """How a load checks the program's files against their records (``LoadOptions.integrity``).

    Every path but ``off`` verifies each ``.so`` and reference file whole before the first ``.so``
    is opened; they differ in when a weights blob's pieces are verified and where its constants'
    uploads read them from.
    """

    # a blob's pieces verified as they are read; a per-constant upload's hashed in the process's own
    # staging slots and uploaded from there (toolkit.upload.stage_pieces)
    STAGED = "staged"
    COPY = "copy"  # a blob's pieces verified as they are read, into its sealed private copy, uploads read from it
    # a blob's pieces hashed in the program's file itself, uploads read from the file: no copy; trusts that
    # nothing writes the file between a piece's check and its upload
    IN_PLACE = "in-place"
    FILES_FIRST = "files-first"  # every byte of every file verified, into sealed copies, before the first .so opens
    OFF = "off"  # nothing checked: every file read in place (only for programs you edit yourself)

    @property
    def checks(self) -> bool:
        """Whether files are checked against their records at all."""
        return self is not Integrity.OFF

    @property
    def blobs_when_read(self) -> bool:
        """Whether a weights blob's pieces are verified as they are read rather than all before the first .so."""
        return self in (Integrity.STAGED, Integrity.COPY, Integrity.IN_PLACE)

    @property
    def in_place(self) -> bool:
        """Whether a blob's pieces read as needed are hashed in the program's file, with no private copy."""
        return self is Integrity.IN_PLACE

    @property
    def hashes_staging(self) -> bool:
        """Whether per-constant uploads are hashed in the staging slots they are uploaded from."""
        return self is Integrity.STAGED


class Oracle(enum.StrEnum):
    """What a method is checked against (``verify(oracle=...)``, ``report --oracle``)."""

    AUTO = "auto"  # its reference where there is one, else its own unshared load on generated inputs
    REFERENCE = "reference"  # references only
    UNSHARED = "unshared"  # its own unshared load for every method, on the reference's inputs where there is one
    GENERATED = "generated"  # its own unshared load on generated inputs only


class BlindSpot(enum.StrEnum):
    """What a verdict could not check (one ``Verdict.not_checked`` entry): an "ok" never hides one."""

    STATE = "sequence state"  # nothing says which shared constants a method writes, or no sequence ran
    NO_REFERENCE = "no reference"  # a method or sequence had nothing to be compared against
    ORACLE = "oracle blind spot"  # what the differential oracle's state model cannot tell from the file


class CheckedAgainst(enum.StrEnum):
    """What one verification row was checked against (its ``oracle`` column)."""

    EAGER = "eager reference"
    SUPPLIED = "supplied reference"
    UNSHARED_REFERENCE_INPUTS = "unshared load, reference inputs"  # the same method loaded alone, on its own bytes
    UNSHARED_SUPPLIED_INPUTS = "unshared load, supplied inputs"
    UNSHARED_GENERATED = "unshared load, generated inputs"


E = TypeVar("E", bound=enum.StrEnum)


class Members:
    """An enum's members as plain attributes, for code that reads them once per constant:
    ``Members(Decision).SHARED is Decision.SHARED``.

    On Python 3.11 ``EnumType.__getattr__`` takes every attribute read of an enum class off the
    interpreter's fast path, and a dry run reads about fifteen members per decision; a plain
    attribute read here stays on it.
    """

    def __init__(self, enum_type: type[enum.Enum]):
        self.__dict__.update(enum_type.__members__)


def parse(enum_type: type[E], value: object, *, what: str) -> E:
    """Turn user input into a member of ``enum_type`` or raise a ValueError naming the choices."""
    if isinstance(value, enum_type):
        return value
    try:
        return enum_type(str(value))
    except ValueError:
        choices = ", ".join(repr(m.value) for m in enum_type)
        raise ValueError(f"unknown {what} {value!r}; choose one of {choices}") from None
