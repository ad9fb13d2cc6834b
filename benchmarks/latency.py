"""Per-execution latency of `print(2+2)` through the public API, next to the physical floor.

The floor is the bare start-up (`python -I -c pass`) of the interpreter the backend runs,
measured in the same run, interleaved with the measurements so both see the same machine.
For each available backend it prints:

- cold: every execution launches its child from nothing;
- warm: a profile with `warm = 1`, at low load (each execution starts once the next child is
  ready, waited for, not guessed) — each child still runs exactly one program;
- sustained: the same warm profile driven back to back, as executions per second;
- where a backend names one (`bare_command()`), the bare equivalent of its own start-up
  (e.g. `docker run` of the same image) measured in the same run;
- the same, cold and warm, for a program that awaits (`await asyncio.sleep(0)`) and for a
  code-mode program (20 no-op binding calls under `asyncio.gather`), each also as a ratio to
  the program that does not await.

    python benchmarks/latency.py [--runs N] [--backend ID ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import anyio

from psych_sandbox_core import DeploymentConfig, FunctionBindings, ProfileConfig, Sandbox
from psych_sandbox_core.registry import BackendRegistry
from psych_sandbox_core.trials import trial

PROGRAM = "print(2+2)"
#: Programs compared with PROGRAM: each prints 4 too.
AWAITING = {
    "await": "import asyncio\nawait asyncio.sleep(0)\nprint(2+2)",
    "code mode": (
        "import asyncio\n"
        "replies = await asyncio.gather(*[noop() for _ in range(20)])\n"
        "print(2 + 2 if replies == [None] * 20 else replies)"
    ),
}


async def noop() -> None:
    return None


BINDINGS = FunctionBindings({"noop": noop})


def time_command(argv: Sequence[str]) -> float:
    started = time.perf_counter()
    subprocess.run(list(argv), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


async def time_run(sandbox: Sandbox, profile: str, program: str = PROGRAM) -> float:
    started = time.perf_counter()
    result = await sandbox.run(program, profile=profile, bindings=BINDINGS)
    elapsed = time.perf_counter() - started
    if result.error is not None or result.stdout != "4\n":
        raise SystemExit(f"{profile}: unexpected result {result.error}")
    return elapsed


async def measure(backend_id: str, runs: int) -> None:
    config = DeploymentConfig(
        profiles={
            "cold": ProfileConfig(backend=backend_id),
            "warm": ProfileConfig(backend=backend_id, warm=1),
        }
    )
    async with Sandbox(config) as sandbox:
        loaded = await sandbox._load("cold")
        interpreter = str(getattr(loaded.backend, "interpreter", sys.executable))
        bare_command = getattr(loaded.backend, "bare_command", None)
        floor_argv = [interpreter, "-I", "-c", "pass"]
        await time_run(sandbox, "cold")
        await time_run(sandbox, "warm")
        floor, cold, warm, bare = [], [], [], []
        awaiting: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in AWAITING}
        for _ in range(runs):
            floor.append(time_command(floor_argv))
            cold.append(await time_run(sandbox, "cold"))
            await sandbox.warmed("warm")  # low load: the next child is ready
            warm.append(await time_run(sandbox, "warm"))
            for name, program in AWAITING.items():
                awaiting[name][0].append(await time_run(sandbox, "cold", program))
                await sandbox.warmed("warm")
                awaiting[name][1].append(await time_run(sandbox, "warm", program))
            if bare_command is not None:
                bare.append(time_command(bare_command()))
        started = time.perf_counter()
        for _ in range(runs):
            await time_run(sandbox, "warm")
        rate = runs / (time.perf_counter() - started)
    f = statistics.median(floor)
    c = statistics.median(cold)
    w = statistics.median(warm)
    print(f"{backend_id}: floor `{' '.join(floor_argv[:1])} -I -c pass` median {f * 1e3:.2f} ms")
    print(f"{backend_id}:   cold       median {c * 1e3:7.2f} ms   ratio {c / f:5.2f}x")
    print(f"{backend_id}:   warm       median {w * 1e3:7.2f} ms   ratio {w / f:5.2f}x (low load)")
    print(f"{backend_id}:   sustained  {rate:7.1f} executions/s back to back (warm = 1)")
    for name, (cold_times, warm_times) in awaiting.items():
        ac, aw = statistics.median(cold_times), statistics.median(warm_times)
        print(
            f"{backend_id}:   {name:10} cold {ac * 1e3:7.2f} ms ({ac / f:5.2f}x floor, "
            f"{ac / c:4.2f}x print)   warm {aw * 1e3:7.2f} ms ({aw / f:5.2f}x floor, "
            f"{aw / w:4.2f}x print)"
        )
    if bare:
        b = statistics.median(bare)
        print(f"{backend_id}:   bare equivalent start-up median {b * 1e3:7.2f} ms ({b / f:5.2f}x)")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--backend", action="append", default=None)
    args = parser.parse_args()
    registry = BackendRegistry()
    for backend_id in args.backend or registry.ids():
        reason = await trial(registry, backend_id)
        if reason is not None:
            print(f"{backend_id}: not available here ({reason})")
            continue
        await measure(backend_id, args.runs)


if __name__ == "__main__":
    anyio.run(main)
