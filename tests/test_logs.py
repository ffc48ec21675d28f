"""Flight-log loading: the generic CSV schema, conversions at the edge, the nano-drone cleaning
rules on synthetic series, and — where the data folder exists — the real benchmark flights."""

import numpy as np
import pytest

from quadjax import frames
from quadjax.logs import (
    NANODRONE_RUNS,
    NANODRONE_TEST,
    NANODRONE_TRAIN,
    FlightLog,
    despike_erpm,
    erpm_to_rad_s,
    estimate_motor_lag,
    load_csv,
    load_logs,
    lowpass_attitude,
    quat_exp,
    quat_log,
    quat_xyzw_to_wxyz,
    save_csv,
    shift_rows,
    stale_rows,
)
from quadjax.quaternion import quat_angle_between, quat_from_axis_angle


def small_log(T=30, rng=None, with_rotors=True):
    rng = rng or np.random.default_rng(0)
    axis = rng.normal(size=(T, 3))
    axis /= np.linalg.norm(axis, axis=1, keepdims=True)
    q = np.asarray(quat_from_axis_angle(axis, rng.uniform(0, 1, T)))
    return FlightLog(
        name="small", t=np.arange(T) * 0.01, position=rng.normal(size=(T, 3)), velocity=rng.normal(size=(T, 3)),
        attitude=q, body_rates=rng.normal(size=(T, 3)),
        rotor_speeds=rng.uniform(1000, 2000, (T, 4)) if with_rotors else None,
        motor_commands=rng.uniform(0, 1, (T, 4)), specific_force=rng.normal(size=(T, 3)),
        battery_voltage=rng.uniform(3.5, 4.2, T),
    )


def test_csv_round_trip(tmp_path):
    log = small_log()
    path = tmp_path / "flight.csv"
    save_csv(log, path)
    back = load_csv(path)
    assert back.name == "flight" and back.dt == pytest.approx(0.01)
    for field in ("t", "position", "velocity", "attitude", "body_rates", "rotor_speeds", "motor_commands",
                  "specific_force", "battery_voltage"):
        np.testing.assert_allclose(getattr(back, field), getattr(log, field), rtol=1e-8, atol=1e-12)
    no_rotors = small_log(with_rotors=False)
    save_csv(no_rotors, path)
    assert load_csv(path).rotor_speeds is None


def test_csv_errors_name_the_problem(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("t,x,y,z\n0,0,0,0\n0.01,0,0,0\n0.02,0,0,0\n")
    with pytest.raises(ValueError, match="missing required column 'vx'"):
        load_csv(path)
    log = small_log()
    save_csv(log, path)
    text = path.read_text().splitlines()
    header = [ln for ln in text if not ln.startswith("#")][0]
    cols = header.split(",")
    rows = [ln.split(",") for ln in text if ln and not ln.startswith("#")][1:]
    rows[3][cols.index("t")] = "0.5"  # a jump in time
    path.write_text("\n".join([header] + [",".join(r) for r in rows]))
    with pytest.raises(ValueError, match="uniform"):
        load_csv(path)
    with pytest.raises(ValueError, match="FlightLog.body_rates: contains NaN"):
        log.replace(body_rates=np.full_like(log.body_rates, np.nan))
    with pytest.raises(ValueError, match="FlightLog.position: shape"):
        log.replace(position=log.position[:, :2])


def test_conversions_at_the_edge():
    # scalar-last → scalar-first: 90° yaw
    s = np.sqrt(0.5)
    np.testing.assert_allclose(quat_xyzw_to_wxyz([0.0, 0.0, s, s]), [s, 0.0, 0.0, s])
    # 6 pole pairs: ω = eRPM/6 · 2π/60 = eRPM · 2π/360; the README's hover ≈ 100 000 eRPM ≈ 1745 rad/s
    assert float(erpm_to_rad_s(100_000)) == pytest.approx(100_000 * 2 * np.pi / 360)
    assert float(erpm_to_rad_s(100)) == pytest.approx(1.745, abs=1e-3)
    # Crazyflie M1 FR, M2 RR, M3 RL, M4 FL → PX4 FR, RL, FL, RR
    np.testing.assert_array_equal(frames.reorder_rotors(np.array([1.0, 2.0, 3.0, 4.0]), "crazyflie"), [1, 3, 4, 2])
    # the rotation-vector log/exp maps invert each other, also near 0 and near π
    r = np.array([[0.0, 0.0, 0.0], [1e-9, 0, 0], [0.3, -0.2, 0.1], [0.0, 0.0, np.pi - 1e-6]])
    np.testing.assert_allclose(quat_log(quat_exp(r)), r, atol=1e-12)


def test_despike_fill_shift_and_stale():
    erpm = np.full((10, 4), 100_000.0)
    erpm[4, 1] = 6_000_000.0  # a spike: jump > 1e5 and value > 3e5
    erpm[8, 2] = 150_000.0    # a jump of 5e4 and < 3e5: kept
    clean = despike_erpm(erpm)
    # the jumps into and out of row 4 mark rows 3–6; every column refilled from row 7
    np.testing.assert_array_equal(clean[3:7], 100_000.0)
    assert clean[8, 2] == 150_000.0
    # a NaN run is filled backward from the next valid row, and forward at the end
    x = np.array([np.nan, 1.0, np.nan, np.nan, 4.0, np.nan])
    np.testing.assert_array_equal(despike_erpm(np.tile(x[:, None], (1, 4)))[:, 0], [1, 1, 4, 4, 4, 4])
    np.testing.assert_array_equal(shift_rows(np.arange(5), 2), [0, 0, 0, 1, 2])
    np.testing.assert_array_equal(shift_rows(np.arange(5), -1), [1, 2, 3, 4, 4])
    a = np.array([[0.0], [1.0], [1.0], [2.0], [2.0]])
    np.testing.assert_array_equal(stale_rows(a), [False, False, True, False, True])


@pytest.mark.parametrize("lag", [-3, 0, 2])
def test_motor_lag_estimate_recovers_a_known_delay(lag):
    rng = np.random.default_rng(1)
    omega = 1700 + np.cumsum(rng.normal(0, 20, (800, 4)), axis=0)
    thrust = np.sum(omega ** 2, axis=1)
    # the IMU sees the thrust of motor row k − lag at row k: the motor columns must be delayed by lag
    imu = shift_rows(thrust, lag) + rng.normal(0, 1e3, 800)
    assert estimate_motor_lag(imu, omega) == lag


def test_attitude_lowpass_follows_a_slow_rotation():
    pytest.importorskip("scipy")
    t = np.arange(400) * 0.01
    angle = 0.5 * np.sin(2 * np.pi * 0.5 * t)  # 0.5 Hz, well below a 12 Hz cut-off
    q = np.array(quat_from_axis_angle(np.array([0.0, 0.6, 0.8]), angle))
    q[::2] *= -1  # sign flips are the same attitude and must not disturb the filter
    # a rotation well inside the pass band goes through unchanged, despite the sign flips
    clean = lowpass_attitude(q, 12.0, 0.01)
    assert np.asarray(quat_angle_between(clean, q))[20:-20].max() < 2e-4  # of a 0.5 rad swing; edges aside
    np.testing.assert_allclose(np.linalg.norm(clean, axis=1), 1.0)
    # and white noise is attenuated (12 Hz of a 50 Hz band: about √(12/50) in rms)
    noisy = q + np.random.default_rng(2).normal(0, 1e-3, q.shape)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    before = np.sqrt(np.mean(np.asarray(quat_angle_between(noisy, q)) ** 2))
    after = np.sqrt(np.mean(np.asarray(quat_angle_between(lowpass_attitude(noisy, 12.0, 0.01), q)) ** 2))
    assert after < 0.65 * before


# --- the real flights (skip where the folder is absent) -------------------------------------


@pytest.fixture(scope="module")
def flights(request):
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pytest.importorskip("scipy")
    from quadjax.logs import load_nanodrone, nanodrone_dir

    folder = nanodrone_dir()
    if folder is None:
        pytest.skip("nano-drone flight data not found (../shared/data/nanodrone or $QUADJAX_NANODRONE_DIR)")
    return folder, {n: load_nanodrone(folder / f"{n}.parquet") for n in NANODRONE_RUNS}


def test_real_flights_load_into_project_conventions(flights):
    folder, logs = flights
    assert set(NANODRONE_TRAIN) | set(NANODRONE_TEST) <= set(logs)
    for name, log in logs.items():
        assert len(log) == NANODRONE_RUNS[name][1]
        np.testing.assert_allclose(np.linalg.norm(log.attitude, axis=1), 1.0, atol=1e-9)
        assert log.rotor_speeds.shape == (len(log), 4) and np.all(log.rotor_speeds > 500)
        # hover ≈ 1750 rad/s per motor (data README)
        assert 1500 < np.median(log.rotor_speeds) < 2000
        assert log.specific_force is not None and log.battery_voltage is not None
    # thrust: m·a_body,z = k_f Σω² over the training flights, k_f ≈ 3.72e-8 (README: 3.7178e-8)
    from quadjax.quaternion import quat_rotate_inverse

    num = den = 0.0
    for name in NANODRONE_TRAIN:
        log = logs[name]
        az = np.asarray(quat_rotate_inverse(log.attitude, log.specific_force))[:, 2]
        w2 = np.sum(log.rotor_speeds ** 2, axis=1)
        num, den = num + np.dot(0.045 * az, w2), den + np.dot(w2, w2)
    assert num / den == pytest.approx(3.72e-8, rel=0.02)


def test_real_flights_rotor_order_matches_torque_signs(flights):
    """In PX4 order, the model's roll and pitch moments from the loaded rotor speeds correlate
    positively with the measured angular acceleration (a swapped motor would break this)."""
    from quadjax import presets
    from quadjax.quadrotor import rotor_moment, rotor_thrusts

    _, logs = flights
    p = presets.crazyflie21_brushless(dtype="float64")
    log = logs["square_20251017_run3"]
    T = rotor_thrusts(p, log.rotor_speeds, np.zeros(len(log)))
    M = np.asarray(rotor_moment(p, T))
    wdot = np.gradient(log.body_rates, log.dt, axis=0)
    for axis in range(3):
        assert np.corrcoef(M[:, axis], wdot[:, axis])[0, 1] > 0.2


def test_real_motor_lag_matches_the_data_card(flights):
    from quadjax.logs import load_nanodrone

    from quadjax.quaternion import quat_rotate_inverse

    folder, _ = flights
    for name in ("random1_20251017_run2", "square_20251017_run4", "multisine_20251017_run3"):
        raw = load_nanodrone(folder / f"{name}.parquet", window=False, align_motors=False, filtered=False)
        az = np.asarray(quat_rotate_inverse(raw.attitude, raw.specific_force))[:, 2]
        lag = estimate_motor_lag(az, raw.rotor_speeds)
        assert lag == NANODRONE_RUNS[name][2]


def test_load_logs_expands_folders_and_rejects_unknown(tmp_path):
    save_csv(small_log(), tmp_path / "a.csv")
    save_csv(small_log(), tmp_path / "b.csv")
    assert [lg.name for lg in load_logs([tmp_path])] == ["a", "b"]
    (tmp_path / "c.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown log type"):
        load_logs([tmp_path / "c.txt"])
    with pytest.raises(ValueError, match="no such file"):
        load_logs([tmp_path / "missing.csv"])
