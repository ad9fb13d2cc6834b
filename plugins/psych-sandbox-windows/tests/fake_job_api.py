"""A recording fake of the Job Object kernel calls: it does nothing but remember each call,
so the composition above it can be tested where Job Objects do not exist. It is a fake; the
real calls are exercised on Windows only (CI)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RecordingFakeJobApi:
    """Implements psych_sandbox_windows.jobobject.JobApi by recording calls."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    #: Names of calls that raise OSError, to test failure paths.
    failing: set[str] = field(default_factory=set)
    _next: int = 100

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        if call[0] in self.failing:
            raise OSError(5, f"{call[0]} failed (fake)")

    def _handle(self) -> int:
        self._next += 4
        return self._next

    def create_job(self) -> int:
        handle = self._handle()
        self._record("create_job", handle)
        return handle

    def set_information(self, job: int, info_class: int, info: ctypes.Structure) -> None:
        # A copy: the caller's structure could change after the call.
        self._record(
            "set_information", job, info_class, type(info).from_buffer_copy(bytes(memoryview(info)))
        )

    def open_process(self, pid: int, access: int) -> int:
        handle = self._handle()
        self._record("open_process", pid, access, handle)
        return handle

    def assign(self, job: int, process: int) -> None:
        self._record("assign", job, process)

    def resume(self, process: int) -> None:
        self._record("resume", process)

    def terminate(self, job: int, exit_code: int) -> None:
        self._record("terminate", job, exit_code)

    def close(self, handle: int) -> None:
        self._record("close", handle)

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]
