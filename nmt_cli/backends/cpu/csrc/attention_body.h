// The body of the decoder step's one-query attention (attention.cpp), written once over
// the lanes `V` (simd_width.h): attention.cpp includes it twice, inside a namespace
// compiled for AVX-512 with V = Lanes16 and inside one compiled for AVX2 + FMA with
// V = Lanes8, so that every call inlines at its width. No include guard and no includes:
// it is meant to be included inside a namespace, after attention.cpp's `Shape`,
// `PrefixRows` and `MemoryRows`, with `V` declared.

using Vec = V::Vec;
using Mask = V::Mask;
constexpr int64_t kWidth = V::kWidth;
constexpr int64_t kGroup = 8;  // heads whose scores one 256-bit register holds

// `n` values from `from` (Q) to `to` (KV), rounded as PyTorch's copy_ rounds.
template <typename Q, typename KV>
void convert(const Q* from, KV* to, int64_t n) {
  for (int64_t i = 0; i < n; i += kWidth) {
    const Mask m = V::first(n - i);
    V::store(to + i, V::load(from + i, m), m);
  }
}

// One row, `heads` rounded up to whole groups of eight in the (length, groups * 8)
// score table; a step's scores of all heads come out of one pass over its key row. A
// head's d_k and d_v columns are C vectors (the last ones masked), C a constant so that
// the accumulators can stay in registers. `Whole`: d_k and d_v fill all C vectors, so
// every mask is the whole vector, known when compiling; otherwise each load tests its
// lane count (a compare and a branch beside each multiply-add).
template <int C, bool Whole, typename Q, typename KV, typename Rows>
void attend_row(int64_t r, const Q* q, const KV* keys, const KV* values, const Rows& rows,
                const Shape& sh, float* scores, int64_t* at, Q* out, float* weights) {
  const int64_t h = sh.heads, dk = sh.d_k, dv = sh.d_v, n = sh.length;
  const int64_t groups = (h + kGroup - 1) / kGroup, width = groups * kGroup;
  Mask mk[C], mv[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    mk[c] = V::first(Whole ? kWidth : dk - kWidth * c);
    mv[c] = V::first(Whole ? kWidth : dv - kWidth * c);
  }
  const Q* qr = q + r * sh.q_stride;
  const float* bias = rows.bias(r);
  if constexpr (std::is_same_v<Rows, PrefixRows>) {
    const int64_t at_last = rows(r, n - 1);
    KV* k = const_cast<KV*>(keys) + at_last * h * dk;  // the buffers the caller gave to fill
    KV* v = const_cast<KV*>(values) + at_last * h * dv;
    convert(static_cast<const Q*>(rows.k_new) + r * rows.k_stride, k, h * dk);
    convert(static_cast<const Q*>(rows.v_new) + r * rows.v_stride, v, h * dv);
  }
  for (int64_t s = 0; s < n; ++s) at[s] = rows(r, s);
  const __m256 scale = _mm256_set1_ps(sh.scale);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t in_group = std::min<int64_t>(kGroup, h - g * kGroup);
    Vec qv[kGroup][C];
#pragma GCC unroll 8
    for (int j = 0; j < kGroup; ++j) {
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        qv[j][c] = j < in_group ? V::load(qr + (g * kGroup + j) * dk + kWidth * c, mk[c])
                                : V::zero();
      }
    }
    for (int64_t s = 0; s < n; ++s) {
      const KV* k = keys + at[s] * h * dk + g * kGroup * dk;
      Vec acc[kGroup];
#pragma GCC unroll 8
      for (int j = 0; j < kGroup; ++j) {
        acc[j] = V::zero();
        if (j >= in_group) continue;
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
          acc[j] = V::fmadd(qv[j][c], V::load(k + j * dk + kWidth * c, mk[c]), acc[j]);
        }
      }
      const __m256 b = _mm256_set1_ps(bias == nullptr ? 0.0f : bias[s]);
      _mm256_storeu_ps(scores + s * width + g * kGroup,
                       _mm256_fmadd_ps(V::sum8(acc), scale, b));
    }
  }
  // Softmax down each head's column, eight heads a register; left unnormalised here
  // (the context is divided by the sum once).
  float inverse[kGroup * 16];
  std::vector<float> many;
  float* inv = inverse;
  if (width > kGroup * 16) {
    many.resize(width);
    inv = many.data();
  }
  for (int64_t g = 0; g < groups; ++g) {
    float* x = scores + g * kGroup;
    __m256 vmax = _mm256_set1_ps(-INFINITY), vsum = _mm256_setzero_ps();
    for (int64_t s = 0; s < n; ++s) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + s * width));
    for (int64_t s = 0; s < n; ++s) {
      const __m256 e = simd::exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + s * width), vmax));
      _mm256_storeu_ps(x + s * width, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    _mm256_storeu_ps(inv + g * kGroup, _mm256_div_ps(_mm256_set1_ps(1.0f), vsum));
  }
  // Each head's context: the weighted sum of its values.
  for (int64_t head = 0; head < h; ++head) {
    Vec acc[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[c] = V::zero();
    for (int64_t s = 0; s < n; ++s) {
      const Vec p = V::set1(scores[s * width + head]);
      const KV* v = values + at[s] * h * dv + head * dv;
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[c] = V::fmadd(p, V::load(v + kWidth * c, mv[c]), acc[c]);
    }
    const Vec norm = V::set1(inv[head]);
    Q* o = out + r * h * dv + head * dv;
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      if (Whole || kWidth * c < dv) V::store(o + kWidth * c, V::mul(acc[c], norm), mv[c]);
    }
    if (weights != nullptr) {
      float* w = weights + (r * h + head) * n;
      for (int64_t s = 0; s < n; ++s) w[s] = scores[s * width + head] * inv[head];
    }
  }
}

template <int C, bool Whole, typename Q, typename KV, typename Rows>
void attend_rows(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                 const Rows& rows, const Shape& sh, at::Tensor& out, float* weights) {
  const int64_t count = q.size(0);
  const Q* qd = reinterpret_cast<const Q*>(q.const_data_ptr());
  const KV* kd = reinterpret_cast<const KV*>(keys.const_data_ptr());
  const KV* vd = reinterpret_cast<const KV*>(values.const_data_ptr());
  Q* od = reinterpret_cast<Q*>(out.data_ptr());
  // A share of the rows is at least ~64k multiply-adds: one sentence stays on one thread.
  const int64_t work = std::max<int64_t>(1, sh.length * sh.heads * (sh.d_k + sh.d_v));
  const int64_t grain = std::max<int64_t>(1, 65536 / work);
  const int64_t width = (sh.heads + kGroup - 1) / kGroup * kGroup;
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(sh.length * width);
    std::vector<int64_t> at(sh.length);
    for (int64_t r = begin; r < end; ++r) {
      attend_row<C, Whole>(r, qd, kd, vd, rows, sh, scores.data(), at.data(), od, weights);
    }
  });
}

// Whole vectors where d_k and d_v fill all C (the usual 64 or 128), masked ones else.
template <int C, typename Q, typename KV, typename Rows>
void attend_rows_of(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                    const Rows& rows, const Shape& sh, at::Tensor& out, float* weights) {
  if (sh.d_k == C * kWidth && sh.d_v == C * kWidth) {
    attend_rows<C, true, Q, KV>(q, keys, values, rows, sh, out, weights);
  } else {
    attend_rows<C, false, Q, KV>(q, keys, values, rows, sh, out, weights);
  }
}

// The vector count C for a head's columns: the fewest of 1, 2, 4, 8 and 16 that hold
// d_k and d_v (up to 128).
template <typename Q, typename KV, typename Rows>
void dispatch_width(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                    const Rows& rows, const Shape& sh, at::Tensor& out, float* weights) {
  const int64_t d = std::max(sh.d_k, sh.d_v);
  TORCH_CHECK(d <= 128, "attention kernel: head dimensions up to 128");
  if (d <= kWidth) {
    attend_rows_of<1, Q, KV>(q, keys, values, rows, sh, out, weights);
  } else if (d <= 2 * kWidth) {
    attend_rows_of<2, Q, KV>(q, keys, values, rows, sh, out, weights);
  } else if (d <= 4 * kWidth) {
    attend_rows_of<4, Q, KV>(q, keys, values, rows, sh, out, weights);
  } else if (d <= 8 * kWidth) {
    attend_rows_of<8, Q, KV>(q, keys, values, rows, sh, out, weights);
  } else if constexpr (8 * kWidth < 128) {
    attend_rows_of<16, Q, KV>(q, keys, values, rows, sh, out, weights);
  }
}
