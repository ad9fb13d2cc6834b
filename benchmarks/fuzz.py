"""Fuzz the host's side of the protocol for a bounded time: the hypothesis state machine over
the conversation, and the frame reader and codec on bytes (under atheris where it installs
for this Python, else on hypothesis's random bytes). Both harnesses are in
psych_sandbox_core/testing/protocol_fuzz.py; the test suite runs them briefly.

A finding is an exception other than the documented ProtocolViolation path, a broken
invariant of the state machine, an input that takes longer than --input-seconds (a hang) or
an allocation past --rss-limit-mib (atheris: libFuzzer's own limits). Prints what ran and
exits 1 on a finding, with the input that caused it.

    python benchmarks/fuzz.py [--seconds 60] [--only machine|bytes] [--input-seconds 10]
        [--rss-limit-mib 2048]

atheris is not a dependency of the project: ``pip install atheris`` to use it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The harness is imported only where it is used: atheris instruments what is imported after
# it starts (see atheris_child).

BATCH_EXAMPLES = 50
STEPS = 30


def _batch() -> Any:
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=BATCH_EXAMPLES,
        database=None,
        deadline=None,
        stateful_step_count=STEPS,
        suppress_health_check=list(HealthCheck),
    )


def machine(seconds: float) -> int:
    """Batches of the state machine, fresh random seeds each, until ``seconds`` are up."""
    from hypothesis.stateful import run_state_machine_as_test

    from psych_sandbox_core.testing.protocol_fuzz import ConversationMachine

    started = time.monotonic()
    batches = 0
    while time.monotonic() - started < seconds:
        run_state_machine_as_test(ConversationMachine, settings=_batch())
        batches += 1
    elapsed = time.monotonic() - started
    print(
        f"state machine: {batches * BATCH_EXAMPLES} runs of up to {STEPS} steps in "
        f"{elapsed:.0f} s, no finding"
    )
    return 0


def random_bytes(seconds: float) -> int:
    """The byte target on hypothesis's random bytes, until ``seconds`` are up."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from psych_sandbox_core.testing.protocol_fuzz import feed_reader, interesting_seeds

    started = time.monotonic()
    inputs = 0

    @settings(_batch(), max_examples=500)
    @given(st.binary(max_size=1 << 16))
    def batch(data: bytes) -> None:
        nonlocal inputs
        inputs += 1
        feed_reader(data)

    for seed in interesting_seeds():
        feed_reader(seed)
    while time.monotonic() - started < seconds:
        batch()
    print(
        f"reader and codec (hypothesis, random bytes): {inputs} inputs in "
        f"{time.monotonic() - started:.0f} s, no finding"
    )
    return 0


def atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def atheris_run(seconds: float, input_seconds: float, rss_limit_mib: int) -> int:
    """libFuzzer through atheris, in a child process (it exits when done), from the seed
    corpus; a crash, a timeout or an allocation past the limit is a finding."""
    from psych_sandbox_core.testing.protocol_fuzz import interesting_seeds

    with tempfile.TemporaryDirectory(prefix="psych-fuzz-") as scratch:
        corpus = Path(scratch, "corpus")
        corpus.mkdir()
        for index, seed in enumerate(interesting_seeds()):
            (corpus / f"seed-{index}").write_bytes(seed)
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--atheris-child",
                f"-max_total_time={int(seconds)}",
                f"-timeout={int(input_seconds)}",
                f"-rss_limit_mb={rss_limit_mib}",
                f"-malloc_limit_mb={rss_limit_mib}",
                "-max_len=1048576",
                f"-artifact_prefix={scratch}/",
                "-print_final_stats=1",
                str(corpus),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        stats = [
            line
            for line in done.stderr.splitlines()
            if "DONE" in line or "ERROR" in line or line.startswith("stat::number_of")
        ]
        findings = sorted(p.name for p in Path(scratch).iterdir() if p.name != "corpus")
        for line in stats[-6:]:
            print(f"  {line}")
        if done.returncode != 0 or findings:
            print(done.stderr[-4000:])
            for name in findings:
                print(f"finding {name}: {Path(scratch, name).read_bytes()[:400]!r}")
            return 1
    print(f"reader and codec (atheris): {int(seconds)} s, no finding")
    return 0


def atheris_child(argv: list[str]) -> None:
    import atheris

    with atheris.instrument_imports(include=["psych_sandbox_core"]):
        from psych_sandbox_core.testing import protocol_fuzz
    atheris.Setup([sys.argv[0], *argv], protocol_fuzz.feed_reader)
    atheris.Fuzz()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--atheris-child":
        atheris_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--only", choices=["machine", "bytes"])
    parser.add_argument("--input-seconds", type=float, default=10.0)
    parser.add_argument("--rss-limit-mib", type=int, default=2048)
    args = parser.parse_args()
    parts = [args.only] if args.only else ["machine", "bytes"]
    share = args.seconds / len(parts)
    failed = 0
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()}")
    try:
        if "machine" in parts:
            failed |= machine(share)
        if "bytes" in parts:
            if atheris_available():
                failed |= atheris_run(share, args.input_seconds, args.rss_limit_mib)
            else:
                print(
                    f"atheris is not installed for python {sys.version.split()[0]}: "
                    "the same target on hypothesis's random bytes instead"
                )
                failed |= random_bytes(share)
    except Exception as exc:  # a finding (an invariant, a crash): shown, and exit 1
        print(f"FINDING: {type(exc).__name__}: {exc}")
        raise
    sys.exit(failed)


if __name__ == "__main__":
    main()
