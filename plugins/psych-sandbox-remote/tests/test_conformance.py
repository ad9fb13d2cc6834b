"""The remote backend, pointed at a local ``psych-sandbox serve`` of the bwrap backend, passes
the shared behaviour suite: the same program, the same result and the same grades."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from psych_sandbox_core.kit.posix import (
    DEFAULT_COUNT,
    DEFAULT_FIRST_UID,
)
from psych_sandbox_testing.conformance import BackendConformance
from remote_support import TOKEN_ENV, new_token, requires_bwrap, serving


@requires_bwrap
class TestRemoteConformance(BackendConformance):
    backend = "remote"
    options: ClassVar[dict[str, Any]] = {}
    level = "isolated"
    # Commands travel in the run frame over the relayed channel, as programs do.
    runs_commands = True
    enforced = frozenset({"filesystem", "network", "process_tree", "identity"})
    workspace_path = "/workspace"
    # The workspace is the service's (a tmpfs inside its sandbox), not below this host's
    # temporary directory.
    workspace_on_host = False
    # Its identities are the service's: leased there, from the service's own range.
    identity_options = False

    def identity_uids(self) -> range | None:
        # The service's bwrap backend leases from its default range on this same host.
        return range(DEFAULT_FIRST_UID, DEFAULT_FIRST_UID + DEFAULT_COUNT)

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _service(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
        token = new_token()
        previous = os.environ.get(TOKEN_ENV)
        # In this process's environment, so the CLI runs the suite starts inherit it too.
        os.environ[TOKEN_ENV] = token
        try:
            with serving(tmp_path_factory.mktemp("conformance"), {"suite": token}) as served:
                cls.options = {"url": served.url, "token_env": TOKEN_ENV}
                yield
        finally:
            if previous is None:
                os.environ.pop(TOKEN_ENV, None)
            else:
                os.environ[TOKEN_ENV] = previous

    @pytest.mark.anyio
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    async def test_output_streams_across_the_wire_while_the_program_runs(
        self, anyio_backend: str
    ) -> None:
        import anyio
        from psych_sandbox_core import FunctionBindings, OutputChunk

        streamed: list[bytes] = []
        first_line = anyio.Event()

        async def on_output(chunk: OutputChunk) -> None:
            streamed.append(chunk.data)
            if b"".join(streamed).startswith(b"one\n"):
                first_line.set()

        async def seen() -> str:
            # Answered only once the line printed before the call came across: output
            # relayed only at the end would leave the program waiting here until its wall
            # clock ran out.
            await first_line.wait()
            return "seen"

        async with self.sandbox() as sandbox:
            result = await sandbox.run(
                "print('one')\nprint(await seen())",
                profile=self.profile,
                bindings=FunctionBindings({"seen": seen}),
                on_output=on_output,
            )
        assert result.ok, result.error
        assert b"".join(streamed) == b"one\nseen\n" == result.stdout.encode()
