"""The protocol channel, the child's side: connected over whatever transport the backend gave
(an inherited descriptor, a unix socket, a loopback port and its token), its frames, and the
tool calls in flight (ids, places, and the one reader that hands each reply to its call)."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import _socket
import _thread
import os

MAX_HOST_FRAME_BYTES = 64 * 1024 * 1024
MAX_CHILD_FRAME_BYTES = 16 * 1024 * 1024


class Channel:
    """The protocol channel, whatever transport the backend gave us."""

    def __init__(self, spec):
        kind, _, rest = spec.partition(":")
        token = None
        if kind == "fd":
            sock = _socket.socket(fileno=int(rest))
            # Inherited, so inheritable: the program's children must not get it too. (Sockets
            # made here are never inheritable; on Windows a descriptor is not a socket.)
            os.set_inheritable(sock.fileno(), False)
        elif kind == "unix":
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            sock.connect(rest)
        elif kind == "tcp":
            # A loopback listener (channel_loopback.py): the one-time token comes on stdin,
            # never on the command line, and is the first line sent.
            host, port = rest.rsplit(":", 1)
            host = host.strip("[]")
            token = _read_token()
            family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
            sock = _socket.socket(family, _socket.SOCK_STREAM)
            sock.connect((host, int(port)))
        else:
            raise SystemExit(f"psych-sandbox bootstrap: unknown channel {spec!r}")
        self.sock = sock
        self.fd = sock.fileno()
        self._buffer = bytearray()
        if token is not None:
            sock.sendall(token + b"\n")
        self.lock = _thread.allocate_lock()  # one writer at a time; held to change the reader
        self.next_id = 0
        self.reader = None  # who reads replies: None yet, an event loop, or READER_THREAD
        self.read_lock = _thread.allocate_lock()  # held by a loop while it reads

    def send(self, frame):
        self._write((json_dumps(frame) + "\n").encode())

    def _line(self, start=0):
        """The first whole line in the buffer (taken out of it), b"" for a line longer than
        a host frame may be, None when the line is not complete yet. ``start``: where a
        newline can first be (the bytes before it were searched already)."""
        end = self._buffer.find(b"\n", start)
        if end >= 0:
            line = bytes(self._buffer[: end + 1])
            del self._buffer[: end + 1]
            return line
        if len(self._buffer) > MAX_HOST_FRAME_BYTES:
            return b""
        return None

    def _readline(self):
        line = self._line()
        while line is None:
            # 64 KiB: a larger request makes the allocator map and unmap memory per read.
            chunk = self.sock.recv(65536)
            if not chunk:
                return b""
            searched = len(self._buffer)
            self._buffer += chunk
            line = self._line(searched)
        return line

    def receive(self):
        line = self._readline()
        if not line.endswith(b"\n"):
            raise SystemExit("psych-sandbox bootstrap: control channel closed")
        frame = json_loads(line)
        if not isinstance(frame, dict):
            raise SystemExit("psych-sandbox bootstrap: malformed host frame")
        return frame

    # Calls. Several may be in flight (from tasks, gathers, threads), up to the limit the run
    # frame gives; beyond it a call waits here, in order, for a reply to free a place.
    # Replies are read by one reader and handed to each call's waiter by id, so a call waits
    # on its own reply without holding the channel or an event loop. The reader is the event
    # loop of the first call while only that loop calls (it watches the socket, so a reply
    # wakes it once), and otherwise, for good, a thread of ours (a reply then wakes that
    # thread, which wakes the waiter). Whoever reads never blocks on a write: a writer
    # blocked on a full socket (the host busy writing a large reply) would stop the replies
    # that unblock it. So the reader thread never writes, and a loop that reads writes only
    # what the socket takes at once, handing the reading to the thread before it waits.

    def start_calls(self, limit):
        self.in_flight_limit = limit if isinstance(limit, int) and limit > 0 else 16
        self.in_flight = 0
        self.waiters = {}  # call id -> deliver(reply)
        self.granting = []  # grant() of each call waiting for a place, in order
        self.state = _thread.allocate_lock()  # guards the three above; held only briefly

    def call(self, name, arguments_json):
        """One call from a thread with no event loop running: block until its reply."""
        if not self._take_place(None):
            place = _thread.allocate_lock()
            place.acquire()

            def grant():
                place.release()
                return True

            if not self._take_place(grant):
                place.acquire()
        done = _thread.allocate_lock()
        done.acquire()
        replies = []

        def deliver(reply):
            replies.append(reply)
            done.release()

        self._send(name, arguments_json, deliver, None)
        done.acquire()
        return _reply_value(replies[0])

    async def call_async(self, name, arguments_json, loop):
        """One call from a coroutine on ``loop``, which runs on while the call is in flight.
        A call cancelled while it waits (wait_for, a cancelled task) stops waiting and tells
        the host, which cancels the tool; the reply that still comes frees its place."""
        loop_thread = _thread.get_ident()
        if not self._take_place(None):
            granted = loop.create_future()

            def grant():
                try:
                    if _thread.get_ident() == loop_thread:
                        loop.call_soon(_grant, self, granted)  # freed by this loop's own reading
                    else:
                        loop.call_soon_threadsafe(_grant, self, granted)
                except RuntimeError:
                    return False  # the loop is closed: nobody will use the place
                return True

            if not self._take_place(grant):
                try:
                    await granted
                except BaseException:
                    if granted.done() and not granted.cancelled():
                        self._release_place()  # granted, then cancelled before it was used
                    raise
        future = loop.create_future()

        def deliver(reply):
            if _thread.get_ident() == loop_thread:
                _settle(future, reply)  # read by this loop itself: no wake-up to ask for
                return
            try:
                loop.call_soon_threadsafe(_settle, future, reply)
            except RuntimeError:
                pass  # the loop is closed: nobody waits for this reply any more

        call_id = self._send(name, arguments_json, deliver, loop)
        try:
            reply = await future
        except BaseException:
            self._cancel(call_id)
            raise
        return _reply_value(reply)

    def _cancel(self, call_id):
        # Only while the reply has not arrived; one that is already on its way answers the
        # call all the same, and the host takes a cancel that crossed it as nothing.
        with self.lock:
            with self.state:
                if call_id not in self.waiters:
                    return
            try:
                self.send({"type": "cancel", "id": call_id})
            except OSError:
                pass  # the host is gone: the reply reader ends this process

    def _take_place(self, grant):
        """Take a place among the calls in flight (True), or queue ``grant`` to be called
        when one is handed over (False); ``grant()`` says whether its call took it. With
        ``grant`` None, only a free place is taken (most calls find one: nothing to make)."""
        with self.state:
            if self.in_flight < self.in_flight_limit:
                self.in_flight += 1
                return True
            if grant is not None:
                self.granting.append(grant)
            return False

    def _release_place(self):
        # Handed straight over to the first waiting call that can still take it (the count
        # stays); called outside the lock, since a grant may have to release in turn.
        while True:
            with self.state:
                if not self.granting:
                    self.in_flight -= 1
                    return
                grant = self.granting.pop(0)
            if grant():
                return

    def _send(self, name, arguments_json, deliver, loop):
        # Claim, write and advance under one lock: an id is spent only once its frame was
        # written, and ids go out consecutively whichever thread writes them.
        with self.lock:
            call_id = self.next_id
            try:
                self._choose_reader(loop)
                with self.state:
                    self.waiters[call_id] = deliver  # before the write: the reply may come
                head = f'{{"type":"call","id":{call_id},"name":{_quoted(name)},"arguments":'
                # Type first, as every frame begins; the arguments as measured (call_tool).
                self._write((head + arguments_json + "}\n").encode())
            except BaseException:
                with self.state:
                    self.waiters.pop(call_id, None)
                self._release_place()
                raise
            self.next_id = call_id + 1
        return call_id

    def _choose_reader(self, loop):
        """Make sure someone reads the reply to a call from ``loop`` (None: a thread with no
        loop running). Under self.lock."""
        reader = self.reader
        if reader is READER_THREAD or (reader is loop and loop is not None):
            return
        if reader is not None and reader.is_closed() and not self.waiters:
            reader = self.reader = None  # that loop ended owing no call a reply (a new run)
        if reader is None and loop is not None and _DONTWAIT:
            try:
                loop.add_reader(self.fd, self._read_in_loop, loop)
            except Exception:
                pass  # a loop that cannot watch a socket (a proactor): the thread reads
            else:
                self.reader = loop
                return
        # Another loop, a thread, or a call that blocks: a loop could not be relied on to
        # read its reply (it may be closed, or blocked waiting for that very call).
        self.read_in_thread()

    def end_loop_reading(self):
        """The program is over: no loop reads now. The reader thread reads the replies to
        calls still in flight, if any (they may still come). Under self.lock."""
        if self.reader is None or self.reader is READER_THREAD:
            return
        with self.state:
            waited = bool(self.waiters)
        if waited:
            self.read_in_thread()
        else:
            with self.read_lock:
                self.reader = None

    def read_in_thread(self):
        """From now on, the reader thread reads the replies. Under self.lock."""
        if self.reader is READER_THREAD:
            return
        with self.read_lock:  # a loop reading now finishes first; then it stops for good
            self.reader = READER_THREAD
        _thread.start_new_thread(self._read_replies, ())

    def _write(self, data):
        """Write a whole frame (under self.lock), never blocking the loop that reads."""
        if self.reader is None or self.reader is READER_THREAD:
            self.sock.sendall(data)
            return
        try:
            sent = self.sock.send(data, _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            self.read_in_thread()
            self.sock.sendall(memoryview(data)[sent:])

    def _read_in_loop(self, loop):
        """The loop's reader (called by ``loop`` when the socket is readable): take what has
        arrived without waiting and answer each whole reply in it."""
        try:
            with self.read_lock:
                if self.reader is not loop:
                    loop.remove_reader(self.fd)  # the thread reads now
                    return
                try:
                    chunk = self.sock.recv(65536, _DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    return
                if not chunk:
                    raise SystemExit("psych-sandbox bootstrap: control channel closed")
                searched = len(self._buffer)
                self._buffer += chunk
                while (line := self._line(searched)) is not None:
                    searched = 0
                    if not line:
                        raise SystemExit("psych-sandbox bootstrap: host frame too long")
                    self._answer(json_loads(line))
        except BaseException:
            # Also for what a signal handler of the program may raise in here: the reading
            # would be left half done, and calls waiting on it waiting for ever.
            _channel_broke()

    def _read_replies(self):
        try:
            while True:
                self._answer(self.receive())
        except BaseException:
            _channel_broke()

    def _answer(self, reply):
        """Hand a reply to its call; anything else from the host ends this process."""
        if not isinstance(reply, dict) or reply.get("type") != "reply":
            raise SystemExit("psych-sandbox bootstrap: unexpected host frame")
        with self.state:
            deliver = self.waiters.pop(reply.get("id"), None)
        if deliver is None:
            raise SystemExit("psych-sandbox bootstrap: a reply to no call in flight")
        deliver(reply)
        self._release_place()


#: The reader when a thread of ours reads the replies (Channel.reader).
READER_THREAD = "thread"
#: Reads and writes that do not wait, on a socket that stays blocking for everyone else; 0
#: where the platform has none (the reader thread then reads every reply).
_DONTWAIT = getattr(_socket, "MSG_DONTWAIT", 0)


def _channel_broke():
    # The channel closed or broke, or the host sent what it may not: the host is gone or
    # ending this execution, and a call waiting for its reply would wait for ever. The
    # process goes too.
    os._exit(1)


def _grant(channel, granted):
    if granted.cancelled():
        channel._release_place()  # its call was cancelled while it waited for the place
    else:
        granted.set_result(None)


def _settle(future, reply):
    if not future.done():
        future.set_result(reply)


def _read_token():
    """The token line the host wrote to stdin (and closed), without the newline."""
    data = b""
    while not data.endswith(b"\n") and len(data) <= 128:
        chunk = os.read(0, 129 - len(data))
        if not chunk:
            break
        data += chunk
    if not data.endswith(b"\n"):
        raise SystemExit("psych-sandbox bootstrap: no channel token on stdin")
    return data[:-1]
