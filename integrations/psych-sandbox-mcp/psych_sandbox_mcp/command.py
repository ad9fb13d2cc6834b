"""``psych-sandbox mcp``: the core's command line parses the arguments and hands them here
(the command is this distribution's; the core only names it)."""

from __future__ import annotations

import signal
import sys

import anyio
from psych_sandbox_core.integration_kit import ConfigSource

from .server import Transport, serve

#: Signals that stop the server, as they cancel ``psych-sandbox run``.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main(config: ConfigSource, transport: Transport, *, host: str, port: int) -> int:
    """Serve until the client goes away (stdio) or a signal stops the server; 0 then. A
    configuration error is raised, for the command line to say as it says every other."""

    def announce(url: str) -> None:
        print(f"psych-sandbox mcp: serving at {url}", file=sys.stderr, flush=True)

    async def run() -> None:
        # A signal ends the server through cancellation, so every execution, upstream
        # process and temporary folder is torn down before the command exits.
        failure: Exception | None = None
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async with anyio.create_task_group() as group:

                async def stop() -> None:
                    async for _ in signals:
                        group.cancel_scope.cancel()

                group.start_soon(stop)
                try:
                    await serve(config, transport, host=host, port=port, announce=announce)
                except Exception as exc:
                    # Raised again below, outside the task group, which would otherwise
                    # wrap it in an exception group (a configuration error, a port taken).
                    failure = exc
                finally:
                    group.cancel_scope.cancel()
        if failure is not None:
            raise failure

    anyio.run(run)
    return 0
