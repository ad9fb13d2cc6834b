"""The run's resource limits applied to this process: on each side the stricter of requested
and inherited, core dumps off first."""

# At load, before the bootstrap forks (see _pid_namespace_init), though only the program's
# process uses it (the probe reports the limits, then they are applied): an extension
# module loaded after a fork costs that process about three times as much (1.1 ms against
# 0.4, measured), the loader's pages copied on write.
try:
    import resource
except ImportError:  # not POSIX (Windows): no limits to report or apply this way
    resource = None  # type: ignore[assignment]


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
