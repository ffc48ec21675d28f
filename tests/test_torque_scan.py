"""The torque-channel diagnostic of benchmarks/sysid_nanodrone.py (``--torque-scan``, written to
benchmarks/TORQUE_SCAN.md): on synthetic flights whose angular acceleration is a planted linear law
of the rotor speeds, read a known number of samples earlier, it must find the law at that lag and
only there, and credit the reaction-torque regressors only when the law has them."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np

spec = importlib.util.spec_from_file_location(
    "sysid_nanodrone", Path(__file__).resolve().parents[1] / "benchmarks" / "sysid_nanodrone.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

DT = 0.01


def _flights(lag, reaction, seed, n=3, T=3000):
    """Rotor speeds: smooth random excursions about hover; body rates built so that the
    diagnostic's target J ω̇ + ω × J ω (ω̇ by central differences) is exactly the planted torque
    A (ω² − ω_h²)(t − lag) [+ B ω̇(t − lag)] at every interior sample: a leapfrog step
    ω[i+1] = ω[i−1] + 2 dt J⁻¹ (τ[i] − ω[i] × J ω[i])."""
    law = np.random.default_rng(0)  # one airframe: the training and held-out flights share the law
    A = law.normal(0, 1e-12, (4, 3))
    B = law.normal(0, 2e-10, (4, 3)) * reaction
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        kernel = np.exp(-0.5 * ((np.arange(40) - 20) / 6.0) ** 2) / 6.0  # smooth: a leapfrog's odd/even chains agree
        W = 2000 + np.stack([np.convolve(rng.normal(0, 60, T + 40), kernel, "valid")[:T] for _ in range(4)], 1)
        sq = W ** 2 - 2000.0 ** 2
        law_now = sq @ A + np.gradient(W, DT, axis=0) @ B
        torque = np.concatenate([np.repeat(law_now[:1], lag, axis=0), law_now[:T - lag]])  # τ[i] = law(i − lag)
        w = np.zeros((T, 3))
        w[1] = DT * torque[0] / bench.J_CARD  # a consistent start: no parasitic odd/even mode
        for i in range(1, T - 1):
            w[i + 1] = w[i - 1] + 2 * DT * (torque[i] - np.cross(w[i], w[i] * bench.J_CARD)) / bench.J_CARD
        out.append(SimpleNamespace(body_rates=w, rotor_speeds=W, dt=DT))
    return out


def _best_lag(train, test, acceleration):
    r2 = {lag: bench._r2(train, test, lag=lag, acceleration=acceleration)[1] for lag in range(-1, 5)}
    return max(r2, key=lambda k: r2[k].mean()), r2


def test_the_planted_lag_and_law_are_found():
    train, test = _flights(2, reaction=False, seed=1), _flights(2, reaction=False, seed=2)
    lag, r2 = _best_lag(train, test, acceleration=False)
    assert lag == 2 and r2[2].min() > 0.9999
    assert all(r2[k].max() < 0.995 for k in r2 if k != 2)  # a sample off explains measurably less


def test_reaction_torque_regressors_pay_only_when_the_law_has_them():
    train, test = _flights(1, reaction=True, seed=3), _flights(1, reaction=True, seed=4)
    with_acc = bench._r2(train, test, lag=1, acceleration=True)[1]
    without = bench._r2(train, test, lag=1, acceleration=False)[1]
    assert with_acc.min() > 0.9999 and without.mean() < 0.9
    plain_train, plain_test = _flights(1, reaction=False, seed=5), _flights(1, reaction=False, seed=6)
    gain = (bench._r2(plain_train, plain_test, lag=1, acceleration=True)[1]
            - bench._r2(plain_train, plain_test, lag=1, acceleration=False)[1])
    assert np.all(np.abs(gain) < 0.01)


def test_the_scan_reads_its_conclusions_from_its_numbers():
    """TORQUE_SCAN.md's reading comes from the scan: on flights with a planted reaction torque two
    samples late it names lag 2 and an R² near 1; a row per setting in the table."""
    train, test = _flights(2, reaction=True, seed=7, n=2, T=1500), _flights(2, reaction=True, seed=8, n=2, T=1500)
    rows = bench.torque_scan(train, test, lags=range(0, 4), smooths=(1, 5))
    read = bench.scan_reading(rows)
    assert read["yaw_lag"] == 2 and read["yaw"] > 0.999 and read["yaw_without"] < read["yaw"]
    doc = bench.scan_markdown(rows)
    assert len([line for line in doc.splitlines() if line.startswith("| ω")]) == 2 * 2 * 4
    assert f"held-out R² {read['yaw']:.2f}" in doc and f"{read['roll_pitch']:.2f}" in doc
