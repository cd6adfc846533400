"""passes stage of the jaxpr-cc pipeline."""
