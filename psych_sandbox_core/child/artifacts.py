"""Sending artifacts: the requested folder walked from the workspace's descriptor without
following a link, each regular file sent in chunks, and what cannot be sent named with why."""

import os

#: Artifacts travel in chunks of exactly this many bytes (the last may be shorter); the walk
#: examines at most this many entries, this deep. Copies of protocol/limits.py.
ARTIFACT_CHUNK_BYTES = 1024 * 1024
MAX_ARTIFACT_ENTRIES = 10_000
MAX_ARTIFACT_DEPTH = 32
MAX_ARTIFACT_PATH_CHARS = 4096


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
