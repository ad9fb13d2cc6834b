"""psych-sandbox-docker: the isolated level in a fresh container per execution.

Installing this distribution registers two backends through the ``psych_sandbox`` entry
points: ``docker`` (runc by default) and ``gvisor`` (the same with gVisor's runsc). Images are
never pulled; ``python -m psych_sandbox_docker.image`` builds a suitable local one.
"""

from .backend import DockerBackend, DockerOptions, GvisorBackend, GvisorOptions
from .engine import reap_orphans

__all__ = ["DockerBackend", "DockerOptions", "GvisorBackend", "GvisorOptions", "reap_orphans"]
__version__ = "0.2.0"
