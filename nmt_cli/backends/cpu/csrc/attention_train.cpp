// Training's attention on a CPU: scores, masks, softmax and the weighted sum of the
// values, and their gradients, one (sentence, head) at a time in float32.
//
// The core's reference (core/attention.py, `attention`) is PyTorch's operations: two
// batched products, a scaling, one masking per mask, a float32 softmax and the casts
// around it, and the copies that split and merge the heads, each a pass over memory;
// backward as many again. A sentence's scores are small (tens of keys), so on the
// Multi30k recipe's model those operations cost more than their arithmetic (BENCHMARKS.md
// has their share of a bf16 update). Here a task widens its sentence-head's queries, keys
// and values once into float32 rows that stay in cache, and does everything else there:
// products as dot products and row updates over d, the softmax with the decoding
// kernels' exponential, the context written straight into the merged-heads layout. The
// forward pass keeps the float32 weights for the backward pass (L x S per head, as the
// reference keeps its softmax). Sums run in another order, in float32 throughout, so
// results differ from the reference's bf16 products in the last bits.
#include "attention_train.h"
#include "cpu_level.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_width.h"
#endif

namespace nmt {
namespace {

// n rounded up to whole vectors of 16 floats.
inline int64_t padded(int64_t n) { return (n + 15) / 16 * 16; }

// A sentence's operands (every head's), float32, each row padded to whole vectors (dp,
// sp: d and S rounded up to 16): queries, keys, values, the context's gradient, a
// transposed (d x S) copy of the scaled keys or of the values, the weights or their
// gradient (when the caller keeps no weights), the products' outputs, and the keys a
// padding mask hides.
struct Scratch {
  int64_t dp, sp;
  std::vector<float> q, k, v, g, t, p, o, dk, dv;
  std::vector<int64_t> hidden;
  Scratch(int64_t H, int64_t L, int64_t S, int64_t d, bool backward)
      : dp(padded(d)),
        sp(padded(S)),
        q(static_cast<size_t>(H * L * dp)),
        k(static_cast<size_t>(H * S * dp)),
        v(static_cast<size_t>(H * S * dp)),
        g(static_cast<size_t>(backward ? H * L * dp : 0)),
        t(static_cast<size_t>(d * sp)),
        p(static_cast<size_t>(L * sp)),
        o(static_cast<size_t>(L * dp)),
        dk(static_cast<size_t>(backward ? S * dp : 0)),
        dv(static_cast<size_t>(backward ? S * dp : 0)) {}
};

// One strided (rows, d) operand of a (sentence, head): row r starts at data + r * stride.
template <typename T>
struct Rows {
  T* data;
  int64_t stride;
  T* operator[](int64_t r) const { return data + r * stride; }
};

// One sentence's (heads, rows, d) operand: row r of head h at data + h * head + r * row.
template <typename T>
struct Heads {
  T* data;
  int64_t head_stride, row_stride;
  T* operator()(int64_t h, int64_t r) const { return data + h * head_stride + r * row_stride; }
  Rows<T> head(int64_t h) const { return {data + h * head_stride, row_stride}; }
};

// Which of a left operand's columns can be nonzero in row m: m - below ... m + above (the
// causal weights P: above = S - L; read transposed: below = S - L). Products skip the rest.
struct Band {
  int64_t below, above;
  static constexpr int64_t kAll = int64_t{1} << 40;
  int64_t first(int64_t m, int64_t K) const { return std::clamp<int64_t>(m - below, 0, K); }
  int64_t end(int64_t m, int64_t K) const { return std::clamp<int64_t>(m + above + 1, 0, K); }
};
constexpr Band kFull{Band::kAll, Band::kAll};

// A float32 matrix read one element at a time: (m, k) at data[m * row + k * col], so a
// product's left operand can be read transposed without a copy.
struct Strided {
  const float* data;
  int64_t row, col;
  float operator()(int64_t m, int64_t k) const { return data[m * row + k * col]; }
};

// Any CPU: plain loops; bf16 through PyTorch's own conversions.
namespace plain {

struct Ops {
  static void widen(const float* x, float* out, int64_t n) { std::copy(x, x + n, out); }
  static void widen(const uint16_t* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<float>(c10::BFloat16(x[i], c10::BFloat16::from_bits()));
    }
  }
  static void narrow(const float* x, float* out, int64_t n) { std::copy(x, x + n, out); }
  static void narrow(const float* x, uint16_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = c10::BFloat16(x[i]).x;
  }
  static float dot(const float* a, const float* b, int64_t n) {
    float total = 0.0f;
    for (int64_t i = 0; i < n; ++i) total += a[i] * b[i];
    return total;
  }
  static void axpy(float alpha, const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }
  static void zero(float* y, int64_t n) { std::fill(y, y + n, 0.0f); }
  // scale * a (rows x cols, row stride lda) -> out (cols x rows, row stride ldo); written in
  // order (strided reads are cheaper than strided writes).
  static void transpose(const float* a, int64_t rows, int64_t cols, int64_t lda, float scale,
                        float* out, int64_t ldo) {
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) out[c * ldo + r] = scale * a[r * lda + c];
    }
  }
  // c (M x N, row stride ldc) = a (M x K, nonzero within `band`) b (K x N, row stride ldb).
  static void gemm(int64_t M, int64_t N, int64_t K, Strided a, const float* b, int64_t ldb,
                   float* c, int64_t ldc, Band band = kFull) {
    for (int64_t m = 0; m < M; ++m) {
      float* row = c + m * ldc;
      zero(row, N);
      const int64_t end = band.end(m, K);
      for (int64_t k = band.first(m, K); k < end; ++k) axpy(a(m, k), b + k * ldb, row, N);
    }
  }
  // In place; a row of -inf only (a query that may see no key) becomes zeros.
  static void softmax(float* x, int64_t n) {
    const float max = *std::max_element(x, x + n);
    if (max == -INFINITY) return zero(x, n);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - max));
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  }
};

#include "attention_train_body.h"

}  // namespace plain

#if defined(__x86_64__)
// Vector loops, written once over the lanes of simd_width.h: AVX-512 (sixteen lanes, the
// tail under a lane mask) and AVX2 + FMA (eight lanes, the tail by a lane count).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
namespace train_avx512 {
using V = simd::Lanes16;
#include "attention_train_lanes.h"
#include "attention_train_body.h"
}  // namespace train_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace train_avx2 {
using V = simd::Lanes8;
#include "attention_train_lanes.h"
#include "attention_train_body.h"
}  // namespace train_avx2
#pragma GCC pop_options
#endif

bool use_simd(bool wanted) { return wanted && attention_train_vectorized(); }

// Raw pointers of float32 (float) or bf16 (uint16_t) data.
template <typename T>
const T* cdata(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.const_data_ptr());
}
template <typename T>
T* mdata(at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

void check_operand(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 4 && t.stride(3) == 1,
              "attention_train: ", name,
              " must be a CPU (B, h, n, d) tensor with its last dimension contiguous");
  TORCH_CHECK(t.scalar_type() == dtype, "attention_train: ", name, " is ", t.scalar_type(),
              ", the queries ", dtype);
}

// An empty (B, n, h, d) tensor seen as (B, h, n, d): heads merge by a view.
at::Tensor merged_heads_like(const at::Tensor& t) {
  return at::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options())
      .permute({0, 2, 1, 3});
}

// Sentence b of a (B, h, n, d) operand.
template <typename T>
Heads<const T> heads_of(const at::Tensor& t, int64_t b) {
  return {cdata<T>(t) + b * t.stride(0), t.stride(1), t.stride(2)};
}
template <typename T>
Heads<T> heads_of(at::Tensor& t, int64_t b) {
  return {mdata<T>(t) + b * t.stride(0), t.stride(1), t.stride(2)};
}

// Asks for the next sentence's rows while this one computes: a projection's output is
// larger than the cache, and a head's rows are short runs a stride apart.
template <typename T>
void prefetch(Heads<const T> x, int64_t H, int64_t n, int64_t d) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < d; i += kLine) __builtin_prefetch(x(h, r) + i);
    }
  }
}

// Sentences over the threads, one task each (its rows of every head are read in one sweep
// through memory), each thread with its scratch; `ahead`'s rows of the next sentence are
// prefetched while one computes.
template <typename T, typename Run>
void each_sentence(std::initializer_list<const at::Tensor*> ahead, int64_t B, int64_t H,
                   int64_t L, int64_t S, int64_t d, bool backward, const Run& run) {
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    Scratch w(H, L, S, d, backward);
    for (int64_t b = begin; b < end; ++b) {
      for (const at::Tensor* t : ahead) {
        if (b + 1 < end) prefetch(heads_of<T>(*t, b + 1), H, t->size(2), d);
      }
      run(b, w);
    }
  });
}

// The body's instantiation for this CPU.
template <typename T>
auto forward_kernel(bool vector) {
#if defined(__x86_64__)
  if (vector) {
    return simd::by_level(&train_avx512::forward_sentence<T>, &train_avx2::forward_sentence<T>);
  }
#endif
  (void)vector;
  return &plain::forward_sentence<T>;
}

template <typename T>
auto backward_kernel(bool vector) {
#if defined(__x86_64__)
  if (vector) {
    return simd::by_level(&train_avx512::backward_sentence<T>, &train_avx2::backward_sentence<T>);
  }
#endif
  (void)vector;
  return &plain::backward_sentence<T>;
}

template <typename T>
void forward_all(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const float* bias, const bool* key_ok, bool causal, float scale,
                 at::Tensor& out, float* probs, bool simd) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), d = q.size(3);
  const auto kernel = forward_kernel<T>(simd);
  each_sentence<T>({&q, &k, &v}, B, H, L, S, d, false, [&](int64_t b, Scratch& w) {
    kernel(heads_of<T>(q, b), heads_of<T>(k, b), heads_of<T>(v, b), bias,
           key_ok == nullptr ? nullptr : key_ok + b * S, causal, H, L, S, d, scale,
           heads_of<T>(out, b), probs == nullptr ? nullptr : probs + b * H * L * w.sp, w);
  });
}

// `partial`: each sentence's sums of the biases' gradients (B x 3 x H x d, zeros), or null.
template <typename T>
void backward_all(const at::Tensor& g, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const float* bias, const float* probs, float scale,
                  bool causal, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, float* partial,
                  bool simd) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), d = q.size(3);
  const auto kernel = backward_kernel<T>(simd);
  each_sentence<T>({&g, &q, &k, &v}, B, H, L, S, d, true, [&](int64_t b, Scratch& w) {
    kernel(heads_of<T>(g, b), heads_of<T>(q, b), heads_of<T>(k, b), heads_of<T>(v, b), bias,
           probs + b * H * L * w.sp, H, L, S, d, scale, causal, heads_of<T>(dq, b),
           heads_of<T>(dk, b), heads_of<T>(dv, b),
           partial == nullptr ? nullptr : partial + b * 3 * H * d, w);
  });
}

// The biases of q, k and v: (3, h, d) float32, contiguous; null where there are none.
const float* bias_data(const std::optional<at::Tensor>& bias, int64_t H, int64_t d) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                  bias->sizes() == at::IntArrayRef({3, H, d}),
              "attention_train: the biases must be (3, ", H, ", ", d, ") float32, got ",
              bias->scalar_type(), " ", bias->sizes());
  return bias->const_data_ptr<float>();
}

}  // namespace

// Elsewhere than x86-64 the detected level is generic: never.
bool attention_train_vectorized() { return cpu_level_at_least(CpuLevel::kAvx2); }

std::tuple<at::Tensor, at::Tensor> attention_train_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& key_mask, bool causal, double scale, bool want_probs,
    bool simd, const std::optional<at::Tensor>& bias) {
  RECORD_FUNCTION("nmt::attention_train_forward", std::vector<c10::IValue>());
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "attention_train: float32 or bfloat16 queries are needed, got ", dtype);
  check_operand(q, "q", dtype);
  check_operand(k, "k", dtype);
  check_operand(v, "v", dtype);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), d = q.size(3);
  TORCH_CHECK(k.size(0) == B && k.size(1) == H && k.size(3) == d && v.sizes() == k.sizes(),
              "attention_train: q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(),
              " do not fit (the values' width must equal the keys')");
  const bool* key_ok = nullptr;
  at::Tensor mask;
  if (key_mask.has_value()) {
    TORCH_CHECK(key_mask->scalar_type() == at::kBool && key_mask->dim() == 2 &&
                    key_mask->size(0) == B && key_mask->size(1) == S,
                "attention_train: the key mask must be (B, S) bool, got ", key_mask->sizes());
    mask = key_mask->contiguous();
    key_ok = mask.const_data_ptr<bool>();
  }
  at::Tensor out = merged_heads_like(q);
  at::Tensor probs = want_probs ? at::empty({B, H, L, padded(S)}, q.options().dtype(at::kFloat))
                                : at::Tensor();
  float* p = want_probs ? probs.data_ptr<float>() : nullptr;
  const bool vector = use_simd(simd);
  const auto s = static_cast<float>(scale);
  const float* b = bias_data(bias, H, d);
  if (dtype == at::kFloat) {
    forward_all<float>(q, k, v, b, key_ok, causal, s, out, p, vector);
  } else {
    forward_all<uint16_t>(q, k, v, b, key_ok, causal, s, out, p, vector);
  }
  return {out, probs};
}

at::Tensor attention_train_backward_into(const at::Tensor& grad_out, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& probs, double scale, bool causal,
                                         bool simd, at::Tensor& dq, at::Tensor& dk,
                                         at::Tensor& dv, const std::optional<at::Tensor>& bias) {
  RECORD_FUNCTION("nmt::attention_train_backward", std::vector<c10::IValue>());
  const auto dtype = q.scalar_type();
  const at::Tensor g = grad_out.stride(3) == 1 ? grad_out : grad_out.contiguous();
  check_operand(g, "the context's gradient", dtype);
  TORCH_CHECK(g.sizes() == q.sizes(), "attention_train: the context's gradient is ",
              g.sizes(), ", the queries ", q.sizes());
  TORCH_CHECK(probs.scalar_type() == at::kFloat && probs.is_contiguous() &&
                  probs.dim() == 4 && probs.size(2) == q.size(2) &&
                  probs.size(3) == padded(k.size(2)),
              "attention_train: the weights must be the forward pass's (B, h, L, S) float32");
  const auto check_out = [&](const at::Tensor& out, const at::Tensor& in, const char* name) {
    check_operand(out, name, dtype);
    TORCH_CHECK(out.sizes() == in.sizes(), "attention_train: ", name, " is ", out.sizes(),
                ", its input ", in.sizes());
  };
  check_out(dq, q, "dq");
  check_out(dk, k, "dk");
  check_out(dv, v, "dv");
  const bool vector = use_simd(simd);
  const auto s = static_cast<float>(scale);
  const float* p = probs.const_data_ptr<float>();
  const int64_t B = q.size(0), H = q.size(1), d = q.size(3);
  const float* b = bias_data(bias, H, d);
  std::vector<float> partial(b == nullptr ? 0 : static_cast<size_t>(B * 3 * H * d), 0.0f);
  float* sums = b == nullptr ? nullptr : partial.data();
  if (dtype == at::kFloat) {
    backward_all<float>(g, q, k, v, b, p, s, causal, dq, dk, dv, sums, vector);
  } else {
    backward_all<uint16_t>(g, q, k, v, b, p, s, causal, dq, dk, dv, sums, vector);
  }
  if (b == nullptr) return at::Tensor();
  // The sentences' sums in their order: the same whatever the threads.
  at::Tensor bias_grad = at::zeros({3, H, d}, q.options().dtype(at::kFloat));
  float* total = bias_grad.data_ptr<float>();
  for (int64_t sentence = 0; sentence < B; ++sentence) {
    const float* one = partial.data() + sentence * 3 * H * d;
    for (int64_t i = 0; i < 3 * H * d; ++i) total[i] += one[i];
  }
  return bias_grad;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_train_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& probs, double scale, bool causal, bool simd,
    const std::optional<at::Tensor>& bias) {
  at::Tensor dq = merged_heads_like(q), dk = merged_heads_like(k), dv = merged_heads_like(v);
  at::Tensor bias_grad = attention_train_backward_into(grad_out, q, k, v, probs, scale, causal,
                                                       simd, dq, dk, dv, bias);
  return {dq, dk, dv, bias_grad};
}

}  // namespace nmt
