"""Commands the core parses and hands to another distribution: without it, the command names
the install line and exits as for a usage error. The distribution is made absent the way
the import system itself knows (``None`` in ``sys.modules`` halts its import)."""

from __future__ import annotations

import sys

import pytest

from psych_sandbox_core.cli import main


@pytest.mark.parametrize(
    ("argv", "package", "install"),
    [
        (["mcp"], "psych_sandbox_mcp", "pip install psych-sandbox-mcp"),
        (
            ["serve", "--profile", "p", "--listen", "127.0.0.1:0"],
            "psych_sandbox_remote",
            "pip install psych-sandbox-remote",
        ),
    ],
    ids=["mcp", "serve"],
)
def test_a_command_whose_distribution_is_absent_names_its_install_line(
    argv: list[str],
    package: str,
    install: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(f"install it with: {install}"), err
    assert err.startswith(f"psych-sandbox: {argv[0]} needs "), err
