"""The ExecuTorch releases, and the policy each runs with its sharing setting off and on.

A person knows the ExecuTorch they ship, not our policy names.  :data:`RELEASES` maps every
release with a CUDA backend to the payload generation its exporter writes, the generations its
runtime reads, its sharing setting (the runtime option ``weight_sharing_across_methods``) with its
default, and the policy it runs for each payload generation and value of that setting.  Each row
carries the evidence it rests on; ``docs/upstream.md`` ("ExecuTorch releases and the policy each
runs") tabulates it.  :data:`REVISIONS` says which release first contains each upstream revision a
policy reproduces.  Payload generations are those of :mod:`toolkit.sources.executorch.payload`
(1: method-named keys, 2: ``"<so_key>\\n<weights_key>"``, 3: per-FQN manifests ``ETCUDAFQN*``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from toolkit.core.errors import InvalidChoiceError, UnknownExecuTorchVersionError
from toolkit.core.policies.registry import POLICY_CLASSES
from toolkit.core.vocab import PolicyName, parse

SETTING = "weight_sharing_across_methods"  # the CUDA backend's runtime option (cuda_backend.cpp)
GENERATIONS = (1, 2, 3)
LABEL_LIMIT = 48  # a label stands beside a policy name in tables that fit 100 columns
OURS = "ours"

# the values a run's setting can take
ON, OFF, NONE, ANY = "on", "off", "none", "any"  # NONE: the release has no setting; ANY: it is not read


@dataclass(frozen=True)
class Run:
    """What one release runs on ``.pte`` files of ``generations`` when its setting is ``value``."""

    policy: PolicyName
    generations: tuple[int, ...]
    value: str  # ON, OFF, NONE (no setting: never shares) or ANY (the setting is not read)

    @property
    def shares(self) -> bool:
        return self.value in (ON, ANY)


@dataclass(frozen=True)
class ExecuTorchRelease:
    """One minor release line of ExecuTorch with a CUDA backend (its patch releases run the same sharing code)."""

    release: str  # "1.3.x", or the one version where there is one ("1.2.0")
    versions: tuple[str, ...]  # the published versions it covers
    date: str  # of its first version (the tagged commit's date, or the wheel's files where no tag is stored)
    writes: int  # the payload generation its exporter writes
    setting: str  # the runtime option that turns sharing on; "" where the release has none
    default: str  # the setting's default (OFF); "" where there is no setting
    runs: tuple[Run, ...]  # what it runs, per payload generation it reads and value of the setting
    evidence: str  # the git commands (or the files) this row rests on, and what they said

    @property
    def reads(self) -> tuple[int, ...]:
        """The payload generations its runtime loads."""
        return tuple(sorted({g for r in self.runs for g in r.generations}))

    def policy(self, generation: int, sharing: bool) -> PolicyName | None:
        """The policy it runs on a ``.pte`` of ``generation`` with sharing on or off (None: it cannot read it)."""
        for r in self.runs:
            if generation in r.generations and (r.value in (NONE, ANY) or (r.value == ON) == sharing):
                return r.policy
        return None

    @property
    def sharing_off(self) -> PolicyName:
        """The policy it runs on the payload it writes, with sharing off (its default)."""
        return self.policy(self.writes, False)

    @property
    def sharing_on(self) -> PolicyName:
        """The policy it runs on the payload it writes, with sharing on (no setting: it never shares)."""
        return self.policy(self.writes, True)

    def setting_text(self, run: Run) -> str:
        """``run``'s setting in the user's words: ``weight_sharing_across_methods=on``."""
        if run.value == NONE:
            return "no sharing setting"
        if run.value == ANY:
            return f"any {self.setting}"
        return f"{self.setting}={run.value}" + (" (default)" if run.value == self.default else "")


_NO_SHARING, _NAME_ONLY, _REFUSE, _DECLINE, _VERIFY, _BLIND, _FQN = (
    PolicyName.NO_SHARING,
    PolicyName.NAME_ONLY,
    PolicyName.REFUSE_ON_MISMATCH,
    PolicyName.DECLINE_ON_MISMATCH,
    PolicyName.VERIFY_ALWAYS,
    PolicyName.BLIND_SHARE,
    PolicyName.FQN_WEIGHT_CACHE,
)
_MIRROR = "git -C executorch"  # a clone of pytorch/executorch with its tags and refs/pull/*

RELEASES: tuple[ExecuTorchRelease, ...] = (
    ExecuTorchRelease(
        "1.1.0",
        ("1.1.0",),
        "2026-01-27",
        1,
        "",
        "",
        (Run(_NO_SHARING, (1,), NONE),),
        f"{_MIRROR} ls-tree v1.1.0 backends/cuda/runtime: cuda_backend.cpp (v1.0.1 has no backends/cuda); "
        "git grep weight_sharing_across_methods v1.1.0: nothing; keys <method>_so_blob (cuda_backend.cpp:180)",
    ),
    ExecuTorchRelease(
        "1.2.0",
        ("1.2.0",),
        "2026-04-01",
        1,
        "",
        "",
        (Run(_NO_SHARING, (1,), NONE),),
        f"{_MIRROR} tag --contains 266ff2d71d (#18667, the first sharing): v1.3.0 first, not v1.2.0; "
        "git grep 'weight_sharing_across_methods\\|share_kv_cache' v1.2.0: nothing; "
        "keys <method>_so_blob (cuda_backend.cpp:275)",
    ),
    ExecuTorchRelease(
        "1.3.x",
        ("1.3.0", "1.3.1"),
        "2026-05-26",
        1,
        SETTING,
        OFF,
        (Run(_NO_SHARING, (1,), OFF), Run(_REFUSE, (1,), ON)),
        f"{_MIRROR} tag --contains 922adad721 (#18901): v1.3.0 first; git show "
        "v1.3.1:backends/cuda/runtime/cuda_backend.cpp: 'std::atomic<bool> weight_sharing_across_methods_{false};' "
        "(line 909), '... Refusing to share.' (1159); git grep share_kv_cache v1.3.0: nothing; keys "
        "<method>_so_blob (351)",
    ),
    ExecuTorchRelease(
        "1.4.x",
        ("1.4.0", "1.4.1"),
        "2026-08-06",
        2,
        SETTING,
        OFF,
        (Run(_NO_SHARING, (1, 2), OFF), Run(_REFUSE, (1, 2), ON)),
        f"{_MIRROR} tag --contains 3a9abee4b2 (#20424): v1.4.0 first (aoti_backend.py:303 keys sha256(so) + "
        "'_so_blob'); git show v1.4.1:backends/cuda/runtime/cuda_backend.cpp: "
        "'weight_sharing_across_methods_{false};' (886), '... Refusing to share.' (1127); "
        "backends/aoti/aoti_delegate_handle.h:155 resolve_blob_keys: an empty payload -> <method>_so_blob "
        "(reads gen 1); tag --contains e4b18fa9aa (#21959): no v* tag; release/1.4's tip is v1.4.1",
    ),
    ExecuTorchRelease(
        "1.5.x",
        ("1.5.0", "1.5.1"),
        "2026-09-15",
        3,
        SETTING,
        OFF,
        (Run(_NO_SHARING, (1, 2), OFF), Run(_DECLINE, (1, 2), ON), Run(_FQN, (3,), ANY)),
        "no v1.5.* tag nor release/1.5 branch in the mirror (main to cff6f4dd32, 2026-08-22); "
        "pip download --no-deps executorch==1.5.0 / ==1.5.1: version.py git_version f7140a46ff / 3b60683923 "
        "(neither in the mirror), files dated 2026-09-15 / 2026-09-18, backends/cuda/cuda_weight_collector.py "
        "CUDA_WEIGHT_CACHE_MAGIC = b'ETCUDAFQN3' (gen 3), no C++ runtime (+cpu wheels); the runtime modelled is "
        "refs/pull/21823/head 91323c9c96 (has e4b18fa9aa): 'versioned manifest artifacts do not consult this "
        "option', weight_sharing_across_methods_{false}, dense blobs keep #21959's decline: not from a tag",
    ),
)


class Revision(NamedTuple):
    """Where one upstream revision a policy reproduces first shipped, and which release runs its code."""

    pr: int
    commit: str  # on main, 10 hex digits; "" where no merge commit is stored
    first_tag: str  # the first release tag containing the commit ("" for none)
    runs_in: str  # the release of RELEASES that runs its code ("" for none)
    evidence: str


REVISIONS: tuple[Revision, ...] = (
    Revision(
        18667,
        "266ff2d71d",
        "v1.3.0",
        "",
        f"{_MIRROR} tag --contains 266ff2d71d: v1.3.0 first (branches release/1.3, release/1.4, main); "
        "git grep constants_extracted_ v1.3.0 -- backends/cuda/runtime/cuda_backend.cpp: nothing (#18901 "
        "replaced the inline sharing first): no release runs it",
    ),
    Revision(
        18864,
        "875f7c8019",
        "v1.3.0",
        "",
        f"{_MIRROR} tag --contains 875f7c8019: v1.3.0 first; git grep share_kv_cache v1.3.0: nothing "
        "(922adad721 removed the compile spec): no release runs it",
    ),
    Revision(
        18901,
        "922adad721",
        "v1.3.0",
        "1.3.x",
        f"{_MIRROR} tag --contains 922adad721: v1.3.0-rc1 v1.3.0 v1.3.1 v1.4.0 v1.4.1 (and their rcs)",
    ),
    Revision(
        20241,
        "182be0e26e",
        "v1.4.0",
        "1.4.x",
        f"{_MIRROR} tag --contains 182be0e26e: v1.4.0-rc1 v1.4.0 v1.4.1; branches release/1.4, main",
    ),
    Revision(
        20424,
        "3a9abee4b2",
        "v1.4.0",
        "1.4.x",
        f"{_MIRROR} tag --contains 3a9abee4b2: v1.4.0-rc1 v1.4.0 v1.4.1; branches release/1.4, main",
    ),
    Revision(
        21959,
        "e4b18fa9aa",
        "",
        "1.5.x",
        f"{_MIRROR} tag --contains e4b18fa9aa: no v* tag; branch -a --contains: main, not release/1.4; "
        "merge-base --is-ancestor e4b18fa9aa refs/pull/21823/head: yes (1.5.x's dense-blob path, not "
        "established from a tag)",
    ),
    Revision(
        21706,
        "144ce1bc77",
        "",
        "",
        f"{_MIRROR} branch -a --contains 144ce1bc77: nothing; tag --contains: nothing (closed, never merged)",
    ),
    Revision(
        21823,
        "",
        "",
        "1.5.x",
        f"{_MIRROR} log refs/heads/main (to cff6f4dd32, 2026-08-22): no commit of #21823; "
        "refs/pull/21823/head 91323c9c96 (payload ETCUDAFQN1) is no ancestor of main; "
        "the executorch 1.5.0 and 1.5.1 wheels write ETCUDAFQN3 (cuda_weight_collector.py)",
    ),
)

# upstream policies no release runs: (label, setting)
_NO_RELEASE: dict[PolicyName, tuple[str, str]] = {
    _NAME_ONLY: ("no release (unchecked core of #18901)", f"{SETTING}=on, checks removed"),
    _BLIND: (
        "no release: main between #18667 and #18901",
        "always on (#18667); share_kv_cache_across_methods=on (#18864)",
    ),
    _VERIFY: ("PR #21706, never merged", f"{SETTING}=on"),
}


class ReleasePolicy(NamedTuple):
    """One policy a release runs, and the setting under which it does."""

    policy: PolicyName
    setting: str  # "weight_sharing_across_methods=on", "no sharing setting", ...


class GenerationReader(NamedTuple):
    """One way a ``.pte`` of a payload generation is read upstream: the policy, the releases, the setting."""

    policy: PolicyName
    release: str  # "1.3.x-1.4.x"
    setting: str


def _short(release: str) -> str:
    """ "1.4.x" -> "1.4", "1.1.0" -> "1.1": a release line in few characters."""
    return release.removesuffix(".x").removesuffix(".0")


def _span(releases: list[ExecuTorchRelease]) -> str:
    return releases[0].release if len(releases) == 1 else f"{releases[0].release}-{releases[-1].release}"


def _writers(generations: tuple[int, ...]) -> str:
    w = [r for r in RELEASES if r.writes in generations]
    return _short(w[0].release) if len(w) == 1 else f"{_short(w[0].release)}-{_short(w[-1].release)}"


def executorch_releases(policy: str | PolicyName) -> str:
    """A short label (at most :data:`LABEL_LIMIT` characters) of the ExecuTorch releases that run ``policy``
    and the setting they run it under: ``ExecuTorch 1.3.x-1.4.x, sharing on``; ``ours`` for ours."""
    name = parse(PolicyName, policy, what="policy")
    if not POLICY_CLASSES[name].reproduces:
        return OURS
    if name in _NO_RELEASE:
        return _NO_RELEASE[name][0]
    running = [(rel, run) for rel in RELEASES for run in rel.runs if run.policy == name]
    span = _span(list(dict.fromkeys(rel for rel, _ in running)))
    values = {run.value for _, run in running}
    phrase = "always shares" if values == {ANY} else "sharing on" if values == {ON} else "sharing off (default)"
    label = f"ExecuTorch {span}, {phrase}"
    if all(rel.writes not in run.generations for rel, run in running):  # only on older exporters' files
        label += f", .pte of {_writers(running[0][1].generations)}"
    return label


def release_for_version(version: str) -> ExecuTorchRelease:
    """The row of :data:`RELEASES` for ``version``: ``1.5``, ``1.5.1``, ``v1.5.1``, ``1.5.1+cpu`` or ``1.4.0-rc2``."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+|x))?(?:-?rc\d+)?(?:\+[\w.]+)?", str(version).strip())
    if m:
        major, minor, patch = m.groups()
        line = f"{major}.{minor}"
        for rel in RELEASES:
            if any(v.startswith(line + ".") for v in rel.versions) and (
                patch in (None, "x") or f"{line}.{patch}" in rel.versions
            ):
                return rel
    known = ", ".join(v for rel in RELEASES for v in rel.versions)
    lines = ", ".join(dict.fromkeys(_short(rel.release) for rel in RELEASES))
    raise UnknownExecuTorchVersionError(
        f"unknown ExecuTorch version {version!r}: known versions are {known} (or a release line: {lines}); "
        "1.0.x and earlier have no CUDA backend"
    )


def policies_for_executorch(version: str, *, generation: int | None = None) -> tuple[ReleasePolicy, ...]:
    """The (policy, setting) pairs ExecuTorch ``version`` runs, sharing off before sharing on; the runs on
    the payload generation that release writes come last, so the last pair answers "this release's own
    ``.pte``, sharing on".  ``generation`` keeps those for a ``.pte`` of that payload generation."""
    rel = release_for_version(version)
    if generation is not None and generation not in rel.reads:
        raise InvalidChoiceError(
            f"ExecuTorch {rel.release} does not read a .pte of payload generation {generation} "
            f"(it reads generation {', '.join(map(str, rel.reads))})"
        )
    runs = [r for r in rel.runs if generation is None or generation in r.generations]
    runs.sort(key=lambda r: (rel.writes in r.generations, r.shares))
    out = []
    for r in runs:
        setting = rel.setting_text(r)
        if generation is None and rel.writes not in r.generations:
            setting += f", on a .pte of {_writers(r.generations)}"
        out.append(ReleasePolicy(r.policy, setting))
    return tuple(out)


def policies_for_payload_generation(generation: int) -> tuple[GenerationReader, ...]:
    """The upstream (policy, releases, setting) that read a ``.pte`` of payload ``generation``: those that
    share first (the question "with sharing on, is my .pte safe?"), then those that do not; consecutive
    releases running one policy under one setting are joined (``1.3.x-1.4.x``)."""
    if generation not in GENERATIONS:
        raise InvalidChoiceError(
            f"unknown payload generation {generation!r}; choose one of {', '.join(map(str, GENERATIONS))}"
        )
    found: list[tuple[bool, PolicyName, str, list[ExecuTorchRelease]]] = []
    for i, rel in enumerate(RELEASES):
        for run in rel.runs:
            if generation not in run.generations:
                continue
            setting = rel.setting_text(run)
            same = [f for f in found if f[1:3] == (run.policy, setting) and f[3][-1] is RELEASES[i - 1]]
            if i and same:
                same[0][3].append(rel)
            else:
                found.append((run.shares, run.policy, setting, [rel]))
    found.sort(key=lambda f: not f[0])  # stable: sharing first, releases in order
    return tuple(GenerationReader(policy, _span(rels), setting) for _, policy, setting, rels in found)


def policy_table() -> tuple[dict[str, str], ...]:
    """The rows of ``constshare policies``: policy, ours or upstream, its ExecuTorch releases, the setting
    that runs it, and its one-line summary."""
    rows = []
    for name, cls in POLICY_CLASSES.items():
        if not cls.reproduces:
            setting = ""
        elif name in _NO_RELEASE:
            setting = _NO_RELEASE[name][1]
        else:
            texts = [rel.setting_text(run) for rel in RELEASES for run in rel.runs if run.policy == name]
            kept = [t for t in dict.fromkeys(texts) if t != "no sharing setting"] or texts[:1]
            setting = "; ".join(kept)
        rows.append(
            {
                "policy": name.value,
                "origin": "upstream" if cls.reproduces else OURS,
                "executorch": executorch_releases(name),
                "setting": setting,
                "summary": cls.summary,
            }
        )
    return tuple(rows)
