"""Which policy a command answers for when the user names none, in ExecuTorch's terms.

A ``.pte`` is read by the ExecuTorch releases of its payload generation, so a command given no
policy answers for what those releases run with sharing on (the user's question: "with sharing on,
is my file safe?"), names the release and the setting, and shows ours (``fingerprint``) as the fix
where it differs.  ``--executorch VERSION`` picks what that release runs.  A program directory or a
``.pt2`` has no ExecuTorch release: it keeps :data:`DEFAULT_POLICY`.
"""

from __future__ import annotations

from toolkit.core.policies.releases import (
    executorch_releases,
    policies_for_executorch,
    policies_for_payload_generation,
)
from toolkit.core.vocab import ExitCode, PolicyName

DEFAULT_POLICY = PolicyName.FINGERPRINT.value  # ours: shares a constant only where its bytes are the same


def payload_generation(program) -> int | None:
    """The newest payload generation among a ``.pte``'s methods (None: not a ``.pte``)."""
    if program is None:
        return None
    found = {getattr(m.location, "generation", 0) for m in program.methods} - {0}
    return max(found) if found else None


def described(policy: str) -> str:
    """``policy`` with the ExecuTorch releases that run it."""
    return f"{policy}: {executorch_releases(policy)}"


def policy_for_report(program, a) -> tuple[str, str]:
    """The one policy ``report`` answers for, and a line saying why it was chosen."""
    generation = payload_generation(program)
    if a.policy:
        return a.policy, f"policy {described(a.policy)}"
    if a.executorch:
        policy, setting = policies_for_executorch(a.executorch, generation=generation)[-1]
        return policy, f"ExecuTorch {a.executorch} runs {policy} on this file ({setting})"
    if generation is None:
        return DEFAULT_POLICY, f"policy {described(DEFAULT_POLICY)}, the default here; --policy or --executorch picks"
    first, *others = [r for r in policies_for_payload_generation(generation) if r[0] != "no-sharing"]
    policy, release, setting = first
    also = "".join(f"; ExecuTorch {r} runs {p} ({s})" for p, r, s in others)
    return policy, (
        f"this .pte (payload generation {generation}) is read by ExecuTorch {release}, which runs {policy} "
        f"({setting}){also}; --executorch VERSION or --policy picks"
    )


def policies_for_compare(program, a) -> list[str] | None:
    """The policies ``compare`` and ``scan`` answer for (None: every one)."""
    if a.policies:
        return a.policies.split(",")
    if getattr(a, "executorch", None):
        chosen = [p for p, _ in policies_for_executorch(a.executorch, generation=payload_generation(program))]
        return list(dict.fromkeys([*chosen, DEFAULT_POLICY]))
    return None


def fix_line(program, verdict, *, device: str | None) -> str:
    """Under an upstream policy that fails, what ours (``fingerprint``) predicts, where it differs."""
    if verdict.policy == DEFAULT_POLICY or verdict.exit_code is not ExitCode.PROBLEM:
        return ""
    from toolkit.workflows.dry_run import dry_run

    ours = dry_run(program, DEFAULT_POLICY, device=device).verdict
    if ours.exit_code is ExitCode.PROBLEM:
        return f"fix: {DEFAULT_POLICY} (ours) fails too (predicted): {ours.headline()}"
    return f"fix: under {DEFAULT_POLICY} (ours) every method would run on its own data (predicted)"
