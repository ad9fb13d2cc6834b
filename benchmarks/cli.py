"""The ``psych-sandbox`` command end to end, next to the bare interpreter's start-up.

An agent that shells out once per program pays the command's whole start-up every time. The
floor is the bare start-up of the interpreter the command runs on, measured in the same run,
interleaved with the measurements so both see the same machine: `python -c pass` (the
command runs with site-packages, so this is its floor) and `python -I -c pass`. Each line
is the median of N runs of a fresh process; it prints:

- `--help`, and `run` of `print(1)` under the subprocess and bwrap profiles, and under
  `default` with its choice remembered (the command's ordinary case) and with nothing
  remembered (a trial execution first; a fresh state directory each time);
- each ratio to `python -c pass` next to its target (`--help` under 3x, `run` under 6x);
- what importing the package costs (`import psych_sandbox_core`, and the modules `run`
  needs, `import psych_sandbox_core._api.sandbox`), minus the floor, and what importing the core's
  required runtime libraries alone costs (anyio, pluggy, pydantic with `BaseModel`): the part
  of `run` that no change inside the core can take off its path;
- beside each, the CPU time the command and its children used (user + system), which other
  work on the machine inflates far less than wall time: a ratio of CPU times to the floor's
  says what the command costs when the machine is shared;
- where `run`'s time goes, for the subprocess and bwrap profiles, measured in a fresh process
  that does what `run` does, step by step: importing what `run` imports (the third-party
  libraries apart from the core's own modules, whose share is mostly building pydantic
  models, the first of them after pydantic reads every installed distribution's entry
  points for its own plugins), loading the configuration and the profile's backend (the
  `Sandbox` and the first run, less the execution), and the execution itself (a second run
  in a fresh `Sandbox` in the same process, everything already imported and loaded); what
  is left of the command's median is the interpreter's start and exit and the printing of
  the result;
- the load average before and after, since every number is inflated by other work.

Bytecode is written on the first (unmeasured) run of each command, as an installed package
has it. The remembered choice lives in a temporary state directory, removed at the end.

    python benchmarks/cli.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

PROGRAM = "print(1)\n"
HELP_TARGET = 3.0
RUN_TARGET = 6.0

#: Run in a fresh interpreter (one per sample) with the profile's name as its argument: what
#: `psych-sandbox run` does, timed step by step; prints one JSON object of seconds.
BREAKDOWN = """
import importlib, json, resource, sys, time

def now():
    # Wall time, and the CPU time of this process and every child it has reaped.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), time.process_time() + children.ru_utime + children.ru_stime

marks = {"start": now()}
# The third-party libraries run needs (anyio's asyncio backend is imported by anyio.run).
for name in ("pydantic", "pydantic_core", "anyio", "anyio._backends._asyncio", "pluggy"):
    importlib.import_module(name)
marks["libraries"] = now()
# What the command imports before it runs anything (cli._execute's imports).
import psych_sandbox_core.cli
from psych_sandbox_core._output.blobstore import FilesystemBlobStore
from psych_sandbox_core.cli.render import LiveOutput, print_summary
from psych_sandbox_core._api.sandbox import Sandbox
from psych_sandbox_core._policy.selection_cache import SelectionCache
from psych_sandbox_core.cli.visible import visible
marks["core modules"] = now()
import anyio, tempfile

async def once(profile):
    with tempfile.TemporaryDirectory() as store:
        async with Sandbox(
            None, blob_store=FilesystemBlobStore(store), selection_cache=SelectionCache()
        ) as sandbox:
            result = await sandbox.run("print(1)", profile=profile)
    assert result.ok, result

async def main():
    marks["loop"] = now()
    await once(sys.argv[1])  # configuration, backend and the execution
    marks["first"] = now()
    await once(sys.argv[1])  # the execution, everything loaded
    marks["second"] = now()
anyio.run(main)

def between(a, b):
    return [marks[b][i] - marks[a][i] for i in (0, 1)]

execution = between("first", "second")
first = between("loop", "first")
print(json.dumps({
    "libraries": between("start", "libraries"),
    "core modules": between("libraries", "core modules"),
    "load": [first[i] - execution[i] for i in (0, 1)],
    "execution": execution,
}))
"""


def command() -> list[str]:
    """How a person starts the command: its console script beside this interpreter."""
    script = Path(sys.executable).parent / "psych-sandbox"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "psych_sandbox_core"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_once(argv: Sequence[str], env: dict[str, str], expect: int = 0) -> tuple[float, float]:
    """Wall time and CPU time (the command and every child it waited for) of one run."""
    cpu = _children_cpu()
    started = time.perf_counter()
    completed = subprocess.run(
        list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    elapsed = time.perf_counter() - started
    if completed.returncode != expect:
        raise RuntimeError(f"{' '.join(argv)}: exit {completed.returncode}: {completed.stderr!r}")
    return elapsed, _children_cpu() - cpu


#: What no command that runs a program through the core can avoid importing: its required
#: runtime libraries, including what defining one pydantic model needs.
REQUIRED = "import the core's required libraries"
REQUIRED_IMPORTS = "import anyio, pluggy, pydantic; from pydantic import BaseModel"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    state = tempfile.mkdtemp(prefix="psych-cli-bench-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["XDG_STATE_HOME"] = state
    env.pop("PSYCH_SANDBOX_CONFIG", None)
    try:
        program = Path(state) / "print1.py"
        program.write_text(PROGRAM)
        cli = command()
        python = sys.executable

        def fresh_state() -> dict[str, str]:
            # A state directory of its own: nothing remembered, so default tries backends.
            return {**env, "XDG_STATE_HOME": tempfile.mkdtemp(dir=state)}

        cases: dict[str, tuple[list[str], Callable[[], dict[str, str]]]] = {
            "python -c pass": ([python, "-c", "pass"], lambda: env),
            "python -I -c pass": ([python, "-I", "-c", "pass"], lambda: env),
            "import psych_sandbox_core": ([python, "-c", "import psych_sandbox_core"], lambda: env),
            REQUIRED: ([python, "-c", REQUIRED_IMPORTS], lambda: env),
            "import psych_sandbox_core._api.sandbox": (
                [python, "-c", "import psych_sandbox_core._api.sandbox"],
                lambda: env,
            ),
            "--help": ([*cli, "--help"], lambda: env),
            "run --profile subprocess": (
                [*cli, "run", "--profile", "subprocess", str(program)],
                lambda: env,
            ),
            "run --profile bwrap": ([*cli, "run", "--profile", "bwrap", str(program)], lambda: env),
            "run (default, remembered)": ([*cli, "run", str(program)], lambda: env),
            "run (default, nothing remembered)": ([*cli, "run", str(program)], fresh_state),
        }
        breakdowns = {
            profile: [python, "-c", BREAKDOWN, profile] for profile in ("subprocess", "bwrap")
        }
        available = {}
        for name, (argv, make_env) in cases.items():
            try:  # the unmeasured first run: writes bytecode, remembers default's choice
                time_once(argv, make_env())
                available[name] = (argv, make_env)
            except RuntimeError as exc:
                print(f"{name}: not available here ({str(exc)[-200:]})")
        steps: dict[str, list[dict[str, list[float]]]] = {}
        for profile, argv in breakdowns.items():
            if f"run --profile {profile}" in available:
                breakdown_once(argv, env)  # unmeasured, as above
                steps[profile] = []
        load_before = os.getloadavg()
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in available}
        for _ in range(args.runs):
            for name, (argv, make_env) in available.items():
                samples[name].append(time_once(argv, make_env()))
            for profile in steps:
                steps[profile].append(breakdown_once(breakdowns[profile], env))
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(state, ignore_errors=True)

    print(
        "load average (1, 5, 15 min): before "
        + ", ".join(f"{x:.2f}" for x in load_before)
        + "; after "
        + ", ".join(f"{x:.2f}" for x in load_after)
    )
    median = {name: statistics.median(w for w, _ in runs) for name, runs in samples.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in samples.items()}
    floor, floor_cpu = median["python -c pass"], cpu["python -c pass"]
    print(f"floor `{python} -c pass`     median {floor * 1e3:7.2f} ms (cpu {floor_cpu * 1e3:.1f})")
    print(f"floor `python -I -c pass`   median {median['python -I -c pass'] * 1e3:7.2f} ms")
    for name in ("import psych_sandbox_core", "import psych_sandbox_core._api.sandbox", REQUIRED):
        cost = median[name] - floor
        print(
            f"{name:<35} {cost * 1e3:7.2f} ms above the floor ({median[name] / floor:5.2f}x; "
            f"cpu {(cpu[name] - floor_cpu) * 1e3:.1f} ms above, {cpu[name] / floor_cpu:5.2f}x)"
        )
    for name, value in median.items():
        if name.startswith(("python", "import")):
            continue
        target = HELP_TARGET if name == "--help" else RUN_TARGET
        ratio = value / floor
        verdict = "met" if ratio < target else "NOT met"
        print(
            f"psych-sandbox {name:<35} median {value * 1e3:7.2f} ms   ratio {ratio:5.2f}x"
            f"   target < {target:g}x: {verdict}   (cpu {cpu[name] * 1e3:.1f} ms, "
            f"{cpu[name] / floor_cpu:5.2f}x)"
        )
    for profile, runs in steps.items():
        # Each step's median wall time, and its median CPU time (user + system, the process's
        # and its children's) in brackets.
        wall = {key: statistics.median(run[key][0] for run in runs) for key in runs[0]}
        used = {key: statistics.median(run[key][1] for run in runs) for key in runs[0]}
        name = f"run --profile {profile}"
        rest = median[name] - sum(wall.values())
        rest_cpu = cpu[name] - sum(used.values())

        def ms(key: str, wall: dict[str, float] = wall, used: dict[str, float] = used) -> str:
            return f"{wall[key] * 1e3:.0f} ms (cpu {used[key] * 1e3:.0f})"

        print(
            f"  where {name}'s time goes, medians: importing third-party libraries "
            f"{ms('libraries')}, the core's modules {ms('core modules')}; configuration and "
            f"backend load {ms('load')}; execution {ms('execution')}; the rest (interpreter "
            f"start and exit, output) {rest * 1e3:.0f} ms (cpu {rest_cpu * 1e3:.0f})"
        )


def breakdown_once(argv: Sequence[str], env: dict[str, str]) -> dict[str, list[float]]:
    """One sample of where ``run``'s time goes: each step's [wall, cpu] (see BREAKDOWN)."""
    completed = subprocess.run(list(argv), env=env, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"breakdown: exit {completed.returncode}: {completed.stderr[-500:]}")
    steps: dict[str, list[float]] = json.loads(completed.stdout)
    return steps


if __name__ == "__main__":
    main()
