"""The remote backend over loopback, next to the same profile run locally.

Starts three ``psych-sandbox serve`` processes of a bwrap profile on loopback and prints, each
next to its local floor measured in the same run:

- the round trip of ``print(2+2)`` through one service (median of N), and run locally;
- the binding round trip across the wire (a program calling a no-op tool K times, per call),
  and locally;
- sustained executions per second with 1, 2 and 3 services (C executions at once), and
  locally with the same concurrency.

    python benchmarks/remote.py [--runs N] [--calls K] [--executions M] [--concurrency C]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import anyio

from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings

LIMITS = ExecutionLimits(cpu_seconds=10, wall_seconds=60.0, grace_seconds=0.5)
TOKEN_ENV = "PSYCH_BENCH_REMOTE_TOKEN"


@contextmanager
def serving(directory: Path, token: str, name: str) -> Iterator[str]:
    config = directory / f"{name}.toml"
    config.write_text('[profiles.sandbox]\nbackend = "bwrap"\n[serve]\ncapacity = 16\n')
    errors = directory / f"{name}.err"
    env = {**os.environ, "PSYCH_SANDBOX_SERVE_TOKENS": f"bench={token}"}
    with open(errors, "wb") as err:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "psych_sandbox_core.cli",
                "serve",
                "--profile",
                "sandbox",
                "--listen",
                "127.0.0.1:0",
                "--config",
                str(config),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            found = re.search(r"listening on (http://\S+) ", errors.read_text())
            if found:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not start: {errors.read_text()}")
            time.sleep(0.05)
        yield found.group(1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def config(urls: list[str] | None) -> DeploymentConfig:
    if urls is None:
        profile = ProfileConfig(backend="bwrap", limits=LIMITS)
    else:
        profile = ProfileConfig(
            backend="remote", options={"url": urls, "token_env": TOKEN_ENV}, limits=LIMITS
        )
    return DeploymentConfig(profiles={"bench": profile})


async def round_trip(urls: list[str] | None, runs: int) -> float:
    async with Sandbox(config(urls)) as sandbox:
        await sandbox.run("print(2+2)", profile="bench")  # warm: imports, description
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            result = await sandbox.run("print(2+2)", profile="bench")
            times.append(time.perf_counter() - started)
            assert result.error is None and result.stdout == "4\n", result.error
    return statistics.median(times)


async def binding(urls: list[str] | None, calls: int) -> float:
    def noop() -> int:
        return 1

    source = (
        f"import time\nt = time.perf_counter()\nfor _ in range({calls}):\n"
        "    await noop()\n(time.perf_counter() - t)"
    )
    async with Sandbox(config(urls)) as sandbox:
        result = await sandbox.run(
            source, profile="bench", bindings=FunctionBindings({"noop": noop})
        )
    assert result.error is None, result.error
    return float(result.return_value) / calls


async def throughput(urls: list[str] | None, executions: int, concurrency: int) -> float:
    async with Sandbox(config(urls)) as sandbox:
        await sandbox.run("None", profile="bench")
        remaining = executions
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                result = await sandbox.run("print(2+2)", profile="bench")
                assert result.error is None, result.error

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        return executions / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--executions", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=6)
    args = parser.parse_args()
    token = "bench-" + secrets.token_hex(16)
    os.environ[TOKEN_ENV] = token
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        urls = [stack.enter_context(serving(Path(tmp), token, f"s{i}")) for i in range(3)]
        local = anyio.run(round_trip, None, args.runs)
        remote = anyio.run(round_trip, urls[:1], args.runs)
        print(
            f"print(2+2) round trip: remote {remote * 1000:.1f} ms, local bwrap "
            f"{local * 1000:.1f} ms, ratio {remote / local:.2f}x (median of {args.runs})"
        )
        local_call = anyio.run(binding, None, args.calls)
        remote_call = anyio.run(binding, urls[:1], args.calls)
        print(
            f"binding round trip: remote {remote_call * 1e6:.0f} us, local "
            f"{local_call * 1e6:.0f} us per call, ratio {remote_call / local_call:.1f}x "
            f"({args.calls} calls)"
        )
        floor = anyio.run(throughput, None, args.executions, args.concurrency)
        print(f"executions/s, {args.concurrency} at once: local bwrap {floor:.1f}")
        for count in (1, 2, 3):
            rate = anyio.run(throughput, urls[:count], args.executions, args.concurrency)
            print(
                f"executions/s, {args.concurrency} at once: {count} service(s) {rate:.1f} "
                f"({rate / floor:.2f}x local)"
            )


if __name__ == "__main__":
    main()
