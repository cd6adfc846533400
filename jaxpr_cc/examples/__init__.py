"""Bundled example programs used by ``jaxpr-cc demo`` and the documentation."""
