"""constshare toolkit: load multi-method AOTInductor programs with cross-method constant
sharing, record every decision, and verify every method against its eager reference.

Public names and submodules (``toolkit.report``, ``toolkit.plots``) are imported on first use
(PEP 562), so a dry run (``toolkit.dry_run``) never loads torch, and ``import toolkit``
stays cheap.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_EXPORTS = {
    "dry_run": "workflows.dry_run",
    "DryRun": "workflows.dry_run",
    "memory_floor": "workflows.dry_run",
    "build_program": "build.builder",
    "compare_policies": "workflows.compare",
    "PolicyComparison": "workflows.compare",
    "BuildError": "core.errors",
    "IncompatibleProgramError": "core.errors",
    "IntegrityError": "core.errors",
    "LoadError": "core.errors",
    "ManifestError": "core.errors",
    "ProgramError": "core.errors",
    "ReferenceDataError": "core.errors",
    "ToolkitError": "core.errors",
    "OutputError": "core.errors",
    "WorkerCrashedError": "core.errors",
    "IsolatedLoad": "workflows.isolation",
    "load_isolated": "workflows.isolation",
    "Session": "engine.session",
    "load_program": "engine.session",
    "Program": "core.model",
    "LoadOptions": "core.options",
    "options_from_environment": "core.options",
    "POLICIES": "core.policies",
    "Policy": "core.policies",
    "get_policy": "core.policies",
    "open_program": "sources",
    "ExampleExport": "sources.executorch.examples",
    "example_exports": "sources.executorch.examples",
    "build_sample": "build.samples",
    "BlameStatus": "core.vocab",
    "DataProblem": "core.vocab",
    "ExitCode": "core.vocab",
    "MethodOutcome": "core.vocab",
    "Verdict": "core.verdict",
    "Decision": "core.vocab",
    "Integrity": "core.vocab",
    "Oracle": "core.vocab",
    "Lookup": "core.vocab",
    "MethodStatus": "core.vocab",
    "PolicyName": "core.vocab",
    "ProgramFormat": "core.vocab",
    "SessionStatus": "core.vocab",
}
# names users know for a module -> the module: toolkit.report is the collision report
_MODULES = {"report": "reports.collision"}
# earlier names of the dry run, still answered with a DeprecationWarning: name -> what to use instead
_RENAMED = {"analyze": "dry_run(...).decisions", "run_analysis": "dry_run"}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if name in _RENAMED:
        return _renamed(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    elif name in _MODULES:
        value = importlib.import_module(f".{_MODULES[name]}", __name__)
    elif (
        "." not in name and importlib.util.find_spec(f"{__name__}.{name}") is not None
    ):  # a submodule: toolkit.reports.collision, toolkit.plots
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
    globals()[name] = value
    return value


def _renamed(name: str) -> Any:
    import functools
    import warnings

    from toolkit.workflows.dry_run import dry_run

    @functools.wraps(dry_run)
    def old(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"toolkit.{name} is toolkit.{_RENAMED[name]} now", DeprecationWarning, stacklevel=2)
        result = dry_run(*args, **kwargs)
        return result.decisions if name == "analyze" else result

    return old


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
