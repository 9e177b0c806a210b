// 16-float vectors for the CPU kernels (GCC vector extensions) and the target clones
// that run them: each clone (x86-64-v4: AVX-512, v3: AVX2, baseline) lowers a
// 16-float vector to its own registers (one zmm, two ymm, four xmm), chosen at
// load time for the machine, as ATen's CPU_CAPABILITY dispatch does.
#pragma once

#include <cstdint>
#include <cstring>

namespace polaformerpp {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define POLA_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define POLA_MULTIVERSION
#endif

typedef float vfloat __attribute__((vector_size(64)));
typedef int32_t vint __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;
#define POLA_INLINE inline __attribute__((always_inline))

POLA_INLINE vfloat vload(const float* p) {
    vfloat x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
POLA_INLINE void vstore(float* p, vfloat x) { std::memcpy(p, &x, sizeof x); }
POLA_INLINE vfloat vsplat(float a) { return vfloat{} + a; }
// the sum of the 16 lanes, as a tree (a chain of 16 scalar adds would cost 16 latencies)
POLA_INLINE float vsum(vfloat x) {
    x += __builtin_shuffle(x, vint{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    x += __builtin_shuffle(x, vint{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    x += __builtin_shuffle(x, vint{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    x += __builtin_shuffle(x, vint{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    return x[0];
}
// channels (2i, 2i+1) -> (2i+1, 2i): the partner of each RoPE pair
POLA_INLINE vfloat swap_pairs(vfloat x) {
    return __builtin_shuffle(x, vint{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
}

}  // namespace polaformerpp
