"""A corpus of small programs written the way users of equinox, lineax, optimistix and
diffrax write them (issue 15): custom rules through equinox's filtered APIs, Modules as
arguments, linear solves with matrix and function operators, root finding,
minimisation and least squares with implicit differentiation, and ODE solves with the
three adjoints, with parameters reaching the library through ``args`` and through
closures.

``PROGRAMS`` is a list of ``(id, function, example_args)``.  Each function returns an
array (or a pytree of arrays); the tests differentiate ``sum(out**2)`` with respect
to every argument.  Shapes are tiny and solves take few steps so that the corpus runs
fast.
"""
import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx

A = jnp.array([[3.0, 1.0], [1.0, 2.0]])
TALL = jnp.array([[1.0, 2.0], [0.5, -1.0], [2.0, 0.3]])
B = jnp.array([1.0, -1.0])
VEC2 = jax.ShapeDtypeStruct((2,), jnp.float32)


# ---------------------------------------------------------------- equinox

@eqx.filter_custom_vjp
def _clipped_scale(x__scale, how):
    # ``how`` (a string) is not differentiable; equinox hands it to the rules as is.
    x, scale = x__scale
    return jnp.clip(x, -1.0, 1.0) * scale if how == "clip" else x * scale


@_clipped_scale.def_fwd
def _clipped_scale_fwd(perturbed, x__scale, how):
    x, scale = x__scale
    out = jnp.clip(x, -1.0, 1.0) * scale
    return out, (x, scale)


@_clipped_scale.def_bwd
def _clipped_scale_bwd(residuals, g, perturbed, x__scale, how):
    x, scale = residuals
    # straight-through gradient for x; the usual one for scale
    return g * scale, jnp.sum(g * jnp.clip(x, -1.0, 1.0))


def eqx_filter_custom_vjp_pytree(x, scale):
    return jnp.sin(_clipped_scale((x, scale), "clip"))


@eqx.filter_custom_vjp
def _times_n(x, n):
    return x * n


@_times_n.def_fwd
def _times_n_fwd(perturbed, x, n):
    return x * n, None


@_times_n.def_bwd
def _times_n_bwd(residuals, g, perturbed, x, n):
    return g * n


def eqx_filter_custom_vjp_int_arg(x):
    # An integer argument: never perturbed, never given a cotangent.
    return _times_n(x, 3) + _times_n(x ** 2, jnp.int32(2))


def eqx_filter_custom_vjp_closure(x, scale):
    # A custom rule defined inside the function, closing over the differentiated
    # ``scale``: JAX refuses (the rule cannot see ``scale``); jaxpr-cc forms that
    # derivative itself, so the reference is float64 finite differences.
    @eqx.filter_custom_vjp
    def scaled_sin(y):
        return jnp.sin(y) * scale

    @scaled_sin.def_fwd
    def scaled_sin_fwd(perturbed, y):
        return scaled_sin(y), jnp.cos(y)

    @scaled_sin.def_bwd
    def scaled_sin_bwd(cos_y, g, perturbed, y):
        return g * cos_y * scale

    return scaled_sin(x) + x


@eqx.filter_custom_jvp
def _softplus(x, beta):
    return jnp.logaddexp(beta * x, 0.0) / beta


@_softplus.def_jvp
def _softplus_jvp(primals, tangents):
    x, beta = primals
    tx, _ = tangents  # beta is a Python float: no tangent
    return _softplus(x, beta), jax.nn.sigmoid(beta * x) * tx


def eqx_filter_custom_jvp(x):
    return _softplus(x, 2.0) * x


@eqx.filter_custom_jvp
def _weighted_norm(x, w):
    return jnp.sqrt(jnp.sum(w * x ** 2))


@_weighted_norm.def_jvp
def _weighted_norm_jvp(primals, tangents):
    x, w = primals
    tx, tw = tangents
    out = _weighted_norm(x, w)
    t = jnp.sum(w * x * tx) / out
    if tw is not None:  # None: w not perturbed (equinox's symbolic zero)
        t = t + jnp.sum(tw * x ** 2) / (2 * out)
    return out, t


def eqx_filter_custom_jvp_two_arrays(x, w):
    return _weighted_norm(x, w) * x


def eqx_filter_custom_jvp_closure(x, w):
    # The parameter reaches the custom function only through a closure.
    def f(y):
        return _weighted_norm(y, w)
    return jax.vmap(f)(jnp.stack([x, 2 * x]))


def eqx_filter_closure_convert(x, k):
    def f(y):
        return jnp.tanh(k * y) + y
    converted = eqx.filter_closure_convert(f, x)
    return converted(x) * converted(2 * x)


@eqx.filter_custom_vjp
def _call_converted(fn__y):
    fn, y = fn__y
    return fn(y)


@_call_converted.def_fwd
def _call_converted_fwd(perturbed, fn__y):
    return _call_converted(fn__y), None


@_call_converted.def_bwd
def _call_converted_bwd(residuals, g, perturbed, fn__y):
    fn, y = fn__y
    _, vjp = eqx.filter_vjp(lambda fn, y: fn(y), fn, y)
    return vjp(g)


def eqx_filter_closure_convert_in_custom_vjp(x, k):
    # The documented use: a closure-converted function (its closed-over ``k`` now a
    # leaf) passed through a custom rule that differentiates it.
    def f(y):
        return jnp.sin(k * y)
    converted = eqx.filter_closure_convert(f, x)
    return _call_converted((converted, x))


def _mlp_parts():
    mlp = eqx.nn.MLP(2, 2, 4, 2, activation=jnp.tanh, key=jax.random.PRNGKey(0))
    return eqx.partition(mlp, eqx.is_array)


_MLP_PARAMS, _MLP_STATIC = _mlp_parts()


def eqx_mlp_as_argument(params, x):
    model = eqx.combine(params, _MLP_STATIC)
    return model(x)


def eqx_linear_module_vmap(linear, xs):
    return jax.vmap(linear)(xs)


def eqx_filter_jit_inside(params, x):
    @eqx.filter_jit
    def apply(model, y, n_layers_used):
        for layer in model.layers[:n_layers_used]:
            y = jnp.tanh(layer(y))
        return y

    model = eqx.combine(params, _MLP_STATIC)
    return apply(model, x, 2)


class _Affine(eqx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return jnp.tanh(self.weight @ x + self.bias)


def eqx_module_fixed_point(layer, x):
    # A Module argument closed over by an optimistix fixed-point residual.
    fn = lambda y, _: layer(y) - y  # noqa: E731
    return optx.root_find(fn, optx.Newton(1e-6, 1e-6), x).value


def eqx_filter_grad_inside(params, x):
    @eqx.filter_grad
    def loss(model, y):
        return jnp.sum(model(y) ** 2)

    grads = loss(eqx.combine(params, _MLP_STATIC), x)
    return grads.layers[0].weight


# ---------------------------------------------------------------- lineax

def lx_lu(b):
    return lx.linear_solve(lx.MatrixLinearOperator(A), b, lx.LU()).value


def lx_lu_matrix_argument(m, b):
    return lx.linear_solve(lx.MatrixLinearOperator(m), b, lx.LU()).value


def lx_qr_least_squares(m, b):
    # A tall matrix: QR gives the least-squares solution.
    return lx.linear_solve(lx.MatrixLinearOperator(m), b, lx.QR()).value


def lx_cholesky(m, b):
    operator = lx.MatrixLinearOperator(m @ m.T + jnp.eye(2), lx.positive_semidefinite_tag)
    return lx.linear_solve(operator, b, lx.Cholesky()).value


def lx_svd(m, b):
    return lx.linear_solve(lx.MatrixLinearOperator(m), b, lx.SVD()).value


def lx_cg(b):
    operator = lx.MatrixLinearOperator(A, lx.positive_semidefinite_tag)
    return lx.linear_solve(operator, b, lx.CG(rtol=1e-6, atol=1e-6)).value


def lx_cg_function_operator(b, w):
    operator = lx.FunctionLinearOperator(lambda v: A @ v + w * v, VEC2,
                                         lx.positive_semidefinite_tag)
    return lx.linear_solve(operator, b, lx.CG(rtol=1e-6, atol=1e-6)).value


def lx_gmres(m, b):
    return lx.linear_solve(lx.MatrixLinearOperator(m), b,
                           lx.GMRES(rtol=1e-6, atol=1e-6, restart=2)).value


def lx_gmres_function_operator(b, w):
    operator = lx.FunctionLinearOperator(lambda v: A @ v + jnp.roll(v, 1) * w, VEC2)
    return lx.linear_solve(operator, b, lx.GMRES(rtol=1e-6, atol=1e-6)).value


def lx_qr_function_operator(b, w):
    operator = lx.FunctionLinearOperator(lambda v: A @ v + w * v, VEC2)
    return lx.linear_solve(operator, b, lx.QR()).value


def lx_auto_solver(m, b):
    return lx.linear_solve(lx.MatrixLinearOperator(m), b,
                           lx.AutoLinearSolver(well_posed=True)).value


# ---------------------------------------------------------------- optimistix

def _residual(y, a):
    return jnp.tanh(y) - a * y + 0.1


def optx_newton_args(a):
    return optx.root_find(_residual, optx.Newton(1e-6, 1e-6), jnp.zeros(2), args=a).value


def optx_newton_closure(a):
    fn = lambda y, _: jnp.tanh(y) - a * y + 0.1  # noqa: E731
    return optx.root_find(fn, optx.Newton(1e-6, 1e-6), jnp.zeros(2)).value


def optx_chord_args(a):
    return optx.root_find(_residual, optx.Chord(1e-6, 1e-6), jnp.zeros(2), args=a).value


def optx_bisection(c):
    # The cube root of c on [0, 3].
    fn = lambda y, c: y ** 3 - c  # noqa: E731
    return optx.root_find(fn, optx.Bisection(rtol=1e-6, atol=1e-6), jnp.array(1.0), args=c,
                          options=dict(lower=0.0, upper=3.0)).value


def _rosenbrock_like(y, p):
    return (p[0] - y[0]) ** 2 + p[1] * (y[1] - y[0] ** 2) ** 2


def optx_bfgs_args(p):
    return optx.minimise(_rosenbrock_like, optx.BFGS(1e-7, 1e-7), jnp.array([0.5, 0.5]),
                         args=p, max_steps=64).value


def optx_bfgs_closure(c):
    fn = lambda y, _: jnp.sum((y - c) ** 2) + 0.1 * jnp.sum(y ** 4)  # noqa: E731
    return optx.minimise(fn, optx.BFGS(1e-7, 1e-7), jnp.zeros(2), max_steps=64).value


def optx_nonlinear_cg(c):
    fn = lambda y, c: jnp.sum((y - c) ** 2 * jnp.array([1.0, 3.0]))  # noqa: E731
    return optx.minimise(fn, optx.NonlinearCG(1e-6, 1e-6), jnp.zeros(2), args=c,
                         max_steps=64).value


def optx_gradient_descent(c):
    fn = lambda y, _: jnp.sum((y - c) ** 2)  # noqa: E731
    return optx.minimise(fn, optx.GradientDescent(0.25, 1e-6, 1e-6), jnp.zeros(2),
                         max_steps=64).value


def optx_levenberg_marquardt_args(data):
    # Fit y = a * exp(b t) to three points.
    t = jnp.array([0.0, 0.5, 1.0])
    fn = lambda ab, d: ab[0] * jnp.exp(ab[1] * t) - d  # noqa: E731
    return optx.least_squares(fn, optx.LevenbergMarquardt(1e-6, 1e-6), jnp.array([1.0, 0.0]),
                              args=data, max_steps=64).value


def optx_gauss_newton_closure(data):
    t = jnp.array([0.0, 0.5, 1.0])
    fn = lambda ab, _: ab[0] + ab[1] * jnp.sin(t) - data  # noqa: E731
    return optx.least_squares(fn, optx.GaussNewton(1e-6, 1e-6), jnp.zeros(2),
                              max_steps=16).value


def optx_implicit_adjoint_explicit(a):
    # ImplicitAdjoint spelled out, with its linear solver chosen.
    adjoint = optx.ImplicitAdjoint(linear_solver=lx.LU())
    return optx.root_find(_residual, optx.Newton(1e-6, 1e-6), jnp.zeros(2), args=a,
                          adjoint=adjoint).value


# ---------------------------------------------------------------- diffrax

_TS = jnp.array([0.25, 0.5])
_CONSTANT = diffrax.ConstantStepSize()


def dfx_tsit5_checkpoint_saveat(k):
    term = diffrax.ODETerm(lambda t, y, args: -k * y)
    sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 0.5, 0.125, jnp.ones(2),
                              saveat=diffrax.SaveAt(ts=_TS), stepsize_controller=_CONSTANT,
                              adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=4))
    return sol.ys


def dfx_dopri5_direct_args(m):
    term = diffrax.ODETerm(lambda t, y, m: m @ y)
    sol = diffrax.diffeqsolve(term, diffrax.Dopri5(), 0.0, 0.5, 0.125, jnp.ones(2), args=m,
                              stepsize_controller=_CONSTANT, adjoint=diffrax.DirectAdjoint(),
                              max_steps=8)
    return sol.ys[-1]


def dfx_euler_backsolve_args(k):
    term = diffrax.ODETerm(lambda t, y, k: -k * y + jnp.sin(t))
    sol = diffrax.diffeqsolve(term, diffrax.Euler(), 0.0, 0.5, 0.125, jnp.ones(2), args=k,
                              stepsize_controller=_CONSTANT, adjoint=diffrax.BacksolveAdjoint(),
                              saveat=diffrax.SaveAt(t1=True))
    return sol.ys[-1]


def dfx_euler_checkpoint_closure(m, y0):
    term = diffrax.ODETerm(lambda t, y, args: jnp.tanh(m @ y))
    sol = diffrax.diffeqsolve(term, diffrax.Euler(), 0.0, 0.5, 0.125, y0,
                              saveat=diffrax.SaveAt(ts=_TS), stepsize_controller=_CONSTANT)
    return sol.ys


def dfx_heun_direct_closure(k):
    term = diffrax.ODETerm(lambda t, y, args: -k * y ** 3)
    sol = diffrax.diffeqsolve(term, diffrax.Heun(), 0.0, 0.5, 0.125, jnp.ones(2),
                              stepsize_controller=_CONSTANT, adjoint=diffrax.DirectAdjoint(),
                              max_steps=8, saveat=diffrax.SaveAt(ts=_TS))
    return sol.ys


def dfx_mlp_vector_field(params, y0):
    # A neural ODE: an equinox MLP as the vector field, passed through ``args``.
    term = diffrax.ODETerm(lambda t, y, p: eqx.combine(p, _MLP_STATIC)(y))
    sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 0.5, 0.25, y0, args=params,
                              stepsize_controller=_CONSTANT, saveat=diffrax.SaveAt(t1=True))
    return sol.ys[-1]


_LINEAR = eqx.nn.Linear(2, 2, key=jax.random.PRNGKey(1))
_XS = jnp.array([[0.3, -0.2], [0.1, 0.4], [-0.5, 0.2]])

PROGRAMS = [
    # equinox
    ("eqx_filter_custom_vjp_pytree", eqx_filter_custom_vjp_pytree,
     (jnp.array([0.5, -2.0]), jnp.float32(1.5))),
    ("eqx_filter_custom_vjp_int_arg", eqx_filter_custom_vjp_int_arg, (jnp.array([0.5, -2.0]),)),
    ("eqx_filter_custom_vjp_closure", eqx_filter_custom_vjp_closure,
     (jnp.array([0.5, -2.0]), jnp.float32(1.5))),
    ("eqx_filter_custom_jvp", eqx_filter_custom_jvp, (jnp.array([0.5, -2.0]),)),
    ("eqx_filter_custom_jvp_two_arrays", eqx_filter_custom_jvp_two_arrays,
     (jnp.array([0.5, -2.0]), jnp.array([1.0, 0.5]))),
    ("eqx_filter_custom_jvp_closure", eqx_filter_custom_jvp_closure,
     (jnp.array([0.5, -2.0]), jnp.array([1.0, 0.5]))),
    ("eqx_filter_closure_convert", eqx_filter_closure_convert,
     (jnp.array([0.5, -2.0]), jnp.float32(0.7))),
    ("eqx_filter_closure_convert_in_custom_vjp", eqx_filter_closure_convert_in_custom_vjp,
     (jnp.array([0.5, -2.0]), jnp.float32(0.7))),
    ("eqx_mlp_as_argument", eqx_mlp_as_argument, (_MLP_PARAMS, jnp.array([0.3, -0.4]))),
    ("eqx_linear_module_vmap", eqx_linear_module_vmap, (_LINEAR, _XS)),
    ("eqx_filter_jit_inside", eqx_filter_jit_inside, (_MLP_PARAMS, jnp.array([0.3, -0.4]))),
    ("eqx_filter_grad_inside", eqx_filter_grad_inside, (_MLP_PARAMS, jnp.array([0.3, -0.4]))),
    ("eqx_module_fixed_point", eqx_module_fixed_point,
     (_Affine(jnp.array([[0.5, 0.1], [0.2, 0.3]]), jnp.array([0.1, -0.2])),
      jnp.array([0.3, 0.1]))),
    # lineax
    ("lx_lu", lx_lu, (B,)),
    ("lx_lu_matrix_argument", lx_lu_matrix_argument, (A, B)),
    ("lx_qr_least_squares", lx_qr_least_squares, (TALL, jnp.array([1.0, -1.0, 0.5]))),
    ("lx_cholesky", lx_cholesky, (A, B)),
    ("lx_svd", lx_svd, (A, B)),
    ("lx_cg", lx_cg, (B,)),
    ("lx_cg_function_operator", lx_cg_function_operator, (B, jnp.float32(0.5))),
    ("lx_gmres", lx_gmres, (A, B)),
    ("lx_gmres_function_operator", lx_gmres_function_operator, (B, jnp.float32(0.5))),
    ("lx_qr_function_operator", lx_qr_function_operator, (B, jnp.float32(0.5))),
    ("lx_auto_solver", lx_auto_solver, (A, B)),
    # optimistix
    ("optx_newton_args", optx_newton_args, (jnp.array([0.5, 0.3]),)),
    ("optx_newton_closure", optx_newton_closure, (jnp.array([0.5, 0.3]),)),
    ("optx_chord_args", optx_chord_args, (jnp.array([0.5, 0.3]),)),
    ("optx_bisection", optx_bisection, (jnp.float32(2.0),)),
    ("optx_bfgs_args", optx_bfgs_args, (jnp.array([1.0, 2.0]),)),
    ("optx_bfgs_closure", optx_bfgs_closure, (jnp.array([0.5, -0.3]),)),
    ("optx_nonlinear_cg", optx_nonlinear_cg, (jnp.array([0.5, -0.3]),)),
    ("optx_gradient_descent", optx_gradient_descent, (jnp.array([0.5, -0.3]),)),
    ("optx_levenberg_marquardt_args", optx_levenberg_marquardt_args,
     (jnp.array([1.0, 1.4, 2.1]),)),
    ("optx_gauss_newton_closure", optx_gauss_newton_closure, (jnp.array([0.1, 0.6, 0.9]),)),
    ("optx_implicit_adjoint_explicit", optx_implicit_adjoint_explicit,
     (jnp.array([0.5, 0.3]),)),
    # diffrax
    ("dfx_tsit5_checkpoint_saveat", dfx_tsit5_checkpoint_saveat, (jnp.float32(0.7),)),
    ("dfx_dopri5_direct_args", dfx_dopri5_direct_args, (jnp.array([[-0.5, 0.2], [0.1, -0.3]]),)),
    ("dfx_euler_backsolve_args", dfx_euler_backsolve_args, (jnp.float32(0.7),)),
    ("dfx_euler_checkpoint_closure", dfx_euler_checkpoint_closure,
     (jnp.array([[-0.5, 0.2], [0.1, -0.3]]), jnp.array([1.0, 0.5]))),
    ("dfx_heun_direct_closure", dfx_heun_direct_closure, (jnp.float32(0.7),)),
    ("dfx_mlp_vector_field", dfx_mlp_vector_field, (_MLP_PARAMS, jnp.array([0.3, -0.4]))),
]

# Programs whose gradient JAX refuses (a custom rule closes over a differentiated
# value); their reference gradient is float64 central finite differences.
JAX_GRADIENT_RAISES = {"eqx_filter_custom_vjp_closure"}


def loss(fun):
    """``sum(out**2)`` over every leaf of ``fun``'s result."""
    return lambda *args: sum(jnp.sum(leaf ** 2) for leaf in jax.tree.leaves(fun(*args)))


def jax_gradient(fun, args):
    return jax.grad(loss(fun), argnums=tuple(range(len(args))))(*args)


def finite_difference_gradient(fun, args, step=1e-6):
    """Central differences of ``loss(fun)`` in float64, one per element of every
    floating-point leaf of ``args``; a pytree like ``args``."""
    import numpy as np

    with jax.enable_x64(True):
        def widen(leaf):
            leaf = jnp.asarray(leaf)
            return leaf.astype(jnp.float64) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf

        leaves, treedef = jax.tree.flatten(jax.tree.map(widen, args))
        flat_loss = jax.jit(lambda *leaves: loss(fun)(*jax.tree.unflatten(treedef, leaves)))
        grads = []
        for i, leaf in enumerate(leaves):
            base = np.asarray(leaf)
            grad = np.zeros(base.shape, base.dtype)
            for j in np.ndindex(base.shape):
                shifted = []
                for sign in (1, -1):
                    moved = base.copy()
                    moved[j] += sign * step
                    shifted.append(float(flat_loss(*leaves[:i], jnp.asarray(moved),
                                                   *leaves[i + 1:])))
                grad[j] = (shifted[0] - shifted[1]) / (2 * step)
            grads.append(grad)
        return jax.tree.unflatten(treedef, grads)


def reference_gradient(name, fun, args):
    """JAX's gradient of ``loss(fun)``; finite differences where JAX raises (and the
    test checks that it does)."""
    if name in JAX_GRADIENT_RAISES:
        return finite_difference_gradient(fun, args)
    return jax_gradient(fun, args)
