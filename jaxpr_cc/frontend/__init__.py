"""frontend stage of the jaxpr-cc pipeline."""
