"""A Program reaches its run frame unchanged: every field it carries is the frame's own."""

from __future__ import annotations

import base64
import dataclasses

import pytest

from psych_sandbox_core._engine.program import Program, input_files, python_program
from psych_sandbox_core.errors import InvalidRequestError
from psych_sandbox_core.protocol.frames import ChildLimits, CommandSpec, InputFile

LIMITS = ChildLimits(
    cpu_seconds=1,
    memory_bytes=None,
    file_size_bytes=None,
    processes=None,
    return_value_bytes=1000,
    argument_bytes=1000,
)


def test_every_field_of_a_program_is_carried_by_its_run_frame() -> None:
    # Every field set away from its default: one the run frame forgot would show here.
    program = Program(
        source="x = 1",
        command=CommandSpec(argv=["true"], shell=False),
        inputs=(InputFile(name="a", data=base64.b64encode(b"data").decode()),),
        preamble="y = 2",
        variables_json='{"z": 3}',
        keep_variables=True,
    )
    for field in dataclasses.fields(Program):
        assert getattr(program, field.name) != field.default, field.name
    frame = program.run_frame(
        tools=[], catalogue=None, limits=LIMITS, artifacts=None, end_marker=None
    )
    for field in dataclasses.fields(Program):
        carried = getattr(frame, field.name)
        given = getattr(program, field.name)
        assert (tuple(carried) if field.name == "inputs" else carried) == given, field.name


def test_a_program_without_inputs_sends_none() -> None:
    frame = Program(source="1").run_frame(
        tools=[], catalogue=None, limits=LIMITS, artifacts=None, end_marker=None
    )
    assert frame.inputs is None and frame.command is None and frame.preamble is None


def test_inputs_are_held_to_each_executions_limits_after_one_reading() -> None:
    program = python_program("1", inputs={"a": b"123", "b": b"4567"})
    assert [len(base64.b64decode(given.data)) for given in program.inputs] == [3, 4]
    program.check_inputs(file_size_bytes=None, workspace_bytes=None)
    program.check_inputs(file_size_bytes=4, workspace_bytes=7)
    with pytest.raises(InvalidRequestError, match="'b' is 4 bytes, over the file-size limit"):
        program.check_inputs(file_size_bytes=3, workspace_bytes=None)
    with pytest.raises(InvalidRequestError, match=r"'b' does not fit: .* at most 6 bytes"):
        program.check_inputs(file_size_bytes=None, workspace_bytes=6)


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 100])
def test_an_inputs_size_is_counted_as_its_bytes(size: int) -> None:
    program = Program(inputs=input_files({"f": b"x" * size}))
    program.check_inputs(file_size_bytes=size, workspace_bytes=size)
    if size:
        with pytest.raises(InvalidRequestError):
            program.check_inputs(file_size_bytes=size - 1, workspace_bytes=None)
        with pytest.raises(InvalidRequestError):
            program.check_inputs(file_size_bytes=None, workspace_bytes=size - 1)
