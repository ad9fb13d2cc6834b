"""Fuzz the host's side of the protocol for a bounded time: the hypothesis state machine over
the conversation, and the frame reader and codec on bytes (under atheris where it installs
for this Python, else on hypothesis's random bytes). Both harnesses are in
psych_sandbox_testing/protocol_fuzz.py and reader_fuzz.py; the test suite runs them briefly.

A finding is an exception other than the documented ProtocolViolation path, a broken
invariant of the state machine, an input that takes longer than --input-seconds (a hang) or
an allocation past --rss-limit-mib (atheris: libFuzzer's own limits). Prints what ran and
exits 1 on a finding, with the input that caused it.

    python benchmarks/fuzz.py [--seconds 60] [--only machine|bytes] [--input-seconds 10]
        [--rss-limit-mib 2048]

atheris comes with the test extra where it has wheels (Linux x86_64); elsewhere the bytes go
through hypothesis.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

# The harness is imported only where it is used: atheris instruments what is imported after
# it starts (see psych_sandbox_testing/atheris_fuzz.py).

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
    from psych_sandbox_testing.protocol_fuzz import ConversationMachine

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
    from psych_sandbox_testing.reader_fuzz import feed_reader, interesting_seeds

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


def atheris_run(seconds: float, input_seconds: float, rss_limit_mib: int) -> int:
    """libFuzzer through atheris for ``seconds``, from the seed corpus (see
    psych_sandbox_testing/atheris_fuzz.py)."""
    from psych_sandbox_testing import atheris_fuzz

    outcome = atheris_fuzz.fuzz(
        [f"-max_total_time={int(seconds)}"],
        input_seconds=int(input_seconds),
        rss_limit_mib=rss_limit_mib,
    )
    for line in outcome.stats[-6:]:
        print(f"  {line}")
    if not outcome.ok:
        print(outcome.output)
        for name, data in outcome.findings:
            print(f"finding {name}: {data!r}")
        return 1
    print(f"reader and codec (atheris): {int(seconds)} s, no finding")
    return 0


def main() -> None:
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
            from psych_sandbox_testing import atheris_fuzz

            if atheris_fuzz.available():
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
