"""Component form: a (..., k) array held as a tuple of k arrays (...,), one per component.

The physics is written once, on components (functions named ``*_c``): a quaternion is
``(w, x, y, z)``, a vector ``(x, y, z)``, per-rotor values a tuple of R arrays. The
public array form (trailing component axes, ``(..., 3)``) splits its arguments, calls
the component form and joins the result. Rollouts split once, step the component form
for the whole horizon and join only what they save.

Why: inside a jitted, vmapped step, XLA then sees only element-wise arithmetic on
vehicle-shaped arrays (N,), which it fuses and vectorises across vehicles. The array
form's slices, small stacks and size-3/4 reductions inside the step cost ~10–20× the
arithmetic (GUIDE §3; measured in benchmarks/RESULTS.md).
"""

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from quadjax.params import QuadParams
from quadjax.state import QuadState


def split(x) -> tuple:
    """(..., k) array → tuple of its k components (...,)."""
    x = jnp.asarray(x)
    return tuple(x[..., i] for i in range(x.shape[-1]))


def join(components):
    """Tuple of k arrays (or scalars) → one (..., k) array; components broadcast together."""
    return jnp.stack(jnp.broadcast_arrays(*components), axis=-1)


def split_matrix(m) -> tuple:
    """(..., r, c) array → tuple of r rows, each a tuple of c components."""
    m = jnp.asarray(m)
    return tuple(split(m[..., i, :]) for i in range(m.shape[-2]))


def join_matrix(rows):
    """Inverse of :func:`split_matrix`."""
    return jnp.stack([join(r) for r in rows], axis=-2)


def cross_c(a, b) -> tuple:
    """a × b for 3-vectors in component form."""
    ax, ay, az = a
    bx, by, bz = b
    return (ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx)


def dot_c(a, b):
    """Σ aᵢ bᵢ in component form."""
    out = a[0] * b[0]
    for x, y in zip(a[1:], b[1:]):
        out = out + x * y
    return out


def total(xs):
    """Σ xᵢ over a tuple (e.g. over rotors), summed left to right."""
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def split_params(params: QuadParams) -> QuadParams:
    """The same parameters with every vector or matrix field as nested tuples of components.

    Scalar fields are unchanged. Works on batched parameters (leading axes).
    """
    return params.replace(
        inertia=split_matrix(params.inertia),
        rotor_positions=split_matrix(params.rotor_positions),
        rotor_spins=split(params.rotor_spins),
        drag_linear=split(params.drag_linear),
        drag_quadratic=split(params.drag_quadratic),
        drag_rotational=split(params.drag_rotational),
        wind=split(params.wind),
    )


def join_params(params: QuadParams) -> QuadParams:
    """Inverse of :func:`split_params`."""
    return params.replace(
        inertia=join_matrix(params.inertia),
        rotor_positions=join_matrix(params.rotor_positions),
        rotor_spins=join(params.rotor_spins),
        drag_linear=join(params.drag_linear),
        drag_quadratic=join(params.drag_quadratic),
        drag_rotational=join(params.drag_rotational),
        wind=join(params.wind),
    )


def split_state(state: QuadState) -> QuadState:
    """A state (or state derivative) with its vector fields as tuples of components."""
    return state.replace(
        position=split(state.position),
        velocity=split(state.velocity),
        attitude=split(state.attitude),
        body_rates=split(state.body_rates),
        rotor_speeds=split(state.rotor_speeds),
    )


def join_state(state: QuadState) -> QuadState:
    """Inverse of :func:`split_state`."""
    return state.replace(
        position=join(state.position),
        velocity=join(state.velocity),
        attitude=join(state.attitude),
        body_rates=join(state.body_rates),
        rotor_speeds=join(state.rotor_speeds),
        energy=jnp.asarray(state.energy),
        on_ground=jnp.asarray(state.on_ground),
    )


def gated(on, term, off, *args, coefficients: tuple = ()):
    """``term(*args)`` where ``on``, else ``off``: a number every element of the result takes, or a
    function of ``args`` that returns some of them unchanged (an effect whose coefficient sits at
    its off value; ``on`` a bool of the vehicles' shape). ``coefficients``: the fields of
    ``args[0]`` (the parameters) whose values decide ``on`` (empty: ``args[0]`` is the coefficient).

    The values are term's (where off it gives ``off``: its coefficient multiplies it) and so is
    every derivative: the jvp is term's own, so d/dk at k = 0 stays right where the effect is off.
    What it changes is the cost. For one vehicle it is a ``lax.cond``, which the native kernel
    (generated per vehicle) turns into a branch that runs term only for a block of vehicles of
    which one has it on: an effect off costs a test, not its arithmetic. On batched arrays it is
    a select of both, as XLA would make of a cond under vmap. Un-jitted (op by op, the gate
    already known) it is decided in Python, with the same values. Within :func:`gated_tangents`
    its derivatives are gated too where the coefficients are not differentiated (:func:`_gate_jvp`).
    """
    return _gate(term, off, tuple(coefficients), on, *args)


def _off_values(off, shapes, args):
    """The off branch's result in the term's ``shapes`` and dtypes (an operand kept may be narrower:
    a parameter shared by a batch of states)."""
    if callable(off):
        return jax.tree_util.tree_map(lambda x, s: jnp.broadcast_to(x, s.shape).astype(s.dtype), off(*args), shapes)
    return jax.tree_util.tree_map(lambda s: jnp.full(s.shape, off, s.dtype), shapes)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _gate(term, off, coefficients, on, *args):
    if jnp.ndim(on):
        result = term(*args)
        return jax.tree_util.tree_map(lambda x, y: jnp.where(on, x, y), result, _off_values(off, result, args))
    if op_by_op(on):  # an un-jitted qj.derivative took 137 ms, 98 of them compiling its two gates
        return term(*args) if bool(on) else _off_values(off, jax.eval_shape(term, *args), args)
    shapes = jax.eval_shape(term, *args)
    return jax.lax.cond(on, lambda a: term(*a), lambda a: _off_values(off, shapes, a), args)


def op_by_op(tree) -> bool:
    """Whether ``tree`` is being evaluated op by op (un-jitted): no leaf is a tracer, and a new array
    is not staged either (a jit that closes over a concrete ``tree`` stages every operation).

    Where it is, a ``lax.cond`` or ``lax.scan`` of closures made per call would be compiled anew on
    every call (their jaxprs are new each time): the gates above and RK4's stage loop
    (:func:`quadjax.integrators.runge_kutta4`) then branch or loop in Python instead.
    """
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree)):
        return False
    return not isinstance(jnp.zeros(()), jax.core.Tracer)


_GATED_TANGENTS = contextvars.ContextVar("quadjax_gated_tangents", default=False)


@contextlib.contextmanager
def gated_tangents():
    """Within it, a gate's tangents are gated as its values are where its coefficients are not
    differentiated (:func:`_gate_jvp`): what the native kernels' derivatives with the parameters
    fixed are generated from (one vehicle, no ``vmap``). Not elsewhere: under a ``vmap`` that
    batches the gate, JAX makes a cond a select whose operands pass through ``stop_gradient``, which
    a linearisation (``jax.grad``) cannot transpose once they are tangents."""
    token = _GATED_TANGENTS.set(True)
    try:
        yield
    finally:
        _GATED_TANGENTS.reset(token)


@functools.partial(_gate.defjvp, symbolic_zeros=True)
def _gate_jvp(term, off, coefficients, primals, tangents):
    """term's jvp; within :func:`gated_tangents`, with the coefficients not differentiated (a zero
    tangent: the parameters fixed), gated as the values are. Where off, term is ``off`` as a
    function of everything else (its coefficient at its off value makes it so), so their
    derivatives are off's: an effect off then costs the derivative kernels a test, not its
    arithmetic (the tangent step 30 % less, the adjoint step 13 %: benchmarks/README.md)."""
    on, args, d_args = primals[0], primals[1:], tangents[1:]
    d_coefficients = [getattr(tangents[1], name) for name in coefficients] if coefficients else tangents[1]
    zero = jax.tree_util.tree_leaves(d_coefficients, is_leaf=lambda t: isinstance(t, SymbolicZero))
    moving, d_moving = _moving(d_args)
    if not _GATED_TANGENTS.get() or jnp.ndim(on) or not all(isinstance(t, SymbolicZero) for t in zero):
        return _jvp_of(term, args, moving, d_moving)
    shapes = jax.eval_shape(term, *args)
    # the values by their own gate, and the tangents by a second that returns tangents alone: a cond
    # that returned both would put the values in the linear part of a linearisation (jax.grad), and
    # everything computed from them after it
    tangent = jax.lax.cond(on, lambda a, d: _jvp_of(term, a, moving, d)[1],
                           lambda a, d: _jvp_of(lambda *x: _off_values(off, shapes, x), a, moving, d)[1],
                           args, d_moving)
    return _gate(term, off, coefficients, on, *args), tangent


def _moving(d_args) -> tuple:
    """(the indices of the leaves of ``d_args``, a custom_jvp rule's tangents, that are not symbolic
    zeros; those tangents). The rest are held as constants by :func:`_jvp_of`, not differentiated as
    arrays of zeros: so instantiated, every term of the parameters' tangent was computed as zero times
    a value (the generated tangent step with the parameters fixed multiplied by zero 77 times a step,
    and carried the products in its sums: benchmarks/README.md, 2026-12-07)."""
    d_leaves = jax.tree_util.tree_leaves(d_args, is_leaf=lambda t: isinstance(t, SymbolicZero))
    moving = tuple(i for i, t in enumerate(d_leaves) if not isinstance(t, SymbolicZero))
    return moving, [d_leaves[i] for i in moving]


def _jvp_of(fn, args, moving, d_moving):
    """``jax.jvp`` of ``fn(*args)`` along ``d_moving``, the tangents of the leaves ``moving``; the
    other leaves of ``args`` held."""
    leaves, tree = jax.tree_util.tree_flatten(args)

    def of_moving(*xs):
        held = list(leaves)
        for i, x in zip(moving, xs):
            held[i] = x
        return fn(*jax.tree_util.tree_unflatten(tree, held))

    return jax.jvp(of_moving, [leaves[i] for i in moving], list(d_moving))
