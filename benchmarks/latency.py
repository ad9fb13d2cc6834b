"""Per-execution latency of `print(2+2)` through the public API, next to the physical floor.

The floor is the bare interpreter start-up (`python -I -c pass`) of the same interpreter the
backend runs, measured in the same run. Prints the medians and the ratio per backend.

    python benchmarks/latency.py [--runs N] [--backend ID ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import anyio

from psych_sandbox_core import Sandbox
from psych_sandbox_core.registry import BackendRegistry
from psych_sandbox_core.sandbox import trial


def bare_startup(interpreter: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([interpreter, "-I", "-c", "pass"], check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def api_latency(sandbox: Sandbox, profile: str, runs: int) -> float:
    await sandbox.run("print(2+2)", profile=profile)  # warm: selection, imports, caches
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        result = await sandbox.run("print(2+2)", profile=profile)
        samples.append(time.perf_counter() - started)
        if result.error is not None or result.stdout != "4\n":
            raise SystemExit(f"{profile}: unexpected result {result.error}")
    return statistics.median(samples)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--backend", action="append", default=None)
    args = parser.parse_args()
    registry = BackendRegistry()
    backends = args.backend or registry.ids()
    async with Sandbox(registry=registry) as sandbox:
        for backend_id in backends:
            reason = await trial(registry, backend_id)
            if reason is not None:
                print(f"{backend_id:>12}: not available here ({reason})")
                continue
            loaded = await sandbox._load(backend_id)
            interpreter = getattr(loaded.backend, "interpreter", sys.executable)
            floor = bare_startup(interpreter, args.runs)
            latency = await api_latency(sandbox, backend_id, args.runs)
            print(
                f"{backend_id:>12}: median {latency * 1000:7.2f} ms   bare `{interpreter} -I -c "
                f"pass` {floor * 1000:6.2f} ms   ratio {latency / floor:5.2f}x"
            )


if __name__ == "__main__":
    anyio.run(main)
