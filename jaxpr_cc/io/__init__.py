"""The saved-program format: ``save``/``load`` Programs to and from files.

See docs/format.md for the file layout, every field, the versioning rules and the
compatibility promise.
"""
from .api import dumps, is_saved_program, load, loads, save
from .errors import LoadError, SaveError
from .format import FORMAT_VERSION

__all__ = ["FORMAT_VERSION", "LoadError", "SaveError", "dumps", "is_saved_program", "load",
           "loads", "save"]
