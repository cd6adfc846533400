"""Pattern rewrites on the graph IR: replace a traced pattern by a traced replacement.

    from jaxpr_cc.rewrite import Pattern, Rewrite, apply_rewrites, floating

    pattern = Pattern.from_function(lambda x: jnp.log(1 + jnp.exp(x)),
                                    jax.ShapeDtypeStruct((), jnp.float32), constraint=floating)
    rewrite = Rewrite(pattern, lambda match: my_replacement)   # my_replacement(*holes)
    apply_rewrites(program, [rewrite])

See ``pattern`` (what matches) and ``matcher`` (how matches are found and
replaced).  The passes ``stable-log1pexp`` and ``straight-through`` are built on it.
"""
from .matcher import Match, Rewrite, RewriteError, apply_rewrites, find_matches, splice
from .pattern import COMMUTATIVE, SHAPE_PARAMS, Pattern, PatternError, all_of, floating, same_shape

__all__ = ["Match", "Pattern", "PatternError", "Rewrite", "RewriteError", "apply_rewrites",
           "find_matches", "splice", "floating", "same_shape", "all_of", "COMMUTATIVE",
           "SHAPE_PARAMS"]
