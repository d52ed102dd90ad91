"""Agents built on the framework as a user builds them: each a package with a pipeline factory."""
