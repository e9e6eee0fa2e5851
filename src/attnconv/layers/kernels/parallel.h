// at::parallel_for carrying the calling thread's state onto every worker thread: grad mode, the
// autocast state and the dispatcher's excluded keys (an autograd Function runs its forward with
// grad off). Without it a worker's at::mm_out on a tensor that requires grad goes through
// autograd and fails ("functions with out=... arguments don't support automatic
// differentiation"), as at::launch and torch's inter-op pool also carry it. The state holds
// Python dispatch modes too (FlopCounterMode): a worker then calls into Python, so the bindings
// release the GIL (bindings.cpp) or the caller, holding it at the pool's barrier, deadlocks.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <cstdint>

template <class F>
inline void parallel_tasks(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const at::ThreadLocalState state;
  at::parallel_for(begin, end, grain, [&](int64_t lo, int64_t hi) {
    at::ThreadLocalStateGuard guard(state);
    f(lo, hi);
  });
}
