"""Motor characterisation on the real nano-drone flights: the throttle → thrust curve, the rotor lag
(spin-up and spin-down) and the battery voltage, from the logged commands and eRPM telemetry.

Busetto et al., CEP 2026 (data: ``quadjax.logs.nanodrone_dir`` or ``$QUADJAX_NANODRONE_DIR``).
k_f from the IMU's specific force on the training flights (:func:`quadjax.sysid.
k_f_from_specific_force`); then :func:`quadjax.sysid.fit_flight_motors` on the paper's twelve
training flights (multisine, random2, square runs 1–4), unfiltered, trajectory windows:

    ω_k+1 = u_k + (ω_k − u_k) e^(−dt/τᵢ),  u_k = √(T(x_k, V_k) / k_f),
    T(x, V) = T_max (V / V_ref)^n (a x² + (1 − a) x),  τᵢ = τ up, r τ down.

Validated on the held-out flights (every random1 run, square run 5) by the free-run rotor-speed
error: from the first measured speed, the commands (and voltage) alone drive the model's lag over
the whole window, as a simulator fed the autopilot's motor outputs would. Against the hand-fitted
power law ω = 2850 √x − 530 with the preset's τ = 45 ms (:func:`quadjax.sysid.nanodrone_motor_map`),
on the same flights and protocol. Also: per-flight fits (their spread), a cross-validation across
trajectory families, and what the curve implies (thrust-to-weight, hover throttle).

Writes benchmarks/out/motor_nanodrone.json and benchmarks/MOTOR_RESULTS.md. The data never enter
the repository. Run: ``python benchmarks/motor_nanodrone.py`` (about a minute).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # a benchmark script, not the library: float64 sums

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import quadjax as qj  # noqa: E402
from quadjax.logs import NANODRONE_TEST, NANODRONE_TRAIN, load_nanodrone, lowpass, nanodrone_dir  # noqa: E402
from quadjax.sysid import (  # noqa: E402
    fit_flight_motors, free_run_rotor_speeds, k_f_from_specific_force, motor_speed_command, nanodrone_motor_map, throttle_rotor_speed,
    throttle_thrust,
)

ROOT = Path(__file__).resolve().parents[1]
VOLTAGE_CUTOFF_HZ = 0.2  # the battery's state, not its sag under each throttle step
FAMILIES = ("multisine", "random2", "square")


def load(name, folder, slow_voltage):
    log = load_nanodrone(folder / f"{name}.parquet", filtered=False)
    if slow_voltage:
        log = log.replace(battery_voltage=lowpass(log.battery_voltage, VOLTAGE_CUTOFF_HZ, log.dt))
    return log


def free_run_rms(log, commands, params) -> float:
    """RMS [rad/s] of the model's rotor lag run free from the first measured speed."""
    path = free_run_rotor_speeds(params, commands[:-1], log.rotor_speeds[0], log.dt)
    return float(np.sqrt(np.mean((np.asarray(path) - log.rotor_speeds[1:]) ** 2)))


def curve_rms(log, fit, params) -> float:
    v = log.battery_voltage[:, None]
    return free_run_rms(log, np.asarray(throttle_rotor_speed(fit.curve, params.k_f, log.motor_commands, v)), fit.params)


def power_law_rms(log, params) -> float:
    return free_run_rms(log, np.asarray(motor_speed_command(nanodrone_motor_map(jnp.float64), log.motor_commands)),
                        params)


def summary(fit) -> dict:
    return {"motor_tau_ms": 1e3 * float(fit.params.motor_tau), "motor_tau_std_ms": 1e3 * fit.std["motor_tau"],
            "down_ratio": float(fit.params.motor_tau_down_ratio), "down_ratio_std": fit.std.get("motor_tau_down_ratio", 0.0),
            "a": float(fit.curve.a), "a_std": fit.std["a"], "max_thrust": float(fit.curve.max_thrust),
            "max_thrust_std": fit.std["max_thrust"], "voltage_exponent": float(fit.curve.voltage_exponent),
            "voltage_exponent_std": fit.std.get("voltage_exponent", 0.0),
            "reference_voltage": float(fit.curve.reference_voltage), "one_step_rms": fit.rms, "rows": fit.rows}


def main() -> int:
    folder = nanodrone_dir(ROOT)
    if folder is None:
        print("nano-drone flights not found (set QUADJAX_NANODRONE_DIR); nothing to do")
        return 0
    t0 = time.perf_counter()
    base = qj.presets.crazyflie21_brushless(dtype=jnp.float64)
    logs = {slow: {n: load(n, folder, slow) for n in NANODRONE_TRAIN + NANODRONE_TEST} for slow in (False, True)}
    imu = k_f_from_specific_force([load_nanodrone(folder / f"{n}.parquet") for n in NANODRONE_TRAIN], float(base.mass))
    params = base.replace(k_f=jnp.asarray(imu.k_f))
    configs = {  # name → (voltage low-passed?, fit options)
        "symmetric lag, no voltage": (False, dict(voltage_exponent=0.0)),
        "spin-down ratio, no voltage": (False, dict(voltage_exponent=0.0, asymmetric=True)),
        "spin-down ratio, bare motor n = 2": (False, dict(voltage_exponent=2.0, asymmetric=True)),
        "spin-down ratio, n fitted": (False, dict(voltage_exponent=None, asymmetric=True)),
        f"spin-down ratio, n fitted, V low-passed {VOLTAGE_CUTOFF_HZ} Hz": (True, dict(voltage_exponent=None,
                                                                                      asymmetric=True)),
    }
    rows = {}
    for name, (slow, options) in configs.items():
        fit = fit_flight_motors([logs[slow][n] for n in NANODRONE_TRAIN], params, **options)
        held = {n: curve_rms(logs[slow][n], fit, params) for n in NANODRONE_TEST}
        rows[name] = {**summary(fit), "held_out_free_run": held, "held_out_mean": float(np.mean(list(held.values())))}
        print(f"{name}: held-out free-run {rows[name]['held_out_mean']:.1f} rad/s", flush=True)
    best = list(configs)[-1]
    power = {n: power_law_rms(logs[False][n], base) for n in NANODRONE_TEST}
    rows["power law 2850 √x − 530, τ 45 ms (preset, not fitted)"] = {
        "held_out_free_run": power, "held_out_mean": float(np.mean(list(power.values())))}

    per_flight = {n: summary(fit_flight_motors(logs[True][n], params, voltage_exponent=None, asymmetric=True))
                  for n in NANODRONE_TRAIN}
    for n in NANODRONE_TRAIN:
        per_flight[n]["mean_voltage"] = float(np.mean(logs[True][n].battery_voltage))

    cross = {}
    for family in FAMILIES:
        train = [n for n in NANODRONE_TRAIN if not n.startswith(family)]
        test = [n for n in NANODRONE_TRAIN if n.startswith(family)]
        fit = fit_flight_motors([logs[True][n] for n in train], params, voltage_exponent=None, asymmetric=True)
        cross[family] = {"fitted": float(np.mean([curve_rms(logs[True][n], fit, params) for n in test])),
                         "power_law": float(np.mean([power_law_rms(logs[False][n], base) for n in test])),
                         "voltage_exponent": float(fit.curve.voltage_exponent)}

    final = fit_flight_motors([logs[True][n] for n in NANODRONE_TRAIN], params, voltage_exponent=None, asymmetric=True)
    weight = float(base.mass * base.gravity)
    x = np.linspace(0, 1, 100001)
    hover = float(x[np.argmin(np.abs(np.asarray(throttle_thrust(final.curve, x)) - weight / 4))])
    implied = {"thrust_to_weight": 4 * float(final.curve.max_thrust) / weight, "hover_throttle": hover,
               "reference_voltage": float(final.curve.reference_voltage)}
    seconds = time.perf_counter() - t0
    doc = {"k_f_imu": imu._asdict(), "rows": rows, "best": best, "per_flight": per_flight, "cross": cross,
           "implied": implied, "seconds": seconds, "machine": f"{platform.machine()}, {jax.devices()[0].platform}",
           "python": sys.version.split()[0], "jax": jax.__version__}
    out = ROOT / "benchmarks" / "out"
    out.mkdir(exist_ok=True)
    (out / "motor_nanodrone.json").write_text(json.dumps(doc, indent=1))
    (ROOT / "benchmarks" / "MOTOR_RESULTS.md").write_text(report(doc))
    print(f"wrote benchmarks/MOTOR_RESULTS.md in {seconds:.0f} s")
    return 0


def report(doc) -> str:
    rows, per, cross, imp = doc["rows"], doc["per_flight"], doc["cross"], doc["implied"]
    lines = [
        "# Motor characterisation on the nano-drone flights",
        "",
        "Generated by `python benchmarks/motor_nanodrone.py` (do not edit by hand). Data: the benchmark's "
        "Crazyflie 2.1 Brushless flights (`../shared/data/nanodrone`, local only), unfiltered, trajectory windows.",
        "",
        f"k_f from the IMU's specific force on the training flights: {doc['k_f_imu']['k_f']:.5g} "
        f"± {doc['k_f_imu']['std']:.2g} N/(rad/s)² ({doc['k_f_imu']['rows']} rows). The fits below turn rotor "
        "speeds into thrust with it.",
        "",
        "## Fits on the twelve training flights, validated on the five held-out flights",
        "",
        "Free-run error: from the first measured rotor speed, the commands (and the voltage) alone drive the "
        "model's exact rotor lag over the whole window; RMS over the four rotors [rad/s]. One-step: the "
        "training fit's one-sample prediction error.",
        "",
        "| model | τ up [ms] | spin-down ratio r | a | T_max [N] | n (voltage) | one-step (train) | "
        + " | ".join(n.replace("_20251017_", " ") for n in NANODRONE_TEST) + " | held-out mean |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(NANODRONE_TEST) + 1),
    ]
    for name, r in rows.items():
        held = " | ".join(f"{r['held_out_free_run'][n]:.1f}" for n in NANODRONE_TEST)
        if "a" in r:
            fitted = (f"{r['motor_tau_ms']:.1f} ± {r['motor_tau_std_ms']:.1f} | {r['down_ratio']:.2f} ± {r['down_ratio_std']:.2f} | "
                      f"{r['a']:.3f} ± {r['a_std']:.3f} | {r['max_thrust']:.4f} ± {r['max_thrust_std']:.4f} | "
                      f"{r['voltage_exponent']:.2f} ± {r['voltage_exponent_std']:.2f} | {r['one_step_rms']:.1f}")
        else:
            fitted = "45 | 1 | — | — | — | —"
        lines.append(f"| {name} | {fitted} | {held} | **{r['held_out_mean']:.1f}** |")
    lines += [
        "",
        "± are white-noise standard errors: the residuals are correlated in time, so they are lower bounds; "
        "the per-flight spread below is the honest uncertainty. T_max is at V_ref, the training flights' mean "
        f"voltage ({imp['reference_voltage']:.3f} V).",
        "",
        "## Per-flight fits (spin-down ratio, n fitted, voltage low-passed)",
        "",
        "| flight | mean V | τ up [ms] | r | a | T_max [N] at the flight's V_ref | n |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in per.items():
        lines.append(f"| {n} | {r['mean_voltage']:.3f} | {r['motor_tau_ms']:.1f} | {r['down_ratio']:.2f} | {r['a']:.3f} | "
                     f"{r['max_thrust']:.4f} | {r['voltage_exponent']:.2f} ± {r['voltage_exponent_std']:.2f} |")
    keys = ("motor_tau_ms", "down_ratio", "a", "max_thrust", "voltage_exponent")
    stats = {k: (np.mean([r[k] for r in per.values()]), np.std([r[k] for r in per.values()], ddof=1)) for k in keys}
    lines.append("| mean ± sd | | " + " | ".join(f"{m:.3g} ± {s:.2g}" for m, s in stats.values()) + " |")
    lines += [
        "",
        "## Cross-validation across trajectory families",
        "",
        "Fit on two families' runs 1–4, free-run error on the third's (voltage low-passed, n fitted).",
        "",
        "| held-out family | fitted [rad/s] | power law (preset) [rad/s] | n fitted on the other two |",
        "|---|---:|---:|---:|",
    ]
    for fam, c in cross.items():
        lines.append(f"| {fam} | {c['fitted']:.1f} | {c['power_law']:.1f} | {c['voltage_exponent']:.2f} |")
    lines += [
        "",
        "## What the curve implies",
        "",
        f"- Thrust-to-weight at full throttle and V_ref: {imp['thrust_to_weight']:.2f} (m = 0.045 kg; the paper's "
        "repository clips the collective thrust at 2 m g).",
        f"- Hover throttle at V_ref: {imp['hover_throttle']:.3f}.",
        "",
        f"Run: {doc['seconds']:.0f} s on {doc['machine']}, Python {doc['python']}, JAX {doc['jax']}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
