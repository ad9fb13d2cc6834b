"""The files the compiled bootstrap reaches a backend's child through, in a run directory the
child reads: their names and the interpreter arguments that run them."""

from __future__ import annotations

from psych_sandbox_core.child.loader import CODE_FILE, SOURCE_FILE, directory_arguments

__all__ = ["CODE_FILE", "SOURCE_FILE", "directory_arguments"]
