"""The entry point: the command line's options, then one start in order (the late terms and
containment, the channel and the hello, the run or an abort, inputs and limits, the program,
its output's end, artifacts and the result frame)."""

# Uses names the other modules define: they run as one namespace (loader.py).
# ruff: noqa: F821

import _socket
import os
import sys

PROTOCOL_VERSION = 1


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
    _end_output(end_marker)
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
