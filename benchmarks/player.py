"""The trace player in a real headless browser: page sizes, load time and frame times, up to a
1 000-vehicle sweep; and the screenshots in docs/.

    python benchmarks/player.py            # ~2 min on 2 idle cores (needs Chromium and playwright)

Writes benchmarks/PLAYER_RESULTS.md (and .json) and docs/player-*.png. Everything runs on this
machine, one job at a time; run it with nothing else on the cores.

1. Pages. Two real sweeps (`quadjax.sweep.run_sweep`, the defaults: RP-1 on the figure-8, PID,
   gusts, 20 s at 125 Hz): 16 vehicles kept (the default page a sweep writes) and 1 000 kept;
   and seed 000's altimeter-bug trajectory (1 kHz, 1 s). Per page: the trace's samples, the
   decimation stride, the file size and the time to build it.
2. The browser. Debian's Chromium, headless, software WebGL (SwiftShader: no GPU here), a
   1 400 × 950 viewport, its DevTools endpoint on 127.0.0.1 (Playwright over CDP), the process
   stopped by its id at the end. Per page: load (navigation start to the player ready, which
   includes decoding the trace and the first frame), then 5 s of playback at 1× on the real
   clock: the time the player's own render takes per frame (JavaScript: building the scene,
   the WebGL calls, the plot cursors; mean, p95, max) and the interval between frames (what a
   user sees: requestAnimationFrame to requestAnimationFrame, which includes the compositor),
   and the time to switch the selected vehicle (redraws its layer of every plot). The same with WebGL off
   (the 2-D fallback) for the 1 000-vehicle page.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import quadjax as qj
from quadjax import player, presets, sweep
from quadjax.sweep import config as cfg

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


def altimeter_page(folder: Path) -> tuple[Path, float]:
    """Seed 000's scenario flown through the engine, and its page: (path, seconds to build the page)."""
    p = presets.rp1(jnp.float64)
    s0 = qj.hover_state(p, position=(0.0, 0.0, 0.3))
    u = jnp.broadcast_to(qj.hover_rotor_speed(p) * 0.97, (1000, 4))

    def fix(state, k):  # seed 000: the caller's altimeter correction, applied every 0.1 s
        due = (k % 100 == 0) & (k > 0)
        return state.replace(position=state.position.at[2].add(jnp.where(due, -0.02, 0.0)))

    run = jax.jit(lambda s: qj.simulate(p, s, 1e-3, commands=u, edit=fix, config=qj.SimConfig(check="monitor")))(s0)
    events = [player.Event(0.1 * k, "the caller applies the -2 cm altimeter correction") for k in range(1, 9)]
    desc = ["The vehicle hovers at 0.3 m on a command 3 % below the hover speed. Every 0.1 s the caller "
            "subtracts 2 cm from the state's height (meant once). The monitor stops the run at I5 before step 800."]
    jax.block_until_ready(run)
    t = time.perf_counter()
    path = qj.view(run, p, dt=1e-3, state0=s0, events=events, path=folder / "altimeter.html", description=desc,
                   title="seed 000: the altimeter bug").path
    return path, time.perf_counter() - t


class Chromium:
    def __init__(self, pw, extra=()):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            sys.exit("benchmarks/player.py needs Chromium (apt-get install chromium)")
        self.profile = tempfile.mkdtemp(prefix="quadjax-bench-chromium-")
        log = Path(self.profile) / "stderr.log"  # a file: an undrained pipe would stall the browser
        with open(log, "w") as err:  # TMPDIR in the profile: Chromium's singleton folder goes with it
            self.proc = subprocess.Popen([exe, *FLAGS, *extra, f"--user-data-dir={self.profile}", "about:blank"],
                                         stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ, TMPDIR=self.profile))
        m, deadline = None, time.monotonic() + 30
        while m is None and time.monotonic() < deadline:
            m = re.search(r"DevTools listening on (ws://127\.0\.0\.1:\d+/\S+)", log.read_text())
            time.sleep(0.05)
        try:
            if m is None:
                raise RuntimeError(f"Chromium did not start its DevTools endpoint:\n{log.read_text()[-2000:]}")
            self.browser = pw.chromium.connect_over_cdp(m.group(1))
        except BaseException:  # never leave the process behind
            self.proc.kill()
            self.proc.wait()
            raise
        self.version = self.browser.version

    def close(self):
        self.browser.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


def measure(browser: Chromium, path: Path, screenshot: Path | None = None, play_s: float = 5.0) -> dict:
    page = browser.browser.new_context(viewport={"width": 1400, "height": 950}).new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    t = time.perf_counter()
    page.goto(path.resolve().as_uri())
    page.wait_for_function("document.getElementById('quadjax-player').dataset.ready === 'true'", timeout=120000)
    load_s = time.perf_counter() - t
    page.evaluate("quadjaxPlayer.resetStats()")
    page.click(".qj-view")
    page.keyboard.press("Space")
    page.wait_for_timeout(play_s * 1000)
    page.keyboard.press("Space")
    stats = page.evaluate("quadjaxPlayer.frameStats()")
    select_ms = None
    if page.query_selector(".qj-vehicle"):
        select_ms = page.evaluate("""() => { const t = performance.now(); quadjaxPlayer.select(1);
                                   return performance.now() - t; }""")
    if screenshot is not None:
        page.keyboard.press("End")
        for _ in range(int(page.evaluate("quadjaxPlayer.count")) // 3):
            page.keyboard.press("ArrowLeft")
        page.wait_for_timeout(300)
        page.screenshot(path=str(screenshot))
    page.context.close()
    return {"load_s": load_s, "render_ms": stats["render"], "interval_ms": stats["interval"],
            "select_ms": select_ms, "console_errors": errors}


def main() -> int:
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="quadjax-bench-player-"))
    DOCS.mkdir(exist_ok=True)
    pages = {}
    pages["altimeter (1 vehicle, 1 kHz, 1 s)"] = altimeter_page(work)
    for keep in (16, 1000):
        conf = cfg.from_dict({"vehicles": max(keep, 16), "keep_trajectories": keep, "chunk_size": 1024})
        result = sweep.run_sweep(conf, plots=False)
        t = time.perf_counter()
        path = player.write_page(player.sweep_trace(result), work / f"sweep{keep}.html")
        pages[f"sweep, {keep} vehicles × 20 s"] = (path, time.perf_counter() - t)
    rows = []
    with sync_playwright() as pw:
        browser = Chromium(pw)
        shots = {"altimeter (1 vehicle, 1 kHz, 1 s)": DOCS / "player-altimeter.png",
                 "sweep, 16 vehicles × 20 s": DOCS / "player-sweep.png"}
        for name, (path, build_s) in pages.items():
            data = json.loads(re.search(r'id="quadjax-trace">(.*?)</script>', path.read_text(), re.S).group(1))
            r = measure(browser, path, shots.get(name))
            rows.append({"page": name, "view": "WebGL", "samples": data["count"], "stride": data["stride"],
                         "tracks": len(data["tracks"]), "mb": path.stat().st_size / 1e6, "build_s": build_s, **r})
        version = browser.version
        browser.close()
        fallback = Chromium(pw, ["--disable-webgl", "--disable-3d-apis"])
        for name in ("altimeter (1 vehicle, 1 kHz, 1 s)", "sweep, 1000 vehicles × 20 s"):
            path, build_s = pages[name]
            shot = DOCS / "player-fallback.png" if name.startswith("altimeter") else None
            r = measure(fallback, path, shot)
            data = json.loads(re.search(r'id="quadjax-trace">(.*?)</script>', path.read_text(), re.S).group(1))
            rows.append({"page": name, "view": "2-D fallback", "samples": data["count"], "stride": data["stride"],
                         "tracks": len(data["tracks"]), "mb": path.stat().st_size / 1e6, "build_s": build_s, **r})
        fallback.close()
    shutil.rmtree(work, ignore_errors=True)

    env = {"chromium": version, "python": platform.python_version(), "jax": jax.__version__,
           "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores"}
    (ROOT / "benchmarks" / "PLAYER_RESULTS.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    lines = ["# Trace player: page size, load and frame times in headless Chromium", "",
             "`python benchmarks/player.py`, one run on this project's 2-core machine (no GPU: Chromium's software "
             f"WebGL, SwiftShader), {env['chromium']}, viewport 1400 × 950, 5 s of playback at 1× per page.", "",
             "| page | view | tracks | samples (stride) | size MB | build s | load s | render ms mean / p95 / max "
             "| frame interval ms mean / p95 | select ms | console errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rd, iv = r["render_ms"], r["interval_ms"]
        sel = "—" if r["select_ms"] is None else f"{r['select_ms']:.0f}"
        lines.append(f"| {r['page']} | {r['view']} | {r['tracks']} | {r['samples']} ({r['stride']}) | {r['mb']:.2f} "
                     f"| {r['build_s']:.2f} | {r['load_s']:.2f} | {rd['mean_ms']:.1f} / {rd['p95_ms']:.1f} / "
                     f"{rd['max_ms']:.1f} | {iv['mean_ms']:.1f} / {iv['p95_ms']:.1f} | {sel} "
                     f"| {len(r['console_errors'])} |")
    lines += ["", "- *render*: the player's own JavaScript per frame (scene, WebGL calls, plot cursors); *frame "
              "interval*: requestAnimationFrame to requestAnimationFrame while playing (16.7 ms is the display's "
              "60 Hz), which includes the compositor and the software rasteriser.",
              "- *load*: navigation start to the player ready (decoding the quantised trace, laying out the plots, "
              "the first frame). *select*: switching the selected vehicle (its layer of every plot redrawn; the axes "
              "and the faint others again only where the new vehicle leaves their range).",
              "- *stride*: the page's decimation (`quadjax.player.page`): at most 100 Hz, and at most 12 MB of trace "
              "data, counted back from the last sample.",
              "- Above 64 vehicles the 3-D view draws rotors as crosses and the selected vehicle's trail only; the "
              "plots show the selected vehicle and 16 others faintly.",
              "- Screenshots from these runs: docs/player-altimeter.png, docs/player-sweep.png, "
              "docs/player-fallback.png."]
    (ROOT / "benchmarks" / "PLAYER_RESULTS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
