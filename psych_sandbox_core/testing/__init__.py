"""Test-time helpers for backends: host-side probes (:mod:`.host`), running a host as an
unprivileged user (:mod:`.as_user`), the behaviour suite every backend must pass
(:mod:`.conformance`, which needs pytest: install ``psych-sandbox-core[test]``) and a test
double of the launch contract whose child is a coroutine (:mod:`.fake_backend`); what one host
process has on the host (:mod:`.census`), hosts killed at points of an execution
(:mod:`.faults`) and the protocol's fuzzing harnesses (:mod:`.protocol_fuzz`, which needs
hypothesis).

Nothing here is imported by the core at run time.
"""
