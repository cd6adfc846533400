"""The jaxpr-cc command line."""
