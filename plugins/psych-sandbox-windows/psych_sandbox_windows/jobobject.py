"""A thin ctypes layer over Windows Job Objects, and the limits one execution's job gets.

A Job Object holds a process tree: every process a member starts is a member too, and none can
leave (no breakaway is allowed). Its limits are enforced by the kernel from outside the
processes: the number of live processes, the memory committed by all of them together, the
user-mode CPU time of the whole job. Kill-on-job-close ends every member when the last handle
to the job closes, so no descendant outlives the worker's handle, even if the worker dies.

Everything that touches Windows goes through :class:`JobApi`, one method per kernel call,
so the composition above it (what limits, in what order: created, limited, the child assigned
while still suspended, then resumed) is the same code on every platform and is tested on
Linux against a recording fake. :class:`Win32JobApi` is the real one.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from psych_sandbox_core.kit import (
    ExecutionLimits,
)

# JOBOBJECTINFOCLASS values.
JOB_OBJECT_BASIC_UI_RESTRICTIONS = 4
JOB_OBJECT_EXTENDED_LIMIT_INFORMATION = 9

# LimitFlags of JOBOBJECT_BASIC_LIMIT_INFORMATION.
JOB_OBJECT_LIMIT_JOB_TIME = 0x00000004
JOB_OBJECT_LIMIT_ACTIVE_PROCESS = 0x00000008
JOB_OBJECT_LIMIT_JOB_MEMORY = 0x00000200
JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION = 0x00000400
JOB_OBJECT_LIMIT_BREAKAWAY_OK = 0x00000800
JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK = 0x00001000
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000

# UIRestrictionsClass of JOBOBJECT_BASIC_UI_RESTRICTIONS: every one of them.
JOB_OBJECT_UILIMIT_HANDLES = 0x00000001
JOB_OBJECT_UILIMIT_READCLIPBOARD = 0x00000002
JOB_OBJECT_UILIMIT_WRITECLIPBOARD = 0x00000004
JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS = 0x00000008
JOB_OBJECT_UILIMIT_DISPLAYSETTINGS = 0x00000010
JOB_OBJECT_UILIMIT_GLOBALATOMS = 0x00000020
JOB_OBJECT_UILIMIT_DESKTOP = 0x00000040
JOB_OBJECT_UILIMIT_EXITWINDOWS = 0x00000080
UI_RESTRICTIONS_ALL = (
    JOB_OBJECT_UILIMIT_HANDLES
    | JOB_OBJECT_UILIMIT_READCLIPBOARD
    | JOB_OBJECT_UILIMIT_WRITECLIPBOARD
    | JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS
    | JOB_OBJECT_UILIMIT_DISPLAYSETTINGS
    | JOB_OBJECT_UILIMIT_GLOBALATOMS
    | JOB_OBJECT_UILIMIT_DESKTOP
    | JOB_OBJECT_UILIMIT_EXITWINDOWS
)

# Process creation flags and access rights.
CREATE_SUSPENDED = 0x00000004
CREATE_NEW_PROCESS_GROUP = 0x00000200
CREATE_NO_WINDOW = 0x08000000
PROCESS_TERMINATE = 0x0001
PROCESS_SET_QUOTA = 0x0100
PROCESS_SUSPEND_RESUME = 0x0800
PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
SYNCHRONIZE = 0x00100000

#: The exit status of every member when the job's CPU time limit ends it (documented
#: behaviour of JOB_OBJECT_LIMIT_JOB_TIME; ERROR_NOT_ENOUGH_QUOTA).
EXIT_JOB_TIME_EXCEEDED = 1816
#: The exit status this backend terminates a job with at teardown.
EXIT_TERMINATED = 1

#: Without a process limit in the profile, the job still bounds a fork bomb (the same number
#: the bwrap backend gives its pids cgroup).
DEFAULT_ACTIVE_PROCESSES = 256
#: Job CPU time is counted in units of 100 nanoseconds.
TICKS_PER_SECOND = 10_000_000


class IO_COUNTERS(ctypes.Structure):
    _fields_ = [
        ("ReadOperationCount", ctypes.c_uint64),
        ("WriteOperationCount", ctypes.c_uint64),
        ("OtherOperationCount", ctypes.c_uint64),
        ("ReadTransferCount", ctypes.c_uint64),
        ("WriteTransferCount", ctypes.c_uint64),
        ("OtherTransferCount", ctypes.c_uint64),
    ]


class JOBOBJECT_BASIC_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", ctypes.c_int64),
        ("PerJobUserTimeLimit", ctypes.c_int64),
        ("LimitFlags", ctypes.c_uint32),
        ("MinimumWorkingSetSize", ctypes.c_size_t),
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", ctypes.c_uint32),
        ("Affinity", ctypes.c_size_t),
        ("PriorityClass", ctypes.c_uint32),
        ("SchedulingClass", ctypes.c_uint32),
    ]


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
        ("IoInfo", IO_COUNTERS),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    ]


class JOBOBJECT_BASIC_UI_RESTRICTIONS(ctypes.Structure):
    _fields_ = [("UIRestrictionsClass", ctypes.c_uint32)]


@dataclass(frozen=True)
class JobLimits:
    """What one execution's job enforces."""

    active_processes: int
    #: Memory committed by the whole job, or None for no cap.
    job_memory_bytes: int | None
    #: User-mode CPU time of the whole job.
    job_cpu_seconds: int


def job_limits(limits: ExecutionLimits) -> JobLimits:
    """The job's limits from the execution's: the process count (or a default that still
    stops a fork bomb), the memory budget for the whole tree, and the CPU budget for it."""
    return JobLimits(
        active_processes=(
            limits.processes if limits.processes is not None else DEFAULT_ACTIVE_PROCESSES
        ),
        job_memory_bytes=limits.memory_bytes,
        job_cpu_seconds=limits.cpu_seconds,
    )


def extended_limit_information(limits: JobLimits) -> JOBOBJECT_EXTENDED_LIMIT_INFORMATION:
    """The structure SetInformationJobObject takes for ``limits``. Kill-on-close always; no
    breakaway ever; an unhandled exception ends the process instead of opening a dialog
    nobody will answer (which would hold the tree alive until the wall clock)."""
    info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
    basic = info.BasicLimitInformation
    flags = (
        JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
        | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION
        | JOB_OBJECT_LIMIT_ACTIVE_PROCESS
        | JOB_OBJECT_LIMIT_JOB_TIME
    )
    basic.ActiveProcessLimit = limits.active_processes
    basic.PerJobUserTimeLimit = limits.job_cpu_seconds * TICKS_PER_SECOND
    if limits.job_memory_bytes is not None:
        flags |= JOB_OBJECT_LIMIT_JOB_MEMORY
        info.JobMemoryLimit = limits.job_memory_bytes
    basic.LimitFlags = flags
    return info


def ui_restrictions() -> JOBOBJECT_BASIC_UI_RESTRICTIONS:
    """Every UI restriction: no clipboard, no other desktop's windows, no global atoms, no
    system settings, no logging off the worker's session."""
    return JOBOBJECT_BASIC_UI_RESTRICTIONS(UIRestrictionsClass=UI_RESTRICTIONS_ALL)


class JobApi(Protocol):
    """The kernel calls a job needs, one method each. Handles are integers."""

    def create_job(self) -> int: ...

    def set_information(self, job: int, info_class: int, info: ctypes.Structure) -> None: ...

    def open_process(self, pid: int, access: int) -> int: ...

    def assign(self, job: int, process: int) -> None: ...

    def resume(self, process: int) -> None: ...

    def terminate(self, job: int, exit_code: int) -> None: ...

    def close(self, handle: int) -> None: ...


class JobObject:
    """One execution's job: created with its limits, given the child while suspended, and
    terminated and closed at teardown."""

    def __init__(self, api: JobApi, handle: int) -> None:
        self.api = api
        self.handle: int | None = handle

    @classmethod
    def create(cls, api: JobApi, limits: JobLimits) -> JobObject:
        handle = api.create_job()
        job = cls(api, handle)
        try:
            api.set_information(
                handle, JOB_OBJECT_EXTENDED_LIMIT_INFORMATION, extended_limit_information(limits)
            )
            api.set_information(handle, JOB_OBJECT_BASIC_UI_RESTRICTIONS, ui_restrictions())
        except BaseException:
            job.close()
            raise
        return job

    def adopt_suspended(self, pid: int) -> None:
        """Put the suspended process ``pid`` in the job, then let it run: nothing it does
        happens outside the job. A failure leaves it suspended for teardown to kill."""
        assert self.handle is not None
        process = self.api.open_process(
            pid,
            PROCESS_SET_QUOTA
            | PROCESS_TERMINATE
            | PROCESS_SUSPEND_RESUME
            | PROCESS_QUERY_LIMITED_INFORMATION
            | SYNCHRONIZE,
        )
        try:
            self.api.assign(self.handle, process)
            self.api.resume(process)
        finally:
            self.api.close(process)

    def terminate(self) -> None:
        """End every process in the job now (idempotent; nothing once closed)."""
        if self.handle is not None:
            self.api.terminate(self.handle, EXIT_TERMINATED)

    def close(self) -> None:
        """Terminate, then close the handle: kill-on-close ends whatever terminating missed."""
        if self.handle is None:
            return
        handle, self.handle = self.handle, None
        try:
            self.api.terminate(handle, EXIT_TERMINATED)
        except OSError:
            pass  # already empty, or ending: closing the handle kills what is left
        finally:
            self.api.close(handle)


class Win32JobApi:
    """The real calls, through kernel32 and ntdll. Windows only."""

    def __init__(self) -> None:
        if sys.platform != "win32":
            raise OSError("Job Objects exist only on Windows")
        # WinDLL exists only on Windows (and in typeshed only there): looked up by name.
        windll: Any = getattr(ctypes, "WinDLL")  # noqa: B009
        self._kernel32: Any = windll("kernel32", use_last_error=True)
        self._ntdll: Any = windll("ntdll")
        k = self._kernel32
        k.CreateJobObjectW.restype = ctypes.c_void_p
        k.CreateJobObjectW.argtypes = [ctypes.c_void_p, ctypes.c_wchar_p]
        k.SetInformationJobObject.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_uint32,
        ]
        k.OpenProcess.restype = ctypes.c_void_p
        k.OpenProcess.argtypes = [ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32]
        k.AssignProcessToJobObject.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        k.TerminateJobObject.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        k.CloseHandle.argtypes = [ctypes.c_void_p]
        self._ntdll.NtResumeProcess.argtypes = [ctypes.c_void_p]

    def _check(self, ok: object, what: str) -> None:
        if not ok:
            error: int = getattr(ctypes, "get_last_error")()  # noqa: B009
            raise OSError(error, f"{what} failed (Windows error {error})")

    def create_job(self) -> int:
        handle = self._kernel32.CreateJobObjectW(None, None)
        self._check(handle, "CreateJobObjectW")
        return int(handle)

    def set_information(self, job: int, info_class: int, info: ctypes.Structure) -> None:
        ok = self._kernel32.SetInformationJobObject(
            job, info_class, ctypes.byref(info), ctypes.sizeof(info)
        )
        self._check(ok, "SetInformationJobObject")

    def open_process(self, pid: int, access: int) -> int:
        handle = self._kernel32.OpenProcess(access, False, pid)
        self._check(handle, "OpenProcess")
        return int(handle)

    def assign(self, job: int, process: int) -> None:
        self._check(
            self._kernel32.AssignProcessToJobObject(job, process), "AssignProcessToJobObject"
        )

    def resume(self, process: int) -> None:
        # subprocess closes the primary thread's handle, so the process is resumed whole.
        status = self._ntdll.NtResumeProcess(process)
        if status != 0:
            raise OSError(status, f"NtResumeProcess failed (status {status:#x})")

    def terminate(self, job: int, exit_code: int) -> None:
        self._check(self._kernel32.TerminateJobObject(job, exit_code), "TerminateJobObject")

    def close(self, handle: int) -> None:
        self._check(self._kernel32.CloseHandle(handle), "CloseHandle")
