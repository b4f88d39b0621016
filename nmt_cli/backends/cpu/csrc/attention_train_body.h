// The body of training's attention, one sentence (all its heads) at a time, written once
// over the operations of `Ops` (attention_train.cpp includes it three times: inside a
// namespace whose `Ops` is plain loops, and inside one compiled for AVX-512 and one for
// AVX2 + FMA whose `Ops` are attention_train_lanes.h's, so every call inlines).
// No include guard and no includes: it is meant to be included inside a namespace, after
// attention_train.cpp's `Scratch`, `Rows`, `Heads`, `Strided` and `Band`.

// A sentence's rows of every head, position by position (one sweep through memory) ->
// out: row r of head h at out + h * n * ldo + r * ldo, plus head h's bias (d floats at
// bias + h * d) where there is one: the projection's, which its product left out.
template <typename T>
void widen_heads(Heads<const T> x, int64_t heads, int64_t n, int64_t d, float* out,
                 int64_t ldo, const float* bias) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      float* row = out + (h * n + r) * ldo;
      Ops::widen(x(h, r), row, d);
      if (bias != nullptr) Ops::axpy(1.0f, bias + h * d, row, d);
    }
  }
}

// sums (d floats) += each of n rows (row stride ld): a bias's gradient.
inline void add_rows(const float* rows, int64_t n, int64_t ld, int64_t d, float* sums) {
  for (int64_t r = 0; r < n; ++r) Ops::axpy(1.0f, rows + r * ld, sums, d);
}

template <typename T>
void narrow_rows(const float* x, int64_t ldx, int64_t n, int64_t d, Rows<T> out) {
  for (int64_t r = 0; r < n; ++r) Ops::narrow(x + r * ldx, out[r], d);
}

// Scaled scores (L x S, row stride ldp, in `probs`) -> the weights: the keys in `hidden`
// and a causal query's future masked (-inf), softmax per row.
inline void weights(float* probs, int64_t ldp, const std::vector<int64_t>& hidden, bool causal,
                    int64_t L, int64_t S) {
  for (int64_t i = 0; i < L; ++i) {
    float* p = probs + i * ldp;
    for (const int64_t j : hidden) p[j] = -INFINITY;
    // Keys from `visible` on are the future of a causal query.
    const int64_t visible = causal ? std::clamp<int64_t>(i + S - L + 1, 0, S) : S;
    std::fill(p + visible, p + S, -INFINITY);
    Ops::softmax(p, S);
  }
}

// The biases of q, k and v (3 x H x d, or null): part `i`'s.
inline const float* part(const float* bias, int64_t i, int64_t H, int64_t d) {
  return bias == nullptr ? nullptr : bias + i * H * d;
}

// One sentence, every head: the context into `out`, the weights into `probs` (heads x L x
// sp, or null); q, k and v plus their projections' biases (3 x H x d) where given.
template <typename T>
void forward_sentence(Heads<const T> q, Heads<const T> k, Heads<const T> v, const float* bias,
                      const bool* key_ok, bool causal, int64_t H, int64_t L, int64_t S,
                      int64_t d, float scale, Heads<T> out, float* probs, Scratch& w) {
  const int64_t dp = w.dp, sp = w.sp;
  widen_heads(q, H, L, d, w.q.data(), dp, part(bias, 0, H, d));
  widen_heads(k, H, S, d, w.k.data(), dp, part(bias, 1, H, d));
  widen_heads(v, H, S, d, w.v.data(), dp, part(bias, 2, H, d));
  w.hidden.clear();  // the keys the padding mask hides, the same for every head
  for (int64_t j = 0; key_ok != nullptr && j < S; ++j) {
    if (!key_ok[j]) w.hidden.push_back(j);
  }
  // Causal weights are 0 past the diagonal (i + S - L): the products skip those keys.
  const Band band = causal ? Band{Band::kAll, S - L} : kFull;
  for (int64_t h = 0; h < H; ++h) {
    const float *qh = w.q.data() + h * L * dp, *kh = w.k.data() + h * S * dp;
    Ops::transpose(kh, S, d, dp, scale, w.t.data(), sp);
    float* p = probs == nullptr ? w.p.data() : probs + h * L * sp;
    Ops::gemm(L, S, d, {qh, dp, 1}, w.t.data(), sp, p, sp);  // Q (scale K)^T
    weights(p, sp, w.hidden, causal, L, S);
    Ops::gemm(L, d, S, {p, sp, 1}, w.v.data() + h * S * dp, dp, w.o.data(), dp, band);  // P V
    narrow_rows(w.o.data(), dp, L, d, out.head(h));
  }
}

// With P the weights and G the context's gradient: dV = P^T G, dP = G V^T,
// dS = scale P * (dP - rowsum(P * dP)), dQ = dS K, dK = dS^T Q. With the biases of
// forward, their gradients' sums over this sentence's rows (float32, before dq, dk and dv
// are rounded to T) are added to bias_grad (3 x H x d).
template <typename T>
void backward_sentence(Heads<const T> g, Heads<const T> q, Heads<const T> k, Heads<const T> v,
                       const float* bias, const float* probs, int64_t H, int64_t L, int64_t S,
                       int64_t d, float scale, bool causal, Heads<T> dq, Heads<T> dk,
                       Heads<T> dv, float* bias_grad, Scratch& w) {
  const int64_t dp = w.dp, sp = w.sp;
  // As forward: products over causal weights (or their gradient) skip the future's zeros.
  const Band band = causal ? Band{Band::kAll, S - L} : kFull;
  const Band transposed{band.above, band.below};
  widen_heads(g, H, L, d, w.g.data(), dp, nullptr);
  widen_heads(q, H, L, d, w.q.data(), dp, part(bias, 0, H, d));
  widen_heads(k, H, S, d, w.k.data(), dp, part(bias, 1, H, d));
  widen_heads(v, H, S, d, w.v.data(), dp, part(bias, 2, H, d));
  for (int64_t h = 0; h < H; ++h) {
    const float *gh = w.g.data() + h * L * dp, *qh = w.q.data() + h * L * dp;
    const float *kh = w.k.data() + h * S * dp, *vh = w.v.data() + h * S * dp;
    const float* ph = probs + h * L * sp;
    Ops::transpose(vh, S, d, dp, 1.0f, w.t.data(), sp);
    Ops::gemm(S, d, L, {ph, 1, sp}, gh, dp, w.dv.data(), dp, transposed);  // P^T G
    float* ds = w.p.data();
    Ops::gemm(L, S, d, {gh, dp, 1}, w.t.data(), sp, ds, sp);  // G V^T
    for (int64_t i = 0; i < L; ++i) {
      const float* p = ph + i * sp;
      float* row = ds + i * sp;
      const float mean = Ops::dot(p, row, S);
      for (int64_t j = 0; j < S; ++j) row[j] = scale * p[j] * (row[j] - mean);
    }
    Ops::gemm(L, d, S, {ds, sp, 1}, kh, dp, w.o.data(), dp, band);  // dS K
    Ops::gemm(S, d, L, {ds, 1, sp}, qh, dp, w.dk.data(), dp, transposed);  // dS^T Q
    narrow_rows(w.o.data(), dp, L, d, dq.head(h));
    narrow_rows(w.dk.data(), dp, S, d, dk.head(h));
    narrow_rows(w.dv.data(), dp, S, d, dv.head(h));
    if (bias_grad != nullptr) {
      add_rows(w.o.data(), L, dp, d, bias_grad + h * d);
      add_rows(w.dk.data(), S, dp, d, bias_grad + (H + h) * d);
      add_rows(w.dv.data(), S, dp, d, bias_grad + (2 * H + h) * d);
    }
  }
}
