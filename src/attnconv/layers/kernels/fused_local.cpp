// SASA's local k x k window attention (Ramachandran et al. 2019, eq. 2-3), fused per image and
// head (CPU): the C++ twin of kernels/window.py's window kernel, the same loops over the k^2
// offsets on shifted rows of the keys and values, but one (image, head) at a time so that its
// q, k, v (d x H x W) and probabilities (k^2 x H x W) stay in the core's cache, where the Python
// kernel streams the whole batch through memory once per offset and operation.
//
//   y_ij = sum_ab softmax_ab(q_ij . k_ab + q_ij . r_{a-i,b-j}) v_ab      (ab in the k x k window)
//
// q, k (B, nh, dk, H, W), v (B, nh, M, dv, H, W) contiguous, with ``mix`` (k^2, M) the attention
// stem's spatially-aware values v_ab = sum_m mix[(a-i, b-j), m] v^m_ab (M = 1 and no mix: plain
// values); qr_row / qr_col (B, nh, k, H, W) the relative logits q . rel_row[a-i], q . rel_col[b-j]. Keys outside the image: masked (out of
// the softmax) or zeros (a zero key and value that keeps its relative logit), as kernels/window.py.
#include <ATen/ATen.h>

#include "parallel.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

namespace {

struct Window {
  int64_t ks, before, h, w;
  // offset o = (a, b): the key row/column shift, and the query box whose keys lie inside
  int64_t di(int64_t o) const { return o / ks - before; }
  int64_t dj(int64_t o) const { return o % ks - before; }
  int64_t r0(int64_t o) const { return std::max<int64_t>(0, -di(o)); }
  int64_t r1(int64_t o) const { return std::min(h, h - di(o)); }
  int64_t c0(int64_t o) const { return std::max<int64_t>(0, -dj(o)); }
  int64_t c1(int64_t o) const { return std::min(w, w - dj(o)); }
};

// acc[o] (H, W) += sum_d a[d] (H, W) * b[d] shifted by offset o, over the query box of o.
template <typename scalar_t>
void shifted_dot(scalar_t* acc, const scalar_t* a, const scalar_t* b, int64_t d,
                 const Window& g, int64_t o) {
  const int64_t hw = g.h * g.w, sh = g.di(o) * g.w + g.dj(o), c0 = g.c0(o), c1 = g.c1(o);
  for (int64_t c = 0; c < d; ++c) {
    const scalar_t* ac = a + c * hw;
    const scalar_t* bc = b + c * hw + sh;
    for (int64_t i = g.r0(o); i < g.r1(o); ++i) {
      scalar_t* row = acc + i * g.w;
_Pragma("omp simd")
      for (int64_t j = c0; j < c1; ++j) row[j] += ac[i * g.w + j] * bc[i * g.w + j];
    }
  }
}

// out[c] shifted by offset o (H, W) += p (H, W) * x[c], over the query box of o (scatter: the
// shift is on the output) or, with ``to_query``, out[c] += p * x[c] shifted (gather).
template <typename scalar_t>
void shifted_axpy(scalar_t* out, const scalar_t* p, const scalar_t* x, int64_t d,
                  const Window& g, int64_t o, bool to_query) {
  const int64_t hw = g.h * g.w, sh = g.di(o) * g.w + g.dj(o), c0 = g.c0(o), c1 = g.c1(o);
  for (int64_t c = 0; c < d; ++c) {
    scalar_t* oc = out + c * hw + (to_query ? 0 : sh);
    const scalar_t* xc = x + c * hw + (to_query ? sh : 0);
    for (int64_t i = g.r0(o); i < g.r1(o); ++i) {
      const scalar_t* prow = p + i * g.w;
_Pragma("omp simd")
      for (int64_t j = c0; j < c1; ++j) oc[i * g.w + j] += prow[j] * xc[i * g.w + j];
    }
  }
}

}  // namespace

// -> y (B, nh, dv, H, W), probs (B, nh, k^2, H, W)
std::vector<at::Tensor> local_forward(at::Tensor q, std::optional<at::Tensor> k, at::Tensor v,
                                      std::optional<at::Tensor> mix,
                                      std::optional<at::Tensor> qr_row,
                                      std::optional<at::Tensor> qr_col, int64_t ks, bool mask) {
  const int64_t b = q.size(0), nh = q.size(1), dk = q.size(2), h = q.size(3), w = q.size(4);
  const int64_t nm = v.size(2), dv = v.size(3), k2 = ks * ks, hw = h * w;
  const Window g{ks, (ks - 1) / 2, h, w};
  auto y = at::zeros({b, nh, dv, h, w}, q.options());
  auto probs = at::zeros({b, nh, k2, h, w}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "local_forward", [&] {
    // base pointers, hoisted: every tensor is contiguous (B, nh, d, H, W), task = (image, head)
    const scalar_t* q0 = q.data_ptr<scalar_t>();
    const scalar_t* k0 = k ? k->data_ptr<scalar_t>() : nullptr;
    const scalar_t* v0 = v.data_ptr<scalar_t>();
    const scalar_t* rr0 = qr_row ? qr_row->data_ptr<scalar_t>() : nullptr;
    const scalar_t* rc0 = qr_col ? qr_col->data_ptr<scalar_t>() : nullptr;
    scalar_t* y0 = y.data_ptr<scalar_t>();
    const scalar_t* mix0 = mix ? mix->data_ptr<scalar_t>() : nullptr;
    parallel_tasks(0, b * nh, 1, [&](int64_t lo, int64_t hi) {
      auto stat = at::empty({3, hw}, q.options());
      for (int64_t task = lo; task < hi; ++task) {
        auto pt = probs.view({b * nh, k2, hw})[task];
        scalar_t* p = pt.data_ptr<scalar_t>();
        const scalar_t* qh = q0 + task * dk * hw;
        for (int64_t o = 0; o < k2; ++o) {
          scalar_t* po = p + o * hw;
          if (k0) shifted_dot(po, qh, k0 + task * dk * hw, dk, g, o);
          if (rr0) {  // + q . rel_row[a] + q . rel_col[b]
            const scalar_t* rr = rr0 + (task * ks + o / ks) * hw;
            const scalar_t* rc = rc0 + (task * ks + o % ks) * hw;
_Pragma("omp simd")
            for (int64_t j = 0; j < hw; ++j) po[j] += rr[j] + rc[j];
          }
          if (mask) {  // keys outside the image leave the softmax
            const scalar_t inf = -std::numeric_limits<scalar_t>::infinity();
            for (int64_t i = 0; i < h; ++i)
              for (int64_t j = 0; j < w; ++j)
                if (i < g.r0(o) || i >= g.r1(o) || j < g.c0(o) || j >= g.c1(o)) po[i * w + j] = inf;
          }
        }
        // softmax over the k^2 offsets of every pixel (the centre key is always inside)
        scalar_t* mx = stat[0].data_ptr<scalar_t>();
        scalar_t* sm = stat[1].data_ptr<scalar_t>();
        std::copy(p, p + hw, mx);
        for (int64_t o = 1; o < k2; ++o) {
          const scalar_t* po = p + o * hw;
_Pragma("omp simd")
          for (int64_t j = 0; j < hw; ++j) mx[j] = po[j] > mx[j] ? po[j] : mx[j];
        }
        for (int64_t o = 0; o < k2; ++o) {
          scalar_t* po = p + o * hw;
_Pragma("omp simd")
          for (int64_t j = 0; j < hw; ++j) po[j] -= mx[j];
        }
        pt.exp_();
        std::fill(sm, sm + hw, scalar_t(0));
        for (int64_t o = 0; o < k2; ++o) {
          const scalar_t* po = p + o * hw;
_Pragma("omp simd")
          for (int64_t j = 0; j < hw; ++j) sm[j] += po[j];
        }
        for (int64_t j = 0; j < hw; ++j) sm[j] = scalar_t(1) / sm[j];
        for (int64_t o = 0; o < k2; ++o) {
          scalar_t* po = p + o * hw;
_Pragma("omp simd")
          for (int64_t j = 0; j < hw; ++j) po[j] *= sm[j];
        }
        scalar_t* yh = y0 + task * dv * hw;
        const scalar_t* vh = v0 + task * nm * dv * hw;
        scalar_t* pw = stat[2].data_ptr<scalar_t>();  // P_o mix[o, m]
        for (int64_t o = 0; o < k2; ++o) {
          if (!mix0) {
            shifted_axpy(yh, p + o * hw, vh, dv, g, o, true);
            continue;
          }
          for (int64_t m = 0; m < nm; ++m) {
            const scalar_t f = mix0[o * nm + m];
            _Pragma("omp simd")
            for (int64_t j = 0; j < hw; ++j) pw[j] = p[o * hw + j] * f;
            shifted_axpy(yh, pw, vh + m * dv * hw, dv, g, o, true);
          }
        }
      }
    });
  });
  return {y, probs};
}

// Gradients of local_forward from gy (B, nh, dv, H, W): gq, gk (or empty), gv, gmix (or empty),
// g_row, g_col (B, nh, k, H, W; empty without relative logits).
std::vector<at::Tensor> local_backward(at::Tensor gy, at::Tensor q, std::optional<at::Tensor> k,
                                       at::Tensor v, std::optional<at::Tensor> mix,
                                       at::Tensor probs, int64_t ks, bool rel) {
  const int64_t b = q.size(0), nh = q.size(1), dk = q.size(2), h = q.size(3), w = q.size(4);
  const int64_t nm = v.size(2), dv = v.size(3), k2 = ks * ks, hw = h * w;
  const Window g{ks, (ks - 1) / 2, h, w};
  auto gv = at::zeros_like(v);
  auto gq = k ? at::zeros_like(q) : at::Tensor();
  auto gk = k ? at::zeros_like(*k) : at::Tensor();
  auto grow = rel ? at::zeros({b, nh, ks, h, w}, q.options()) : at::Tensor();
  auto gcol = rel ? at::zeros({b, nh, ks, h, w}, q.options()) : at::Tensor();
  // per task, reduced after the loop (tasks run in parallel)
  auto gmix_t = mix ? at::zeros({b * nh, k2, nm}, q.options()) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "local_backward", [&] {
    const scalar_t* p0 = probs.data_ptr<scalar_t>();
    const scalar_t* gy0 = gy.data_ptr<scalar_t>();
    const scalar_t* v0 = v.data_ptr<scalar_t>();
    const scalar_t* q0 = q.data_ptr<scalar_t>();
    const scalar_t* k0 = k ? k->data_ptr<scalar_t>() : nullptr;
    scalar_t* gv0 = gv.data_ptr<scalar_t>();
    scalar_t* gq0 = k ? gq.data_ptr<scalar_t>() : nullptr;
    scalar_t* gk0 = k ? gk.data_ptr<scalar_t>() : nullptr;
    scalar_t* gr0 = rel ? grow.data_ptr<scalar_t>() : nullptr;
    scalar_t* gc0 = rel ? gcol.data_ptr<scalar_t>() : nullptr;
    const scalar_t* mix0 = mix ? mix->data_ptr<scalar_t>() : nullptr;
    scalar_t* gm0 = mix ? gmix_t.data_ptr<scalar_t>() : nullptr;
    parallel_tasks(0, b * nh, 1, [&](int64_t lo, int64_t hi) {
      auto gl_t = at::empty({k2, hw}, q.options());
      auto dot_t = at::empty({hw}, q.options());
      auto s_t = at::empty({2, hw}, q.options());
      for (int64_t task = lo; task < hi; ++task) {
        const scalar_t* p = p0 + task * k2 * hw;
        const scalar_t* gyh = gy0 + task * dv * hw;
        const scalar_t* vh = v0 + task * nm * dv * hw;
        scalar_t* gvh = gv0 + task * nm * dv * hw;
        scalar_t* gl = gl_t.data_ptr<scalar_t>();
        std::fill(gl, gl + k2 * hw, scalar_t(0));
        scalar_t* sv = s_t[0].data_ptr<scalar_t>();  // gy . v^m_ab
        scalar_t* pw = s_t[1].data_ptr<scalar_t>();  // P_o mix[o, m]
        for (int64_t o = 0; o < k2; ++o) {
          if (!mix0) {
            shifted_dot(gl + o * hw, gyh, vh, dv, g, o);           // dL/dP = gy . v_ab
            shifted_axpy(gvh, p + o * hw, gyh, dv, g, o, false);  // dL/dv_ab += P gy
            continue;
          }
          for (int64_t m = 0; m < nm; ++m) {
            const scalar_t f = mix0[o * nm + m];
            std::fill(sv, sv + hw, scalar_t(0));
            shifted_dot(sv, gyh, vh + m * dv * hw, dv, g, o);
            double gm = 0;
            _Pragma("omp simd reduction(+ : gm)")
            for (int64_t j = 0; j < hw; ++j) {
              gl[o * hw + j] += f * sv[j];  // dL/dP_o = sum_m mix[o, m] gy . v^m_ab
              gm += static_cast<double>(p[o * hw + j]) * sv[j];  // dL/dmix[o, m]
              pw[j] = p[o * hw + j] * f;
            }
            gm0[(task * k2 + o) * nm + m] += static_cast<scalar_t>(gm);
            shifted_axpy(gvh + m * dv * hw, pw, gyh, dv, g, o, false);
          }
        }
        scalar_t* dot = dot_t.data_ptr<scalar_t>();  // softmax backward: P (dP - sum P dP)
        std::fill(dot, dot + hw, scalar_t(0));
        for (int64_t o = 0; o < k2; ++o) {
_Pragma("omp simd")
          for (int64_t j = 0; j < hw; ++j) dot[j] += p[o * hw + j] * gl[o * hw + j];
        }
        for (int64_t o = 0; o < k2; ++o) {
_Pragma("omp simd")
          for (int64_t j = 0; j < hw; ++j) gl[o * hw + j] = p[o * hw + j] * (gl[o * hw + j] - dot[j]);
        }
        if (rel) {  // the logits' row and column terms: sums over the other window axis
          scalar_t* gr = gr0 + task * ks * hw;
          scalar_t* gc = gc0 + task * ks * hw;
          for (int64_t o = 0; o < k2; ++o) {
            scalar_t* r = gr + (o / ks) * hw;
            scalar_t* c = gc + (o % ks) * hw;
            const scalar_t* go = gl + o * hw;
_Pragma("omp simd")
            for (int64_t j = 0; j < hw; ++j) {
              r[j] += go[j];
              c[j] += go[j];
            }
          }
        }
        if (k) {  // q_ij . k_ab: dq_ij += gl k_ab, dk_ab += gl q_ij
          const scalar_t* qh = q0 + task * dk * hw;
          const scalar_t* kh = k0 + task * dk * hw;
          scalar_t* gqh = gq0 + task * dk * hw;
          scalar_t* gkh = gk0 + task * dk * hw;
          for (int64_t o = 0; o < k2; ++o) {
            shifted_axpy(gqh, gl + o * hw, kh, dk, g, o, true);
            shifted_axpy(gkh, gl + o * hw, qh, dk, g, o, false);
          }
        }
      }
    });
  });
  auto gmix = mix ? gmix_t.sum(0) : at::Tensor();
  return {gq, gk, gv, gmix, grow, gcol};
}
