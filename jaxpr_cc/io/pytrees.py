"""Pytree structures in saved programs; defined in :mod:`jaxpr_cc.storage.pytrees`
(the IR and the backends use them too) and re-exported here under their old home,
``jaxpr_cc.io.pytrees.SavedNode`` (docs/format.md)."""
from ..storage.pytrees import (LEAF, LiveIndex, SavedNode, decode_treedef, encode_treedef,
                               same_saved_structure, saved_node_difference)

__all__ = ["LEAF", "LiveIndex", "SavedNode", "decode_treedef", "encode_treedef",
           "same_saved_structure", "saved_node_difference"]
