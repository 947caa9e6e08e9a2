"""constshare toolkit: load multi-method AOTInductor programs with cross-method constant
sharing, record every decision, and verify every method against its eager reference."""

from .analysis import analyze, memory_floor
from .builder import build_program
from .compare import compare_policies
from .errors import (
    BuildError, IncompatibleProgramError, IntegrityError, LoadError, ManifestError, ProgramError, ToolkitError,
    WorkerCrashedError,
)
from .isolation import IsolatedLoad, load_isolated
from .loader import Session, load_program
from .manifest import Program
from .policies import POLICIES, Policy, get_policy
from .program import open_program
from .vocab import Decision, Lookup, PolicyName

__all__ = [
    "POLICIES", "BuildError", "Decision", "IncompatibleProgramError", "IntegrityError", "LoadError", "Lookup",
    "IsolatedLoad", "ManifestError", "Policy", "PolicyName", "Program", "ProgramError", "Session", "ToolkitError",
    "WorkerCrashedError", "analyze", "build_program", "compare_policies", "get_policy", "load_isolated", "load_program", "memory_floor", "open_program",
]
__version__ = "0.1.0"
