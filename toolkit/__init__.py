"""constshare toolkit: load multi-method AOTInductor programs with cross-method constant
sharing, record every decision, and verify every method against its eager reference.

Public names are imported on first use (PEP 562), so ``import toolkit.analysis`` or a
dry run never loads torch, and ``import toolkit`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "analyze": "analysis", "memory_floor": "analysis", "run_analysis": "analysis",
    "build_program": "builder",
    "compare_policies": "compare", "PolicyComparison": "compare",
    "BuildError": "errors", "IncompatibleProgramError": "errors", "IntegrityError": "errors", "LoadError": "errors",
    "ManifestError": "errors", "ProgramError": "errors", "ReferenceDataError": "errors", "ToolkitError": "errors",
    "OutputError": "errors", "WorkerCrashedError": "errors",
    "IsolatedLoad": "isolation", "load_isolated": "isolation",
    "Session": "session", "load_program": "session",
    "Program": "model",
    "LoadOptions": "options", "options_from_environment": "options",
    "POLICIES": "policies", "Policy": "policies", "get_policy": "policies",
    "open_program": "sources",
    "BlameStatus": "verdict", "DataProblem": "verdict", "ExitCode": "verdict", "MethodOutcome": "verdict",
    "Verdict": "verdict",
    "Decision": "vocab", "Lookup": "vocab", "MethodStatus": "vocab", "PolicyName": "vocab",
    "ProgramFormat": "vocab", "SessionStatus": "vocab",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
