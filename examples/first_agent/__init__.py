"""A first agent of one's own: a notes service. See ``examples/first_agent/README.md``."""
