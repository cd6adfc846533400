"""backends stage of the jaxpr-cc pipeline."""
