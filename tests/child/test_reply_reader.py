"""Who reads the replies to a program's calls in the child: the event loop that calls, while
it is the only caller (a reply wakes it once), and otherwise the bootstrap's reader thread.

The child's side is driven here in-process over a socket pair, with a host of canned
replies on the other end, except for the one execution that checks the thread count of a
real child from the host's /proc.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from psych_sandbox_testing.census import processes_of
from psych_sandbox_testing.host import status_of

from psych_sandbox_core import Sandbox
from psych_sandbox_core._bindings.bindings import FunctionBindings
from psych_sandbox_core.child.loader import bootstrap_module

from ..conftest import PROFILE, config

#: The child's functions and constants, from the source the child runs.
child = bootstrap_module()

#: How long the canned host waits on a socket before it gives the test up as stuck.
HOST_PATIENCE_SECONDS = 20.0


class Child:
    """The bootstrap's channel over a socket pair; ``started`` lists the threads it starts,
    ``broke`` what ended its reading (the bootstrap would end its process there)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.host, theirs = socket.socketpair()
        self.host.settimeout(HOST_PATIENCE_SECONDS)
        self.started: list[Callable[..., Any]] = []
        self.broke: list[str] = []
        #: Called (in the reading thread) when the reading ends.
        self.on_broke: Callable[[], None] = lambda: None
        real = child._thread

        self.ended: list[threading.Event] = []

        def start_new_thread(function: Callable[..., Any], args: tuple[Any, ...]) -> int:
            self.started.append(function)
            ended = threading.Event()
            self.ended.append(ended)

            def run() -> None:
                try:
                    function(*args)
                finally:
                    ended.set()

            return real.start_new_thread(run, ())

        monkeypatch.setattr(
            child,
            "_thread",
            SimpleNamespace(
                allocate_lock=real.allocate_lock,
                get_ident=real.get_ident,
                start_new_thread=start_new_thread,
            ),
        )

        def broke() -> None:
            self.broke.append("broke")
            self.on_broke()

        monkeypatch.setattr(child, "_channel_broke", broke)
        self.channel = child.Channel(f"fd:{theirs.detach()}")
        self.channel.start_calls(16)
        self.lines = self.host.makefile("rb")

    def call_frame(self) -> dict[str, Any]:
        frame: dict[str, Any] = json.loads(self.lines.readline())
        assert frame["type"] == "call", frame
        return frame

    def reply(self, call_id: int, value: Any) -> None:
        frame = {"type": "reply", "id": call_id, "carries": "value"}
        self.host.sendall((json.dumps({**frame, "value_json": json.dumps(value)}) + "\n").encode())

    def echo(self, calls: int) -> threading.Thread:
        """A host thread that answers ``calls`` calls with their arguments."""

        def serve() -> None:
            for _ in range(calls):
                frame = self.call_frame()
                self.reply(frame["id"], frame["arguments"])

        thread = threading.Thread(target=serve)
        thread.start()
        return thread

    def close(self) -> None:
        self.lines.close()
        self.host.close()
        # A reader thread sees the end and calls _channel_broke: the patched one, so before
        # the patches go.
        for ended in self.ended:
            assert ended.wait(HOST_PATIENCE_SECONDS), "the reader thread did not end"
        self.channel.sock.close()


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[Child]:
    made = Child(monkeypatch)
    try:
        yield made
    finally:
        made.close()


def call(channel: Any, loop: asyncio.AbstractEventLoop, n: int) -> Any:
    return channel.call_async("echo", json.dumps({"n": n}), loop)


def test_calls_from_the_loop_are_read_by_that_loop(pair: Child) -> None:
    host = pair.echo(3)

    async def program() -> list[Any]:
        loop = asyncio.get_running_loop()
        one = await call(pair.channel, loop, 0)
        rest = await asyncio.gather(call(pair.channel, loop, 1), call(pair.channel, loop, 2))
        assert pair.channel.reader is loop
        return [one, *rest]

    assert asyncio.run(program()) == [{"n": 0}, {"n": 1}, {"n": 2}]
    host.join()
    assert pair.started == []  # no reader thread: each reply woke the loop itself
    assert pair.broke == []


def test_a_new_loop_reads_once_the_last_ended_owing_no_reply(pair: Child) -> None:
    host = pair.echo(2)
    loops = []

    async def program(n: int) -> Any:
        loops.append(asyncio.get_running_loop())
        return await call(pair.channel, loops[-1], n)

    assert [asyncio.run(program(0)), asyncio.run(program(1))] == [{"n": 0}, {"n": 1}]
    host.join()
    assert pair.channel.reader is loops[1]
    assert pair.started == []


def test_replies_still_owed_at_the_end_are_read_by_the_thread(pair: Child) -> None:
    # The program ended with a call in flight (its loop is gone): its reply may still come
    # while the result goes out, and someone must read it.
    async def program() -> None:
        loop = asyncio.get_running_loop()
        pending = asyncio.create_task(call(pair.channel, loop, 0))
        await loop.run_in_executor(None, pair.call_frame)
        assert not pending.done()

    asyncio.run(program())  # the task is cancelled as the loop ends: a cancel frame goes
    with pair.channel.lock:
        pair.channel.end_loop_reading()
    assert pair.started == [pair.channel._read_replies]
    assert json.loads(pair.lines.readline()) == {"type": "cancel", "id": 0}
    pair.reply(0, "late")
    pair.host.sendall(b"not json\n")  # read after the late reply: ends the reading
    assert pair.ended[0].wait(HOST_PATIENCE_SECONDS)
    assert pair.channel.waiters == {}  # the late reply was read, then the frame after it
    assert pair.broke == ["broke"]


def test_a_call_from_a_thread_while_the_loop_is_blocked_gets_its_reply(pair: Child) -> None:
    # The loop reads, then blocks waiting for a thread whose call only a reader thread can
    # read: left to the loop, that reply would never be read.
    host = pair.echo(3)
    answered: list[Any] = []

    def from_a_thread() -> None:
        answered.append(pair.channel.call("echo", json.dumps({"n": 1})))

    async def program() -> Any:
        loop = asyncio.get_running_loop()
        first = await call(pair.channel, loop, 0)
        worker = threading.Thread(target=from_a_thread)
        worker.start()
        worker.join(HOST_PATIENCE_SECONDS)  # blocks the loop
        assert not worker.is_alive(), "the thread's call got no reply"
        return [first, await call(pair.channel, loop, 2)]

    assert asyncio.run(program()) == [{"n": 0}, {"n": 2}]
    assert answered == [{"n": 1}]
    host.join()
    assert pair.channel.reader is child.READER_THREAD
    assert pair.started == [pair.channel._read_replies]
    assert pair.broke == []


def over_the_buffers(pair: Child) -> int:
    """More bytes than the socket pair's buffers hold together: a write of them waits for
    the other end to read."""
    held = sum(
        sock.getsockopt(socket.SOL_SOCKET, option)
        for sock in (pair.host, pair.channel.sock)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF)
    )
    return 4 * held


def test_a_loop_that_reads_never_waits_on_a_full_socket(pair: Child) -> None:
    # The host writes a reply larger than the socket holds and reads nothing until it is
    # written; meanwhile the loop writes a call larger than the socket holds. A loop that
    # blocked on its write would never read the reply that unblocks the host: it hands the
    # reading to the thread first.
    big = "x" * over_the_buffers(pair)

    def host() -> None:
        try:
            first = pair.call_frame()
            pair.reply(first["id"], big)
            second = pair.call_frame()
            pair.reply(second["id"], len(second["arguments"]["big"]))
        except OSError:
            pair.host.shutdown(socket.SHUT_RDWR)  # stuck: the child's write fails, not hangs

    serving = threading.Thread(target=host)
    serving.start()

    async def program() -> list[Any]:
        loop = asyncio.get_running_loop()
        large_reply = asyncio.create_task(call(pair.channel, loop, 0))
        await asyncio.sleep(0)  # its frame goes first
        large_call = pair.channel.call_async("echo", json.dumps({"big": big}), loop)
        return list(await asyncio.gather(large_reply, large_call))

    assert asyncio.run(program()) == [big, len(big)]
    serving.join()
    assert pair.started == [pair.channel._read_replies]
    assert pair.broke == []


def test_a_cancel_from_the_loop_reaches_the_host_and_the_late_reply_frees_its_place(
    pair: Child,
) -> None:
    pair.channel.start_calls(1)

    async def program() -> Any:
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(call(pair.channel, loop, 0))
        frame = await loop.run_in_executor(None, pair.call_frame)
        waiting.cancel()
        cancel = json.loads(await loop.run_in_executor(None, pair.lines.readline))
        assert cancel == {"type": "cancel", "id": frame["id"]}
        pair.reply(frame["id"], "late")  # the place frees when the loop reads this
        host = pair.echo(1)
        answer = await call(pair.channel, loop, 1)  # the only place: waits for it
        await loop.run_in_executor(None, host.join)
        return answer

    assert asyncio.run(program()) == {"n": 1}
    assert pair.started == []
    assert pair.broke == []


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type":"reply","id":7,"carries":"value","value_json":"1"}\n',  # no such call
        b'{"type":"run"}\n',
        b"[1]\n",
        b"not json\n",
    ],
)
def test_a_loop_that_reads_a_frame_it_may_not_get_ends_the_reading(
    pair: Child, frame: bytes
) -> None:
    async def program() -> None:
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        pair.on_broke = lambda: ended.set_result(None)  # where the bootstrap would exit
        pending = asyncio.create_task(call(pair.channel, loop, 0))
        await loop.run_in_executor(None, pair.call_frame)
        pair.host.sendall(frame)
        await ended
        loop.remove_reader(pair.channel.fd)
        pending.cancel()

    asyncio.run(program())
    assert pair.broke and pair.started == []


def threads_of_our_processes() -> int:
    """The most threads any process of this test's (its descendants) has, from /proc."""
    counts = [1]
    for pid in processes_of(os.getpid()):
        try:
            counts.append(int(status_of(pid)["Threads"]))
        except (OSError, KeyError, ValueError):
            continue  # ended meanwhile
    return max(counts)


def test_the_replies_of_a_real_child_wake_its_loop_and_no_thread() -> None:
    """Judged on the host while the tool runs: no process of this test has a second thread
    (the child's reader thread would be one from its first call on)."""
    seen: list[int] = []

    def threads() -> None:
        seen.append(threads_of_our_processes())

    async def run() -> Any:
        async with Sandbox(config()) as sandbox:
            return await sandbox.run(
                "await threads()\nawait threads()",
                profile=PROFILE,
                bindings=FunctionBindings({"threads": threads}),
            )

    result = anyio.run(run)
    assert result.error is None, result.error
    assert seen == [1, 1]
