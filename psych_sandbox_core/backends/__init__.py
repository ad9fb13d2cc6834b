"""Backends shipped inside the core distribution (registered through the same hook)."""
