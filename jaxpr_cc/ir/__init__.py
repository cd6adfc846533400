"""ir stage of the jaxpr-cc pipeline."""
