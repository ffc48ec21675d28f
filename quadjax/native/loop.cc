// The native CPU closed loop's harness, called through XLA's FFI: the whole horizon of a
// closed-loop tick (controller, held command, RK4 substeps, a streaming fold) in one call.
//
// No physics, control law or hook here. quadjax/native/loop.py generates, from the engine's own
// tick (quadjax.engine's closed loop: observer, controller, the held command's substeps, hooks,
// status and freezing, traced for one vehicle), one struct K with
//   K::prologue(P, H)         what depends on the tick's invariant inputs alone, once per block
//   K::step(H, P, X, k, U, Y) one tick at tick index k for W vehicles: the carry X in place, the
//                             tick's series row U read, its output Y written
// over GCC vector types, and pastes it, then rollout.cc (whose helpers this file uses: DataTypeOf,
// LaneRows, Gather, Scatter, Parallel, Buf, Out, QJ_BUF), then this file, then its QUADJAX_LOOP line.
//
// Layouts (row-major, all of the float dtype; integers and flags as whole numbers):
//   inputs  (Np, N_P)      Np = N or 1 (shared by every vehicle): what the tick reads and never
//                          changes (params, controller params, hooks' constants)
//   carry   (N, N_X)       what it carries (state, controller state, hooks, status)
//   series  one argument per leaf l of what the tick reads at its own index (commands, wind,
//           wrench), streamed: (Nu, Tu, L_U[l]), Nu = N or 1, Tu = num_ticks or 1 (one row for
//           every tick); as XLA holds them (no copy to pack them), the last leaf (a spare) not passed
// Results: the carry after num_ticks ticks (N, N_X), and of every `every`-th tick each leaf l of
// the tick's output Y (N, S, L_Y[l]), S = num_ticks / every (none when every = 0): a result per
// leaf, so that XLA gets each saved array as it is, with no copy to split them. A leaf that nothing
// reads comes as (N, 0, L_Y[l]) and is not saved (quadjax/native/loop.py, _unread).

namespace {

template <class K>
struct LoopBlock {
  using V = typename K::V;
  V p[K::N_P], H[K::NH], x[K::N_X], k[K::N_k], u[K::N_U], y[K::N_Y];
  static constexpr int kept = SavedSlots<K::N_Y, V>();  // slots of saved outputs held
  V saved[kept * K::N_Y];  // the outputs to save (SaveSlot), the leaf at offset o from kept * o
};

template <class K>
ffi::Error Loop(ffi::ThreadPool pool, Buf<typename K::F> params, Buf<typename K::F> carry, ffi::RemainingArgs series,
                Out<typename K::F> out, ffi::RemainingRets saved, int64_t num_ticks, int64_t every) {
  using F = typename K::F;
  using V = typename K::V;
  constexpr int W = K::W;
  auto xd = carry.dimensions(), pd = params.dimensions();
  if (xd.size() != 2 || xd[1] != K::N_X) return ffi::Error::InvalidArgument("quadjax loop: carry is not (N, N_X)");
  const int64_t n = xd[0];
  if (pd.size() != 2 || pd[1] != K::N_P || (pd[0] != n && pd[0] != 1))
    return ffi::Error::InvalidArgument("quadjax loop: inputs are not (N or 1, N_P)");
  if (num_ticks < 0 || every < 0 || (every > 0 && num_ticks % every))
    return ffi::Error::InvalidArgument("quadjax loop: num_ticks < 0, or every does not divide it");
  constexpr int NU = K::NL_U - 1;  // the series' leaves (the last, a spare, not passed)
  if (static_cast<int64_t>(series.size()) != NU) return ffi::Error::InvalidArgument("quadjax loop: not one series per leaf");
  const F* U[K::NL_U] = {};
  int64_t u_at[K::NL_U] = {}, u_stride[K::NL_U] = {}, t_stride[K::NL_U] = {};
  bool streamed = false;  // any series longer than one row
  for (int l = 0; l < NU; ++l) {
    auto a = series.get<Buf<F>>(l);
    if (!a.has_value()) return a.error();
    auto ud = a->dimensions();
    if (ud.size() != 3 || ud[2] != K::L_U[l] || (ud[0] != n && ud[0] != 1) || (ud[1] != num_ticks && ud[1] != 1))
      return ffi::Error::InvalidArgument("quadjax loop: a series is not (N or 1, num_ticks or 1, its size)");
    U[l] = a->typed_data();
    u_at[l + 1] = u_at[l] + K::L_U[l];
    t_stride[l] = ud[1] == 1 ? 0 : K::L_U[l];
    u_stride[l] = ud[0] == 1 ? 0 : ud[1] * K::L_U[l];
    streamed |= ud[1] != 1;
  }
  // one result per leaf of the tick's output (the last leaf, a spare, is not returned)
  const int64_t S = every ? num_ticks / every : 0;
  constexpr int NY = K::NL_Y - 1;
  if (static_cast<int64_t>(saved.size()) != (every ? NY : 0))
    return ffi::Error::InvalidArgument("quadjax loop: not one saved result per output leaf");
  F* Y[K::NL_Y] = {};
  int64_t y_at[K::NL_Y] = {};
  for (int l = 0; l < (every ? NY : 0); ++l) {
    auto r = saved.get<Buf<F>>(l);
    if (!r.has_value()) return r.error();
    auto yd = (*r)->dimensions();
    y_at[l + 1] = y_at[l] + K::L_Y[l];
    if (yd.size() == 3 && yd[0] == n && yd[1] == 0 && yd[2] == K::L_Y[l]) continue;  // nothing reads it: not saved
    if (yd.size() != 3 || yd[0] != n || yd[1] != S || yd[2] != K::L_Y[l])
      return ffi::Error::InvalidArgument("quadjax loop: a saved output is not (N, num_ticks / every, its size)");
    Y[l] = (*r)->typed_data();
    HugePages(Y[l], static_cast<size_t>((*r)->element_count()) * sizeof(F));
  }
  const F *P = params.typed_data(), *X = carry.typed_data();
  F* Xo = out->typed_data();
  const int64_t p_stride = pd[0] == 1 ? 0 : K::N_P;
  Parallel<LoopBlock<K>>(pool, (n + W - 1) / W, n * num_ticks >= (int64_t{1} << 10), num_ticks, [&](LoopBlock<K>& B, int64_t b) {
    const int64_t v0 = b * W;
    const int count = static_cast<int>(std::min<int64_t>(W, n - v0));
    const LaneRows<W> own(v0, count);
    Gather(B.p, P, LaneRows<W>(own, p_stride == 0), p_stride, K::N_P);
    Gather(B.x, X, own, K::N_X, K::N_X);
    for (int i = 0; i < K::N_U; ++i) B.u[i] = V{};  // the spare
    K::prologue(B.p, B.H);
    for (int64_t t = 0, s = 0; t < num_ticks; ++t) {
      B.k[0] = V{} + static_cast<F>(t);  // whole numbers: exact below 2^24 (float32) ticks
      if (t == 0 || streamed)
        for (int l = 0; l < NU; ++l)
          Gather(B.u + u_at[l], U[l] + t * t_stride[l], LaneRows<W>(own, u_stride[l] == 0), u_stride[l], K::L_U[l]);
      K::step(B.H, B.p, B.x, B.k, B.u, B.y);
      if (every && (t + 1) % every == 0) {
        for (int l = 0; l < NY; ++l)
          if (Y[l]) SaveSlot<LoopBlock<K>::kept>(B.saved, y_at[l], Y[l], own, count, s, S, B.y + y_at[l], K::L_Y[l]);
        ++s;
      }
    }
    Scatter(Xo, own, count, K::N_X, B.x, K::N_X);
  });
  return ffi::Error::Success();
}

}  // namespace

#define QUADJAX_LOOP(NAME, K)                                                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Loop<K>),                                                       \
                                ffi::Ffi::Bind()                                                       \
                                    .Ctx<ffi::ThreadPool>()                                            \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>().RemainingArgs()                 \
                                    .Ret<QJ_BUF(K)>().RemainingRets()                                  \
                                    .Attr<int64_t>("num_ticks")                                        \
                                    .Attr<int64_t>("every"))
