"""Binding round trip (a no-op tool through the public API) against two floors measured in
the same run, in both of the machine's states.

The floors, each a JSON line sent to an echoing child process (blocking, as the bootstrap
is), read back and parsed:

- the event-loop floor: the host's side driven by anyio on the backend the host runs on,
  over a socket pair (the channel's transport), waiting on the socket as the host does;
- the blocking floor: a plain blocking pipe, no event loop at all.

The machine's states: "slow" wake-ups, where an idle CPU goes to sleep between two frames
and each wake-up pays for leaving its idle state (on a virtual machine, a trip through the
hypervisor), and "fast", where a busy spinner (at the idle scheduling class, so it never
delays anything else) keeps them awake. A round trip is mostly wake-ups, so the
same code measures several times apart in the two states; each ratio is taken within one.

Usage: python benchmarks/bindings.py [--state slow|fast|both] [--backend asyncio|trio]
[--rounds N] [--calls N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial

import anyio

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings

WARM_CALLS = 200
TARGET = 3.0
#: Calls made together under gather, as a code-mode program makes them.
GATHERED = 20

PIPE_ECHO = (
    "import sys\n"
    "r, w = sys.stdin.buffer, sys.stdout.buffer\n"
    "for line in r:\n"
    "    w.write(line); w.flush()\n"
)

SOCKET_ECHO = (
    "import socket, sys\n"
    "s = socket.socket(fileno=int(sys.argv[1]))\n"
    "while data := s.recv(65536):\n"
    "    s.sendall(data)\n"
)

FRAME = {"type": "call", "id": 0, "name": "noop", "arguments": {}}


def blocking_pipe_round_trip(calls: int) -> float:
    """Seconds per JSON line sent over a blocking pipe to an echoing process and read back."""
    child = subprocess.Popen(
        [sys.executable, "-c", PIPE_ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    frame = dict(FRAME)
    try:
        for warm in range(WARM_CALLS):
            frame["id"] = warm
            child.stdin.write(json.dumps(frame).encode() + b"\n")
            child.stdin.flush()
            json.loads(child.stdout.readline())
        started = time.perf_counter()
        for i in range(calls):
            frame["id"] = i
            child.stdin.write(json.dumps(frame).encode() + b"\n")
            child.stdin.flush()
            json.loads(child.stdout.readline())
        return (time.perf_counter() - started) / calls
    finally:
        child.stdin.close()
        child.wait()
        child.stdout.close()


async def event_loop_round_trip(calls: int) -> float:
    """Seconds per JSON line sent over a socket pair to an echoing process and read back,
    the host's side in the running event loop: a non-blocking send, then a wait for the
    socket to be readable (the loop's own wake-up) and a read, as the host's channel does."""
    host, child_end = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-c", SOCKET_ECHO, str(child_end.fileno())],
        pass_fds=[child_end.fileno()],
    )
    child_end.close()
    host.setblocking(False)
    buffer = bytearray()
    frame = dict(FRAME)

    async def round_trip(call_id: int) -> None:
        frame["id"] = call_id
        host.send(json.dumps(frame).encode() + b"\n")
        while (end := buffer.find(b"\n")) < 0:
            await anyio.wait_readable(host)
            buffer.extend(host.recv(65536))
        json.loads(bytes(buffer[:end]))
        del buffer[: end + 1]

    try:
        for warm in range(WARM_CALLS):
            await round_trip(warm)
        started = time.perf_counter()
        for i in range(calls):
            await round_trip(i)
        return (time.perf_counter() - started) / calls
    finally:
        host.close()
        child.wait()


def program(calls: int) -> str:
    """One call at a time, then batches of GATHERED under gather: seconds per call, and
    seconds per batch."""
    batches = max(1, calls // GATHERED)
    return f"""
import asyncio, time
for _ in range({WARM_CALLS}):
    await noop()
started = time.perf_counter()
for _ in range({calls}):
    await noop()
alone = (time.perf_counter() - started) / {calls}
started = time.perf_counter()
for _ in range({batches}):
    await asyncio.gather(*[noop() for _ in range({GATHERED})])
return [alone, (time.perf_counter() - started) / {batches}]
"""


async def noop() -> None:
    """The tool: async, as an agent runtime's tools are (plain functions run in a thread)."""


async def binding_round_trip(calls: int) -> tuple[float, float]:
    """Seconds per call made alone, and per batch of GATHERED calls under gather."""
    config = DeploymentConfig(
        profiles={
            "bench": ProfileConfig(
                backend="subprocess", limits=ExecutionLimits(cpu_seconds=60, wall_seconds=120.0)
            )
        }
    )
    async with Sandbox(config) as sandbox:
        result = await sandbox.run(
            program(calls), profile="bench", bindings=FunctionBindings({"noop": noop})
        )
    if result.error is not None:
        raise SystemExit(f"benchmark program failed: {result.error.message}")
    alone, gathered = result.return_value
    return float(alone), float(gathered)


#: Spins at the idle class until its parent is gone (a benchmark killed midway leaves no
#: spinner behind).
SPINNER = (
    "import os, sys\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "while os.getppid() == int(sys.argv[1]):\n"
    "    for _ in range(1_000_000):\n"
    "        pass\n"
)


@contextlib.contextmanager
def machine_state(state: str) -> Iterator[None]:
    """``fast``: a busy spinner at the idle scheduling class keeps the CPUs from sleeping
    (any runnable task of ours preempts it at once); ``slow``: nothing, CPUs sleep when
    idle. One spinner, not one pinned to each CPU: with those, the binding round trip (three
    threads in two processes) measured several times slower, the floors did not."""
    spinner = None
    try:
        if state == "fast":
            spinner = subprocess.Popen([sys.executable, "-c", SPINNER, str(os.getpid())])
        yield
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()


def measure(state: str, backend: str, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per round trip of each kind, rounds interleaved so every kind sees
    the same machine (its frequency and idle states swing a round trip by several times)."""
    samples: dict[str, list[float]] = {
        "blocking": [],
        "event_loop": [],
        "binding": [],
        "gathered": [],
    }
    with machine_state(state):
        for _ in range(rounds):
            samples["blocking"].append(blocking_pipe_round_trip(calls))
            samples["event_loop"].append(
                anyio.run(partial(event_loop_round_trip, calls), backend=backend)
            )
            alone, gathered = anyio.run(partial(binding_round_trip, calls), backend=backend)
            samples["binding"].append(alone)
            samples["gathered"].append(gathered)
    return {kind: statistics.median(values) for kind, values in samples.items()}


DESCRIPTION = {
    "slow": "slow wake-ups (idle CPUs sleep between frames)",
    "fast": "fast wake-ups (a busy spinner at the idle class keeps the CPUs awake)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", choices=["slow", "fast", "both"], default="both")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    options = parser.parse_args()
    states = ["slow", "fast"] if options.state == "both" else [options.state]
    print(
        f"host event loop: anyio on {options.backend}; {options.calls} calls per round, "
        f"medians of {options.rounds} rounds; load average before: "
        + " ".join(f"{load:.2f}" for load in os.getloadavg())
    )
    for state in states:
        result = measure(state, options.backend, options.rounds, options.calls)
        blocking, loop, binding = result["blocking"], result["event_loop"], result["binding"]
        print(f"\n{state}: {DESCRIPTION[state]}")
        print(f"  blocking pipe round trip (floor):      {blocking * 1e6:8.1f} us")
        print(
            f"  {options.backend} socket round trip (floor):{'':<{7 - len(options.backend)}}"
            f"{loop * 1e6:8.1f} us"
        )
        print(f"  binding round trip (no-op tool):       {binding * 1e6:8.1f} us")
        print(
            f"  {GATHERED} no-op calls under gather:          {result['gathered'] * 1e6:8.1f} us "
            f"({result['gathered'] / GATHERED * 1e6:.1f} us a call)"
        )
        print(
            f"  ratio to the {options.backend} floor: {binding / loop:.2f}x (target under "
            f"{TARGET:g}x); to the blocking pipe: {binding / blocking:.2f}x"
        )
    print("\nload average after: " + " ".join(f"{load:.2f}" for load in os.getloadavg()))


if __name__ == "__main__":
    main()
