"""The public façade's implementation (``Sandbox``, ``SyncSandbox``, provider result shapes);
its names are the package's own. Internal."""
