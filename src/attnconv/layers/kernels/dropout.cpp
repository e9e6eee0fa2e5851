// Dropout with the counter-hash mask of functional.dropped_elements (CPU): element i of the
// contiguous tensor (row-major), counter n = offset + i, is dropped when row_key(n, seed) <
// threshold, the kept ones scaled by 1 / (1 - p) in the opmath type (float for bfloat16 and
// float16), one pass, no mask stored: backward is the same call on the gradient with the same
// seed. The plain equations: dropout.py's hash_dropout_reference.
#include <ATen/ATen.h>

#include "hash.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task

// bfloat16 <-> float by bits (c10's round to nearest even, NaN to 0x7fc0), so that the loop
// vectorizes; c10::BFloat16's own conversions keep it scalar (far slower: docs/benchmarks.md,
// "Figures behind the code's comments").
inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return f != f ? uint16_t(0x7fc0) : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// y[i] = x[i] * M / (1 - p) for i in [lo, hi), counter n = offset + i.
template <typename scalar_t>
void drop_range(const scalar_t* x, scalar_t* y, int64_t lo, int64_t hi, int64_t offset,
                uint32_t seed, uint32_t threshold, at::opmath_type<scalar_t> keep) {
  using acc_t = at::opmath_type<scalar_t>;
  using bits_t = std::conditional_t<std::is_same_v<scalar_t, at::BFloat16>, uint16_t, scalar_t>;
  while (lo < hi) {  // runs of constant n >> 32, so that the inner loop counts in uint32 (SIMD)
    const uint64_t n0 = static_cast<uint64_t>(offset + lo);
    const uint64_t run_end = ((n0 >> 32) + 1) << 32;  // the next multiple of 2^32
    const int64_t m = std::min<int64_t>(hi - lo, static_cast<int64_t>(run_end - n0));
    const uint32_t top = static_cast<uint32_t>(n0 >> 32), base = static_cast<uint32_t>(n0);
    const auto* xs = reinterpret_cast<const bits_t*>(x + lo);
    auto* ys = reinterpret_cast<bits_t*>(y + lo);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t u = attnconv::h32(attnconv::h32((base + static_cast<uint32_t>(i)) ^ seed) ^ top);
      const acc_t f = u >= threshold ? keep : acc_t(0);
      if constexpr (std::is_same_v<bits_t, uint16_t>) {
        ys[i] = float_to_bf16(bf16_to_float(xs[i]) * f);
      } else {
        ys[i] = static_cast<scalar_t>(static_cast<acc_t>(xs[i]) * f);
      }
    }
    lo += m;
  }
}

}  // namespace

at::Tensor hash_dropout(const at::Tensor& x, double p, int64_t seed, int64_t threshold,
                        int64_t offset) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous(), "hash_dropout: a contiguous CPU tensor");
  TORCH_CHECK(p >= 0.0 && p < 1.0, "hash_dropout: p must be in [0, 1), got ", p);
  TORCH_CHECK(offset >= 0, "hash_dropout: offset must be >= 0, got ", offset);
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "hash_dropout", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t keep = static_cast<acc_t>(1.0 / (1.0 - p));
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
      drop_range(xp, yp, lo, hi, offset, static_cast<uint32_t>(seed),
                 static_cast<uint32_t>(threshold), keep);
    });
  });
  return y;
}
