// 8-float vectors for the CPU kernels (GCC vector extensions) and the target clones
// that run them (x86-64-v4: AVX-512, v3: AVX2, baseline), chosen at load time for the
// machine, as ATen's CPU_CAPABILITY dispatch does. Eight lanes are one ymm register
// with AVX2 and AVX-512 (whose compares and selects on ymm are native too); sixteen
// lanes would be twice as wide on AVX-512, but measured 2.8x slower on AVX2, where
// compilers split a 16-lane select into scalar code.
#pragma once

#include <cstdint>
#include <cstring>

namespace polaformerpp {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define POLA_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define POLA_MULTIVERSION
#endif

typedef float vfloat __attribute__((vector_size(32)));
typedef int32_t vint __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;
#define POLA_INLINE inline __attribute__((always_inline))

POLA_INLINE vfloat vload(const float* p) {
    vfloat x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
POLA_INLINE void vstore(float* p, vfloat x) { std::memcpy(p, &x, sizeof x); }
POLA_INLINE vfloat vsplat(float a) { return vfloat{} + a; }
// the sum of the lanes, as a tree (a chain of scalar adds would cost a latency each)
POLA_INLINE float vsum(vfloat x) {
    x += __builtin_shuffle(x, vint{4, 5, 6, 7, 0, 1, 2, 3});
    x += __builtin_shuffle(x, vint{2, 3, 0, 1, 6, 7, 4, 5});
    x += __builtin_shuffle(x, vint{1, 0, 3, 2, 5, 4, 7, 6});
    return x[0];
}
// channels (2i, 2i+1) -> (2i+1, 2i): the partner of each RoPE pair
POLA_INLINE vfloat swap_pairs(vfloat x) { return __builtin_shuffle(x, vint{1, 0, 3, 2, 5, 4, 7, 6}); }

// expm1(r) for |r| <= ln2 / 2 (a float or a vector): the degree-7 Taylor polynomial.
template <typename T>
POLA_INLINE T expm1_reduced(T r) {
    T p = T{} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    return p * r;
}

}  // namespace polaformerpp
