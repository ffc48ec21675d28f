"""Vehicle presets. Each cites its source and says which values are assumed.

Rotor order is PX4 Quad X (0 front-right CCW, 1 rear-left CCW, 2 front-left CW,
3 rear-right CW) unless a preset says otherwise; body frame FLU.
"""

import math

from quadjax.params import QuadParams

_PX4_X_SPINS = (1.0, 1.0, -1.0, -1.0)


def quad_x_positions(a: float, z: float = 0.0):
    """Rotor hubs of a Quad X in PX4 order, at (±a, ±a, z) [m] (a = arm / √2)."""
    return ((a, -a, z), (-a, a, z), (a, a, z), (-a, -a, z))


def rp1(dtype=None) -> QuadParams:
    """RP-1, the seed C++ model's default vehicle, reconstructed (GUIDE §1).

    From the seeds: k_f = 8.9e-7 N/(rad/s)²; the mixer throttle sweep (seed 002)
    fixes a = 0.7/9.0 m (arm 0.110 m), k_m = 0.1/6.4 m and T_max ≈ 12.0 N per
    rotor, i.e. ω_max = √(12.0/k_f) ≈ 3672 rad/s.
    Assumed (not published): mass 1.5 kg, inertia diag(0.012, 0.012, 0.022) kg·m²,
    τ = 0.03 s, drag 0.1 N/(m/s) and 0.05 N/(m/s)², k_p = 7.5e-9 W/(rad/s)³
    (≈ 250 W at hover), 4S 5 Ah battery (266 kJ) with 20 % sag, no rotor inertia.
    """
    return QuadParams.create(
        mass=1.5,
        inertia=(0.012, 0.012, 0.022),
        rotor_positions=quad_x_positions(0.7 / 9.0),
        rotor_spins=_PX4_X_SPINS,
        k_f=8.9e-7,
        k_m=0.1 / 6.4,
        motor_tau=0.03,
        omega_max=math.sqrt(12.0 / 8.9e-7),
        drag_linear=0.1,
        drag_quadratic=0.05,
        k_p=7.5e-9,
        battery_capacity=14.8 * 5.0 * 3600.0,
        battery_sag=0.2,
        gravity=9.80665,
        dtype=dtype,
    )


def c4dynamics_reference(dtype=None) -> QuadParams:
    """c4dynamics 2.6 ``default_quad_config()`` (Luukkonen 2011 values), ENU/FLU.

    m 0.468 kg, J diag(4.856e-3, 4.856e-3, 8.801e-3), rotors at (±0.225, ±0.225)
    in ArduPilot order (the same as PX4 Quad X), kT 2.98e-6, kQ/kT 0.0382 m,
    drag A = (0.30, 0.30, 0.25), A_r 0.20, I_R 3.357e-5, g 9.81.
    Assumed: no motor lag (c4dynamics commands rotor speeds directly), ω_max 1200
    rad/s (hover is 620), no energy model.
    """
    return QuadParams.create(
        mass=0.468,
        inertia=(4.856e-3, 4.856e-3, 8.801e-3),
        rotor_positions=quad_x_positions(0.225),
        rotor_spins=_PX4_X_SPINS,
        k_f=2.98e-6,
        k_m=0.0382,
        omega_max=1200.0,
        drag_linear=(0.30, 0.30, 0.25),
        drag_rotational=0.20,
        rotor_inertia=3.357e-5,
        gravity=9.81,
        dtype=dtype,
    )


def crazyflie21(dtype=None) -> QuadParams:
    """Crazyflie 2.0/2.1 (brushed).

    Förster, BSc thesis ETH 2015: mass 0.027 kg, full inertia
    [[16.572, 0.831, 0.718], [0.831, 16.656, 1.800], [0.718, 1.800, 29.262]]e-6 kg·m²,
    arm 0.046 m, k_m = 0.005964552 m. RotorPy ``crazyflie_params.py``: k_f = 2.3e-8,
    τ = 0.072 s (Eschmann 2024: 0.0716), ω ∈ [0, 2500] rad/s.
    Assumed: no drag or energy terms.
    """
    return QuadParams.create(
        mass=0.027,
        inertia=((16.572e-6, 0.831e-6, 0.718e-6), (0.831e-6, 16.656e-6, 1.800e-6), (0.718e-6, 1.800e-6, 29.262e-6)),
        rotor_positions=quad_x_positions(0.046 / math.sqrt(2.0)),
        rotor_spins=_PX4_X_SPINS,
        k_f=2.3e-8,
        k_m=0.005964552,
        motor_tau=0.072,
        omega_max=2500.0,
        dtype=dtype,
    )


def crazyflie21_brushless(dtype=None) -> QuadParams:
    """Crazyflie 2.1 Brushless as flown in the nano-drone benchmark (Busetto et al., CEP 2026).

    From ../shared/data/nanodrone/README.md: mass 0.045 kg, moment arm 0.0353 m
    about x and y, k_f = 3.72e-8, J = diag(2.3951e-5, 2.3951e-5, 3.2347e-5),
    k_yaw = 7.728e-11 N·m/(rad/s)² → k_m = k_yaw/k_f = 2.077e-3 m, motor lag
    τ ≈ 0.045 s (fit on the logs, 37–78 ms), steady state ω ≈ 2850√cmd − 530
    → ω_max ≈ 2320 rad/s. Stored in PX4 order (Crazyflie M1..M4 = PX4 0, 3, 1, 2).
    Assumed: no drag or energy terms; the data card calls J and k_yaw rough.
    """
    return QuadParams.create(
        mass=0.045,
        inertia=(2.3951e-5, 2.3951e-5, 3.2347e-5),
        rotor_positions=quad_x_positions(0.0353),
        rotor_spins=_PX4_X_SPINS,
        k_f=3.72e-8,
        k_m=7.728e-11 / 3.72e-8,
        motor_tau=0.045,
        omega_max=2320.0,
        dtype=dtype,
    )


def iris(dtype=None) -> QuadParams:
    """PX4 iris (Gazebo classic ``models/iris/iris.sdf.jinja``).

    mass 1.5 kg, J diag(0.029125, 0.029125, 0.055225), rotors FR (0.13, −0.22),
    RL (−0.13, 0.20), FL (0.13, 0.22), RR (−0.13, −0.20) at z 0.023 m, k_f 5.84e-6,
    k_m 0.06, ω ≤ 1100 rad/s, rotor drag 1.75e-4, rolling moment 1e-6.
    Assumed: one lag τ = 0.0125 s (the sdf's spin-up constant; its 0.025 s
    spin-down is not modelled); rotor drag and rolling moment not modelled.
    """
    return QuadParams.create(
        mass=1.5,
        inertia=(0.029125, 0.029125, 0.055225),
        rotor_positions=((0.13, -0.22, 0.023), (-0.13, 0.20, 0.023), (0.13, 0.22, 0.023), (-0.13, -0.20, 0.023)),
        rotor_spins=_PX4_X_SPINS,
        k_f=5.84e-6,
        k_m=0.06,
        motor_tau=0.0125,
        omega_max=1100.0,
        dtype=dtype,
    )


def cmu_plus(dtype=None) -> QuadParams:
    """The seed-003 vehicle (CMU course ``system_params.yaml``), a "+" layout.

    m 0.770 kg, J diag(0.0033, 0.0033, 0.005), d = 0.1103 m, cT 8.07e-9 N/RPM²
    = 7.359e-7 N/(rad/s)², k_m 0.017 m, k_m(lag) 36.5 1/s → τ = 1/36.5 s,
    3000–20000 RPM = 314.2–2094.4 rad/s, g 9.80665.
    Rotor order is the doc's: 1 front (+x, CCW), 2 left (+y, CW), 3 rear (−x, CCW),
    4 right (−y, CW) — its allocation rows (roll 0, +d, 0, −d; pitch −d, 0, +d, 0;
    yaw −, +, −, +) fix that layout.
    Assumed: no drag or energy terms.
    """
    d = 0.1103
    return QuadParams.create(
        mass=0.770,
        inertia=(0.0033, 0.0033, 0.005),
        rotor_positions=((d, 0.0, 0.0), (0.0, d, 0.0), (-d, 0.0, 0.0), (0.0, -d, 0.0)),
        rotor_spins=(1.0, -1.0, 1.0, -1.0),
        k_f=8.07e-9 * (60.0 / (2.0 * math.pi)) ** 2,
        k_m=0.017,
        motor_tau=1.0 / 36.5,
        omega_min=3000.0 * 2.0 * math.pi / 60.0,
        omega_max=20000.0 * 2.0 * math.pi / 60.0,
        gravity=9.80665,
        dtype=dtype,
    )


#: name → (constructor, one-line source), for listings and the CLI
PRESETS = {
    "rp1": (rp1, "RP-1 reference vehicle: k_f, arm, k_m and T_max published; mass and inertia assumed"),
    "c4dynamics_reference": (c4dynamics_reference, "c4dynamics 2.6 default_quad_config (Luukkonen 2011)"),
    "crazyflie21": (crazyflie21, "Förster 2015 thesis / RotorPy crazyflie_params"),
    "crazyflie21_brushless": (crazyflie21_brushless, "Busetto et al. CEP 2026 nano-drone benchmark"),
    "iris": (iris, "PX4 Gazebo iris.sdf"),
    "cmu_plus": (cmu_plus, "CMU quadrotor course system_params.yaml ('+' layout)"),
}


def get(name: str, dtype=None) -> QuadParams:
    """A preset by name; ``ValueError`` listing the names for an unknown one."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name][0](dtype=dtype)
