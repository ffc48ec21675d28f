"""System identification: parameterisation, windows, recovery from synthetic flights, uncertainty,
identifiability, the open-loop validation protocol, fit files and the ``quadjax fit`` command.

The recovery tests share one compiled fit (same parameter names, window shapes and
settings), so the three of them pay one compilation.
"""

import json
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from quadjax import hover_rotor_speed, presets
from quadjax.quaternion import quat_angle_between
from quadjax.sysid import (
    LossWeights,
    MotorMap,
    ParamSpec,
    UnidentifiableWarning,
    excitation,
    fit,
    fit_main,
    information,
    load_fit,
    load_params,
    make_windows,
    mixer_directions,
    motor_speed_command,
    nanodrone_motor_map,
    open_loop_errors,
    random_state,
    save_fit,
    simulate_log,
)

DT = 0.01
NAMES = "k_f,k_m,inertia,motor_tau,drag_linear"  # 9 scalars
NOISE = dict(position=1e-3, velocity=5e-3, attitude=2e-3, body_rates=1e-2, rotor_speeds=2.0)
#: the fit settings every recovery test shares (one compilation)
SETTINGS = dict(inputs="commands", horizon=20, adam_steps=50, lbfgs_steps=300)


def truth():
    """Crazyflie 2.1 Brushless preset with drag and motor lag: the vehicle to recover (float64)."""
    p = presets.crazyflie21_brushless(dtype="float64")
    return p.replace(drag_linear=jnp.asarray([0.010, 0.012, 0.020]), motor_tau=jnp.asarray(0.045))


def start_guess(p):
    """Every fitted value off by 20–100 %."""
    return p.replace(
        k_f=p.k_f * 1.2, k_m=p.k_m * 0.7, inertia=p.inertia * jnp.asarray([1.3, 0.8, 1.25]),
        motor_tau=p.motor_tau * 1.4, drag_linear=p.drag_linear * jnp.asarray([2.0, 0.5, 1.5]),
    )


def true_values(p):
    return np.asarray(ParamSpec.create(NAMES, p).values(jnp.zeros(9)))


def excited_logs(p, noise=None, seed=0, n=16, steps=40):
    """n short open-loop flights from random states (±2 m/s, ±0.4 rad tilt, ±3 rad/s) under multisines."""
    rng = np.random.default_rng(seed)
    return [
        simulate_log(p, random_state(p, rng), excitation(p, steps, DT, seed=1000 * seed + i), DT,
                     noise=noise, seed=1000 * seed + i, name=f"synthetic{i}")
        for i in range(n)
    ]


# --- parameterisation -----------------------------------------------------------------


def test_spec_start_is_params0_and_positive_stays_positive():
    p = truth()
    spec = ParamSpec.create(NAMES + ",inertia_products,com_offset.y", p)
    params, mm = spec.unpack(spec.theta0())
    for name in ("k_f", "k_m", "motor_tau", "inertia", "drag_linear", "rotor_positions"):
        np.testing.assert_allclose(getattr(params, name), getattr(p, name), rtol=1e-15)
    assert spec.labels[:4] == ("k_f", "k_m", "motor_tau", "inertia.xx")
    # a large negative step in θ leaves log-parameterised values positive, affine ones move linearly
    big = spec.unpack(jnp.full(spec.size, -50.0))[0]
    assert float(big.k_f) > 0 and float(big.motor_tau) > 0 and np.all(np.diag(np.asarray(big.inertia)) > 0)
    np.testing.assert_allclose(big.inertia, np.asarray(big.inertia).T)  # products stay symmetric
    # com_offset.y = d moves every rotor hub by −d along y
    th = jnp.zeros(spec.size).at[spec.labels.index("com_offset.y")].set(1.0)
    moved = spec.unpack(th)[0].rotor_positions
    d = float(spec.values(th)[spec.labels.index("com_offset.y")])
    np.testing.assert_allclose(moved[:, 1], p.rotor_positions[:, 1] - d)
    assert d == pytest.approx(spec.scale[spec.labels.index("com_offset.y")])


def test_spec_priors_bounds_and_bad_names():
    p = truth()
    spec = ParamSpec.create("k_f,drag_linear", p, priors={"k_f": (4.0e-8, 4.0e-9)},
                            bounds={"drag_linear": (0.005, [0.02, 0.02, 0.03])})
    th = spec.theta0()
    # prior residual (θ − μ)/σ with θ = log(value/ref): log-space, relative std
    r = np.asarray(spec.prior_residuals(th))
    assert r[0] == pytest.approx((0.0 - np.log(4.0e-8 / 3.72e-8)) / 0.1)
    assert np.all(r[1:] == 0)
    clipped = spec.values(spec.project(jnp.asarray([0.0, 10.0, -10.0, 10.0])))
    np.testing.assert_allclose(clipped[1:], [0.02, 0.005, 0.03], rtol=1e-12)
    with pytest.raises(ValueError, match="cannot fit 'thrust'"):
        ParamSpec.create("thrust", p)
    with pytest.raises(ValueError, match="inertia has components"):
        ParamSpec.create("inertia.q", p)
    with pytest.raises(ValueError, match="not fitted"):
        ParamSpec.create("k_f", p, priors={"k_m": (1.0, 0.1)})
    with pytest.raises(ValueError, match="std must be > 0"):
        ParamSpec.create("k_f", p, priors={"k_f": (1.0, 0.0)})
    with pytest.raises(ValueError, match="motor_tau cannot be identified"):
        fit([], "k_f,motor_tau", p)  # refused before any data is looked at


def test_motor_map():
    u = jnp.asarray([[0.0, 0.25, 0.5, 1.0]])
    np.testing.assert_array_equal(motor_speed_command(MotorMap.identity(), u), u)
    w = motor_speed_command(nanodrone_motor_map("float64"), u)
    np.testing.assert_allclose(w, [[-530.0, 2850 * 0.5 - 530, 2850 * np.sqrt(0.5) - 530, 2320.0]])
    with pytest.raises(ValueError, match="gain"):
        MotorMap.create(gain=0.0)


# --- windows and the model's replay of a log -------------------------------------------


def test_windows_cut_rows_and_delay():
    p = truth()
    log = excited_logs(p, n=1)[0]  # 41 rows
    w = make_windows(log, 5, stride=7, inputs="commands", input_delay=1, dtype="float64")
    starts = np.arange(0, 41 - 5, 7)
    assert w.num_windows == len(starts) and w.horizon == 5
    np.testing.assert_array_equal(w.state0.position, log.position[starts])
    np.testing.assert_array_equal(w.position[1], log.position[starts[1] + 1: starts[1] + 6])
    # input k of a window at row i is row i + k − delay (clipped at the log's start)
    np.testing.assert_array_equal(w.inputs[1], log.motor_commands[starts[1] - 1: starts[1] + 4])
    np.testing.assert_array_equal(w.inputs[0, 0], log.motor_commands[0])
    with pytest.raises(ValueError, match="no motor commands"):
        make_windows(log.replace(motor_commands=None), 5, inputs="commands")


# --- recovery -------------------------------------------------------------------------------


def test_noise_free_recovery_of_nine_parameters():
    """9 parameters (k_f, k_m, J diag, τ, 3 drag) from 32 windows of 0.2 s: within 0.5 %."""
    p = truth()
    result = fit(excited_logs(p), NAMES, start_guess(p), weights=LossWeights(rotor_speeds=5.0), **SETTINGS)
    rel = result.values / true_values(p) - 1
    assert np.all(np.abs(result.start / true_values(p) - 1) >= 0.19)  # it had somewhere to go
    assert np.all(np.abs(rel) < 5e-3), dict(zip(result.labels, rel))
    assert result.uncertainty.rank == 9 and not result.uncertainty.unidentifiable
    assert result.loss_history[-1] < 1e-12 * result.loss_history[0]


def test_noisy_estimates_within_three_sigma():
    """With realistic noise on every measured channel (start states included), each estimate lies
    within 3 sandwich standard deviations of the truth; the plain Gauss–Newton std, which assumes
    white residuals, is the smaller one (errors inside a window are correlated)."""
    p = truth()
    weights = LossWeights(position=1e-3, velocity=5e-3, attitude=2e-3, body_rates=1e-2, rotor_speeds=2.0)
    result = fit(excited_logs(p, noise=NOISE, seed=1), NAMES, start_guess(p), weights=weights, **SETTINGS)
    err = result.values - true_values(p)
    z = err / result.std
    assert np.all(np.isfinite(result.std)) and np.all(result.std > 0)
    assert np.all(np.abs(z) < 3.0), dict(zip(result.labels, z))
    assert np.all(np.abs(err / true_values(p)) < 0.05)  # and the noise is not hiding a blunder
    u = result.uncertainty
    assert np.median(u.std_sandwich / u.std_gauss_newton) > 1.0
    assert "± std" in result.table() and "k_f" in result.table()


def test_unexcited_motor_lag_is_flagged():
    """Constant motor commands with the rotors at steady state: the motor lag has no effect on the
    data (a zero Jacobian column), so τ is flagged and warned about; the rest is still determined."""
    p = truth()
    rng = np.random.default_rng(3)
    D = mixer_directions(p)
    hover2 = np.asarray(hover_rotor_speed(p)) ** 2
    logs = []
    for i in range(16):
        u = np.sqrt(hover2 * (1 + rng.uniform(-0.1, 0.1, 4) @ D))  # one constant command per flight
        s0 = random_state(p, rng).replace(rotor_speeds=jnp.asarray(u))
        logs.append(simulate_log(p, s0, np.tile(u, (40, 1)), DT, name=f"constant{i}"))
    with pytest.warns(UnidentifiableWarning, match="motor_tau"):
        result = fit(logs, NAMES, start_guess(p), weights=LossWeights(rotor_speeds=5.0), **SETTINGS)
    assert result.uncertainty.unidentifiable == ("motor_tau",)
    assert result.uncertainty.rank == 8
    i = result.labels.index("motor_tau")
    assert np.isinf(result.std[i]) and result.values[i] == pytest.approx(result.start[i])
    others = np.delete(result.values / true_values(p) - 1, i)
    assert np.all(np.abs(others) < 5e-3)


# --- validation protocol --------------------------------------------------------------------


def test_open_loop_errors_protocol():
    p = truth().replace(motor_tau=jnp.asarray(0.0))
    log = excited_logs(p, n=1)[0]
    H = 8
    naive = open_loop_errors(None, log, max_horizon=H)
    # by hand: every start i with i + H inside the log, the constant-state prediction
    n = len(log) - H
    for h in (1, H):
        dp = np.linalg.norm(log.position[h: h + n] - log.position[:n], axis=1).mean()
        dq = np.asarray(quat_angle_between(jnp.asarray(log.attitude[h: h + n]), jnp.asarray(log.attitude[:n]))).mean()
        dw = np.linalg.norm(log.body_rates[h: h + n] - log.body_rates[:n], axis=1).mean()
        assert naive.at(h)["position"] == pytest.approx(dp, rel=1e-12)
        assert naive.at(h)["attitude"] == pytest.approx(dq, rel=1e-9)
        assert naive.at(h)["body_rates"] == pytest.approx(dw, rel=1e-12)
    assert naive.n_starts == n
    # the true model replays its own noise-free log; a wrong one does not
    exact = open_loop_errors(p, log, max_horizon=H).total()
    assert max(exact["position"], exact["velocity"], exact["body_rates"]) < 1e-9
    assert exact["attitude"] < 1e-6  # the arccos in the geodesic angle resolves √ε ≈ 1e-8 rad
    wrong = open_loop_errors(p.replace(inertia=p.inertia * 1.5), log, max_horizon=H)
    assert wrong.at(H)["body_rates"] > 1e-3
    s = naive.summary((1, 8))
    assert set(s) == {"h1", "h8", "sum", "n_starts"}
    assert s["sum"]["velocity"] == pytest.approx(float(np.sum(naive.velocity)))


# --- files and the command -----------------------------------------------------------------


def test_fit_file_round_trip(tmp_path):
    p = truth()
    mm = nanodrone_motor_map("float64")
    path = tmp_path / "fit.json"
    save_fit(path, p, motor_map=mm, inputs="commands", estimates=[{"label": "k_f", "value": 3.72e-8}])
    back = load_params(path, dtype="float64")
    for name in ("mass", "inertia", "rotor_positions", "rotor_spins", "k_f", "k_m", "motor_tau", "drag_linear"):
        np.testing.assert_array_equal(getattr(back, name), getattr(p, name))
    doc = load_fit(path, dtype="float64")
    np.testing.assert_array_equal(doc["motor_map"].gain, mm.gain)
    assert doc["inputs"] == "commands" and doc["estimates"][0]["label"] == "k_f"
    bad = json.loads(path.read_text())
    bad["params"]["mass"] = -1.0
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="QuadParams.mass"):
        load_params(path)
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a quadjax fit file"):
        load_params(path)


def lag_free_pair():
    """(truth, start): the preset without motor lag, and the same with k_f and J_zz off by 20–25 %."""
    p = presets.crazyflie21_brushless(dtype="float64").replace(motor_tau=jnp.asarray(0.0))
    return p, p.replace(k_f=p.k_f * 1.2, inertia=p.inertia.at[2, 2].multiply(1.25))


def csv_flights(tmp_path, n):
    """(truth, CSV paths of n excited flights of it, a fit file of the start, the output path)."""
    from quadjax.logs import save_csv

    p, p0 = lag_free_pair()
    paths = []
    for i, log in enumerate(excited_logs(p, n=n, steps=40, seed=5)):
        paths.append(tmp_path / f"flight{i}.csv")
        save_csv(log, paths[-1])
    init, out = tmp_path / "start.json", tmp_path / "fitted.json"
    save_fit(init, p0)
    return p, paths, init, out


def test_fit_command_on_csv_logs(tmp_path, capsys):
    """``quadjax fit`` on generic CSV logs, in float32: prints estimates ± std and the validation
    table, writes a JSON that loads back, and recovers k_f and J_zz of a lag-free vehicle."""
    p, paths, init, out = csv_flights(tmp_path, 4)
    code = fit_main(["--data", *map(str, paths[:3]), "--validate", str(paths[3]), "--fit", "k_f,inertia.zz",
                     "--init", str(init), "--horizon", "10", "--adam-steps", "20", "--lbfgs-steps", "100",
                     "--float32", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "± std" in text and "inertia.zz" in text and "| fitted |" in text and "| naive |" in text
    fitted = load_params(out, dtype="float64")
    # float32 rollouts (and 9 significant digits in the CSV): recovery to ~1e-4
    assert float(fitted.k_f) == pytest.approx(float(p.k_f), rel=1e-3)
    assert float(fitted.inertia[2, 2]) == pytest.approx(float(p.inertia[2, 2]), rel=1e-3)
    doc = json.loads(out.read_text())
    assert doc["fit"]["dtype"] == "float32"
    assert doc["validation"]["fitted"]["h10"]["position"] < 1e-2 * doc["validation"]["start"]["h10"]["position"]
    assert doc["estimates"][0]["label"] == "k_f" and doc["estimates"][0]["std"] > 0
    assert fit_main(["--data", str(paths[0]), "--fit", "bogus", "--out", str(out)]) == 2
    assert "cannot fit 'bogus'" in capsys.readouterr().err


def test_no_warning_when_everything_is_excited():
    """No UnidentifiableWarning for a well-posed problem (the warning is an error here)."""
    p, p0 = lag_free_pair()
    logs = excited_logs(p, n=3, steps=40, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnidentifiableWarning)
        r = fit(logs, "k_f,inertia.zz", p0, horizon=10, adam_steps=20, lbfgs_steps=100)
    np.testing.assert_allclose(r.values, [float(p.k_f), float(p.inertia[2, 2])], rtol=1e-6)
    assert r.uncertainty.rank == 2


def test_gradient_matches_finite_differences_and_truth_replays():
    """Σ J_wᵀ r_w from the forward-mode Jacobians = ½ ∂Σr²/∂θ by central differences; at the true
    parameters the windows replay the simulated log exactly (Σr² ≈ 0) in 'rotor_speeds' mode."""
    p, p0 = lag_free_pair()
    w = make_windows(excited_logs(p, n=3, steps=40, seed=7), 10, dtype="float64")
    spec = ParamSpec.create("k_f,inertia.zz", p0)

    def info(th):
        return information(jnp.asarray(th), spec, w, DT, LossWeights())

    th = np.asarray([0.01, -0.02])
    at = info(th)
    h = 1e-6
    for i in range(2):
        e = np.zeros(2)
        e[i] = h
        fd = (info(th + e).rss - info(th - e).rss) / (4 * h)
        assert at.grad[i] == pytest.approx(fd, rel=1e-5)
    assert np.all(np.linalg.eigvalsh(at.fisher) > 0) and at.n == 12 * 10 * 12
    truth_theta = np.log([float(p.k_f / p0.k_f), float(p.inertia[2, 2] / p0.inertia[2, 2])])
    assert info(truth_theta).rss < 1e-16 * at.rss


def test_a_fit_returns_its_best_valid_iterate_and_that_objective(monkeypatch):
    """Planted: params_valid accepts only k_f ≤ 0.9 × the truth, so the optimiser's path toward the
    truth (from 0.8 ×) leaves the "valid" set; the result is the best iterate inside it, its
    objective the one reported (the objective history goes lower, outside)."""
    import quadjax.sysid._engine as engine
    from quadjax.params import params_valid

    p, p0 = lag_free_pair()
    start = p0.replace(k_f=p.k_f * 0.8)
    cap = 0.9 * float(p.k_f)
    monkeypatch.setattr(engine, "params_valid", lambda q: params_valid(q) & (q.k_f <= cap))
    # substeps=3, used by no other fit here: the jitted loop reads params_valid when it is traced,
    # so it must be traced afresh (and its cache entry serves no other test)
    r = fit(excited_logs(p, n=3, steps=40, seed=7), "k_f,inertia.zz", start, horizon=10, adam_steps=20,
            lbfgs_steps=60, substeps=3, warn=False)
    assert float(r.params.k_f) <= cap and float(r.params.k_f) > 0.85 * float(p.k_f)
    assert np.nanmin(r.loss_history) < r.objective  # it went lower, outside the planted set
    assert np.any(r.loss_history == r.objective)  # the objective of an iterate it evaluated


def test_the_fit_command_saves_a_fit_whose_validation_fails(tmp_path, capsys, monkeypatch):
    """A validation that raises does not lose the fit: the file is written, with the reason, and a
    warning names it on stderr; the exit code is 0."""
    from quadjax.sysid import cli

    p, paths, init, out = csv_flights(tmp_path, 2)

    def broken(*args, **kwargs):
        raise ValueError("held-out log too short for h = 50")

    monkeypatch.setattr(cli, "_validation", broken)
    code = fit_main(["--data", *map(str, paths), "--fit", "k_f", "--init", str(init), "--horizon", "10",
                     "--adam-steps", "10", "--lbfgs-steps", "20", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0 and "validation failed (held-out log too short" in err and "saved" in err
    doc = json.loads(out.read_text())
    assert doc["validation"] == {"error": "held-out log too short for h = 50"}
    assert float(load_params(out, dtype="float64").k_f) == pytest.approx(float(p.k_f), rel=0.05)  # J_zz is off


def test_the_help_example_fits_physical_parameters(nanodrone_dir, tmp_path, capsys):
    """``quadjax fit --help``'s first example, as printed (its data path pointed at the flight
    folder), on the real multisine flight: it exits 0 and saves k_f within 3 % of the published
    least-squares 3.72e-8 and a linear drag of 0.01-0.06 N/(m/s) per axis, the physical values its
    text promises."""
    import shlex

    from quadjax.sysid import cli

    lines = cli._EPILOG.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    first = " ".join(line.strip().rstrip("\\").strip() for line in lines[:2])
    argv = shlex.split(first)[2:]  # past "quadjax fit"
    argv[argv.index("--data") + 1] = str(nanodrone_dir / "multisine_20251017_run1.parquet")
    argv[argv.index("--out") + 1] = str(tmp_path / "fitted.json")
    assert fit_main(argv) == 0, capsys.readouterr().err
    fitted = load_params(tmp_path / "fitted.json", dtype="float64")
    assert float(fitted.k_f) == pytest.approx(3.72e-8, rel=0.03)
    assert np.all((np.asarray(fitted.drag_linear) > 0.01) & (np.asarray(fitted.drag_linear) < 0.06))
