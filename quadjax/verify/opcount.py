"""The operation count of one RK4 step, read from its jaxpr (seed 000, "Timing").

The seed counts the operations of ``step()`` with an instrumented scalar over generated states
and finds the count fixed for each arm of its one data-dependent branch, ground contact. Here
the step's jaxpr is *evaluated* on the given inputs, equation by equation, and every primitive
executed is counted: nested jaxprs (``jit``, ``custom_jvp_call``, ...) are entered recursively,
a ``scan`` counts its body once per iteration (RK4's four stages are one), and a ``cond`` counts
only the branch its index selects, so a data-dependent branch would show as different counts
for different states. The quadrotor's ground contact has no ``cond``: it is a select
(``jnp.where``, primitive ``select_n``), both arms are computed, and the count is the same for
every state of a given shape, airborne, grounded or random (tests/test_precision.py). Its only
``cond``s are the small-vehicle effects' gates, whose branch the parameters choose.

The step counted is :data:`quadjax.integrators.rk4_step_xla`, the model as XLA operations:
on the CPU :func:`quadjax.rk4_step` runs the native kernel generated from it, whose own
instructions a jaxpr cannot see.
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

from quadjax.integrators import rk4_step_xla
from quadjax.native.generate import scan_counts
from quadjax.state import QuadState

#: floating-point arithmetic: the primitives an instrumented scalar would count
ARITHMETIC = frozenset({
    "add", "sub", "mul", "div", "neg", "sqrt", "rsqrt", "exp", "log", "max", "min", "abs", "sign",
    "integer_pow", "pow", "clamp", "sin", "cos", "tan", "atan2", "tanh", "logistic", "square",
})
_FLOAT = " arithmetic"  # the counter's key for floating-point arithmetic (no primitive's name)
#: the primitives that only hold other jaxprs (entered, not counted), by the parameter holding it
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
          "custom_vjp_call_jaxpr": "fun_jaxpr", "remat": "jaxpr", "checkpoint": "jaxpr"}


def _closed(j):
    """(jaxpr, consts) of a Jaxpr or ClosedJaxpr."""
    return (j.jaxpr, j.consts) if isinstance(j, jax.extend.core.ClosedJaxpr) else (j, ())


def _evaluate(jaxpr, consts, args, counts: Counter):
    env = {}

    def read(v):
        return v.val if isinstance(v, jax.extend.core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        outs = _equation(eqn, [read(v) for v in eqn.invars], counts)
        env.update((v, x) for v, x in zip(eqn.outvars, outs) if not isinstance(v, jax.extend.core.DropVar))
    return [read(v) for v in jaxpr.outvars]


def _equation(eqn, args, counts: Counter):
    name, params = eqn.primitive.name, eqn.params
    if name in _CALLS and _CALLS[name] in params:
        return _evaluate(*_closed(params[_CALLS[name]]), args, counts)
    if name == "cond":  # the branch taken, only: a data-dependent count shows here
        counts["cond"] += 1
        return _evaluate(*_closed(params["branches"][int(args[0])]), args[1:], counts)
    if name == "scan":
        body, body_consts = _closed(params["jaxpr"])
        nc, ncarry = scan_counts(params)
        consts, carry, xs = args[:nc], list(args[nc:nc + ncarry]), args[nc + ncarry:]
        order = range(params["length"])
        ys = [None] * params["length"]
        for i in (reversed(order) if params["reverse"] else order):
            out = _evaluate(body, body_consts, [*consts, *carry, *(x[i] for x in xs)], counts)
            carry, ys[i] = out[:ncarry], out[ncarry:]
        stacked = [jnp.stack([y[k] for y in ys]) for k in range(len(body.outvars) - ncarry)]
        return [*carry, *stacked]
    if name == "while":
        cond, cond_consts = _closed(params["cond_jaxpr"])
        body, body_consts = _closed(params["body_jaxpr"])
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        cc, bc, carry = args[:cn], args[cn:cn + bn], list(args[cn + bn:])
        while bool(_evaluate(cond, cond_consts, [*cc, *carry], counts)[0]):
            carry = _evaluate(body, body_consts, [*bc, *carry], counts)
        return carry
    counts[name] += 1
    if name in ARITHMETIC and all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in eqn.outvars):
        counts[_FLOAT] += 1  # not the integer index arithmetic of the RK4 stage loop
    out = eqn.primitive.bind(*args, **params)
    return out if eqn.primitive.multiple_results else [out]


def count_operations(fn, *args) -> dict[str, int]:
    """The primitives ``fn(*args)`` executes, by name, on these (concrete) arguments; with
    ``"total"`` (every primitive) and ``"arithmetic"`` (those in :data:`ARITHMETIC` with a
    floating-point result).

    Data movement (``slice``, ``squeeze``, ``stack``, ...), comparisons, selects and the integer
    index arithmetic of the RK4 stage loop are counted too: they are in the program;
    ``arithmetic`` is the figure an instrumented scalar would give.
    """
    # a fresh function each call: make_jaxpr caches traces by the function, and a count must
    # see the code as it is now (a test plants changes into it)
    closed = jax.make_jaxpr(lambda *a: fn(*a))(*args)
    counts = Counter()
    _evaluate(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args), counts)
    arithmetic = counts.pop(_FLOAT, 0)
    out = dict(sorted(counts.items()))
    out["total"] = sum(counts.values())
    out["arithmetic"] = arithmetic
    return out


def operation_count(params, state, command, dt) -> dict[str, int]:
    """The operations of one RK4 step (:data:`quadjax.integrators.rk4_step_xla`) of one
    vehicle from ``state`` under ``command`` [rad/s] over ``dt`` [s], by primitive, with
    ``"total"`` and ``"arithmetic"`` (:func:`count_operations`)."""
    return count_operations(rk4_step_xla, params, state, command, dt)


def compiled_flops(params, state, command, dt) -> float | None:
    """XLA's own estimate: ``cost_analysis()['flops']`` of the compiled step (None where the
    backend gives none). XLA counts after its own simplification and fusion, so it need not
    equal :func:`operation_count`'s arithmetic."""
    compiled = jax.jit(rk4_step_xla).lower(params, state, command, dt).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # one entry per computation in older JAX releases
        cost = cost[0] if cost else None
    return None if not cost or "flops" not in cost else float(cost["flops"])


def random_states(params, n: int, seed: int = 0) -> list:
    """``n`` states of one vehicle (R rotors, the params' dtype) and a command for each,
    drawn over the envelope and beyond: any attitude, rates up to 10 rad/s, rotors and
    commands anywhere in [0, ω_max], heights either side of the ground, either contact flag.
    Returns a list of (state, command)."""
    rng = np.random.default_rng(seed)
    R, w_max, dtype = params.num_rotors, float(params.omega_max), params.mass.dtype
    out = []
    for _ in range(n):
        q = rng.normal(size=4)
        state = QuadState.create(
            position=rng.uniform(-1, 1, 3) * (1, 1, 2), velocity=rng.uniform(-5, 5, 3), attitude=q / np.linalg.norm(q),
            body_rates=rng.uniform(-10, 10, 3), rotor_speeds=rng.uniform(0, w_max, R), energy=rng.uniform(0, 1e4),
            on_ground=float(rng.integers(0, 2)), dtype=dtype)
        out.append((state, jnp.asarray(rng.uniform(0, w_max, R), dtype)))
    return out
