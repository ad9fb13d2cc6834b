"""The child side: the bootstrap the sandboxed interpreter runs (standard library only) and how
it reaches that interpreter (``loader``)."""
