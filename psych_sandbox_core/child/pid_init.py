"""The pid namespace's init: an outer process that ends as the program's did, an init that
reaps every orphan and reports the program's exact end, and the program's process below it."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import _socket
import os
import sys


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
