"""Command mode: a command run as this process's child; its exit status is the result, and its
death by a signal this process's own."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import os

#: The shell of a command run in shell form (command mode), as ``SHELL -c COMMAND``.
SHELL = "/bin/sh"


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
