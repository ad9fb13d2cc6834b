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
  needs, `import psych_sandbox_core.sandbox`), minus the floor;
- beside each, the CPU time the command and its children used (user + system), which other
  work on the machine inflates far less than wall time: a ratio of CPU times to the floor's
  says what the command costs when the machine is shared.

Bytecode is written on the first (unmeasured) run of each command, as an installed package
has it. The remembered choice lives in a temporary state directory, removed at the end.

    python benchmarks/cli.py [--runs N]
"""

from __future__ import annotations

import argparse
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
            "import psych_sandbox_core.sandbox": (
                [python, "-c", "import psych_sandbox_core.sandbox"],
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
        available = {}
        for name, (argv, make_env) in cases.items():
            try:  # the unmeasured first run: writes bytecode, remembers default's choice
                time_once(argv, make_env())
                available[name] = (argv, make_env)
            except RuntimeError as exc:
                print(f"{name}: not available here ({str(exc)[-200:]})")
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in available}
        for _ in range(args.runs):
            for name, (argv, make_env) in available.items():
                samples[name].append(time_once(argv, make_env()))
    finally:
        shutil.rmtree(state, ignore_errors=True)

    median = {name: statistics.median(w for w, _ in runs) for name, runs in samples.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in samples.items()}
    floor, floor_cpu = median["python -c pass"], cpu["python -c pass"]
    print(f"floor `{python} -c pass`     median {floor * 1e3:7.2f} ms (cpu {floor_cpu * 1e3:.1f})")
    print(f"floor `python -I -c pass`   median {median['python -I -c pass'] * 1e3:7.2f} ms")
    for name in ("import psych_sandbox_core", "import psych_sandbox_core.sandbox"):
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


if __name__ == "__main__":
    main()
