"""What the worst frames a program can write on its control channel cost the host, and what
they do to an honest execution's wall clock in the same Sandbox at the same time.

Each case runs in a fresh interpreter that imports the library, warms up, and measures an
honest execution alone (the floor): a program that prints its start time and sleeps past a
short wall-clock limit. Then it starts one hostile execution, which writes call frames of
one shape straight to the channel descriptor for a few seconds (reading each reply, so every
frame the host accepts is parsed and answered), and runs honest executions back to back
beside it until the hostile one ends. Printed per case:

- the host's peak RSS growth over the hostile execution (VmHWM reset first), against the
  target of 64 MiB;
- the host's CPU over that time, next to the hostile program's own CPU;
- how the hostile execution ended (the limit it spent);
- the honest executions' timeout accuracy: how much later than alone their timeout ended
  them (from the program's own start to the result, minus the same span measured alone),
  against the target of 100 ms, and whether each was reported as a timeout.

    python benchmarks/hostile_frames.py [--case SHAPE ...] [--size ceiling|budget|limits ...]
        [--seconds N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

#: The target for the host's peak RSS growth, and for an honest timeout's lateness.
RSS_TARGET_MIB = 64
OVERRUN_TARGET_MS = 100

_MEASURE = r"""
import json, resource, statistics, sys, time
import anyio
from psych_sandbox_core import DeploymentConfig, ExecutionLimits, ProfileConfig, Sandbox

shape, n, seconds, frames = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
HONEST_WALL = 0.5

HOSTILE = '''
import os, socket, sys, time
FD = int(next(a for a in sys.argv if a.startswith("channel=fd:"))[len("channel=fd:"):])
channel = socket.socket(fileno=os.dup(FD))
shape, n, seconds, frames = %r, %d, %r, %d
if shape == "deep":  # n levels
    payload = b"[" * n + b"]" * n
elif shape == "wide":  # n empty lists in one
    payload = b"[" + b"[]," * (n - 1) + b"[]]"
elif shape == "keys":  # n members
    payload = b"{" + b",".join(b'"%%x":0' %% i for i in range(n)) + b"}"
elif shape == "string":  # n characters
    payload = b'"' + b"x" * n + b'"'
else:
    payload = b"0"
tail = b',"name":"tool","arguments":{"x":' + payload + b"}}\\n"
buffer = b""
deadline = time.monotonic() + seconds
sent = 0
try:
    while sent < frames and time.monotonic() < deadline:
        channel.sendall(b'{"type":"call","id":%%d' %% sent + tail)
        sent += 1
        while b"\\n" not in buffer:
            chunk = channel.recv(65536)
            if not chunk:
                raise SystemExit(0)
            buffer += chunk
        buffer = buffer[buffer.index(b"\\n") + 1:]
except OSError:
    pass
os._exit(0)
''' % (shape, n, seconds, frames)

HONEST = "import time\nprint(time.monotonic(), flush=True)\ntime.sleep(%r)\n" % (HONEST_WALL * 3)

def hwm():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

async def honest(sandbox):
    result = await sandbox.run(HONEST, profile="honest")
    ended = time.monotonic()
    kind = None if result.error is None else result.error.kind.value
    started = float(result.stdout.split()[0]) if result.stdout.strip() else None
    span = None if started is None else ended - started
    return {"kind": kind, "span": span, "wall_grade": result.grades.get("wall_clock"),
            "wall_seconds": result.usage.wall_seconds}

async def main():
    config = DeploymentConfig(profiles={
        "hostile": ProfileConfig(backend="subprocess", limits=ExecutionLimits(
            wall_seconds=seconds + 60.0, cpu_seconds=600, grace_seconds=0.5)),
        "honest": ProfileConfig(backend="subprocess", limits=ExecutionLimits(
            wall_seconds=HONEST_WALL, grace_seconds=0.5)),
    })
    async with Sandbox(config) as sandbox:
        await sandbox.run("None", profile="hostile")
        lag = [0.0]
        async def probe():
            # How late a 10 ms timer fires: the event loop's own stalls, apart from the
            # machine's load on the honest program's processes.
            while True:
                before = time.monotonic()
                await anyio.sleep(0.01)
                lag[0] = max(lag[0], time.monotonic() - before - 0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            alone = [await honest(sandbox) for _ in range(3)]
            tg.cancel_scope.cancel()
        lag_alone, lag[0] = lag[0], 0.0
        floor = statistics.median(s["span"] for s in alone)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        before_rss, before_cpu = rss(), cpu()
        outcome = {}
        beside = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            async def hostile():
                result = await sandbox.run(HOSTILE, profile="hostile")
                outcome["kind"] = None if result.error is None else result.error.kind.value
                outcome["message"] = None if result.error is None else result.error.message
                outcome["cpu"] = result.usage.cpu_seconds
                outcome["calls"] = len(result.calls)
                outcome["wall"] = result.usage.wall_seconds
            tg.start_soon(hostile)
            while not outcome or not beside:
                beside.append(await honest(sandbox))
            tg.cancel_scope.cancel()
        after_cpu, peak = cpu(), hwm()
    print(json.dumps({
        "growth": peak - before_rss, "host_cpu": after_cpu - before_cpu, "hostile": outcome,
        "lag": lag[0], "lag_alone": lag_alone,
        "floor": floor, "alone": alone, "beside": beside,
    }))

anyio.run(main)
"""

MiB = 1024 * 1024
#: Per shape, the payload's size parameter (levels, lists, members, characters) for frames of
#: about 16 MiB (the channel's ceiling), of about 1 MiB (the default argument budget), and
#: just under the element and depth limits (2 elements per list or member; a call's
#: arguments sit two levels down).
SIZES = {
    "ceiling": {
        "deep": 8 * MiB - 64,
        "wide": 16 * MiB // 3 - 64,
        "keys": 16 * MiB // 12,
        "string": 16 * MiB - 4096,
    },
    "budget": {
        "deep": MiB // 2 - 64,
        "wide": MiB // 3 - 64,
        "keys": MiB // 12,
        "string": MiB - 4096,
    },
    "limits": {"deep": 128, "wide": 32_500, "keys": 32_500, "string": MiB - 4096},
}
#: The smallest call, over and over: the most frames per second.
MANY = ("many", 1)


def measure(shape: str, n: int, seconds: float, frames: int) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, shape, str(n), str(seconds), str(frames)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def report(label: str, sample: dict[str, object]) -> None:
    hostile: dict[str, object] = sample["hostile"]  # type: ignore[assignment]
    beside: list[dict[str, object]] = sample["beside"]  # type: ignore[assignment]
    floor = float(sample["floor"])  # type: ignore[arg-type]
    growth = int(sample["growth"]) / MiB  # type: ignore[call-overload]
    host_cpu = float(sample["host_cpu"])  # type: ignore[arg-type]
    program_cpu = hostile.get("cpu")
    overruns = [
        (float(s["span"]) - floor) * 1000  # type: ignore[arg-type]
        for s in beside
        if s["span"] is not None
    ]
    kinds = sorted({str(s["kind"]) for s in beside})
    grades = sorted({str(s["wall_grade"]) for s in beside})
    message = str(hostile.get("message") or "")[:110]
    if hostile.get("kind") == "exception":
        raise SystemExit(f"{label}: the hostile program itself failed: {message}")
    print(f"{label}:")
    print(f"  hostile ended: {hostile.get('kind')} after {hostile.get('calls')} calls: {message}")
    print(
        f"  host peak RSS growth  {growth:8.1f} MiB   target < {RSS_TARGET_MIB} MiB "
        f"({'met' if growth < RSS_TARGET_MIB else 'MISSED'})"
    )
    print(
        f"  host CPU              {host_cpu:8.2f} s     hostile program's own CPU "
        f"{float(program_cpu or 0):.2f} s"  # type: ignore[arg-type]
    )
    worst = max(overruns) if overruns else float("nan")
    print(
        f"  honest timeout late   {worst:8.1f} ms    worst of {len(beside)} beside it, "
        f"target < {OVERRUN_TARGET_MS} ms ({'met' if worst < OVERRUN_TARGET_MS else 'MISSED'}); "
        f"alone it ends {floor * 1000:.0f} ms after its start"
    )
    print(f"  honest reported as    {', '.join(kinds)}; wall_clock graded {', '.join(grades)}")
    lag = float(sample["lag"]) * 1000  # type: ignore[arg-type]
    alone = float(sample["lag_alone"]) * 1000  # type: ignore[arg-type]
    print(
        f"  event loop's worst stall {lag:5.1f} ms; {alone:5.1f} ms with the honest "
        "executions alone (a 10 ms timer, late by this much at worst)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", action="append", choices=[*sorted(SIZES["limits"]), "many"])
    parser.add_argument("--size", action="append", choices=sorted(SIZES))
    parser.add_argument("--seconds", type=float, default=4.0, help="how long each sends")
    args = parser.parse_args()
    for shape in args.case or [*SIZES["limits"], MANY[0]]:
        if shape == MANY[0]:
            report("many (smallest calls)", measure(shape, MANY[1], args.seconds, 10**9))
            continue
        for size in args.size or list(SIZES):
            n = SIZES[size][shape]
            report(f"{shape} ({size}: n={n})", measure(shape, n, args.seconds, 10**9))


if __name__ == "__main__":
    main()
