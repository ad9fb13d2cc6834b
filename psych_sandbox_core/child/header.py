"""The child side of psych-sandbox. Standard library only, CPython 3.10+: this source runs on
interpreters we do not choose (a container's, a remote host's), passed with ``-c``, so it
never needs a file of ours to be readable from inside the sandbox.

The loader assembles it from the modules of this folder, in the order its PARTS name, into
one source run in one namespace: each module uses what the others define and imports none
of them (tests/child/test_assembly.py holds them to it).

Imports are kept to C modules every run needs (_json, _socket, _thread, resource; _ast once
the hello is sent, see _load_ast); the Python wrappers around them (ast, json, socket,
threading) would import re, enum and collections, which roughly doubles an interpreter's
start-up. asyncio and traceback load only when used."""
