"""A host killed outright (SIGKILL) at a chosen point of an execution, and a restarted host
that must reap what it left: for the fault tests and benchmarks/faults.py.

:class:`Hosts` runs one host process per point. At its point a hook in that host writes
``AT <point> <pid>`` to its stdout and then blocks the whole host (a read of a pipe nobody
writes), so nothing moves on until the caller, having read the line, kills it: the kill
lands exactly there, with no sleep and no race. Then a restarted host, a new process under
the same uid range and the same durable run log, runs one execution per killed host: its
start-up is where a restarted host reaps (temporary directories, cgroups), each lease it
takes sweeps what a dead holder of that uid left, and each program counts what its run's
call budget has left.
What is left is judged from the host (:mod:`.census`), by the dead host's pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from typing import Any, cast

#: Where a host can be killed: its child launched but not yet heard from; the child's hello
#: read; a binding call in flight (two calls already spent); the program's files being
#: collected (by the host's walk, or over the channel); the execution's teardown (its
#: process tree ended, its uid not yet swept and handed back). The hooks are the core's own,
#: so every backend stops at the same points.
POINTS = ("spawn", "handshake", "binding", "artifacts", "teardown")

#: Calls the run may make in all, and what the program spends before the binding point.
RUN_CALLS = 4
SPENT_BEFORE_BLOCK = 2


def run_id(point: str) -> str:
    """The run a host killed at ``point`` spends its calls in."""
    return f"fault-{point}"


#: The killed host's program: two calls, a call that blocks where the point is ``binding``,
#: files to collect, then the end.
PROGRAM = """
await spend()
await spend()
await block()
import os
os.makedirs("out", exist_ok=True)
for i in range(3):
    with open(f"out/f{i}.txt", "w") as fh:
        fh.write("x" * 100)
3
"""

#: The restarted host's program: how many calls the run has left.
COUNT_LEFT = """
n = 0
while True:
    try:
        await spend()
    except ToolError as exc:
        return [n, exc.kind]
    n += 1
"""


def calls_spent(point: str) -> int:
    """Calls the run has spent when a host is killed at ``point`` (the one in flight too)."""
    return 0 if point in ("spawn", "handshake") else SPENT_BEFORE_BLOCK + 1


class Hosts:
    """Hosts in processes of their own, one per point, each stopped at its point, then a
    restarted host (see the module docstring).

    One process imports the library once and forks every host from it, and later the
    restarted host: each is a host process of its own (its own pid, nothing reaped or
    detected yet), at the cost of one interpreter's start-up."""

    def __init__(
        self, backend: str, options: dict[str, Any], run_log: str, points: list[str]
    ) -> None:
        self.points = points
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "psych_sandbox_testing.faults",
                backend,
                json.dumps(options),
                run_log,
                ",".join(points),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        #: The host process stopped at each point, by point.
        self.pids: dict[str, int] = {}

    def wait_at_points(self) -> dict[str, int]:
        """Block until every host reports it stands at its point; AssertionError, with the
        stderr, if one ended first."""
        assert self.process.stdout is not None
        while len(self.pids) < len(self.points):
            line = self.process.stdout.readline()
            if line.startswith(b"RESULT "):
                # A result handed back before its teardown: the host stops there next.
                continue
            if not line.startswith(b"AT "):
                self.process.kill()
                _, err = self.process.communicate()
                raise AssertionError(
                    f"a host never reached its point: {line!r}; {err.decode()[-3000:]}"
                )
            _, point, pid = line.decode().split()
            self.pids[point] = int(pid)
        return self.pids

    def kill(self) -> None:
        """SIGKILL every host at its point."""
        for pid in self.pids.values():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def restart(self) -> dict[str, list[Any]]:
        """Once the killed hosts are reaped, a new host runs :data:`COUNT_LEFT` once in the
        run of each point (each execution leases the range's next uid); by point, what the
        run had left ([count, kind])."""
        out, err = self.process.communicate(b"restart\n", timeout=300)
        found: dict[str, list[Any]] = {}
        for line in out.decode().splitlines():
            if line.startswith("RESULT "):
                point, _, text = line[len("RESULT ") :].partition(" ")
                result = json.loads(text)
                assert result["error"] is None, result["error"]
                found[point] = result["return_value"]
        assert self.process.returncode == 0 and set(found) == set(self.points), err.decode()[-3000:]
        return found

    def close(self) -> None:
        """Kill whatever still runs (after a failure) and reap it."""
        self.kill()
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


# ---------------------------------------------------------------- inside the host process


def _stop_here(point: str) -> None:
    """Say where the host stands, then hold it there until it is killed."""
    os.write(1, f"AT {point} {os.getpid()}\n".encode())
    reading, _writing = os.pipe()
    os.read(reading, 1)  # nobody writes: the host stands still until the SIGKILL
    raise AssertionError("the host was not killed at its point")


def _install(point: str) -> dict[str, Any]:
    """Hook the host at ``point``; the bindings the program calls."""
    from psych_sandbox_core._engine import conversation, driver
    from psych_sandbox_core._output.artifact_channel import ChannelCollector
    from psych_sandbox_core.kit.posix.identity import IdentityLease

    def spend() -> None:
        return None

    def block() -> None:
        if point == "binding":
            _stop_here(point)

    if point == "spawn":
        # The child is launched and the host is about to wait for its hello.
        handshake = driver.ChildDriver.handshake

        async def spawned(self: driver.ChildDriver) -> None:
            _stop_here(point)
            await handshake(self)

        cast(Any, driver.ChildDriver).handshake = spawned
    elif point == "handshake":
        hello = conversation.Conversation._hello

        def heard(self: conversation.Conversation, frame: Any) -> Any:
            _stop_here(point)
            return hello(self, frame)

        cast(Any, conversation.Conversation)._hello = heard
    elif point == "artifacts":
        walk = cast(Any, driver).collect_artifacts
        receive = ChannelCollector.receive

        def walked(*args: Any) -> Any:
            _stop_here(point)
            return walk(*args)

        def received(self: ChannelCollector, frame: Any) -> None:
            _stop_here(point)
            receive(self, frame)

        cast(Any, driver).collect_artifacts = walked
        cast(Any, ChannelCollector).receive = received
    elif point == "teardown":
        # The execution's tree is gone and its uid is about to be swept and handed back.
        retire = IdentityLease.retire

        async def retiring(self: IdentityLease, empty: Any = None) -> None:
            _stop_here(point)
            await retire(self, empty)

        cast(Any, IdentityLease).retire = retiring
    return {"spend": spend, "block": block}


def _host(
    role: str, backend: str, options: dict[str, Any], run_log: str, points: list[str]
) -> None:
    """One host: the program in the run of ``points[0]``, stopped there (``host``), or
    COUNT_LEFT once in the run of each point (``restart``)."""
    import anyio
    from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
    from psych_sandbox_core._bindings.bindings import FunctionBindings
    from psych_sandbox_core._bindings.runlog import SQLiteRunLog
    from psych_sandbox_core.budgets import BindingBudgets

    tools = _install(points[0]) if role == "host" else {"spend": lambda: None}
    config = DeploymentConfig(
        profiles={
            "faults": ProfileConfig(
                backend=backend,
                options=options,
                budgets=BindingBudgets(calls_per_execution=RUN_CALLS, calls_per_run=RUN_CALLS),
                limits=ExecutionLimits(wall_seconds=60.0, grace_seconds=0.5),
            )
        }
    )

    async def main() -> None:
        async with Sandbox(config, run_log=SQLiteRunLog(run_log)) as sandbox:
            for point in points:
                result = await sandbox.run(
                    PROGRAM if role == "host" else COUNT_LEFT,
                    profile="faults",
                    run_id=run_id(point),
                    bindings=FunctionBindings(tools),
                )
                print("RESULT", point, result.model_dump_json(), flush=True)

    anyio.run(main)


def _forked(work: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            work()
        except BaseException:
            traceback.print_exc()
            status = 1
        finally:
            sys.stdout.flush()
            os._exit(status)
    return pid


def _zygote(backend: str, options_json: str, run_log: str, points_text: str) -> None:
    """Import once, fork one host per point, wait for ``restart`` on stdin, reap the killed
    hosts, fork the restarted one and wait for it."""
    # Everything a host needs, imported before the forks (no thread runs yet).
    from psych_sandbox_core import Sandbox  # noqa: F401
    from psych_sandbox_core._bindings.bindings import FunctionBindings  # noqa: F401
    from psych_sandbox_core._bindings.runlog import SQLiteRunLog  # noqa: F401

    options = json.loads(options_json)
    points = points_text.split(",")
    hosts = [_forked(partial(_host, "host", backend, options, run_log, [p])) for p in points]
    sys.stdin.readline()
    for pid in hosts:
        os.waitpid(pid, 0)
    os.waitpid(_forked(partial(_host, "restart", backend, options, run_log, points)), 0)


if __name__ == "__main__":
    _zygote(*sys.argv[1:5])
