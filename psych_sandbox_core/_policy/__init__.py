"""Deployment configuration, profiles, plugin loading, backend selection and the four
narrowings. Internal."""
