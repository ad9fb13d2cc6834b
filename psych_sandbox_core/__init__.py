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
from .provider_shapes import (
    anthropic_tool_result,
    gemini_code_execution_result,
    shell_call_output,
)
from .result import ExecutionFailure, ExecutionNote, ExecutionResult
from .sandbox import Sandbox
from .sync_sandbox import Cancellation, SyncSandbox
from .terms import ExecutionLimits

#: The one place the core's version is written; the distribution's metadata reads it from here.
__version__ = "0.1.0"

__all__ = [
    "BindingProvider",
    "Cancellation",
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
    "SyncSandbox",
    "ToolCallError",
    "ToolSpec",
    "UnknownBackendError",
    "UnknownProfileError",
    "__version__",
    "anthropic_tool_result",
    "gemini_code_execution_result",
    "level_of",
    "shell_call_output",
]
