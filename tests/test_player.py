"""The trace player (#19): the traces it is given, the page's size and encoding, and the page itself
in a real headless Chromium: every key, the event markers, no console errors, the fallback view.

The browser tests start Debian's Chromium (``/usr/bin/chromium``, or ``QUADJAX_CHROMIUM``) with
its DevTools endpoint on 127.0.0.1, drive it with Playwright over that endpoint, and stop the
process by its id afterwards; they skip where no browser or no Playwright can be had. Playback
runs on Playwright's fake clock (``page.clock``), so the samples a key or a second of play moves
are exact, not timed.
"""

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import player, presets
from quadjax.cli import main as cli_main
from quadjax.monitor import load_history, write_repro
from quadjax.player import page as P
from quadjax.quadrotor import rotor_thrusts
from tests.helpers import small_sweep

F64 = jnp.float64
DT = 1e-3


# --------------------------------------------------------------------------- runs to replay


@functools.cache
def altimeter_run():
    """Seed 000's debugging scenario: hover at 0.3 m on 97 % of the hover speed while the caller
    subtracts 2 cm from the height every 0.1 s; the monitor stops the vehicle at I5 before step 800."""
    p = presets.rp1(F64)
    s0 = qj.hover_state(p, position=(0.0, 0.0, 0.3))
    u = jnp.broadcast_to(qj.hover_rotor_speed(p) * 0.97, (1000, 4))

    def fix(state, k):
        due = (k % 100 == 0) & (k > 0)
        return state.replace(position=state.position.at[2].add(jnp.where(due, -0.02, 0.0)))

    config = qj.SimConfig(check="monitor")
    run = jax.jit(lambda s: qj.simulate(p, s, DT, commands=u, edit=fix, config=config))(s0)
    return p, s0, run


CORRECTIONS = [player.Event(0.1 * k, "the caller applies the -2 cm altimeter correction") for k in range(1, 9)]


def altimeter_trace():
    p, s0, run = altimeter_run()
    return player.trajectory_trace(run, p, DT, state0=s0, events=CORRECTIONS, title="seed 000: the altimeter bug")


def test_trajectory_trace_times_channels_and_events_follow_the_run():
    p, s0, run = altimeter_run()
    assert int(run.status) == qj.status.STATUS_IDS.index("below_ground") and int(run.status_tick) == 800
    tr = altimeter_trace()
    track = tr.tracks[0]
    # sample 0 is state0 at t = 0, sample j the state after tick j − 1, at j·dt
    assert tr.t0 == 0.0 and tr.dt == DT and tr.num_samples == 1001
    np.testing.assert_array_equal(track.position[0], np.asarray(s0.position))
    np.testing.assert_array_equal(track.position[1:], np.asarray(run.states.position))
    # thrust arrows: the model's own T = s·k_f·ω² on the state's rotor speeds (the rotors lag)
    np.testing.assert_allclose(track.thrust[1:], np.asarray(rotor_thrusts(p, run.states.rotor_speeds,
                                                                          run.states.energy)), rtol=1e-12)
    labels = {e.label: e.t for e in tr.events}
    ground = np.asarray(run.states.on_ground) > 0.5
    first = int(np.argmax(ground))  # the first saved state on the ground: after tick `first`
    assert labels["touch-down"] == pytest.approx((first + 1) * DT)
    monitor = [e for e in tr.events if e.label.startswith("monitor:")]
    assert len(monitor) == 1 and monitor[0].t == pytest.approx(0.8)
    assert "I5 below_ground before step 800" in monitor[0].label and "position.z = -0.02" in monitor[0].label
    assert sum(e.label.startswith("the caller") for e in tr.events) == 8


def test_batched_run_gives_one_track_per_vehicle_with_its_own_params_and_events():
    p = presets.rp1(F64)
    mass = jnp.array([0.9, 1.0, 1.2]) * p.mass
    ps = p.replace(mass=mass)
    s0 = qj.hover_state(p, position=(0.0, 0.0, 0.5))
    u = jnp.broadcast_to(qj.hover_rotor_speed(p), (200, 4))
    run = jax.jit(jax.vmap(lambda m: qj.simulate(p.replace(mass=m), s0, 5e-3, commands=u,
                                                 config=qj.SimConfig(save_every=2))))(mass)
    tr = player.trajectory_trace(run, ps, 5e-3)
    assert [t.name for t in tr.tracks] == ["vehicle 0", "vehicle 1", "vehicle 2"]
    assert tr.dt == pytest.approx(1e-2) and tr.t0 == pytest.approx(1e-2) and tr.num_samples == 100
    z_end = [t.position[-1, 2] for t in tr.tracks]
    assert z_end[0] > 0.5 > z_end[2]  # the light one climbs, the heavy one sinks on the same command
    heavy = [e for e in tr.events if e.track == 2 and e.label == "touch-down"]
    assert len(heavy) == 1 and not [e for e in tr.events if e.track == 0]


def test_closed_loop_saturation_report_reaches_the_trace():
    from quadjax import control as C

    p = presets.rp1(F64)
    s0 = qj.hover_state(p, position=(0.0, 0.0, 1.0))
    step = C.Step(start=jnp.array([0.0, 0.0, 1.0]), end=jnp.array([3.0, 0.0, 2.0]), t_step=jnp.asarray(0.1),
                  yaw=jnp.asarray(0.0))
    ctrl = C.PIDController.create(p, step)
    law = functools.partial(C.pid_control, rates=C.CascadeRates(dt=4e-3, position_every=1, attitude_every=1))
    weak = p.replace(k_f=p.k_f * 0.2)  # motors that cannot lift the vehicle: the collective is cut
    run = jax.jit(lambda s: qj.simulate(weak, s, 4e-3, controller=law, ctrl_params=ctrl,
                                        ctrl_state=C.pid_init(ctrl, s), num_ticks=300,
                                        hooks=(player.MixerReport(),)))(s0)
    report = np.asarray(run.outputs[0])
    assert report.shape == (300, 4) and set(np.unique(report)) <= {-1, 0, 1}
    assert np.mean(report[:, 3] == 1) > 0.5  # the mixer delivers less than the demanded collective
    tr = player.trajectory_trace(run, weak, 4e-3, saturation=run.outputs[0])
    np.testing.assert_array_equal(tr.tracks[0].saturation, report)
    data = P.page_data(tr)
    np.testing.assert_array_equal(P.dequantise(data["tracks"][0]["channels"]["saturation"]),
                                  report[(299 % data["stride"])::data["stride"]])


def test_repro_file_carries_the_flight_before_the_violation(tmp_path):
    p, s0, run = altimeter_run()
    path = write_repro(tmp_path / "bug.npz", run, p, DT)
    states, step = load_history(path)
    assert step == DT and states.position.shape == (800, 3)  # after ticks 0 … 799
    np.testing.assert_array_equal(states.position, np.asarray(run.states.position)[:800])
    tr = player.repro_trace(path)
    z = tr.tracks[0].position[:, 2]
    # the last sample is what step 800 was about to take: the corrected state, 2 cm below the ground
    assert tr.num_samples == 800 and z[-1] == pytest.approx(-0.02, abs=1e-9) and z[-2] >= 0
    assert tr.t0 + (tr.num_samples - 1) * tr.dt == pytest.approx(0.8)
    monitor = [e for e in tr.events if e.label.startswith("monitor:")]
    assert [e.t for e in monitor] == [pytest.approx(0.8)]
    bare = write_repro(tmp_path / "bare.npz", run, p, DT, history=False)
    assert load_history(bare) is None and player.repro_trace(bare).num_samples == 2


def synthetic_log(n=200, dt=0.01):
    from quadjax.sysid.synthetic import excitation, simulate_log

    # without rotor lag the log's rotor speeds are the ones that made the thrust, and without
    # battery sag the energy a window starts from (a log has none) does not matter: the true
    # model replays the log exactly
    p = presets.crazyflie21_brushless(F64).replace(motor_tau=jnp.asarray(0.0), battery_sag=jnp.asarray(0.0))
    s0 = qj.hover_state(p, position=(0.0, 0.0, 3.0))
    log = simulate_log(p, s0, excitation(p, n, dt, amplitude=(0.1, 0.01, 0.01, 0.05)), dt)
    assert np.min(log.position[:, 2]) > 0.1  # airborne throughout: no ground contact to replay
    return p, log


def test_validation_of_the_true_model_predicts_the_log_and_a_wrong_one_does_not():
    p, log = synthetic_log()
    right = player.validation_trace(log, p, horizon=30)
    measured, predicted = right.tracks
    assert predicted.role == "predicted" and predicted.of == 0 and measured.role == "measured"
    np.testing.assert_allclose(predicted.position[:181], log.position[:181], atol=1e-6)
    assert np.nanmax(predicted.error) < 1e-6
    wrong = player.validation_trace(log, p.replace(k_f=p.k_f * 1.1), horizon=30)
    err = wrong.tracks[1].error
    assert np.nanmax(err) > 1e-2
    assert np.all(err[0:151:30] == 0)  # each of the 6 windows starts at the measured state
    assert np.all(np.isnan(err[181:])) and len(err) == 201  # past the last whole window nothing is predicted


def test_trace_and_view_refuse_bad_input_with_the_field_named(tmp_path):
    p, s0, run = altimeter_run()
    with pytest.raises(ValueError, match="dt="):
        qj.view(run, p, path=tmp_path / "x.html")
    no_states = jax.jit(lambda s: qj.simulate(p, s, DT, commands=jnp.ones((10, 4)) * 1e3,
                                              config=qj.SimConfig(save_every=0)))(s0)
    with pytest.raises(ValueError, match="no saved quadrotor states"):
        player.trajectory_trace(no_states, p, DT)
    from quadjax import euler16

    e16 = euler16.from_quad_params(presets.cmu_plus())
    other = qj.simulate(e16, euler16.hover_state(e16), 2e-3, commands=jnp.tile(euler16.hover_wrench(e16), (5, 1)))
    with pytest.raises(ValueError, match="not QuadState"):
        player.trajectory_trace(other, e16, 2e-3)
    good = altimeter_trace()
    with pytest.raises(ValueError, match=r"tracks\[0\].attitude: shape \(1001, 3\)"):
        player.Trace(tracks=[player.Track("a", good.tracks[0].position, attitude=np.zeros((1001, 3)))], dt=DT)
    with pytest.raises(ValueError, match="dt="):
        player.Trace(tracks=good.tracks, dt=0.0)
    with pytest.raises(ValueError, match="names track 3"):
        player.Trace(tracks=good.tracks, dt=DT, events=[player.Event(0.1, "x", 3)])
    with pytest.raises(ValueError, match="cannot replay a dict"):
        qj.view({}, path=tmp_path / "x.html")
    with pytest.raises(ValueError, match="does not exist"):
        qj.view(good, path=tmp_path / "no" / "x.html")


def test_quantisation_error_is_within_its_documented_bound_and_keeps_missing_values():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5000, 3)) * [1.0, 100.0, 1e-3]
    x[7, 1] = np.nan
    x[:, 2] = 0.25  # a constant component is exact
    back = P.dequantise(P.quantise(x))
    bound = (np.nanmax(x, 0) - np.nanmin(x, 0)) / 131068
    err = np.abs(np.nan_to_num(back - x))
    assert np.all(err <= bound * (1 + 1e-9)) and np.isnan(back[7, 1]) and np.all(back[:, 2] == 0.25)
    assert np.max(err[:, 0]) > 0.25 * bound[0]  # the bound is not loose by orders of magnitude


def test_size_of_16_vehicles_for_20_s_at_100_hz_and_the_decimation_rules():
    T, rng = 2000, np.random.default_rng(1)
    q = rng.normal(size=(T, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    track = player.Track("v", rng.normal(size=(T, 3)), attitude=q, body_rates=rng.normal(size=(T, 3)),
                         rotor_speeds=rng.normal(size=(T, 4)), commands=rng.normal(size=(T, 4)),
                         thrust=rng.normal(size=(T, 4)), saturation=rng.integers(-1, 2, size=(T, 4)),
                         error=rng.normal(size=T))
    tr = player.Trace(tracks=[track] * 16, dt=0.01, reference=rng.normal(size=(T, 3)))
    html = player.render_html(tr)
    full = P.page_data(tr)
    assert full["stride"] == 1 and len(html.encode()) < 3e6  # "a few MB": every channel, every sample
    fast = player.Trace(tracks=[track] * 16, dt=0.001, reference=tr.reference)  # 1 kHz → stride 10
    data = P.page_data(fast)
    assert data["stride"] == 10 and data["count"] == 200 and data["dt"] == pytest.approx(0.01)
    assert data["t0"] == pytest.approx(0.009)  # counted back from the last sample, which is kept
    per_sample = raw_bytes(full) / T
    small = P.page_data(tr, max_bytes=1e5)
    stride = small["stride"]
    assert raw_bytes(small) <= 1e5 and small["count"] == len(range((T - 1) % stride, T, stride))
    assert T / (stride - 1) * per_sample > 1e5  # the smallest stride that fits


def raw_bytes(data):
    """Bytes of the channel data a page carries (before base64)."""
    encs = [enc for tr in data["tracks"] for enc in tr["channels"].values()] + [data["reference"]]
    return sum(len(base64.b64decode(enc["data"])) for enc in encs if enc)


def test_page_is_self_contained_and_its_text_cannot_break_out_of_the_script(tmp_path):
    tr = altimeter_trace()
    nasty = player.Trace(tracks=tr.tracks, dt=tr.dt, title="</script><img src=x onerror=alert(1)>",
                         events=[player.Event(0.5, "</script><script>alert(2)</script>")])
    html = player.render_html(nasty)
    assert html.count("</script>") == 2  # the data's and the player's own
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "fetch(" not in html and "XMLHttpRequest" not in html and "import(" not in html
    data = json.loads(re.search(r'id="quadjax-trace">(.*?)</script>', html, re.S).group(1))
    assert data["title"] == nasty.title and data["events"][0]["label"] == nasty.events[0].label


def test_cli_view_writes_pages_and_refuses_what_it_cannot_read(tmp_path, capsys):
    p, s0, run = altimeter_run()
    repro = write_repro(tmp_path / "bug.npz", run, p, DT)
    out = tmp_path / "bug.html"
    assert cli_main(["view", str(repro), "--out", str(out)]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out
    assert cli_main(["view", str(tmp_path / "missing.npz")]) == 2
    assert "no such file" in capsys.readouterr().out
    (tmp_path / "notes.txt").write_text("x")
    assert cli_main(["view", str(tmp_path / "notes.txt")]) == 2
    assert "unknown log type" in capsys.readouterr().out


# --------------------------------------------------------------------------- the browser


CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


def _chromium():
    for candidate in (os.environ.get("QUADJAX_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


class Browser:
    """A Chromium process of the test's own (stopped by its id) with Playwright attached over CDP."""

    def __init__(self, pw, extra=()):
        exe = _chromium()
        if exe is None:
            pytest.skip("no Chromium (apt-get install chromium, or set QUADJAX_CHROMIUM)")
        self.profile = tempfile.mkdtemp(prefix="quadjax-chromium-")
        # its log goes to a file, never a pipe: a pipe nobody drains would fill and stall it
        log = Path(self.profile) / "stderr.log"
        # TMPDIR inside the profile: Chromium's singleton folder (org.chromium.Chromium.*) goes with it
        with open(log, "w") as err:
            self.proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, *extra, f"--user-data-dir={self.profile}",
                                          "about:blank"], stdout=subprocess.DEVNULL, stderr=err,
                                         env=dict(os.environ, TMPDIR=self.profile))
        endpoint, deadline = None, time.monotonic() + 30
        while endpoint is None and time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"DevTools listening on (ws://127\.0\.0\.1:\d+/\S+)", log.read_text())
            if m:
                endpoint = m.group(1)
            else:
                time.sleep(0.05)
        if endpoint is None:
            self.close()
            pytest.skip("Chromium did not start its DevTools endpoint")
        try:
            self.browser = pw.chromium.connect_over_cdp(endpoint)
        except BaseException:  # never leave the process behind
            self.close()
            raise

    def page(self, path, *, fake_clock=False, width=1400, height=950):
        context = self.browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        page.errors = []
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        if fake_clock:
            page.clock.install()
        page.goto(Path(path).resolve().as_uri())
        page.wait_for_function("document.getElementById('quadjax-player').dataset.ready === 'true'", timeout=20000)
        if fake_clock:  # from here on the page's time moves only by clock.run_for
            page.clock.pause_at(page.evaluate("Date.now()") + 1000)
        return page

    def close(self):
        if hasattr(self, "browser"):
            self.browser.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def pw():
    """One Playwright driver for the module (its sync API allows one at a time)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if _chromium() is None:
        pytest.skip("no Chromium (apt-get install chromium, or set QUADJAX_CHROMIUM)")
    driver = sync_api.sync_playwright().start()
    yield driver
    driver.stop()


@pytest.fixture(scope="module")
def browser(pw):
    b = Browser(pw)
    yield b
    b.close()
    assert b.proc.poll() is not None  # the process is gone


@pytest.fixture(scope="module")
def altimeter_page(tmp_path_factory):
    return player.write_page(altimeter_trace(), tmp_path_factory.mktemp("player") / "altimeter.html")


def readout(page):
    text = page.inner_text(".qj-readout")
    m = re.match(r"t = (-?[\d.]+) s · sample (\d+) of (\d+) · speed ([\d/]+)× · (playing|paused)", text)
    assert m, text
    speed = m.group(4)
    speed = 1 / float(speed[2:]) if speed.startswith("1/") else float(speed)
    return {"time": float(m.group(1)), "index": int(m.group(2)), "count": int(m.group(3)), "speed": speed,
            "playing": m.group(5) == "playing"}


def page_trace(page):
    return json.loads(page.evaluate("document.getElementById('quadjax-trace').textContent"))


def test_every_key_moves_the_player_exactly_as_specified(browser, altimeter_page):
    page = browser.page(altimeter_page, fake_clock=True)
    data = page_trace(page)
    n, dt, t0 = data["count"], data["dt"], data["t0"]
    assert n == 101 and dt == pytest.approx(0.01) and t0 == 0.0  # 1 kHz decimated to 100 Hz
    page.click(".qj-view")  # focus the player
    r = readout(page)
    assert (r["index"], r["count"], r["speed"], r["playing"]) == (0, n, 1.0, False)
    steps = [("ArrowRight", 1), ("Shift+ArrowRight", 11), ("ArrowLeft", 10), ("Shift+ArrowLeft", 0),
             ("ArrowLeft", 0), ("Shift+ArrowLeft", 0), ("End", n - 1), ("ArrowRight", n - 1),
             ("Shift+ArrowRight", n - 1), ("Shift+ArrowLeft", n - 11), ("Home", 0)]
    for key, want in steps:
        page.keyboard.press(key)
        r = readout(page)
        assert r["index"] == want, key
        assert r["time"] == pytest.approx(t0 + want * dt, abs=5e-4), key
    speeds = [("]", 2.0), ("]", 4.0), ("[", 2.0), ("[", 1.0), ("[", 0.5)]
    for key, want in speeds:
        page.keyboard.press(key)
        assert readout(page)["speed"] == want, key
    for _ in range(10):
        page.keyboard.press("[")
    assert readout(page)["speed"] == 1 / 16  # the slowest
    for _ in range(12):
        page.keyboard.press("]")
    assert readout(page)["speed"] == 16.0  # the fastest
    for _ in range(4):
        page.keyboard.press("[")
    assert readout(page)["speed"] == 1.0

    # Space plays: half a second of the (fake) clock moves half a second of trace at 1×, a whole
    # one at 2×; the first frame after Space only starts the clock, so up to one frame (16 ms)
    # is not played
    def played(ms, speed):  # samples played in ms of clock: all, less at most one frame and the floor
        full = speed * ms / 1000 / dt
        return pytest.approx(full - (speed * 1000 / 60 / 1000 / dt + 1) / 2, abs=(speed * 1000 / 60 / 1000 / dt + 1) / 2)

    page.keyboard.press("Space")
    assert readout(page)["playing"]
    page.clock.run_for(500)
    moved = readout(page)["index"]
    assert moved == played(500, 1.0)
    page.keyboard.press("Space")
    assert not readout(page)["playing"]
    page.clock.run_for(500)
    assert readout(page)["index"] == moved  # paused: nothing moves
    page.keyboard.press("Home")
    page.keyboard.press("]")
    page.keyboard.press("Space")
    page.clock.run_for(400)
    assert readout(page)["index"] == played(400, 2.0)  # 0.4 s at 2× is 0.8 s of trace
    page.clock.run_for(5000)
    r = readout(page)
    assert r["index"] == n - 1 and not r["playing"]  # it stops at the end
    page.keyboard.press("Space")
    assert readout(page)["index"] == 0 and readout(page)["playing"]  # and Space there starts over
    page.keyboard.press("Space")
    state = page.evaluate("quadjaxPlayer.state()")
    assert state["index"] == readout(page)["index"] and state["speed"] == 2.0
    assert page.errors == []


def test_event_markers_sit_at_their_times_and_the_list_seeks_there(browser, altimeter_page):
    page = browser.page(altimeter_page)
    data = page_trace(page)
    t0, t_end = data["t0"], data["t0"] + (data["count"] - 1) * data["dt"]
    assert page.evaluate("quadjaxPlayer.webgl")
    panels = page.query_selector_all(".qj-panel")
    assert len(panels) == 4  # position, attitude, body rates, rotor speeds
    events = data["events"]
    assert [e["label"] for e in events if not e["label"].startswith("the caller")] == [
        "touch-down", "monitor: I5 below_ground before step 800: position.z = -0.02 m < ground_z = 0 m"]
    for panel in panels:
        width = panel.evaluate("e => e.clientWidth")
        markers = panel.query_selector_all(".qj-marker")
        assert len(markers) == len(events)
        for m, e in zip(markers, events):
            x = float(m.evaluate("e => getComputedStyle(e).left")[:-2])
            # the plot area runs from 54 px to width − 10 px (player.js MARGIN) over t0 … t_end
            assert x == pytest.approx(54 + (e["t"] - t0) / (t_end - t0) * (width - 64), abs=0.5), e["label"]
            assert float(m.get_attribute("data-t")) == e["t"] and m.get_attribute("title") == e["label"]
    items = page.query_selector_all(".qj-event")
    assert [i.inner_text().split(" s ", 1)[1] for i in items] == [e["label"] for e in events]
    touch = next(i for i in items if "touch-down" in i.inner_text())
    touch.query_selector("button").click()
    r = readout(page)
    t = next(e["t"] for e in events if e["label"] == "touch-down")
    assert abs(r["time"] - t) <= data["dt"] / 2 + 1e-9
    assert page.errors == []


def test_webgl_view_draws_the_vehicle_and_the_fallback_shows_the_same_trace(pw, altimeter_page, tmp_path):
    b = Browser(pw)
    try:
        page = b.page(altimeter_page)
        assert page.evaluate("quadjaxPlayer.webgl")
        assert not page.is_visible(".qj-nogl")
        drawn = page.evaluate("quadjaxPlayer.snapshot()")
        assert drawn["drawn"] > 0.002 * drawn["pixels"]
        page.screenshot(path=str(tmp_path / "webgl.png"))
        assert page.errors == []
    finally:
        b.close()
    b = Browser(pw, extra=["--disable-webgl", "--disable-3d-apis"])
    try:
        page = b.page(altimeter_page)
        assert page.evaluate("quadjaxPlayer.webgl") is False
        assert page.is_visible(".qj-nogl") and page.is_visible(".qj-2d") and not page.is_visible(".qj-gl")
        assert "The 3-D view needs WebGL" in page.inner_text(".qj-nogl")
        before = page.evaluate("quadjaxPlayer.snapshot()")
        assert before["drawn"] > 0.001 * before["pixels"]  # top and side views are drawn
        page.click(".qj-view")
        page.keyboard.press("End")
        assert readout(page)["index"] == readout(page)["count"] - 1
        after = page.evaluate("quadjaxPlayer.snapshot()")
        assert after["drawn"] != before["drawn"]  # the vehicle moved on the canvas
        assert page.errors == []
    finally:
        b.close()
    assert b.proc.poll() is not None


def test_a_sweep_writes_its_player_page_and_every_kept_vehicle_replays(browser, tmp_path):
    from quadjax import sweep

    result = sweep.run_sweep(small_sweep(), out_dir=tmp_path / "sweep")  # test_sweep's compilation
    page_path = tmp_path / "sweep" / "plots" / "player.html"
    assert page_path.is_file()
    assert "plots/player.html" in json.loads((tmp_path / "sweep" / "manifest.json").read_text())["plots"]
    page = browser.page(page_path, fake_clock=True)
    data = page_trace(page)
    assert len(data["tracks"]) == 48 and data["kind"] == "sweep"
    # what the page shows is the sweep's kept trajectory, to the quantisation's bound
    tr = result.trajectories
    j, k = 7, data["count"] - 1
    for c in range(3):
        shown = page.evaluate(f"quadjaxPlayer.value('position', {j}, {k}, {c})")
        enc = data["tracks"][j]["channels"]["position"]
        bound = (enc["hi"][c] - enc["lo"][c]) / 131068 + 1e-6
        assert shown == pytest.approx(float(tr["position"][j, -1, c]), abs=bound)
    assert {p["channel"] for p in data["panels"]} == {"position", "euler", "body_rates", "rotor_speeds",
                                                       "saturation", "error"}
    page.select_option(".qj-vehicle", "5")
    assert page.evaluate("quadjaxPlayer.state().selected") == 5
    page.click(".qj-view")
    page.keyboard.press("Space")
    page.clock.run_for(300)
    assert readout(page)["index"] > 0
    stats = page.evaluate("quadjaxPlayer.frameStats()")
    assert stats["render"]["frames"] > 0
    assert page.errors == []


def test_log_and_validation_pages_render_without_errors(browser, tmp_path):
    p, log = synthetic_log()
    for name, pg in (("log", qj.view(log, p, path=tmp_path / "log.html")),
                     ("validation", qj.view(log, fit=p.replace(k_f=p.k_f * 1.05), path=tmp_path / "val.html",
                                            horizon=30))):
        page = browser.page(pg.path)
        data = page_trace(page)
        assert data["kind"] == name
        assert page.evaluate("quadjaxPlayer.snapshot()")["drawn"] > 0
        if name == "validation":
            assert [t["role"] for t in data["tracks"]] == ["measured", "predicted"]
            assert page.query_selector(".qj-vehicle") is None  # a prediction is not a vehicle to pick
        assert page.errors == []
    # what a notebook displays inline: the same page in a sandboxed iframe, which plays there too
    page = browser.page(pg.path)
    page.set_content(pg._repr_html_())
    inner = page.frames[1]
    inner.wait_for_function("document.getElementById('quadjax-player').dataset.ready === 'true'")
    assert inner.evaluate("quadjaxPlayer.state().index") == 0 and inner.evaluate("quadjaxPlayer.count") > 1
    assert page.errors == []


def test_attitude_plot_is_unwrapped_through_whole_turns():
    yaw = np.linspace(0.0, 6 * np.pi, 601)  # three turns about z
    q = np.stack([np.cos(yaw / 2), 0 * yaw, 0 * yaw, np.sin(yaw / 2)], axis=1)
    tr = player.Trace(tracks=[player.Track("spin", np.zeros((601, 3)), attitude=q)], dt=0.01)
    shown = P.dequantise(P.page_data(tr)["tracks"][0]["channels"]["euler"])[:, 2]
    bound = 1080 / 131068 + 1e-6
    np.testing.assert_allclose(shown, np.degrees(yaw), atol=bound)  # no ±180° jumps


def test_base64_payload_matches_the_quantised_bytes():
    enc = P.quantise(np.array([[0.0], [1.0], [np.nan]]))
    q = np.frombuffer(base64.b64decode(enc["data"]), "<u2")
    assert q.tolist() == [0, 65534, 65535]
