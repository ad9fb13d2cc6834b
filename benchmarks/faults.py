"""Hosts killed outright (SIGKILL) at points of an execution, in a loop, and a restarted host
that must reap what they left, judged from the host side.

Each round, per backend: one host per point (the points drawn at random, with repeats, from
spawn, handshake, mid-binding, artifact collection and teardown; see
psych_sandbox_testing/faults.py), each stopped exactly at its point by a hook and killed
there; what each left is counted (processes, temporary directories, cgroups, uid leases, and
for docker its containers); then a restarted host runs one execution per killed one and must
leave nothing of any of them, and each run's call budget must be as the dead host left it
(the calls it accepted, the one in flight too, stay spent). Exits 1 on anything left or any
budget given back.

    python benchmarks/faults.py [--rounds 5] [--backend subprocess --backend bwrap ...]
        [--per-round 5] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter

import anyio
from psych_sandbox_testing import census, faults

from psych_sandbox_core._bindings.runlog import SQLiteRunLog
from psych_sandbox_core.kit.posix.identity import IdentityRange
from psych_sandbox_core.kit.posix.sweep import sweep


def containers_of(pid: int) -> int:
    """The engine's containers whose owner label names host process ``pid`` on this boot."""
    try:
        from psych_sandbox_docker import engine
    except ImportError:
        return 0
    listed = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            f"label={engine.MANAGED_LABEL}=1",
            "--format",
            '{{.Label "' + engine.OWNER_LABEL + '"}}',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    me = engine.current_owner()
    found = 0
    for label in listed.stdout.split():
        owner = engine.Owner.parse(me.machine, label)
        if owner is not None and owner.boot == me.boot and owner.pid == pid:
            found += 1
    return found


def counts(pid: int, backend: str) -> dict[str, int]:
    taken = census.take(pid, extra_prefixes=("psych-docker-",))
    found = {
        "processes": taken.processes,
        "temp_dirs": taken.temp_dirs,
        "cgroups": taken.cgroups,
        "leases": taken.leases,
    }
    if backend in ("docker", "gvisor"):
        found["containers"] = containers_of(pid)
    return found


async def calls_in_run(path: str, run: str) -> int:
    log = SQLiteRunLog(path)
    try:
        return await log.calls_in_run(run)
    finally:
        await log.aclose()


def one_round(backend: str, points: list[str], first_uid: int) -> tuple[Counter[str], list[str]]:
    """Kill a host at each of ``points``, restart, check; what the kills left (summed), and
    the problems found after the restart."""
    count = 2 * len(points)
    options = {"identity_first_uid": first_uid, "identity_count": count}
    problems: list[str] = []
    left_by_kills: Counter[str] = Counter()
    # The runs are named by point: one host per point within a round.
    with tempfile.TemporaryDirectory(prefix="psych-faults-") as scratch:
        run_log = os.path.join(scratch, "runs.sqlite")
        hosts = faults.Hosts(backend, options, run_log, points)
        try:
            pids = hosts.wait_at_points()
            hosts.kill()
            for point, pid in pids.items():
                left_by_kills.update(counts(pid, backend))
                spent = anyio.run(calls_in_run, run_log, faults.run_id(point))
                if spent != faults.calls_spent(point):
                    problems.append(
                        f"{point}: {spent} calls spent, not {faults.calls_spent(point)}"
                    )
            left_in_run = hosts.restart()
        finally:
            hosts.close()
        for point, pid in pids.items():
            expected = [faults.RUN_CALLS - faults.calls_spent(point), "budget_exhausted"]
            if left_in_run[point] != expected:
                problems.append(f"{point}: the run had {left_in_run[point]} left, not {expected}")
            after = {name: value for name, value in counts(pid, backend).items() if value}
            if after:
                problems.append(f"{point}: left after the restart: {after}")
    for uid in range(first_uid, first_uid + count):
        sweep(uid, uid)
    IdentityRange(first_uid, count).forget()
    return left_by_kills, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--backend",
        action="append",
        default=None,
        choices=["subprocess", "bwrap", "docker", "gvisor"],
    )
    parser.add_argument("--per-round", type=int, default=len(faults.POINTS))
    parser.add_argument("--seed", type=int, default=6)
    args = parser.parse_args()
    backends = args.backend or ["subprocess", "bwrap"]
    rng = random.Random(args.seed)
    kills: Counter[str] = Counter()
    left: Counter[str] = Counter()
    problems: list[str] = []
    started = time.monotonic()
    for round_number in range(args.rounds):
        for backend in backends:
            # Each round at most one host per point (a run per point), drawn in random order.
            points = rng.sample(list(faults.POINTS), min(args.per_round, len(faults.POINTS)))
            first = 1_930_000_000 + 16 * rng.randrange(1_000_000)
            found, wrong = one_round(backend, points, first)
            kills.update(f"{backend}/{point}" for point in points)
            left.update({f"{backend} {name}": value for name, value in found.items()})
            problems += [f"round {round_number} {backend} {p}" for p in wrong]
        print(
            f"  round {round_number + 1}/{args.rounds} in {time.monotonic() - started:.0f} s",
            flush=True,
        )
    print(
        f"\n{sum(kills.values())} hosts killed in {time.monotonic() - started:.0f} s, "
        f"load average {os.getloadavg()}"
    )
    print("kills: " + json.dumps(dict(sorted(kills.items()))))
    print(
        "left by the killed hosts (summed), before the restart: "
        + json.dumps(dict(sorted(left.items())))
    )
    if problems:
        print(f"PROBLEMS after the restarts ({len(problems)}):")
        for problem in problems:
            print(f"  {problem}")
        sys.exit(1)
    print(
        "after the restarts: nothing of any killed host left (processes, temporary "
        "directories, cgroups, leases"
        + (", containers" if {"docker", "gvisor"} & set(backends) else "")
        + "), and no run's budget given back"
    )


if __name__ == "__main__":
    main()
