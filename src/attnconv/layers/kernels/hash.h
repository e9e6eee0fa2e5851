// The dropout counter hash of functional.py (_h32, dropped_links, dropped_elements), shared by
// the fused kernels: a mask is a pure function of (seed, index), redrawn in forward and backward
// instead of stored.
#pragma once

#include <cstdint>

namespace attnconv {

// A 32-bit integer mixer (functional._h32).
inline uint32_t h32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

// key(n) = h32(h32(n mod 2^32 ^ seed) ^ n >> 32): an attention row's key (dropped_links), or an
// element's draw (dropped_elements: dropped when below the threshold).
inline uint32_t row_key(uint64_t n, uint32_t seed) {
  return h32(h32(static_cast<uint32_t>(n) ^ seed) ^ static_cast<uint32_t>(n >> 32));
}

}  // namespace attnconv
