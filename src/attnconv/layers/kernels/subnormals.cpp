// Subnormal floats flushed to zero (FTZ and DAZ) or kept, on every intra-op thread:
// torch.set_flush_denormal sets the calling thread's control register alone, and ATen's worker
// threads, once started, keep their own. One task per thread (grain 1 over get_num_threads()
// items: ATen's parallel_for gives each thread of its pool one), each setting its own register.
#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>

bool flush_denormal(bool on) {
  std::atomic<bool> ok{at::globalContext().setFlushDenormal(on)};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (!at::globalContext().setFlushDenormal(on)) ok = false;
    }
  });
  return ok;
}
