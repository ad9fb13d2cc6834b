"""Binding round trip (a no-op tool through the public API) against a raw NDJSON round trip
between two Python processes over a pipe, measured in the same run. Prints both and the ratio.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import anyio

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core.bindings import FunctionBindings

CALLS = 2000

ECHO = (
    "import sys\n"
    "r, w = sys.stdin.buffer, sys.stdout.buffer\n"
    "for line in r:\n"
    "    w.write(line); w.flush()\n"
)


def raw_pipe_round_trip(calls: int) -> float:
    """Seconds per JSON line sent to an echoing process and read back and parsed."""
    child = subprocess.Popen(
        [sys.executable, "-c", ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    frame = {"type": "call", "id": 0, "name": "noop", "arguments": {}}
    try:
        for warm in range(200):
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


PROGRAM = f"""
import time
for _ in range(200):
    await noop()
started = time.perf_counter()
for _ in range({CALLS}):
    await noop()
return (time.perf_counter() - started) / {CALLS}
"""


async def noop() -> None:
    """The tool: async, as an agent runtime's tools are (plain functions run in a thread)."""


async def binding_round_trip() -> float:
    config = DeploymentConfig(
        profiles={
            "bench": ProfileConfig(
                backend="subprocess", limits=ExecutionLimits(cpu_seconds=60, wall_seconds=120.0)
            )
        }
    )
    async with Sandbox(config) as sandbox:
        result = await sandbox.run(
            PROGRAM, profile="bench", bindings=FunctionBindings({"noop": noop})
        )
    if result.error is not None:
        raise SystemExit(f"benchmark program failed: {result.error.message}")
    return float(result.return_value)


ROUNDS = 7


def main() -> None:
    # Interleaved rounds, medians: both measurements see the same machine (CPU frequency and
    # idle states swing a 10 us round trip by several times between runs).
    raws, bindings = [], []
    for _ in range(ROUNDS):
        raws.append(raw_pipe_round_trip(CALLS))
        bindings.append(anyio.run(binding_round_trip))
    raw = statistics.median(raws)
    binding = statistics.median(bindings)
    print(f"raw NDJSON pipe round trip: {raw * 1e6:8.1f} us (median of {ROUNDS} rounds)")
    print(f"binding round trip (no-op): {binding * 1e6:8.1f} us (median of {ROUNDS} rounds)")
    print(f"ratio: {binding / raw:.2f}x (target under 3x)")


if __name__ == "__main__":
    main()
