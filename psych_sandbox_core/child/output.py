"""The program's output streams at the end: flushed, then the end marker that tells the host
both are complete; writes that outlive a stream the program broke."""

import os
import sys


def _end_output(end_marker):
    """The program's streams flushed, then ``end_marker`` (if the host sent one) on both."""
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


def _write_all(fd, data):
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # the program closed or broke the stream: the host waits for its end instead
