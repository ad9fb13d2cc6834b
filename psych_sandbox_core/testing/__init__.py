"""Test-time helpers for backends: host-side probes (:mod:`.host`), running a host as an
unprivileged user (:mod:`.as_user`) and the behaviour suite every backend must pass
(:mod:`.conformance`, which needs pytest: install ``psych-sandbox-core[test]``).

Nothing here is imported by the core at run time.
"""
