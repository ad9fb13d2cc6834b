"""psych-sandbox: run one untrusted Python program per execution in real OS isolation."""

from .bindings import BindingProvider, FunctionBindings, ToolCallError, ToolSpec
from .errors import (
    ConfigurationError,
    ErrorKind,
    InterpreterNotFoundError,
    SandboxClosedError,
    SandboxError,
    UnknownBackendError,
    UnknownProfileError,
)
from .grading import Grade, Guarantee, Level, level_of
from .profiles import DeploymentConfig, ProfileConfig
from .result import ExecutionFailure, ExecutionNote, ExecutionResult
from .sandbox import Sandbox
from .terms import ExecutionLimits

#: The one place the core's version is written; the distribution's metadata reads it from here.
__version__ = "0.1.0"

__all__ = [
    "BindingProvider",
    "ConfigurationError",
    "DeploymentConfig",
    "ErrorKind",
    "ExecutionFailure",
    "ExecutionLimits",
    "ExecutionNote",
    "ExecutionResult",
    "FunctionBindings",
    "Grade",
    "Guarantee",
    "InterpreterNotFoundError",
    "Level",
    "ProfileConfig",
    "Sandbox",
    "SandboxClosedError",
    "SandboxError",
    "ToolCallError",
    "ToolSpec",
    "UnknownBackendError",
    "UnknownProfileError",
    "__version__",
    "level_of",
]
