"""psych-sandbox: run one untrusted Python program per execution in real OS isolation.

The public names below are imported when first used (PEP 562), not with the package: a
command such as ``psych-sandbox --help`` then pays only for what it uses, and importing a
submodule does not build every model and backend in the package.
"""

from __future__ import annotations

import importlib

#: typing.TYPE_CHECKING without importing typing, which costs more than this whole module;
#: type checkers treat the name as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._api.provider_shapes import (
        anthropic_tool_result,
        gemini_code_execution_result,
        shell_call_output,
    )
    from ._api.sandbox import Sandbox
    from ._api.sync_sandbox import Cancellation, SyncSandbox
    from ._bindings.bindings import (
        BindingProvider,
        CallErrorKind,
        FunctionBindings,
        ToolCallError,
        ToolSpec,
        load_function_tools,
    )
    from ._bindings.catalogue import describe_tools, spec_from_function
    from ._bindings.runlog import MemoryRunLog, RunLog, SQLiteRunLog
    from ._engine.pool import WarmStatus
    from ._output.attachments import AttachmentDenied
    from ._output.blobstore import BlobAddress, BlobStore, FilesystemBlobStore
    from ._output.capture import OutputPolicy
    from ._output.streaming import OutputChunk
    from ._policy.narrowing import ExecutionRequest, TenantPolicy
    from ._policy.profiles import DeploymentConfig, ProfileConfig
    from .budgets import BindingBudgets
    from .errors import (
        ConfigurationError,
        ErrorKind,
        InterpreterNotFoundError,
        InvalidRequestError,
        SandboxClosedError,
        SandboxError,
        UnknownBackendError,
        UnknownProfileError,
    )
    from .grading import Grade, Guarantee, Level, level_of
    from .result import Attachment, ExecutionFailure, ExecutionNote, ExecutionResult
    from .terms import ExecutionLimits

#: The one place the core's version is written; the distribution's metadata reads it from here.
__version__ = "0.2.0"

#: Each public name and the submodule that defines it.
_PUBLIC = {
    "Attachment": "result",
    "AttachmentDenied": "_output.attachments",
    "BindingProvider": "_bindings.bindings",
    "CallErrorKind": "_bindings.bindings",
    "FunctionBindings": "_bindings.bindings",
    "ToolCallError": "_bindings.bindings",
    "ToolSpec": "_bindings.bindings",
    "load_function_tools": "_bindings.bindings",
    "BlobAddress": "_output.blobstore",
    "BlobStore": "_output.blobstore",
    "FilesystemBlobStore": "_output.blobstore",
    "BindingBudgets": "budgets",
    "describe_tools": "_bindings.catalogue",
    "spec_from_function": "_bindings.catalogue",
    "ConfigurationError": "errors",
    "ErrorKind": "errors",
    "InterpreterNotFoundError": "errors",
    "InvalidRequestError": "errors",
    "SandboxClosedError": "errors",
    "SandboxError": "errors",
    "UnknownBackendError": "errors",
    "UnknownProfileError": "errors",
    "Grade": "grading",
    "Guarantee": "grading",
    "Level": "grading",
    "level_of": "grading",
    "ExecutionRequest": "_policy.narrowing",
    "TenantPolicy": "_policy.narrowing",
    "OutputPolicy": "_output.capture",
    "DeploymentConfig": "_policy.profiles",
    "ProfileConfig": "_policy.profiles",
    "anthropic_tool_result": "_api.provider_shapes",
    "gemini_code_execution_result": "_api.provider_shapes",
    "shell_call_output": "_api.provider_shapes",
    "ExecutionFailure": "result",
    "ExecutionNote": "result",
    "ExecutionResult": "result",
    "MemoryRunLog": "_bindings.runlog",
    "RunLog": "_bindings.runlog",
    "SQLiteRunLog": "_bindings.runlog",
    "Sandbox": "_api.sandbox",
    "OutputChunk": "_output.streaming",
    "Cancellation": "_api.sync_sandbox",
    "SyncSandbox": "_api.sync_sandbox",
    "ExecutionLimits": "terms",
    "WarmStatus": "_engine.pool",
}

__all__ = [
    "Attachment",
    "AttachmentDenied",
    "BindingBudgets",
    "BindingProvider",
    "BlobAddress",
    "BlobStore",
    "CallErrorKind",
    "Cancellation",
    "ConfigurationError",
    "DeploymentConfig",
    "ErrorKind",
    "ExecutionFailure",
    "ExecutionLimits",
    "ExecutionNote",
    "ExecutionRequest",
    "ExecutionResult",
    "FilesystemBlobStore",
    "FunctionBindings",
    "Grade",
    "Guarantee",
    "InterpreterNotFoundError",
    "InvalidRequestError",
    "Level",
    "MemoryRunLog",
    "OutputChunk",
    "OutputPolicy",
    "ProfileConfig",
    "RunLog",
    "SQLiteRunLog",
    "Sandbox",
    "SandboxClosedError",
    "SandboxError",
    "SyncSandbox",
    "TenantPolicy",
    "ToolCallError",
    "ToolSpec",
    "UnknownBackendError",
    "UnknownProfileError",
    "WarmStatus",
    "__version__",
    "anthropic_tool_result",
    "describe_tools",
    "gemini_code_execution_result",
    "level_of",
    "load_function_tools",
    "shell_call_output",
    "spec_from_function",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups find it without calling back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
