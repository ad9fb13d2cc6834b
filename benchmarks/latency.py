"""Per-execution latency of `print(2+2)` through the public API, next to the physical floor.

The floor is the bare start-up (`python -I -c pass`) of the interpreter the backend runs,
measured in the same run, interleaved with the measurements so both see the same machine.
For each available backend it prints:

- cold: every execution launches its child from nothing, on a quiet machine (the warm pool
  of the same Sandbox full and idle, as for the floors);
- warm: a profile that does not set `warm`, in a long-lived Sandbox (its default pool of
  prepared children), at low load (each execution starts once the next child is ready,
  waited for, not guessed, and has then been idle for `--idle` seconds, as between requests
  that do not arrive back to back: an idle child imports what an awaiting program needs) —
  each child still runs exactly one program;
- sustained: the same profile driven by `--concurrency` callers at once, as executions per
  second, next to the bare interpreter's own ceiling: `python -I -c pass` processes per
  second started by as many callers at once, measured in the same run (the median of
  `--rounds` rounds of each, interleaved), with how many executions started cold (no
  prepared child could be had sooner), the CPU each execution cost the host process and its
  children (against what one bare process costs), the whole machine's busy CPU per execution
  and per bare process (/proc/stat: what the host never reaped and the kernel's own threads
  count there too; the share of the ceiling a machine bound by CPU alone would reach follows
  from it), and the median latency under that load;
- where a backend names one (`bare_command()`), the bare equivalent of its own start-up
  measured in the same run, and the cold execution's ratio to it: for a container engine
  `docker run --rm IMAGE python -I -c pass` of the same image and runtime (target: under
  1.2x); for bubblewrap, bwrap with the backend's own namespaces and mounts running the same
  start-up (no target: it shows what of the cold path is bubblewrap's own, which no host-side
  work can take off it, next to the 1.5x target against the bare interpreter);
- the same, cold and warm, for a program that awaits (`await asyncio.sleep(0)`) and for a
  code-mode program (20 no-op binding calls under `asyncio.gather`), each also as a ratio to
  the program that does not await, and cold also to the bare interpreter importing and
  running asyncio itself (`python -I -c "import asyncio; asyncio.run(...)"`), the part of a
  cold awaiting execution no sandbox can take off its path;
- where a cold execution's time goes: the median time between consecutive points the host
  reached (psych_sandbox_core.kit.phases: timestamps taken in the host as it reaches each point,
  not estimates), how much of what the caller waits for comes after the child's result
  frame, and the teardown that finishes after the result was handed back.

    python benchmarks/latency.py [--runs N] [--backend ID ...] [--idle SECONDS] [--concurrency N]
                                 [--rounds N]

The load average is printed with each backend's rows: the machine is shared, and a busy one
moves every number (the ratios less, as both sides are measured together).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio

from psych_sandbox_core import DeploymentConfig, FunctionBindings, ProfileConfig, Sandbox
from psych_sandbox_core._policy.registry import BackendRegistry
from psych_sandbox_core._policy.trials import trial
from psych_sandbox_core.kit.phases import Marks, recording

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


#: The bare interpreter doing what the awaiting programs need of it: the floor of a cold child
#: that awaits (its own import of asyncio and an event loop).
AWAITING_BARE = "import asyncio; asyncio.run(asyncio.sleep(0))"


async def noop() -> None:
    return None


BINDINGS = FunctionBindings({"noop": noop})

#: A cold execution of a container backend should cost less than this many times its bare
#: equivalent (the engine's `run` of the same image).
BARE_TARGET = 1.2
BARE_TARGET_BACKENDS = ("docker", "gvisor")

#: What the time up to each point the host reaches was spent on (a point a backend does not
#: reach is left out; the time until the next one it does reach includes that work).
PHASES = {
    "probe targets": "probes: canary file and loopback listeners made (after the spawn "
    "where the backend hands them over late, while the child starts)",
    "identity leased": "identity: a uid leased",
    "cgroup made": "cgroup: made, capped, opened for joining",
    "container created": "docker: run directory (socket, bootstrap), cgroup parent, create",
    "spawned": "spawn (launcher started; docker: attached, exit watched, started)",
    "namespace reported": "child: interpreter start, containment, pid namespace's init",
    "connected": "child: (namespaces,) interpreter start, bootstrap, to its channel",
    "hello": "handshake: child's probes, report read, graded",
    "run sent": "run frame sent",
    "result frame": "program, to its result frame",
    "result handed back": "result: complete at the end markers, assembled, handed back",
    "exited": "child's exit seen",
    "reaped": "teardown: killed, reaped, usage read",
    "streams drained": "teardown: output streams read to their end",
    "identity retired": "teardown: backend clean-up, uid swept and given back",
    "launch left": "teardown: backend clean-up",
    "probe targets removed": "teardown: probe targets removed",
    "result": "result: classified, output preserved, assembled",
}


def time_command(argv: Sequence[str]) -> float:
    started = time.perf_counter()
    subprocess.run(list(argv), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


async def time_run(
    sandbox: Sandbox, profile: str, program: str = PROGRAM, marks: list[Marks] | None = None
) -> float:
    started = time.perf_counter()
    with recording() as reached:
        result = await sandbox.run(program, profile=profile, bindings=BINDINGS)
    elapsed = time.perf_counter() - started
    if marks is not None:
        marks.append(reached)
    if result.error is not None or result.stdout != "4\n":
        raise SystemExit(f"{profile}: unexpected result {result.error}")
    return elapsed


@dataclass(frozen=True)
class Load:
    """One round of ``count`` things done by callers at once: how many per second, the CPU
    each cost this process and its children (reaped meanwhile), and each one's latency."""

    per_second: float
    host_cpu: float
    children_cpu: float
    #: The whole machine's busy CPU (every process and the kernel's own threads) per item.
    machine_cpu: float
    latencies: list[float]


async def under_load(work: Callable[[], Awaitable[object]], concurrency: int, count: int) -> Load:
    limiter = anyio.CapacityLimiter(concurrency)
    latencies: list[float] = []

    async def one() -> None:
        async with limiter:
            started = time.perf_counter()
            await work()
            latencies.append(time.perf_counter() - started)

    host, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    machine = _machine_busy()
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    elapsed = time.perf_counter() - started
    return Load(
        count / elapsed,
        (_cpu(resource.RUSAGE_SELF) - host) / count,
        (_cpu(resource.RUSAGE_CHILDREN) - children) / count,
        (_machine_busy() - machine) / count,
        latencies,
    )


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy since boot (/proc/stat: every state but
    idle and waiting for I/O), which counts what no rusage of this process does: processes it
    never reaped, and kernel threads working for it (a namespace's or cgroup's teardown)."""
    with open("/proc/stat") as fh:
        fields = [int(value) for value in fh.readline().split()[1:]]
    # user, nice, system, idle, iowait, irq, softirq: not steal (the hypervisor's, for
    # others), nor guest time (counted in user time already).
    idle = fields[3] + fields[4]
    return (sum(fields[:7]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


async def processes_per_second(argv: Sequence[str], concurrency: int, count: int) -> Load:
    """Bare processes started and waited for by ``concurrency`` callers at once."""
    return await under_load(lambda: anyio.run_process(list(argv)), concurrency, count)


async def executions_per_second(
    sandbox: Sandbox, profile: str, concurrency: int, count: int
) -> Load:
    """Executions of PROGRAM run to their result by ``concurrency`` callers at once."""
    return await under_load(lambda: time_run(sandbox, profile), concurrency, count)


async def measure(backend_id: str, runs: int, idle: float, concurrency: int, rounds: int) -> None:
    config = DeploymentConfig(
        profiles={
            "cold": ProfileConfig(backend=backend_id, warm=0),
            "warm": ProfileConfig(backend=backend_id),
        }
    )
    async with Sandbox(config) as sandbox:
        loaded = await sandbox._load("cold")
        interpreter = str(getattr(loaded.backend, "interpreter", sys.executable))
        bare_command = getattr(loaded.backend, "bare_command", None)
        floor_argv = [interpreter, "-I", "-c", "pass"]
        await time_run(sandbox, "cold")
        await time_run(sandbox, "warm")
        floor, cold, warm, bare, awaiting_floor = [], [], [], [], []
        cold_marks: list[Marks] = []
        awaiting: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in AWAITING}

        async def quiet() -> None:
            # Low load: the pool's next child is ready and has been idle long enough to have
            # done what an idle child does, so nothing measured shares the machine (or a
            # container engine) with the pool refilling or a child preparing in the
            # background: neither the floors nor the cold executions, nor the warm ones.
            await sandbox.warmed("warm")
            await anyio.sleep(idle)

        for _ in range(runs):
            await quiet()
            floor.append(time_command(floor_argv))
            awaiting_floor.append(time_command([*floor_argv[:-1], AWAITING_BARE]))
            if bare_command is not None:
                bare.append(time_command(bare_command()))
            cold.append(await time_run(sandbox, "cold", marks=cold_marks))
            await quiet()
            warm.append(await time_run(sandbox, "warm"))
            for name, program in AWAITING.items():
                await quiet()
                awaiting[name][0].append(await time_run(sandbox, "cold", program))
                await quiet()
                awaiting[name][1].append(await time_run(sandbox, "warm", program))
        bare_loads, loads = [], []
        before = sandbox.warm_status("warm")
        for _ in range(rounds):
            bare_loads.append(await processes_per_second(floor_argv, concurrency, runs * 2))
            loads.append(await executions_per_second(sandbox, "warm", concurrency, runs * 2))
        after = sandbox.warm_status("warm")
    load_average = os.getloadavg()
    f = statistics.median(floor)
    c = statistics.median(cold)
    w = statistics.median(warm)
    print(f"{backend_id}: floor `{' '.join(floor_argv[:1])} -I -c pass` median {f * 1e3:.2f} ms")
    print(f"{backend_id}:   cold       median {c * 1e3:7.2f} ms   ratio {c / f:5.2f}x")
    print(
        f"{backend_id}:   warm       median {w * 1e3:7.2f} ms   ratio {w / f:5.2f}x "
        f"(low load: ready, then idle {idle:g} s; target < 0.25x: "
        f"{'met' if w / f < 0.25 else 'NOT met'})"
    )
    rate = statistics.median(load.per_second for load in loads)
    bare_rate = statistics.median(load.per_second for load in bare_loads)
    share = rate / bare_rate
    print(
        f"{backend_id}:   sustained  {rate:7.1f} executions/s by {concurrency} callers; the bare "
        f"interpreter's ceiling {bare_rate:.1f}/s: {share:.0%} of it "
        f"(target >= 60%: {'met' if share >= 0.6 else 'NOT met'}; medians of {rounds} rounds)"
    )
    if before is not None and after is not None:
        cold = after.started_cold - before.started_cold
        total = after.runs - before.runs
        print(f"{backend_id}:              {cold} of {total} executions started cold")
    host = statistics.median(load.host_cpu for load in loads)
    children = statistics.median(load.children_cpu for load in loads)
    bare_host = statistics.median(load.host_cpu for load in bare_loads)
    bare_children = statistics.median(load.children_cpu for load in bare_loads)
    latency = statistics.median(t for load in loads for t in load.latencies)
    print(
        f"{backend_id}:              CPU per execution {(host + children) * 1e3:.1f} ms (host "
        f"{host * 1e3:.1f}, children {children * 1e3:.1f}); per bare process "
        f"{(bare_host + bare_children) * 1e3:.1f} ms (host {bare_host * 1e3:.1f}, the process "
        f"{bare_children * 1e3:.1f}); median latency under this load {latency * 1e3:.1f} ms"
    )
    machine = statistics.median(load.machine_cpu for load in loads)
    bare_machine = statistics.median(load.machine_cpu for load in bare_loads)
    print(
        f"{backend_id}:              the whole machine's CPU per execution {machine * 1e3:.1f} "
        f"ms; per bare process {bare_machine * 1e3:.1f} ms (/proc/stat: every process and "
        "the kernel's own threads, whatever was reaped)"
    )
    # On a machine the runs have to themselves, both rates are bound by CPU: this share
    # does not move with other work on the machine as the measured one does.
    print(
        f"{backend_id}:              bound by CPU alone, the sustained rate would be "
        f"{bare_machine / machine:.0%} of the bare ceiling (the machine's CPU for one bare "
        "process over its CPU for one execution)"
    )
    if children < bare_children:
        # Less than a bare interpreter costs: part of each child was never reaped by us.
        print(
            f"{backend_id}:              (children: the CPU of what this process reaped; this "
            "backend's launcher does not hand its sandbox's processes' CPU back, so the "
            "children's figure and the total are low)"
        )
    print(
        f"{backend_id}:   load average {load_average[0]:.2f} {load_average[1]:.2f} "
        f"{load_average[2]:.2f} (at the end of the measurements)"
    )
    af = statistics.median(awaiting_floor)
    for name, (cold_times, warm_times) in awaiting.items():
        ac, aw = statistics.median(cold_times), statistics.median(warm_times)
        print(
            f"{backend_id}:   {name:10} cold {ac * 1e3:7.2f} ms ({ac / f:5.2f}x floor, "
            f"{ac / c:4.2f}x print, {ac / af:4.2f}x the bare awaiting floor)   "
            f"warm {aw * 1e3:7.2f} ms ({aw / f:5.2f}x floor, {aw / w:4.2f}x print)"
        )
    print(
        f"{backend_id}:   bare awaiting floor `-I -c {AWAITING_BARE!r}` median {af * 1e3:.2f} ms "
        f"({af / f:.2f}x the bare start-up: what the interpreter itself pays to import and run "
        "asyncio, on a cold child's path whatever the sandbox does)"
    )
    if bare:
        b = statistics.median(bare)
        print(f"{backend_id}:   bare equivalent start-up median {b * 1e3:7.2f} ms ({b / f:5.2f}x)")
        if backend_id in BARE_TARGET_BACKENDS:
            verdict = f"target < {BARE_TARGET}x: {'met' if c / b < BARE_TARGET else 'NOT met'}"
        else:
            verdict = (
                f"the host's own part of a cold execution: {(c - b) * 1e3:.2f} ms; the bare "
                f"equivalent alone is {b / f:.2f}x the bare start-up"
            )
        print(f"{backend_id}:   cold / bare equivalent  {c / b:5.2f}x ({verdict})")
    print_breakdown(backend_id, cold_marks, f)


def print_breakdown(backend_id: str, runs: list[Marks], floor: float) -> None:
    """The median time to each point from the one before it, over the runs that reached
    the same points in the same order (the most common sequence). Points after the result
    was handed back are the teardown finishing in the Sandbox's task group: nobody waits."""
    sequences = [tuple(point for point, _ in marks) for marks in runs]
    common = max(set(sequences), key=sequences.count)
    kept = [marks for marks, sequence in zip(runs, sequences, strict=True) if sequence == common]
    print(f"{backend_id}:   where a cold execution's time goes (median of {len(kept)} runs):")
    waited = after = background = 0.0
    for i in range(1, len(common)):
        step = statistics.median(marks[i][1] - marks[i - 1][1] for marks in kept)
        label = PHASES.get(common[i], common[i])
        if "result handed back" in common[:i]:
            background += step
            label = "(in the background) " + label
        else:
            waited += step
            if "result frame" in common[:i]:
                after += step
        print(f"{backend_id}:     {step * 1e3:7.2f} ms ({step / floor:5.2f}x floor)  {label}")
    print(
        f"{backend_id}:     {waited * 1e3:7.2f} ms waited for, {after * 1e3:.2f} ms of it after "
        f"the result frame; {background * 1e3:.2f} ms of teardown after the result was handed "
        "back (nobody waits for it)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--backend", action="append", default=None)
    parser.add_argument(
        "--idle", type=float, default=0.25, help="seconds a warm child idles before its program"
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="callers at once for the sustained rate"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of the sustained rates"
    )
    args = parser.parse_args()
    registry = BackendRegistry()
    for backend_id in args.backend or registry.ids():
        reason = await trial(registry, backend_id)
        if reason is not None:
            print(f"{backend_id}: not available here ({reason})")
            continue
        await measure(backend_id, args.runs, args.idle, args.concurrency, args.rounds)


if __name__ == "__main__":
    anyio.run(main)
