// Native CPU kernel for quadjax's RK4 rollout, called through XLA's FFI: the open loop's whole
// horizon in one call, or one closed-loop tick per call.
//
// The physics is quadjax.derivative + quadjax.rk4_step (see their docstrings for the
// equations); this file restates it so that a C++ compiler can keep one vehicle's whole
// RK4 step in vector registers, vehicles in SIMD lanes. XLA's CPU backend instead splits
// the step into ~150 single-output loop fusions that each recompute what they need
// (benchmarks/README.md). tests/test_native.py holds this kernel to the JAX model on
// random states, parameters, wind and wrench; change both together.
//
// Layouts (all row-major, leading "batch" dims broadcast against the outputs' batch dims,
// each either equal or 1; quadjax/native/__init__.py packs and unpacks them):
//   params   (..., NP)      NP = kFixed + 3 R + 1: the fields in Param order, then per rotor
//                          (x, y, spin), then dt
//   state    (..., S)       S = 15 + R: position 3, velocity 3, attitude (w,x,y,z) 4, body
//                          rates 3, rotor speeds R, energy, on_ground
//   commands (..., T, R)   rotor-speed commands, one per tick
//   wind     (..., T, 3)   world wind per tick (read when has_wind)
//   wrench   (..., T, 6)   body force, moment per tick (read when has_wrench)
// Results: final (..., S); saved (..., T / save_every, S) (empty when save_every = 0).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

enum Param : int {
  kMass, kJ00, kJ01, kJ02, kJ10, kJ11, kJ12, kJ20, kJ21, kJ22, kKf, kKm, kTau, kWmin, kWmax,
  kDl0, kDl1, kDl2, kDq0, kDq1, kDq2, kDr0, kDr1, kDr2, kIr, kKp, kCap, kSag, kGz, kG,
  kWindX, kWindY, kWindZ, kFixed
};
enum StateIndex : int { kPx = 0, kVx = 3, kQw = 6, kWx = 10, kRot = 13 };

// Vehicles per block (SIMD lanes). Wide blocks keep the working set in L1; a batch's
// remainder runs in narrow ones, so that small batches do not compute idle lanes.
constexpr int kWide = 32, kNarrow = 8;
constexpr int kChunk = 64;  // ticks of commands staged per block at a time

// Batch broadcasting: the offset of vehicle v's row in an input whose batch dims are each
// 1 or the output's.
struct Broadcast {
  std::vector<int64_t> out_dims, strides;  // strides in rows; 0 where the input dim is 1
  bool ok = true;

  Broadcast(ffi::Span<const int64_t> out, ffi::Span<const int64_t> in, int core_rank) {
    int rank = static_cast<int>(out.size());
    if (static_cast<int>(in.size()) != rank + core_rank) { ok = false; return; }
    out_dims.assign(out.begin(), out.end());
    strides.assign(rank, 0);
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; --d) {
      if (in[d] != out[d] && in[d] != 1) { ok = false; return; }
      strides[d] = in[d] == 1 ? 0 : s;
      s *= in[d];
    }
    classify();
  }
  int64_t row(int64_t v) const {
    if (same) return v;  // the common cases first: no divisions
    if (shared) return 0;
    int64_t r = 0;
    for (int d = static_cast<int>(out_dims.size()) - 1; d >= 0; --d) {
      r += (v % out_dims[d]) * strides[d];
      v /= out_dims[d];
    }
    return r;
  }
  bool same = false, shared = false;  // batch dims equal to the outputs' / all 1
  void classify() {
    same = shared = true;
    int64_t s = 1;
    for (int d = static_cast<int>(out_dims.size()) - 1; d >= 0; --d) {
      same &= strides[d] == s || out_dims[d] == 1;
      shared &= strides[d] == 0;
      s *= out_dims[d];
    }
  }
};

template <typename F, int R, int kLanes>
struct Kernel {
  static constexpr int S = 15 + R;
  static constexpr int NP = kFixed + 3 * R + 1;
  static constexpr int kEnergy = kRot + R, kGround = kRot + R + 1;

  F p[NP][kLanes];    // parameters per lane (wind rows overwritten per tick when has_wind)
  F x[S][kLanes];     // state
  F t[S][kLanes];     // RK stage argument
  F acc[S][kLanes];   // RK running sum
  F u[R][kLanes];     // command, clamped to [ω_min, ω_max] once per tick
  F ext[6][kLanes];   // external body wrench
  F h[kLanes];        // step length dt / substeps
  F inv_tau[kLanes];  // 1 / τ (1 without lag): constant over the call
  // e^(−h/2τ), e^(−h/τ): the first-order lag solved exactly over half and a whole step with the
  // command held (quadjax.quadrotor.lagged_rotor_speeds_c); RK4 on the lag is unstable past h = 2.79 τ
  F decay_half[kLanes], decay_one[kLanes];
  F k[S][kLanes];     // RK stage derivative
  F staged[kChunk][R][kLanes];  // the next commands, lane-major
  bool params_ready = false;    // p and h hold a shared parameter row

  // One lane's derivative k = f(xs) (quadjax.derivative, component form).
  // (GCC vectorises the lane loop only when these inner loops are fully unrolled.)
  __attribute__((always_inline)) inline void derivative(const F (*xs)[kLanes], int j) {
    const F vx = xs[kVx][j], vy = xs[kVx + 1][j], vz = xs[kVx + 2][j];
    const F qw = xs[kQw][j], qx = xs[kQw + 1][j], qy = xs[kQw + 2][j], qz = xs[kQw + 3][j];
    const F wx = xs[kWx][j], wy = xs[kWx + 1][j], wz = xs[kWx + 2][j];
    const F energy = xs[kEnergy][j];
    const bool lag = p[kTau][j] > F(0);
    const F inv_tau = this->inv_tau[j];
    const F sc = (F(1) - p[kSag][j] * std::min(energy / p[kCap][j], F(1))) * p[kKf][j];
    F ftot = 0, roll = 0, pitch = 0, yaw = 0, spin_sum = 0, power = 0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const F c = u[r][j];
      const F w = xs[kRot + r][j];
      const F eff = lag ? w : c;
      k[kRot + r][j] = lag ? (c - w) * inv_tau : F(0);
      const F thrust = sc * eff * eff;
      const F rx = p[kFixed + 3 * r][j], ry = p[kFixed + 3 * r + 1][j], spin = p[kFixed + 3 * r + 2][j];
      ftot += thrust;
      roll += ry * thrust;
      pitch += rx * thrust;
      yaw += spin * thrust;
      spin_sum += spin * eff;
      power += p[kKp][j] * (eff * eff * eff);
    }
    // R(q), body → world
    const F r00 = 1 - 2 * (qy * qy + qz * qz), r01 = 2 * (qx * qy - qw * qz), r02 = 2 * (qx * qz + qw * qy);
    const F r10 = 2 * (qx * qy + qw * qz), r11 = 1 - 2 * (qx * qx + qz * qz), r12 = 2 * (qy * qz - qw * qx);
    const F r20 = 2 * (qx * qz - qw * qy), r21 = 2 * (qy * qz + qw * qx), r22 = 1 - 2 * (qx * qx + qy * qy);
    // drag on the air-relative velocity in the body frame, v_b = Rᵀ (v − wind)
    const F ax = vx - p[kWindX][j], ay = vy - p[kWindY][j], az = vz - p[kWindZ][j];
    const F bx = r00 * ax + r10 * ay + r20 * az;
    const F by = r01 * ax + r11 * ay + r21 * az;
    const F bz = r02 * ax + r12 * ay + r22 * az;
    const F fx = -p[kDl0][j] * bx - p[kDq0][j] * bx * std::fabs(bx) + ext[0][j];
    const F fy = -p[kDl1][j] * by - p[kDq1][j] * by * std::fabs(by) + ext[1][j];
    const F fz = ftot - p[kDl2][j] * bz - p[kDq2][j] * bz * std::fabs(bz) + ext[2][j];
    const F m = p[kMass][j];
    k[kPx][j] = vx;
    k[kPx + 1][j] = vy;
    k[kPx + 2][j] = vz;
    k[kVx][j] = (r00 * fx + r01 * fy + r02 * fz) / m;
    k[kVx + 1][j] = (r10 * fx + r11 * fy + r12 * fz) / m;
    k[kVx + 2][j] = (r20 * fx + r21 * fy + r22 * fz) / m - p[kG][j];
    k[kQw][j] = F(0.5) * (-qx * wx - qy * wy - qz * wz);
    k[kQw + 1][j] = F(0.5) * (qw * wx + qy * wz - qz * wy);
    k[kQw + 2][j] = F(0.5) * (qw * wy - qx * wz + qz * wx);
    k[kQw + 3][j] = F(0.5) * (qw * wz + qx * wy - qy * wx);
    // moment: rotors, rotational drag, rotor gyroscopic term, external
    const F h = p[kIr][j] * spin_sum;
    const F mx = roll - p[kDr0][j] * wx - wy * h + ext[3][j];
    const F my = -pitch - p[kDr1][j] * wy + wx * h + ext[4][j];
    const F mz = -p[kKm][j] * yaw - p[kDr2][j] * wz + ext[5][j];
    // ω̇ = J⁻¹ (M − ω × J ω), J⁻¹ by the adjugate
    const F a = p[kJ00][j], b = p[kJ01][j], c = p[kJ02][j];
    const F d = p[kJ10][j], e = p[kJ11][j], f = p[kJ12][j];
    const F g = p[kJ20][j], hh = p[kJ21][j], i = p[kJ22][j];
    const F jx = a * wx + b * wy + c * wz, jy = d * wx + e * wy + f * wz, jz = g * wx + hh * wy + i * wz;
    const F b0 = mx - (wy * jz - wz * jy), b1 = my - (wz * jx - wx * jz), b2 = mz - (wx * jy - wy * jx);
    const F A = e * i - f * hh, B = f * g - d * i, C = d * hh - e * g;
    const F inv_det = F(1) / (a * A + b * B + c * C);
    k[kWx][j] = (A * b0 + (c * hh - b * i) * b1 + (b * f - c * e) * b2) * inv_det;
    k[kWx + 1][j] = (B * b0 + (a * i - c * g) * b1 + (c * d - a * f) * b2) * inv_det;
    k[kWx + 2][j] = (C * b0 + (b * g - a * hh) * b1 + (a * e - b * d) * b2) * inv_det;
    k[kEnergy][j] = power;
    k[kGround][j] = 0;
  }

  // One RK4 step of h (per lane) for every lane: x ← rk4(x), then the projection and
  // ground contact of quadjax.integrators._finish_c. Sums in the order rk4_step_c uses.
  void rk4() {
    stage(x, F(0.5), F(1.0 / 6), true, decay_half);
    stage(t, F(0.5), F(1.0 / 3), false, decay_half);
    stage(t, F(1), F(1.0 / 3), false, decay_one);
    stage(t, F(0), F(1.0 / 6), false, nullptr);
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) finish(j);
  }

  // k = f(arg); acc (+)= b h k; t = x + a h k, rotors at their exact lagged speed at a h.
  inline void stage(const F (*arg)[kLanes], F a_next, F b, bool first, const F* decay) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) derivative(arg, j);
    for (int i = 0; i < S; ++i) {
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) {
        acc[i][j] = (first ? x[i][j] : acc[i][j]) + (h[j] * b) * k[i][j];
        t[i][j] = x[i][j] + (h[j] * a_next) * k[i][j];
      }
    }
    if (decay == nullptr) return;
    for (int r = 0; r < R; ++r) {
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) {
        const F c = u[r][j];
        t[kRot + r][j] = p[kTau][j] > F(0) ? c + (x[kRot + r][j] - c) * decay[j] : t[kRot + r][j];
      }
    }
  }

  __attribute__((always_inline)) inline void finish(int j) {
    // attitude renormalised; rotors clamped to [0, ω_max] (the clamped command without lag)
    const F qw = acc[kQw][j], qx = acc[kQw + 1][j], qy = acc[kQw + 2][j], qz = acc[kQw + 3][j];
    const F n = std::sqrt(qw * qw + qx * qx + qy * qy + qz * qz);
    const F nq[4] = {qw / n, qx / n, qy / n, qz / n};
    const bool lag = p[kTau][j] > F(0);
    const F wmax = p[kWmax][j];
    F rot[R];
    F wsq = 0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      F w = lag ? u[r][j] + (x[kRot + r][j] - u[r][j]) * decay_one[j] : u[r][j];
      w = w < F(0) ? F(0) : (w > wmax ? wmax : w);
      rot[r] = w;
      wsq += w * w;
    }
    F energy = acc[kEnergy][j];
    energy = energy < F(0) ? F(0) : energy;  // NaN stays NaN
    // ground contact (quadjax.ground_contact): stays, lands or flies
    const F sc = (F(1) - p[kSag][j] * std::min(energy / p[kCap][j], F(1))) * p[kKf][j];
    const F vertical = (1 - 2 * (nq[1] * nq[1] + nq[2] * nq[2])) * (sc * wsq);
    const bool stays = (x[kGround][j] > F(0.5)) & (vertical <= p[kMass][j] * p[kG][j]);
    const bool lands = !stays & (acc[kPx + 2][j] <= p[kGz][j]);
    const bool grounded = stays | lands;
#pragma GCC unroll 8
    for (int i = 0; i < 2; ++i) x[kPx + i][j] = stays ? x[kPx + i][j] : acc[kPx + i][j];
    x[kPx + 2][j] = stays ? x[kPx + 2][j] : (lands ? p[kGz][j] : acc[kPx + 2][j]);
#pragma GCC unroll 8
    for (int i = 0; i < 3; ++i) x[kVx + i][j] = grounded ? F(0) : acc[kVx + i][j];
#pragma GCC unroll 8
    for (int i = 0; i < 4; ++i) x[kQw + i][j] = stays ? x[kQw + i][j] : nq[i];
#pragma GCC unroll 8
    for (int i = 0; i < 3; ++i) x[kWx + i][j] = grounded ? F(0) : acc[kWx + i][j];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) x[kRot + r][j] = rot[r];
    x[kEnergy][j] = energy;
    x[kGround][j] = grounded ? F(1) : F(0);
  }
};

struct Inputs {
  ffi::Span<const int64_t> batch;  // the outputs' batch dims
  int64_t n, T, save_every, substeps;
  bool has_wind, has_wrench;
};

// Run vehicles [v0, v0 + count) (count ≤ kLanes) through the whole horizon.
template <typename F, int R, int kLanes>
void RunBlock(Kernel<F, R, kLanes>& K, const Inputs& in, int64_t v0, int count, const F* params,
              const Broadcast& bp, const F* state, const Broadcast& bs, const F* commands,
              const Broadcast& bc, const F* wind, const Broadcast& bw, const F* wrench,
              const Broadcast& br, F* final_state, F* saved) {
  using KF = Kernel<F, R, kLanes>;
  constexpr int S = KF::S, NP = KF::NP;
  int64_t prow[kLanes], crow[kLanes], wrow[kLanes], rrow[kLanes];
  // shared parameters stay loaded from the thread's previous block (short calls, e.g. one
  // closed-loop tick, are otherwise dominated by this transposition)
  const bool reuse = bp.shared && K.params_ready;
  for (int j = 0; j < kLanes; ++j) {
    const int64_t v = v0 + (j < count ? j : 0);  // spare lanes repeat the first vehicle
    prow[j] = bp.row(v);
    crow[j] = bc.row(v);
    wrow[j] = in.has_wind ? bw.row(v) : 0;
    rrow[j] = in.has_wrench ? br.row(v) : 0;
    const int64_t srow = bs.row(v);
    if (!reuse)
      for (int i = 0; i < NP; ++i) K.p[i][j] = params[prow[j] * NP + i];
    for (int i = 0; i < S; ++i) K.x[i][j] = state[srow * S + i];
    for (int i = 0; i < 6; ++i) K.ext[i][j] = 0;
    K.h[j] = K.p[NP - 1][j] / static_cast<F>(in.substeps);
    K.inv_tau[j] = F(1) / (K.p[kTau][j] > F(0) ? K.p[kTau][j] : F(1));
    const F tau = K.p[kTau][j] > F(0) ? K.p[kTau][j] : F(1);
    K.decay_half[j] = K.p[kTau][j] > F(0) ? std::exp(-(K.h[j] * F(0.5)) / tau) : F(0);
    K.decay_one[j] = K.p[kTau][j] > F(0) ? std::exp(-(K.h[j] * F(1)) / tau) : F(0);
  }
  K.params_ready = bp.shared;
  const int64_t T = in.T;
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    // stage the block's next commands lane-major: each vehicle's rows are read in one
    // sequential run instead of one strided line per vehicle per tick
    const int len = static_cast<int>(std::min<int64_t>(kChunk, T - t0));
    for (int j = 0; j < kLanes; ++j) {
      const F* c = commands + (crow[j] * T + t0) * R;
      for (int tt = 0; tt < len; ++tt)
        for (int r = 0; r < R; ++r) K.staged[tt][r][j] = c[tt * R + r];
    }
    for (int tt = 0; tt < len; ++tt) {
      const int64_t tick = t0 + tt;
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < kLanes; ++j) {
          const F c = K.staged[tt][r][j], lo = K.p[kWmin][j], hi = K.p[kWmax][j];
          K.u[r][j] = c < lo ? lo : (c > hi ? hi : c);  // NaN stays NaN
        }
      for (int j = 0; j < kLanes; ++j) {
        if (in.has_wind) {
          const F* w = wind + (wrow[j] * T + tick) * 3;
          K.p[kWindX][j] = w[0];
          K.p[kWindY][j] = w[1];
          K.p[kWindZ][j] = w[2];
        }
        if (in.has_wrench) {
          const F* w = wrench + (rrow[j] * T + tick) * 6;
          for (int i = 0; i < 6; ++i) K.ext[i][j] = w[i];
        }
      }
      for (int64_t s = 0; s < in.substeps; ++s) K.rk4();
      if (in.save_every > 0 && (tick + 1) % in.save_every == 0) {
        const int64_t slot = tick / in.save_every, slots = T / in.save_every;
        for (int j = 0; j < count; ++j)
          for (int i = 0; i < S; ++i) saved[((v0 + j) * slots + slot) * S + i] = K.x[i][j];
      }
    }
  }
  for (int j = 0; j < count; ++j)
    for (int i = 0; i < S; ++i) final_state[(v0 + j) * S + i] = K.x[i][j];
}


template <ffi::DataType DT, int R>
ffi::Error Rollout(ffi::ThreadPool pool, ffi::Buffer<DT> params, ffi::Buffer<DT> state,
                   ffi::Buffer<DT> commands, ffi::Buffer<DT> wind, ffi::Buffer<DT> wrench,
                   ffi::ResultBuffer<DT> final_state, ffi::ResultBuffer<DT> saved,
                   int64_t substeps, int64_t save_every, bool has_wind, bool has_wrench) {
  using F = ffi::NativeType<DT>;
  using KF = Kernel<F, R, 1>;
  auto fdims = final_state->dimensions();
  if (fdims.size() == 0 || fdims.back() != KF::S) return ffi::Error::InvalidArgument("quadjax native: bad state width");
  ffi::Span<const int64_t> batch(fdims.begin(), fdims.size() - 1);
  int64_t n = 1;
  for (int64_t d : batch) n *= d;
  auto cdims = commands.dimensions();
  if (cdims.size() < 2 || cdims.back() != R) return ffi::Error::InvalidArgument("quadjax native: bad commands shape");
  const int64_t T = cdims[cdims.size() - 2];
  if (substeps < 1 || save_every < 0 || (save_every > 0 && T % save_every != 0))
    return ffi::Error::InvalidArgument("quadjax native: bad substeps/save_every");
  Broadcast bp(batch, params.dimensions(), 1), bs(batch, state.dimensions(), 1),
      bc(batch, commands.dimensions(), 2), bw(batch, wind.dimensions(), has_wind ? 2 : 1),
      br(batch, wrench.dimensions(), has_wrench ? 2 : 1);
  if (!bp.ok || !bs.ok || !bc.ok || !bw.ok || !br.ok ||
      params.dimensions().back() != KF::NP || state.dimensions().back() != KF::S)
    return ffi::Error::InvalidArgument("quadjax native: input shapes do not broadcast to the batch");
  Inputs in{batch, n, T, save_every, substeps, has_wind, has_wrench};
  const F *P = params.typed_data(), *X = state.typed_data(), *U = commands.typed_data();
  const F *Wd = wind.typed_data(), *Wr = wrench.typed_data();
  F *out = final_state->typed_data(), *sv = saved->typed_data();
  struct Task { int64_t v0; int count, lanes; };
  std::vector<Task> tasks;
  int64_t v0 = 0;
  for (; n - v0 >= kWide; v0 += kWide) tasks.push_back({v0, kWide, kWide});
  while (v0 < n) {  // the remainder: narrow blocks while they are at least half full, then singles
    const int count = static_cast<int>(std::min<int64_t>(kNarrow, n - v0));
    const int lanes = count >= kNarrow / 2 ? kNarrow : 1;
    tasks.push_back({v0, lanes == 1 ? 1 : count, lanes});
    v0 += lanes == 1 ? 1 : count;
  }
  const int64_t blocks = static_cast<int64_t>(tasks.size());

  std::atomic<int64_t> next{0};
  auto work = [&] {
    std::unique_ptr<Kernel<F, R, kWide>> wide;
    std::unique_ptr<Kernel<F, R, kNarrow>> narrow;
    std::unique_ptr<Kernel<F, R, 1>> single;
    for (int64_t b; (b = next.fetch_add(1)) < blocks;) {
      const Task& tk = tasks[b];
      if (tk.lanes == kWide) {
        if (!wide) wide = std::make_unique<Kernel<F, R, kWide>>();
        RunBlock<F, R, kWide>(*wide, in, tk.v0, tk.count, P, bp, X, bs, U, bc, Wd, bw, Wr, br, out, sv);
      } else if (tk.lanes == kNarrow) {
        if (!narrow) narrow = std::make_unique<Kernel<F, R, kNarrow>>();
        RunBlock<F, R, kNarrow>(*narrow, in, tk.v0, tk.count, P, bp, X, bs, U, bc, Wd, bw, Wr, br, out, sv);
      } else {
        if (!single) single = std::make_unique<Kernel<F, R, 1>>();
        RunBlock<F, R, 1>(*single, in, tk.v0, 1, P, bp, X, bs, U, bc, Wd, bw, Wr, br, out, sv);
      }
    }
  };
  // XLA's intra-op pool: worth it only with several blocks and enough steps per block
  const int64_t threads = std::min<int64_t>(pool.num_threads(), blocks);
  const bool parallel = threads > 1 && n * T * substeps >= (int64_t{1} << 12);
  if (!parallel) {
    work();
    return ffi::Error::Success();
  }
  std::mutex mu;
  std::condition_variable cv;
  int64_t pending = threads - 1;
  for (int64_t i = 0; i + 1 < threads; ++i)
    pool.Schedule([&] {
      work();
      std::lock_guard<std::mutex> lock(mu);
      if (--pending == 0) cv.notify_one();
    });
  work();
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return pending == 0; });
  return ffi::Error::Success();
}

}  // namespace

#define QUADJAX_ROLLOUT(NAME, DT, R)                                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Rollout<DT, R>),                                  \
                                ffi::Ffi::Bind()                                         \
                                    .Ctx<ffi::ThreadPool>()                              \
                                    .Arg<ffi::Buffer<DT>>()                              \
                                    .Arg<ffi::Buffer<DT>>()                              \
                                    .Arg<ffi::Buffer<DT>>()                              \
                                    .Arg<ffi::Buffer<DT>>()                              \
                                    .Arg<ffi::Buffer<DT>>()                              \
                                    .Ret<ffi::Buffer<DT>>()                              \
                                    .Ret<ffi::Buffer<DT>>()                              \
                                    .Attr<int64_t>("substeps")                           \
                                    .Attr<int64_t>("save_every")                         \
                                    .Attr<bool>("has_wind")                              \
                                    .Attr<bool>("has_wrench"))

QUADJAX_ROLLOUT(quadjax_rollout_f32_r4, ffi::F32, 4);
QUADJAX_ROLLOUT(quadjax_rollout_f64_r4, ffi::F64, 4);
QUADJAX_ROLLOUT(quadjax_rollout_f32_r6, ffi::F32, 6);
QUADJAX_ROLLOUT(quadjax_rollout_f64_r6, ffi::F64, 6);
QUADJAX_ROLLOUT(quadjax_rollout_f32_r8, ffi::F32, 8);
QUADJAX_ROLLOUT(quadjax_rollout_f64_r8, ffi::F64, 8);
