"""The loopback channel with a one-time token, for children that can inherit no socket.

Where a child can neither inherit a descriptor nor reach a bind-mounted Unix socket (a
Windows worker, say), the host listens on a loopback TCP port and the child connects to it.
Any process on the host can connect to a loopback port, so the connection proves nothing by
itself: the child's first line must be a token only the host and that child know.

- The token never appears on the child's command line or in its environment (both are
  readable by other local processes on some systems): the host writes it to the child's
  stdin, once, and closes it (:attr:`LoopbackTokenChannel.child_stdin`). The child is told
  only ``tcp:127.0.0.1:PORT``.
- It is one-time: the listener closes at the first good token, so the same token presented
  again meets a closed port.
- It is short-lived: a good token presented after :data:`TOKEN_LIFETIME_SECONDS` (from when
  the listener opened) ends the channel instead of connecting it.
- Strangers cannot stall the child: each connection is judged on its own, with
  :data:`TOKEN_READ_SECONDS` to present its token, so a silent connection does not hold the
  listener; after :data:`MAX_REFUSED_CONNECTIONS` wrong tokens the channel gives up.

Any backend on any platform may use it (it needs nothing but loopback TCP); the child side is
the bootstrap's ``tcp:`` transport.
"""

from __future__ import annotations

import hmac
import math
import secrets
import time
from collections.abc import Callable

import anyio
from anyio.abc import ByteStream, SocketAttribute, SocketListener, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from ..errors import ProtocolViolation
from .channel import ChannelListener

#: Bytes of randomness in a token: 128 bits, beyond guessing within any execution's life.
TOKEN_BYTES = 16
#: How long a token is good for, from the moment the listener opens. The child connects first
#: thing after its interpreter starts; a slow, loaded host starts one in seconds, and this
#: matches the backends' own start-up bound.
TOKEN_LIFETIME_SECONDS = 30.0
#: How long one connection may take to present its token once connected: the child sends it
#: at once, so only a stranger (or a stalled child) needs longer.
TOKEN_READ_SECONDS = 5.0
#: Wrong tokens tolerated before the channel gives up: a stray client or two is survivable,
#: a stream of them is an attack on this execution, which then fails rather than waits.
MAX_REFUSED_CONNECTIONS = 16
#: The longest line read while waiting for a token (the token is 32 hex digits).
_MAX_TOKEN_LINE = 64


class LoopbackTokenChannel(ChannelListener):
    """A loopback TCP listener whose first good connection presents a one-time token.

    ``await open()`` before spawning; give the child ``child_spec`` and write
    ``child_stdin`` to its stdin, then close that. ``clock`` (seconds, monotonic) is there
    for tests of expiry.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        lifetime_seconds: float = TOKEN_LIFETIME_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if host not in ("127.0.0.1", "::1"):
            # A token is no protection against a network: this channel is for loopback only.
            raise ValueError(f"the token channel listens on loopback only, not {host!r}")
        self._host = host
        self._token = secrets.token_hex(TOKEN_BYTES).encode("ascii")
        self._lifetime = lifetime_seconds
        self._clock = clock
        self._opened_at = math.inf
        self._listener: SocketListener | None = None
        self.child_spec = ""
        #: What the backend writes to the child's stdin (then closes it): the token line.
        self.child_stdin = self._token + b"\n"
        #: Connections refused so far (wrong, malformed, silent or late), for diagnostics.
        self.refused = 0

    async def open(self) -> None:
        multi = await anyio.create_tcp_listener(local_host=self._host, local_port=0)
        listener = multi.listeners[0]
        assert isinstance(listener, SocketListener)
        self._listener = listener
        self._opened_at = self._clock()
        port = listener.extra(SocketAttribute.local_port)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.child_spec = f"tcp:{host}:{port}"

    def expired(self) -> bool:
        return self._clock() - self._opened_at > self._lifetime

    async def accept(self) -> ByteStream:
        """The first connection that presents the token in time; the listener is closed then.
        Raises ProtocolViolation if the token is presented late or too many strangers call."""
        listener = self._listener
        assert listener is not None, "open() first"
        accepted: ByteStream | None = None
        failure: ProtocolViolation | None = None
        async with anyio.create_task_group() as tg:

            async def judge(stream: SocketStream) -> None:
                nonlocal accepted, failure
                kept = False
                try:
                    verdict = await self._judge(stream)
                    if verdict is None:
                        return
                    if isinstance(verdict, ProtocolViolation):
                        failure = failure or verdict
                    elif accepted is None:
                        accepted, kept = verdict, True
                    tg.cancel_scope.cancel()
                finally:
                    if not kept:
                        # Refused, or cancelled once another connection won: closed either way.
                        with anyio.CancelScope(shield=True):
                            await stream.aclose()

            while True:
                try:
                    stream = await listener.accept()
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
                tg.start_soon(judge, stream)
        # Either way the port closes now: a good token is never good twice.
        await listener.aclose()
        if accepted is not None:
            return accepted
        raise failure or ProtocolViolation("the token channel closed before a child connected")

    async def _judge(self, stream: SocketStream) -> ByteStream | ProtocolViolation | None:
        """A stream to keep if it presented the token in time; a violation that ends the
        channel; None for a connection that is merely refused. Never closes ``stream``."""
        buffered = BufferedByteReceiveStream(stream)
        presented: bytes | None = None
        with anyio.move_on_after(TOKEN_READ_SECONDS):
            try:
                presented = await buffered.receive_until(b"\n", _MAX_TOKEN_LINE)
            except (
                anyio.EndOfStream,
                anyio.IncompleteRead,
                anyio.DelimiterNotFound,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
            ):
                presented = None
        if presented is not None and hmac.compare_digest(presented, self._token):
            if self.expired():
                return ProtocolViolation(
                    f"the child presented its channel token more than "
                    f"{self._lifetime:g} s after the channel opened; a late token is refused"
                )
            return _Prebuffered(stream, buffered)
        self.refused += 1
        if self.refused >= MAX_REFUSED_CONNECTIONS:
            return ProtocolViolation(
                f"{self.refused} connections to the token channel presented no valid token; "
                "giving up on this execution"
            )
        return None

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()


class _Prebuffered(ByteStream):
    """A stream whose first bytes may already sit in the buffer that read the token."""

    def __init__(self, stream: ByteStream, buffered: BufferedByteReceiveStream) -> None:
        self._stream = stream
        self._buffered = buffered

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._buffered.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._stream.send(item)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()
