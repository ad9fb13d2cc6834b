"""psych-sandbox-smolagents: a smolagents executor that runs every code step of a
``CodeAgent`` in the sandbox (see the core's smolagents.md)."""

from .executor import SandboxExecutor, StepFailed

__all__ = ["SandboxExecutor", "StepFailed"]
__version__ = "0.2.0"
