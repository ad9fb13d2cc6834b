# The child side of psych-sandbox. Standard library only, CPython 3.10+: this source runs on
# interpreters we do not choose (a container's, a remote host's), passed with ``-c``, so it
# never needs a file of ours to be readable from inside the sandbox.
#
# Sequence: connect the channel -> probe own containment -> hello -> wait for run or abort
# -> apply limits -> compile -> run -> result frame -> exit.
#
# Imports are kept to C modules every run needs (_json, _socket, _thread, resource; _ast once
# the hello is sent, see _load_ast); the Python wrappers around them (ast, json, socket,
# threading) would import re, enum and collections, which roughly doubles an interpreter's
# start-up. asyncio and traceback load only when used.
import _socket
import _thread
import os
import sys

try:
    import _json
except ImportError:  # an interpreter without the C accelerator: the plain module will do
    _json = None  # type: ignore[assignment]

# Here, before the bootstrap forks (see _pid_namespace_init), though only the program's
# process uses it (the probe reports the limits, then they are applied): an extension
# module loaded after a fork costs that process about three times as much (1.1 ms against
# 0.4, measured), the loader's pages copied on write.
try:
    import resource
except ImportError:  # not POSIX (Windows): no limits to report or apply this way
    resource = None  # type: ignore[assignment]
# The site module likewise (and the builtins module it imports): importing it runs nothing
# under -S, and its work is done later, in the program's process, as the program's identity
# (_as_site_would); loaded here, that work costs a fresh fork about 0.8 ms less, measured.
import site

PROTOCOL_VERSION = 1
PROGRAM_FILENAME = "<program>"
#: The caller's code run ahead of the program, compiled apart so the program's own line
#: numbers and file name are what its tracebacks show.
PREAMBLE_FILENAME = "<preamble>"
MAX_HOST_FRAME_BYTES = 64 * 1024 * 1024
MAX_CHILD_FRAME_BYTES = 16 * 1024 * 1024
#: JSON nested deeper, or holding more elements, than this is refused before it is sent:
#: the host refuses such frames before it parses them. Copies of protocol/limits.py.
MAX_JSON_DEPTH = 128
MAX_JSON_ELEMENTS = 2**16
#: A call frame's bytes around its arguments; the host's ceiling for a call frame is the
#: argument budget plus this. A copy of protocol/limits.py.
CALL_FRAME_ENVELOPE_BYTES = 4 * 1024
#: No tool has a longer name (the envelope above counts on it). A copy of protocol/limits.py.
MAX_TOOL_NAME_CHARS = 256
MAIN_NAME = "__psych_main__"
MAX_INPUT_NAME_CHARS = 255
#: The shell of a command run in shell form (command mode), as ``SHELL -c COMMAND``.
SHELL = "/bin/sh"
#: Artifacts travel in chunks of exactly this many bytes (the last may be shorter); the walk
#: examines at most this many entries, this deep. Copies of protocol/limits.py.
ARTIFACT_CHUNK_BYTES = 1024 * 1024
MAX_ARTIFACT_ENTRIES = 10_000
MAX_ARTIFACT_DEPTH = 32
MAX_ARTIFACT_PATH_CHARS = 4096
RLIMIT_NAMES = ("CORE", "CPU", "AS", "FSIZE", "NPROC", "NOFILE")


# ------------------------------------------------------------------ JSON without json


class _DecodeContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo = None

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"{name} is not valid JSON")


def _not_serialisable(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


if _json is not None:
    _scan = _json.make_scanner(_DecodeContext())  # type: ignore[arg-type]

    def json_loads(text):
        if isinstance(text, (bytes, bytearray)):
            text = text.decode("utf-8")
        start = len(text) - len(text.lstrip(" \t\r\n"))
        end = len(text.rstrip(" \t\r\n"))
        try:
            value, stop = _scan(text, start)
        except StopIteration:
            raise ValueError("invalid JSON") from None
        if stop != end:
            raise ValueError("invalid JSON: extra data after the value")
        return value

    def json_dumps(value):
        encode = _json.make_encoder(
            {},
            _not_serialisable,
            _json.encode_basestring_ascii,
            None,
            ":",
            ",",
            False,
            False,
            False,
        )
        return "".join(encode(value, 0))

    def json_text(value):
        """Compact JSON with text left as text (sent as UTF-8): the form the host measures
        a call's arguments in."""
        encode = _json.make_encoder(
            {}, _not_serialisable, _json.encode_basestring, None, ":", ",", False, False, False
        )
        return "".join(encode(value, 0))

else:  # pragma: no cover - CPython always has _json

    def json_loads(text):
        import json

        return json.loads(text, parse_constant=_DecodeContext.parse_constant)

    def json_dumps(value):
        import json

        return json.dumps(value, allow_nan=False, separators=(",", ":"))

    def json_text(value):
        import json

        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def json_problem(value):
    """Why the host would refuse this (already encodable) JSON data, or None."""
    # Elements counted as the host counts them on the text (protocol/shape.py): a "[" and a
    # "," between items; a "{", a "," between members and a ":" in each.
    elements = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"it is nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "it contains a lone surrogate, which is not valid Unicode text"
        elif isinstance(item, dict):
            elements += 2 * len(item) or 1
            for key, member in item.items():
                stack.append((key, depth + 1))
                stack.append((member, depth + 1))
        elif isinstance(item, (list, tuple)):
            elements += len(item) or 1
            stack.extend((member, depth + 1) for member in item)
        if elements > MAX_JSON_ELEMENTS:
            return f"it holds more than {MAX_JSON_ELEMENTS} elements"
    return None


# ------------------------------------------------------------------ the program's helpers


class ToolError(Exception):
    """A binding call failed; ``kind`` says how (see docs/protocol.md)."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class ToolResultHandle:
    """A result too large to hand over whole: read it with read_tool_output()."""

    __slots__ = ("_descriptor",)

    def __init__(self, descriptor):
        self._descriptor = descriptor

    def _refuse(self, *args, **kwargs):
        raise TypeError(
            "this is a ToolResultHandle, not the tool's result: the result was too large to "
            "send whole. Read it in windows or search it with "
            "await read_tool_output(handle=..., offset=..., length=...) or pattern=..."
        )

    __len__ = __iter__ = __getitem__ = __contains__ = get = keys = items = values = _refuse

    def __repr__(self):
        return f"ToolResultHandle({self._descriptor!r})"

    def to_json(self):
        return dict(self._descriptor)


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
#: A tool's name as a JSON string: json_dumps of a str, without building an encoder per call.
_quoted = json_dumps if _json is None else _json.encode_basestring_ascii
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


def _reply_value(reply):
    carries = reply.get("carries")
    if carries == "value":
        return json_loads(reply["value_json"])
    if carries == "handle":
        return ToolResultHandle(reply["handle"])
    raise ToolError(reply.get("error_kind") or "tool_error", reply.get("message") or "")


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


# ------------------------------------------------------------------ probing


def _probe_connect(family, address):
    if address is None:
        return "skipped"
    try:
        sock = _socket.socket(family, _socket.SOCK_STREAM)
    except OSError:
        return "unreachable"
    sock.settimeout(1.0)
    try:
        sock.connect(address)
        return "connected"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "unreachable"
    finally:
        sock.close()


def _interfaces_up():
    # Ask the kernel about this process's own network namespace (sysfs may be the host's).
    try:
        names = [name for _, name in _socket.if_nameindex()]
    except OSError:
        return []
    # Only a namespace with more than loopback is asked further (an isolated one has only
    # "lo"), so the usual child imports nothing for this probe.
    names = [name for name in names if name != "lo" and not name.startswith("lo0")]
    if not names:
        return []
    up = []
    probe_socket = None
    try:
        if sys.platform.startswith("linux"):
            import fcntl

            probe_socket = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        for name in names:
            flags = 0x1  # elsewhere, an interface that exists counts as up: the safe side
            if probe_socket is not None:
                try:
                    # struct ifreq: the name in 16 bytes, then the flags (a short), padded.
                    request = name.encode()[:15].ljust(16, b"\0") + bytes(16)
                    answer = fcntl.ioctl(probe_socket.fileno(), 0x8913, request)  # SIOCGIFFLAGS
                    flags = int.from_bytes(answer[16:18], sys.byteorder)
                except OSError:
                    flags = 0x1
            if flags & 0x1:  # IFF_UP
                up.append(name[:64])
    finally:
        if probe_socket is not None:
            probe_socket.close()
    return up[:256]


def _capabilities():
    status = _read_file("/proc/self/status", 64 * 1024)
    for line in (status or b"").split(b"\n"):
        if line.startswith(b"CapEff:"):
            return line.split()[1][:32].decode("ascii", "replace")
    return None


def _read_file(path, limit):
    """Up to ``limit`` bytes of ``path`` (None if it cannot be read): by descriptor, without
    the file objects open() builds, which cost a freshly forked child a few tenths of a
    millisecond each time (their pages copied on write)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        data = b""
        while len(data) < limit:
            chunk = os.read(fd, limit - len(data))
            if not chunk:
                break
            data += chunk
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def _limits():
    if resource is None:
        return []
    out = []
    for name in RLIMIT_NAMES:
        constant = getattr(resource, "RLIMIT_" + name, None)
        if constant is None:
            continue
        soft, hard = resource.getrlimit(constant)
        inf = resource.RLIM_INFINITY
        out.append(
            {"name": name, "soft": -1 if soft == inf else soft, "hard": -1 if hard == inf else hard}
        )
    return out


def probe(config):
    canary = config.get("canary")
    canary_readable = None
    if canary:
        canary_readable = _read_file(canary, 1) is not None
    port4 = config.get("port4")
    port6 = config.get("port6")
    host_pid = config.get("host_pid")
    return {
        # -1 where there are no POSIX ids (Windows): the host grades no identity there.
        "uid": os.getuid() if hasattr(os, "getuid") else -1,
        "euid": os.geteuid() if hasattr(os, "geteuid") else -1,
        "gid": os.getgid() if hasattr(os, "getgid") else -1,
        "pid": os.getpid(),
        "canary_readable": canary_readable,
        "network": {
            "ipv4": _probe_connect(_socket.AF_INET, ("127.0.0.1", port4) if port4 else None),
            "ipv6": _probe_connect(_socket.AF_INET6, ("::1", port6) if port6 else None),
            "interfaces_up": _interfaces_up(),
        },
        "limits": _limits(),
        "capabilities": _capabilities(),
        "sees_foreign_processes": (
            os.path.exists(f"/proc/{host_pid}") if host_pid and os.path.isdir("/proc") else None
        ),
        "python": sys.version.split()[0],
        "platform": sys.platform,
    }


# ------------------------------------------------------------------ limits


def apply_limits(limits):
    if resource is None:
        return
    inf = resource.RLIM_INFINITY

    def clamp(constant, soft, hard):
        # Never raise: take the stricter of requested and inherited on each side, then keep
        # soft <= hard.
        old_soft, old_hard = resource.getrlimit(constant)
        if hard is not None and (old_hard == inf or hard < old_hard):
            new_hard = hard
        else:
            new_hard = old_hard
        if soft is not None and (old_soft == inf or soft < old_soft):
            new_soft = soft
        else:
            new_soft = old_soft
        if new_hard != inf and (new_soft == inf or new_soft > new_hard):
            new_soft = new_hard
        try:
            resource.setrlimit(constant, (new_soft, new_hard))
        except (ValueError, OSError):
            # Some platforms refuse any practical cap (address space with large shared
            # mappings); the CPU limit and the host's wall clock remain.
            pass

    # Core dumps off first: the CPU limit's signal would otherwise dump a memory image.
    clamp(resource.RLIMIT_CORE, 0, 0)
    cpu = limits.get("cpu_seconds")
    if cpu is not None:
        clamp(resource.RLIMIT_CPU, cpu, cpu + 1)
    memory = limits.get("memory_bytes")
    if memory is not None and hasattr(resource, "RLIMIT_AS"):
        clamp(resource.RLIMIT_AS, memory, memory)
    size = limits.get("file_size_bytes")
    if size is not None:
        clamp(resource.RLIMIT_FSIZE, size, size)
    processes = limits.get("processes")
    if processes is not None and hasattr(resource, "RLIMIT_NPROC"):
        clamp(resource.RLIMIT_NPROC, processes, processes)


# ------------------------------------------------------------------ compiling


def _iter_children(node):
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            yield value
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    yield item


def _walk(node):
    pending = [node]
    while pending:
        current = pending.pop()
        pending.extend(_iter_children(current))
        yield current


def _copy_location(new, old):
    for attribute in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
        if hasattr(old, attribute):
            setattr(new, attribute, getattr(old, attribute))
    return new


def _fix_missing_locations(node):
    # Give every synthetic node its parent's position, as ast.fix_missing_locations does.
    def fix(current, lineno, col, end_lineno, end_col):
        if "lineno" in current._attributes:
            if getattr(current, "lineno", None) is None:
                current.lineno = lineno
            else:
                lineno = current.lineno
            if getattr(current, "end_lineno", None) is None:
                current.end_lineno = end_lineno
            else:
                end_lineno = current.end_lineno
            if getattr(current, "col_offset", None) is None:
                current.col_offset = col
            else:
                col = current.col_offset
            if getattr(current, "end_col_offset", None) is None:
                current.end_col_offset = end_col
            else:
                end_col = current.end_col_offset
        for child in _iter_children(current):
            fix(child, lineno, col, end_lineno, end_col)

    fix(node, 1, 0, 1, 0)
    return node


class _NodeVisitor:
    def visit(self, node):
        return getattr(self, "visit_" + type(node).__name__, self.generic_visit)(node)

    def generic_visit(self, node):
        for child in _iter_children(node):
            self.visit(child)


class _ScopeWalker(_NodeVisitor):
    """Collects names the top-level scope binds, and whether it awaits, without descending
    into nested scopes."""

    def __init__(self):
        self.names = set()
        self.awaits = False
        self.yields = False

    def visit_FunctionDef(self, node):
        self.names.add(node.name)
        for item in node.decorator_list:
            self.visit(item)
        self._visit_arguments_defaults(node.args)
        if node.returns is not None:
            self.visit(node.returns)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _visit_arguments_defaults(self, args):
        for default in list(args.defaults) + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)

    def visit_ClassDef(self, node):
        self.names.add(node.name)
        for item in list(node.decorator_list) + list(node.bases) + list(node.keywords):
            self.visit(item)

    def visit_Lambda(self, node):
        self._visit_arguments_defaults(node.args)

    def _visit_comprehension(self, node):
        # The first iterable is evaluated in the enclosing scope; an await there counts.
        self.visit(node.generators[0].iter)
        for child in _walk(node):
            if isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name):
                self.names.add(child.target.id)
            if isinstance(child, (ast.Await,)) or (
                isinstance(child, ast.comprehension) and child.is_async
            ):
                self.awaits = True

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension

    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.names.add(node.id)

    def visit_Import(self, node):
        for alias in node.names:
            self.names.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node):
        for alias in node.names:
            if alias.name != "*":
                self.names.add(alias.asname or alias.name)

    def visit_ExceptHandler(self, node):
        if node.name:
            self.names.add(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node):
        if node.name:
            self.names.add(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node):
        if node.name:
            self.names.add(node.name)

    def visit_MatchMapping(self, node):
        if node.rest:
            self.names.add(node.rest)
        self.generic_visit(node)

    def visit_Global(self, node):
        self.names.update(node.names)

    def visit_Await(self, node):
        self.awaits = True
        self.generic_visit(node)

    def visit_AsyncFor(self, node):
        self.awaits = True
        self.generic_visit(node)

    visit_AsyncWith = visit_AsyncFor

    def visit_Yield(self, node):
        self.yields = True

    visit_YieldFrom = visit_Yield


if "_ast" in sys.modules:  # the compiler's tree types, already imported by the start-up
    import _ast as ast
else:
    ast = None  # type: ignore[assignment]  # imported by _load_ast


def _load_ast():
    """Import the compiler's tree types, which building a program needs: about 1.5 ms, taken
    off a cold child's start by doing it once the hello is sent, while the host grades it."""
    global ast
    if ast is None:
        import _ast

        ast = _ast


def build_program(source):
    """Parse the model's program and wrap its body in a synthetic function.

    Returns (code, is_async). Raises SyntaxError with the program's own line and column.
    """
    _load_ast()
    tree = compile(source, PROGRAM_FILENAME, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    body = list(tree.body)  # type: ignore[attr-defined]
    futures = []
    while body and isinstance(body[0], ast.ImportFrom) and body[0].module == "__future__":
        futures.append(body.pop(0))
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        # A leading docstring is allowed before __future__ imports; keep it as a statement.
        pass
    walker = _ScopeWalker()
    for statement in body:
        walker.visit(statement)
    if walker.yields:
        first = next(n for s in body for n in _walk(s) if isinstance(n, (ast.Yield, ast.YieldFrom)))
        raise SyntaxError(
            "'yield' outside function",
            (PROGRAM_FILENAME, first.lineno, first.col_offset + 1, None),
        )
    # Module-level names stay module globals, as they would in a script: functions defined
    # by the program see them, and `global` inside those functions means what it says.
    body = [_unannotate(statement) for statement in body]
    body = [statement for statement in body if statement is not None]
    if body and isinstance(body[-1], ast.Expr):
        last = body[-1]
        body[-1] = _copy_location(ast.Return(value=last.value), last)
    anchor = body[0] if body else (futures[0] if futures else None)
    if not body:
        body = [ast.Pass()]
    if walker.names:
        body.insert(0, ast.Global(names=sorted(walker.names)))
    factory = ast.AsyncFunctionDef if walker.awaits else ast.FunctionDef
    arguments = ast.arguments(
        posonlyargs=[],
        args=[],
        vararg=None,
        kwonlyargs=[],
        kw_defaults=[],
        kwarg=None,
        defaults=[],
    )
    wrapper = factory(
        name=MAIN_NAME,
        args=arguments,
        body=body,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    if sys.version_info >= (3, 12):
        wrapper.type_params = []
    module = ast.Module(body=[*futures, wrapper], type_ignores=[])
    if anchor is not None:
        # Anchor the synthetic nodes on the first real statement so every line number in a
        # traceback is a line of the model's text.
        for node in (wrapper, body[0]):
            _copy_location(node, anchor)
            node.end_lineno = anchor.end_lineno
            node.end_col_offset = anchor.end_col_offset
    _fix_missing_locations(module)
    # dont_inherit: this module's own compiler flags must not leak into the program.
    code = compile(module, PROGRAM_FILENAME, "exec", dont_inherit=True)
    return code, walker.awaits


def _unannotate(statement):
    # `x: int = 1` cannot stay annotated once `x` is declared global inside the wrapper.
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        if statement.value is None:
            return None
        return _copy_location(
            ast.Assign(targets=[statement.target], value=statement.value), statement
        )
    return statement


# ------------------------------------------------------------------ reporting errors


def _filter_exception(te):
    import traceback

    seen = set()
    stack = [te]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = traceback.StackSummary.from_list(
            [frame for frame in current.stack if frame.filename == PROGRAM_FILENAME]
        )
        stack.append(current.__cause__)
        stack.append(current.__context__)
        stack.extend(getattr(current, "exceptions", None) or [])


_PROGRAM_SOURCE = None


def _register_source():
    # Only when a traceback is formatted: linecache pulls in tokenize and re, which every
    # successful run would otherwise pay for at start-up.
    import linecache

    if _PROGRAM_SOURCE is not None:
        linecache.cache[PROGRAM_FILENAME] = (
            len(_PROGRAM_SOURCE),
            None,
            _PROGRAM_SOURCE.splitlines(True),
            PROGRAM_FILENAME,
        )


def describe_exception(exc):
    import traceback

    _register_source()

    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, capture_locals=False)
    _filter_exception(te)
    text = "".join(te.format())
    line = column = None
    if isinstance(exc, SyntaxError) and exc.filename == PROGRAM_FILENAME:
        line, column = exc.lineno, exc.offset
    elif te.stack:
        line = te.stack[-1].lineno
    try:
        message = str(exc)
    except Exception:  # a hostile __str__ must not take the bootstrap down
        message = f"<unprintable {type(exc).__name__}>"
    return {
        "type": type(exc).__name__[:256],
        "message": message[: 256 * 1024],
        "traceback": text[-256 * 1024 :],
        "line": line if isinstance(line, int) and line >= 0 else None,
        "column": column if isinstance(column, int) and column >= 0 else None,
    }


# ------------------------------------------------------------------ the program's namespace

#: Names the namespace defines itself, never a tool's alias. A copy of catalogue.py's.
NAMESPACE_NAMES = frozenset(
    {"TOOLS", "ToolError", "ToolResultHandle", "call_tool", "list_tools", "get_tool_info"}
)
#: The catalogue lookups the host answers, when it offers them.
LOOKUPS = ("list_tools", "get_tool_info")


def alias_for(name):
    """A tool's direct alias: its own name when that is a usable identifier hiding nothing
    (no keyword, builtin or namespace name); never a mangled one. A copy of catalogue.py's."""
    import builtins
    import keyword

    if (
        name.isidentifier()
        and not keyword.iskeyword(name)
        and name not in NAMESPACE_NAMES
        and not hasattr(builtins, name)
    ):
        return name
    return None


class Tool(str):
    """One tool offered to the program: its name (it is that str), with ``.alias`` (the
    direct alias, or None: call it through call_tool), ``.description`` and ``.schema`` (the
    JSON schema of its arguments, or None when the host sent none: get_tool_info has it)."""

    name = ""
    alias = None
    description = ""
    _schema_json = None
    _schema = None

    def __new__(cls, name, description="", schema_json=None):
        self = str.__new__(cls, name)
        self.name = name
        self.alias = alias_for(name)
        self.description = description
        self._schema_json = schema_json
        self._schema = None
        return self

    @property
    def schema(self):
        if self._schema is None and self._schema_json is not None:
            self._schema = json_loads(self._schema_json)
        return self._schema

    def positional_order(self):
        schema = self.schema
        properties = schema.get("properties") if isinstance(schema, dict) else None
        return list(properties) if isinstance(properties, dict) else None


class NotAwaitedError(TypeError):
    """A tool was called without ``await``: the call never ran."""


class _NotAwaitedAttribute(NotAwaitedError, AttributeError):
    pass


#: Tool calls made and dropped without being awaited, as (what, line): the program fails
#: with the first when it otherwise finished, since the tools it meant to call never ran.
_NOT_AWAITED = []  # type: list[tuple[str, int | None]]


def _program_line():
    """The line of the model's program that is calling us (None if none is on the stack)."""
    frame = sys._getframe(2)
    for _ in range(32):
        if frame.f_code.co_filename == PROGRAM_FILENAME:
            return frame.f_lineno
        if frame.f_back is None:
            return None
        frame = frame.f_back
    return None


def _not_awaited_message(what, line):
    where = f"line {line}: " if line is not None else ""
    return (
        f"{where}{what} was called without await, so the tool never ran; every tool is an "
        f"async function: write `result = await {what}`"
    )


class _ToolCall:
    """What calling a tool returns: awaited (or gathered, or made a task) it makes the call.
    To asyncio it is a coroutine; used as a value it raises NotAwaitedError naming the line
    of the call, and dropped unawaited it fails the program saying so."""

    __slots__ = ("__weakref__", "_coroutine", "_factory", "_line", "_what")

    def __init__(self, factory, what, line):
        self._factory = factory
        self._coroutine = None
        self._what = what
        self._line = line

    def _started(self):
        if self._coroutine is None:
            self._coroutine = self._factory()
            self._factory = None
        return self._coroutine

    def __await__(self):
        return self._started().__await__()

    def send(self, value):
        return self._started().send(value)

    def throw(self, *args):
        return self._started().throw(*args)

    def close(self):
        self._factory = None  # closed: deliberately never run
        if self._coroutine is not None:
            self._coroutine.close()

    def __del__(self):
        if self._factory is not None:
            _NOT_AWAITED.append((self._what, self._line))

    def __repr__(self):
        return f"<call of {self._what}, not awaited>"

    def _misused(self, *args, **kwargs):
        raise NotAwaitedError(_not_awaited_message(self._what, self._line))

    def __getattr__(self, name):
        raise _NotAwaitedAttribute(_not_awaited_message(self._what, self._line))

    __getitem__ = __iter__ = __len__ = __contains__ = __bool__ = __str__ = _misused
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _misused
    __truediv__ = __floordiv__ = __mod__ = __lt__ = __le__ = __gt__ = __ge__ = _misused
    __int__ = __float__ = __index__ = __call__ = _misused


def _running_loop():
    """The asyncio loop running in this thread, if any (without importing asyncio)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _make_namespace(channel, tools, argument_bytes, catalogue=None):
    import builtins

    async def perform(name, arguments):
        if not isinstance(name, str):
            raise TypeError("call_tool(name, arguments): name must be a str")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise TypeError("call_tool(name, arguments): arguments must be a dict")
        # A handle travels as its opaque descriptor (how read_tool_output names it).
        arguments = {
            key: value.to_json() if isinstance(value, ToolResultHandle) else value
            for key, value in arguments.items()
        }
        if json_problem(name) is not None:
            raise TypeError("call_tool(name, arguments): name must be valid Unicode text")
        if len(name) > MAX_TOOL_NAME_CHARS:
            raise ToolError(
                "unknown_tool",
                f"no tool has a name longer than {MAX_TOOL_NAME_CHARS} characters; TOOLS "
                "lists those offered",
            )
        try:
            encoded = json_text(arguments)
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(f"call_tool({name!r}): arguments must be JSON data: {exc}") from None
        problem = json_problem(arguments)
        if problem is not None:
            raise TypeError(f"call_tool({name!r}): arguments cannot be sent: {problem}")
        size = len(encoded.encode("utf-8"))
        if size > argument_bytes:
            # Checked here, before an id is spent: the host refuses a call frame longer than
            # the budget allows by its length alone, as a protocol violation. The words are
            # the host's own for arguments over the budget.
            raise ToolError(
                "budget_exhausted",
                f"the arguments are {size} bytes as JSON, over the per-call budget of "
                f"{argument_bytes} bytes",
            )
        loop = _running_loop()
        if loop is None:
            return channel.call(name, encoded)
        return await channel.call_async(name, encoded, loop)

    def call_tool(name, arguments=None):
        what = f"call_tool({name!r}, ...)" if isinstance(name, str) else "call_tool(...)"
        return _ToolCall(lambda: perform(name, arguments), what, _program_line())

    if catalogue is None:
        listed = [Tool(name) for name in tools if name not in LOOKUPS]
    else:
        listed = [
            Tool(entry.get("name"), entry.get("description") or "", entry.get("input_schema_json"))
            for entry in catalogue
        ]
    namespace = {
        "__name__": "__main__",
        "__builtins__": builtins,
        "__doc__": None,
        "TOOLS": tuple(listed),
        "ToolError": ToolError,
        "ToolResultHandle": ToolResultHandle,
        "call_tool": call_tool,
    }
    if all(name in tools for name in LOOKUPS):
        aliases = {tool.name: tool.alias for tool in listed}

        def list_tools(query=None, offset=0, limit=100):
            arguments = {"offset": offset, "limit": limit}
            if query is not None:
                arguments["query"] = query
            return _ToolCall(
                lambda: perform("list_tools", arguments), "list_tools(...)", _program_line()
            )

        async def info(name):
            answer = await perform("get_tool_info", {"name": name})
            if isinstance(answer, dict):
                answer["alias"] = aliases.get(name)
            return answer

        def get_tool_info(name):
            return _ToolCall(lambda: info(name), "get_tool_info(...)", _program_line())

        namespace["list_tools"] = list_tools
        namespace["get_tool_info"] = get_tool_info
    for tool in listed:
        # A direct alias only for names that are usable identifiers; never a mangled one, so
        # two tools whose names mangle alike can never answer for each other; and never one
        # that would hide a builtin (a tool named "print" stays reachable through call_tool).
        if tool.alias is not None and tool.alias not in namespace:
            namespace[tool.alias] = _alias(perform, tool)
    return namespace


def _alias(perform, tool):
    name = str(tool)
    what = f"{name}(...)"

    def alias(*args, **arguments):
        if args:
            # Positional arguments in the order of the tool's input schema.
            order = tool.positional_order()
            if order is None:
                raise TypeError(
                    f"{name}() takes keyword arguments only: its input schema is unknown "
                    f"(await get_tool_info({name!r}) may say more)"
                )
            if len(args) > len(order):
                raise TypeError(
                    f"{name}() takes at most {len(order)} positional arguments "
                    f"({', '.join(order)}) but {len(args)} were given"
                )
            for key, value in zip(order, args, strict=False):
                if key in arguments:
                    raise TypeError(f"{name}() got multiple values for argument {key!r}")
                arguments[key] = value
        return _ToolCall(lambda: perform(name, arguments), what, _program_line())

    alias.__name__ = alias.__qualname__ = name
    alias.__doc__ = tool.description or None
    return alias


# ------------------------------------------------------------------ running


def run_program(channel, frame):
    tools = frame.get("tools") or []
    limits = frame.get("limits") or {}
    cap = int(limits.get("return_value_bytes") or 0)
    argument_bytes = limits.get("argument_bytes")
    if not isinstance(argument_bytes, int) or argument_bytes <= 0:
        argument_bytes = MAX_CHILD_FRAME_BYTES - 1 - CALL_FRAME_ENVELOPE_BYTES
    channel.start_calls(limits.get("calls_in_flight"))
    namespace = _make_namespace(channel, tools, argument_bytes, frame.get("catalogue"))
    given = _give_names(namespace, frame)
    if given is not None:
        return given
    try:
        code, is_async = build_program(frame["source"])
    except SyntaxError as exc:
        return {"outcome": "raised", "error": describe_exception(exc)}
    except ValueError as exc:
        # The compiler refuses what it cannot build (a NUL byte in the text).
        return {"outcome": "raised", "error": describe_exception(exc)}
    except (MemoryError, RecursionError):
        # Nesting beyond the parser's stack: the program's shape, not the memory limit.
        error = SyntaxError("the program is nested too deeply for the compiler")
        return {"outcome": "raised", "error": describe_exception(error)}
    global _PROGRAM_SOURCE
    _PROGRAM_SOURCE = frame["source"]
    try:
        exec(code, namespace)
        main = namespace.pop(MAIN_NAME)
        main.__code__ = main.__code__.replace(co_name="<module>")
        if is_async:
            import asyncio

            value = asyncio.run(main())
        else:
            value = main()
    except SystemExit as exc:
        if exc.code in (None, 0):
            value = None
        else:
            return {"outcome": "raised", "error": describe_exception(exc)}
    except BaseException as exc:
        return {"outcome": "raised", "error": describe_exception(exc)}
    returned = _returned(value, cap)
    if returned["outcome"] != "returned" or not frame.get("keep_variables"):
        return returned
    # Only after a return: a raised result's text and the variables together could outweigh
    # the result frame's ceiling, which allows for one or the other.
    return _kept(returned, namespace, cap - len((returned.get("value_json") or "").encode()))


def _give_names(namespace, frame):
    """The caller's names (variables, then its preamble) put in the program's namespace;
    a result when that failed (the program then does not run)."""
    variables_json = frame.get("variables_json")
    if isinstance(variables_json, str):
        namespace.update(json_loads(variables_json))  # identifiers, checked by the host
    preamble = frame.get("preamble")
    if not isinstance(preamble, str):
        return None
    try:
        exec(compile(preamble, PREAMBLE_FILENAME, "exec", dont_inherit=True), namespace)
    except BaseException as exc:
        error = describe_exception(exc)
        error["message"] = ("the preamble raised, so the program did not run: " + error["message"])[
            : 256 * 1024
        ]
        return {"outcome": "raised", "error": error}
    return None


def _kept(result, namespace, room):
    """``result`` with the program's global names that hold JSON data (the run frame's
    keep_variables): names starting with "_", the namespace's own and those whose value is
    not JSON data (modules, functions, objects) are left out. They share the return value's
    cap with it (``room`` is what the value left); past it the result is output_limit."""
    own = NAMESPACE_NAMES | {"__name__", "__builtins__", "__doc__"}
    kept = {}
    for name, value in list(namespace.items()):
        if not isinstance(name, str) or name.startswith("_") or name in own:
            continue
        try:
            json_dumps(value)
        except Exception:  # not JSON data, or an object of the program's that fails to say
            continue
        if json_problem(value) is None:
            kept[name] = value
    problem = json_problem(kept)
    if problem is not None:
        return {
            "outcome": "invalid_output",
            "detail": f"the program's variables cannot be sent: {problem}",
        }
    encoded = json_dumps(kept)
    if len(encoded.encode()) > room:
        detail = (
            f"the program's variables are {len(encoded.encode())} bytes as JSON, over "
            f"the {max(room, 0)} bytes left of the return value's limit"
        )
        return {"outcome": "output_limit", "detail": detail}
    return dict(result, variables_json=encoded)


def _returned(value, cap):
    """The result of a program that returned ``value``."""
    if isinstance(value, _ToolCall):
        value.close()
        return _not_awaited(value._what, value._line)
    if _NOT_AWAITED:
        return _not_awaited(*_NOT_AWAITED[0])
    if isinstance(value, ToolResultHandle):
        value = value.to_json()
    try:
        encoded = json_dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return {
            "outcome": "invalid_output",
            "detail": (
                f"the return value of type {type(value).__name__} is not JSON-serialisable: {exc}"
            )[:4096],
        }
    problem = json_problem(value) if len(encoded) <= cap else None
    if problem is not None:
        return {
            "outcome": "invalid_output",
            "detail": f"the return value of type {type(value).__name__} cannot be sent: {problem}",
        }
    if len(encoded.encode()) > cap:
        return {
            "outcome": "output_limit",
            "detail": (
                f"the return value is {len(encoded.encode())} bytes as JSON, over the "
                f"{cap}-byte limit"
            ),
        }
    return {"outcome": "returned", "value_json": encoded}


def run_command(spec):
    """Command mode: run the command as this process's child, in everything this process is
    in (its namespaces, cgroup, identity, limits, session and process group), with fd 1 and
    2 as its own, and no other descriptor of ours: the channel stays here. Its exit status is
    the result. A command killed by a signal takes this process with it by the same signal,
    so the host reads that ending exactly as it would a program's (a CPU limit's SIGXCPU is a
    timeout, and so on)."""
    import subprocess

    argv = spec.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return {"outcome": "raised", "error": describe_exception(ValueError("no command"))}
    if spec.get("shell") is True:
        argv = [SHELL, "-c", argv[0]]
    try:
        command = subprocess.Popen(argv, close_fds=True)
    except OSError as exc:
        # As a shell says it: 127 for a program not found, 126 for one that cannot run.
        missing = isinstance(exc, FileNotFoundError)
        why = "command not found" if missing else (exc.strerror or str(exc))
        _write_all(2, f"{argv[0]}: {why}\n".encode("utf-8", "replace"))
        return {"outcome": "exited", "exit_status": 127 if missing else 126}
    except (ValueError, TypeError) as exc:
        return {"outcome": "raised", "error": describe_exception(exc)}
    status = command.wait()
    if status < 0:
        _die_of(-status)
        os._exit(128 - status)  # a signal this process cannot die of (none should be left)
    return {"outcome": "exited", "exit_status": status}


def write_inputs(inputs):
    """Write the run's input files into the workspace (this process's working directory,
    fresh, not yet touched by any program): each created anew, never through a link. None,
    or the error of the first that could not be written (the workspace's cap reached)."""
    import binascii

    for item in inputs:
        name = item.get("name") if isinstance(item, dict) else None
        try:
            if not isinstance(name, str) or not _safe_input_name(name):
                raise ValueError(f"{name!r} cannot name an input file")
            data = binascii.a2b_base64(item.get("data") or "")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(name, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except (OSError, ValueError, binascii.Error) as exc:
            if isinstance(exc, OSError):
                exc = OSError(exc.errno, f"writing input file {name!r}: {exc.strerror}")
            return {"outcome": "raised", "error": describe_exception(exc)}
    return None


def _safe_input_name(name):
    return (
        0 < len(name) <= MAX_INPUT_NAME_CHARS
        and name not in (".", "..")
        and not any(c in name for c in "/\\\0")
    )


def _not_awaited(what, line):
    error = describe_exception(NotAwaitedError(_not_awaited_message(what, line)))
    error["line"] = line
    return {"outcome": "raised", "error": error}


# ------------------------------------------------------------------ sending artifacts


def _open_workspace():
    """The workspace as a descriptor, taken before the program can change directory: the
    backend starts the bootstrap in it. None if it cannot be opened."""
    if not hasattr(os, "O_DIRECTORY"):
        return None  # no directory descriptors (Windows): nothing is walked from here
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    info = os.fstat(fd)
    return fd, info.st_dev, info.st_ino


class _ArtifactSender:
    """Walks the requested folder without following any link and sends each regular file in
    chunks. The program ran in this process and may have tampered with anything here: the
    host checks every frame again, so this walk is about honest reporting, not containment."""

    def __init__(self, channel, request):
        import binascii
        import errno
        import stat

        self.channel = channel
        self.binascii, self.errno, self.stat = binascii, errno, stat
        self.max_files = int(request.get("max_files") or 0)
        self.file_bytes = int(request.get("file_bytes") or 0)
        self.total_bytes = int(request.get("total_bytes") or 0)
        self.folder = request.get("folder") or ""
        self.files = self.total = self.entries = 0
        self.stopped = False
        #: The file whose chunks are going out, so a failure can abandon it.
        self.sending = None
        # POSIX flags; where they do not exist the workspace was never opened (see above).
        posix = {
            name: getattr(os, name, 0)
            for name in ("O_DIRECTORY", "O_NOFOLLOW", "O_CLOEXEC", "O_NONBLOCK", "O_NOCTTY")
        }
        self.dir_flags = (
            os.O_RDONLY | posix["O_DIRECTORY"] | posix["O_NOFOLLOW"] | posix["O_CLOEXEC"]
        )
        self.file_flags = (
            os.O_RDONLY
            | posix["O_NOFOLLOW"]
            | posix["O_NONBLOCK"]
            | posix["O_CLOEXEC"]
            | posix["O_NOCTTY"]
        )

    def skip(self, path, reason):
        self.channel.send({"type": "artifact_skipped", "path": path, "reason": reason})

    def send_all(self, workspace):
        if workspace is None:
            self.skip(".", "unreadable")
            return
        fd, dev, ino = workspace
        try:
            now = os.fstat(fd)
        except OSError:
            self.skip(".", "changed")  # the program closed it
            return
        if (now.st_dev, now.st_ino) != (dev, ino) or not self.stat.S_ISDIR(now.st_mode):
            self.skip(".", "changed")
            return
        self.root_dev = dev
        parts = [p for p in self.folder.split("/") if p not in ("", ".")]
        if ".." in parts:
            self.skip(".", "unsafe_name")
            return
        start = fd
        for index, part in enumerate(parts):
            try:
                child = os.open(part, self.dir_flags, dir_fd=start)
            except OSError as exc:
                child = -1
                if exc.errno in (self.errno.ELOOP, self.errno.ENOTDIR):
                    self.skip("/".join(parts[: index + 1]), "symlink")
                elif exc.errno != self.errno.ENOENT:
                    self.skip("/".join(parts[: index + 1]), "unreadable")
            if start != fd:
                os.close(start)
            if child < 0:
                return  # no such folder: nothing to collect, as on the host
            start = child
        try:
            self.walk(start, "/".join(parts), 0)
        finally:
            if start != fd:
                os.close(start)

    def walk(self, dir_fd, prefix, depth):
        try:
            with os.scandir(dir_fd) as listing:
                names = sorted(entry.name for entry in listing)
        except OSError:
            self.skip(prefix or ".", "unreadable")
            return
        for name in names:
            if self.stopped:
                return
            self.entries += 1
            relative = prefix + "/" + name if prefix else name
            if self.entries > MAX_ARTIFACT_ENTRIES:
                self.stopped = True
                self.skip(relative if _safe_name(name) else _shown(prefix, name), "entry_limit")
                return
            if not _safe_name(name):
                self.skip(_shown(prefix, name), "unsafe_name")
                continue
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                self.skip(relative, "vanished")
                continue
            except OSError:
                self.skip(relative, "unreadable")
                continue
            mode = info.st_mode
            if self.stat.S_ISDIR(mode):
                self.enter(dir_fd, name, relative, depth, info)
            elif self.stat.S_ISREG(mode):
                self.take(dir_fd, name, relative, info)
            else:
                self.skip(relative, self.kind(mode))

    def kind(self, mode):
        stat = self.stat
        if stat.S_ISLNK(mode):
            return "symlink"
        if stat.S_ISFIFO(mode):
            return "fifo"
        if stat.S_ISSOCK(mode):
            return "socket"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            return "device"
        return "not_regular"

    def enter(self, dir_fd, name, relative, depth, info):
        if info.st_dev != self.root_dev:
            self.skip(relative, "other_filesystem")
            return
        if depth + 1 > MAX_ARTIFACT_DEPTH or len(relative) > MAX_ARTIFACT_PATH_CHARS - 256:
            # Too deep, or too long a path for a name below it (255 bytes) to be sent.
            self.skip(relative, "too_deep")
            return
        try:
            child = os.open(name, self.dir_flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == self.errno.ENOENT:
                self.skip(relative, "vanished")
            elif exc.errno in (self.errno.ELOOP, self.errno.ENOTDIR):
                self.skip(relative, "changed")
            else:
                self.skip(relative, "unreadable")
            return
        try:
            now = os.fstat(child)
            if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
                self.skip(relative, "changed")
                return
            self.walk(child, relative, depth + 1)
        finally:
            os.close(child)

    def take(self, dir_fd, name, relative, info):
        if info.st_nlink > 1:
            self.skip(relative, "hard_link")
            return
        if info.st_dev != self.root_dev:
            self.skip(relative, "other_filesystem")
            return
        if self.files >= self.max_files:
            self.skip(relative, "too_many")
            return
        if info.st_size > self.file_bytes:
            self.skip(relative, "too_large")
            return
        if self.total + info.st_size > self.total_bytes:
            self.skip(relative, "total_cap")
            return
        try:
            fd = os.open(name, self.file_flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == self.errno.ENOENT:
                self.skip(relative, "vanished")
            elif exc.errno in (self.errno.ELOOP, self.errno.ENOTDIR, self.errno.ENXIO):
                self.skip(relative, "changed")
            else:
                self.skip(relative, "unreadable")
            return
        try:
            now = os.fstat(fd)
            if (
                not self.stat.S_ISREG(now.st_mode)
                or (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino)
                or now.st_nlink != 1
            ):
                self.skip(relative, "changed")
                return
            self.files += 1
            self.sending = relative
            self.send_file(fd, relative)
            self.sending = None
        finally:
            os.close(fd)

    def send_file(self, fd, relative):
        room = min(self.file_bytes, self.total_bytes - self.total)
        offset = 0
        try:
            pending = self.read_chunk(fd)
            while True:
                chunk = pending
                last = len(chunk) < ARTIFACT_CHUNK_BYTES
                if not last:
                    pending = self.read_chunk(fd)
                    last = not pending
                if offset + len(chunk) > room:
                    # It grew after the size check: something is still writing it.
                    self.skip(relative, "changed")
                    return
                data = self.binascii.b2a_base64(chunk, newline=False).decode("ascii")
                self.channel.send(
                    {
                        "type": "artifact",
                        "path": relative,
                        "offset": offset,
                        "data": data,
                        "last": last,
                    }
                )
                offset += len(chunk)
                self.total += len(chunk)
                if last:
                    return
        except (OSError, MemoryError):
            # Abandoned, whether or not chunks went out: the host drops what it received.
            self.skip(relative, "unreadable")

    @staticmethod
    def read_chunk(fd):
        parts = []
        size = 0
        while size < ARTIFACT_CHUNK_BYTES:
            try:
                data = os.read(fd, ARTIFACT_CHUNK_BYTES - size)
            except BlockingIOError:
                break
            if not data:
                break
            parts.append(data)
            size += len(data)
        return b"".join(parts)


def _safe_name(name):
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False  # undecodable bytes (surrogate-escaped)
    return name.isprintable() and "\\" not in name


def _shown(prefix, name):
    """An unsafe name as printable ASCII escapes (cut to a name's length), to list it."""
    text = name.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)[:255]
    return prefix + "/" + shown if prefix else shown


def send_artifacts(channel, request, workspace):
    sender = _ArtifactSender(channel, request)
    try:
        sender.send_all(workspace)
    except Exception:
        # A walk broken by what the program left behind (a patched module, exhausted
        # memory) still ends in a result: abandon the file on its way, say the rest is
        # missing. If the channel itself failed, this fails too and the host sees no result.
        if sender.sending is not None:
            sender.skip(sender.sending, "unreadable")
        sender.skip(".", "unreadable")


PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
SIGKILL = 9


def _contain(spec):
    """Containment the bootstrap applies to itself first, before any program exists: unshare
    namespaces, put itself out of the program's reach, then die with the host. Returns libc
    and the identity only the program's own process takes (see _become_program).

    This is what a pre-exec step would do, done here so the host can spawn with vfork
    instead of copying its own address space for every execution. Any failure exits: the
    host sees a child that never reported, and nothing runs under weaker terms.
    """
    flags, uid, gid, host_pid = spec.split(":")
    libc = _load_libc()
    if int(flags):
        try:
            if hasattr(os, "unshare"):  # 3.12+
                os.unshare(int(flags))
            elif libc.unshare(int(flags)) != 0:
                raise OSError(libc.get_errno(), "unshare")
        except OSError as exc:
            message = f"psych-sandbox bootstrap: unshare failed (errno {exc.errno})"
            raise SystemExit(message) from None
    # This process and the namespace's init it forks are ours, not the program's: undumpable,
    # no process of the program can trace them or read or write their memory, even where it
    # shares their uid (an unprivileged host) and holds capabilities in their user namespace
    # (the check is made against the user namespace they were exec'd in, the host's).
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    if host_pid and os.getppid() != int(host_pid):
        os._exit(1)  # the host died before we could tie ourselves to it
    return libc, ((int(uid), int(gid)) if uid else None)


class _Libc:
    """The C library's prctl and unshare, and the errno they leave, as ctypes' CDLL offers
    them (arguments passed as C ints, an int returned)."""

    def __init__(self, prctl, unshare, get_errno):
        self.prctl = prctl
        self.unshare = unshare
        self.get_errno = get_errno


def _load_libc():
    """prctl and unshare through _ctypes alone: the ctypes package around it (its types, its
    loader classes, struct) costs a cold child about 3 ms, on the path of every execution,
    for these two calls. ctypes itself where _ctypes is not what this expects."""
    try:
        import _ctypes

        class c_int(_ctypes._SimpleCData):  # type: ignore[type-arg]
            _type_ = "i"

        class Function(_ctypes.CFuncPtr):
            # What CDLL(None, use_errno=True) makes of a name.
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = c_int

        class Process:
            # dlopen(NULL): the symbols the process has loaded already, libc's among them.
            _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]

        # A function is named by (name, an object holding the library's handle).
        prctl = Function(("prctl", Process))  # type: ignore[arg-type]
        unshare = Function(("unshare", Process))  # type: ignore[arg-type]
        return _Libc(prctl, unshare, _ctypes.get_errno)
    except Exception:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return _Libc(libc.prctl, libc.unshare, ctypes.get_errno)


def _late_terms(fd):
    """What the host made while this interpreter started (see late_terms.py): the probe's
    targets, and the descriptors that move this process into the execution's cgroup. One
    message on the socket ``fd``, closed once read: no program ever holds it. Without the
    message (the host gave up on this start), nothing runs."""
    sock = _socket.socket(fileno=fd)
    try:
        data, ancillary, _flags, _address = sock.recvmsg(
            LATE_TERMS_BYTES, _socket.CMSG_SPACE(4 * LATE_TERMS_FDS)
        )
    except OSError as exc:
        message = f"psych-sandbox bootstrap: the host's terms did not come ({exc})"
        raise SystemExit(message) from None
    finally:
        sock.close()
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.extend(
                int.from_bytes(payload[i : i + 4], sys.byteorder)
                for i in range(0, len(payload) - len(payload) % 4, 4)
            )
    terms = json_loads(data) if data else None
    if not isinstance(terms, dict) or not isinstance(terms.get("probe"), dict):
        raise SystemExit("psych-sandbox bootstrap: the host's terms did not come")
    return terms["probe"], fds


#: The late terms' bounds (copies of late_terms.py's).
LATE_TERMS_BYTES = 64 * 1024
LATE_TERMS_FDS = 16


def _join_cgroup(fds):
    """Move this process into the execution's cgroup, the first thing it does: still root,
    still single-threaded, before anything forks, so every process of the execution is
    counted there. The host opened the cgroup's files; writing "0" moves the writer. Any
    failure exits: usage the host reads would otherwise miss this process."""
    for fd in fds:
        try:
            os.write(fd, b"0")
        except OSError as exc:
            raise SystemExit(
                f"psych-sandbox bootstrap: joining the cgroup failed ({exc})"
            ) from None
        finally:
            os.close(fd)


def _become_program(libc, identity):
    """Make this process the program's: its identity (on a root host only this process drops
    it, so the init and the outer process stay root, out of its reach), no way back to
    privilege through a set-uid file, and death with its parent."""
    if identity is not None:
        uid, gid = identity
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    # Dumpable again: the program's own /proc entries must be its own, as if it had been
    # exec'd as its uid (changing identity, or the parent's setting, left it undumpable).
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # Only now: changing credentials clears the parent-death signal.
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)


def _pid_namespace_init(libc, init_report):
    """Split into an outer waiter, an init for the new pid namespace, and the program's process.

    The bootstrap unshared a pid namespace, so its children live in it. The first child is its
    init: when it exits the kernel kills everything left in the namespace, including
    descendants that called setsid. Init ignores default-disposition signals, so the program
    runs one level further down, where a CPU-limit signal still kills it. The outer process
    hands the host a pidfd on the init before the program's process exists (_hand_over_init),
    so the host kills the namespace itself at teardown; the init keeps the report socket and
    tells the host how the program's process ended (_reap_as_init).
    """

    def die_with_parent():
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)

    # Init reports the program's exact wait status on this pipe: an exit code alone could
    # not tell "exited with 152" from "killed by SIGXCPU".
    report_read, report_write = os.pipe()
    init = os.fork()
    if init:
        # Never past this point, whatever fails (an unprivileged host's program may change
        # its init's limits, and so make it fail): the outer process and the init only exit,
        # and the init's exit ends the namespace.
        try:
            # The host's SIGTERM to the group is for the program: this process outlives the
            # init, so that the init is never orphaned (an orphan is left for the system to
            # reap). Its children are not kept as zombies: the init is gone from the host's
            # /proc as soon as it has exited, without this process being scheduled to reap it
            # (the host learns the program's end from the init itself, see _reap_as_init).
            import _signal  # type: ignore[import-not-found]  # (the C module: no enum import)

            _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)
            _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
            os.close(report_write)
            if init_report is not None:
                _hand_over_init(init, init_report)
            # Nothing of the execution's is held here any more (its output streams, its
            # channel): they end with the program's tree, not with this process, which may
            # exit after the host has handed the result back.
            _close_all_but(report_read)
            _exit_like(init, report_read)
        finally:
            os._exit(70)
    try:
        os.close(report_read)
        die_with_parent()
        program = os.fork()
        if program:
            _reap_as_init(program, report_write, init_report)
    except BaseException:
        _init_failed(report_write)
    # The program's process: the reports are the init's alone.
    os.close(report_write)
    if init_report is not None:
        os.close(init_report)
    die_with_parent()


def _hand_over_init(pid, report):
    """Send the host the namespace (an open descriptor, so its identity cannot be reused by
    another namespace while the host holds it) and a pidfd on the init, then close ``report``.

    Opened here, by the init's parent, while the init cannot yet have been reaped: the pidfd
    names that process and no other. Without pidfds the host gets the namespace alone."""
    fds: list[int] = []
    try:
        fds.append(os.open("/proc/self/ns/pid_for_children", os.O_RDONLY | os.O_CLOEXEC))
        fds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        pass
    try:
        data = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        ancillary = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, data)] if fds else []
        sock = _socket.socket(fileno=report)
        try:
            sock.sendmsg([str(pid).encode("ascii")], ancillary)
        finally:
            sock.close()
    except OSError:
        pass  # the host is gone or gave up; it sees no report and tears down without it
    for fd in fds:
        os.close(fd)


def _exit_like(pid, report):
    """End as the program's process ended, once the init has: by the status the init
    reported, else (it was killed before it could report) by SIGKILL."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped by the kernel as it exited (SIGCHLD is ignored here)
    reported = b""
    while True:
        chunk = os.read(report, 64)
        if not chunk:
            break
        reported += chunk
    # An init ends without a report only when it is killed: by SIGKILL (its namespace killed
    # by the host, or the kernel out of memory; nothing in the namespace can signal it),
    # or a crash of its own, whose signal is not known here (it was released by the kernel).
    # Its own failures report, see _init_failed.
    status = int(reported) if reported.strip().isdigit() else SIGKILL
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        _die_of(-code)
    os._exit(code)


def _die_of(signum):
    """End this process by ``signum``, as the process it stands for ended (no core file)."""
    import _signal  # (the C module: no enum import)

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        _signal.signal(signum, _signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL and SIGSTOP cannot be handled, nor need to be
    os.kill(os.getpid(), signum)


#: What the init sends the host when the program's process has ended, before its wait status
#: in decimal and the CPU seconds of what it reaped (pid_namespace.EXIT_REPORT).
EXIT_REPORT = b"exit "


def _reap_as_init(program, report, host):
    """As init, reap every orphan until the program's process ends; then report its exact
    wait status and exit, which ends the namespace. The status goes to the host first (on
    ``host``, the report socket): the host then knows the program's end, and the namespace's
    once this process has exited, without waiting for the outer process to be scheduled. And
    up ``report`` to the outer process, which ends by it for wait4 (init cannot die of a
    signal it has no handler for, so it could not mirror one itself). With the CPU time of
    what it reaped: the outer process's wait4 no longer counts it (it keeps no zombies)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            _init_failed(report)
        if pid == program:
            if host is not None:
                usage = resource.getrusage(resource.RUSAGE_CHILDREN)
                spent = usage.ru_utime + usage.ru_stime
                try:
                    os.write(host, EXIT_REPORT + b"%d %.6f" % (status, spent))
                except OSError:
                    pass  # the host is gone or gave up on the report
            os.write(report, str(status).encode())
            os._exit(0)


def _init_failed(report):
    """The init's own failure, reported as its exit status would have been."""
    try:
        os.write(report, str(70 << 8).encode())
    finally:
        os._exit(70)


def _close_all_but(keep):
    """Close every descriptor of this process but ``keep`` (where /proc lists them)."""
    try:
        entries = os.listdir("/proc/self/fd")
    except OSError:
        return
    for entry in entries:
        fd = int(entry)
        if fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own, closed already


def _write_all(fd, data):
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # the program closed or broke the stream: the host waits for its end instead


#: What a program that awaits needs imported (asyncio and what it imports, heaviest first in
#: the order asyncio reaches them), in steps of a few milliseconds each.
ASYNC_MODULES = (
    "enum",
    "functools",
    "collections",
    "re",
    "traceback",
    "inspect",
    "typing",
    "logging",
    "concurrent.futures",
    "socket",
    "selectors",
    "ssl",
    "subprocess",
    "asyncio",
)
#: Built (never run) by an idle child ahead of its program, see _prepare_while_idle.
WARM_UP_SOURCE = "warmed_up: int = 1\nprint(warmed_up)\nwarmed_up\n"
#: A host that has a program for this child sends it within a few milliseconds of the hello;
#: a child still waiting after this long is a warm one, prepared ahead of its program.
IDLE_AFTER_SECONDS = 0.05


def _prepare_while_idle(sock):
    """Import what an awaiting program needs while a warm child waits for its program: about
    30 ms of ``import asyncio`` that would otherwise be on the path the program waits on.

    Only once the child is idle (no program IDLE_AFTER_SECONDS after its hello: a cold child
    is answered at once and prepares nothing, so a program that does not await never pays),
    and one module at a time, stopping as soon as the program arrives, so a program that
    arrives mid-way waits for one step at most. A program sees these modules imported, as
    after any import of its own.
    """
    if _arrived(sock, IDLE_AFTER_SECONDS):
        return
    # The compiler's path walked once, on a text of ours that is built and never run: the
    # program's own build then skips what a first call costs (about 0.2 ms, measured).
    try:
        build_program(WARM_UP_SOURCE)
    except Exception:
        pass
    if _arrived(sock, 0.0):
        return
    for name in ASYNC_MODULES:
        try:
            __import__(name)
        except Exception:
            return  # an interpreter without it (no ssl): the program meets that itself
        if _arrived(sock, 0.0):
            return


def _arrived(sock, wait):
    """Whether the host has sent something (or closed the channel) within ``wait`` seconds."""
    sock.settimeout(wait)
    try:
        sock.recv(1, _socket.MSG_PEEK)
        return True  # a frame, or b"" at the end: either way, stop preparing
    except (BlockingIOError, TimeoutError):
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(None)


def _as_site_would():
    """What the site module does at start-up, for an interpreter the host started without it
    (``-S``), less the code nobody asked for: the directories it adds to the path (the
    site-packages, a virtual environment's and its prefixes, the directories ``.pth`` files
    name), the builtins it installs (exit, quit, help, copyright, credits, license). Left out:
    the ``import`` lines of ``.pth`` files and sitecustomize, code a start would otherwise run
    in every child (a hook, a certificate injector), costing milliseconds before any program;
    and the user's site directory, which isolated mode never adds, is not looked up (site
    asks the password database for it, about a millisecond). An interpreter whose site module
    is not as expected runs it whole."""
    if not sys.flags.no_site:
        return  # started with site (a backend that starts the bootstrap its own way)
    kept = {
        name: getattr(site, name)
        for name in ("addpackage", "addusersitepackages", "execsitecustomize", "execusercustomize")
    }
    try:
        site.addpackage = _pth_paths_only
        site.execsitecustomize = site.execusercustomize = _nothing
        if sys.flags.no_user_site:
            site.ENABLE_USER_SITE = False
            site.addusersitepackages = _no_user_site
        site.main()
    except Exception:
        for name, value in kept.items():
            setattr(site, name, value)
        site.main()
    finally:
        for name, value in kept.items():
            setattr(site, name, value)


def _nothing():
    pass


def _no_user_site(known_paths):
    return known_paths


def _pth_paths_only(sitedir, name, known_paths):
    """site.addpackage without its code lines: the directories a ``.pth`` file names that
    exist are added to the path, the lines that start with ``import`` are not run."""
    reset = known_paths is None
    if reset:
        known_paths = site._init_pathinfo()  # type: ignore[attr-defined]
    try:
        with open(os.path.join(sitedir, name), encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None if reset else known_paths
    for line in lines:
        if not line.strip() or line.startswith(("#", "import ", "import\t")):
            continue
        directory, case = site.makepath(sitedir, line.rstrip())
        if case not in known_paths and os.path.exists(directory):
            sys.path.append(directory)
            known_paths.add(case)
    return None if reset else known_paths


def main(argv):
    options = {}
    for item in argv:
        key, _, value = item.partition("=")
        options[key.lstrip("-")] = value
    if options.get("late"):
        probe_config, join_fds = _late_terms(int(options["late"]))
        _join_cgroup(join_fds)
    else:
        probe_config = json_loads(options.get("probe") or "{}")
    init_report = options.get("init-report")
    if options.get("contain"):
        libc, identity = _contain(options["contain"])
        if options.get("pid-namespace") == "1":
            _pid_namespace_init(libc, int(init_report) if init_report else None)
        elif init_report:
            os.close(int(init_report))
        _become_program(libc, identity)
    elif options.get("pid-namespace") == "1":
        # A backend that made the pid namespace itself (no containment asked of us): the
        # namespace still needs an init that is not the program.
        libc = _load_libc()
        _pid_namespace_init(libc, int(init_report) if init_report else None)
        _become_program(libc, None)
    channel = Channel(options["channel"])
    channel.send({"type": "hello", "protocol": PROTOCOL_VERSION, "report": probe(probe_config)})
    # What the program needs and the probe does not, done while the host grades the hello
    # rather than before it: the site directories on the path, then (unless the program is
    # there already) the compiler's tree types.
    _as_site_would()
    if not _arrived(channel.sock, 0.0):
        _load_ast()
    _prepare_while_idle(channel.sock)
    frame = channel.receive()
    if frame.get("type") != "run":
        # Abort (or anything that is not a run): nothing is compiled, nothing executes.
        os._exit(0)
    request = frame.get("artifacts")
    # Taken before the program runs: it may change directory or rename the workspace away.
    workspace = _open_workspace() if request else None
    # Written before the limits apply, as the host's own files would be (it checked them).
    result = write_inputs(frame.get("inputs") or [])
    apply_limits(frame.get("limits") or {})
    end_marker = frame.get("end_marker")
    if result is None:
        command = frame.get("command")
        result = run_command(command) if command else run_program(channel, frame)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if isinstance(end_marker, str):
        # Everything the program wrote is in the pipes now: the marker tells the host both
        # streams are complete, so it need not wait for their end (the container's).
        marker = end_marker.encode("ascii", "replace")
        for fd in (1, 2):
            _write_all(fd, marker)
    frame = {
        "type": "result",
        "outcome": result["outcome"],
        "value_json": result.get("value_json"),
        "error": result.get("error"),
        "detail": result.get("detail"),
    }
    if result["outcome"] == "exited":
        frame["exit_status"] = result["exit_status"]
    if "variables_json" in result:
        frame["variables_json"] = result["variables_json"]
    with channel.lock:
        channel.end_loop_reading()  # a reply may still come while these frames go
        if request:
            send_artifacts(channel, request, workspace)
        channel.send(frame)
        try:
            # Nothing more from anyone: the socket is shut for writing whoever else holds
            # it (a process the program forked), so the host need not wait for every
            # holder's exit to know that no frame can follow the result.
            channel.sock.shutdown(_socket.SHUT_WR)
        except OSError:
            pass
    # Calls still in flight are the host's to cancel now: nothing here waits for them.
    # Threads the program left running must not hold the process open after its result.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
