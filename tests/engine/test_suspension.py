"""suspension.watching awaits a coroutine as ``await`` does and says when it first suspends,
on both event loops: values, exceptions, cancellation and the tool's own cancel scopes pass
through unchanged."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from psych_sandbox_core._engine.suspension import watching

pytestmark = pytest.mark.anyio


class Said:
    def __init__(self) -> None:
        self.times = 0

    def __call__(self) -> None:
        self.times += 1


async def test_a_coroutine_that_never_waits_is_not_said_to_suspend() -> None:
    said = Said()

    async def answer() -> int:
        return 42

    assert await watching(answer(), said) == 42
    assert said.times == 0


async def test_a_coroutine_that_waits_is_said_to_suspend_once_before_it_does() -> None:
    said = Said()
    seen: list[int] = []

    async def waits() -> str:
        seen.append(said.times)
        await anyio.sleep(0)
        seen.append(said.times)
        await anyio.sleep(0)
        return "done"

    assert await watching(waits(), said) == "done"
    assert seen == [0, 1]  # said between its first step and its first suspension
    assert said.times == 1


async def test_exceptions_pass_through_before_and_after_a_suspension() -> None:
    async def fails_at_once() -> None:
        raise KeyError("first step")

    async def fails_later() -> None:
        await anyio.sleep(0)
        raise ValueError("after waiting")

    with pytest.raises(KeyError):
        await watching(fails_at_once(), Said())
    with pytest.raises(ValueError, match="after waiting"):
        await watching(fails_later(), Said())


async def test_what_the_event_loop_sends_back_reaches_the_coroutine() -> None:
    # Another task's results arrive through the loop's traps (trio sends them in).
    send_stream, receive_stream = anyio.create_memory_object_stream[int](1)

    async def receives() -> list[int]:
        return [await receive_stream.receive() for _ in range(3)]

    async def sends() -> None:
        for n in range(3):
            await anyio.sleep(0)
            await send_stream.send(n)

    got: list[Any] = []
    async with send_stream, receive_stream, anyio.create_task_group() as tasks:

        async def receiving() -> None:
            got.append(await watching(receives(), Said()))

        tasks.start_soon(receiving)
        tasks.start_soon(sends)
    assert got == [[0, 1, 2]]


async def test_a_cancel_scope_around_it_cancels_it_where_it_waits() -> None:
    said = Said()
    cancelled: list[bool] = []

    async def waits_forever() -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    async with anyio.create_task_group() as tasks:
        with anyio.CancelScope() as scope:
            tasks.start_soon(_cancel_soon, scope)
            await watching(waits_forever(), said)
    assert scope.cancelled_caught
    assert cancelled == [True] and said.times == 1


async def _cancel_soon(scope: anyio.CancelScope) -> None:
    await anyio.sleep(0)
    scope.cancel()


async def test_the_coroutines_own_cancel_scopes_and_tasks_nest_as_they_would() -> None:
    # A tool that opens its own scopes and task group before it first waits: the watch does
    # not stand between them and the task's scopes.
    async def tool() -> str:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(anyio.sleep, 0)
                await anyio.sleep(0)
            with anyio.move_on_after(0.001) as timed:
                await anyio.sleep_forever()
        assert timed.cancelled_caught
        return "nested"

    assert await watching(tool(), Said()) == "nested"


async def test_closing_it_unawaited_closes_the_coroutine() -> None:
    closed: list[bool] = []

    async def waits() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            closed.append(True)

    watched = watching(waits(), Said())
    watched.send(None)  # type: ignore[attr-defined]
    watched.close()  # type: ignore[attr-defined]
    assert closed == [True]
