// Content attention with row/column positional logits and attention dropout, fused per head
// (CPU): the C++ twin of blocked.py's query-blocked kernel, with the dropout mask drawn in the
// kernel from functional.dropped_links' counter hash instead of read from a (B, Nh, T, T) tensor.
//
//   y = (softmax_k(scale q.k + R[q, k1] + C[q, k2]) * M / (1 - p)) v     (Cordonnier et al.
//                                                                          eq. 1-2, 9; sec. 4.3)
//
// One task per (image, head), split over the cores (parallel.h); a task walks query
// blocks whose (Bq, T) logits stay in the core's L2, so the elementwise passes (bias, max, exp,
// mask) run from cache, the products are BLAS calls on strided views (no layout copies).
// Backward recomputes the probabilities from the saved row max and 1 / sum (flash-attention
// style) and redraws the same mask: nothing (T, T) is kept between forward and backward.
// Under bf16 autocast q, k, v come in bfloat16: the five products take bfloat16 operands
// (oneDNN's bf16 GEMM, float32 sums, each product rounded once to bfloat16, as the plain autocast
// path rounds it), while the logits, softmax, mask, dS and every accumulator stay float32.
#include <ATen/ATen.h>

#include "hash.h"

#include "parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kBlockElems = 1 << 16;  // logits per block: 256 KiB of float32
constexpr double kFloor = -60.0;          // blocked.py's _FLOOR: no subnormal probabilities

using attnconv::h32;
using attnconv::row_key;

struct Geometry {
  int64_t b, nh, t, h, w, dk, dv;
  double scale, p;
  uint32_t seed, threshold;
  bool per_image;
  int64_t block() const { return std::max<int64_t>(1, std::min(t, kBlockElems / t)); }
  uint64_t row(int64_t bi, int64_t hi, int64_t i) const {
    return static_cast<uint64_t>(((per_image ? bi * nh : 0) + hi) * t + i);
  }
};

// s (n, T) = scale s + R[i, k1] + C[i, k2], then minus the row max, clamped (float32), exp;
// with stats: writes each row's max and 1 / sum (forward), without: subtracts the saved max and
// multiplies by the saved 1 / sum (backward's recompute).
template <typename scalar_t>
void probabilities(scalar_t* s, const scalar_t* qa, at::Tensor block, int64_t n,
                   const Geometry& g, scalar_t* mx, scalar_t* inv, bool stats) {
  const int64_t t = g.t, h = g.h, w = g.w;
  const scalar_t scale = static_cast<scalar_t>(g.scale);
  const bool clamp = std::is_same<scalar_t, float>::value;
  for (int64_t i = 0; i < n; ++i) {
    scalar_t* si = s + i * t;
    const scalar_t* ri = qa + i * (h + w);
    scalar_t m = -std::numeric_limits<scalar_t>::infinity();
    for (int64_t r = 0; r < h; ++r) {
      scalar_t* sr = si + r * w;
      const scalar_t base = ri[r];
#pragma omp simd reduction(max : m)
      for (int64_t c = 0; c < w; ++c) {
        const scalar_t v = sr[c] * scale + (base + ri[h + c]);  // the plain bias, then added
        sr[c] = v;
        m = v > m ? v : m;
      }
    }
    if (stats) mx[i] = m; else m = mx[i];
    for (int64_t j = 0; j < t; ++j) {
      scalar_t v = si[j] - m;
      if (clamp) v = std::max(v, static_cast<scalar_t>(kFloor));
      si[j] = v;
    }
  }
  block.exp_();
  for (int64_t i = 0; i < n; ++i) {
    scalar_t* si = s + i * t;
    if (stats) {
      double sum = 0;  // in double: float32 rows of 1e3+ terms would round the normalizer
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < t; ++j) sum += si[j];
      inv[i] = static_cast<scalar_t>(1.0 / sum);
    }
    const scalar_t f = inv[i];
    for (int64_t j = 0; j < t; ++j) si[j] *= f;
  }
}

// p (n, T) *= M / (1 - p) in place for rows i0.. of task (bi, hi); also d (when given) the same.
template <typename scalar_t>
void drop(scalar_t* p, scalar_t* d, int64_t n, int64_t i0, int64_t bi, int64_t hi,
          const Geometry& g) {
  const scalar_t keep = static_cast<scalar_t>(1.0 / (1.0 - g.p));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = row_key(g.row(bi, hi, i0 + i), g.seed);
    scalar_t* pi = p + i * g.t;
    scalar_t* di = d ? d + i * g.t : nullptr;
    for (int64_t j = 0; j < g.t; ++j) {
      const scalar_t f = h32(key ^ static_cast<uint32_t>(j)) >= g.threshold ? keep : scalar_t(0);
      pi[j] *= f;
      if (di) di[j] *= f;
    }
  }
}

Geometry geometry(const at::Tensor& q, const at::Tensor& v, int64_t h, int64_t w, double scale,
                  double p, int64_t seed, int64_t threshold, bool per_image) {
  return Geometry{q.size(0), q.size(1), q.size(2), h, w, q.size(3), v.size(3), scale, p,
                  static_cast<uint32_t>(seed), static_cast<uint32_t>(threshold), per_image};
}

// out = a @ b (float32/float64). Operands in out's dtype: one BLAS call into out. bfloat16
// operands: the product into ``lo`` (bfloat16, out's shape), then widened into out.
void mm_to(at::Tensor out, const at::Tensor& a, const at::Tensor& b, at::Tensor lo) {
  if (a.scalar_type() == out.scalar_type()) {
    at::mm_out(out, a, b);
  } else {
    at::mm_out(lo, a, b);
    out.copy_(lo);
  }
}

// out = a @ b (first) or out += a @ b, as mm_to: the float32 sum over query blocks is out's.
void mm_acc(at::Tensor out, const at::Tensor& a, const at::Tensor& b, at::Tensor lo, bool first) {
  if (a.scalar_type() == out.scalar_type()) {
    out.addmm_(a, b, first ? 0.0 : 1.0);  // the first block overwrites
  } else {
    at::mm_out(lo, a, b);
    if (first) out.copy_(lo); else out.add_(lo);
  }
}

// An operand of a product: ``x`` itself, or (bfloat16 kernels) x rounded into ``lo``.
at::Tensor operand(const at::Tensor& x, at::Tensor lo) {
  if (!lo.defined()) return x;
  lo.copy_(x);
  return lo;
}

void check_dtypes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& qa) {
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "q, k and v must share a dtype");
  TORCH_CHECK(qa.scalar_type() == q.scalar_type() ||
                  (q.scalar_type() == at::kBFloat16 && qa.scalar_type() == at::kFloat),
              "qa must be q's dtype, or float32 with bfloat16 q, k, v");
}

}  // namespace

// q, k (B, Nh, T, dk), v (B, Nh, T, dv) (any strides), qa (B, Nh, T, H + W) contiguous ->
// y (B, T, Nh, dv), row max and 1 / sum (B, Nh, T), all in qa's dtype (q, k, v may be
// bfloat16 with float32 qa: the products' operands).
std::vector<at::Tensor> forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor qa,
                                int64_t h, int64_t w, double scale, double p, int64_t seed,
                                int64_t threshold, bool per_image) {
  TORCH_CHECK(qa.is_contiguous(), "qa must be contiguous");
  check_dtypes(q, k, v, qa);
  const Geometry g = geometry(q, v, h, w, scale, p, seed, threshold, per_image);
  TORCH_CHECK(g.t == h * w && qa.size(3) == h + w, "q, qa and the grid disagree");
  const bool low = q.scalar_type() != qa.scalar_type();
  auto y = at::empty({g.b, g.t, g.nh, g.dv}, qa.options());
  auto mx = at::empty({g.b, g.nh, g.t}, qa.options());
  auto inv = at::empty({g.b, g.nh, g.t}, qa.options());
  AT_DISPATCH_FLOATING_TYPES(qa.scalar_type(), "fused_axis_forward", [&] {
    parallel_tasks(0, g.b * g.nh, 1, [&](int64_t lo, int64_t hi_end) {
      const int64_t bq = g.block();
      auto buf = at::empty({bq, g.t}, qa.options());
      at::Tensor s_lo, y_lo;  // bfloat16 kernels: the products' bfloat16 sides
      if (low) {
        s_lo = at::empty({bq, g.t}, q.options());
        y_lo = at::empty({bq, g.dv}, q.options());
      }
      for (int64_t task = lo; task < hi_end; ++task) {
        const int64_t bi = task / g.nh, hi = task % g.nh;
        auto qh = q[bi][hi], kt = k[bi][hi].t(), vh = v[bi][hi], yh = y[bi].select(1, hi);
        const scalar_t* qah = qa[bi][hi].data_ptr<scalar_t>();
        scalar_t* mxh = mx[bi][hi].data_ptr<scalar_t>();
        scalar_t* invh = inv[bi][hi].data_ptr<scalar_t>();
        for (int64_t i0 = 0; i0 < g.t; i0 += bq) {
          const int64_t n = std::min(bq, g.t - i0);
          auto s = buf.narrow(0, 0, n);
          auto slo = low ? s_lo.narrow(0, 0, n) : at::Tensor();
          mm_to(s, qh.narrow(0, i0, n), kt, slo);
          scalar_t* sp = s.data_ptr<scalar_t>();
          probabilities<scalar_t>(sp, qah + i0 * (h + w), s, n, g, mxh + i0, invh + i0, true);
          if (g.p > 0) drop<scalar_t>(sp, static_cast<scalar_t*>(nullptr), n, i0, bi, hi, g);
          auto yb = yh.narrow(0, i0, n);
          mm_to(yb, operand(s, slo), vh, low ? y_lo.narrow(0, 0, n) : at::Tensor());
        }
      }
    });
  });
  return {y, mx, inv};
}

// Gradients of ``forward`` from dy (B, T, Nh, dv) and its row statistics:
// dq, dk (B, Nh, T, dk), dv (B, Nh, T, dv) per head, dqa (B, Nh, T, H + W), in qa's dtype
// (dy in q's: with bfloat16 q, k, v an operand of the products, as they are).
std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor q, at::Tensor k, at::Tensor v,
                                 at::Tensor qa, at::Tensor mx, at::Tensor inv,
                                 int64_t h, int64_t w, double scale, double p, int64_t seed,
                                 int64_t threshold, bool per_image) {
  check_dtypes(q, k, v, qa);
  TORCH_CHECK(dy.scalar_type() == q.scalar_type(), "dy must be q's dtype");
  const Geometry g = geometry(q, v, h, w, scale, p, seed, threshold, per_image);
  const bool low = q.scalar_type() != qa.scalar_type();
  auto dq = at::empty({g.b, g.t, g.nh, g.dk}, qa.options()).transpose(1, 2);
  // dK, dV accumulate over query blocks; each head's (T, d) stored column-major (a transposed
  // view), the layout the BLAS sums that product into fastest (measured: docs/benchmarks.md)
  auto dk = at::empty({g.b, g.nh, g.dk, g.t}, qa.options()).transpose(2, 3);
  auto dv = at::empty({g.b, g.nh, g.dv, g.t}, qa.options()).transpose(2, 3);
  auto dqa = at::zeros({g.b, g.nh, g.t, h + w}, qa.options());
  AT_DISPATCH_FLOATING_TYPES(qa.scalar_type(), "fused_axis_backward", [&] {
    parallel_tasks(0, g.b * g.nh, 1, [&](int64_t lo, int64_t hi_end) {
      const int64_t bq = g.block();
      auto bufs = at::empty({3, bq, g.t}, qa.options());
      at::Tensor p_lo, dq_lo, dk_lo, dv_lo;  // bfloat16 kernels: the products' bfloat16 sides
      if (low) {
        p_lo = at::empty({bq, g.t}, q.options());
        dq_lo = at::empty({bq, g.dk}, q.options());
        dk_lo = at::empty({g.dk, g.t}, q.options()).t();  // dk's and dv's layout
        dv_lo = at::empty({g.dv, g.t}, q.options()).t();
      }
      for (int64_t task = lo; task < hi_end; ++task) {
        const int64_t bi = task / g.nh, hi = task % g.nh;
        auto qh = q[bi][hi], kh = k[bi][hi], vh = v[bi][hi], dyh = dy[bi].select(1, hi);
        auto dqh = dq[bi][hi], dkh = dk[bi][hi], dvh = dv[bi][hi];
        const scalar_t* qah = qa[bi][hi].data_ptr<scalar_t>();
        scalar_t* dqah = dqa[bi][hi].data_ptr<scalar_t>();
        scalar_t* mxh = mx[bi][hi].data_ptr<scalar_t>();
        scalar_t* invh = inv[bi][hi].data_ptr<scalar_t>();
        for (int64_t i0 = 0; i0 < g.t; i0 += bq) {
          const int64_t n = std::min(bq, g.t - i0);
          auto s = bufs[0].narrow(0, 0, n), dp = bufs[1].narrow(0, 0, n);
          auto pd = bufs[2].narrow(0, 0, n);
          auto qb = qh.narrow(0, i0, n), dyb = dyh.narrow(0, i0, n);
          auto plo = low ? p_lo.narrow(0, 0, n) : at::Tensor();
          mm_to(s, qb, kh.t(), plo);
          scalar_t* sp = s.data_ptr<scalar_t>();
          probabilities<scalar_t>(sp, qah + i0 * (h + w), s, n, g, mxh + i0, invh + i0, false);
          mm_to(dp, dyb, vh.t(), plo);  // dL/d(P M / (1 - p))
          at::Tensor kept = s;
          if (g.p > 0) {
            pd.copy_(s);
            drop<scalar_t>(pd.data_ptr<scalar_t>(), dp.data_ptr<scalar_t>(), n, i0, bi, hi, g);
            kept = pd;
          }
          mm_acc(dvh, operand(kept, plo).t(), dyb, dv_lo, i0 == 0);
          scalar_t* dpp = dp.data_ptr<scalar_t>();
          const scalar_t sc = static_cast<scalar_t>(scale);
          for (int64_t i = 0; i < n; ++i) {  // dS = P o (dP - delta): R and C gradients from
            scalar_t* si = sp + i * g.t;      // dS, q and k gradients from scale dS (kept in s)
            const scalar_t* di = dpp + i * g.t;
            scalar_t* ga = dqah + (i0 + i) * (h + w);
            // delta = sum_j P dP from this row's own P and dP (as blocked.py and the dense
            // softmax backward do), not rowsum(dO o O): the rounding of O would not cancel
            double dsum = 0;
            _Pragma("omp simd reduction(+ : dsum)")
            for (int64_t j = 0; j < g.t; ++j) dsum += static_cast<double>(si[j]) * di[j];
            const scalar_t d0 = static_cast<scalar_t>(dsum);
            for (int64_t r = 0; r < h; ++r) {
              double acc = 0;
              _Pragma("omp simd reduction(+ : acc)")
              for (int64_t c = 0; c < w; ++c) {
                const scalar_t v = si[r * w + c] * (di[r * w + c] - d0);
                si[r * w + c] = v * sc;
                acc += v;
                ga[h + c] += v;
              }
              ga[r] = static_cast<scalar_t>(acc);
            }
          }
          auto dqb = dqh.narrow(0, i0, n);
          auto ds = operand(s, plo);  // scale dS
          mm_to(dqb, ds, kh, low ? dq_lo.narrow(0, 0, n) : at::Tensor());
          mm_acc(dkh, ds.t(), qb, dk_lo, i0 == 0);
        }
      }
    });
  });
  return {dq, dk, dv, dqa};
}
