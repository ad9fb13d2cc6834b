"""The Job Object layer: the limits composed from an execution's, the structures handed to
the kernel, and the order of the calls, driven against a recording fake (fake_job_api.py)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from typing import Any

import pytest
from fake_job_api import RecordingFakeJobApi
from psych_sandbox_core import ExecutionLimits

from psych_sandbox_windows import jobobject
from psych_sandbox_windows.jobobject import (
    JOB_OBJECT_BASIC_UI_RESTRICTIONS,
    JOB_OBJECT_EXTENDED_LIMIT_INFORMATION,
    JOB_OBJECT_LIMIT_ACTIVE_PROCESS,
    JOB_OBJECT_LIMIT_BREAKAWAY_OK,
    JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION,
    JOB_OBJECT_LIMIT_JOB_MEMORY,
    JOB_OBJECT_LIMIT_JOB_TIME,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK,
    PROCESS_SET_QUOTA,
    PROCESS_SUSPEND_RESUME,
    PROCESS_TERMINATE,
    UI_RESTRICTIONS_ALL,
    JobLimits,
    JobObject,
    Win32JobApi,
    extended_limit_information,
    job_limits,
)

MiB = 1024 * 1024


def test_limits_are_composed_from_the_execution_s() -> None:
    limits = ExecutionLimits(cpu_seconds=7, memory_bytes=300 * MiB, processes=12)
    assert job_limits(limits) == JobLimits(
        active_processes=12, job_memory_bytes=300 * MiB, job_cpu_seconds=7
    )
    # No process limit in the profile still bounds a fork bomb; no memory cap means none.
    unbounded = ExecutionLimits(memory_bytes=None, processes=None)
    assert job_limits(unbounded).active_processes == jobobject.DEFAULT_ACTIVE_PROCESSES
    assert job_limits(unbounded).job_memory_bytes is None


def test_the_extended_limit_structure() -> None:
    info = extended_limit_information(
        JobLimits(active_processes=12, job_memory_bytes=300 * MiB, job_cpu_seconds=7)
    )
    basic = info.BasicLimitInformation
    flags = basic.LimitFlags
    for required in (
        JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
        JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION,
        JOB_OBJECT_LIMIT_ACTIVE_PROCESS,
        JOB_OBJECT_LIMIT_JOB_TIME,
        JOB_OBJECT_LIMIT_JOB_MEMORY,
    ):
        assert flags & required
    # Nothing may leave the job.
    assert not flags & (JOB_OBJECT_LIMIT_BREAKAWAY_OK | JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK)
    assert basic.ActiveProcessLimit == 12
    assert basic.PerJobUserTimeLimit == 7 * 10_000_000  # 100 ns units
    assert info.JobMemoryLimit == 300 * MiB
    without_memory = extended_limit_information(
        JobLimits(active_processes=1, job_memory_bytes=None, job_cpu_seconds=1)
    )
    assert not without_memory.BasicLimitInformation.LimitFlags & JOB_OBJECT_LIMIT_JOB_MEMORY


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="layout checked for 64-bit")
def test_structure_layout_matches_windows_x64() -> None:
    # The sizes and offsets winnt.h gives these structures on x64.
    assert ctypes.sizeof(jobobject.JOBOBJECT_BASIC_LIMIT_INFORMATION) == 64
    assert ctypes.sizeof(jobobject.IO_COUNTERS) == 48
    assert ctypes.sizeof(jobobject.JOBOBJECT_EXTENDED_LIMIT_INFORMATION) == 144
    assert jobobject.JOBOBJECT_EXTENDED_LIMIT_INFORMATION.JobMemoryLimit.offset == 120
    assert jobobject.JOBOBJECT_BASIC_LIMIT_INFORMATION.ActiveProcessLimit.offset == 40


def test_a_job_is_created_limited_and_restricted() -> None:
    api = RecordingFakeJobApi()
    job = JobObject.create(api, JobLimits(12, 300 * MiB, 7))
    assert api.names() == ["create_job", "set_information", "set_information"]
    _, handle, info_class, info = api.calls[1]
    assert handle == job.handle and info_class == JOB_OBJECT_EXTENDED_LIMIT_INFORMATION
    assert info.BasicLimitInformation.LimitFlags & JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    _, _, info_class, ui = api.calls[2]
    assert info_class == JOB_OBJECT_BASIC_UI_RESTRICTIONS
    assert ui.UIRestrictionsClass == UI_RESTRICTIONS_ALL


def test_a_job_whose_limits_cannot_be_set_is_closed() -> None:
    api = RecordingFakeJobApi(failing={"set_information"})
    with pytest.raises(OSError):
        JobObject.create(api, JobLimits(1, None, 1))
    assert api.names()[-1] == "close" and api.calls[-1][1] == api.calls[0][1]


def test_the_child_is_assigned_while_suspended_then_resumed() -> None:
    api = RecordingFakeJobApi()
    job = JobObject.create(api, JobLimits(1, None, 1))
    api.calls.clear()
    job.adopt_suspended(4242)
    assert api.names() == ["open_process", "assign", "resume", "close"]
    _, pid, access, process = api.calls[0]
    assert pid == 4242
    assert access & PROCESS_SET_QUOTA and access & PROCESS_TERMINATE
    assert access & PROCESS_SUSPEND_RESUME
    assert api.calls[1] == ("assign", job.handle, process)
    assert api.calls[2] == ("resume", process)
    assert api.calls[3] == ("close", process)


def test_a_child_that_cannot_be_assigned_is_never_resumed() -> None:
    api = RecordingFakeJobApi(failing={"assign"})
    job = JobObject.create(api, JobLimits(1, None, 1))
    api.calls.clear()
    with pytest.raises(OSError):
        job.adopt_suspended(4242)
    assert "resume" not in api.names()
    assert api.names()[-1] == "close"  # the process handle, not leaked


def test_closing_terminates_then_closes_once() -> None:
    api = RecordingFakeJobApi()
    job = JobObject.create(api, JobLimits(1, None, 1))
    handle = job.handle
    api.calls.clear()
    job.close()
    job.close()
    job.terminate()  # after close: nothing
    assert api.calls == [("terminate", handle, 1), ("close", handle)]


def test_a_failing_terminate_still_closes_the_handle() -> None:
    """Closing the handle is the backstop: kill-on-job-close ends whatever is left."""
    api = RecordingFakeJobApi(failing={"terminate"})
    job = JobObject.create(api, JobLimits(1, None, 1))
    job.close()
    assert api.names()[-2:] == ["terminate", "close"]


@pytest.mark.skipif(sys.platform == "win32", reason="tests the other platforms")
def test_the_real_api_refuses_to_exist_off_windows() -> None:
    with pytest.raises(OSError, match="only on Windows"):
        Win32JobApi()


@pytest.mark.skipif(sys.platform != "win32", reason="needs Windows (run in CI)")
def test_a_real_job_holds_the_tree_and_closing_it_ends_the_tree() -> None:
    """On Windows: a suspended child and the grandchild it starts die when the job closes."""
    api = Win32JobApi()
    job = JobObject.create(api, job_limits(ExecutionLimits()))
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print(g.pid, flush=True)\n"
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        creationflags=jobobject.CREATE_SUSPENDED | jobobject.CREATE_NO_WINDOW,
    )
    try:
        job.adopt_suspended(child.pid)
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        # Judged from the host: a handle on the grandchild, waited on after the job closes.
        kernel32: Any = getattr(ctypes, "WinDLL")("kernel32")  # noqa: B009
        kernel32.OpenProcess.restype = ctypes.c_void_p
        handle = kernel32.OpenProcess(jobobject.SYNCHRONIZE, False, grandchild)
        assert handle
        try:
            job.close()
            assert child.wait(timeout=60) == jobobject.EXIT_TERMINATED
            wait_object_0 = 0
            assert kernel32.WaitForSingleObject(ctypes.c_void_p(handle), 60_000) == wait_object_0
        finally:
            kernel32.CloseHandle(ctypes.c_void_p(handle))
    finally:
        if child.poll() is None:
            child.kill()
        job.close()
