// The Python module of the fused CPU kernels: only this file includes torch's Python bindings
// (torch/python.h); the kernels include ATen alone, so the build parses the heavy headers once
// and compiles the kernels beside it (the build's time: docs/benchmarks.md).
#include <torch/python.h>

#include <optional>
#include <vector>

// content attention with row/column positional logits (fused_axis.cpp)
std::vector<at::Tensor> forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor qa,
                                int64_t h, int64_t w, double scale, double p, int64_t seed,
                                int64_t threshold, bool per_image);
std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor q, at::Tensor k, at::Tensor v,
                                 at::Tensor qa, at::Tensor mx, at::Tensor inv,
                                 int64_t h, int64_t w, double scale, double p, int64_t seed,
                                 int64_t threshold, bool per_image);

// SASA's local window attention (fused_local.cpp)
std::vector<at::Tensor> local_forward(at::Tensor q, std::optional<at::Tensor> k, at::Tensor v,
                                      std::optional<at::Tensor> mix,
                                      std::optional<at::Tensor> qr_row,
                                      std::optional<at::Tensor> qr_col, int64_t ks, bool mask);
std::vector<at::Tensor> local_backward(at::Tensor gy, at::Tensor q, std::optional<at::Tensor> k,
                                       at::Tensor v, std::optional<at::Tensor> mix,
                                       at::Tensor probs, int64_t ks, bool rel);

// hidden dropout with the counter-hash mask (dropout.cpp)
at::Tensor hash_dropout(const at::Tensor& x, double p, int64_t seed, int64_t threshold,
                        int64_t offset);

// subnormals flushed to zero (or kept) on every intra-op thread (subnormals.cpp)
bool flush_denormal(bool on);

// The kernels run without the GIL: a worker thread may call back into Python (a dispatch mode
// such as FlopCounterMode, carried to it by parallel.h) while the calling thread waits for it.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using nogil = py::call_guard<py::gil_scoped_release>;
  m.def("forward", &forward, "fused axis attention forward", nogil());
  m.def("backward", &backward, "fused axis attention backward", nogil());
  m.def("local_forward", &local_forward, "fused local window attention forward", nogil());
  m.def("local_backward", &local_backward, "fused local window attention backward", nogil());
  m.def("hash_dropout", &hash_dropout, "dropout with the counter-hash mask", nogil());
  m.def("flush_denormal", &flush_denormal, "FTZ/DAZ on every intra-op thread", nogil());
}
