"""Containment the bootstrap applies to itself before any program exists (namespaces
unshared, out of the program's reach, death with the host), the execution's cgroup joined,
and the program's own process made (its identity, no new privileges)."""

import os

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
