"""The service kit: what a distribution that serves this host's profiles to others (the
remote backend's ``psych-sandbox serve``) imports from the core, beside the backend kit.

A service is a front end, like the command line: it loads the deployment's configuration,
validated as ``run`` validates it, and creates the backend a profile names through the same
plugin registry. It follows the backend kit's compatibility policy (see backend_kit.py).
"""

from __future__ import annotations

from ._policy.config import create_backend, resolve_config
from ._policy.profiles import DeploymentConfig, ProfileConfig
from ._policy.registry import BackendRegistry
from ._policy.settings_errors import describe_errors
from ._policy.trials import availability

__all__ = [
    "BackendRegistry",
    "DeploymentConfig",
    "ProfileConfig",
    "availability",
    "create_backend",
    "describe_errors",
    "resolve_config",
]
