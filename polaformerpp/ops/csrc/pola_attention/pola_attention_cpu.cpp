// Fused CPU feature maps of PolaFormer++'s polarity-aware linear attention.
//
// For every token these kernels read one row of q (or k), build the
// polarity-aware, channel-wise spiky feature maps in registers (one exp per
// element and stream: only one of x+ and x- is non-zero), rotate channel pairs
// by the RoPE angles and write the rows the attention's matrix products read.
// The products run on the BLAS torch links (sgemm): either torch.matmul over rows
// written to memory (the row kernels), or, in the fused passes of the shift-free
// forward (key_state, readout), per block of tokens while the rows are in cache.
// polaformerpp/ops/pola_attention/cpu.py drives them; the eager reference is
// pola_attention/eager.py (pola_attention_torch); the method is written out in
// pola_attention/__init__.py.
//
// Shapes (fp32, last dim contiguous, other strides arbitrary):
//   q, k          (B, h, n, d)
//   signed_temps  (h, 4, d)   rows [ts+, -ts-, -to+, to-] (see common.signed_temperatures)
//   key_mean      (B, h, 2d)
//   RoPE, per half of the 2d feature channels: sin_lo/cos_lo rotate channels
//   [0, d), sin_hi/cos_hi channels [d, 2d); each (rows, d), channels 2i and
//   2i+1 share one angle. With grid_width == 0 token i reads row i of both
//   (the halves of (n, 2d) tables); with grid_width == W token t = offset + i
//   reads row t / W of the lo and row t % W of the hi tables (RopeGrid).
#include <torch/extension.h>

#include "checks.h"
#include "kernels.h"
#include "vectors.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace polaformerpp;


constexpr float kExpOverflow = 88.72283905206835f;  // log(FLT_MAX)

// exp(a) - 1 for a >= 0 (NaN propagates, +inf above log(FLT_MAX)).
// Cody-Waite reduction a = k ln2 + r, |r| <= ln2 / 2, and a degree-7 Taylor
// polynomial for expm1(r); the result scale * expm1(r) + (scale - 1) is exact
// in the k = 0 case, so small arguments keep full relative precision.
// Written without branches or library calls so that the loops vectorise.
inline float expm1_nonneg(float a) {
    float x = a < 88.5f ? a : 88.5f;  // NaN -> 88.5, fixed below
    float kf = std::floor(x * 1.4426950408889634f + 0.5f);
    float r = x - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float pm1 = expm1_reduced(r);
    // 2^k in two halves: k reaches 128, one past the largest finite exponent
    int32_t k = static_cast<int32_t>(kf);
    int32_t k1 = k >> 1;
    int32_t bits1 = (k1 + 127) << 23, bits2 = (k - k1 + 127) << 23;
    float s1, s2;
    std::memcpy(&s1, &bits1, sizeof(float));
    std::memcpy(&s2, &bits2, sizeof(float));
    float scale = s1 * s2;
    float result = s1 * (s2 * pm1) + (scale - 1.0f);
    result = a > kExpOverflow ? std::numeric_limits<float>::infinity() : result;
    return a != a ? a : result;
}

// exp(a) for any a: 0 below -103.9 (past the smallest subnormal), +inf above
// log(FLT_MAX), NaN propagates. Same reduction and polynomial as
// expm1_nonneg; 2^k in two halves covers k in [-150, 128].
inline float exp_any(float a) {
    float x = a < 88.5f ? a : 88.5f;  // NaN -> 88.5, fixed below
    x = x > -104.0f ? x : -104.0f;
    float kf = std::floor(x * 1.4426950408889634f + 0.5f);
    float r = x - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float e_r = expm1_reduced(r) + 1.0f;  // exp(r)
    int32_t k = static_cast<int32_t>(kf);
    int32_t k1 = k >> 1;
    int32_t bits1 = (k1 + 127) << 23, bits2 = (k - k1 + 127) << 23;
    float s1, s2;
    std::memcpy(&s1, &bits1, sizeof(float));
    std::memcpy(&s2, &bits2, sizeof(float));
    float result = s1 * (s2 * e_r);
    result = a < -103.9f ? 0.0f : result;
    result = a > kExpOverflow ? std::numeric_limits<float>::infinity() : result;
    return a != a ? a : result;
}

// The RoPE rows of one token: sin/cos of channels [0, d) and [d, 2d).
struct RopeRows {
    const float* sin_lo;
    const float* cos_lo;
    const float* sin_hi;
    const float* cos_hi;
};

// out = scale * R(f) for the d channels of one half (d/2 pairs, one angle each).
inline void rotate_half(const float* f, const float* sin, const float* cos, int64_t d, float scale,
                        float* out) {
    for (int64_t i = 0; i < d / 2; ++i) {
        float c = cos[2 * i] * scale, s = sin[2 * i] * scale;
        float f0 = f[2 * i], f1 = f[2 * i + 1];
        out[2 * i] = f0 * c - f1 * s;
        out[2 * i + 1] = f1 * c + f0 * s;
    }
}

inline bool pairs_share_angles(const float* sin, const float* cos, int64_t d) {
    bool paired = true;
    for (int64_t i = 0; i < d / 2; ++i)
        paired &= (cos[2 * i] == cos[2 * i + 1]) & (sin[2 * i] == sin[2 * i + 1]);
    return paired;
}

// scale * R(f) for all 2d channels (scale * f without rope).
inline void rotate_row(const float* f, const RopeRows* rope, int64_t d, float scale, float* out) {
    if (rope == nullptr) {
        for (int64_t j = 0; j < 2 * d; ++j) out[j] = f[j] * scale;
        return;
    }
    rotate_half(f, rope->sin_lo, rope->cos_lo, d, scale, out);
    rotate_half(f + d, rope->sin_hi, rope->cos_hi, d, scale, out + d);
}

// One stream's query features (2d) from the signed temperature rows t1, t2:
// exp(relu(x t1)) - 1 | exp(relu(x t2)) - 1. With non-negative temperatures at
// most one of x t1, x t2 is positive, so one exp serves both. Returns phi . m.
inline float query_stream_features(const float* q, const float* t1, const float* t2, const float* key_mean,
                                   int64_t d, float* feature) {
    for (int64_t j = 0; j < d; ++j) {
        float y1 = q[j] * t1[j], y2 = q[j] * t2[j];
        float a = y1 > y2 ? y1 : y2;
        float e = expm1_nonneg(a < 0.0f ? 0.0f : a);
        feature[j] = !(y1 <= 0.0f) ? e : 0.0f;  // NaN propagates, as in the eager code
        feature[d + j] = !(y2 <= 0.0f) ? e : 0.0f;
    }
    float dot = 0.0f;
    for (int64_t j = 0; j < 2 * d; ++j) dot += feature[j] * key_mean[j];
    return dot;
}

// The rest of a key row once its features (2d) are built: their sum into
// feature_sum and R(phi) into out (phi itself without rope); false when a RoPE
// pair holds two different angles.
inline bool finish_key_row(const float* feature, const RopeRows* rope, int64_t d, float* feature_sum,
                           float* out) {
    for (int64_t j = 0; j < 2 * d; ++j) feature_sum[j] += feature[j];
    if (rope == nullptr) {
        std::memcpy(out, feature, 2 * d * sizeof(float));
        return true;
    }
    rotate_half(feature, rope->sin_lo, rope->cos_lo, d, 1.0f, out);
    rotate_half(feature + d, rope->sin_hi, rope->cos_hi, d, 1.0f, out + d);
    return pairs_share_angles(rope->sin_lo, rope->cos_lo, d) && pairs_share_angles(rope->sin_hi, rope->cos_hi, d);
}

// One token of the key map: phi = [exp(k+) - 1, exp(k-) - 1] (2d), its sum
// into `feature_sum` and R(phi) into `out` (phi itself without `rope`).
// Returns false when a RoPE pair holds two different angles.
POLA_MULTIVERSION
bool key_row(const float* k, const RopeRows* rope, int64_t d, float* feature, float* feature_sum,
             float* out) {
    for (int64_t j = 0; j < d; ++j) {
        float x = k[j];
        float e = expm1_nonneg(x < 0.0f ? -x : x);
        // written as !(x <= 0) and !(x >= 0) so that a NaN reaches both halves
        feature[j] = !(x <= 0.0f) ? e : 0.0f;
        feature[d + j] = !(x >= 0.0f) ? e : 0.0f;
    }
    return finish_key_row(feature, rope, d, feature_sum, out);
}

// One token of both query maps. Stream s (0 same, 1 opposite) has the signed
// temperature rows t1 = signed[2s], t2 = signed[2s + 1] (query_stream_features).
// Writes R(phi_s) / (phi_s . m + eps) (2d) to out[s * 2d ...]: the readout
// divides each row by its denominator, so scaling the row before the product
// with the state gives the stream's output directly.
POLA_MULTIVERSION
void query_row(const float* q, const float* signed_temps, const float* key_mean, const RopeRows* rope,
               int64_t d, float eps, float* feature, float* out) {
    for (int64_t s = 0; s < 2; ++s) {
        const float dot = query_stream_features(q, signed_temps + (2 * s) * d, signed_temps + (2 * s + 1) * d,
                                                key_mean, d, feature);
        rotate_row(feature, rope, d, 1.0f / (dot + eps), out + s * 2 * d);
    }
}

// key_row with exponent shifts b (2d, ../common.py key_exponent_shifts):
// phi' = exp(x - b) - exp(-b) on the active polarity; floor[j] = exp(-b_j).
// b is at most max |k| - 20, so exp(-b) expm1(20) cannot overflow.
POLA_MULTIVERSION
bool shifted_key_row(const float* k, const float* shift, const float* floor, const RopeRows* rope, int64_t d,
                     float* feature, float* feature_sum, float* out) {
    for (int64_t j = 0; j < d; ++j) {
        float x = k[j];
        bool pos = x > 0.0f;
        float a = pos ? x : -x;
        float b = pos ? shift[j] : shift[d + j];
        // exp(a - b) - exp(-b): as exp(-b) expm1(a) below a = 20 (no cancellation), as
        // exp(a - b) above (1 - exp(-a) rounds to 1 there)
        float small = (pos ? floor[j] : floor[d + j]) * expm1_nonneg(a < 20.0f ? a : 20.0f);
        float e = a < 20.0f ? small : exp_any(a - b);
        e = x != x ? x : e;
        feature[j] = !(x <= 0.0f) ? e : 0.0f;
        feature[d + j] = !(x >= 0.0f) ? e : 0.0f;
    }
    return finish_key_row(feature, rope, d, feature_sum, out);
}

// query_row with the keys' log scale L and log m'' per signed-temperature row
// (both (4, d), -inf allowed; ../common.py): per stream the shift
// c = max(relu(max(relu(x) + L + log m'') - top_term), max(relu(x) + L) - top_feature)
// (the limits of ../common.py: SHIFT_FREE_PRODUCT_EXPONENT, MAX_QUERY_EXPONENT), features
// exp(x + L - c) - exp(L - c) and eps * exp(-c) (at least FLT_MIN when eps > 0).
POLA_MULTIVERSION
void shifted_query_row(const float* q, const float* signed_temps, const float* key_mean, const float* log_rows,
                       const float* log_mean_rows, float top_term_limit, float top_feature_limit,
                       const RopeRows* rope, int64_t d, float eps, float* feature, float* out) {
    for (int64_t s = 0; s < 2; ++s) {
        const float* t1 = signed_temps + (2 * s) * d;
        const float* t2 = signed_temps + (2 * s + 1) * d;
        const float* l1 = log_rows + (2 * s) * d;
        const float* l2 = log_rows + (2 * s + 1) * d;
        const float* lm1 = log_mean_rows + (2 * s) * d;
        const float* lm2 = log_mean_rows + (2 * s + 1) * d;
        float top_term = -std::numeric_limits<float>::infinity(), top_feature = top_term;
        for (int64_t j = 0; j < d; ++j) {
            float y1 = q[j] * t1[j], y2 = q[j] * t2[j];
            float a1 = (y1 > 0.0f ? y1 : 0.0f) + l1[j], a2 = (y2 > 0.0f ? y2 : 0.0f) + l2[j];
            float f = a1 > a2 ? a1 : a2;
            float t = a1 + lm1[j] > a2 + lm2[j] ? a1 + lm1[j] : a2 + lm2[j];
            top_feature = f > top_feature ? f : top_feature;
            top_term = t > top_term ? t : top_term;
        }
        float c = top_term - top_term_limit > 0.0f ? top_term - top_term_limit : 0.0f;
        c = top_feature - top_feature_limit > c ? top_feature - top_feature_limit : c;
        for (int64_t j = 0; j < d; ++j) {
            float y1 = q[j] * t1[j], y2 = q[j] * t2[j];
            bool first = y1 > y2;
            float y = first ? y1 : y2;
            float l = first ? l1[j] : l2[j];
            float yp = y > 0.0f ? y : 0.0f;
            // exp(y + l - c) - exp(l - c), as in shifted_key_row
            float small = exp_any(l - c) * expm1_nonneg(yp < 20.0f ? yp : 20.0f);
            float e = yp < 20.0f ? small : exp_any(yp + l - c);
            e = y != y ? y : e;
            feature[j] = !(y1 <= 0.0f) ? e : 0.0f;
            feature[d + j] = !(y2 <= 0.0f) ? e : 0.0f;
        }
        float dot = 0.0f;
        for (int64_t j = 0; j < 2 * d; ++j) dot += feature[j] * key_mean[j];
        float eps_c = eps * exp_any(-c);
        eps_c = eps > 0.0f && eps_c < std::numeric_limits<float>::min() ? std::numeric_limits<float>::min() : eps_c;
        rotate_row(feature, rope, d, 1.0f / (dot + eps_c), out + s * 2 * d);
    }
}

// out = scale * R^T(g) for the d channels of one half: the rotation by the opposite angles
// (the transpose of rotate_half).
inline void unrotate_half(const float* g, const float* sin, const float* cos, int64_t d, float scale,
                          float* out) {
    for (int64_t i = 0; i < d / 2; ++i) {
        float c = cos[2 * i] * scale, s = sin[2 * i] * scale;
        float g0 = g[2 * i], g1 = g[2 * i + 1];
        out[2 * i] = g0 * c + g1 * s;
        out[2 * i + 1] = g1 * c - g0 * s;
    }
}

// scale * R^T(g) (2d channels; scale * g without rope)
inline void unrotate_row(const float* g, const RopeRows* rope, int64_t d, float scale, float* out) {
    if (rope == nullptr) {
        for (int64_t j = 0; j < 2 * d; ++j) out[j] = g[j] * scale;
        return;
    }
    unrotate_half(g, rope->sin_lo, rope->cos_lo, d, scale, out);
    unrotate_half(g + d, rope->sin_hi, rope->cos_hi, d, scale, out + d);
}

// The backward of one query row (both streams; see ../cpu_backward.py). Inputs:
// g and o, the row's output gradient and output (dv, stream s in [s dv/2, (s+1) dv/2));
// grad_rot[s] = g_s S_s^T (2d, row stride rot_stride between the streams).
// With phi, den = phi . m + eps rebuilt as in query_row:
//   dden = -(g_s . o_s) / den,  dphi = R^T(grad_rot[s]) / den + dden m,
//   dx = dphi (phi + 1) on the active exponents,
// accumulating dq (d, written), dm += dden phi (2d) and dT[r] += dx_r q (4, d).
POLA_MULTIVERSION
void query_grad_row(const float* q, const float* signed_temps, const float* key_mean, const RopeRows* rope,
                    int64_t d, int64_t dv, float eps, const float* g, const float* o, const float* grad_rot,
                    int64_t rot_stride, float* feature, float* grad_phi, float* grad_q, float* grad_mean,
                    float* grad_temps) {
    for (int64_t j = 0; j < d; ++j) grad_q[j] = 0.0f;
    const int64_t half = dv / 2;
    for (int64_t s = 0; s < 2; ++s) {
        const float* t1 = signed_temps + (2 * s) * d;
        const float* t2 = signed_temps + (2 * s + 1) * d;
        const float dot = query_stream_features(q, t1, t2, key_mean, d, feature);
        float go = 0.0f;
        for (int64_t j = 0; j < half; ++j) go += g[s * half + j] * o[s * half + j];
        const float inv_den = 1.0f / (dot + eps);
        const float grad_den = -go * inv_den;
        unrotate_row(grad_rot + s * rot_stride, rope, d, inv_den, grad_phi);
        float* dt1 = grad_temps + (2 * s) * d;
        float* dt2 = grad_temps + (2 * s + 1) * d;
        // one store stream per loop, so that each vectorises
        for (int64_t j = 0; j < 2 * d; ++j) grad_mean[j] += grad_den * feature[j];
        for (int64_t j = 0; j < d; ++j) {  // dphi -> dx in place
            float y1 = q[j] * t1[j];
            grad_phi[j] = y1 > 0.0f ? (grad_phi[j] + grad_den * key_mean[j]) * (feature[j] + 1.0f) : 0.0f;
        }
        for (int64_t j = 0; j < d; ++j) {
            float y2 = q[j] * t2[j];
            grad_phi[d + j] =
                y2 > 0.0f ? (grad_phi[d + j] + grad_den * key_mean[d + j]) * (feature[d + j] + 1.0f) : 0.0f;
        }
        for (int64_t j = 0; j < d; ++j) grad_q[j] += grad_phi[j] * t1[j] + grad_phi[d + j] * t2[j];
        for (int64_t j = 0; j < d; ++j) dt1[j] += grad_phi[j] * q[j];
        for (int64_t j = 0; j < d; ++j) dt2[j] += grad_phi[d + j] * q[j];
    }
}

// The backward of one key row: dphi = R^T(grad_rot) + grad_mean (2d), then
// dk = dphi[j] (phi + 1) where k > 0, -dphi[d + j] (phi + 1) where k < 0.
POLA_MULTIVERSION
void key_grad_row(const float* k, const RopeRows* rope, int64_t d, const float* grad_rot, const float* grad_mean,
                  float* grad_phi, float* grad_k) {
    unrotate_row(grad_rot, rope, d, 1.0f, grad_phi);
    for (int64_t j = 0; j < d; ++j) {
        float x = k[j];
        float slope = expm1_nonneg(x < 0.0f ? -x : x) + 1.0f;
        float up = (grad_phi[j] + grad_mean[j]) * slope;
        float down = -(grad_phi[d + j] + grad_mean[d + j]) * slope;
        grad_k[j] = x > 0.0f ? up : (x < 0.0f ? down : 0.0f);
    }
}

// The per-head inputs of the query kernels: signed_temps (h, 4, d) and key_mean (B, h, 2d), contiguous.
void check_query_inputs(const torch::Tensor& signed_temps, const torch::Tensor& key_mean, int64_t B, int64_t H,
                        int64_t d) {
    check_float_rows(signed_temps, "signed_temps", 3);
    TORCH_CHECK(signed_temps.is_contiguous() && signed_temps.size(0) == H && signed_temps.size(1) == 4 &&
                signed_temps.size(2) == d, "signed_temps must be contiguous (h, 4, d)");
    check_float_rows(key_mean, "key_mean", 3);
    TORCH_CHECK(key_mean.is_contiguous() && key_mean.size(0) == B && key_mean.size(1) == H &&
                key_mean.size(2) == 2 * d, "key_mean must be contiguous (B, h, 2d)");
}

// The output and its gradient of the backward's query pass: both (B, h, n, dv), dv even. Returns dv.
int64_t check_output_rows(const torch::Tensor& grad_out, const torch::Tensor& out, int64_t B, int64_t H, int64_t n) {
    check_float_rows(grad_out, "grad_out", 4);
    check_float_rows(out, "out", 4);
    const int64_t dv = out.size(3);
    TORCH_CHECK(grad_out.sizes() == out.sizes() && out.size(0) == B && out.size(1) == H && out.size(2) == n &&
                dv % 2 == 0, "grad_out and out must be (B, h, n, dv), dv even");
    return dv;
}

// The RoPE tables of a call: lo/hi halves, each (rows, d) with its row stride.
struct RopeTables {
    bool present = false;
    const float* sin_lo = nullptr;
    const float* cos_lo = nullptr;
    const float* sin_hi = nullptr;
    const float* cos_hi = nullptr;
    int64_t stride_lo = 0, stride_hi = 0, grid_width = 0, offset = 0;

    RopeRows rows(int64_t i) const {
        const int64_t lo = grid_width ? (offset + i) / grid_width : i;
        const int64_t hi = grid_width ? (offset + i) % grid_width : i;
        return {sin_lo + lo * stride_lo, cos_lo + lo * stride_lo, sin_hi + hi * stride_hi,
                cos_hi + hi * stride_hi};
    }
};

RopeTables rope_tables(const c10::optional<torch::Tensor>& sin_lo, const c10::optional<torch::Tensor>& cos_lo,
                       const c10::optional<torch::Tensor>& sin_hi, const c10::optional<torch::Tensor>& cos_hi,
                       int64_t grid_width, int64_t offset, int64_t n, int64_t d) {
    RopeTables r;
    const bool any = sin_lo.has_value() || cos_lo.has_value() || sin_hi.has_value() || cos_hi.has_value();
    if (!any) return r;
    TORCH_CHECK(sin_lo.has_value() && cos_lo.has_value() && sin_hi.has_value() && cos_hi.has_value(),
                "the four RoPE tables must be given together");
    TORCH_CHECK(grid_width >= 0 && offset >= 0, "grid_width and offset must be non-negative");
    for (const auto* t : {&sin_lo.value(), &cos_lo.value(), &sin_hi.value(), &cos_hi.value()}) {
        check_float_rows(*t, "RoPE table", 2);
        TORCH_CHECK(t->size(1) == d, "RoPE tables must have d = ", d, " channels, got ", t->sizes());
    }
    TORCH_CHECK(sin_lo->sizes() == cos_lo->sizes() && sin_lo->stride(0) == cos_lo->stride(0) &&
                sin_hi->sizes() == cos_hi->sizes() && sin_hi->stride(0) == cos_hi->stride(0),
                "sin and cos tables must have the same shapes and strides");
    const int64_t last = offset + n - 1;
    const int64_t lo_rows = grid_width ? last / grid_width + 1 : n;
    const int64_t hi_rows = grid_width ? std::min(last + 1, grid_width) : n;
    TORCH_CHECK(sin_lo->size(0) >= lo_rows && sin_hi->size(0) >= hi_rows,
                "RoPE tables have too few rows for these tokens");
    r.present = true;
    r.sin_lo = sin_lo->data_ptr<float>();
    r.cos_lo = cos_lo->data_ptr<float>();
    r.sin_hi = sin_hi->data_ptr<float>();
    r.cos_hi = cos_hi->data_ptr<float>();
    r.stride_lo = sin_lo->stride(0);
    r.stride_hi = sin_hi->stride(0);
    r.grid_width = grid_width;
    r.offset = offset;
    return r;
}

// ---- vector forms of the feature rows (kLanes lanes), for head dims that are multiples of kLanes ----

// expm1_nonneg on kLanes lanes for finite a in [0, 88]: the same reduction and
// polynomial, the integer part rounded to nearest by adding 1.5 * 2^23 (whose low
// mantissa bits then hold it). The fused passes that use it take inputs in the
// shift-free range only (no NaN, no exponent near overflow), so it needs none of
// expm1_nonneg's guards.
POLA_INLINE vfloat vexpm1_bounded(vfloat a) {
    const vfloat magic = vsplat(12582912.0f);
    vfloat t = a * 1.4426950408889634f + magic;
    vfloat kf = t - magic;
    vfloat r = a - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    vfloat pm1 = expm1_reduced(r);
    vfloat scale = (vfloat)((((vint)t - (vint)magic) + 127) << 23);
    return scale * pm1 + (scale - 1.0f);
}

// R(f) for kLanes channels of one half from prepared rows (PreparedRope): f cos +
// swap_pairs(f) ssin
POLA_INLINE vfloat vrotate(vfloat f, const float* cos, const float* ssin) {
    return f * vload(cos) + swap_pairs(f) * vload(ssin);
}

// One stream's query features for kLanes channels from the signed temperature rows t1, t2:
// f1 = exp(relu(x t1)) - 1, f2 = exp(relu(x t2)) - 1 (one exp: at most one is active);
// returns their share of phi . m (m1, m2: the key mean's two halves at these channels).
POLA_INLINE vfloat vstream_features(const float* q, const float* t1, const float* t2, const float* m1,
                                    const float* m2, vfloat& f1, vfloat& f2) {
    const vfloat zero = vfloat{}, x = vload(q);
    const vfloat y1 = x * vload(t1), y2 = x * vload(t2);
    const vfloat a = y1 > y2 ? y1 : y2;
    const vfloat e = vexpm1_bounded(a < zero ? zero : a);
    f1 = y1 <= zero ? zero : e;
    f2 = y2 <= zero ? zero : e;
    return f1 * vload(m1) + f2 * vload(m2);
}

// key_row on vectors (d a multiple of kLanes): the features' sum into feature_sum (2d)
// and R(phi) into out (2d). `rope` holds PreparedRope rows (cosines and signed sines);
// the RoPE pairs are checked once per call (tables_paired).
POLA_MULTIVERSION
void key_row_vec(const float* k, const RopeRows* rope, int64_t d, float* feature_sum, float* out) {
    const vfloat zero = vfloat{};
    for (int64_t c = 0; c < d; c += kLanes) {
        vfloat x = vload(k + c);
        vfloat e = vexpm1_bounded(x < zero ? -x : x);
        vfloat up = x <= zero ? zero : e, down = x >= zero ? zero : e;
        vstore(feature_sum + c, vload(feature_sum + c) + up);
        vstore(feature_sum + d + c, vload(feature_sum + d + c) + down);
        if (rope) {
            up = vrotate(up, rope->cos_lo + c, rope->sin_lo + c);
            down = vrotate(down, rope->cos_hi + c, rope->sin_hi + c);
        }
        vstore(out + c, up);
        vstore(out + d + c, down);
    }
}

// Whether both channels of every pair (2i, 2i + 1) hold the same bits in `rows` rows of d
// (an xor-or reduction, which vectorises).
POLA_MULTIVERSION
bool rows_paired(const float* table, int64_t stride, int64_t rows, int64_t d) {
    uint32_t diff = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = table + r * stride;
        for (int64_t i = 0; i < d / 2; ++i) {
            uint32_t a, b;
            std::memcpy(&a, row + 2 * i, sizeof a);
            std::memcpy(&b, row + 2 * i + 1, sizeof b);
            diff |= a ^ b;
        }
    }
    return diff == 0;
}

// Whether every RoPE pair of the rows these tokens read shares its angle.
bool tables_paired(const RopeTables& t, int64_t n, int64_t d) {
    if (!t.present) return true;
    const int64_t lo_rows = t.grid_width ? (t.offset + n - 1) / t.grid_width + 1 : n;
    const int64_t hi_rows = t.grid_width ? std::min(t.offset + n, t.grid_width) : n;
    return rows_paired(t.sin_lo, t.stride_lo, lo_rows, d) && rows_paired(t.cos_lo, t.stride_lo, lo_rows, d) &&
           rows_paired(t.sin_hi, t.stride_hi, hi_rows, d) && rows_paired(t.cos_hi, t.stride_hi, hi_rows, d);
}

// RoPE rows as the vector rows read them: per table row the cosine of each channel's
// pair and the signed sine (-sin on a pair's first channel, +sin on its second), so that
// R(f) = f cos + swap_pairs(f) ssin. The angles are those of each pair's first channel
// (as rotate_half). Built once per call: O((H + W) d) for a grid, O(n d) for tables.
struct PreparedRope {
    bool present = false;
    int64_t d = 0, grid_width = 0, offset = 0;
    torch::Tensor lo, hi;  // (2, rows, d): cos, ssin

    static torch::Tensor prepare(const float* sin, const float* cos, int64_t stride, int64_t rows, int64_t d) {
        auto out = torch::empty({2, rows, d}, torch::kFloat32);
        float* cp = out.data_ptr<float>();
        float* sp = cp + rows * d;
        at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
                for (int64_t i = 0; i < d / 2; ++i) {
                    const float c = cos[r * stride + 2 * i], sn = sin[r * stride + 2 * i];
                    cp[r * d + 2 * i] = c;
                    cp[r * d + 2 * i + 1] = c;
                    sp[r * d + 2 * i] = -sn;
                    sp[r * d + 2 * i + 1] = sn;
                }
            }
        });
        return out;
    }

    PreparedRope(const RopeTables& t, int64_t n, int64_t d_)
            : present(t.present), d(d_), grid_width(t.grid_width), offset(t.offset) {
        if (!present) return;
        const int64_t lo_rows = grid_width ? (offset + n - 1) / grid_width + 1 : n;
        const int64_t hi_rows = grid_width ? std::min(offset + n, grid_width) : n;
        lo = prepare(t.sin_lo, t.cos_lo, t.stride_lo, lo_rows, d);
        hi = prepare(t.sin_hi, t.cos_hi, t.stride_hi, hi_rows, d);
    }

    // token i's rows; the sin fields hold the signed sines
    RopeRows rows(int64_t i) const {
        const int64_t r_lo = grid_width ? (offset + i) / grid_width : i;
        const int64_t r_hi = grid_width ? (offset + i) % grid_width : i;
        const float* l = lo.data_ptr<float>();
        const float* h = hi.data_ptr<float>();
        const int64_t lo_plane = lo.size(1) * d, hi_plane = hi.size(1) * d;
        return {l + lo_plane + r_lo * d, l + r_lo * d, h + hi_plane + r_hi * d, h + r_hi * d};
    }
};

// query_row on vectors without the division: both streams' R(phi) into out (2 x 2d)
// and their denominators phi . m + eps into den (2). Rope rows as key_row_vec.
POLA_MULTIVERSION
void query_row_vec(const float* q, const float* signed_temps, const float* key_mean, const RopeRows* rope,
                   int64_t d, float eps, float* out, float* den) {
    const vfloat zero = vfloat{};
    for (int64_t s = 0; s < 2; ++s) {
        const float* t1 = signed_temps + (2 * s) * d;
        const float* t2 = signed_temps + (2 * s + 1) * d;
        float* row = out + s * 2 * d;
        vfloat dot = zero;
        for (int64_t c = 0; c < d; c += kLanes) {
            vfloat f1, f2;
            dot += vstream_features(q + c, t1 + c, t2 + c, key_mean + c, key_mean + d + c, f1, f2);
            if (rope) {
                f1 = vrotate(f1, rope->cos_lo + c, rope->sin_lo + c);
                f2 = vrotate(f2, rope->cos_hi + c, rope->sin_hi + c);
            }
            vstore(row + c, f1);
            vstore(row + d + c, f2);
        }
        den[s] = vsum(dot) + eps;
    }
}

// Both streams' rows (each `width` floats, consecutive) divided by their denominators.
POLA_MULTIVERSION
void scale_rows(float* rows, int64_t width, const float* den) {
    for (int64_t s = 0; s < 2; ++s) {
        const vfloat inv = vsplat(1.0f / den[s]);
        for (int64_t c = 0; c < width; c += kLanes) vstore(rows + s * width + c, vload(rows + s * width + c) * inv);
    }
}

// The readout rows' epilogue, dv/2 channels of one stream: out = c / den (+ out) (* gate).
POLA_MULTIVERSION
void finish_output_row(const float* c, float den, int64_t half, bool accumulate, const float* gate, float* out) {
    const float inv = 1.0f / den;
    if (accumulate && gate) {
        for (int64_t j = 0; j < half; ++j) out[j] = (c[j] * inv + out[j]) * gate[j];
    } else if (accumulate) {
        for (int64_t j = 0; j < half; ++j) out[j] += c[j] * inv;
    } else if (gate) {
        for (int64_t j = 0; j < half; ++j) out[j] = c[j] * inv * gate[j];
    } else {
        for (int64_t j = 0; j < half; ++j) out[j] = c[j] * inv;
    }
}

// R^T(g) for kLanes channels from prepared rows: g cos - swap_pairs(g) ssin (the opposite rotation)
POLA_INLINE vfloat vunrotate(vfloat g, const float* cos, const float* ssin) {
    return g * vload(cos) - swap_pairs(g) * vload(ssin);
}

// query_grad_row on vectors (d a multiple of kLanes; `rope` holds PreparedRope rows).
// `feature` is scratch for the 2d unrotated features of a stream.
POLA_MULTIVERSION
void query_grad_row_vec(const float* q, const float* signed_temps, const float* key_mean, const RopeRows* rope,
                        int64_t d, int64_t dv, float eps, const float* g, const float* o, const float* grad_rot,
                        int64_t rot_stride, float* feature, float* grad_q, float* grad_mean, float* grad_temps) {
    const vfloat zero = vfloat{}, one = vsplat(1.0f);
    const int64_t half = dv / 2;
    for (int64_t c = 0; c < d; c += kLanes) vstore(grad_q + c, zero);
    for (int64_t s = 0; s < 2; ++s) {
        const float* t1 = signed_temps + (2 * s) * d;
        const float* t2 = signed_temps + (2 * s + 1) * d;
        vfloat dot = zero;
        for (int64_t c = 0; c < d; c += kLanes) {  // phi and phi . m, as in query_row_vec
            vfloat f1, f2;
            dot += vstream_features(q + c, t1 + c, t2 + c, key_mean + c, key_mean + d + c, f1, f2);
            vstore(feature + c, f1);
            vstore(feature + d + c, f2);
        }
        float go = 0.0f;
        for (int64_t j = 0; j < half; ++j) go += g[s * half + j] * o[s * half + j];
        const float inv_den = 1.0f / (vsum(dot) + eps);
        const vfloat inv = vsplat(inv_den), grad_den = vsplat(-go * inv_den);
        const float* rot = grad_rot + s * rot_stride;
        float* dt1 = grad_temps + (2 * s) * d;
        float* dt2 = grad_temps + (2 * s + 1) * d;
        for (int64_t c = 0; c < d; c += kLanes) {
            vfloat r1 = vload(rot + c), r2 = vload(rot + d + c);
            if (rope) {
                r1 = vunrotate(r1, rope->cos_lo + c, rope->sin_lo + c);
                r2 = vunrotate(r2, rope->cos_hi + c, rope->sin_hi + c);
            }
            const vfloat f1 = vload(feature + c), f2 = vload(feature + d + c);
            const vfloat m1 = vload(key_mean + c), m2 = vload(key_mean + d + c);
            vstore(grad_mean + c, vload(grad_mean + c) + grad_den * f1);
            vstore(grad_mean + d + c, vload(grad_mean + d + c) + grad_den * f2);
            const vfloat x = vload(q + c);
            const vfloat y1 = x * vload(t1 + c), y2 = x * vload(t2 + c);
            const vfloat dx1 = y1 > zero ? (r1 * inv + grad_den * m1) * (f1 + one) : zero;
            const vfloat dx2 = y2 > zero ? (r2 * inv + grad_den * m2) * (f2 + one) : zero;
            vstore(grad_q + c, vload(grad_q + c) + dx1 * vload(t1 + c) + dx2 * vload(t2 + c));
            vstore(dt1 + c, vload(dt1 + c) + dx1 * x);
            vstore(dt2 + c, vload(dt2 + c) + dx2 * x);
        }
    }
}

// key_grad_row on vectors (d a multiple of kLanes; `rope` holds PreparedRope rows).
POLA_MULTIVERSION
void key_grad_row_vec(const float* k, const RopeRows* rope, int64_t d, const float* grad_rot, const float* grad_mean,
                      float* grad_k) {
    const vfloat zero = vfloat{}, one = vsplat(1.0f);
    for (int64_t c = 0; c < d; c += kLanes) {
        vfloat r1 = vload(grad_rot + c), r2 = vload(grad_rot + d + c);
        if (rope) {
            r1 = vunrotate(r1, rope->cos_lo + c, rope->sin_lo + c);
            r2 = vunrotate(r2, rope->cos_hi + c, rope->sin_hi + c);
        }
        const vfloat x = vload(k + c);
        const vfloat slope = vexpm1_bounded(x < zero ? -x : x) + one;
        const vfloat up = (r1 + vload(grad_mean + c)) * slope;
        const vfloat down = -((r2 + vload(grad_mean + d + c)) * slope);
        vstore(grad_k + c, x > zero ? up : (x < zero ? down : zero));
    }
}

constexpr int64_t kRowsPerTask = 64;

// Rotated key features (B, h, n, 2d), their unrotated sum over tokens
// (B, h, 2d) and whether every RoPE pair shares its angle. With key_shifts
// (B, h, 2d) the features are shifted (shifted_key_row).
std::tuple<torch::Tensor, torch::Tensor, bool> key_features(
        const torch::Tensor& k, const c10::optional<torch::Tensor>& sin_lo,
        const c10::optional<torch::Tensor>& cos_lo, const c10::optional<torch::Tensor>& sin_hi,
        const c10::optional<torch::Tensor>& cos_hi, int64_t grid_width, int64_t offset,
        const c10::optional<torch::Tensor>& key_shifts) {
    check_float_rows(k, "k", 4);
    const int64_t B = k.size(0), H = k.size(1), n = k.size(2), d = k.size(3);
    const RopeTables rope = rope_tables(sin_lo, cos_lo, sin_hi, cos_hi, grid_width, offset, n, d);
    torch::Tensor floors;
    const float* shift_p = nullptr;
    if (key_shifts.has_value()) {
        check_float_rows(*key_shifts, "key_shifts", 3);
        TORCH_CHECK(key_shifts->is_contiguous() && key_shifts->size(0) == B && key_shifts->size(1) == H &&
                    key_shifts->size(2) == 2 * d, "key_shifts must be contiguous (B, h, 2d)");
        floors = key_shifts->neg().exp().contiguous();
        shift_p = key_shifts->data_ptr<float>();
    }
    const float* floor_p = shift_p ? floors.data_ptr<float>() : nullptr;
    const bool vec = d % kLanes == 0 && shift_p == nullptr;
    const PreparedRope prepared(vec ? rope : RopeTables{}, n, d);
    auto out = torch::empty({B, H, n, 2 * d}, k.options());
    const int64_t blocks = (n + kRowsPerTask - 1) / kRowsPerTask;
    auto partial = torch::zeros({B * H, blocks, 2 * d}, k.options());
    std::vector<char> paired(B * H * blocks, 1);
    const float* kp = k.data_ptr<float>();
    float* op = out.data_ptr<float>();
    float* pp = partial.data_ptr<float>();
    at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> feature(2 * d);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / blocks, block = task % blocks;
            const int64_t b = bh / H, h = bh % H;
            bool ok = true;
            for (int64_t i = block * kRowsPerTask; i < std::min(n, (block + 1) * kRowsPerTask); ++i) {
                const float* row = kp + b * k.stride(0) + h * k.stride(1) + i * k.stride(2);
                if (vec) {
                    const RopeRows rows = prepared.present ? prepared.rows(i) : RopeRows{};
                    key_row_vec(row, prepared.present ? &rows : nullptr, d, pp + task * 2 * d,
                                op + (bh * n + i) * 2 * d);
                    continue;
                }
                const RopeRows rows = rope.present ? rope.rows(i) : RopeRows{};
                if (shift_p) {
                    ok &= shifted_key_row(row, shift_p + bh * 2 * d, floor_p + bh * 2 * d,
                                          rope.present ? &rows : nullptr, d, feature.data(), pp + task * 2 * d,
                                          op + (bh * n + i) * 2 * d);
                } else {
                    ok &= key_row(row, rope.present ? &rows : nullptr, d, feature.data(), pp + task * 2 * d,
                                  op + (bh * n + i) * 2 * d);
                }
            }
            paired[task] = ok;
        }
    });
    bool all_paired = !vec || tables_paired(rope, n, d);
    for (char p : paired) all_paired &= static_cast<bool>(p);
    return {out, partial.sum(1).view({B, H, 2 * d}), all_paired};
}

// Rotated query features of both streams, each row divided by its
// denominator phi . m + eps: (B, h, n, 2, 2d). With log_rows and
// log_mean_rows (each (B, h, 4, d)) the features are shifted (shifted_query_row).
torch::Tensor query_features(
        const torch::Tensor& q, const torch::Tensor& signed_temps, const torch::Tensor& key_mean,
        const c10::optional<torch::Tensor>& sin_lo, const c10::optional<torch::Tensor>& cos_lo,
        const c10::optional<torch::Tensor>& sin_hi, const c10::optional<torch::Tensor>& cos_hi,
        int64_t grid_width, int64_t offset, double eps, const c10::optional<torch::Tensor>& log_rows,
        const c10::optional<torch::Tensor>& log_mean_rows, double top_term_limit, double top_feature_limit) {
    check_float_rows(q, "q", 4);
    const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3);
    check_query_inputs(signed_temps, key_mean, B, H, d);
    const RopeTables rope = rope_tables(sin_lo, cos_lo, sin_hi, cos_hi, grid_width, offset, n, d);
    TORCH_CHECK(log_rows.has_value() == log_mean_rows.has_value(),
                "log_rows and log_mean_rows must be given together");
    const float* log_p = nullptr;
    const float* log_mean_p = nullptr;
    if (log_rows.has_value()) {
        for (const auto* t : {&log_rows.value(), &log_mean_rows.value()}) {
            check_float_rows(*t, "log_rows", 4);
            TORCH_CHECK(t->is_contiguous() && t->size(0) == B && t->size(1) == H && t->size(2) == 4 &&
                        t->size(3) == d, "log_rows and log_mean_rows must be contiguous (B, h, 4, d)");
        }
        log_p = log_rows->data_ptr<float>();
        log_mean_p = log_mean_rows->data_ptr<float>();
    }
    const bool vec = d % kLanes == 0 && log_p == nullptr;
    const PreparedRope prepared(vec ? rope : RopeTables{}, n, d);
    auto out = torch::empty({B, H, n, 2, 2 * d}, q.options());
    const float* qp = q.data_ptr<float>();
    const float* tp = signed_temps.data_ptr<float>();
    const float* mp = key_mean.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float epsf = static_cast<float>(eps);
    const int64_t blocks = (n + kRowsPerTask - 1) / kRowsPerTask;
    at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> feature(2 * d);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / blocks, block = task % blocks;
            const int64_t b = bh / H, h = bh % H;
            for (int64_t i = block * kRowsPerTask; i < std::min(n, (block + 1) * kRowsPerTask); ++i) {
                const float* row = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
                if (vec) {
                    const RopeRows rows = prepared.present ? prepared.rows(i) : RopeRows{};
                    float den[2];
                    float* target = op + (bh * n + i) * 4 * d;
                    query_row_vec(row, tp + h * 4 * d, mp + bh * 2 * d, prepared.present ? &rows : nullptr, d, epsf,
                                  target, den);
                    scale_rows(target, 2 * d, den);
                    continue;
                }
                const RopeRows rows = rope.present ? rope.rows(i) : RopeRows{};
                if (log_p) {
                    shifted_query_row(row, tp + h * 4 * d, mp + bh * 2 * d, log_p + bh * 4 * d,
                                      log_mean_p + bh * 4 * d, static_cast<float>(top_term_limit),
                                      static_cast<float>(top_feature_limit), rope.present ? &rows : nullptr, d,
                                      epsf, feature.data(), op + (bh * n + i) * 4 * d);
                } else {
                    query_row(row, tp + h * 4 * d, mp + bh * 2 * d, rope.present ? &rows : nullptr, d, epsf,
                              feature.data(), op + (bh * n + i) * 4 * d);
                }
            }
        }
    });
    return out;
}

// The query half of the backward (../cpu_backward.py), for tokens of one chunk:
// grad_out, out (B, h, n, dv); grad_rot (B, h, 2, n, 2d), contiguous, g_s S_s^T per stream.
// Writes dq into grad_q (B, h, n, d), last dim contiguous, and returns per task of
// kRowsPerTask rows the partial sums of dm (B*h, blocks, 2d) and of d(signed temps) (B*h, blocks, 4, d).
std::tuple<torch::Tensor, torch::Tensor> query_grads(
        const torch::Tensor& q, const torch::Tensor& signed_temps, const torch::Tensor& key_mean,
        const c10::optional<torch::Tensor>& sin_lo, const c10::optional<torch::Tensor>& cos_lo,
        const c10::optional<torch::Tensor>& sin_hi, const c10::optional<torch::Tensor>& cos_hi,
        int64_t grid_width, int64_t offset, double eps, const torch::Tensor& grad_out, const torch::Tensor& out,
        const torch::Tensor& grad_rot, torch::Tensor& grad_q) {
    check_float_rows(q, "q", 4);
    const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3);
    check_query_inputs(signed_temps, key_mean, B, H, d);
    const int64_t dv = check_output_rows(grad_out, out, B, H, n);
    TORCH_CHECK(grad_rot.is_contiguous() && grad_rot.scalar_type() == torch::kFloat32 && grad_rot.dim() == 5 &&
                grad_rot.size(0) == B && grad_rot.size(1) == H && grad_rot.size(2) == 2 && grad_rot.size(3) == n &&
                grad_rot.size(4) == 2 * d, "grad_rot must be contiguous float32 (B, h, 2, n, 2d)");
    const RopeTables rope = rope_tables(sin_lo, cos_lo, sin_hi, cos_hi, grid_width, offset, n, d);
    const int64_t blocks = (n + kRowsPerTask - 1) / kRowsPerTask;
    check_float_rows(grad_q, "grad_q", 4);
    TORCH_CHECK(grad_q.sizes() == q.sizes(), "grad_q must have the shape of q");
    auto grad_mean = torch::zeros({B * H, blocks, 2 * d}, q.options());
    auto grad_temps = torch::zeros({B * H, blocks, 4, d}, q.options());
    const float* qp = q.data_ptr<float>();
    const float* tp = signed_temps.data_ptr<float>();
    const float* mp = key_mean.data_ptr<float>();
    const float* gp = grad_out.data_ptr<float>();
    const float* op = out.data_ptr<float>();
    const float* rp = grad_rot.data_ptr<float>();
    float* dqp = grad_q.data_ptr<float>();
    const int64_t dq_s0 = grad_q.stride(0), dq_s1 = grad_q.stride(1), dq_s2 = grad_q.stride(2);
    float* dmp = grad_mean.data_ptr<float>();
    float* dtp = grad_temps.data_ptr<float>();
    const float epsf = static_cast<float>(eps);
    const bool vec = d % kLanes == 0;
    const PreparedRope prepared(vec ? rope : RopeTables{}, n, d);
    at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> feature(2 * d), grad_phi(2 * d);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / blocks, block = task % blocks;
            const int64_t b = bh / H, h = bh % H;
            for (int64_t i = block * kRowsPerTask; i < std::min(n, (block + 1) * kRowsPerTask); ++i) {
                if (vec) {
                    const RopeRows rows = prepared.present ? prepared.rows(i) : RopeRows{};
                    query_grad_row_vec(qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2), tp + h * 4 * d,
                                       mp + bh * 2 * d, prepared.present ? &rows : nullptr, d, dv, epsf,
                                       gp + b * grad_out.stride(0) + h * grad_out.stride(1) + i * grad_out.stride(2),
                                       op + b * out.stride(0) + h * out.stride(1) + i * out.stride(2),
                                       rp + (bh * 2 * n + i) * 2 * d, n * 2 * d, feature.data(),
                                       dqp + b * dq_s0 + h * dq_s1 + i * dq_s2, dmp + task * 2 * d, dtp + task * 4 * d);
                    continue;
                }
                const RopeRows rows = rope.present ? rope.rows(i) : RopeRows{};
                query_grad_row(qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2), tp + h * 4 * d,
                               mp + bh * 2 * d, rope.present ? &rows : nullptr, d, dv, epsf,
                               gp + b * grad_out.stride(0) + h * grad_out.stride(1) + i * grad_out.stride(2),
                               op + b * out.stride(0) + h * out.stride(1) + i * out.stride(2),
                               rp + (bh * 2 * n + i) * 2 * d, n * 2 * d, feature.data(), grad_phi.data(),
                               dqp + b * dq_s0 + h * dq_s1 + i * dq_s2, dmp + task * 2 * d, dtp + task * 4 * d);
            }
        }
    });
    return {grad_mean, grad_temps};
}

// The key half of the backward for tokens of one chunk: grad_rot (B, h, n, 2d),
// contiguous, v dS^T / N; grad_mean (B, h, 2d), dm / N. Writes dk into grad_k (B, h, n, d),
// last dim contiguous.
void key_grads(
        const torch::Tensor& k, const c10::optional<torch::Tensor>& sin_lo, const c10::optional<torch::Tensor>& cos_lo,
        const c10::optional<torch::Tensor>& sin_hi, const c10::optional<torch::Tensor>& cos_hi, int64_t grid_width,
        int64_t offset, const torch::Tensor& grad_rot, const torch::Tensor& grad_mean, torch::Tensor& grad_k) {
    check_float_rows(k, "k", 4);
    const int64_t B = k.size(0), H = k.size(1), n = k.size(2), d = k.size(3);
    TORCH_CHECK(grad_rot.is_contiguous() && grad_rot.scalar_type() == torch::kFloat32 &&
                grad_rot.sizes() == torch::IntArrayRef({B, H, n, 2 * d}),
                "grad_rot must be contiguous float32 (B, h, n, 2d)");
    check_float_rows(grad_mean, "grad_mean", 3);
    TORCH_CHECK(grad_mean.is_contiguous() && grad_mean.size(0) == B && grad_mean.size(1) == H &&
                grad_mean.size(2) == 2 * d, "grad_mean must be contiguous (B, h, 2d)");
    const RopeTables rope = rope_tables(sin_lo, cos_lo, sin_hi, cos_hi, grid_width, offset, n, d);
    const int64_t blocks = (n + kRowsPerTask - 1) / kRowsPerTask;
    check_float_rows(grad_k, "grad_k", 4);
    TORCH_CHECK(grad_k.sizes() == k.sizes(), "grad_k must have the shape of k");
    const float* kp = k.data_ptr<float>();
    const float* rp = grad_rot.data_ptr<float>();
    const float* mp = grad_mean.data_ptr<float>();
    float* dkp = grad_k.data_ptr<float>();
    const int64_t dk_s0 = grad_k.stride(0), dk_s1 = grad_k.stride(1), dk_s2 = grad_k.stride(2);
    const bool vec = d % kLanes == 0;
    const PreparedRope prepared(vec ? rope : RopeTables{}, n, d);
    at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> grad_phi(2 * d);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / blocks, block = task % blocks;
            const int64_t b = bh / H, h = bh % H;
            for (int64_t i = block * kRowsPerTask; i < std::min(n, (block + 1) * kRowsPerTask); ++i) {
                if (vec) {
                    const RopeRows rows = prepared.present ? prepared.rows(i) : RopeRows{};
                    key_grad_row_vec(kp + b * k.stride(0) + h * k.stride(1) + i * k.stride(2),
                                     prepared.present ? &rows : nullptr, d, rp + (bh * n + i) * 2 * d, mp + bh * 2 * d,
                                     dkp + b * dk_s0 + h * dk_s1 + i * dk_s2);
                    continue;
                }
                const RopeRows rows = rope.present ? rope.rows(i) : RopeRows{};
                key_grad_row(kp + b * k.stride(0) + h * k.stride(1) + i * k.stride(2), rope.present ? &rows : nullptr,
                             d, rp + (bh * n + i) * 2 * d, mp + bh * 2 * d, grad_phi.data(),
                             dkp + b * dk_s0 + h * dk_s1 + i * dk_s2);
            }
        }
    });
}

// Fortran BLAS sgemm, as exported by the BLAS torch is built with (MKL on x86-64).
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

// Row-major C (m x n, row stride ldc) = op(A) op(B) + beta C, op(X) = X^T where trans_x;
// A and B are stored row-major with row strides lda, ldb. (Column-major BLAS sees the
// transposes, so it computes C^T = op(B)^T op(A)^T.)
void matmul_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    const int lda_i = static_cast<int>(lda), ldb_i = static_cast<int>(ldb), ldc_i = static_cast<int>(ldc);
    const float one = 1.0f;
    sgemm_(&tb, &ta, &ni, &mi, &ki, &one, b, &ldb_i, a, &lda_i, &beta, c, &ldc_i);
}

void check_blas_stride(int64_t stride, const char* name) {
    TORCH_CHECK(stride > 0 && stride <= std::numeric_limits<int>::max(), name,
                " has a row stride the BLAS cannot take: ", stride);
}

// tokens whose features are built, then multiplied, while in cache (512 and 1024 measured
// alike on AVX-512 with 2 MiB L2; the smaller block leaves room on smaller caches)
constexpr int64_t kKeyBlockRows = 512;
constexpr int64_t kQueryBlockRows = 512;

// Token ranges per (b, h) for passes that sum over tokens: enough tasks for every
// thread (two each), whole blocks in each range.
int64_t block_splits(int64_t blocks, int64_t batch_heads) {
    return std::min(blocks, std::max<int64_t>(1, (2 * at::get_num_threads() + batch_heads - 1) / batch_heads));
}

// max |x| over `rows` rows of d (row stride `stride`); NaN when an element is NaN or
// infinite (x * 0 is then NaN).
POLA_MULTIVERSION
float rows_abs_max(const float* t, int64_t stride, int64_t rows, int64_t d) {
    const vfloat zero = vfloat{};
    vfloat top = zero, poison = zero;
    float top_s = 0.0f, poison_s = 0.0f;
    const int64_t body = d - d % kLanes;
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = t + r * stride;
        for (int64_t c = 0; c < body; c += kLanes) {
            vfloat x = vload(row + c);
            vfloat a = x < zero ? -x : x;
            top = a > top ? a : top;
            poison += x * 0.0f;
        }
        for (int64_t j = body; j < d; ++j) {
            float a = std::fabs(row[j]);
            top_s = a > top_s ? a : top_s;
            poison_s += row[j] * 0.0f;
        }
    }
    for (int l = 0; l < kLanes; ++l) top_s = top[l] > top_s ? top[l] : top_s;
    return std::isnan(vsum(poison) + poison_s) ? std::numeric_limits<float>::quiet_NaN() : top_s;
}

// max |t| of a (B, h, n, d) tensor with a contiguous last dim; NaN when any element
// is NaN or infinite.
double abs_max(const torch::Tensor& t) {
    check_float_rows(t, "t", 4);
    const int64_t B = t.size(0), H = t.size(1), n = t.size(2), d = t.size(3);
    const float* p = t.data_ptr<float>();
    const int64_t blocks = (n + kKeyBlockRows - 1) / kKeyBlockRows;
    std::vector<float> top(B * H * blocks, 0.0f);
    at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / blocks, block = task % blocks, b = bh / H, h = bh % H;
            const int64_t start = block * kKeyBlockRows, stop = std::min(n, start + kKeyBlockRows);
            top[task] = rows_abs_max(p + b * t.stride(0) + h * t.stride(1) + start * t.stride(2), t.stride(2),
                                     stop - start, d);
        }
    });
    float m = 0.0f;
    for (float x : top) {
        if (std::isnan(x)) return std::numeric_limits<double>::quiet_NaN();
        m = x > m ? x : m;
    }
    return m;
}

// The key pass of the fused forward (unshifted exponents): per block of kKeyBlockRows
// tokens the rotated key features are built in a per-thread buffer and multiplied
// there into the state. Returns S = R(phi_k)^T v / n (B, h, 2d, dv), the key mean
// m = sum phi_k / n (B, h, 2d) and whether every RoPE pair shares its angle.
std::tuple<torch::Tensor, torch::Tensor, bool> key_state(
        const torch::Tensor& k, const torch::Tensor& v, const c10::optional<torch::Tensor>& sin_lo,
        const c10::optional<torch::Tensor>& cos_lo, const c10::optional<torch::Tensor>& sin_hi,
        const c10::optional<torch::Tensor>& cos_hi, int64_t grid_width) {
    check_float_rows(k, "k", 4);
    check_float_rows(v, "v", 4);
    const int64_t B = k.size(0), H = k.size(1), n = k.size(2), d = k.size(3), dv = v.size(3);
    TORCH_CHECK(v.size(0) == B && v.size(1) == H && v.size(2) == n, "v must be (B, h, n, dv) like k");
    TORCH_CHECK(n > 0, "k must have at least one token");
    check_blas_stride(v.stride(2), "v");
    const RopeTables rope = rope_tables(sin_lo, cos_lo, sin_hi, cos_hi, grid_width, 0, n, d);
    const int64_t BH = B * H, blocks = (n + kKeyBlockRows - 1) / kKeyBlockRows;
    const int64_t splits = block_splits(blocks, BH);
    auto partial_state = torch::empty({BH, splits, dv, 2 * d}, k.options());  // transposed
    auto partial_sum = torch::zeros({BH, splits, 2 * d}, k.options());
    std::vector<char> paired(BH * splits, 1);
    const bool vec = d % kLanes == 0;
    const PreparedRope prepared(vec ? rope : RopeTables{}, n, d);
    const float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    float* sp = partial_state.data_ptr<float>();
    float* mp = partial_sum.data_ptr<float>();
    at::parallel_for(0, BH * splits, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> feature(2 * d), rows_buf(kKeyBlockRows * 2 * d);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / splits, split = task % splits, b = bh / H, h = bh % H;
            const int64_t first = split * blocks / splits, last = (split + 1) * blocks / splits;
            bool ok = true;
            for (int64_t block = first; block < last; ++block) {
                const int64_t start = block * kKeyBlockRows, stop = std::min(n, start + kKeyBlockRows);
                for (int64_t i = start; i < stop; ++i) {
                    const float* row = kp + b * k.stride(0) + h * k.stride(1) + i * k.stride(2);
                    float* target = rows_buf.data() + (i - start) * 2 * d;
                    if (vec) {
                        const RopeRows rows = prepared.present ? prepared.rows(i) : RopeRows{};
                        key_row_vec(row, prepared.present ? &rows : nullptr, d, mp + task * 2 * d, target);
                    } else {
                        const RopeRows rows = rope.present ? rope.rows(i) : RopeRows{};
                        ok &= key_row(row, rope.present ? &rows : nullptr, d, feature.data(), mp + task * 2 * d,
                                      target);
                    }
                }
                // S_task^T (dv, 2d) (+)= V^T F over the block's rows (BLAS runs this
                // orientation faster than F^T V)
                matmul_rows(true, false, dv, 2 * d, stop - start,
                            vp + b * v.stride(0) + h * v.stride(1) + start * v.stride(2), v.stride(2),
                            rows_buf.data(), 2 * d, block == first ? 0.0f : 1.0f, sp + task * 2 * d * dv, 2 * d);
            }
            paired[task] = ok;
        }
    });
    bool all_paired = !vec || tables_paired(rope, n, d);
    for (char p : paired) all_paired &= static_cast<bool>(p);
    const double inv_n = 1.0 / static_cast<double>(n);
    auto state = (splits == 1 ? partial_state.squeeze(1) : partial_state.sum(1)).mul_(inv_n)
                     .transpose(-1, -2).contiguous();
    auto key_mean = (splits == 1 ? partial_sum.squeeze(1) : partial_sum.sum(1)).mul_(inv_n);
    return {state.view({B, H, 2 * d, dv}), key_mean.view({B, H, 2 * d}).contiguous(), all_paired};
}

// The query pass of the fused forward (unshifted exponents): per block of kQueryBlockRows
// tokens both streams' rotated features over their denominators are built in a
// per-thread buffer, multiplied by their halves of the state straight into out
// (B, h, n, dv), any strides with a contiguous last dim: the readout rows are the
// outputs. With accumulate the products add onto what out holds; with gate
// ((B, n, h * dv), last dim contiguous) the rows are then multiplied by it.
void readout(const torch::Tensor& q, const torch::Tensor& signed_temps, const torch::Tensor& key_mean,
             const torch::Tensor& state, const c10::optional<torch::Tensor>& sin_lo,
             const c10::optional<torch::Tensor>& cos_lo, const c10::optional<torch::Tensor>& sin_hi,
             const c10::optional<torch::Tensor>& cos_hi, int64_t grid_width, double eps, torch::Tensor& out,
             bool accumulate, const c10::optional<torch::Tensor>& gate) {
    check_float_rows(q, "q", 4);
    const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3);
    check_query_inputs(signed_temps, key_mean, B, H, d);
    check_float_rows(out, "out", 4);
    const int64_t dv = out.size(3), half = dv / 2;
    TORCH_CHECK(out.size(0) == B && out.size(1) == H && out.size(2) == n && dv % 2 == 0,
                "out must be (B, h, n, dv), dv even");
    TORCH_CHECK(state.is_contiguous() && state.scalar_type() == torch::kFloat32 &&
                state.sizes() == torch::IntArrayRef({B, H, 2 * d, dv}), "state must be contiguous float32 (B, h, 2d, dv)");
    check_blas_stride(out.stride(2), "out");
    const float* gp = nullptr;
    int64_t g_s0 = 0, g_s1 = 0;
    if (gate.has_value()) {
        check_float_rows(*gate, "gate", 3);
        TORCH_CHECK(gate->size(0) == B && gate->size(1) == n && gate->size(2) == H * dv, "gate must be (B, n, h * dv)");
        gp = gate->data_ptr<float>();
        g_s0 = gate->stride(0);
        g_s1 = gate->stride(1);
    }
    const RopeTables rope = rope_tables(sin_lo, cos_lo, sin_hi, cos_hi, grid_width, 0, n, d);
    const float* qp = q.data_ptr<float>();
    const float* tp = signed_temps.data_ptr<float>();
    const float* mp = key_mean.data_ptr<float>();
    const float* sp = state.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t o_s0 = out.stride(0), o_s1 = out.stride(1), o_s2 = out.stride(2);
    const float epsf = static_cast<float>(eps);
    const int64_t blocks = (n + kQueryBlockRows - 1) / kQueryBlockRows;
    const bool vec = d % kLanes == 0;
    const PreparedRope prepared(vec ? rope : RopeTables{}, n, d);
    at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> feature(2 * d), rows_buf(kQueryBlockRows * 4 * d), products(kQueryBlockRows * dv),
            den(2 * kQueryBlockRows);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / blocks, block = task % blocks, b = bh / H, h = bh % H;
            const int64_t start = block * kQueryBlockRows, stop = std::min(n, start + kQueryBlockRows);
            for (int64_t i = start; i < stop; ++i) {
                const float* row = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
                float* target = rows_buf.data() + (i - start) * 4 * d;
                if (vec) {
                    const RopeRows rows = prepared.present ? prepared.rows(i) : RopeRows{};
                    query_row_vec(row, tp + h * 4 * d, mp + bh * 2 * d, prepared.present ? &rows : nullptr, d,
                                  epsf, target, den.data() + 2 * (i - start));
                } else {  // rows already divided by their denominators
                    const RopeRows rows = rope.present ? rope.rows(i) : RopeRows{};
                    query_row(row, tp + h * 4 * d, mp + bh * 2 * d, rope.present ? &rows : nullptr, d, epsf,
                              feature.data(), target);
                    den[2 * (i - start)] = den[2 * (i - start) + 1] = 1.0f;
                }
            }
            const float* s = sp + bh * 2 * d * dv;
            for (int64_t stream = 0; stream < 2; ++stream)  // (rows, dv/2) = phi_s rows @ S_s
                matmul_rows(false, false, stop - start, half, 2 * d, rows_buf.data() + stream * 2 * d, 4 * d,
                            s + stream * half, dv, 0.0f, products.data() + stream * half, dv);
            for (int64_t i = start; i < stop; ++i) {
                float* target = op + b * o_s0 + h * o_s1 + i * o_s2;
                const float* g = gp ? gp + b * g_s0 + i * g_s1 + h * dv : nullptr;
                for (int64_t stream = 0; stream < 2; ++stream)
                    finish_output_row(products.data() + (i - start) * dv + stream * half, den[2 * (i - start) + stream],
                                      half, accumulate, g ? g + stream * half : nullptr, target + stream * half);
            }
        }
    });
}

// ---- block-fused backward ----
// The two passes of ../cpu_backward.py per block of tokens on one thread: the feature
// rows are rebuilt in a per-thread buffer, multiplied there (sgemm) and finished row by
// row while in cache; no feature row, product or chunk reaches memory. Rows go through
// the vector forms where d is a multiple of kLanes, through the scalar ones otherwise
// (as in the chunked kernels).

// The query pass: per block of kQueryBlockRows tokens of (b, h), F_s = R(phi_s) / den_s,
// dS_s += F_s^T g_s, G_s = g_s S_s^T, then query_grad_row(_vec) per token (dq into grad_q).
// grad_out, out (B, h, n, dv); state (B, h, 2d, dv) contiguous. Returns the un-normalised
// dS (B, h, 2d, dv) and the partial sums of dm (B, h, splits, 2d) and of d(signed temps)
// (B, h, splits, 4, d).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> query_backward(
        const torch::Tensor& q, const torch::Tensor& signed_temps, const torch::Tensor& key_mean,
        const torch::Tensor& state, const c10::optional<torch::Tensor>& sin_lo,
        const c10::optional<torch::Tensor>& cos_lo, const c10::optional<torch::Tensor>& sin_hi,
        const c10::optional<torch::Tensor>& cos_hi, int64_t grid_width, double eps, const torch::Tensor& grad_out,
        const torch::Tensor& out, torch::Tensor& grad_q) {
    check_float_rows(q, "q", 4);
    const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3);
    check_query_inputs(signed_temps, key_mean, B, H, d);
    check_float_rows(grad_q, "grad_q", 4);
    const int64_t dv = check_output_rows(grad_out, out, B, H, n), half = dv / 2;
    TORCH_CHECK(grad_q.sizes() == q.sizes(), "grad_q must have the shape of q");
    TORCH_CHECK(state.is_contiguous() && state.scalar_type() == torch::kFloat32 &&
                state.sizes() == torch::IntArrayRef({B, H, 2 * d, dv}), "state must be contiguous float32 (B, h, 2d, dv)");
    check_blas_stride(grad_out.stride(2), "grad_out");
    const RopeTables rope = rope_tables(sin_lo, cos_lo, sin_hi, cos_hi, grid_width, 0, n, d);
    const bool vec = d % kLanes == 0;
    const PreparedRope prepared(vec ? rope : RopeTables{}, n, d);
    const int64_t BH = B * H, blocks = (n + kQueryBlockRows - 1) / kQueryBlockRows;
    const int64_t splits = block_splits(blocks, BH);
    auto partial_grad_state = torch::empty({BH, splits, 2 * d, dv}, q.options());
    auto grad_mean = torch::zeros({BH, splits, 2 * d}, q.options());
    auto grad_temps = torch::zeros({BH, splits, 4, d}, q.options());
    const float* qp = q.data_ptr<float>();
    const float* tp = signed_temps.data_ptr<float>();
    const float* mp = key_mean.data_ptr<float>();
    const float* sp = state.data_ptr<float>();
    const float* gp = grad_out.data_ptr<float>();
    const float* op = out.data_ptr<float>();
    float* dqp = grad_q.data_ptr<float>();
    float* dsp = partial_grad_state.data_ptr<float>();
    float* dmp = grad_mean.data_ptr<float>();
    float* dtp = grad_temps.data_ptr<float>();
    const float epsf = static_cast<float>(eps);
    at::parallel_for(0, BH * splits, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> feature(2 * d), grad_phi(2 * d), rows_buf(kQueryBlockRows * 4 * d),
            grad_rot(2 * kQueryBlockRows * 2 * d), den(2);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / splits, split = task % splits, b = bh / H, h = bh % H;
            const int64_t first = split * blocks / splits, last = (split + 1) * blocks / splits;
            const float* s = sp + bh * 2 * d * dv;
            for (int64_t block = first; block < last; ++block) {
                const int64_t start = block * kQueryBlockRows, stop = std::min(n, start + kQueryBlockRows);
                const int64_t rows = stop - start;
                const float* g = gp + b * grad_out.stride(0) + h * grad_out.stride(1) + start * grad_out.stride(2);
                for (int64_t i = start; i < stop; ++i) {
                    const float* q_row = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
                    float* target = rows_buf.data() + (i - start) * 4 * d;
                    if (vec) {
                        const RopeRows r = prepared.present ? prepared.rows(i) : RopeRows{};
                        query_row_vec(q_row, tp + h * 4 * d, mp + bh * 2 * d, prepared.present ? &r : nullptr, d,
                                      epsf, target, den.data());
                        scale_rows(target, 2 * d, den.data());
                    } else {
                        const RopeRows r = rope.present ? rope.rows(i) : RopeRows{};
                        query_row(q_row, tp + h * 4 * d, mp + bh * 2 * d, rope.present ? &r : nullptr, d, epsf,
                                  feature.data(), target);
                    }
                }
                for (int64_t stream = 0; stream < 2; ++stream) {
                    // dS_s (2d, dv/2) (+)= F_s^T g_s;  G_s (rows, 2d) = g_s S_s^T
                    matmul_rows(true, false, 2 * d, half, rows, rows_buf.data() + stream * 2 * d, 4 * d,
                                g + stream * half, grad_out.stride(2), block == first ? 0.0f : 1.0f,
                                dsp + task * 2 * d * dv + stream * half, dv);
                    matmul_rows(false, true, rows, 2 * d, half, g + stream * half, grad_out.stride(2),
                                s + stream * half, dv, 0.0f, grad_rot.data() + stream * kQueryBlockRows * 2 * d,
                                2 * d);
                }
                for (int64_t i = start; i < stop; ++i) {
                    const float* q_row = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
                    const float* g_row = gp + b * grad_out.stride(0) + h * grad_out.stride(1) + i * grad_out.stride(2);
                    const float* o_row = op + b * out.stride(0) + h * out.stride(1) + i * out.stride(2);
                    const float* rot_row = grad_rot.data() + (i - start) * 2 * d;
                    float* dq_row = dqp + b * grad_q.stride(0) + h * grad_q.stride(1) + i * grad_q.stride(2);
                    if (vec) {
                        const RopeRows r = prepared.present ? prepared.rows(i) : RopeRows{};
                        query_grad_row_vec(q_row, tp + h * 4 * d, mp + bh * 2 * d, prepared.present ? &r : nullptr,
                                           d, dv, epsf, g_row, o_row, rot_row, kQueryBlockRows * 2 * d,
                                           feature.data(), dq_row, dmp + task * 2 * d, dtp + task * 4 * d);
                    } else {
                        const RopeRows r = rope.present ? rope.rows(i) : RopeRows{};
                        query_grad_row(q_row, tp + h * 4 * d, mp + bh * 2 * d, rope.present ? &r : nullptr, d, dv,
                                       epsf, g_row, o_row, rot_row, kQueryBlockRows * 2 * d, feature.data(),
                                       grad_phi.data(), dq_row, dmp + task * 2 * d, dtp + task * 4 * d);
                    }
                }
            }
        }
    });
    auto grad_state = splits == 1 ? partial_grad_state.squeeze(1) : partial_grad_state.sum(1);
    return {grad_state.view({B, H, 2 * d, dv}), grad_mean.view({B, H, splits, 2 * d}),
            grad_temps.view({B, H, splits, 4, d})};
}

// The key pass: per block of kKeyBlockRows tokens of (b, h), F = R(phi_k),
// dv = F dS (straight into grad_v's rows), G = v dS^T, then key_grad_row(_vec) per token
// (dk into grad_k). grad_state (B, h, 2d, dv) and grad_mean (B, h, 2d), contiguous, are
// dS / n and dm / n.
void key_backward(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& grad_state,
                  const torch::Tensor& grad_mean, const c10::optional<torch::Tensor>& sin_lo,
                  const c10::optional<torch::Tensor>& cos_lo, const c10::optional<torch::Tensor>& sin_hi,
                  const c10::optional<torch::Tensor>& cos_hi, int64_t grid_width, torch::Tensor& grad_k,
                  torch::Tensor& grad_v) {
    check_float_rows(k, "k", 4);
    check_float_rows(v, "v", 4);
    check_float_rows(grad_k, "grad_k", 4);
    check_float_rows(grad_v, "grad_v", 4);
    const int64_t B = k.size(0), H = k.size(1), n = k.size(2), d = k.size(3), dv = v.size(3);
    TORCH_CHECK(v.size(0) == B && v.size(1) == H && v.size(2) == n, "v must be (B, h, n, dv) like k");
    TORCH_CHECK(grad_k.sizes() == k.sizes() && grad_v.sizes() == v.sizes(), "grad_k, grad_v must be shaped like k, v");
    TORCH_CHECK(grad_state.is_contiguous() && grad_state.scalar_type() == torch::kFloat32 &&
                grad_state.sizes() == torch::IntArrayRef({B, H, 2 * d, dv}),
                "grad_state must be contiguous float32 (B, h, 2d, dv)");
    TORCH_CHECK(grad_mean.is_contiguous() && grad_mean.scalar_type() == torch::kFloat32 &&
                grad_mean.sizes() == torch::IntArrayRef({B, H, 2 * d}), "grad_mean must be contiguous float32 (B, h, 2d)");
    check_blas_stride(v.stride(2), "v");
    check_blas_stride(grad_v.stride(2), "grad_v");
    const RopeTables rope = rope_tables(sin_lo, cos_lo, sin_hi, cos_hi, grid_width, 0, n, d);
    const bool vec = d % kLanes == 0;
    const PreparedRope prepared(vec ? rope : RopeTables{}, n, d);
    const int64_t blocks = (n + kKeyBlockRows - 1) / kKeyBlockRows;
    const float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    const float* dsp = grad_state.data_ptr<float>();
    const float* dmp = grad_mean.data_ptr<float>();
    float* dkp = grad_k.data_ptr<float>();
    float* dvp = grad_v.data_ptr<float>();
    at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> rows_buf(kKeyBlockRows * 2 * d), grad_rot(kKeyBlockRows * 2 * d), feature_sum(2 * d),
            feature(2 * d), grad_phi(2 * d);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t bh = task / blocks, block = task % blocks, b = bh / H, h = bh % H;
            const int64_t start = block * kKeyBlockRows, stop = std::min(n, start + kKeyBlockRows);
            const int64_t rows = stop - start;
            for (int64_t i = start; i < stop; ++i) {
                const float* k_row = kp + b * k.stride(0) + h * k.stride(1) + i * k.stride(2);
                float* target = rows_buf.data() + (i - start) * 2 * d;
                if (vec) {
                    const RopeRows r = prepared.present ? prepared.rows(i) : RopeRows{};
                    key_row_vec(k_row, prepared.present ? &r : nullptr, d, feature_sum.data(), target);
                } else {  // the forward checked the RoPE pairs: key_row's answer is not needed here
                    const RopeRows r = rope.present ? rope.rows(i) : RopeRows{};
                    key_row(k_row, rope.present ? &r : nullptr, d, feature.data(), feature_sum.data(), target);
                }
            }
            const float* ds = dsp + bh * 2 * d * dv;
            // dv rows (rows, dv) = F dS;  G (rows, 2d) = v dS^T
            matmul_rows(false, false, rows, dv, 2 * d, rows_buf.data(), 2 * d, ds, dv, 0.0f,
                        dvp + b * grad_v.stride(0) + h * grad_v.stride(1) + start * grad_v.stride(2),
                        grad_v.stride(2));
            matmul_rows(false, true, rows, 2 * d, dv, vp + b * v.stride(0) + h * v.stride(1) + start * v.stride(2),
                        v.stride(2), ds, dv, 0.0f, grad_rot.data(), 2 * d);
            for (int64_t i = start; i < stop; ++i) {
                const float* k_row = kp + b * k.stride(0) + h * k.stride(1) + i * k.stride(2);
                const float* rot_row = grad_rot.data() + (i - start) * 2 * d;
                float* dk_row = dkp + b * grad_k.stride(0) + h * grad_k.stride(1) + i * grad_k.stride(2);
                if (vec) {
                    const RopeRows r = prepared.present ? prepared.rows(i) : RopeRows{};
                    key_grad_row_vec(k_row, prepared.present ? &r : nullptr, d, rot_row, dmp + bh * 2 * d, dk_row);
                } else {
                    const RopeRows r = rope.present ? rope.rows(i) : RopeRows{};
                    key_grad_row(k_row, rope.present ? &r : nullptr, d, rot_row, dmp + bh * 2 * d, grad_phi.data(),
                                 dk_row);
                }
            }
        }
    });
}

}  // namespace

namespace polaformerpp {

void bind_pola_attention(pybind11::module_& m) {
    m.def("key_features", &key_features, "rotated key features, their token sum, RoPE pairs ok",
          py::arg("k"), py::arg("sin_lo"), py::arg("cos_lo"), py::arg("sin_hi"), py::arg("cos_hi"),
          py::arg("grid_width"), py::arg("offset"), py::arg("key_shifts") = py::none());
    m.def("query_features", &query_features, "rotated query features of both streams over their denominators",
          py::arg("q"), py::arg("signed_temps"), py::arg("key_mean"), py::arg("sin_lo"), py::arg("cos_lo"),
          py::arg("sin_hi"), py::arg("cos_hi"), py::arg("grid_width"), py::arg("offset"), py::arg("eps"),
          py::arg("log_rows") = py::none(), py::arg("log_mean_rows") = py::none(),
          py::arg("top_term_limit") = 0.0, py::arg("top_feature_limit") = 0.0);
    m.def("query_grads", &query_grads, "the query half of the backward: dq into grad_q, partial sums of dm and d(signed temps)",
          py::arg("q"), py::arg("signed_temps"), py::arg("key_mean"), py::arg("sin_lo"), py::arg("cos_lo"),
          py::arg("sin_hi"), py::arg("cos_hi"), py::arg("grid_width"), py::arg("offset"), py::arg("eps"),
          py::arg("grad_out"), py::arg("out"), py::arg("grad_rot"), py::arg("grad_q"));
    m.def("key_grads", &key_grads, "the key half of the backward: dk, written into grad_k", py::arg("k"), py::arg("sin_lo"),
          py::arg("cos_lo"), py::arg("sin_hi"), py::arg("cos_hi"), py::arg("grid_width"), py::arg("offset"),
          py::arg("grad_rot"), py::arg("grad_mean"), py::arg("grad_k"));
    m.def("abs_max", &abs_max, "max |t| (NaN when any element is NaN or infinite)", py::arg("t"));
    m.def("key_state", &key_state, "the fused key pass: state S, key mean, RoPE pairs ok", py::arg("k"),
          py::arg("v"), py::arg("sin_lo"), py::arg("cos_lo"), py::arg("sin_hi"), py::arg("cos_hi"),
          py::arg("grid_width"));
    m.def("query_backward", &query_backward,
          "the block-fused query pass of the backward: dq into grad_q; dS, partial sums of dm and d(signed temps)",
          py::arg("q"), py::arg("signed_temps"), py::arg("key_mean"), py::arg("state"), py::arg("sin_lo"),
          py::arg("cos_lo"), py::arg("sin_hi"), py::arg("cos_hi"), py::arg("grid_width"), py::arg("eps"),
          py::arg("grad_out"), py::arg("out"), py::arg("grad_q"));
    m.def("key_backward", &key_backward, "the block-fused key pass of the backward: dk and dv into grad_k, grad_v",
          py::arg("k"), py::arg("v"), py::arg("grad_state"), py::arg("grad_mean"), py::arg("sin_lo"),
          py::arg("cos_lo"), py::arg("sin_hi"), py::arg("cos_hi"), py::arg("grid_width"), py::arg("grad_k"),
          py::arg("grad_v"));
    m.def("readout", &readout, "the fused query pass, written into out", py::arg("q"), py::arg("signed_temps"),
          py::arg("key_mean"), py::arg("state"), py::arg("sin_lo"), py::arg("cos_lo"), py::arg("sin_hi"),
          py::arg("cos_hi"), py::arg("grid_width"), py::arg("eps"), py::arg("out"), py::arg("accumulate"),
          py::arg("gate") = py::none());
}

}  // namespace polaformerpp
