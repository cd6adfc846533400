"""Errors the command line turns into one-line messages and exit codes."""


class CliError(Exception):
    """Bad input or usage: printed as one line, exit code 2 (1 for failed checks)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code
