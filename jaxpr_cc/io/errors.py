"""The saved-program format's errors; defined in :mod:`jaxpr_cc.storage.errors`, which
every file writer and reader shares, and re-exported here under their old home."""
from ..storage.errors import FormatError, LoadError, SaveError, one_line

__all__ = ["FormatError", "LoadError", "SaveError", "one_line"]
