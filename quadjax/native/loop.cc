// The native CPU closed loop's harness, called through XLA's FFI: the whole horizon of a
// closed-loop tick (controller, held command, RK4 substeps, a streaming fold) in one call.
//
// No physics, control law or hook here. quadjax/native/loop.py generates, from the engine's own
// tick (quadjax.engine's closed loop: observer, controller, the held command's substeps, hooks,
// status and freezing, traced for one vehicle), one struct K with
//   K::prologue(P, H)         what depends on the tick's invariant inputs alone, once per block
//   K::step(H, P, X, k)       one tick at tick index k for W vehicles, the carry X in place
// over GCC vector types, and pastes it, then rollout.cc (whose helpers this file uses: DataTypeOf,
// Gather, Parallel, Buf, Out, QJ_BUF), then this file, then its QUADJAX_LOOP line.
//
// Layouts (row-major, all of the float dtype; integers and flags of the carry as whole numbers):
//   inputs  (Np, N_P)   Np = N or 1 (shared by every vehicle): what the tick reads and never
//                       changes (params, controller params, hooks' constants)
//   carry   (N, N_X)    what it carries (state, controller state, hooks, status)
// Result: the carry after num_ticks ticks, (N, N_X).

namespace {

template <class K>
struct LoopBlock {
  using V = typename K::V;
  V p[K::N_P], H[K::NH], x[K::N_X], k[K::N_k];
};

template <class K>
ffi::Error Loop(ffi::ThreadPool pool, Buf<typename K::F> params, Buf<typename K::F> carry, Out<typename K::F> out,
                int64_t num_ticks) {
  using F = typename K::F;
  using V = typename K::V;
  constexpr int W = K::W;
  auto xd = carry.dimensions(), pd = params.dimensions();
  if (xd.size() != 2 || xd[1] != K::N_X) return ffi::Error::InvalidArgument("quadjax loop: carry is not (N, N_X)");
  const int64_t n = xd[0];
  if (pd.size() != 2 || pd[1] != K::N_P || (pd[0] != n && pd[0] != 1))
    return ffi::Error::InvalidArgument("quadjax loop: inputs are not (N or 1, N_P)");
  if (num_ticks < 0) return ffi::Error::InvalidArgument("quadjax loop: num_ticks < 0");
  const F *P = params.typed_data(), *X = carry.typed_data();
  F* Y = out->typed_data();
  const int64_t p_stride = pd[0] == 1 ? 0 : K::N_P;
  Parallel<LoopBlock<K>>(pool, (n + W - 1) / W, n * num_ticks >= (int64_t{1} << 10), [&](LoopBlock<K>& B, int64_t b) {
    const int64_t v0 = b * W;
    const int count = static_cast<int>(std::min<int64_t>(W, n - v0));
    for (int j = 0; j < W; ++j) {  // spare lanes repeat v0: finite numbers, results discarded
      const int64_t v = v0 + (j < count ? j : 0);
      Gather(B.p, P + v * p_stride, K::N_P, j);
      Gather(B.x, X + v * K::N_X, K::N_X, j);
    }
    K::prologue(B.p, B.H);
    for (int64_t t = 0; t < num_ticks; ++t) {
      B.k[0] = V{} + static_cast<F>(t);  // whole numbers: exact below 2^24 (float32) ticks
      K::step(B.H, B.p, B.x, B.k);
    }
    for (int j = 0; j < count; ++j)
      for (int i = 0; i < K::N_X; ++i) Y[(v0 + j) * K::N_X + i] = B.x[i][j];
  });
  return ffi::Error::Success();
}

}  // namespace

#define QUADJAX_LOOP(NAME, K)                                                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Loop<K>),                                                       \
                                ffi::Ffi::Bind()                                                       \
                                    .Ctx<ffi::ThreadPool>()                                            \
                                    .Arg<QJ_BUF(K)>().Arg<QJ_BUF(K)>()                                 \
                                    .Ret<QJ_BUF(K)>()                                                  \
                                    .Attr<int64_t>("num_ticks"))
