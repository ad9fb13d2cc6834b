"""The service kit: what a distribution that serves this host's profiles to others (the
remote backend's ``psych-sandbox serve``) imports from the core, beside the backend kit.

A service is a front end, like the command line: it loads the deployment's configuration,
validated as ``run`` validates it, and creates the backend a profile names through the same
plugin registry. It follows the backend kit's compatibility policy (see backend_kit.py).
"""

from __future__ import annotations

from .config import create_backend, describe_errors, resolve_config
from .profiles import DeploymentConfig, ProfileConfig
from .registry import BackendRegistry
from .trials import availability

__all__ = [
    "BackendRegistry",
    "DeploymentConfig",
    "ProfileConfig",
    "availability",
    "create_backend",
    "describe_errors",
    "resolve_config",
]
