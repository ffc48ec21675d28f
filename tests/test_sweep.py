"""Monte Carlo sweeps (#6): determinism, chunking, kill-and-resume, streaming quantiles,
crashes instead of NaNs, randomisation, gusts, configuration and its errors.

The sweeps here share one compilation (blocks of 16 vehicles): sweeps that differ only in
numbers (seed, distribution bounds, vehicle count, chunk size) reuse it.
"""

import functools
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import sweep
from quadjax.cli import main as cli_main
from quadjax.sweep import config as cfg
from quadjax.sweep import gusts as G
from quadjax.sweep import randomise as R
from quadjax.sweep import stats as S

REPO = Path(__file__).resolve().parents[1]
F32 = jnp.float32

from tests.helpers import SMALL_SWEEP, small_sweep as small


def assert_results_equal(a, b):
    """Bit-for-bit equality of two sweeps' per-vehicle arrays, histograms and trajectories."""
    assert a.vehicles.keys() == b.vehicles.keys()
    for k in a.vehicles:
        assert a.vehicles[k].dtype == b.vehicles[k].dtype, k
        np.testing.assert_array_equal(a.vehicles[k], b.vehicles[k], err_msg=k)
    np.testing.assert_array_equal(a.counts, b.counts)
    for k in a.trajectories:
        np.testing.assert_array_equal(a.trajectories[k], b.trajectories[k], err_msg=k)
    strip = lambda s: {k: v for k, v in s.items() if k != "timings_s"}  # noqa: E731
    assert strip(a.summary) == strip(b.summary)


@pytest.fixture(scope="module")
def base():
    return sweep.run_sweep(small())


# --- the four claims of the issue -------------------------------------------------------------


def test_same_seed_gives_identical_statistics_and_another_seed_does_not(base):
    again = sweep.run_sweep(small())
    assert_results_equal(base, again)
    other = sweep.run_sweep(small(seed=1))
    assert not np.array_equal(other.vehicles["param_mass"], base.vehicles["param_mass"])
    assert not np.array_equal(other.vehicles["rms_error"], base.vehicles["rms_error"])
    # the sweep flew: every vehicle finished, tracking the figure-8 to centimetres
    assert base.summary["crashed"] == 0
    assert 0.005 < base.summary["rms_error_m"]["p50"] < 0.3


def test_chunked_equals_unchunked_bit_for_bit(base):
    chunked = sweep.run_sweep(small(chunk_size=16))
    assert_results_equal(base, chunked)


def test_streaming_quantiles_agree_with_exact_ones_within_documented_error(base):
    h = base.config.histogram
    tr = base.trajectories
    assert len(tr["index"]) == base.config.vehicles  # every vehicle kept, every tick
    samples = tr["error"][tr["alive"]]
    # the histogram counted exactly these samples, no more, no fewer
    bins = np.asarray(h.index(jnp.asarray(samples)))
    np.testing.assert_array_equal(np.bincount(bins, minlength=h.num_bins), base.counts)
    qs = np.array([0.001, 0.01, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999])
    estimate = h.quantiles(base.counts, qs)
    exact = S.exact_quantiles(samples, qs)
    assert np.all(np.abs(estimate / exact - 1.0) <= h.relative_error * (1 + 1e-5)), (estimate, exact)


def test_histogram_quantiles_bound_on_a_wide_distribution():
    h = S.ErrorHistogram(minimum=1e-4, bins_per_decade=32, decades=6)
    rng = np.random.default_rng(0)
    x = np.exp(rng.normal(np.log(0.05), 2.0, 200_000))  # spans every decade, with under/overflow
    counts = np.bincount(np.asarray(h.index(jnp.asarray(x))), minlength=h.num_bins)
    assert counts.sum() == x.size and counts[0] > 0 and counts[-1] > 0
    qs = np.concatenate([[0.0002, 0.0005], np.linspace(0.01, 0.99, 99)])
    est, exact = h.quantiles(counts, qs), S.exact_quantiles(x, qs)
    inside = (exact >= h.minimum) & (exact < h.maximum)
    assert np.all(np.abs(est[inside] / exact[inside] - 1) <= h.relative_error * (1 + 1e-6))
    below = exact < h.minimum
    assert below.any() and np.all(np.abs(est[below] - exact[below]) <= h.minimum / 2)
    # the bound is tight: the worst case uses most of it
    assert np.max(np.abs(est[inside] / exact[inside] - 1)) > 0.5 * h.relative_error


def _assert_no_nan(r):
    for k, x in r.vehicles.items():
        if np.issubdtype(x.dtype, np.floating):
            assert np.all(np.isfinite(x)), k
    json.dumps(r.summary, allow_nan=False)  # no NaN anywhere in the report
    assert r.summary["rms_error_m"]["p50"] is None  # nothing finished: no error statistics, not NaN


def test_kept_trajectories_hold_the_flown_state(base):
    """The kept vehicles' per-tick state (for the plots and the trace player) is the flight's:
    its last sample gives the per-vehicle final error and energy, the attitude is a unit
    quaternion, and the mixer's saturation report is a code in {−1, 0, +1}."""
    tr, v = base.trajectories, base.vehicles
    rows, T = tr["index"], base.config.num_ticks
    assert set(tr) == {"index", "time", "reference"} | {name for name, _, _ in sweep.runner.KEPT}
    assert tr["attitude"].shape == (48, T, 4) and tr["rotor_speeds"].shape == (48, T, 4)
    assert tr["saturation"].dtype == np.int8 and set(np.unique(tr["saturation"])) <= {-1, 0, 1}
    np.testing.assert_allclose(np.linalg.norm(tr["attitude"], axis=-1), 1.0, atol=1e-5)
    assert v["crash_code"][rows].max() == 0
    np.testing.assert_allclose(tr["error"][:, -1], v["final_error"][rows], rtol=1e-6)
    np.testing.assert_allclose(tr["energy"][:, -1], v["energy"][rows], rtol=1e-6)
    # the hover speed makes the weight: rotor speeds sit within 30 % of it through a gentle figure-8
    hover = float(qj.hover_rotor_speed(qj.presets.get(base.config.preset)).mean())
    assert 0.7 * hover < np.median(tr["rotor_speeds"]) < 1.3 * hover


def test_unstable_configuration_is_reported_as_crashes_not_nans():
    # mirrored arms (a wiring error): every roll/pitch correction pushes the wrong way, a
    # closed-loop instability that tips every vehicle over within a fraction of a second
    mirrored = small(**{"randomise.rotor_positions": {"dist": "uniform", "low": -1.01, "high": -0.99, "mode": "scale"}})
    r = sweep.run_sweep(mirrored)
    assert r.summary["crashed"] == r.summary["vehicles"] == 48 and r.summary["crash_rate"] == 1.0
    assert r.summary["crash_causes"] == {"tilt": 48}
    assert np.all((r.vehicles["crash_tick"] >= 2) & (r.vehicles["crash_tick"] < mirrored.num_ticks // 2))
    assert np.all(np.degrees(r.vehicles["max_tilt"]) > 60)  # it tipped over before the limit
    _assert_no_nan(r)
    # a kept trajectory (what the trace player shows) stops where the vehicle stopped: from the
    # tick the crash was seen in, it holds the state going into that tick
    tr = r.trajectories
    for k, i in enumerate(tr["index"]):
        c = int(r.vehicles["crash_tick"][i])
        assert tr["alive"][k, :c - 1].all() and not tr["alive"][k, c - 1:].any()
        for name in ("position", "attitude", "body_rates", "rotor_speeds", "energy"):
            frozen = tr[name][k, c - 1:]
            np.testing.assert_array_equal(frozen, np.broadcast_to(tr[name][k, c - 2], frozen.shape), err_msg=name)
    # inertia 10⁹× too small with the tilt and distance limits off: the state overflows to
    # non-finite values in the first tick; reported as such, the NaN kept out of every figure
    blown = small(**{"randomise.inertia": {"dist": "uniform", "low": 1e-9, "high": 2e-9, "mode": "scale"},
                     "crash.max_tilt_deg": 180.0, "crash.max_error": 900.0})
    r = sweep.run_sweep(blown)
    assert r.summary["crash_causes"] == {"non_finite": 48} and r.summary["violations"] == 48
    assert np.all(r.vehicles["crash_tick"] == 1)
    _assert_no_nan(r)


def test_kill_mid_sweep_then_resume_equals_uninterrupted(tmp_path):
    settings = dict(SMALL_SWEEP, vehicles=160, chunk_size=16)
    path = tmp_path / "sweep.toml"
    path.write_text(cfg.to_toml(cfg.merge(cfg.DEFAULTS, settings)))
    out = tmp_path / "res"
    # the subprocesses fly on two (virtual CPU) devices, each from its own thread, the reference
    # here on one
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip())
    command = [sys.executable, "-m", "quadjax.cli", "sweep", "--config", str(path), "--out", str(out), "--no-plots"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chunks = out / "chunks"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if chunks.is_dir() and len(list(chunks.glob("chunk_*.npz"))) >= 2:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    manifest = json.loads((out / "manifest.json").read_text())
    written = len(list(chunks.glob("chunk_*.npz")))
    assert not manifest["complete"] and 2 <= written < manifest["num_chunks"]

    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming with" in resumed.stderr and "on 2 device(s)" in resumed.stderr
    assert json.loads((out / "manifest.json").read_text())["complete"]

    reference = sweep.run_sweep(cfg.from_dict(settings))
    with np.load(out / "vehicles.npz") as z:
        assert sorted(z.files) == sorted(reference.vehicles)
        for k in z.files:
            np.testing.assert_array_equal(z[k], reference.vehicles[k], err_msg=k)
    assert np.array_equal(np.asarray(reference.vehicles["vehicle_index"]), np.arange(160))  # none lost, none twice
    with np.load(out / "trajectories.npz") as z:
        for k in z.files:
            np.testing.assert_array_equal(z[k], reference.trajectories[k], err_msg=k)
    summary = json.loads((out / "summary.json").read_text())
    strip = lambda s: {k: v for k, v in s.items() if k != "timings_s"}  # noqa: E731
    assert strip(summary) == json.loads(json.dumps(strip(reference.summary)))


# --- randomisation ----------------------------------------------------------------------------


_draw = jax.jit(lambda nominal, values, keys, spec: jax.vmap(
    lambda k: R.sample_valid_params(nominal, spec, values, k))(keys), static_argnums=3)


def _draw_many(spec, n=20_000, dtype=F32):  # one n everywhere: one compilation per skeleton
    """n vehicles' parameters; the spec's numbers are traced, so specs with one skeleton share
    one compilation."""
    nominal = qj.presets.rp1(dtype=dtype)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(0), i))(jnp.arange(n))
    return nominal, _draw(nominal, spec.values(dtype), keys, spec.skeleton())


def _spec(mass=(0.9, 1.1)):
    """One skeleton for the distribution tests: every distribution, mode and draw shape."""
    return R.RandomSpec((
        R.Perturbation("mass", "uniform", *mass, "scale"),
        R.Perturbation("inertia", "uniform", 0.96, 1.04, "scale", per_element=True),
        R.Perturbation("k_m", "lognormal", math.log(0.02), 0.1, "absolute"),
        R.Perturbation("drag_linear", "uniform", 0.8, 1.2, "scale"),
        R.Perturbation("wind", "normal", 0.0, 2.0, "offset", per_element=True),
    ))


def test_distributions_modes_and_per_element_draws():
    nominal, (p, ok) = _draw_many(_spec())
    assert bool(ok.all())
    # mass: relative ±10 %, i.e. p₀ · U(0.9, 1.1)
    x = np.asarray(p.mass / nominal.mass, np.float64)
    assert x.min() >= 0.9 - 1e-6 and x.max() <= 1.1 + 1e-6
    assert abs(x.mean() - 1.0) < 0.002 and abs(x.std() - 0.2 / math.sqrt(12)) < 0.002
    assert abs(np.mean(x < 0.95) - 0.25) < 0.015
    # a shared draw scales the whole (3,) leaf by one factor
    d = np.asarray(p.drag_linear / nominal.drag_linear)
    np.testing.assert_allclose(d[:, 1], d[:, 0], rtol=1e-6)
    assert d.min() >= 0.8 - 1e-6 and d.max() <= 1.2 + 1e-6
    # an untouched field stays the nominal
    np.testing.assert_array_equal(np.asarray(p.k_f), np.full(x.shape, float(nominal.k_f), np.float32))
    # log-normal: median e^μ, σ of the log
    km = np.asarray(p.k_m, np.float64)
    assert abs(np.median(km) / 0.02 - 1) < 0.01 and abs(np.std(np.log(km)) - 0.1) < 0.003
    # normal offset, per element: independent N(0, 2²) on each wind axis
    wind = np.asarray(p.wind, np.float64)
    assert np.all(np.abs(wind.mean(0)) < 0.05) and np.all(np.abs(wind.std(0) - 2.0) < 0.05)
    assert abs(np.corrcoef(wind[:, 0], wind[:, 1])[0, 1]) < 0.03
    # inertia per principal axis (rp1's Izz is close to Ixx + Iyy: wider independent spreads
    # break the triangle inequality, see the next test); J stays symmetric
    J, J0 = np.asarray(p.inertia, np.float64), np.asarray(nominal.inertia, np.float64)
    np.testing.assert_allclose(J, np.swapaxes(J, 1, 2), rtol=1e-6)
    ratios = J[:, [0, 1, 2], [0, 1, 2]] / np.diag(J0)
    assert ratios.min() >= 0.96 - 1e-6 and ratios.max() <= 1.04 + 1e-6
    assert abs(np.corrcoef(ratios[:, 0], ratios[:, 1])[0, 1]) < 0.03


def test_invalid_draws_are_flagged_and_replaced_by_the_nominal_vehicle():
    nominal, (p, ok) = _draw_many(_spec(mass=(-1.0, 1.0)))  # half the masses negative
    ok = np.asarray(ok)
    assert abs(ok.mean() - 0.5) < 0.02
    m = np.asarray(p.mass)
    assert np.all(m[ok] > 0) and np.all(m[~ok] == np.float32(nominal.mass))
    assert bool(np.all(np.asarray(jax.jit(qj.params_valid)(p))))


def test_consistency_options_keep_inertia_per_mass_and_thrust_to_weight():
    spec = R.RandomSpec((R.Perturbation.relative("mass", 0.1), R.Perturbation.relative("k_f", 0.2)),
                        inertia_with_mass=True, keep_thrust_to_weight=True)
    nominal, (p, ok) = _draw_many(spec)
    m = np.asarray(p.mass, np.float64)
    np.testing.assert_allclose(np.asarray(p.inertia) / m[:, None, None],
                               np.broadcast_to(np.asarray(nominal.inertia) / float(nominal.mass), (m.size, 3, 3)),
                               rtol=1e-6)
    twr = np.asarray(p.k_f * p.omega_max**2 / (p.mass * p.gravity), np.float64)
    twr0 = float(nominal.k_f * nominal.omega_max**2 / (nominal.mass * nominal.gravity))
    np.testing.assert_allclose(twr, twr0, rtol=1e-5)
    assert np.std(np.asarray(p.omega_max)) > 0
    # a field's draws do not depend on which other fields vary (they come from its own key)
    _, (q, _) = _draw_many(_spec())
    np.testing.assert_array_equal(np.asarray(p.mass), np.asarray(q.mass))


def test_small_rotation_matches_axis_angle_and_is_exact_at_zero():
    delta = np.array([0.3, -0.2, 0.5])
    theta = np.linalg.norm(delta)
    rot = jax.jit(R.small_rotation)
    np.testing.assert_allclose(rot(delta), qj.quaternion.quat_from_axis_angle(delta / theta, theta),
                               rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(rot(np.zeros(3)), [1.0, 0.0, 0.0, 0.0])
    grad = jax.jit(jax.jacobian(R.small_rotation))(np.zeros(3))
    np.testing.assert_array_equal(grad, np.vstack([np.zeros(3), 0.5 * np.eye(3)]))  # d/dδ (1, δ/2)


def test_initial_state_sits_on_the_reference_with_the_vehicles_own_hover_speed():
    p = qj.presets.iris(dtype=jnp.float64).replace(mass=jnp.asarray(1.7))
    ref = qj.control.Figure8(center=jnp.asarray([1.0, 2.0, 3.0]), a=jnp.asarray(2.0), b=jnp.asarray(1.0),
                             omega=jnp.asarray(0.5), yaw=jnp.asarray(0.4))
    spread = R.InitialSpread.create(dtype=jnp.float64)
    s = jax.jit(R.initial_state)(p, ref, spread, jnp.ones((4, 3)))
    r0 = jax.jit(lambda r, t: r(t))(ref, 0.0)
    np.testing.assert_allclose(s.position, r0.position)
    np.testing.assert_allclose(s.velocity, r0.velocity)
    np.testing.assert_allclose(s.attitude, [math.cos(0.2), 0, 0, math.sin(0.2)], rtol=1e-14)
    np.testing.assert_allclose(s.rotor_speeds, jax.jit(qj.hover_rotor_speed)(p))
    assert int(jax.jit(qj.state_violation)(p, s)) == 0


# --- gusts -----------------------------------------------------------------------------------


def test_ou_gusts_have_the_stationary_std_and_exponential_autocorrelation():
    g = G.Gusts.create(sigma=(1.0, 2.0, 0.5), tau=(0.5, 0.5, 2.0), dtype=jnp.float64)
    rng = np.random.default_rng(1)
    n, steps, h = 4000, 50, 0.02
    step = jax.jit(jax.vmap(lambda w, xi: G.gust_step(g, w, xi, h)))
    w = jax.vmap(lambda xi: G.gust_init(g, xi))(jnp.asarray(rng.standard_normal((n, 3))))
    w0 = np.asarray(w)
    for _ in range(steps):
        w = step(w, jnp.asarray(rng.standard_normal((n, 3))))
    w = np.asarray(w)
    np.testing.assert_allclose(w.std(0), [1.0, 2.0, 0.5], rtol=0.05)
    lag = steps * h
    for axis, tau in enumerate((0.5, 0.5, 2.0)):
        rho = np.corrcoef(w0[:, axis], w[:, axis])[0, 1]
        assert abs(rho - math.exp(-lag / tau)) < 0.05, (axis, rho)  # 3 standard errors


def test_ou_step_without_noise_decays_exactly():
    g = G.Gusts.create(sigma=1.0, tau=0.7, dtype=jnp.float64)
    w = jnp.asarray([1.0, -2.0, 0.5])
    for _ in range(10):
        w = G.gust_step(g, w, jnp.zeros(3), 0.1)
    np.testing.assert_allclose(w, np.array([1.0, -2.0, 0.5]) * math.exp(-1.0 / 0.7), rtol=1e-13)


def test_bad_gust_values_raise():
    with pytest.raises(ValueError, match="gusts.tau"):
        G.Gusts.create(tau=(1.0, 0.0, 1.0))


# --- configuration and the command line --------------------------------------------------------


def test_defaults_round_trip_through_toml():
    import tomllib

    c = cfg.from_dict({})
    again = cfg.from_dict(tomllib.loads(cfg.to_toml(c.resolved)))
    assert again == c and again.resolved == c.resolved
    assert c.num_ticks == 2500 and c.vehicles == 4096
    assert [p.field for p in c.random.perturbations] == ["mass", "inertia", "k_f", "motor_tau"]


@pytest.mark.parametrize("user,needle", [
    ({"missoin": {"duration": 3}}, "unknown key 'missoin'"),
    ({"mission": {"duration": -1.0}}, "mission.duration = -1.0: must be > 0"),
    ({"mission": {"duration": 1.003}}, "whole number of control ticks"),
    ({"randomise": {"mass": {"spread": 1.5}}}, "randomise.mass.spread = 1.5"),
    ({"randomise": {"mass": {"dist": "gaussian"}}}, "choose one of relative, uniform, normal, lognormal"),
    ({"randomise": {"rotor_spins": {"dist": "relative", "spread": 0.1}}}, "randomise.rotor_spins"),
    ({"trajectory": {"kind": "spiral"}}, "trajectory.kind = \"spiral\": choose one of"),
    ({"gusts": {"sigma": [1, 2]}}, "gusts.sigma"),
    ({"vehicle": {"preset": "f16"}}, "vehicle.preset"),
    ({"vehicles": 10.5}, "vehicles = 10.5: expected an integer"),
])
def test_bad_config_gives_one_line_error_naming_the_key(user, needle):
    with pytest.raises(ValueError) as err:
        cfg.from_dict(user)
    message = str(err.value)
    assert needle in message and "\n" not in message


def test_switching_trajectory_kind_starts_from_its_defaults():
    c = cfg.from_dict({"trajectory": {"kind": "circle", "radius": 3.0}})
    assert c.trajectory == {"kind": "circle", "center": [0.0, 0.0, 2.0], "radius": 3.0, "period": 8.0, "yaw": 0.0}
    c = cfg.from_dict({"randomise": {"mass": {"dist": "none"}, "k_f": {"spread": 0.2}}})
    assert [p.field for p in c.random.perturbations] == ["inertia", "k_f", "motor_tau"]
    assert c.random.perturbations[1].b == pytest.approx(1.2)


def test_cli_errors_are_one_line_and_print_config_is_loadable(capsys, tmp_path):
    assert cli_main(["sweep", "--set", "mission.duration=-2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("quadjax sweep: error: config: mission.duration") and "\n" not in err
    assert cli_main(["sweep", "--vehicles", "100", "--set", "gusts.sigma=[2, 2, 1]", "--print-config"]) == 0
    text = capsys.readouterr().out
    (tmp_path / "c.toml").write_text(text)
    c = cfg.load(tmp_path / "c.toml")
    assert c.vehicles == 100 and c.gusts["sigma"] == [2.0, 2.0, 1.0]


def test_cpu_devices_one_per_core_only_where_the_extra_compilations_pay(capsys, monkeypatch):
    from quadjax.sweep.cli import MANY_DEVICES_FROM, cpu_devices, whole_native_flight

    cores = len(os.sched_getaffinity(0))
    short = cfg.from_dict({"sensor_noise": {"enabled": True}})  # 4096 × 2500 = 1.0e7 vehicle-ticks, per tick
    assert not whole_native_flight(short)
    assert short.vehicles * short.num_ticks < MANY_DEVICES_FROM and cpu_devices(short) == 1
    long = cfg.from_dict({"vehicles": 16384, "sensor_noise": {"enabled": True}})  # 4.1e7
    assert long.vehicles * long.num_ticks >= MANY_DEVICES_FROM and cpu_devices(long) == cores
    whole = cfg.from_dict({"vehicles": 16384})  # the flight threads itself in the native loop: one device
    assert cpu_devices(whole) == (1 if whole_native_flight(whole) else cores)
    monkeypatch.setenv("QUADJAX_NATIVE", "0")
    assert not whole_native_flight(whole) and cpu_devices(whole) == cores
    assert cpu_devices(short, 3) == 3
    assert cli_main(["sweep", "--cpu-devices", "0"]) == 2
    assert capsys.readouterr().err.strip() == "quadjax sweep: error: --cpu-devices 0: needs at least 1"


def test_results_folder_of_another_sweep_is_not_overwritten(tmp_path):
    from quadjax.sweep.store import SweepStore

    SweepStore.open(tmp_path, config={}, config_hash="aaa", vehicles=10, chunk_size=5)
    with pytest.raises(ValueError, match="holds a different sweep"):
        SweepStore.open(tmp_path, config={}, config_hash="bbb", vehicles=10, chunk_size=5)
    store = SweepStore.open(tmp_path, config={}, config_hash="bbb", vehicles=10, chunk_size=5, overwrite=True)
    assert store.manifest["config_hash"] == "bbb" and store.completed() == []


def test_sweep_equals_the_engine_closed_loop():
    """The sweep flies each vehicle through qj.simulate. (1) Its chunks, blocks, devices, store
    and aggregation change nothing: calling the engine on the sweep's own vehicle definition
    (``fly_vehicle``: the flight stack as controller, the crash rules as hook) gives every
    per-vehicle figure to the last bit. (2) A user who draws the same vehicle with the public
    randomisation functions and flies the PID through the engine gets the same flight to
    rounding: XLA compiles that other program's controller with other fusions (FMA
    contraction differs in the last bit), so there it is ≤ 1e-6 relative, not bitwise."""
    from quadjax import control as C

    conf = small(vehicles=8, chunk_size=8, block_size=8, keep_trajectories=0, mission={"duration": 0.4},
                 gusts={"enabled": False}, sensor_noise={"enabled": False})
    swept = sweep.run_sweep(conf)
    static, values = sweep.runner.prepare(conf)
    index = jnp.arange(8, dtype=jnp.int32)
    # values traced, as the sweep passes them (closed over, XLA would fold them as constants)
    out, samples, _ = jax.jit(lambda v, i: qj.map_vehicles(
        lambda j: sweep.runner.fly_vehicle(static, v, j), (i,), (0,)))(values, index)
    for k, x in out.items():
        np.testing.assert_array_equal(np.asarray(x), swept.vehicles[k], err_msg=k)
    samples = np.asarray(samples)  # each tick's error while flying (the histogram's samples), −1 after
    flying = samples >= 0
    assert flying.sum() == swept.vehicles["samples"].sum() == conf.num_ticks * 8
    counts = np.bincount(np.asarray(conf.histogram.index(jnp.asarray(samples[flying]))), minlength=len(swept.counts))
    np.testing.assert_array_equal(counts, swept.counts)

    nominal = qj.presets.get(conf.preset, dtype=F32)
    reference = sweep.runner.make_reference(conf.trajectory, conf.duration, F32)
    ctrl = C.PIDController.create(nominal, reference)
    rates = C.CascadeRates(dt=conf.control_dt, position_every=conf.position_every, attitude_every=conf.attitude_every)
    spec, rand = conf.random.skeleton(), conf.random.values(F32)
    spread = R.InitialSpread.create(**conf.initial, dtype=F32)
    dt = jnp.asarray(conf.control_dt, F32)

    def fly(i):
        key = jax.random.fold_in(jax.random.PRNGKey(conf.seed), i)
        params, ok = R.sample_valid_params(nominal, spec, rand, jax.random.fold_in(key, 0))
        params = nominal.replace(**{f: getattr(params, f) for f in spec.varied_fields})
        z = R.standard_normal(R.raw_draws(jax.random.fold_in(key, 1), 15, F32))
        s0 = R.initial_state(params, reference, spread, z[:12].reshape(4, 3))
        run = qj.simulate(params, s0, dt, controller=functools.partial(C.pid_control, rates=rates), ctrl_params=ctrl,
                          ctrl_state=C.pid_init(ctrl, s0), num_ticks=conf.num_ticks,
                          config=qj.SimConfig(integrator=conf.stepper, substeps=conf.substeps, save_every=0))
        end = reference(jnp.asarray(conf.num_ticks, F32) * dt).position
        d = run.final.position - end
        return run.final.energy - s0.energy, jnp.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), run.status

    energy, final_error, status = jax.jit(lambda i: qj.map_vehicles(fly, (i,), (0,)))(index)
    assert swept.summary["crashed"] == 0 and np.all(np.asarray(status) == 0)
    np.testing.assert_allclose(np.asarray(energy), swept.vehicles["energy"], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(final_error), swept.vehicles["final_error"], rtol=1e-4, atol=1e-6)


def test_the_summary_is_the_same_on_both_backends(tmp_path):
    """The same gusty sweep flown whole in the native loop (this process) and on XLA (a child
    with QUADJAX_NATIVE=0): the same crashes, the printed table identical, every figure equal to
    rounding (the two compile the same tick to different code: not bit for bit)."""
    from quadjax import native

    conf = small(vehicles=24, chunk_size=8, block_size=8, keep_trajectories=3, mission={"duration": 1.0},
                 sensor_noise={"enabled": False})
    assert conf.gusts is not None
    if native.compiler() is None:
        pytest.skip("no C++ compiler: the native loop is unavailable")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the flight compiles whole: no fallback
        here = sweep.run_sweep(conf, tmp_path / "native", plots=False)
    assert json.loads((tmp_path / "native" / "manifest.json").read_text())["versions"]["backend"] == "native"
    (tmp_path / "c.toml").write_text(cfg.to_toml(conf.resolved))
    env = dict(os.environ, QUADJAX_NATIVE="0", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run([sys.executable, "-m", "quadjax.cli", "sweep", "--config", str(tmp_path / "c.toml"),
                           "--out", str(tmp_path / "xla"), "--no-plots"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    there = json.loads((tmp_path / "xla" / "summary.json").read_text())
    assert json.loads((tmp_path / "xla" / "manifest.json").read_text())["versions"]["backend"] == "xla"
    mine = json.loads(json.dumps(here.summary))
    mine.pop("timings_s"), there.pop("timings_s")
    assert mine["crashed"] == there["crashed"] and mine["crash_causes"] == there["crash_causes"]
    assert S.format_table(mine) == S.format_table(there)

    def numbers(d, path=""):
        for k, x in sorted(d.items()):
            if isinstance(x, dict):
                yield from numbers(x, path + k + ".")
            elif isinstance(x, (int, float)) and x is not None:
                yield path + k, float(x)

    theirs = dict(numbers(there))
    for k, x in numbers(mine):
        assert math.isclose(x, theirs[k], rel_tol=1e-4, abs_tol=1e-7), (k, x, theirs[k])
    with np.load(tmp_path / "xla" / "vehicles.npz") as z:
        np.testing.assert_allclose(here.vehicles["rms_error"], z["rms_error"], rtol=1e-4)
