"""The test zoo: programs beyond the corpus that exercise custom rules and closures."""
