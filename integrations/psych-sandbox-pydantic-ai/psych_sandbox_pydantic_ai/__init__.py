"""psych-sandbox-pydantic-ai: ``run_python`` as a Pydantic AI toolset, each program run in
the sandbox (see the core's pydantic-ai.md)."""

from .toolset import sandbox_toolset

__all__ = ["sandbox_toolset"]
__version__ = "0.2.0"
