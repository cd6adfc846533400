"""Small programs that together put a broad set of primitives and parameter types in a
jaxpr: every lax family (elementwise, special functions, linear algebra, FFT, sorting,
windows, gathers/scatters, control flow), PRNG keys made inside the program with
every registered implementation, device_put with each copy semantics, and
custom_linear_solve through jax.scipy.sparse.linalg.cg / gmres.

``PROGRAMS`` maps a name to ``(function, example_args)``.  Used by
tests/test_param_types.py and by the loader fuzz seeds.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
from jax import lax

F = np.linspace(-1.5, 2.0, 6, dtype=np.float32)
M = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]], np.float32)
I32 = np.array([3, -7, 12, 0, 5, 9], np.int32)
U32 = np.array([1, 7, 255, 4096], np.uint32)


def elementwise(x):
    y = lax.cbrt(x) + lax.exp2(x) + lax.expm1(x) + lax.log1p(jnp.abs(x)) + lax.logistic(x)
    y = y + lax.rsqrt(jnp.abs(x) + 1) + lax.tan(x * 0.3) + lax.atan2(x, x + 3)
    y = y + lax.nextafter(x, x + 1) + lax.rem(x, 0.7) + lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)
    y = y + lax.clamp(-1.0, x, 1.0) + lax.pow(jnp.abs(x) + 1, x) + lax.integer_pow(x, 3)
    y = y + lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10)
    y = y + lax.is_finite(x).astype(jnp.float32) + lax.sign(x) + lax.square(x)
    return y + lax.exp(x, accuracy=lax.Tolerance(atol=1e-6, rtol=1e-6, ulps=2))


def special(x):
    a = jnp.abs(x) + 0.5
    return (lax.lgamma(a) + lax.digamma(a) + lax.igamma(a, a) + lax.igammac(a, a)
            + lax.bessel_i0e(x) + lax.bessel_i1e(x) + lax.erf_inv(x * 0.3) + lax.erf(x)
            + lax.erfc(x) + lax.polygamma(jnp.ones_like(a), a) + lax.zeta(a + 1, a)
            + jax.scipy.special.betainc(a, a, jnp.full_like(a, 0.4)))


def integers(i, u):
    j = lax.population_count(i) + lax.clz(i) + lax.shift_left(i, 2) + lax.shift_right_arithmetic(i, 1)
    j = j + lax.shift_right_logical(i, 1) + (i & 5) + (i | 3) + (i ^ 9) + ~i + lax.div(i, 4)
    v = lax.bitcast_convert_type(u, jnp.float32)
    return j, v, lax.convert_element_type(i, jnp.int8), lax.convert_element_type(i, jnp.uint16)


def linalg(a):
    spd = a @ a.T + 3 * jnp.eye(3)
    lu, piv, perm = lax.linalg.lu(a)
    q, r = jnp.linalg.qr(a)
    w, v = jnp.linalg.eigh(spd)
    s = jnp.linalg.svd(a, compute_uv=False)
    chol = jnp.linalg.cholesky(spd)
    tri = lax.linalg.triangular_solve(chol, a, left_side=True, lower=True)
    dl = jnp.array([0.0, 1.0, 1.0]); d = jnp.array([4.0, 4.0, 4.0]); du = jnp.array([1.0, 1.0, 0.0])
    ts = lax.linalg.tridiagonal_solve(dl, d, du, a)
    hh = lax.linalg.householder_product(a, jnp.array([1.2, 0.5], jnp.float32))
    return (jnp.sum(lu) + jnp.sum(piv) + jnp.sum(perm) + jnp.sum(q @ r) + jnp.sum(w) + jnp.sum(v ** 2)
            + jnp.sum(s) + jnp.sum(tri) + jnp.sum(ts) + jnp.sum(jnp.abs(hh)))


def fft_sort(x):
    c = jnp.fft.fft(x.astype(jnp.complex64))
    r = jnp.fft.irfft(jnp.fft.rfft(x), n=6)
    srt = jnp.sort(x)
    order = jnp.argsort(-x)
    top, idx = lax.top_k(x, 3)
    approx, _ = lax.approx_max_k(x, 2)
    return (jnp.real(c), r, srt, order, top, idx, approx, jnp.argmax(x), jnp.argmin(x),
            lax.cumsum(x), lax.cumprod(x, reverse=True), lax.cummax(x), lax.cummin(x),
            lax.cumlogsumexp(x))


def windows(x):
    img = x.reshape(1, 1, 2, 3)
    pooled = lax.reduce_window(img, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 1, 1), "VALID")
    summed = lax.reduce_window(img, 0.0, lax.add, (1, 1, 1, 2), (1, 1, 1, 1), "SAME")
    kernel = jnp.ones((2, 1, 1, 2), jnp.float32)
    conv = lax.conv_general_dilated(img, kernel, (1, 1), "SAME", rhs_dilation=(1, 1),
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                    precision=lax.Precision.HIGHEST)
    grad_pool = jax.grad(lambda z: jnp.sum(lax.reduce_window(z, -jnp.inf, lax.max, (1, 1, 2, 2),
                                                            (1, 1, 1, 1), "VALID")))(img)
    return pooled, summed, conv, grad_pool


def user_reducers(x, i):
    # Reducers JAX has no monoid for: ``reduce`` keeps the Python function beside
    # its jaxpr (the IR holds the jaxpr only); ``reduce_window`` the jaxpr alone.
    total = lax.reduce(x, 0.0, lambda a, b: a + 1.5 * b, (0,))
    best, at = lax.reduce((x.reshape(2, 3), i.reshape(2, 3)), (-jnp.inf, jnp.int32(0)),
                          lambda a, b: (jnp.maximum(a[0], b[0]),
                                        jnp.where(a[0] >= b[0], a[1], b[1])), (1,))
    window = lax.reduce_window(x, 1.0, lambda a, b: a * b + 0.5, (2,), (1,), "VALID")
    return total, best, at, window


def indexing(x, i):
    x = jnp.asarray(x)
    g = x[jnp.array([0, 2, 5])]
    s = x.at[jnp.array([1, 3])].add(1.0).at[jnp.array([0])].mul(2.0)
    s = s.at[jnp.array([2])].min(0.0).at[jnp.array([4])].max(9.0).at[1].set(-1.0)
    d = lax.dynamic_slice(x, (i[0] % 3,), (2,))
    u = lax.dynamic_update_slice(x, jnp.zeros(2), (i[3],))
    p = lax.pad(x, 0.0, ((1, 2, 1),))
    return g, s, d, u, p, jnp.roll(x, 2), jnp.flip(x), jnp.tile(x, 2), jnp.stack([x, x])[:, ::2]


def control(x):
    def body(c):
        k, v = c
        return k + 1, v * 0.9
    k, v = lax.while_loop(lambda c: c[0] < 5, body, (0, x))
    y = lax.cond(jnp.sum(x) > 0, jnp.sin, jnp.cos, v)
    z = lax.switch(2, [jnp.sin, jnp.cos, jnp.tanh], y)
    _, ys = lax.scan(lambda c, e: (c + e, c * e), 0.0, z, reverse=True, unroll=2)
    w = jax.checkpoint(lambda t: jnp.sin(t) * t, policy=jax.checkpoint_policies.dots_saveable)(ys)
    return lax.optimization_barrier(w) + lax.stop_gradient(x)


def prng(seed, data):
    keys = [jax.random.key(seed, impl=name)
            for name in ("threefry2x32", "rbg", "unsafe_rbg")]
    wrapped = jax.random.wrap_key_data(data, impl="threefry2x32")
    old = jax.random.PRNGKey(seed)
    outs = [jax.random.normal(k, (3,)) for k in keys]
    outs.append(jax.random.uniform(jax.random.fold_in(wrapped, 3), (3,)))
    outs.append(jax.random.gamma(jax.random.split(wrapped)[1], jnp.ones(3)))
    outs.append(jax.random.bits(old, (2,)).astype(jnp.float32))
    out, state = lax.rng_bit_generator(jax.random.key_data(keys[0]).astype(jnp.uint32).reshape(2)
                                       .repeat(2), (3,), algorithm=lax.RandomAlgorithm.RNG_DEFAULT)
    outs.append(out.astype(jnp.float32))
    return outs, jax.random.key_data(keys[1])


def device_puts(x):
    return (jax.device_put(x * 2), jax.device_put(x, may_alias=False),
            jax.device_put((x, x + 1)))


A3 = np.array([[4.0, 1.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.5, 2.0]], np.float32)


def cg_solve(b):
    return jax.scipy.sparse.linalg.cg(lambda v: A3 @ v, b, tol=1e-6)[0]


def gmres_solve(b, a):
    return jax.scipy.sparse.linalg.gmres(lambda v: (A3 + a) @ v, b, tol=1e-6)[0]


def bicgstab_solve(b):
    return jax.scipy.sparse.linalg.bicgstab(lambda v: A3 @ v, b, tol=1e-6)[0]


def linear_solve_explicit(b):
    def matvec(x):
        return A3 @ x

    def solve(mv, rhs):
        return jnp.linalg.solve(A3, rhs)

    return lax.custom_linear_solve(matvec, b, solve, solve, symmetric=True)


def dots(x, a):
    m = jnp.stack([x[:3], x[3:]])
    d = lax.dot_general(m, a, (((1,), (0,)), ((), ())), precision=lax.Precision.HIGH,
                        preferred_element_type=jnp.float32)
    e = jnp.einsum("ij,jk->ik", m, a, precision=lax.DotAlgorithmPreset.F32_F32_F32)
    half = lax.dot(m.astype(jnp.bfloat16), a.astype(jnp.bfloat16)).astype(jnp.float32)
    return d + e + half


@partial(jax.jit, static_argnums=1, donate_argnums=())
def _scaled(x, n):
    return x * n


def jits(x):
    return _scaled(x, 3) + jax.jit(jnp.sin, inline=True)(x)


def checkpoint_names(x):
    from jax.ad_checkpoint import checkpoint_name

    def block(t):
        return jnp.sin(checkpoint_name(jnp.cos(t) * t, "kept")) * checkpoint_name(t * t, "dropped")
    a = jax.checkpoint(block, policy=jax.checkpoint_policies.save_only_these_names("kept"))(x)
    b = jax.checkpoint(block, policy=jax.checkpoint_policies.save_any_names_but_these("dropped"))(x)
    # Differentiated inside the program: JAX stages the checkpoint's recomputation.
    c = jax.grad(lambda t: jnp.sum(jax.checkpoint(block)(t) * x))(x)
    return a + b + c


PROGRAMS = {
    "elementwise": (elementwise, (F,)),
    "special": (special, (F,)),
    "integers": (integers, (I32, U32)),
    "linalg": (linalg, (M,)),
    "fft_sort": (fft_sort, (F,)),
    "windows": (windows, (F,)),
    "indexing": (indexing, (F, I32)),
    "user_reducers": (user_reducers, (F, I32)),
    "control": (control, (F,)),
    "prng": (prng, (np.int32(7), np.array([1, 2], np.uint32))),
    "device_puts": (device_puts, (F,)),
    "cg_solve": (cg_solve, (np.array([1.0, 2.0, 3.0], np.float32),)),
    "gmres_solve": (gmres_solve, (np.array([1.0, 2.0, 3.0], np.float32), np.float32(0.5))),
    "bicgstab_solve": (bicgstab_solve, (np.array([1.0, 2.0, 3.0], np.float32),)),
    "linear_solve_explicit": (linear_solve_explicit, (np.array([1.0, 2.0, 3.0], np.float32),)),
    "dots": (dots, (F, M)),
    "jits": (jits, (F,)),
    "checkpoint_names": (checkpoint_names, (F,)),
}


def decompositions(a):
    w, vl, vr = lax.linalg.eig(a)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    schur_t, _ = lax.linalg.schur(a)
    return (jnp.sort(jnp.abs(w)), jnp.sum(jnp.abs(u @ jnp.diag(s) @ vh)),
            jnp.sum(jnp.abs(jnp.diag(schur_t))))


def ragged(x, a):
    lhs = jnp.concatenate([x, x]).reshape(4, 3)
    rhs = jnp.stack([a, a * 2])
    return lax.ragged_dot(lhs, rhs, jnp.array([1, 3], jnp.int32))


def collectives(x):
    mesh = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))

    def body(v):
        total = lax.psum(v, "i")
        gathered = lax.all_gather(v, "i", tiled=True)
        shifted = lax.ppermute(v, "i", [(0, 1), (1, 0)])
        biggest = lax.pmax(v, "i") + lax.pmin(v, "i")
        index = lax.axis_index("i").astype(v.dtype)
        return total + shifted + biggest + index + jnp.sum(gathered)

    return jax.shard_map(body, mesh=mesh, in_specs=jax.sharding.PartitionSpec("i"),
                         out_specs=jax.sharding.PartitionSpec("i"))(x)


PROGRAMS.update({
    "decompositions": (decompositions, (M,)),
    "ragged": (ragged, (F, M)),
    "collectives": (collectives, (F,)),
})


def more_elementwise(x, i, u):
    c = jnp.clip(x * 0.4, -0.9, 0.9)
    y = (lax.acos(c) + lax.asin(c) + lax.atan(c) + lax.acosh(jnp.abs(x) + 1) + lax.asinh(x)
         + lax.atanh(c) + lax.ceil(x) + lax.floor(x) + lax.cosh(c) + lax.sinh(c))
    z = lax.complex(x, x)
    hi = jax.lax.mul(u, u)
    return (y, jnp.abs(z), lax.le(x, c), lax.reciprocal(x + 3.0) if hasattr(lax, "reciprocal")
            else 1 / (x + 3.0), jnp.prod(x), jnp.bitwise_xor.reduce(i), hi,
            jax.grad(lambda a: jnp.sum(lax.igamma(a, jnp.ones(6))))(jnp.abs(x) + 0.5))


def more_structure(x, i):
    x = jnp.asarray(x)
    m = x.reshape(2, 3)
    mn = lax.reduce_window(m, jnp.inf, lax.min, (1, 2), (1, 1), "VALID")
    sub = x.at[jnp.array([2])].subtract(1.0)
    rolled = jnp.roll(x, i[0])
    parts = lax.unstack(m) if hasattr(lax, "unstack") else list(m)
    tri = lax.linalg.tridiagonal(M)
    hess = lax.linalg.hessenberg(M)
    perm = lax.linalg.lu_pivots_to_permutation(jnp.array([2, 2, 2], jnp.int32), 3)
    bits = jax.extend.random.threefry_2x32(jnp.array([1, 2], jnp.uint32), U32)
    uni = lax.rng_uniform(0.0, 1.0, (2,))
    q = lax.linalg.ormqr(M, jnp.array([1.2, 0.5], jnp.float32), M)
    return q, mn, sub, rolled, parts, tri, hess, perm, bits, uni.shape


def more_collectives(x):
    mesh = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))

    def body(v):
        scattered = lax.psum_scatter(jnp.concatenate([v, v]), "i", tiled=True)
        swapped = lax.all_to_all(v.reshape(2, -1), "i", 0, 0, tiled=True).reshape(-1)
        return scattered + swapped

    return jax.shard_map(body, mesh=mesh, in_specs=jax.sharding.PartitionSpec("i"),
                         out_specs=jax.sharding.PartitionSpec("i"))(x)


import jax.extend.random  # noqa: E402

PROGRAMS.update({
    "more_elementwise": (more_elementwise, (F, I32, U32)),
    "more_structure": (more_structure, (F, I32)),
    "more_collectives": (more_collectives, (np.linspace(0, 1, 8, dtype=np.float32),)),
})


@partial(lax.composite, name="my.scaled_pair", version=3)
def _scaled_pair(v, w, *, scale, table):
    return v * scale + w, jnp.asarray(table, v.dtype)[: v.shape[0]] * w


def composite(x):
    # lax.composite: a name, a version and attributes (an array one held as a
    # HashableArray) beside its decomposition.
    a, b = _scaled_pair(x, x[::-1], scale=2.5, table=np.arange(6.0))
    return a + b


PROGRAMS.update({"composite": (composite, (F,))})
