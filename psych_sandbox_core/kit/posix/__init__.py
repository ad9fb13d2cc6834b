"""The local toolbox of a backend on a POSIX host: the process tree, the pid namespace, cgroups,
a uid of the execution's own and its sweep, and owned directories."""
