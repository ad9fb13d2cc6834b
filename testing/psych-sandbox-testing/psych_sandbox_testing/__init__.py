"""The test kit of psych-sandbox, for the core's tests and every backend's: host-side probes
(:mod:`.host`, :mod:`.cgroups_here`), running a host as an unprivileged user
(:mod:`.as_user`), the behaviour suite every backend must pass (:mod:`.conformance`) and a
test double of the launch contract whose child is a coroutine (:mod:`.fake_backend`); what one
host process has on the host (:mod:`.census`), hosts killed at points of an execution
(:mod:`.faults`), the protocol's fuzzing harnesses (:mod:`.protocol_fuzz`, the ``fuzz``
extra) and the pytest plugin every session shares (:mod:`.plugin`).

What a backend's tests need of the core's insides, each in a module of its own: the command
run in this process (:mod:`.cli_run`), backend selection, its trials and registry
(:mod:`.selection`), identity leases (:mod:`.leases`), the points an execution reached
(:mod:`.phases`), the compiled bootstrap's run-directory files (:mod:`.bootstrap_files`),
the host's side of a frame channel (:mod:`.host_frames`) and the protocol's ceilings
(:mod:`.ceilings`). A backend's tests import the kit, this test kit and the public API only.

Released in lockstep with psych-sandbox-core, whose internals it drives; the core never
imports it.
"""
