"""The child side: the bootstrap the sandboxed interpreter runs (standard library only), as
modules of one idea each, and ``loader``, which assembles them into the one source that
interpreter runs and passes it there."""
