// The native CPU rollout's harness, called through XLA's FFI: the open loop's whole horizon
// in one call, or one closed-loop tick per call.
//
// No physics here. quadjax/native/__init__.py generates, from the JAX model's jaxpr
// (quadjax.native.generate.generate_kernel), one struct K per dtype and rotor count with
//   K::prologue(P, H)                 what depends on the parameters alone, once per block
//   K::step(H, P, S, U, Wd, E)        one RK4 step (quadjax.integrators.rk4_step_c) for W vehicles
// over GCC vector types (K::V: W lanes, one vehicle each), and pastes it above this file with
// its QUADJAX_ROLLOUT and QUADJAX_STEP lines below it. This file keeps only what is not physics:
// batch broadcasting, blocks of W vehicles, command staging, substeps, saving, threads, FFI.
// The derivative library instantiates the same rollout with the generated tangent step (every
// row [primal | tangent], so every width doubles; the commands' tangents an input of their own,
// RolloutTangent) and Adjoint (below) with the generated transpose of the step.
//
// Layouts (row-major; leading "batch" dims broadcast against the outputs' batch dims, each
// either equal or 1; the last dims are the generated layouts, quadjax.native.generate.Layout):
//   params   (..., N_P)      the QuadParams leaves in field order, raveled, then the step h
//   state    (..., N_S)      the QuadState leaves in field order
//   commands (..., T, R)     rotor-speed commands, one per tick
//   wind     (..., Tw, 3)    world wind per tick; Tw = 1: held for the whole call
//   wrench   (..., Tr, 6)    body force, moment per tick; Tr = 1: held
// Results: final (..., N_S); saved (..., T / save_every, N_S) (empty when save_every = 0), or, from
// the leaves entry (QUADJAX_ROLLOUT_LEAVES), one saved result per state leaf (..., T / save_every,
// leaf size), as the engine's QuadState holds them.
// The step entry point takes the state as its 7 QuadState leaves, vehicle-minor, and one command
// row (..., 1, R), row-major (see Step), and returns the 7 leaves vehicle-minor (XLA updates them
// in place).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include <sys/mman.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kChunk = 64;  // ticks of commands staged per block at a time
// Saved values are held per block and written a run of slots per lane at a time (SaveSlot): as many
// slots as fit in kSavedBytes, a multiple of 16 (whole W x W tiles of a width-1 leaf), from 16 to 128
// (96 for a quadrotor's state). Each line written is a line of a large result that no cache holds,
// read in before it is written: a lane's longer run is a longer sequential stream, which the
// prefetchers follow. Saving every state (float32, 4 rotors, N = 4 096, T = 1 000, 2 threads) took
// 19.7-20.2 against 22.8 ns wall per vehicle-step with 16 slots (2026-12-06, benchmarks/README.md).
constexpr size_t kSavedBytes = size_t{128} << 10;
template <int N, class V>
constexpr int SavedSlots() {
  const int fit = static_cast<int>(kSavedBytes / (N * sizeof(V))) / 16 * 16;
  return fit < 16 ? 16 : fit > 128 ? 128 : fit;
}

template <typename F> struct DataTypeOf;
template <> struct DataTypeOf<float> { static constexpr ffi::DataType value = ffi::DataType::F32; };
template <> struct DataTypeOf<double> { static constexpr ffi::DataType value = ffi::DataType::F64; };

// Batch broadcasting: the offset of vehicle v's row in an input whose batch dims are each
// 1 or the output's.
struct Broadcast {
  std::vector<int64_t> out_dims, strides;  // strides in rows; 0 where the input dim is 1
  bool ok = true, same = false, shared = false;  // batch dims equal to the outputs' / all 1

  Broadcast() = default;
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
    same = shared = true;
    s = 1;
    for (int d = rank - 1; d >= 0; --d) {
      same &= strides[d] == s || out_dims[d] == 1;
      shared &= strides[d] == 0;
      s *= out_dims[d];
    }
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
};

// A run of the state's leaves: `width` values per vehicle at `offset` in the kernel's state, read
// from `in` (rows broadcast by `b`) and the final values written to `out`. The rollout passes the
// packed state as one segment of rows (value i of row r at r * width + i); the step (a user's
// rk4_step) passes each QuadState leaf vehicle-minor (at i * rows + r), so that XLA neither packs
// rows nor transposes around the call and a block's values are one vector load each.
template <typename F>
struct Segment {
  const F* in;
  F* out;
  int width, offset;
  Broadcast b;
  int64_t in_row, in_value, out_row, out_value;  // value i of row r at in[r * in_row + i * in_value]; out alike
};

// Where the saved states go: values [offset, offset + width) of the state, for vehicle r and slot
// s at out[(r * slots + s) * width], in a result of `count` values. The packed rows are one of
// these; the state's leaves, one each.
template <typename F>
struct SavedPart {
  F* out;
  int width, offset;
  int64_t count;
};

template <typename F>
struct Job {
  const F *params, *commands, *wind, *wrench;
  int c_width = 0;  // commands per tick in `commands` (the step's all, or the primal's, below): tick t's
                    // command k of row r at commands[(r * T + t) * c_width + k]
  // a tangent kernel's commands after the primal's, from an array of their own (nullptr: `commands`
  // holds whole rows): tick t's k-th at tangents[r * T * (N_U - c_width) + t * (N_U - c_width) + k]
  const F* tangents = nullptr;
  std::vector<SavedPart<F>> saved;
  Broadcast bp, bc, bt, bw, br;
  // value i of params row r at params[r * p_row + i * p_value]: rows (Prepare's), or vehicle-minor (Step's)
  int64_t p_row = 0, p_value = 1;
  int64_t T, Tw, Tr, save_every, substeps;
  std::vector<Segment<F>> state;
};

// One block's working set: W vehicles in vector lanes.
template <class K>
struct Block {
  using V = typename K::V;
  static constexpr int R = K::N_U;
  V p[K::N_P], H[K::NH], s[K::N_S], u[R], wind[K::N_Wd], ext[K::N_E];
  V staged[kChunk][R];  // the next commands, lane-major
  static constexpr int kept = SavedSlots<K::N_S, V>();  // slots of saved states held
  V saved[kept * K::N_S];  // the states to save (SaveSlot), the part at offset o from kept * o
  bool params_ready = false;  // p and H hold a shared parameter row (LoadParams)
  bool series_ready = false;  // RunStep: wind and ext hold the fleet's shared rows
};

// Where a block's lanes are in one input or output: lane j's row is row[j], decided once per block
// by the input's broadcast. `shared`: one row for every lane (shared params, a held wind);
// `consecutive`: the block's W vehicles in order (then, in vehicle-minor storage, each value of
// the block is one vector load or store).
template <int W>
struct LaneRows {
  int64_t row[W];
  bool consecutive, shared;
  // the block [v0, v0 + count) itself (count <= W; spare lanes repeat v0: finite, results discarded)
  LaneRows(int64_t v0, int count) : consecutive(count == W), shared(false) {
    for (int j = 0; j < W; ++j) row[j] = v0 + (j < count ? j : 0);
  }
  // the block's own rows, or row 0 for every lane
  LaneRows(const LaneRows& own, bool one_row) : consecutive(own.consecutive && !one_row), shared(one_row) {
    for (int j = 0; j < W; ++j) row[j] = one_row ? 0 : own.row[j];
  }
  // the rows of the block's vehicles in an input broadcast by `b`
  LaneRows(const Broadcast& b, const LaneRows& own) : LaneRows(own, b.shared) {
    if (!b.same && !b.shared) {
      consecutive = false;
      for (int j = 0; j < W; ++j) row[j] = b.row(own.row[j]);
    }
  }
};

// One whole-vector load or store at any address, through an unaligned vector type. A memcpy of a
// vector, as GCC expands it for this project's AVX-512 CPU (it prefers 256-bit moves), stores a
// 64-byte vector as two halves, and the step's 64-byte load of it then cannot be forwarded from
// them: a store-forwarding stall on every value of a block (benchmarks/README.md, 2026-12-05).
template <class V, typename F>
inline V LoadWhole(const F* p) {
  typedef V U __attribute__((aligned(sizeof(F)), may_alias));
  return *reinterpret_cast<const U*>(p);
}
template <class V, typename F>
inline void StoreWhole(F* p, const V& v) {
  typedef V U __attribute__((aligned(sizeof(F)), may_alias));
  *reinterpret_cast<U*>(p) = v;
}

#if defined(__GNUC__) && !defined(__clang__)
#define QJ_SHUFFLES 1  // GCC's two-vector __builtin_shuffle: register transpositions below
template <class V>
using LaneInt = std::conditional_t<sizeof(V{}[0]) == 4, int32_t, int64_t>;  // a shuffle mask's lane

// The masks of TransposeTile: at the stage of distance d, rows a and a + d (a & d == 0) swap the
// off-diagonal d x d blocks of their 2d-lane column blocks: `lo` makes row a, `hi` row a + d.
template <int W, typename I>
struct TileMasks {
  I lo[8][W] = {}, hi[8][W] = {};
  constexpr TileMasks() {
    for (int k = 0, d = W / 2; d >= 1; ++k, d /= 2)
      for (int l = 0; l < W; ++l) {
        const int o = l % (2 * d), c = l - o;
        lo[k][l] = o < d ? l : W + c + o - d;
        hi[k][l] = o < d ? c + d + o : W + l;
      }
  }
};
template <int W, typename I>
inline constexpr TileMasks<W, I> kTileMasks{};

// r[i] (lane j) <- r[j] (lane i): a W x W transposition in registers, log2(W) stages of W
// two-vector shuffles.
template <class V, int W>
inline void TransposeTile(V* r) {
  typedef LaneInt<V> I;
  typedef I M __attribute__((vector_size(sizeof(V))));
  constexpr const auto& masks = kTileMasks<W, I>;
  for (int k = 0, d = W / 2; d >= 1; ++k, d /= 2) {
    M lo, hi;
    std::memcpy(&lo, masks.lo[k], sizeof(M));
    std::memcpy(&hi, masks.hi[k], sizeof(M));
    for (int a = 0; a < W; ++a)
      if (!(a & d)) {
        const V x = r[a], y = r[a + d];
        r[a] = __builtin_shuffle(x, y, lo);
        r[a + d] = __builtin_shuffle(x, y, hi);
      }
  }
}

// The masks of TransposeRows: for value i, `first` picks lane j's source from the first two
// vectors, `next[k]` from vector k, keeping the lanes already picked.
template <int N, int W, typename I>
struct RowsMasks {
  I first[N][W] = {}, next[N][N][W] = {};
  constexpr RowsMasks() {
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < W; ++j) {
        const int e = j * N + i;  // lane j of value i: element e of the rows, in vector e / W
        first[i][j] = e / W == 1 ? W + e % W : e % W;
        for (int k = 2; k < N; ++k) next[i][k][j] = e / W == k ? W + e % W : j;
      }
  }
};
template <int N, int W, typename I>
inline constexpr RowsMasks<N, W, I> kRowsMasks{};

// x[i] (lane j) = src[j * N + i]: the W consecutive rows of N values that start at src (a block's
// rows of a row-major (vehicles, N) input, e.g. a one-step call's commands). N vector loads and
// N - 1 two-vector shuffles per value (AVX-512: vpermt2ps).
template <int N, class V, int W, typename F>
inline void TransposeRows(V* x, const F* src) {
  typedef LaneInt<V> I;
  typedef I M __attribute__((vector_size(sizeof(V))));
  constexpr const auto& masks = kRowsMasks<N, W, I>;
  V v[N];
  for (int k = 0; k < N; ++k) v[k] = LoadWhole<V>(src + k * W);
  for (int i = 0; i < N; ++i) {
    M m;
    std::memcpy(&m, masks.first[i], sizeof(M));
    V acc = __builtin_shuffle(v[0], v[1], m);
    for (int k = 2; k < N; ++k) {
      std::memcpy(&m, masks.next[i][k], sizeof(M));
      acc = __builtin_shuffle(acc, v[k], m);
    }
    x[i] = acc;
  }
}
#endif

// TransposeRows for the row widths the kernels read (wind 3, rotors 4, 6, 8, wrench 6); false
// where it does not apply, and the caller gathers lane by lane.
template <class V, int W, typename F>
inline bool TransposedRows(V* x, const F* src, int n) {
#ifdef QJ_SHUFFLES
  switch (n) {
    case 3: TransposeRows<3, V, W>(x, src); return true;
    case 4: TransposeRows<4, V, W>(x, src); return true;
    case 6: TransposeRows<6, V, W>(x, src); return true;
    case 8: TransposeRows<8, V, W>(x, src); return true;
  }
#endif
  return false;
}

// The vectors x[0..n) of the block: lane j of x[i] is src[at.row[j] * row_step + i * step]. Each
// vector is assembled in registers and stored whole. (Storing lane by lane into memory and then
// loading the vector defeats store-to-load forwarding: that way the gather and scatter of a
// one-step call cost twice its step; benchmarks/README.md, 2026-12-04.)
template <class V, typename F, int W>
inline void Gather(V* x, const F* src, const LaneRows<W>& at, int64_t row_step, int n, int64_t step = 1) {
  if (at.shared) {
    for (int i = 0; i < n; ++i) x[i] = V{} + src[i * step];
  } else if (at.consecutive && row_step == 1) {
    for (int i = 0; i < n; ++i) x[i] = LoadWhole<V>(src + at.row[0] + i * step);
  } else if (at.consecutive && step == 1 && row_step == n && TransposedRows<V, W>(x, src + at.row[0] * n, n)) {
    // the block's rows one after the other (a one-step call's commands, row-major)
  } else {
    int i0 = 0;
#ifdef QJ_SHUFFLES
    // each lane's run of values contiguous (a rollout's command rows, packed state rows): W x W
    // tiles, a vector load per lane and a transposition in registers, where lane by lane took a
    // load and an insert per value (a tenth of a one-core rollout's time went to staging commands)
    if (step == 1)
      for (; i0 + W <= n; i0 += W) {
        V r[W];
        for (int j = 0; j < W; ++j) r[j] = LoadWhole<V>(src + at.row[j] * row_step + i0);
        TransposeTile<V, W>(r);
        for (int i = 0; i < W; ++i) x[i0 + i] = r[i];
      }
#endif
    for (int i = i0; i < n; ++i) {
      V v;
      for (int j = 0; j < W; ++j) v[j] = src[at.row[j] * row_step + i * step];
      x[i] = v;
    }
  }
}

// The first `count` lanes of the vectors x[0..n) out: lane j of x[i] to dst[at.row[j] * row_step + i * step].
template <class V, typename F, int W>
inline void Scatter(F* dst, const LaneRows<W>& at, int count, int64_t row_step, const V* x, int n, int64_t step = 1) {
  if (at.consecutive && row_step == 1) {
    for (int i = 0; i < n; ++i) StoreWhole(dst + at.row[0] + i * step, x[i]);
    return;
  }
  int i0 = 0;
#ifdef QJ_SHUFFLES
  // each lane's run of values contiguous (a segment's command cotangents, saved state rows): Gather's
  // W x W tiles the other way, a transposition in registers and a vector store per lane
  if (step == 1)
    for (; i0 + W <= n; i0 += W) {
      V r[W];
      for (int i = 0; i < W; ++i) r[i] = x[i0 + i];
      TransposeTile<V, W>(r);
      for (int j = 0; j < count; ++j) StoreWhole(dst + at.row[j] * row_step + i0, r[j]);
    }
#endif
  for (int i = i0; i < n; ++i)
    for (int j = 0; j < count; ++j) dst[at.row[j] * row_step + i * step] = x[i][j];
}

// Slot `slot` (of `slots`) of a saved result: the block's values x[0..width) for lane j go to
// out[(own.row[j] * slots + slot) * width]. They are held in the block's `saved` region of the
// result, the `Kept` slots from saved + Kept * offset (slot k at k * width), and written a run of
// Kept slots at a time, the last run when the last slot comes: a lane's run is one span of its saved
// rows, written by W x W tiles (Scatter), where a slot at a time took a store per lane and value.
// Kept is the block type's constant (SavedSlots), so that the modulo below is no division.
template <int Kept, class V, typename F, int W>
inline void SaveSlot(V* saved, int offset, F* out, const LaneRows<W>& own, int count, int64_t slot, int64_t slots,
                     const V* x, int width) {
  V* stage = saved + Kept * offset;
  const int k = static_cast<int>(slot % Kept);
  std::copy_n(x, width, stage + k * width);
  if (k == Kept - 1 || slot == slots - 1)
    Scatter(out + (slot - k) * width, own, count, slots * width, stage, (k + 1) * width);
}

// The block's lanes: their own rows (results) and their rows in the commands, wind and wrench.
template <int W>
struct Lanes {
  LaneRows<W> own, c, t, w, r;
  template <typename F>
  Lanes(const Job<F>& job, int64_t v0, int count)
      : own(v0, count), c(job.bc, own), t(job.bt, own), w(job.bw, own), r(job.br, own) {}
};

// Ticks [t0, t0 + len) of the block's commands into x, lane-major (tick t's command k at
// x[(t - t0) * N_U + k]); each lane's rows are read as one sequential stream. A tangent kernel's
// rows [u | du] come from two arrays, each read where XLA holds it and paired here, a few ticks
// at a time in registers and L1: XLA had concatenated them into one (..., T, N_U) array on every
// call, on one thread (N = 4 096, T = 1 000: 131 MB, 37-46 ms of a 146-159 ms jvp; benchmarks/README.md,
// 2026-12-06).
template <class K, int W>
void StageCommands(typename K::V* x, const Job<typename K::F>& job, const Lanes<W>& lanes, int64_t t0, int len) {
  constexpr int NU = K::N_U;
  if (job.tangents == nullptr) {
    Gather(x, job.commands + t0 * NU, lanes.c, job.T * NU, len * NU);
    return;
  }
  constexpr int kTicks = 16;  // ticks per pass: a W x W tile of 4 commands per tick at least
  typename K::V part[kTicks * NU];
  struct Half {
    const typename K::F* src;
    const LaneRows<W>& rows;
    int width, at;  // commands per tick, and where they go in the step's row
  };
  const Half halves[2] = {{job.commands, lanes.c, job.c_width, 0}, {job.tangents, lanes.t, NU - job.c_width, job.c_width}};
  for (int a = 0; a < len; a += kTicks) {
    const int n = std::min(kTicks, len - a);
    for (const Half& h : halves) {
      Gather(part, h.src + (t0 + a) * h.width, h.rows, job.T * h.width, n * h.width);
      for (int tt = 0; tt < n; ++tt)
        for (int k = 0; k < h.width; ++k) x[(a + tt) * NU + h.at + k] = part[tt * h.width + k];
    }
  }
}

// Tick t's wind and wrench into the lanes; a series of length 1 is read only when `first`.
template <class K, int W>
void LoadSeries(const Job<typename K::F>& job, const Lanes<W>& lanes, int64_t t, bool first, typename K::V* wind,
                typename K::V* ext) {
  if (first || job.Tw > 1) Gather(wind, job.wind + (job.Tw > 1 ? t : 0) * K::N_Wd, lanes.w, job.Tw * K::N_Wd, K::N_Wd);
  if (first || job.Tr > 1) Gather(ext, job.wrench + (job.Tr > 1 ? t : 0) * K::N_E, lanes.r, job.Tr * K::N_E, K::N_E);
}

// The block's params and what the prologue derives from them. A shared row stays loaded from the
// thread's previous block (short calls, e.g. one closed-loop tick or a user's scan tick, are
// otherwise dominated by this transposition and the prologue).
template <class K, int W>
void LoadParams(Block<K>& B, const Job<typename K::F>& job, const LaneRows<W>& own) {
  if (job.bp.shared && B.params_ready) return;
  Gather(B.p, job.params, LaneRows<W>(job.bp, own), job.p_row, K::N_P, job.p_value);
  K::prologue(B.p, B.H);
  B.params_ready = job.bp.shared;
}

// Run vehicles [v0, v0 + count) (count <= W) through the whole horizon.
template <class K>
void RunBlock(Block<K>& B, const Job<typename K::F>& job, int64_t v0, int count) {
  constexpr int W = K::W, R = Block<K>::R;
  const Lanes<W> lanes(job, v0, count);
  LoadParams(B, job, lanes.own);
  for (const auto& seg : job.state)
    Gather(B.s + seg.offset, seg.in, LaneRows<W>(seg.b, lanes.own), seg.in_row, seg.width, seg.in_value);
  const int64_t T = job.T;
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    const int len = static_cast<int>(std::min<int64_t>(kChunk, T - t0));
    StageCommands<K>(&B.staged[0][0], job, lanes, t0, len);
    for (int tt = 0; tt < len; ++tt) {
      const int64_t tick = t0 + tt;
      for (int r = 0; r < R; ++r) B.u[r] = B.staged[tt][r];
      LoadSeries<K>(job, lanes, tick, tick == 0, B.wind, B.ext);
      for (int64_t sub = 0; sub < job.substeps; ++sub) K::step(B.H, B.p, B.s, B.u, B.wind, B.ext);
      if (job.save_every > 0 && (tick + 1) % job.save_every == 0) {
        const int64_t slot = tick / job.save_every, slots = T / job.save_every;
        for (const auto& part : job.saved)
          SaveSlot<Block<K>::kept>(B.saved, part.offset, part.out, lanes.own, count, slot, slots, B.s + part.offset,
                                   part.width);
      }
    }
  }
  for (const auto& seg : job.state)
    Scatter(seg.out, lanes.own, count, seg.out_row, B.s + seg.offset, seg.width, seg.out_value);
}

// Blocks handed out to the calling thread and to helpers on XLA's intra-op pool. The caller
// never waits for a helper that has not started: a call made from inside a pool task (a
// sharded program on forced host devices) with every pool thread busy would otherwise wait
// forever. A helper that starts after the caller finished finds the crew closed and returns.
//
// The blocks are cut into one contiguous share per thread (the caller's first). A thread takes
// its own share's blocks from a counter of its own, then helps with the others'. So the same
// thread handles the same vehicles call after call (a user's scan of one-step calls keeps each
// vehicle's state in one core's cache), and the threads do not contend for one counter. Every
// value that one thread writes while another reads sits in a cache line of its own. Handing out
// single blocks from one shared counter, a one-step call at N = 4096 was slower on two threads
// than on one (benchmarks/README.md, 2026-12-05).
struct alignas(64) Share {
  std::atomic<int64_t> next{0};
  int64_t end = 0;
};

struct Crew {
  std::unique_ptr<Share[]> shares;
  std::function<void(int64_t)> work;  // by the thread whose share is the argument
  alignas(64) std::atomic<int> running{0};  // helpers started and not finished
  std::mutex mu;  // guards `closed` and the helpers' start
  std::condition_variable cv;
  bool closed = false;
};

// How long the caller spins for helpers still on their last block before it sleeps: a helper's
// block outlasts it only in long calls, where one wake-up does not count. Sleeping at once, a
// one-step call paid a cross-core wake-up (microseconds on this project's VM) every time.
constexpr auto kSpin = std::chrono::microseconds(20);

inline void Relax() {  // one turn of a spin-wait
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Blocks [0, blocks) on the calling thread and helpers, each thread with its own working set
// `State` (heap: it is large); `heavy`: enough work that helpers pay for themselves; `ticks`: the
// steps each block runs, which bounds how many blocks a thread claims at once (below).
template <class State, class Body>
void Parallel(ffi::ThreadPool& pool, int64_t blocks, bool heavy, int64_t ticks, const Body& body) {
  auto crew = std::make_shared<Crew>();
  const int64_t helpers = heavy ? std::min<int64_t>(pool.num_threads(), blocks) - 1 : 0;  // XLA's intra-op pool
  const int64_t count = std::max<int64_t>(helpers, 0) + 1;
  crew->shares.reset(new Share[count]);
  for (int64_t k = 0; k < count; ++k) {
    crew->shares[k].next.store(blocks * k / count, std::memory_order_relaxed);
    crew->shares[k].end = blocks * (k + 1) / count;
  }
  // Claims are guided: a quarter of what is left of a share, at least one block, and at most
  // 256 block-steps' worth. A counter's locked add waits for the thread's stores to drain: one per
  // block took 12 % of a one-core one-step call at N = 4 096. Long blocks are claimed one at a
  // time, so that a descheduled thread holds back little work that the others could take.
  const int64_t most = std::max<int64_t>(1, 256 / std::max<int64_t>(ticks, 1));
  crew->work = [&body, shares = crew->shares.get(), count, most](int64_t own) {
    // default-initialised: every value of a working set is written before it is read, and
    // value-initialising zeroed all of it (47 KB for the forward step, 199-249 KB for the multi-tangent
    // ones) on every thread of every call, which a one-step call (a user's scan) paid each tick
    std::unique_ptr<State> state(new State);
    for (int64_t i = 0; i < count; ++i) {
      Share& share = shares[(own + i) % count];
      for (;;) {
        const int64_t left = share.end - share.next.load(std::memory_order_relaxed);
        const int64_t take = std::clamp<int64_t>(left / 4, 1, most);
        const int64_t b0 = share.next.fetch_add(take, std::memory_order_relaxed);
        if (b0 >= share.end) break;
        for (int64_t b = b0, b1 = std::min(b0 + take, share.end); b < b1; ++b) body(*state, b);
      }
    }
  };
  for (int64_t i = 0; i < helpers; ++i)
    pool.Schedule([crew, i] {
      {
        std::lock_guard<std::mutex> lock(crew->mu);
        if (crew->closed) return;
        crew->running.fetch_add(1, std::memory_order_relaxed);
      }
      crew->work(i + 1);
      if (crew->running.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(crew->mu);
        crew->cv.notify_all();
      }
    });
  crew->work(0);
  const auto spin_from = std::chrono::steady_clock::now();
  while (crew->running.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() - spin_from < kSpin)
    Relax();
  std::unique_lock<std::mutex> lock(crew->mu);
  crew->closed = true;  // helpers not yet started will not touch this call's buffers
  crew->cv.wait(lock, [&] { return crew->running.load(std::memory_order_acquire) == 0; });
}

// A copy of K's step over half its lanes (QUADJAX_NARROW), for batches that fit in it: one block's
// step is then one chain of dependent operations, bound by latency, and a 256-bit division or square
// root has about half a 512-bit one's (N = 1: 134 against 190-200 ns per step, 2026-12-05,
// benchmarks/README.md).
// The generator places every fused multiply-add (the library is built without contraction), so both
// copies run the same arithmetic in every lane: a vehicle's bits do not depend on which ran it.
template <class K>
struct Narrow {
  using type = void;
};

// Every vehicle of the batch through the job, in blocks of W. Helpers from 2 048 vehicle-steps
// (~40 us of work here): a one-step call at N = 2 048 took 18 against 25 ns per vehicle on two
// threads; at N = 1 024 they gained little and doubled the CPU time (2026-12-05).
template <class K>
void Run(ffi::ThreadPool& pool, const Job<typename K::F>& job, int64_t n) {
  using KN = typename Narrow<K>::type;
  if constexpr (!std::is_void_v<KN>) {
    if (n <= KN::W) return Run<KN>(pool, job, n);
  }
  constexpr int W = K::W;
  Parallel<Block<K>>(pool, (n + W - 1) / W, n * job.T * job.substeps >= (int64_t{1} << 11), job.T * job.substeps,
                     [&](Block<K>& block, int64_t b) {
                       RunBlock<K>(block, job, b * W, static_cast<int>(std::min<int64_t>(W, n - b * W)));
                     });
}

template <typename F>
using Buf = ffi::Buffer<DataTypeOf<F>::value>;
template <typename F>
using Out = ffi::ResultBuffer<DataTypeOf<F>::value>;

// The checks shared by both entry points; fills the job's inputs and series lengths.
// `tangents`: a tangent kernel's commands after the primal's (..., T, N_U - R), `commands` then the
// primal's (..., T, R); nullptr: `commands` holds the step's whole rows.
template <class K>
ffi::Error Prepare(Job<typename K::F>& job, ffi::Span<const int64_t> batch, Buf<typename K::F>& params,
                   Buf<typename K::F>& commands, Buf<typename K::F>& wind, Buf<typename K::F>& wrench,
                   Buf<typename K::F>* tangents = nullptr) {
  auto cdims = commands.dimensions(), wdims = wind.dimensions(), rdims = wrench.dimensions();
  const int64_t width = tangents ? K::N_U - tangents->dimensions().back() : K::N_U;
  if (cdims.size() < 2 || cdims.back() != width || width <= 0 || wdims.size() < 2 || wdims.back() != K::N_Wd ||
      rdims.size() < 2 || rdims.back() != K::N_E || params.dimensions().back() != K::N_P)
    return ffi::Error::InvalidArgument("quadjax native: bad params, commands, wind or wrench shape");
  job.T = cdims[cdims.size() - 2];
  job.c_width = static_cast<int>(width);
  if (tangents) {
    auto tdims = tangents->dimensions();
    if (tdims.size() != cdims.size() || tdims[tdims.size() - 2] != job.T)
      return ffi::Error::InvalidArgument("quadjax native: command tangents of another horizon or rank");
    job.tangents = tangents->typed_data();
    job.bt = Broadcast(batch, tdims, 2);
    if (!job.bt.ok) return ffi::Error::InvalidArgument("quadjax native: command tangents do not broadcast to the batch");
  }
  job.Tw = wdims[wdims.size() - 2];
  job.Tr = rdims[rdims.size() - 2];
  if ((job.Tw != 1 && job.Tw != job.T) || (job.Tr != 1 && job.Tr != job.T))
    return ffi::Error::InvalidArgument("quadjax native: a wind or wrench series of neither 1 nor T rows");
  job.params = params.typed_data();
  job.commands = commands.typed_data();
  job.wind = wind.typed_data();
  job.wrench = wrench.typed_data();
  job.bp = Broadcast(batch, params.dimensions(), 1);
  job.p_row = K::N_P;
  job.bc = Broadcast(batch, commands.dimensions(), 2);
  job.bw = Broadcast(batch, wind.dimensions(), 2);
  job.br = Broadcast(batch, wrench.dimensions(), 2);
  for (const auto& seg : job.state)
    if (!seg.b.ok) return ffi::Error::InvalidArgument("quadjax native: state shapes do not broadcast to the batch");
  if (!job.bp.ok || !job.bc.ok || !job.bw.ok || !job.br.ok)
    return ffi::Error::InvalidArgument("quadjax native: input shapes do not broadcast to the batch");
  return ffi::Error::Success();
}

inline int64_t Count(ffi::Span<const int64_t> batch) {
  int64_t n = 1;
  for (int64_t d : batch) n *= d;
  return n;
}

// A large result buffer, freshly mapped, faults in one 4 KiB page at a time as the blocks write it
// (glibc maps allocations above 32 MiB anew each call): ask for transparent huge pages over its
// whole 2 MiB spans before the first write (a hint; where THP is off it does nothing).
inline void HugePages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
}

// Each saved part of n vehicles holds T / save_every slots (the forward kernels' and Trail's);
// their pages asked for huge (HugePages)
template <typename F>
ffi::Error CheckSaved(const Job<F>& job, int64_t n) {
  const int64_t slots = job.save_every ? job.T / job.save_every : 0;
  for (const auto& part : job.saved) {
    if (part.count != n * slots * part.width) return ffi::Error::InvalidArgument("quadjax native: bad saved shape");
    HugePages(part.out, static_cast<size_t>(part.count) * sizeof(F));
  }
  return ffi::Error::Success();
}

// The open loop: T ticks of `substeps` steps on packed state rows, every save_every-th state kept
// in `job.saved`'s parts (set by the entry points below).
template <class K>
ffi::Error RunRollout(ffi::ThreadPool& pool, Job<typename K::F>& job, Buf<typename K::F>& params,
                      Buf<typename K::F>& state, Buf<typename K::F>& commands, Buf<typename K::F>& wind,
                      Buf<typename K::F>& wrench, Out<typename K::F>& final_state, int64_t substeps,
                      int64_t save_every, Buf<typename K::F>* tangents = nullptr) {
  using F = typename K::F;
  auto fdims = final_state->dimensions();
  if (fdims.size() == 0 || fdims.back() != K::N_S || state.dimensions().back() != K::N_S)
    return ffi::Error::InvalidArgument("quadjax native: bad state width");
  ffi::Span<const int64_t> batch(fdims.begin(), fdims.size() - 1);
  job.state.push_back({state.typed_data(), final_state->typed_data(), K::N_S, 0, Broadcast(batch, state.dimensions(), 1),
                       K::N_S, 1, K::N_S, 1});
  if (ffi::Error e = Prepare<K>(job, batch, params, commands, wind, wrench, tangents); e.failure()) return e;
  if (substeps < 1 || save_every < 0 || (save_every > 0 && job.T % save_every != 0))
    return ffi::Error::InvalidArgument("quadjax native: bad substeps or save_every");
  job.substeps = substeps;
  job.save_every = save_every;
  const int64_t n = Count(batch);
  if (ffi::Error e = CheckSaved(job, n); e.failure()) return e;
  if (job.T == 0) {  // no ticks: the final state is the initial one
    for (int64_t v = 0; v < n; ++v)
      std::copy_n(job.state[0].in + job.state[0].b.row(v) * K::N_S, K::N_S, job.state[0].out + v * K::N_S);
    return ffi::Error::Success();
  }
  Run<K>(pool, job, n);
  return ffi::Error::Success();
}

// Saved as packed rows (..., T / save_every, N_S) (the tangent kernel's: [primal | tangent]).
template <class K>
ffi::Error Rollout(ffi::ThreadPool pool, Buf<typename K::F> params, Buf<typename K::F> state,
                   Buf<typename K::F> commands, Buf<typename K::F> wind, Buf<typename K::F> wrench,
                   Out<typename K::F> final_state, Out<typename K::F> saved, int64_t substeps, int64_t save_every) {
  Job<typename K::F> job{};
  job.saved.push_back({saved->typed_data(), K::N_S, 0, static_cast<int64_t>(saved->element_count())});
  return RunRollout<K>(pool, job, params, state, commands, wind, wrench, final_state, substeps, save_every);
}

// The tangent kernels' rollout: as Rollout, with the commands' tangents an input of their own
// (..., T, N_U - R) beside the primal's (..., T, R) (StageCommands pairs them).
template <class K>
ffi::Error RolloutTangent(ffi::ThreadPool pool, Buf<typename K::F> params, Buf<typename K::F> state,
                          Buf<typename K::F> commands, Buf<typename K::F> tangents, Buf<typename K::F> wind,
                          Buf<typename K::F> wrench, Out<typename K::F> final_state, Out<typename K::F> saved,
                          int64_t substeps, int64_t save_every) {
  Job<typename K::F> job{};
  job.saved.push_back({saved->typed_data(), K::N_S, 0, static_cast<int64_t>(saved->element_count())});
  return RunRollout<K>(pool, job, params, state, commands, wind, wrench, final_state, substeps, save_every, &tangents);
}

// Saved as the state's leaves, one result each (..., T / save_every, leaf size; a one-value leaf
// without its trailing 1), as a QuadState holds them: no split of packed rows (a copy of every
// saved value) after the call.
template <class K>
ffi::Error RolloutLeaves(ffi::ThreadPool pool, Buf<typename K::F> params, Buf<typename K::F> state,
                         Buf<typename K::F> commands, Buf<typename K::F> wind, Buf<typename K::F> wrench,
                         Out<typename K::F> final_state, ffi::RemainingRets saved, int64_t substeps,
                         int64_t save_every) {
  if (static_cast<int64_t>(saved.size()) != K::NL_S)
    return ffi::Error::InvalidArgument("quadjax native: not one saved result per state leaf");
  Job<typename K::F> job{};
  for (int l = 0, at = 0; l < K::NL_S; at += K::L_S[l], ++l) {
    auto r = saved.get<Buf<typename K::F>>(l);
    if (!r.has_value()) return r.error();
    if (K::L_S[l] > 1 && (*r)->dimensions().back() != K::L_S[l])
      return ffi::Error::InvalidArgument("quadjax native: bad saved leaf");
    if ((*r)->element_count() == 0) continue;  // a leaf that nothing reads comes with no slots: not saved
    job.saved.push_back({(*r)->typed_data(), K::L_S[l], at, static_cast<int64_t>((*r)->element_count())});
  }
  return RunRollout<K>(pool, job, params, state, commands, wind, wrench, final_state, substeps, save_every);
}

// A one-step call (Step) over the batch. Its common forms (a user's scan of vmap(rk4_step): every state
// leaf and command row the vehicle's own; params, wind and wrench shared or each the vehicle's own)
// take each whole block straight: the state's and params' values one vector load each, the state's one
// store each, the command rows one register transposition, the shared rows loaded once per thread.
// Through RunBlock's general lanes, chunks and series a block cost ~40 % on top of its step at
// N = 4 096 (a user's scan 1.6x the rollout; with per-vehicle params as rows, 3x: benchmarks/README.md,
// seventeenth session). Other forms, partial blocks and batches within the half-width kernel: Run.
template <class K>
void RunStep(ffi::ThreadPool& pool, const Job<typename K::F>& job, int64_t n) {
  using F = typename K::F;
  constexpr int W = K::W, NS = K::N_S;
  const auto own_or_shared = [](const Broadcast& b) { return b.shared || b.same; };
  bool straight = n >= 2 * W && own_or_shared(job.bp) && own_or_shared(job.bw) && own_or_shared(job.br) &&
                  job.bc.same && job.c_width == K::N_U && job.tangents == nullptr;
  const F* in[NS];
  F* out[NS];
  for (const auto& seg : job.state) {
    straight &= seg.b.same && seg.in_row == 1 && seg.out_row == 1 && seg.in_value == n && seg.out_value == n;
    for (int i = 0; i < seg.width; ++i) {
      in[seg.offset + i] = seg.in + i * seg.in_value;
      out[seg.offset + i] = seg.out + i * seg.out_value;
    }
  }
  if (!straight) return Run<K>(pool, job, n);
  Parallel<Block<K>>(pool, (n + W - 1) / W, n >= (int64_t{1} << 11), 1, [&](Block<K>& B, int64_t b) {
    const int64_t v0 = b * W;
    if (v0 + W > n) return RunBlock<K>(B, job, v0, static_cast<int>(n - v0));
    const LaneRows<W> own(v0, W);
    LoadParams(B, job, own);  // a sweep's per-vehicle params: vehicle-minor, a vector load per value
    // the held wind and wrench, as LoadParams the params: rows the fleet shares stay loaded from the
    // thread's previous block (a partial block's RunBlock loads the same rows)
    if (!B.series_ready) {
      Gather(B.wind, job.wind, LaneRows<W>(job.bw, own), K::N_Wd, K::N_Wd);
      Gather(B.ext, job.wrench, LaneRows<W>(job.br, own), K::N_E, K::N_E);
      B.series_ready = job.bw.shared && job.br.shared;
    }
    for (int i = 0; i < NS; ++i) B.s[i] = LoadWhole<typename K::V>(in[i] + v0);
    Gather(B.u, job.commands, own, K::N_U, K::N_U);
    K::step(B.H, B.p, B.s, B.u, B.wind, B.ext);
    for (int i = 0; i < NS; ++i) StoreWhole(out[i] + v0, B.s[i]);
  });
}

// One step (quadjax.rk4_step) on the state's leaves, each (...) or (..., width), vehicle-minor (the
// batch dims are the minor ones: value i of row r at i * rows + r), the leaves' results too, and the
// params (..., N_P) likewise (a sweep's per-vehicle params one vector load per value, where rows took
// a transposition per block every tick). The command (..., 1, R), wind and wrench are rows, as in the
// rollout: a scan's tick of time-major commands reaches the kernel as XLA holds it, where a
// vehicle-minor command cost XLA a transposing copy per tick, on one thread (benchmarks/README.md,
// 2026-12-05).
template <class K>
ffi::Error Step(ffi::ThreadPool pool, Buf<typename K::F> params, Buf<typename K::F> s0, Buf<typename K::F> s1,
                Buf<typename K::F> s2, Buf<typename K::F> s3, Buf<typename K::F> s4, Buf<typename K::F> s5,
                Buf<typename K::F> s6, Buf<typename K::F> commands, Buf<typename K::F> wind,
                Buf<typename K::F> wrench, Out<typename K::F> o0, Out<typename K::F> o1, Out<typename K::F> o2,
                Out<typename K::F> o3, Out<typename K::F> o4, Out<typename K::F> o5, Out<typename K::F> o6) {
  using F = typename K::F;
  static_assert(K::NL_S == 7, "the state has 7 leaves");
  Buf<F>* in[7] = {&s0, &s1, &s2, &s3, &s4, &s5, &s6};
  Out<F>* out[7] = {&o0, &o1, &o2, &o3, &o4, &o5, &o6};
  auto pdims = o0->dimensions();  // the position's: (batch..., 3)
  if (pdims.size() == 0 || pdims.back() != K::L_S[0]) return ffi::Error::InvalidArgument("quadjax native: bad position shape");
  ffi::Span<const int64_t> batch(pdims.begin(), pdims.size() - 1);
  const int64_t n = Count(batch);
  Job<F> job{};
  for (int l = 0, offset = 0; l < 7; offset += K::L_S[l], ++l) {
    auto idims = in[l]->dimensions(), odims = (*out[l])->dimensions();
    // a leaf of one value may come without its trailing 1
    const int core = idims.size() == batch.size() && K::L_S[l] == 1 ? 0 : 1;
    if ((core && idims.back() != K::L_S[l]) || odims.size() != batch.size() + core ||
        Count(odims) != n * K::L_S[l])
      return ffi::Error::InvalidArgument("quadjax native: bad state leaf shape");
    job.state.push_back({in[l]->typed_data(), (*out[l])->typed_data(), K::L_S[l], offset, Broadcast(batch, idims, core),
                         1, Count(idims) / K::L_S[l], 1, n});
  }
  if (ffi::Error e = Prepare<K>(job, batch, params, commands, wind, wrench); e.failure()) return e;
  if (job.T != 1) return ffi::Error::InvalidArgument("quadjax native: a step takes one command row");
  job.p_row = 1;  // the step's params vehicle-minor, as its state
  job.p_value = Count(params.dimensions()) / K::N_P;
  job.substeps = 1;
  job.save_every = 0;
  RunStep<K>(pool, job, n);
  return ffi::Error::Success();
}


// ---------------------------------------------------------------------------------------------
// The reverse sweep (reverse-mode derivatives of the open loop). A is the generated adjoint of
// K's step (the transpose of its linearisation, quadjax.native.adjoint_step):
//   A::step(H, P, X, U, Wd, E, C)   C <- the cotangents before the step, from those after it;
// C = (state, params, command, wind, wrench) cotangents: the state's replaced, the others
// accumulated. Per block: a forward pass that keeps the state at the start of each segment of
// ticks, then, segment by segment from the last, the segment's states recomputed into a trail
// and swept backwards (a single segment when the whole trail fits: no recomputation).
// jax.grad's own forward pass keeps for the sweep either the whole trail or the checkpoints (the same
// run with `kept_out`: final and what it keeps, the kernel Trail below); the sweep then reads
// them (`kept_in`) and runs no forward pass of its own beyond recomputing segments: a forward pass
// fewer per gradient. The segments' length comes from the caller (quadjax.native.TRAIL_VECTORS).
// Results, one row per vehicle of the batch (the caller sums over the dims it broadcast):
// cotangents of params (..., N_P; (..., 0) from an adjoint with the params fixed), state (..., N_S),
// commands (..., T, R), wind (..., Tw, 3), wrench (..., Tr, 6).

template <class K, class A>
struct AdjointBlock {
  using V = typename K::V;
  // the params' cotangent is carried (NPC = N_P) or not (0: an adjoint of the step with the params fixed)
  static constexpr int NC = A::N_C, NPC = NC - (K::N_S + K::N_U + K::N_Wd + K::N_E);
  static constexpr int CP = K::N_S, CU = CP + NPC, CW = CU + K::N_U, CE = CW + K::N_Wd;
  static_assert(NPC == 0 || NPC == K::N_P, "the adjoint carries the state, [params,] command, wind and wrench cotangents");
  V p[K::N_P], H[K::NH], HA[A::NH], s[K::N_S], u[K::N_U], wind[K::N_Wd], ext[K::N_E], c[NC];
  // a segment's commands and their cotangents, lane-major: read and written a segment at a time
  // by register transpositions, where a tick at a time took a load or store per lane and value
  std::vector<V> checkpoints, trail, commands, g_commands;
  // the saved states' cotangents, kStagedSlots slots at a time (AdjointRun)
  std::vector<V> ct_saved;
  // jax.grad's forward pass of a rollout that saves states: the states to save, as Block's
  static constexpr int kept = SavedSlots<K::N_S, V>();
  std::vector<V> saved;
};

// Slots of the saved states' cotangents a sweep stages at once: whole W x W tiles for Gather's
// transpositions, a few KB that stay in L1 while the sweep goes back through them
constexpr int64_t kStagedSlots = 16;

template <typename F>
struct AdjointJob {
  Job<F> fwd;  // params, commands, wind, wrench, the initial state (one segment), T, substeps, save_every
  const F *ct_final, *ct_saved;
  Broadcast bf, bs;  // the cotangents' rows (a zero cotangent may come unbatched)
  F *g_params, *g_state, *g_commands, *g_wind, *g_wrench;
  int64_t segment;  // ticks per recomputed segment (> 0)
  // what jax.grad's forward pass keeps for the sweep, in a caller's buffer: written by Trail (with
  // `final`, and no sweep), read by the sweep (nullptr: none; it runs its own forward
  // pass). `whole`: the whole trail, T * substeps * N_S values per vehicle; else the checkpoints,
  // the state at each segment's start, segments * N_S.
  F *kept_out = nullptr, *final_out = nullptr;
  const F* kept_in = nullptr;
  bool whole = false;
};

// What a kept buffer of `size` values over n vehicles holds: 1 the whole trail, 0 the checkpoints,
// -1 neither (the trail first: with one tick per segment and one substep the two are the same).
template <typename F>
int KeptKind(const AdjointJob<F>& job, int64_t n, int64_t size) {
  const Job<F>& f = job.fwd;
  const int64_t L = std::max<int64_t>(1, std::min<int64_t>(f.T, job.segment));
  if (size == n * f.T * f.substeps * f.state[0].width) return 1;
  if (size == n * ((f.T + L - 1) / L) * f.state[0].width) return 0;
  return -1;
}

// A vehicle's trail in the caller's buffer: the block's vehicles [v0, v0 + count) hold the values
// [v0 * L, (v0 + count) * L) (L = T * substeps * N_S), state e of the trail (tick * substeps + k) at
// e * N_S * count, as the block's vectors (lane-interleaved: a full block's are whole-vector stores
// and loads, the partial last block's lane by lane). Only the sweep of the same batch reads it.
template <class V, typename F, int W>
inline void PutTrail(F* at, int count, const V* s, int n) {
  if (count == W)
    for (int i = 0; i < n; ++i) StoreWhole(at + i * W, s[i]);
  else
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < count; ++j) at[i * count + j] = s[i][j];
}
template <class V, typename F, int W>
inline void TakeTrail(V* s, int count, const F* at, int n) {
  if (count == W)
    for (int i = 0; i < n; ++i) s[i] = LoadWhole<V>(at + i * W);
  else
    for (int i = 0; i < n; ++i) {
      V v{};
      for (int j = 0; j < count; ++j) v[j] = at[i * count + j];
      for (int j = count; j < W; ++j) v[j] = v[0];  // spare lanes repeat lane 0 (finite; discarded)
      s[i] = v;
    }
}

template <class K, class A>
void AdjointRun(AdjointBlock<K, A>& B, const AdjointJob<typename K::F>& job, int64_t v0, int count) {
  using F = typename K::F;
  using V = typename K::V;
  using AB = AdjointBlock<K, A>;
  constexpr int W = K::W, R = K::N_U, NS = K::N_S, NP = K::N_P, NW = K::N_Wd, NE = K::N_E;
  const Job<F>& f = job.fwd;
  const int64_t T = f.T, sub = f.substeps, slots = f.save_every ? T / f.save_every : 0;
  const Lanes<W> lanes(f, v0, count);
  const auto& seg0 = f.state[0];
  Gather(B.p, f.params, LaneRows<W>(f.bp, lanes.own), f.p_row, NP, f.p_value);
  Gather(B.s, seg0.in, LaneRows<W>(seg0.b, lanes.own), NS, NS);
  K::prologue(B.p, B.H);
  if (!job.kept_out) A::prologue(B.p, B.HA);
  LoadSeries<K>(f, lanes, 0, true, B.wind, B.ext);  // held series: read once
  // segments of L ticks: the trail holds L * substeps states, the commands are staged a segment at
  // a time; a kept whole trail is written or read in place
  const int64_t L = std::max<int64_t>(1, std::min<int64_t>(T, job.segment));
  const int64_t segments = (T + L - 1) / L;
  const int64_t per = job.whole ? T * sub * NS : segments * NS;  // a vehicle's kept values
  F* out = job.kept_out ? job.kept_out + v0 * per : nullptr;
  const F* in = job.kept_in ? job.kept_in + v0 * per : nullptr;
  const bool trail_in = in && job.whole;
  B.checkpoints.resize(in || out ? 0 : segments * NS);
  B.trail.resize(out ? 0 : trail_in ? NS : std::min(T, L) * sub * NS);
  B.commands.resize(std::min(T, L) * R);
  B.g_commands.resize(out ? 0 : std::min(T, L) * R);
  B.saved.resize(out && slots ? AB::kept * NS : 0);
  auto load_inputs = [&](int64_t t, int64_t t0) {  // tick t of the segment staged from t0
    for (int r = 0; r < R; ++r) B.u[r] = B.commands[(t - t0) * R + r];
    LoadSeries<K>(f, lanes, t, false, B.wind, B.ext);
  };
  auto stage = [&](int64_t t0, int64_t t1) {
    StageCommands<K>(B.commands.data(), f, lanes, t0, static_cast<int>(t1 - t0));
  };
  auto forward = [&](int64_t t0, int64_t t1, bool keep) {  // ticks [t0, t1) from B.s, t1 - t0 <= L
    stage(t0, t1);
    if (!keep && out)
      PutTrail<V, F, W>(out + (t0 / L) * NS * count, count, B.s, NS);
    else if (!keep)
      std::copy_n(B.s, NS, &B.checkpoints[(t0 / L) * NS]);
    for (int64_t t = t0; t < t1; ++t) {
      load_inputs(t, t0);
      for (int64_t k = 0; k < sub; ++k) {
        if (keep && out)
          PutTrail<V, F, W>(out + (t * sub + k) * NS * count, count, B.s, NS);
        else if (keep)
          std::copy_n(B.s, NS, &B.trail[((t - t0) * sub + k) * NS]);
        K::step(B.H, B.p, B.s, B.u, B.wind, B.ext);
      }
      if (out && slots && (t + 1) % f.save_every == 0)  // jax.grad's forward pass saves as RunBlock does
        for (const auto& part : f.saved)
          SaveSlot<AB::kept>(B.saved.data(), part.offset, part.out, lanes.own, count, (t + 1) / f.save_every - 1,
                             slots, B.s + part.offset, part.width);
    }
  };
  if (out) {  // jax.grad's forward pass: what it keeps and the final state; no sweep
    for (int64_t t0 = 0; t0 < T; t0 += L) forward(t0, std::min(T, t0 + L), job.whole);
    for (int j = 0; j < count; ++j)
      for (int i = 0; i < NS; ++i) job.final_out[(v0 + j) * NS + i] = B.s[i][j];
    return;
  }
  // the state before substep k of tick t (in the segment from t0)
  auto state_at = [&](int64_t t, int64_t t0, int64_t k) -> V* {
    if (!trail_in) return &B.trail[((t - t0) * sub + k) * NS];
    const int64_t e = t * sub + k, stride = NS * count;
    // the sweep reads the trail backwards, a few hundred bytes per state: the hardware's prefetchers
    // did not run ahead of it (each state's lines missed, ~8 ns per vehicle-step), so ask for the
    // state kPrefetch back now
    constexpr int64_t kPrefetch = 4;
    if (e >= kPrefetch)
      for (int64_t b = 0; b < stride * static_cast<int64_t>(sizeof(F)); b += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(in + (e - kPrefetch) * stride) + b);
    TakeTrail<V, F, W>(B.trail.data(), count, in + e * stride, NS);
    return B.trail.data();
  };
  if (segments > 1 && !in)  // the checkpoints (one segment: its trail, below)
    for (int64_t t0 = 0; t0 < T; t0 += L) forward(t0, std::min(T, t0 + L), false);
  for (int i = 0; i < AB::NC; ++i) B.c[i] = V{};
  Gather(B.c, job.ct_final, LaneRows<W>(job.bf, lanes.own), NS, NS);
  // the saved states' cotangents, read kStagedSlots slots at a time: each lane's slots are one run of
  // values, gathered by W x W transpositions. Lane by lane (a scalar load and insert per value and
  // lane) jax.grad of a loss on every saved state took 93-104 ns per vehicle-step, now 57-64 (N = 256,
  // T = 1 000, 2 threads, AMD EPYC, glibc keeping freed buffers; benchmarks/README.md, sixteenth session)
  const LaneRows<W> saved_rows(job.bs, lanes.own);
  int64_t staged = slots;  // the first slot staged in B.ct_saved (slots: none)
  B.ct_saved.resize(slots ? std::min(slots, kStagedSlots) * NS : 0);
  for (int64_t seg = segments - 1; seg >= 0; --seg) {
    const int64_t t0 = seg * L, t1 = std::min(T, t0 + L);
    if (trail_in) {
      stage(t0, t1);
    } else {
      if (in)
        TakeTrail<V, F, W>(B.s, count, in + seg * NS * count, NS);
      else if (segments > 1)
        std::copy_n(&B.checkpoints[seg * NS], NS, B.s);
      forward(t0, t1, true);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      if (f.save_every > 0 && (t + 1) % f.save_every == 0) {  // the cotangent of the state saved after tick t
        const int64_t slot = (t + 1) / f.save_every - 1;
        if (slot < staged) {  // the slots before it, as vectors: a vector load per lane and a transposition
          staged = std::max<int64_t>(0, slot + 1 - kStagedSlots);
          Gather(B.ct_saved.data(), job.ct_saved + staged * NS, saved_rows, slots * NS,
                 static_cast<int>((slot + 1 - staged) * NS));
        }
        const V* ct = &B.ct_saved[(slot - staged) * NS];
        for (int i = 0; i < NS; ++i) B.c[i] += ct[i];
      }
      load_inputs(t, t0);
      for (int i = AB::CU; i < AB::CW; ++i) B.c[i] = V{};
      if (f.Tw > 1) for (int i = AB::CW; i < AB::CE; ++i) B.c[i] = V{};
      if (f.Tr > 1) for (int i = AB::CE; i < AB::NC; ++i) B.c[i] = V{};
      for (int64_t k = sub - 1; k >= 0; --k) A::step(B.HA, B.p, state_at(t, t0, k), B.u, B.wind, B.ext, B.c);
      for (int r = 0; r < R; ++r) B.g_commands[(t - t0) * R + r] = B.c[AB::CU + r];
      if (f.Tw > 1 || f.Tr > 1)  // per-tick wind and wrench series (rare): lane by lane
        for (int j = 0; j < count; ++j) {
          const int64_t v = v0 + j;
          if (f.Tw > 1) for (int i = 0; i < NW; ++i) job.g_wind[(v * T + t) * NW + i] = B.c[AB::CW + i][j];
          if (f.Tr > 1) for (int i = 0; i < NE; ++i) job.g_wrench[(v * T + t) * NE + i] = B.c[AB::CE + i][j];
        }
    }
    Scatter(job.g_commands + t0 * R, lanes.own, count, T * R, B.g_commands.data(), static_cast<int>((t1 - t0) * R));
  }
  for (int j = 0; j < count; ++j) {
    const int64_t v = v0 + j;
    for (int i = 0; i < NS; ++i) job.g_state[v * NS + i] = B.c[i][j];
    for (int i = 0; i < AB::NPC; ++i) job.g_params[v * AB::NPC + i] = B.c[AB::CP + i][j];
    if (f.Tw == 1) for (int i = 0; i < NW; ++i) job.g_wind[v * NW + i] = B.c[AB::CW + i][j];
    if (f.Tr == 1) for (int i = 0; i < NE; ++i) job.g_wrench[v * NE + i] = B.c[AB::CE + i][j];
  }
}

// The forward part of an adjoint job (the sweep's and Trail's): the initial state, params, commands,
// wind and wrench of the batch, substeps and save_every.
template <class K>
ffi::Error PrepareSweep(AdjointJob<typename K::F>& job, ffi::Span<const int64_t> batch, Buf<typename K::F>& state,
                        Buf<typename K::F>& params, Buf<typename K::F>& commands, Buf<typename K::F>& wind,
                        Buf<typename K::F>& wrench, int64_t substeps, int64_t save_every, int64_t segment) {
  job.fwd.state.push_back({state.typed_data(), nullptr, K::N_S, 0, Broadcast(batch, state.dimensions(), 1),
                           K::N_S, 1, K::N_S, 1});
  if (ffi::Error e = Prepare<K>(job.fwd, batch, params, commands, wind, wrench); e.failure()) return e;
  if (substeps < 1 || save_every < 0 || (save_every > 0 && job.fwd.T % save_every != 0) || segment < 1)
    return ffi::Error::InvalidArgument("quadjax native adjoint: bad substeps, save_every or segment");
  job.fwd.substeps = substeps;
  job.fwd.save_every = save_every;
  job.segment = segment;
  return ffi::Error::Success();
}

// Every block of an adjoint job's n vehicles through AdjointRun.
template <class K, class A>
void RunSweep(ffi::ThreadPool& pool, const AdjointJob<typename K::F>& job, int64_t n) {
  constexpr int W = K::W;
  Parallel<AdjointBlock<K, A>>(pool, (n + W - 1) / W, n * job.fwd.T * job.fwd.substeps >= (int64_t{1} << 10),
                               job.fwd.T * job.fwd.substeps, [&](AdjointBlock<K, A>& block, int64_t b) {
                                 AdjointRun<K, A>(block, job, b * W, static_cast<int>(std::min<int64_t>(W, n - b * W)));
                               });
}

template <class K, class A>
ffi::Error Adjoint(ffi::ThreadPool pool, Buf<typename K::F> params, Buf<typename K::F> state,
                   Buf<typename K::F> commands, Buf<typename K::F> wind, Buf<typename K::F> wrench,
                   Buf<typename K::F> ct_final, Buf<typename K::F> ct_saved, Buf<typename K::F> trail,
                   Out<typename K::F> g_params, Out<typename K::F> g_state, Out<typename K::F> g_commands,
                   Out<typename K::F> g_wind, Out<typename K::F> g_wrench, int64_t substeps, int64_t save_every,
                   int64_t segment) {
  using F = typename K::F;
  auto gdims = g_state->dimensions();
  if (gdims.size() == 0 || gdims.back() != K::N_S || state.dimensions().back() != K::N_S ||
      ct_final.dimensions().back() != K::N_S || ct_saved.dimensions().back() != K::N_S)
    return ffi::Error::InvalidArgument("quadjax native adjoint: bad state or cotangent width");
  ffi::Span<const int64_t> batch(gdims.begin(), gdims.size() - 1);
  AdjointJob<F> job{};
  job.bf = Broadcast(batch, ct_final.dimensions(), 1);
  job.bs = Broadcast(batch, ct_saved.dimensions(), 2);
  if (!job.bf.ok || !job.bs.ok) return ffi::Error::InvalidArgument("quadjax native adjoint: cotangent shapes do not broadcast");
  if (ffi::Error e = PrepareSweep<K>(job, batch, state, params, commands, wind, wrench, substeps, save_every, segment);
      e.failure())
    return e;
  job.ct_final = ct_final.typed_data();
  job.ct_saved = ct_saved.typed_data();
  job.g_params = g_params->typed_data();
  job.g_state = g_state->typed_data();
  job.g_commands = g_commands->typed_data();
  job.g_wind = g_wind->typed_data();
  job.g_wrench = g_wrench->typed_data();
  HugePages(job.g_commands, static_cast<size_t>(g_commands->element_count()) * sizeof(F));
  const int64_t n = Count(batch);
  if (trail.element_count() > 0) {  // what the forward pass kept (Trail), for this very batch
    const int kind = KeptKind(job, n, trail.element_count());
    if (kind < 0) return ffi::Error::InvalidArgument("quadjax native adjoint: a trail of another batch or horizon");
    job.kept_in = trail.typed_data();
    job.whole = kind == 1;
  }
  if (job.fwd.T == 0) {  // no ticks: the state's cotangent passes through, nothing else has one
    for (int64_t v = 0; v < n; ++v) std::copy_n(job.ct_final + job.bf.row(v) * K::N_S, K::N_S, job.g_state + v * K::N_S);
    std::fill_n(job.g_params, n * AdjointBlock<K, A>::NPC, F{});
    std::fill_n(job.g_wind, g_wind->element_count(), F{});
    std::fill_n(job.g_wrench, g_wrench->element_count(), F{});
    return ffi::Error::Success();
  }
  RunSweep<K, A>(pool, job, n);
  return ffi::Error::Success();
}

// jax.grad's forward pass: the rollout's final state, its saved states (as Rollout's, a run of slots
// per lane at a time) and what its sweep reads, the whole trail or the checkpoints of segments of
// `segment` ticks, as the result's size says.
template <class K, class A>
ffi::Error Trail(ffi::ThreadPool pool, Buf<typename K::F> params, Buf<typename K::F> state,
                 Buf<typename K::F> commands, Buf<typename K::F> wind, Buf<typename K::F> wrench,
                 Out<typename K::F> final, Out<typename K::F> saved, Out<typename K::F> trail, int64_t substeps,
                 int64_t save_every, int64_t segment) {
  using F = typename K::F;
  auto fdims = final->dimensions();
  if (fdims.size() == 0 || fdims.back() != K::N_S || state.dimensions().back() != K::N_S)
    return ffi::Error::InvalidArgument("quadjax native trail: bad state width");
  ffi::Span<const int64_t> batch(fdims.begin(), fdims.size() - 1);
  AdjointJob<F> job{};
  if (ffi::Error e = PrepareSweep<K>(job, batch, state, params, commands, wind, wrench, substeps, save_every, segment);
      e.failure())
    return e;
  const int64_t n = Count(batch);
  job.fwd.saved.push_back({saved->typed_data(), K::N_S, 0, static_cast<int64_t>(saved->element_count())});
  if (ffi::Error e = CheckSaved(job.fwd, n); e.failure()) return e;
  const int kind = KeptKind(job, n, trail->element_count());
  if (kind < 0) return ffi::Error::InvalidArgument("quadjax native trail: a result of neither the trail's size nor the checkpoints'");
  job.kept_out = trail->typed_data();
  job.whole = kind == 1;
  job.final_out = final->typed_data();
  if (job.fwd.T == 0) {
    for (int64_t v = 0; v < n; ++v)
      std::copy_n(state.typed_data() + job.fwd.state[0].b.row(v) * K::N_S, K::N_S, job.final_out + v * K::N_S);
    return ffi::Error::Success();
  }
  HugePages(job.kept_out, static_cast<size_t>(trail->element_count()) * sizeof(F));
  RunSweep<K, A>(pool, job, n);
  return ffi::Error::Success();
}

}  // namespace

#define QJ_BUF(K) ffi::Buffer<DataTypeOf<K::F>::value>
// the open loop's binding around its results: params, state, commands, wind, wrench; substeps, save_every
#define QJ_ROLLOUT_BIND(K, RESULTS)                                                                    \
  ffi::Ffi::Bind()                                                                                     \
      .Ctx<ffi::ThreadPool>()                                                                          \
      .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>()            \
      RESULTS                                                                                          \
      .Attr<int64_t>("substeps")                                                                       \
      .Attr<int64_t>("save_every")
#define QUADJAX_NARROW(K, KN) \
  namespace {                 \
  template <>                 \
  struct Narrow<K> {          \
    using type = KN;          \
  };                          \
  }
#define QUADJAX_ROLLOUT(NAME, K)                                                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Rollout<K>), QJ_ROLLOUT_BIND(K, .Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>()))
#define QUADJAX_ROLLOUT_TANGENT(NAME, K)                                                               \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (RolloutTangent<K>),                                             \
                                ffi::Ffi::Bind()                                                       \
                                    .Ctx<ffi::ThreadPool>()                                            \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>()                \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>()                \
                                    .Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>()                                 \
                                    .Attr<int64_t>("substeps")                                         \
                                    .Attr<int64_t>("save_every"))
#define QUADJAX_ROLLOUT_LEAVES(NAME, K)                                                                \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (RolloutLeaves<K>), QJ_ROLLOUT_BIND(K, .Ret<QJ_BUF(K)>().RemainingRets()))
#define QUADJAX_STEP(NAME, K)                                                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Step<K>),                                                       \
                                ffi::Ffi::Bind()                                                       \
                                    .Ctx<ffi::ThreadPool>()                                            \
                                    .Arg<QJ_BUF(K)>()                                                  \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>() \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>()                \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>()                \
                                    .Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>() \
                                    .Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>())
#define QUADJAX_ADJOINT(NAME, K, A)                                                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Adjoint<K, A>),                                                 \
                                ffi::Ffi::Bind()                                                       \
                                    .Ctx<ffi::ThreadPool>()                                            \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>()                \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>() \
                                    .Arg<QJ_BUF(K)>()                                                  \
                                    .Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>()                \
                                    .Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>()                                 \
                                    .Attr<int64_t>("substeps")                                         \
                                    .Attr<int64_t>("save_every")                                       \
                                    .Attr<int64_t>("segment"))
#define QUADJAX_TRAIL(NAME, K, A)                                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Trail<K, A>),                                                   \
                                QJ_ROLLOUT_BIND(K, .Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>().Ret<QJ_BUF(K)>()) \
                                    .Attr<int64_t>("segment"))
