"""Errors of closure conversion: each is one line naming the rule and what to do."""


class ClosureConversionError(ValueError):
    """A custom rule could not be made first-order."""


class ClosedOverError(ClosureConversionError):
    """A value a custom rule closes over is being differentiated and the policy is
    ``closed_over='error'`` (or no other policy applies)."""

