"""The host's side of the protocol under fuzzing, briefly and deterministically: the state
machine over the conversation and the byte target for the frame reader and codec
(psych_sandbox_testing/protocol_fuzz.py). benchmarks/fuzz.py runs the same for longer.
Every finding is kept below as a regression test of its own."""

from __future__ import annotations

import platform
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test
from psych_sandbox_testing import atheris_fuzz
from psych_sandbox_testing.hostile import hostile_lines
from psych_sandbox_testing.protocol_fuzz import ConversationMachine
from psych_sandbox_testing.reader_fuzz import feed_reader, interesting_seeds

#: Short, derandomized and without a database: the same examples on every run, in CI too.
SHORT = settings(
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_the_conversation_keeps_its_invariants_under_hostile_lines() -> None:
    run_state_machine_as_test(ConversationMachine, settings=settings(SHORT, stateful_step_count=12))


@SHORT
@given(st.binary(max_size=4096))
def test_the_reader_and_codec_on_random_bytes(data: bytes) -> None:
    feed_reader(data)


@SHORT
@given(st.lists(hostile_lines, max_size=6))
def test_the_reader_and_codec_on_hostile_lines(lines: list[bytes]) -> None:
    feed_reader(b"\n".join(lines) + b"\n")


def test_the_seed_corpus_goes_through_the_reader() -> None:
    for seed in interesting_seeds():
        feed_reader(seed)


#: Where the test extra installs atheris (it has wheels there): its absence is a failure.
ATHERIS_HERE = sys.platform == "linux" and platform.machine() == "x86_64"


@pytest.mark.skipif(
    not ATHERIS_HERE and not atheris_fuzz.available(),
    reason="atheris has no wheels for this platform; the hypothesis targets above cover it",
)
def test_the_reader_and_codec_under_libfuzzer() -> None:
    """A short, repeatable libFuzzer run (a fixed seed and number of inputs) from the seed
    corpus: coverage-guided bytes that reach deeper than random ones, no finding."""
    assert atheris_fuzz.available(), "atheris is missing: install the test extra"
    outcome = atheris_fuzz.fuzz(["-runs=3000", "-seed=1"], input_seconds=10)
    assert outcome.ok, (outcome.findings, outcome.output)
    assert any("number_of_executed_units" in line for line in outcome.stats), outcome.stats
