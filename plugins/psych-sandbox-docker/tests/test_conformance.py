"""The docker backend passes the shared behaviour suite under runc, with the tests of what it
declares: a filesystem boundary, a workspace the host cannot reach, a uid leased per container
on a root host, and size-capped memory-backed filesystems (see docker_conformance.py)."""

from __future__ import annotations

from docker_conformance import DockerConformance


class TestDockerConformance(DockerConformance):
    pass
