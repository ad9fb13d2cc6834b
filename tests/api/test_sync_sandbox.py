"""SyncSandbox: the same executions from synchronous code, one loop thread per instance, and
nothing left behind (threads, children, workspaces) after close, drop or Ctrl-C. Judged from
the host: /proc/self/task, the process table, the private temp directory."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from psych_sandbox_testing.host import host_processes

from psych_sandbox_core import (
    ConfigurationError,
    DeploymentConfig,
    ErrorKind,
    ExecutionLimits,
    FunctionBindings,
    ProfileConfig,
    SandboxClosedError,
    SyncSandbox,
)

from ..conftest import FAST_LIMITS, PROFILE, config, marker, pids_with, sleeper_argv_source

WARM = "warm"
BACKENDS = ["asyncio", "trio"]
#: How long a thread Python already joined may take to leave /proc/self/task (its last
#: instructions after releasing its state); there is no notification to wait on for that.
THREAD_EXIT_SECONDS = 10.0


def with_warm_profile() -> DeploymentConfig:
    """The test profile plus one that keeps a prepared child waiting: a child that exists
    before any run and must still be gone after close."""
    base = config()
    warm = ProfileConfig(backend="subprocess", warm=1, limits=ExecutionLimits(**FAST_LIMITS))
    return DeploymentConfig(profiles={**base.profiles, WARM: warm})


def os_threads() -> set[int]:
    """This process's threads as the kernel lists them."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def descendants() -> set[int]:
    """Live processes below this one in the host's process table."""
    table = host_processes()
    below: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {p.pid for p in table.values() if p.ppid in frontier and p.alive} - below
        below |= frontier
    return below


def wait_gone(probe: Any, baseline: set[int], seconds: float) -> set[int]:
    """Poll ``probe`` until it is back to ``baseline`` (or the deadline); the kernel has no
    notification for a thread or a process this test did not start itself ending."""
    deadline = time.monotonic() + seconds
    while True:
        extra: set[int] = probe() - baseline
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.01)


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler (a KeyboardInterrupt in the main thread), whatever the
    runner installed."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("async_backend", BACKENDS)
def test_runs_programs_with_the_async_sandboxs_semantics(async_backend: str) -> None:
    def lookup(key: str) -> str:
        return key.upper()

    tools = FunctionBindings({"lookup": lookup})
    with SyncSandbox(config(), async_backend=async_backend) as sandbox:
        ok = sandbox.run("print('hi')\nawait lookup(key='x')", profile=PROFILE, bindings=tools)
        failed = sandbox.run("[1][5]", profile=PROFILE)
        slow = sandbox.run("while True:\n    pass", profile=PROFILE, timeout=0.5)
        assert PROFILE in sandbox.profile_names()
    assert (ok.stdout, ok.return_value, ok.error) == ("hi\n", "X", None)
    assert failed.error is not None and failed.error.kind is ErrorKind.EXCEPTION
    assert slow.error is not None and slow.error.kind is ErrorKind.TIMEOUT
    with pytest.raises(SandboxClosedError):
        sandbox.run("1", profile=PROFILE)
    sandbox.close()  # closing twice is fine


def test_close_leaves_no_thread_and_no_child(private_tmp: Path) -> None:
    threads, children = os_threads(), descendants()
    mark = marker()
    with SyncSandbox(with_warm_profile()) as sandbox:
        sandbox.warmed(WARM)  # a prepared child waits for a program that never comes
        assert descendants() - children, "the warm child is visible from the host"
        result = sandbox.run(
            f"import subprocess, sys\nsubprocess.Popen({sleeper_argv_source(mark)})\n'left'",
            profile=PROFILE,
        )
        assert result.return_value == "left"
        assert os_threads() - threads, "the loop thread exists while the sandbox is open"
    # Processes are reaped before close returns; a joined thread may take a moment to leave.
    assert descendants() - children == set()
    assert wait_gone(os_threads, threads, THREAD_EXIT_SECONDS) == set()
    assert wait_gone(lambda: set(pids_with(mark)), set(), 10.0) == set()
    assert os.listdir(private_tmp) == []


def test_a_sandbox_dropped_unclosed_is_closed_by_its_finaliser() -> None:
    threads, children = os_threads(), descendants()
    sandbox = SyncSandbox(with_warm_profile())
    sandbox.warmed(WARM)
    assert sandbox.run("6 * 7", profile=PROFILE).return_value == 42
    loop_thread = next(t for t in threading.enumerate() if t.name == "psych-sandbox-loop")
    del sandbox
    gc.collect()
    assert not loop_thread.is_alive()
    assert descendants() - children == set()
    assert wait_gone(os_threads, threads, THREAD_EXIT_SECONDS) == set()


def test_trio_loop_thread_ends_at_close() -> None:
    # Trio keeps idle worker threads in a process-wide cache for a while (they are trio's,
    # shared, and end on their own); the loop thread and every child are gone at close.
    children = descendants()
    with SyncSandbox(with_warm_profile(), async_backend="trio") as sandbox:
        sandbox.warmed(WARM)
        loop_thread = next(t for t in threading.enumerate() if t.name == "psych-sandbox-loop")
        assert sandbox.run("1 + 1", profile=PROFILE).return_value == 2
    assert not loop_thread.is_alive()
    assert descendants() - children == set()
    # So are the wall clock's, the spawner's and the queue sweep's threads, which wait a
    # while for more work.
    assert all(
        t.name.startswith("Trio thread")
        or t.name
        in ("psych-sandbox-wall-clock", "psych-sandbox-spawner", "psych-sandbox-mqueue-sweep")
        for t in threading.enumerate()[1:]
    )


@pytest.mark.parametrize("async_backend", BACKENDS)
def test_ctrl_c_while_a_run_blocks_cancels_it_cleans_up_and_reraises(
    async_backend: str, default_sigint: None, private_tmp: Path
) -> None:
    assert threading.current_thread() is threading.main_thread()
    main = threading.main_thread().ident
    assert main is not None
    threads, children = os_threads(), descendants()
    mark = marker()

    def ready() -> bool:
        # The program is running and has started its own child: Ctrl-C now, to the thread
        # blocked in run().
        signal.pthread_kill(main, signal.SIGINT)
        return True

    program = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen({sleeper_argv_source(mark)})\n"
        "await ready()\n"
        "time.sleep(600)\n"
    )
    with SyncSandbox(config(), async_backend=async_backend) as sandbox:
        with pytest.raises(KeyboardInterrupt):
            sandbox.run(program, profile=PROFILE, bindings=FunctionBindings({"ready": ready}))
        # run() returned only after the teardown: the program's process is already reaped.
        assert descendants() - children == set()
        assert wait_gone(lambda: set(pids_with(mark)), set(), 10.0) == set()
        assert os.listdir(private_tmp) == []
        # The sandbox is still usable after the interrupt.
        assert sandbox.run("'still here'", profile=PROFILE).return_value == "still here"
    assert descendants() - children == set()
    if async_backend == "asyncio":
        assert wait_gone(os_threads, threads, THREAD_EXIT_SECONDS) == set()


def test_a_cancellation_from_another_thread_ends_the_run_as_cancelled() -> None:
    started = threading.Event()

    def ready() -> bool:
        started.set()
        return True

    with SyncSandbox(config()) as sandbox:
        cancel = sandbox.cancellation()

        def cancel_when_started() -> None:
            started.wait()
            cancel.cancel()

        helper = threading.Thread(target=cancel_when_started)
        helper.start()
        result = sandbox.run(
            "import time\nawait ready()\ntime.sleep(600)",
            profile=PROFILE,
            bindings=FunctionBindings({"ready": ready}),
            cancel=cancel,
        )
        helper.join()
        assert cancel.cancelled
        assert result.error is not None and result.error.kind is ErrorKind.CANCELLED
        with SyncSandbox(config()) as other, pytest.raises(ValueError):
            other.run("1", cancel=cancel)


def test_several_threads_run_at_once() -> None:
    count = 4
    state: dict[str, Any] = {"arrived": 0}

    async def meet() -> int:
        # Every program waits here until all have arrived: only concurrent runs get through.
        if "all_here" not in state:
            state["all_here"] = anyio.Event()
        state["arrived"] += 1
        if state["arrived"] == count:
            state["all_here"].set()
        with anyio.fail_after(60):
            await state["all_here"].wait()
        return int(state["arrived"])

    tools = FunctionBindings({"meet": meet})
    results: dict[int, Any] = {}
    with SyncSandbox(config()) as sandbox:

        def worker(index: int) -> None:
            results[index] = sandbox.run(
                f"[{index}, await meet()]", profile=PROFILE, bindings=tools
            )

        workers = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
    assert {i: r.return_value for i, r in results.items()} == {i: [i, count] for i in range(count)}


def test_close_cancels_a_run_still_going_in_another_thread() -> None:
    children = descendants()
    started = threading.Event()
    results: list[Any] = []

    def ready() -> bool:
        started.set()
        return True

    sandbox = SyncSandbox(config())

    def worker() -> None:
        results.append(
            sandbox.run(
                "import time\nawait ready()\ntime.sleep(600)",
                profile=PROFILE,
                bindings=FunctionBindings({"ready": ready}),
            )
        )

    runner = threading.Thread(target=worker)
    runner.start()
    started.wait()
    sandbox.close()  # returns once the running execution is torn down
    assert descendants() - children == set()
    runner.join()
    (result,) = results
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED


def test_ctrl_c_during_close_is_raised_only_once_everything_is_closed(
    default_sigint: None,
) -> None:
    main = threading.main_thread().ident
    assert threading.current_thread() is threading.main_thread() and main is not None
    children = descendants()
    started = threading.Event()
    results: list[Any] = []

    async def hold() -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            # The teardown close() began is cancelling this call, and the execution cannot
            # end before the call has: the Ctrl-C lands while close() waits for it.
            signal.pthread_kill(main, signal.SIGINT)

    sandbox = SyncSandbox(config())

    def worker() -> None:
        results.append(
            sandbox.run("await hold()", profile=PROFILE, bindings=FunctionBindings({"hold": hold}))
        )

    runner = threading.Thread(target=worker)
    runner.start()
    started.wait()
    loop_thread = sandbox._loop.thread
    with pytest.raises(KeyboardInterrupt):
        sandbox.close()
    assert not loop_thread.is_alive()
    assert descendants() - children == set()
    runner.join()
    (result,) = results
    assert result.error is not None and result.error.kind is ErrorKind.CANCELLED


def test_invalid_configuration_raises_at_construction_and_leaves_no_thread(
    tmp_path: Path,
) -> None:
    threads = os_threads()
    bad = tmp_path / "deployment.toml"
    bad.write_text("[profiles.x]\nbackend = 'subprocess'\nwarmth = 1\n")
    with pytest.raises(ConfigurationError):
        SyncSandbox(bad)
    assert not any(t.name == "psych-sandbox-loop" for t in threading.enumerate())
    assert wait_gone(os_threads, threads, THREAD_EXIT_SECONDS) == set()
