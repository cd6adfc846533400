"""storage stage of the jaxpr-cc pipeline: writing files and encoding values, below the IR.

The pieces every file jaxpr-cc writes shares, whatever the file holds: the one file
writer (``atomic``), the errors of reading and writing files (``errors``), ``.npy``
array entries (``npy``), dtype names and exact scalar forms (``dtypes``), and pytree
structures as JSON with :class:`~jaxpr_cc.storage.pytrees.SavedNode` for custom nodes
read back from a file (``pytrees``).  None of them knows the IR, so the IR (a loaded
program's calling convention), the backends (the executable archive, emitted Python)
and the saved-program format (``io``) all build on them.
"""
