/* quadjax trace player.
 *
 * Written for quadjax and shipped inside the package; it uses no third-party code and is
 * distributed under the quadjax package's own licence. It reads the trace from
 * <script type="application/json" id="quadjax-trace"> (written by quadjax.player) and needs
 * no server and no network.
 *
 * Channels arrive quantised (see quadjax/player/trace.py): "u16" x = lo + q·(hi − lo)/65534,
 * q = 65535 marking a missing value; "i8" small integer codes as they are.
 * World frame ENU (z up), body frame FLU, quaternion (w, x, y, z) body → world.
 */
(function () {
  "use strict";

  var SPEEDS = [0.0625, 0.125, 0.25, 0.5, 1, 2, 4, 8, 16];
  var COMPONENT_COLOURS = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
  var NO_WEBGL = "The 3-D view needs WebGL, which this browser does not provide. " +
    "The plots and the description below show the same trace.";
  var KEYS = "Keys (with the player focused): Space play/pause \u00b7 \u2190 \u2192 one sample (Shift: ten) " +
    "\u00b7 Home/End \u00b7 [ ] speed";
  var TRAIL_S = 2.0;          // seconds of trail behind each vehicle
  var DETAIL_VEHICLES = 64;   // above this many, rotors are drawn as crosses and only the selected trail
  var FAINT_OTHERS = 16;      // other vehicles drawn faintly in the plots

  // ------------------------------------------------------------------ data

  function base64Bytes(text) {
    var bin = atob(text), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function decode(enc) {
    var bytes = base64Bytes(enc.data), T = enc.shape[0], C = enc.shape.length > 1 ? enc.shape[1] : 1;
    var out = new Float32Array(T * C), view = new DataView(bytes.buffer), k, c;
    if (enc.type === "i8") {
      for (k = 0; k < T * C; k++) out[k] = view.getInt8(k);
    } else {
      var lo = enc.lo, span = [];
      for (c = 0; c < C; c++) span.push((enc.hi[c] - enc.lo[c]) / 65534);
      for (k = 0; k < T * C; k++) {
        var q = view.getUint16(2 * k, true);
        c = k % C;
        out[k] = q === 65535 ? NaN : lo[c] + q * span[c];
      }
    }
    var lo = Infinity, hi = -Infinity;  // the finite range, for the plots' axes
    for (k = 0; k < T * C; k++) if (isFinite(out[k])) { lo = Math.min(lo, out[k]); hi = Math.max(hi, out[k]); }
    return { T: T, C: C, v: out, lo: lo, hi: hi, at: function (t, c) { return out[t * C + (c || 0)]; } };
  }

  var trace = JSON.parse(document.getElementById("quadjax-trace").textContent);
  var count = trace.count, t0 = trace.t0, dt = trace.dt;
  var tracks = trace.tracks.map(function (tr) {
    var ch = {};
    Object.keys(tr.channels).forEach(function (name) { ch[name] = decode(tr.channels[name]); });
    return { name: tr.name, role: tr.role, of: tr.of, ch: ch };
  });
  var reference = trace.reference ? decode(trace.reference) : null;
  var events = trace.events || [];

  function timeOf(i) { return t0 + i * dt; }
  var tEnd = timeOf(count - 1);

  // ------------------------------------------------------------------ state

  var state = { index: 0, playing: false, speed: 4, selected: trace.selected || 0, follow: false };
  var clock = { time: t0, last: null };
  var stats = { render: [], interval: [], lastFrame: null };

  // ------------------------------------------------------------------ DOM

  function el(tag, cls, parent, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  var root = document.getElementById("quadjax-player");
  root.tabIndex = 0;
  root.setAttribute("role", "application");
  root.setAttribute("aria-label", trace.title + ". " + KEYS);
  var header = el("header", "qj-header", root);
  el("h1", "qj-title", header, trace.title);
  el("span", "qj-kind", header, trace.kind);
  var main = el("div", "qj-main", root);
  var viewBox = el("div", "qj-view", main);
  var glCanvas = el("canvas", "qj-gl", viewBox);
  var flatCanvas = el("canvas", "qj-2d", viewBox);
  var noGl = el("p", "qj-nogl", viewBox, NO_WEBGL);
  var legend = el("div", "qj-legend", viewBox);
  var plotsBox = el("div", "qj-plots", main);
  var bar = el("div", "qj-bar", root);
  var playButton = el("button", "qj-play", bar, "\u25b6");
  var scrub = el("input", "qj-scrub", bar);
  scrub.type = "range"; scrub.min = 0; scrub.max = count - 1; scrub.step = 1; scrub.value = 0;
  var readout = el("span", "qj-readout", bar);
  var picker = null;
  var pickable = [];
  tracks.forEach(function (tr, i) { if (tr.of === null || tr.of === undefined) pickable.push(i); });
  if (pickable.length > 1) {
    picker = el("select", "qj-vehicle", bar);
    pickable.forEach(function (i) { var o = el("option", null, picker, tracks[i].name); o.value = i; });
    picker.value = state.selected;
  }
  var followLabel = el("label", "qj-follow", bar);
  var followBox = el("input", null, followLabel);
  followBox.type = "checkbox";
  followLabel.appendChild(document.createTextNode(" follow"));
  el("p", "qj-keys", root, KEYS);
  var description = el("div", "qj-description", root);
  (trace.description || []).forEach(function (line) { el("p", null, description, line); });
  var eventList = el("ul", "qj-events", root);

  [playButton, scrub, followBox].concat(picker ? [picker] : []).forEach(function (c) {
    c.tabIndex = -1;  // the player, not its controls, keeps the focus: the keys act on it
  });
  playButton.addEventListener("mousedown", function (e) { e.preventDefault(); });
  playButton.addEventListener("click", function () { togglePlay(); root.focus(); });
  scrub.addEventListener("input", function () { seek(parseInt(scrub.value, 10)); });
  scrub.addEventListener("change", function () { root.focus(); });
  followBox.addEventListener("change", function () { state.follow = followBox.checked; root.focus(); dirty(); });
  if (picker) picker.addEventListener("change", function () {
    state.selected = parseInt(picker.value, 10); drawPlots(true); placeMarkers(); root.focus(); dirty();
  });

  // ------------------------------------------------------------------ transport

  var needsDraw = true;
  function dirty() { needsDraw = true; updateReadout(); }  // the readout at once, the drawing next frame

  function seek(i) {
    state.index = Math.max(0, Math.min(count - 1, i));
    clock.time = timeOf(state.index);
    dirty();
  }

  function togglePlay() {
    if (!state.playing && state.index >= count - 1) seek(0);  // play at the end starts over
    state.playing = !state.playing;
    clock.time = timeOf(state.index);
    clock.last = null;
    dirty();
  }

  function onKey(e) {
    var handled = true;
    if (e.key === " " || e.code === "Space") togglePlay();
    else if (e.key === "ArrowRight") seek(state.index + (e.shiftKey ? 10 : 1));
    else if (e.key === "ArrowLeft") seek(state.index - (e.shiftKey ? 10 : 1));
    else if (e.key === "Home") seek(0);
    else if (e.key === "End") seek(count - 1);
    else if (e.key === "[") { state.speed = Math.max(0, state.speed - 1); dirty(); }
    else if (e.key === "]") { state.speed = Math.min(SPEEDS.length - 1, state.speed + 1); dirty(); }
    else handled = false;
    if (handled) { e.preventDefault(); e.stopPropagation(); }
  }
  root.addEventListener("keydown", onKey, true);
  root.addEventListener("mousedown", function () { root.focus(); });

  function speedText(s) { return s >= 1 ? s + "\u00d7" : "1/" + Math.round(1 / s) + "\u00d7"; }

  function updateReadout() {
    var t = timeOf(state.index), s = SPEEDS[state.speed];
    readout.textContent = "t = " + t.toFixed(3) + " s \u00b7 sample " + state.index + " of " + count +
      " \u00b7 speed " + speedText(s) + (state.playing ? " \u00b7 playing" : " \u00b7 paused");
    readout.dataset.index = state.index;
    readout.dataset.time = t;
    readout.dataset.speed = s;
    readout.dataset.playing = state.playing;
    playButton.textContent = state.playing ? "\u275a\u275a" : "\u25b6";
    if (parseInt(scrub.value, 10) !== state.index) scrub.value = state.index;
  }

  // ------------------------------------------------------------------ geometry

  function quatMatrix(q) {  // rotation body → world of a unit (w, x, y, z), row major
    var w = q[0], x = q[1], y = q[2], z = q[3];
    return [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
      2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
      2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)];
  }
  function rotate(R, v) {
    return [R[0] * v[0] + R[1] * v[1] + R[2] * v[2], R[3] * v[0] + R[4] * v[1] + R[5] * v[2],
      R[6] * v[0] + R[7] * v[1] + R[8] * v[2]];
  }
  function vec(ch, i) { return ch ? [ch.at(i, 0), ch.at(i, 1), ch.at(i, 2)] : null; }
  function quat(ch, i) {
    if (!ch) return [1, 0, 0, 0];
    var q = [ch.at(i, 0), ch.at(i, 1), ch.at(i, 2), ch.at(i, 3)];
    var n = Math.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]) || 1;  // undo the quantisation's last bit
    return [q[0] / n, q[1] / n, q[2] / n, q[3] / n];
  }

  var bounds = (function () {
    var lo = [Infinity, Infinity, Infinity], hi = [-Infinity, -Infinity, -Infinity];
    function add(ch) {
      for (var i = 0; i < ch.T; i++) for (var c = 0; c < 3; c++) {
        var x = ch.at(i, c);
        if (isFinite(x)) { lo[c] = Math.min(lo[c], x); hi[c] = Math.max(hi[c], x); }
      }
    }
    tracks.forEach(function (tr) { if (tr.ch.position) add(tr.ch.position); });
    if (reference) add(reference);
    if (!isFinite(lo[0])) { lo = [-1, -1, 0]; hi = [1, 1, 1]; }
    lo[2] = Math.min(lo[2], trace.ground_z); hi[2] = Math.max(hi[2], trace.ground_z);
    var centre = [0, 1, 2].map(function (c) { return (lo[c] + hi[c]) / 2; });
    var radius = Math.max(0.5, 0.5 * Math.sqrt([0, 1, 2].reduce(function (s, c) {
      return s + (hi[c] - lo[c]) * (hi[c] - lo[c]); }, 0)));
    return { lo: lo, hi: hi, centre: centre, radius: radius };
  })();

  var rotors = trace.rotors ? trace.rotors.positions : [[0.08, -0.08, 0], [-0.08, 0.08, 0], [0.08, 0.08, 0], [-0.08, -0.08, 0]];
  var spins = trace.rotors ? trace.rotors.spins : [1, 1, -1, -1];
  var arm = rotors.reduce(function (m, r) { return Math.max(m, Math.sqrt(r[0] * r[0] + r[1] * r[1])); }, 0) || 0.1;
  var drawScale = Math.max(1, 0.05 * bounds.radius / arm);  // a vehicle stays visible in a big scene
  var thrustScale = trace.hover_thrust > 0 ? arm / trace.hover_thrust : 0;  // hover thrust: one arm long

  function vehicleParts(tr, i) {  // world-frame hubs, thrust tips, nose of track tr at sample i
    var p = vec(tr.ch.position, i);
    if (!p || !isFinite(p[0])) return null;
    var R = quatMatrix(quat(tr.ch.attitude, i)), s = drawScale;
    var up = rotate(R, [0, 0, 1]), hubs = [], tips = [];
    rotors.forEach(function (r, j) {
      var h = rotate(R, [r[0] * s, r[1] * s, r[2] * s]);
      h = [p[0] + h[0], p[1] + h[1], p[2] + h[2]];
      hubs.push(h);
      var T = tr.ch.thrust ? tr.ch.thrust.at(i, j) : NaN, L = isFinite(T) ? T * thrustScale * s : 0;
      tips.push([h[0] + up[0] * L, h[1] + up[1] * L, h[2] + up[2] * L]);
    });
    var n = rotate(R, [arm * s * 0.8, 0, 0]);
    return { p: p, R: R, hubs: hubs, tips: tips, nose: [p[0] + n[0], p[1] + n[1], p[2] + n[2]] };
  }

  // ------------------------------------------------------------------ 3-D view (WebGL)

  var gl = null;
  try {
    gl = glCanvas.getContext("webgl", { antialias: true }) || glCanvas.getContext("experimental-webgl");
  } catch (err) { gl = null; }
  var webgl = !!gl;
  glCanvas.hidden = !webgl;
  flatCanvas.hidden = webgl;
  noGl.hidden = webgl;

  var program = null, buffer = null, verts = new Float32Array(1 << 16), nverts = 0;
  var camera = { az: -Math.PI / 3, el: 0.45, dist: 2.4 * bounds.radius };

  function shader(type, src) {
    var s = gl.createShader(type);
    gl.shaderSource(s, src);
    gl.compileShader(s);
    return s;
  }
  if (webgl) {
    program = gl.createProgram();
    gl.attachShader(program, shader(gl.VERTEX_SHADER,
      "attribute vec3 p; attribute vec4 c; uniform mat4 m; varying vec4 v;" +
      "void main() { gl_Position = m * vec4(p, 1.0); v = c; }"));
    gl.attachShader(program, shader(gl.FRAGMENT_SHADER,
      "precision mediump float; varying vec4 v; void main() { gl_FragColor = v; }"));
    gl.linkProgram(program);
    buffer = gl.createBuffer();
  }

  function rgba(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return [(n >> 16 & 255) / 255, (n >> 8 & 255) / 255, (n & 255) / 255, a];
  }
  function push(x, y, z, c) {
    if (nverts * 7 + 7 > verts.length) { var g = new Float32Array(verts.length * 2); g.set(verts); verts = g; }
    var k = nverts * 7;
    verts[k] = x; verts[k + 1] = y; verts[k + 2] = z;
    verts[k + 3] = c[0]; verts[k + 4] = c[1]; verts[k + 5] = c[2]; verts[k + 6] = c[3];
    nverts++;
  }
  function line(a, b, c) {
    if (!isFinite(a[0] + a[1] + a[2] + b[0] + b[1] + b[2])) return;
    push(a[0], a[1], a[2], c); push(b[0], b[1], b[2], c);
  }

  function perspective(fovy, aspect, near, far) {
    var f = 1 / Math.tan(fovy / 2), nf = 1 / (near - far);
    return [f / aspect, 0, 0, 0, 0, f, 0, 0, 0, 0, (far + near) * nf, -1, 0, 0, 2 * far * near * nf, 0];
  }
  function lookAt(eye, at, up) {  // column major, as WebGL wants
    var z = norm(sub(eye, at)), x = norm(cross(up, z)), y = cross(z, x);
    return [x[0], y[0], z[0], 0, x[1], y[1], z[1], 0, x[2], y[2], z[2], 0,
      -dot(x, eye), -dot(y, eye), -dot(z, eye), 1];
  }
  function mul(a, b) {
    var o = new Array(16);
    for (var c = 0; c < 4; c++) for (var r = 0; r < 4; r++) {
      var s = 0;
      for (var k = 0; k < 4; k++) s += a[k * 4 + r] * b[c * 4 + k];
      o[c * 4 + r] = s;
    }
    return o;
  }
  function sub(a, b) { return [a[0] - b[0], a[1] - b[1], a[2] - b[2]]; }
  function dot(a, b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
  function cross(a, b) { return [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]; }
  function norm(a) { var n = Math.sqrt(dot(a, a)) || 1; return [a[0] / n, a[1] / n, a[2] / n]; }

  function niceStep(x) {
    var e = Math.pow(10, Math.floor(Math.log10(x))), f = x / e;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * e;
  }

  var COL = {
    grid: rgba("#b8bcc4", 0.7), reference: rgba("#7f7f7f", 0.9), arm: rgba("#202020", 1),
    armOther: rgba("#6b6b6b", 0.8), ccw: rgba("#2ca02c", 1), cw: rgba("#1f77b4", 1), thrust: rgba("#ff7f0e", 1),
    nose: rgba("#d62728", 1), trail: rgba("#9467bd", 1), predicted: rgba("#ff7f0e", 0.9), shadow: rgba("#000000", 0.18),
  };

  function addVehicle(tr, i, selected, detail) {
    var v = vehicleParts(tr, i);
    if (!v) return;
    var armC = tr.role === "predicted" ? COL.predicted : selected ? COL.arm : COL.armOther;
    v.hubs.forEach(function (h, j) {
      line(v.p, h, armC);
      var c = spins[j] > 0 ? COL.ccw : COL.cw, r = 0.45 * arm * drawScale;
      if (detail) {
        var segs = 14, prev = null;
        for (var s = 0; s <= segs; s++) {
          var a = 2 * Math.PI * s / segs, d = rotate(v.R, [r * Math.cos(a), r * Math.sin(a), 0]);
          var q = [h[0] + d[0], h[1] + d[1], h[2] + d[2]];
          if (prev) line(prev, q, c);
          prev = q;
        }
      } else {
        var dx = rotate(v.R, [r, 0, 0]), dy = rotate(v.R, [0, r, 0]);
        line(sub(h, dx), [h[0] + dx[0], h[1] + dx[1], h[2] + dx[2]], c);
        line(sub(h, dy), [h[0] + dy[0], h[1] + dy[1], h[2] + dy[2]], c);
      }
      if (tr.ch.thrust) line(h, v.tips[j], COL.thrust);
    });
    line(v.p, v.nose, COL.nose);
    if (selected) line(v.p, [v.p[0], v.p[1], trace.ground_z], COL.shadow);  // a drop line to the ground
  }

  function addTrail(tr, i) {
    var pos = tr.ch.position, n = Math.max(1, Math.round(TRAIL_S / dt)), start = Math.max(0, i - n);
    var c = tr.role === "predicted" ? COL.predicted : COL.trail;
    for (var k = start; k < i; k++) {
      var a = 0.15 + 0.85 * (k - start) / (i - start);
      line(vec(pos, k), vec(pos, k + 1), [c[0], c[1], c[2], a]);
    }
  }

  function buildScene() {
    nverts = 0;
    var step = niceStep(bounds.radius / 4), z = trace.ground_z;
    var x0 = Math.floor((bounds.centre[0] - 1.3 * bounds.radius) / step) * step;
    var y0 = Math.floor((bounds.centre[1] - 1.3 * bounds.radius) / step) * step;
    var n = Math.ceil(2.6 * bounds.radius / step);
    for (var k = 0; k <= n; k++) {
      line([x0 + k * step, y0, z], [x0 + k * step, y0 + n * step, z], COL.grid);
      line([x0, y0 + k * step, z], [x0 + n * step, y0 + k * step, z], COL.grid);
    }
    if (reference) for (var r = 0; r + 1 < reference.T; r++) line(vec(reference, r), vec(reference, r + 1), COL.reference);
    var detail = tracks.length <= DETAIL_VEHICLES, i = state.index;
    tracks.forEach(function (tr, j) {
      var selected = j === state.selected || tr.of === state.selected;
      if (detail || selected) addTrail(tr, i);
      if (!selected) addVehicle(tr, i, false, detail);
    });
    tracks.forEach(function (tr, j) {  // the selected vehicle last, on top
      if (j === state.selected || tr.of === state.selected) addVehicle(tr, i, true, true);
    });
  }

  function cameraTarget() {
    if (state.follow) {
      var p = vec(tracks[state.selected].ch.position, state.index);
      if (p && isFinite(p[0])) return p;
    }
    return bounds.centre;
  }

  function sizeCanvas(c) {
    var dpr = window.devicePixelRatio || 1, w = Math.max(1, c.clientWidth), h = Math.max(1, c.clientHeight);
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
    }
    return dpr;
  }

  function drawGl() {
    sizeCanvas(glCanvas);
    buildScene();
    var at = cameraTarget(), ce = Math.cos(camera.el);
    var eye = [at[0] + camera.dist * ce * Math.cos(camera.az), at[1] + camera.dist * ce * Math.sin(camera.az),
      at[2] + camera.dist * Math.sin(camera.el)];
    var m = mul(perspective(0.8, glCanvas.width / glCanvas.height, camera.dist / 100, camera.dist * 20),
      lookAt(eye, at, [0, 0, 1]));
    gl.viewport(0, 0, glCanvas.width, glCanvas.height);
    gl.clearColor(0.97, 0.97, 0.98, 1);
    gl.clear(gl.COLOR_BUFFER_BIT | gl.DEPTH_BUFFER_BIT);
    gl.enable(gl.BLEND);
    gl.blendFunc(gl.SRC_ALPHA, gl.ONE_MINUS_SRC_ALPHA);
    gl.useProgram(program);
    gl.uniformMatrix4fv(gl.getUniformLocation(program, "m"), false, new Float32Array(m));
    gl.bindBuffer(gl.ARRAY_BUFFER, buffer);
    gl.bufferData(gl.ARRAY_BUFFER, verts.subarray(0, nverts * 7), gl.DYNAMIC_DRAW);
    var p = gl.getAttribLocation(program, "p"), c = gl.getAttribLocation(program, "c");
    gl.enableVertexAttribArray(p);
    gl.enableVertexAttribArray(c);
    gl.vertexAttribPointer(p, 3, gl.FLOAT, false, 28, 0);
    gl.vertexAttribPointer(c, 4, gl.FLOAT, false, 28, 12);
    gl.drawArrays(gl.LINES, 0, nverts);
  }

  // ------------------------------------------------------------------ fallback view (2-D canvas)

  function drawFlat() {  // top (x–y) and side (x–z) views, orthographic, one scale each
    var dpr = sizeCanvas(flatCanvas), ctx = flatCanvas.getContext("2d");
    var W = flatCanvas.width / dpr, H = flatCanvas.height / dpr;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#f7f7f9"; ctx.fillRect(0, 0, W, H);
    var panes = [{ x: 0, w: W / 2, a: 0, b: 1, name: "top view (x, y)" }, { x: W / 2, w: W / 2, a: 0, b: 2, name: "side view (x, z)" }];
    panes.forEach(function (pane) {
      var pad = 18, lo = bounds.lo, hi = bounds.hi, least = Math.max(0.5, 6 * arm * drawScale);
      var sa = Math.max(hi[pane.a] - lo[pane.a], least), sb = Math.max(hi[pane.b] - lo[pane.b], least);
      var k = Math.min((pane.w - 2 * pad) / sa, (H - 2 * pad - 14) / sb);
      ctx.save();
      ctx.beginPath(); ctx.rect(pane.x, 0, pane.w, H); ctx.clip();
      ctx.strokeStyle = "#d0d3d8"; ctx.strokeRect(pane.x + 0.5, 0.5, pane.w - 1, H - 1);
      function X(p) { return pane.x + pane.w / 2 + (p[pane.a] - (lo[pane.a] + hi[pane.a]) / 2) * k; }
      function Y(p) { return 14 + (H - 14) / 2 - (p[pane.b] - (lo[pane.b] + hi[pane.b]) / 2) * k; }
      function seg(a, b, colour, width) {
        if (!a || !b || !isFinite(a[0] + b[0])) return;
        ctx.strokeStyle = colour; ctx.lineWidth = width || 1;
        ctx.beginPath(); ctx.moveTo(X(a), Y(a)); ctx.lineTo(X(b), Y(b)); ctx.stroke();
      }
      ctx.fillStyle = "#444"; ctx.font = "11px sans-serif"; ctx.fillText(pane.name, pane.x + 6, 12);
      if (pane.b === 2) seg([lo[0] - 10, 0, trace.ground_z], [hi[0] + 10, 0, trace.ground_z], "#999", 1);
      if (reference) for (var r = 0; r + 1 < reference.T; r++) seg(vec(reference, r), vec(reference, r + 1), "#9a9a9a");
      var i = state.index, detail = tracks.length <= DETAIL_VEHICLES;
      tracks.forEach(function (tr, j) {
        var selected = j === state.selected || tr.of === state.selected;
        if (detail || selected) {
          var n = Math.round(TRAIL_S / dt);
          for (var q = Math.max(0, i - n); q < i; q++) seg(vec(tr.ch.position, q), vec(tr.ch.position, q + 1), "#9467bd");
        }
        var v = vehicleParts(tr, i);
        if (!v) return;
        v.hubs.forEach(function (h, m) {
          seg(v.p, h, tr.role === "predicted" ? "#ff7f0e" : selected ? "#202020" : "#888", selected ? 2 : 1);
          if (tr.ch.thrust) seg(h, v.tips[m], "#ff7f0e", 1.5);
        });
        seg(v.p, v.nose, "#d62728", 2);
      });
      ctx.restore();
    });
  }

  // ------------------------------------------------------------------ camera input

  (function () {
    var drag = null;
    viewBox.addEventListener("mousedown", function (e) { drag = [e.clientX, e.clientY]; });
    window.addEventListener("mouseup", function () { drag = null; });
    window.addEventListener("mousemove", function (e) {
      if (!drag) return;
      camera.az -= (e.clientX - drag[0]) * 0.01;
      camera.el = Math.max(-1.5, Math.min(1.5, camera.el + (e.clientY - drag[1]) * 0.01));
      drag = [e.clientX, e.clientY];
      dirty();
    });
    viewBox.addEventListener("wheel", function (e) {
      e.preventDefault();
      camera.dist *= Math.exp(e.deltaY * 0.001);
      dirty();
    }, { passive: false });
  })();

  // ------------------------------------------------------------------ plots

  var MARGIN = { left: 54, right: 10, top: 16, bottom: 16 };
  var panels = (trace.panels || []).map(function (spec) {
    var box = el("div", "qj-panel", plotsBox);
    // three layers: axes and the other vehicles faint (drawn on resize), the selected vehicle
    // (drawn when the selection changes), the cursor (every frame)
    var base = el("canvas", "qj-base", box), chosen = el("canvas", "qj-chosen", box);
    var cursor = el("canvas", "qj-cursor", box), markers = el("div", "qj-markers", box);
    box.addEventListener("mousedown", function (e) { scrubFrom(e, box); });
    box.addEventListener("mousemove", function (e) { if (e.buttons & 1) scrubFrom(e, box); });
    return { spec: spec, box: box, base: base, chosen: chosen, cursor: cursor, markers: markers, lo: 0, hi: 1 };
  });

  function plotWidth(panel) { return Math.max(1, panel.box.clientWidth - MARGIN.left - MARGIN.right); }
  function timeToX(t, panel) {
    return MARGIN.left + (tEnd > t0 ? (t - t0) / (tEnd - t0) : 0) * plotWidth(panel);
  }
  function scrubFrom(e, box) {
    var r = box.getBoundingClientRect(), panel = panels.filter(function (p) { return p.box === box; })[0];
    var t = t0 + (e.clientX - r.left - MARGIN.left) / plotWidth(panel) * (tEnd - t0);
    seek(Math.round((t - t0) / dt));
  }

  function group(j) {  // a vehicle and its predictions
    var out = [];
    tracks.forEach(function (tr, k) { if (k === j || tr.of === j) out.push(k); });
    return out;
  }
  var faint = pickable.slice(0, FAINT_OTHERS + 1);  // other vehicles shown faintly, whichever is selected

  function channelRange(ks, spec) {
    var lo = Infinity, hi = -Infinity;
    ks.forEach(function (k) {
      [spec.channel, spec.dashed].forEach(function (name) {
        var ch = name && tracks[k].ch[name];
        if (ch) { lo = Math.min(lo, ch.lo); hi = Math.max(hi, ch.hi); }
      });
    });
    if (spec.reference && reference) { lo = Math.min(lo, reference.lo); hi = Math.max(hi, reference.hi); }
    return [lo, hi];
  }

  function plotY(panel, H) {
    var top = MARGIN.top, h = H - MARGIN.top - MARGIN.bottom;
    return function (v) { return top + (panel.hi - v) / (panel.hi - panel.lo) * h; };
  }

  function series(ctx, panel, H, ch, c, colour, alpha, dash, stepped) {
    var Y = plotY(panel, H);
    ctx.strokeStyle = colour; ctx.globalAlpha = alpha; ctx.setLineDash(dash); ctx.lineWidth = alpha < 1 ? 1 : 1.4;
    ctx.beginPath();
    var open = false, lastY = 0, T = ch.T, stride = Math.max(1, Math.floor(T / plotWidth(panel)));
    for (var i = 0; i < T; i += stride) {
      var v = ch.at(i, c), X = timeToX(timeOf(i), panel);
      if (!isFinite(v)) { open = false; continue; }
      if (!open) { ctx.moveTo(X, Y(v)); open = true; }
      else if (stepped) { ctx.lineTo(X, lastY); ctx.lineTo(X, Y(v)); }
      else ctx.lineTo(X, Y(v));
      lastY = Y(v);
    }
    ctx.stroke();
    ctx.globalAlpha = 1; ctx.setLineDash([]);
  }

  function layer(canvas) {
    var dpr = sizeCanvas(canvas), ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, canvas.width / dpr, canvas.height / dpr);
    return { ctx: ctx, W: canvas.width / dpr, H: canvas.height / dpr };
  }

  function clipped(ctx, panel, H, draw) {
    ctx.save();
    ctx.beginPath(); ctx.rect(MARGIN.left, MARGIN.top, plotWidth(panel), H - MARGIN.top - MARGIN.bottom); ctx.clip();
    draw();
    ctx.restore();
  }

  function drawBase(panel, n) {  // axes, labels, the other vehicles faint; the y range fits them and the selection
    var spec = panel.spec, L = layer(panel.base), ctx = L.ctx, W = L.W, H = L.H;
    sizeCanvas(panel.cursor);
    var r = channelRange(faint.concat(group(state.selected)).reduce(function (a, j) { return a.concat(group(j)); }, []), spec);
    var lo = r[0], hi = r[1];
    if (!isFinite(lo)) { lo = -1; hi = 1; }
    if (spec.step) { lo = Math.min(lo, -1); hi = Math.max(hi, 1); }
    if (spec.min_span && hi - lo < spec.min_span) {
      var mid = (lo + hi) / 2; lo = mid - spec.min_span / 2; hi = mid + spec.min_span / 2;
    }
    var pad = (hi - lo) * 0.08 || Math.max(Math.abs(hi) * 0.1, 0.1);
    panel.lo = lo - pad; panel.hi = hi + pad;
    var Y = plotY(panel, H), h = H - MARGIN.top - MARGIN.bottom;
    ctx.strokeStyle = "#d0d3d8"; ctx.lineWidth = 1;
    ctx.strokeRect(MARGIN.left, MARGIN.top, plotWidth(panel), h);
    ctx.fillStyle = "#555"; ctx.font = "10px sans-serif"; ctx.textAlign = "right";
    [lo, (lo + hi) / 2, hi].forEach(function (v) {
      ctx.fillText(formatValue(v, hi - lo), MARGIN.left - 4, Y(v) + 3);
      ctx.beginPath(); ctx.moveTo(MARGIN.left, Y(v)); ctx.lineTo(MARGIN.left + plotWidth(panel), Y(v));
      ctx.strokeStyle = "#eceef1"; ctx.stroke();
    });
    if (n === panels.length - 1) {  // the time axis under the last panel
      var st = niceStep((tEnd - t0) / 6 || 1);
      for (var tt = Math.ceil(t0 / st) * st; tt <= tEnd + 1e-9; tt += st) {
        var tx = timeToX(tt, panel);
        ctx.textAlign = tx > W - 30 ? "right" : "center";
        ctx.fillText(formatValue(tt) + " s", Math.min(tx, W - 2), H - 3);
      }
    }
    ctx.textAlign = "left"; ctx.fillStyle = "#222"; ctx.font = "11px sans-serif";
    ctx.fillText(spec.title, MARGIN.left + 4, 11);
    var x = MARGIN.left + 8 + ctx.measureText(spec.title).width;
    (spec.labels || []).forEach(function (label, c) {
      ctx.fillStyle = COMPONENT_COLOURS[c % COMPONENT_COLOURS.length];
      ctx.fillText(label, x + 4, 11); x += ctx.measureText(label).width + 8;
    });
    if (spec.note) { ctx.fillStyle = "#777"; ctx.fillText(spec.note, x + 8, 11); }
    if (pickable.length > 1) clipped(ctx, panel, H, function () {
      faint.forEach(function (j) {
        var ch = tracks[j].ch[spec.channel];
        if (ch) for (var c = 0; c < ch.C; c++) {
          series(ctx, panel, H, ch, c, COMPONENT_COLOURS[c % COMPONENT_COLOURS.length], 0.18, [], !!spec.step);
        }
      });
    });
    panel.fits = r;
  }

  function drawChosen(panel) {  // the selected vehicle, its predictions (dashed) and the reference
    var spec = panel.spec, L = layer(panel.chosen), ctx = L.ctx, H = L.H;
    clipped(ctx, panel, H, function () {
      if (spec.reference && reference) for (var c = 0; c < reference.C; c++) {
        series(ctx, panel, H, reference, c, "#888", 1, [4, 3], false);
      }
      group(state.selected).forEach(function (k) {
        var tr = tracks[k], ch = tr.ch[spec.channel];
        if (!ch) return;
        for (var c = 0; c < ch.C; c++) {
          var colour = COMPONENT_COLOURS[c % COMPONENT_COLOURS.length];
          series(ctx, panel, H, ch, c, colour, 1, tr.role === "predicted" ? [5, 3] : [], !!spec.step);
          if (spec.dashed && tr.ch[spec.dashed]) series(ctx, panel, H, tr.ch[spec.dashed], c, colour, 0.6, [2, 2], false);
        }
      });
    });
  }

  function drawPlots(selectionOnly) {  // the base layer again only where the selection leaves its y range
    panels.forEach(function (panel, n) {
      var r = channelRange(group(state.selected), panel.spec);
      var fits = selectionOnly && panel.fits && !(r[0] < panel.fits[0] || r[1] > panel.fits[1]);
      if (!fits) drawBase(panel, n);
      drawChosen(panel);
    });
  }

  function formatValue(v, span) {
    if (span && Math.abs(v) < 1e-4 * span) v = 0;  // an axis end at −1.5e-12 is a zero
    var a = Math.abs(v);
    return a >= 1000 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 0.1 || a === 0 ? v.toFixed(2) : v.toPrecision(2);
  }

  function drawCursors() {
    var t = timeOf(state.index);
    panels.forEach(function (panel) {
      var dpr = window.devicePixelRatio || 1, ctx = panel.cursor.getContext("2d");
      var W = panel.cursor.width / dpr, H = panel.cursor.height / dpr, X = timeToX(t, panel);
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, W, H);
      ctx.strokeStyle = "#111"; ctx.lineWidth = 1;
      ctx.beginPath(); ctx.moveTo(X, MARGIN.top); ctx.lineTo(X, H - MARGIN.bottom); ctx.stroke();
      var tr = tracks[state.selected], ch = tr.ch[panel.spec.channel];
      if (!ch) return;
      var h = H - MARGIN.top - MARGIN.bottom, parts = [];
      for (var c = 0; c < ch.C; c++) {
        var v = ch.at(state.index, c), Y = MARGIN.top + (panel.hi - v) / (panel.hi - panel.lo) * h;
        ctx.fillStyle = COMPONENT_COLOURS[c % COMPONENT_COLOURS.length];
        if (isFinite(v)) { ctx.beginPath(); ctx.arc(X, Y, 2.5, 0, 2 * Math.PI); ctx.fill(); }
        parts.push(isFinite(v) ? formatValue(v) : "\u2013");
      }
      ctx.fillStyle = "#222"; ctx.font = "11px sans-serif"; ctx.textAlign = "right";
      ctx.fillText(parts.join("  "), W - MARGIN.right - 2, 11);
    });
  }

  // ------------------------------------------------------------------ events

  function eventShown(ev) { return ev.track === null || ev.track === undefined || ev.track === state.selected; }

  function placeMarkers() {
    panels.forEach(function (panel) {
      panel.markers.textContent = "";
      events.forEach(function (ev, k) {
        if (!eventShown(ev)) return;
        var m = el("div", "qj-marker", panel.markers);
        m.style.left = timeToX(ev.t, panel) + "px";
        m.style.top = MARGIN.top + "px";
        m.style.height = Math.max(0, panel.box.clientHeight - MARGIN.top - MARGIN.bottom) + "px";
        m.title = ev.label;
        m.dataset.t = ev.t;
        m.dataset.event = k;
      });
    });
  }

  var LIST_MAX = 300;
  events.slice(0, LIST_MAX).forEach(function (ev, k) {
    var li = el("li", "qj-event", eventList);
    var b = el("button", null, li, ev.t.toFixed(3) + " s");
    b.tabIndex = -1;
    b.addEventListener("mousedown", function (e) { e.preventDefault(); });
    b.addEventListener("click", function () {
      if (ev.track !== null && ev.track !== undefined && picker && pickable.indexOf(ev.track) >= 0) {
        state.selected = ev.track; picker.value = ev.track; drawPlots(true); placeMarkers();
      }
      seek(Math.round((ev.t - t0) / dt)); root.focus();
    });
    el("span", null, li, " " + ev.label);
    li.dataset.t = ev.t;
    li.dataset.event = k;
  });
  if (events.length > LIST_MAX) el("li", "qj-more", eventList, "\u2026 and " + (events.length - LIST_MAX) + " more events");

  // ------------------------------------------------------------------ legend

  legend.textContent = (webgl ? "drag: rotate \u00b7 wheel: zoom \u00b7 " : "") +
    "arms (nose red), rotors green CCW / blue CW, thrust orange (hover = one arm)" +
    (reference ? ", reference grey" : "") + (drawScale > 1 ? ", vehicles drawn \u00d7" + drawScale.toFixed(1) : "") +
    (tracks.length > DETAIL_VEHICLES ? "; " + tracks.length + " vehicles: trail of the selected one only" : "");

  // ------------------------------------------------------------------ frame loop

  function render() {
    var start = performance.now();
    if (webgl) drawGl(); else drawFlat();
    drawCursors();
    updateReadout();
    stats.render.push(performance.now() - start);
    if (stats.render.length > 2000) stats.render.shift();
  }

  function frame(now) {
    if (state.playing) {
      if (clock.last !== null) clock.time += (now - clock.last) / 1000 * SPEEDS[state.speed];
      clock.last = now;
      var i = Math.floor((clock.time - t0) / dt + 1e-6);
      if (i >= count - 1) { i = count - 1; state.playing = false; }
      var changed = i !== state.index || !state.playing;
      state.index = i;
      if (changed) dirty();
      if (stats.lastFrame !== null) { stats.interval.push(now - stats.lastFrame); if (stats.interval.length > 2000) stats.interval.shift(); }
      stats.lastFrame = now;
    } else {
      stats.lastFrame = null;
    }
    if (needsDraw) { needsDraw = false; render(); }
    window.requestAnimationFrame(frame);
  }

  function layout() { drawPlots(); placeMarkers(); dirty(); }
  window.addEventListener("resize", layout);

  function summary(xs) {
    if (!xs.length) return { frames: 0, mean_ms: null, p95_ms: null, max_ms: null };
    var s = xs.slice().sort(function (a, b) { return a - b; });
    return { frames: xs.length, mean_ms: xs.reduce(function (a, b) { return a + b; }, 0) / xs.length,
      p95_ms: s[Math.min(s.length - 1, Math.floor(0.95 * s.length))], max_ms: s[s.length - 1] };
  }

  // what tests and benchmarks read (nothing here changes the trace)
  window.quadjaxPlayer = {
    webgl: webgl,
    count: count,
    state: function () {
      return { index: state.index, time: timeOf(state.index), speed: SPEEDS[state.speed], playing: state.playing,
        selected: state.selected };
    },
    value: function (channel, track, index, component) { return tracks[track].ch[channel].at(index, component || 0); },
    timeToX: function (t, panel) { return timeToX(t, panels[panel || 0]); },
    panels: panels.length,
    select: function (j) { state.selected = j; if (picker) picker.value = j; drawPlots(true); placeMarkers(); dirty(); },
    frameStats: function () { return { render: summary(stats.render), interval: summary(stats.interval) }; },
    snapshot: function () {  // draw now and count the pixels that differ from the background
      render();
      var px, w, h, bg;
      if (webgl) {
        w = glCanvas.width; h = glCanvas.height; px = new Uint8Array(w * h * 4); bg = [247, 247, 250];
        gl.readPixels(0, 0, w, h, gl.RGBA, gl.UNSIGNED_BYTE, px);
      } else {
        w = flatCanvas.width; h = flatCanvas.height; bg = [247, 247, 249];
        px = flatCanvas.getContext("2d").getImageData(0, 0, w, h).data;
      }
      var drawn = 0;
      for (var k = 0; k < w * h * 4; k += 4) {
        if (Math.abs(px[k] - bg[0]) + Math.abs(px[k + 1] - bg[1]) + Math.abs(px[k + 2] - bg[2]) > 30) drawn++;
      }
      return { drawn: drawn, pixels: w * h };
    },
    resetStats: function () { stats.render = []; stats.interval = []; },
  };

  layout();
  render();
  root.focus();
  window.requestAnimationFrame(frame);
  root.dataset.ready = "true";
})();
