"""The small-vehicle effects (issue 16): each against its equation in an analytic case, each off
at its default bit-for-bit, and the rotor reaction torque against the conservation law it obeys.

Kernel == XLA with every effect on is the property test over ``varied_fleet`` (test_native,
test_generate, test_gpu), which draws every QuadParams leaf per vehicle, these included.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
import quadjax.integrators
import quadjax.quadrotor as quad
from quadjax.integrators import ground_contact, rk4_step_xla

F64 = jnp.float64


def _bare(**effects):
    """RP-1 without drag, battery, gyroscopic or yaw-drag terms, far above the ground (float64),
    with ``effects`` on: each test then sees its effect alone."""
    p = qj.presets.rp1(dtype=F64).replace(ground_z=jnp.asarray(-1e6, F64))
    zero = jnp.zeros((), F64)
    p = p.replace(drag_linear=jnp.zeros(3, F64), drag_quadratic=jnp.zeros(3, F64), drag_rotational=jnp.zeros(3, F64),
                  rotor_inertia=zero, battery_sag=zero, k_m=zero)
    return p.replace(**{k: jnp.asarray(v, F64) for k, v in effects.items()})


def _hover_speeds():
    """RP-1's hover rotor speeds at standard gravity (the tests that turn gravity off keep them)."""
    return qj.hover_rotor_speed(qj.presets.rp1(dtype=F64))


def _state(p, **fields):
    """Level and still at the origin, rotors at :func:`_hover_speeds`, then ``fields``."""
    s = qj.hover_state(p).replace(rotor_speeds=_hover_speeds())
    return s.replace(**{k: jnp.asarray(v, F64) for k, v in fields.items()})


def test_reaction_torque_is_minus_ia_times_the_spin_weighted_rotor_acceleration():
    """ṙ = −I_a Σ spinᵢ ω̇ᵢ / J_zz, ω̇ᵢ = (uᵢ − ωᵢ)/τ, with k_m = 0 (no drag torque): a CCW rotor
    (spin +1) spun up turns the body CW."""
    Ia = 4e-6
    p = _bare(rotor_reaction_inertia=Ia)
    s = _state(p)
    w = s.rotor_speeds
    u = w.at[0].add(200.0)  # rotor 0, CCW, spins up
    d = qj.derivative(p, s, u)
    w_dot = (u - w) / p.motor_tau
    expected = -Ia * jnp.sum(p.rotor_spins * w_dot) / p.inertia[2, 2]
    np.testing.assert_allclose(d.rotor_speeds, w_dot, rtol=1e-14)
    np.testing.assert_allclose(d.body_rates[2], expected, rtol=1e-12)
    assert float(d.body_rates[2]) < 0
    # the roll/pitch moment of the extra thrust is there too, and nothing else about z
    off = qj.derivative(p.replace(rotor_reaction_inertia=jnp.zeros((), F64)), s, u)
    np.testing.assert_allclose(d.body_rates[:2], off.body_rates[:2], rtol=1e-14)
    assert float(off.body_rates[2]) == 0.0


def test_reaction_torque_conserves_angular_momentum_about_z():
    """With no other yaw torque (k_m = 0, no drag) the rotors' and body's angular momentum about
    body z, J_zz r + I_a Σ spinᵢ ωᵢ, is conserved while the rotors spin up and down (gravity off,
    level, no roll or pitch: z stays the spin axis). A sign error or a missing factor breaks it."""
    Ia = 5e-6
    p = _bare(rotor_reaction_inertia=Ia, gravity=0.0)
    s = _state(p)
    w0 = s.rotor_speeds
    u = jnp.stack([w0 * jnp.asarray([1.3, 1.3, 0.8, 0.8]), w0 * jnp.asarray([0.7, 0.7, 1.2, 1.2])])
    commands = jnp.repeat(u, 150, axis=0)  # 0.3 s each way, dt 1 ms: τ = 30 ms settles

    def momentum(x):
        return p.inertia[2, 2] * x.body_rates[..., 2] + Ia * jnp.sum(p.rotor_spins * x.rotor_speeds, -1)

    tr = jax.jit(lambda: qj.simulate(p, s, 1e-3, commands=commands, config=qj.SimConfig(backend="xla")))()
    L = momentum(tr.states)
    assert float(jnp.max(jnp.abs(tr.states.body_rates[:, 2]))) > 0.05  # the body did turn
    # to RK4's quadrature of the exact lag, (h/τ)⁵/2880 ≈ 1e-11 of the change per step: 1e-9 over the run
    np.testing.assert_allclose(L, momentum(s), rtol=0, atol=1e-9 * float(Ia * jnp.sum(w0)))


@pytest.mark.parametrize("ratio", [0.5, 1.0, 2.5])
def test_spin_down_lag_is_ratio_times_spin_up_and_exact_in_the_step(ratio):
    """ω(t) = u + (ω₀ − u) e^(−t/τᵢ) with τᵢ = τ up and r τ down, per rotor in one step (rotors
    0, 1 up, 2, 3 down), at a step 3× the spin-up lag: the exact solution, not RK4's."""
    p = _bare(motor_tau_down_ratio=ratio)
    s = _state(p)
    w0 = s.rotor_speeds
    u = w0 * jnp.asarray([1.2, 1.1, 0.8, 0.9])
    tau = p.motor_tau * jnp.asarray([1.0, 1.0, ratio, ratio])
    d = qj.derivative(p, s, u)
    np.testing.assert_allclose(d.rotor_speeds, (u - w0) / tau, rtol=1e-13)
    h = 3 * float(p.motor_tau)
    after = qj.rk4_step(p, s, u, h)
    np.testing.assert_allclose(after.rotor_speeds, u + (w0 - u) * jnp.exp(-h / tau), rtol=1e-13)


def test_h_force_opposes_the_in_plane_airspeed_in_proportion_to_the_rotor_speeds():
    """v̇ = −k_h Σωᵢ v_b⊥ / m in the rotor plane, on the air-relative velocity (wind), none along z;
    hubs 3 cm above the centre of mass pitch the nose up: M_y = −k_h v_x Σ zᵢ ωᵢ."""
    kh = 2e-5
    p = _bare(rotor_drag=kh, gravity=0.0)
    p = p.replace(rotor_positions=p.rotor_positions.at[:, 2].set(0.03), wind=jnp.asarray([0.5, -1.0, 0.0], F64))
    s = _state(p, velocity=[2.0, 1.0, 0.7])
    w = s.rotor_speeds
    d = qj.derivative(p, s, w)
    air = s.velocity - p.wind
    thrust = p.k_f * jnp.sum(w ** 2)
    np.testing.assert_allclose(d.velocity[:2], -kh * jnp.sum(w) * air[:2] / p.mass, rtol=1e-12)
    np.testing.assert_allclose(d.velocity[2], thrust / p.mass, rtol=1e-12)
    Jw_dot = p.inertia @ d.body_rates  # ω = 0: J ω̇ = M
    np.testing.assert_allclose(Jw_dot, [kh * air[1] * 0.03 * jnp.sum(w), -kh * air[0] * 0.03 * jnp.sum(w), 0.0],
                               atol=1e-15)
    assert float(d.body_rates[1]) < 0  # nose up (FLU: +y rotation is nose down)


def test_blade_flapping_pitches_the_nose_up_into_the_airflow():
    """M_β = k_β Σωᵢ (v_b,y, −v_b,x, 0) on the air-relative velocity, no force."""
    kb = 3e-7
    p = _bare(blade_flapping=kb, gravity=0.0).replace(wind=jnp.asarray([0.5, -1.0, 0.4], F64))
    s = _state(p, velocity=[2.0, 1.0, 0.7])
    w = s.rotor_speeds
    d = qj.derivative(p, s, w)
    air = s.velocity - p.wind
    np.testing.assert_allclose(p.inertia @ d.body_rates, [kb * jnp.sum(w) * air[1], -kb * jnp.sum(w) * air[0], 0.0],
                               atol=1e-15)
    np.testing.assert_allclose(d.velocity, [0.0, 0.0, p.k_f * jnp.sum(w ** 2) / p.mass], atol=1e-12)
    assert float(d.body_rates[1]) < 0  # flying forward, the nose comes up


def test_inflow_lowers_thrust_climbing_and_damps_roll():
    """Tᵢ = k_f ωᵢ² − k_in ωᵢ (v_z + p yᵢ − q xᵢ): climbing at v_z loses k_in Σωᵢ v_z of thrust;
    rolling at p the rotors on the descending side gain thrust, M_x = −k_in p Σ ωᵢ yᵢ²."""
    kin = 1e-6
    p = _bare(k_inflow=kin, gravity=0.0)
    w = _hover_speeds()
    climb = qj.derivative(p, _state(p, velocity=[0.0, 0.0, 1.5]), w)
    np.testing.assert_allclose(climb.velocity[2] * p.mass, p.k_f * jnp.sum(w ** 2) - kin * jnp.sum(w) * 1.5,
                               rtol=1e-13)
    roll = qj.derivative(p, _state(p, body_rates=[0.8, 0.0, 0.0]), w)
    y = p.rotor_positions[:, 1]
    M_x = -kin * 0.8 * jnp.sum(w * y * y)
    np.testing.assert_allclose((p.inertia @ roll.body_rates)[0] + 0.0, M_x, rtol=1e-9)  # ω × Jω has no x part here
    assert float(roll.body_rates[0]) < 0  # damping
    np.testing.assert_allclose(roll.velocity[2] * p.mass, p.k_f * jnp.sum(w ** 2), rtol=1e-12)  # symmetric layout


@pytest.mark.parametrize("z_over_rho", [0.25, 0.5, 1.0, 3.0, 10.0])
def test_ground_effect_is_cheeseman_bennett_held_below_half_a_radius(z_over_rho):
    """T_IGE / T_OGE = 1 / (1 − (ρ/4z)²) at the height z above ground_z, held at z = ρ/2 below."""
    rho = 0.12
    p = _bare(rotor_radius=rho, gravity=0.0).replace(ground_z=jnp.asarray(0.4, F64))
    w = _hover_speeds()
    d = qj.derivative(p, _state(p, position=[0.0, 0.0, 0.4 + z_over_rho * rho]), w)
    gain = 1.0 / (1.0 - (1.0 / (4.0 * max(z_over_rho, 0.5))) ** 2)
    np.testing.assert_allclose(d.velocity[2] * p.mass / (p.k_f * jnp.sum(w ** 2)), gain, rtol=1e-13)
    assert gain <= 4 / 3 and (z_over_rho < 3 or gain < 1.01)


def test_ground_effect_lets_a_grounded_vehicle_lift_off_sooner():
    """Rotors at 90 % of the weight out of ground effect: with ρ = 0.2 m the gain at the ground
    (held at z = ρ/2: 4/3) lifts the vehicle; without it, it stays put."""
    p = qj.presets.rp1(dtype=F64)
    w = qj.hover_rotor_speed(p) * np.sqrt(0.9)
    s = qj.QuadState.create(rotor_speeds=w, on_ground=1.0, dtype=F64)
    for radius, lifts in ((0.0, False), (0.2, True)):
        q = p.replace(rotor_radius=jnp.asarray(radius, F64))
        after = qj.rk4_step(q, s, w, 0.01)
        assert (float(after.on_ground) == 0.0) == lifts and (float(after.position[2]) > 0) == lifts
        np.testing.assert_array_equal(ground_contact(q, s, after).on_ground, after.on_ground)


# --- off means off, bit for bit -------------------------------------------------------------------

_NEUTRAL = {  # each effect's function replaced by what it gives when its parameter is off
    "inflow_thrust_change_c": lambda params, rotor_speeds, axial: tuple(0.0 * w for w in rotor_speeds),
    "_ground_gain": lambda rho, height: 1.0,
    "rotor_drag_c": lambda params, v_b, rotor_speeds: ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0)),
    "rotor_reaction_moment_c": lambda params, acc: (0.0, 0.0, 0.0),
    "blade_flapping_moment_c": lambda params, v_b, rotor_speeds: (0.0, 0.0, 0.0),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_preset_has_every_effect_off_and_off_is_bit_identical_to_without(dtype, monkeypatch):
    """The presets keep each effect at its off value, and the model at the off values equals, bit
    for bit, the model with every effect computed (no gate: what the derivatives run) and the model
    with each effect's function cut out (and the symmetric lag with the spin-down branch cut out):
    switching an effect off is exact, so every preset is unchanged."""
    rng = np.random.default_rng(3)
    cases = []
    for name in ("rp1", "crazyflie21", "crazyflie21_brushless", "iris", "c4dynamics_reference", "cmu_plus"):
        p = qj.presets.get(name, dtype=dtype)
        assert float(p.motor_tau_down_ratio) == 1.0
        for field in ("rotor_reaction_inertia", "rotor_drag", "blade_flapping", "k_inflow", "rotor_radius"):
            assert float(getattr(p, field)) == 0.0, (name, field)
        s = qj.hover_state(p, position=(0.0, 0.0, float(rng.uniform(0.0, 2.0))))
        s = s.replace(velocity=jnp.asarray(rng.uniform(-3, 3, 3), dtype),
                      body_rates=jnp.asarray(rng.uniform(-2, 2, 3), dtype))
        u = qj.hover_rotor_speed(p) * jnp.asarray(rng.uniform(0.8, 1.2, p.num_rotors), dtype)
        cases.append((p, s, u))

    def run():
        return [(qj.derivative(p, s, u), rk4_step_xla(p, s, u, jnp.asarray(0.004, dtype))) for p, s, u in cases]

    gated = run()
    monkeypatch.setattr(quad, "gated", lambda on, term, off_value, *args, **_: term(*args))
    computed = run()
    for name, neutral in _NEUTRAL.items():
        monkeypatch.setattr(quad, name, neutral)
    monkeypatch.setattr(quad, "_spin_down_c", lambda params, rotor_speeds, command: (False,) * len(rotor_speeds))
    without = run()
    for a, b, c in zip(*(jax.tree_util.tree_leaves(x) for x in (gated, computed, without))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
        np.testing.assert_array_equal(np.asarray(b), np.asarray(c))


def test_the_effects_are_checked_at_the_boundary():
    """A negative coefficient or a non-positive spin-down ratio is refused by name."""
    base = dict(mass=1.0, inertia=(0.01, 0.01, 0.02), rotor_positions=qj.presets.quad_x_positions(0.2),
                rotor_spins=(1, 1, -1, -1), k_f=1e-5, k_m=0.01, omega_max=1000.0)
    for field, bad in (("motor_tau_down_ratio", 0.0), ("rotor_reaction_inertia", -1e-6), ("rotor_drag", -1.0),
                       ("blade_flapping", np.inf),
                       ("k_inflow", np.nan), ("rotor_radius", -0.1)):
        with pytest.raises(ValueError, match=f"QuadParams.{field}"):
            qj.QuadParams.create(**base, **{field: bad})


# --- identifiable on synthetic flights with a known truth ---------------------------------------------

def _flights(p, n, steps, seed, altitudes=(10.0,), noise=None, **state):
    """n open-loop flights under multisine rotor commands from random states (quadjax.sysid.synthetic),
    starting at the given altitudes in turn."""
    from quadjax.sysid import excitation, random_state, simulate_log

    rng = np.random.default_rng(seed)
    return [simulate_log(p, random_state(p, rng, altitude=altitudes[i % len(altitudes)], **state),
                         excitation(p, steps, 0.01, seed=100 * seed + i), 0.01, noise=noise, seed=i,
                         name=f"flight{i}") for i in range(n)]


def test_the_lag_asymmetry_reaction_torque_h_force_flapping_and_inflow_are_recovered():
    """A Crazyflie-sized truth with all five on (spin-down 1.8× slower, I_a = 2e-4 J_zz, an H-force
    of 5 % of the weight per m/s at hover, a flapping moment of that force at 2 cm, 5 % of hover
    thrust lost per m/s of inflow); the fit starts 30–50 % off on each, and k_f and τ are fitted
    beside them: each within 1 %."""
    from quadjax.sysid import LossWeights, fit

    p = qj.presets.crazyflie21_brushless(dtype=F64).replace(motor_tau=jnp.asarray(0.045, F64))
    w_h = float(jnp.mean(qj.hover_rotor_speed(p)))
    truth = {"motor_tau_down_ratio": 1.8, "rotor_reaction_inertia": 2e-4 * float(p.inertia[2, 2]),
             "rotor_drag": 0.05 * float(p.mass * p.gravity) / (4 * w_h),
             "blade_flapping": 0.02 * 0.05 * float(p.mass * p.gravity) / (4 * w_h), "k_inflow": 0.05 * float(p.k_f) * w_h}
    true_p = p.replace(**{k: jnp.asarray(v, F64) for k, v in truth.items()})
    start = p.replace(k_f=p.k_f * 1.1, motor_tau=p.motor_tau * 0.8,
                      **{k: jnp.asarray(v * f, F64) for (k, v), f in zip(truth.items(), (0.7, 1.5, 0.6, 1.5, 1.4))})
    names = "k_f,motor_tau," + ",".join(truth)
    result = fit(_flights(true_p, 12, 40, seed=5), names, start, inputs="commands", horizon=20,
                 weights=LossWeights(rotor_speeds=5.0), adam_steps=50, lbfgs_steps=300)
    want = np.array([float(true_p.k_f), float(true_p.motor_tau), *truth.values()])
    rel = result.values / want - 1
    assert np.all(np.abs(result.start / want - 1) >= 0.09)
    assert np.all(np.abs(rel) < 1e-2), dict(zip(result.labels, rel))
    assert not result.uncertainty.unidentifiable


def test_the_ground_effect_is_recovered_from_low_flights_and_flagged_from_high_ones():
    """Flights starting 7–30 cm above the ground identify a 4 cm rotor radius from a 30 % low start
    (within 2 %); the same fit on flights at 10 m, where the gain is below 2e-6, flags it as
    unidentifiable. (Thrust gain and k_f trade off at one height: the heights tell them apart.)"""
    import warnings

    from quadjax.sysid import LossWeights, UnidentifiableWarning, fit

    p = qj.presets.crazyflie21_brushless(dtype=F64)
    true_p = p.replace(rotor_radius=jnp.asarray(0.04, F64))
    start = p.replace(rotor_radius=jnp.asarray(0.028, F64))
    settings = dict(horizon=10, adam_steps=30, lbfgs_steps=200, inputs="commands")
    calm = dict(speed=0.1, tilt=0.05, rate=0.3)
    low = fit(_flights(true_p, 12, 20, seed=6, altitudes=(0.07, 0.1, 0.15, 0.3), **calm), "rotor_radius", start,
              **settings)
    assert abs(low.values[0] / 0.04 - 1) < 2e-2, low.values
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        noise = dict(position=1e-3, velocity=5e-3, attitude=2e-3, body_rates=1e-2, rotor_speeds=2.0)
        high = fit(_flights(true_p, 12, 20, seed=6, noise=noise, **calm), "rotor_radius", start,
                   weights=LossWeights(position=1e-3, velocity=5e-3, attitude=2e-3, body_rates=1e-2), **settings)
    assert any(issubclass(c.category, UnidentifiableWarning) for c in caught)
    assert "rotor_radius" in high.uncertainty.unidentifiable


# --- the logs' own signals: k_f from the IMU ----------------------------------------------------------

def test_k_f_from_the_specific_force_of_synthetic_flights():
    """The synthetic logs' IMU reads v̇ + g e_z; the line through the origin of m f_b,z on Σωᵢ² gives
    k_f to 1e-9 without body z drag, and k_f within its reported std (× 4) with IMU noise."""
    from quadjax.sysid import k_f_from_specific_force

    p = qj.presets.crazyflie21_brushless(dtype=F64).replace(drag_linear=jnp.asarray([0.01, 0.012, 0.0], F64))
    logs = _flights(p, 4, 60, seed=8)
    exact = k_f_from_specific_force(logs, float(p.mass))
    assert abs(exact.k_f / float(p.k_f) - 1) < 1e-9 and exact.rows == 4 * 61
    noisy = k_f_from_specific_force(_flights(p, 4, 60, seed=8, noise={"specific_force": 0.05}), float(p.mass))
    assert abs(noisy.k_f - float(p.k_f)) < 4 * noisy.std and noisy.std > 0
    assert noisy.residual_rms == pytest.approx(float(p.mass) * 0.05, rel=0.15)


def test_k_f_from_the_specific_force_of_the_nanodrone_flights():
    """On the benchmark's training flights it reproduces the data README's least-squares value,
    3.7178e-8 N/(rad/s)², with a 0.013 N residual."""
    from quadjax.logs import NANODRONE_TRAIN, load_nanodrone, nanodrone_dir
    from quadjax.sysid import k_f_from_specific_force

    folder = nanodrone_dir()
    if folder is None or not (folder / f"{NANODRONE_TRAIN[0]}.parquet").is_file():
        pytest.skip("nano-drone flights not present")
    fit = k_f_from_specific_force([load_nanodrone(folder / f"{n}.parquet") for n in NANODRONE_TRAIN], 0.045)
    assert fit.k_f == pytest.approx(3.7178e-8, rel=1e-4) and fit.residual_rms < 0.015


def test_gated_tangents_equal_the_full_ones_with_each_effect_on_or_off():
    """Within ``gated_tangents`` (what the native kernels' derivatives with the parameters fixed are
    generated from) an effect's tangents are gated as its values are where its coefficients are not
    differentiated: off, they are its off form's, on, its term's. Both equal the full jvp to
    rounding, one RK4 step of six vehicles whose effects are each on or off; with the parameters
    differentiated the full jvp runs in either case (d/dk at k = 0 is not the off form's)."""
    from quadjax._components import gated_tangents
    from tests.helpers import varied_fleet

    fleet = varied_fleet(4, 6, jnp.float64, seed=11)

    def jvp(p, s, u, dt, ds, du, dp=None):
        if dp is None:  # the parameters fixed: a symbolic zero tangent
            return jax.jvp(lambda s, u: rk4_step_xla(p, s, u, dt), (s, u), (ds, du))[1]
        return jax.jvp(lambda p, s, u: rk4_step_xla(p, s, u, dt), (p, s, u), (dp, ds, du))[1]

    def gated(*args):
        with gated_tangents():
            return jvp(*args)

    full, inside = jax.jit(jvp), jax.jit(gated)
    assert "cond" in str(jax.make_jaxpr(gated)(*fleet[0], *fleet[0][1:3]))  # the gate is there
    assert "cond" not in str(jax.make_jaxpr(jvp)(*fleet[0], *fleet[0][1:3]))
    rng = np.random.default_rng(3)
    ons = []
    for p, s, u, dt in fleet:
        ds = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=jnp.shape(x)) * 1e-2, x.dtype), s)
        du = jnp.asarray(rng.normal(size=u.shape), u.dtype)
        dp = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=jnp.shape(x)) * 1e-3, x.dtype), p)
        for a, b in ((inside(p, s, u, dt, ds, du), full(p, s, u, dt, ds, du)),
                     (inside(p, s, u, dt, ds, du, dp), full(p, s, u, dt, ds, du, dp))):
            for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
                np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12 * (1 + float(jnp.max(jnp.abs(y)))))
        ons.append(float(p.k_inflow) != 0)
    assert any(ons) and not all(ons)  # the fleet has the effect both ways


def test_the_tangent_step_with_the_parameters_fixed_multiplies_nothing_by_zero():
    """A gate's jvp holds the arguments whose tangents are symbolic zeros (the parameters, fixed)
    instead of differentiating arrays of zeros: the generated tangent step then computes no term of
    the parameters' tangent as zero times a value (it had 77 such products a step, and the sums that
    carried them). A step with a tangent made of zeros has them: the test sees them where they are.
    That the tangents are right is the native suites' and the gated test's above."""
    from quadjax import native
    from quadjax.native import generate

    ex = native.step_example(4, np.dtype(np.float32))
    pushed = {n: v if n == "P" else (v, v) for n, v in ex.items()}

    def products_by_zero(step) -> list:
        source = generate.generate_kernel(step, pushed, carry="S", invariant=("P",), namespace="t", lanes=16,
                                          reciprocals=True).source
        body = source.split("static inline void step(", 1)[1]  # the prologue's hoisted products are the values'
        zero = r"\(\(-?0x0\.0p\+0f\) - V\{\}\)"
        return re.findall(rf"{zero} \*|\* {zero}|qj_vf\w+\({zero}|qj_vf\w+\([^,()]+, {zero}", body)

    def windless(P, S, U, Wd, E):  # the wind's tangent an array of zeros
        return jax.jvp(functools.partial(native.kernel_step, P), (S[0], U[0], Wd[0], E[0]),
                       (S[1], U[1], jnp.zeros_like(Wd[0]), E[1]))

    assert products_by_zero(windless)
    assert products_by_zero(native.tangent_step_fixed) == []
