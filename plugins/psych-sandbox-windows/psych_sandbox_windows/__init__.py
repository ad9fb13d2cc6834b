"""psych-sandbox-windows: the process level on Windows, with a Job Object per execution.

Installing this distribution is all it takes: the ``psych_sandbox`` entry point registers the
``windows`` backend. On any other platform it stays installed and reports itself unavailable
("requires Windows") in ``psych-sandbox doctor``.
"""

from .backend import WindowsBackend, WindowsOptions
from .jobobject import JobLimits, JobObject, job_limits

__all__ = ["JobLimits", "JobObject", "WindowsBackend", "WindowsOptions", "job_limits"]
__version__ = "0.2.0"
