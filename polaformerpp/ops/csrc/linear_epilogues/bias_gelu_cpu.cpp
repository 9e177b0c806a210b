// The exact (erf) GELU of a matrix product's output plus a per-channel bias, forward
// and backward, for the FFN's first layer in training on the CPU:
//
//   forward   y  = gelu(h + b)                       one pass over the product h
//   backward  dh = dy * gelu'(h + b),  db = sum dh   one pass, the bias gradient summed on the way
//
// (torch: a bias copy before the product, a GELU pass after it, and in the backward a
// GELU-gradient pass and a separate column sum.) With x = h + b:
//
//   gelu(x)  = x Phi(x),          Phi(x) = (1 + erf(x / sqrt2)) / 2
//   gelu'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
//
// erf by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7), whose factor
// exp(-z^2) at z = |x| / sqrt2 is phi's exponential: one exp per element serves both.
// For x < 0, Phi(x) = (1 - erf(|x| / sqrt2)) / 2 is formed directly from that tail
// (no cancellation in 1 + erf).
//
// Shapes: h, dy (rows, C) with channels at stride 1 (rows at any stride); b (C) or none.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "checks.h"
#include "kernels.h"
#include "vectors.h"

namespace polaformerpp {

namespace {

// The GELU rows run on 16 lanes (two ymm registers with AVX2, one zmm with AVX-512):
// the formula is long enough for the width to pay. Its lane masks come from sign bits
// (an arithmetic shift) and its selects are bit operations: 16-lane compares and `?:`
// compile to scalar code with branches for AVX2.
typedef float wfloat __attribute__((vector_size(64)));
typedef int32_t wint __attribute__((vector_size(64)));
constexpr int64_t kWide = 16;

POLA_INLINE wfloat wload(const float* p) {
    wfloat x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
POLA_INLINE void wstore(float* p, wfloat x) { std::memcpy(p, &x, sizeof x); }
// mask ? a : b, lane by lane (mask lanes all ones or all zeros)
POLA_INLINE wfloat select(wint mask, wfloat a, wfloat b) {
    return (wfloat)(((wint)a & mask) | ((wint)b & ~mask));
}
// all ones where the sign bit of x is set (x < 0, and -0), zeros elsewhere
POLA_INLINE wint sign_mask(wfloat x) { return (wint)x >> 31; }

// exp(a) for a <= 0 (0 below -87, where it leaves the normal range; NaN propagates):
// Cody-Waite reduction a = k ln2 + r, the integer k rounded by adding 1.5 * 2^23, and
// the degree-7 polynomial for expm1(r).
POLA_INLINE wfloat wexp_nonpos(wfloat a) {
    const wfloat zero = wfloat{}, magic = zero + 12582912.0f;
    const wint low = sign_mask(a + 87.0f);  // a < -87
    const wfloat x = select(low, zero - 87.0f, a);
    const wfloat t = x * 1.4426950408889634f + magic;
    const wfloat kf = t - magic;
    wfloat r = x - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    const wfloat scale = (wfloat)((((wint)t - (wint)magic) + 127) << 23);
    return (wfloat)((wint)(scale * (expm1_reduced(r) + 1.0f)) & ~low);
}

// Phi(x) and phi(x), lane by lane.
POLA_INLINE void normal_cdf_pdf(wfloat x, wfloat& cdf, wfloat& pdf) {
    const wint sign = (wint)x & (wint{} + INT32_MIN);
    const wfloat ax = (wfloat)((wint)x ^ sign);
    // t = 1 / (1 + p z) with z = |x| / sqrt2
    const wfloat t = 1.0f / (1.0f + (0.3275911f * 0.7071067811865476f) * ax);
    const wfloat poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t +
                         0.254829592f) * t;
    const wfloat g = wexp_nonpos(-0.5f * x * x);
    const wfloat half_tail = 0.5f * poly * g;  // (1 - erf(z)) / 2
    cdf = select(sign_mask(x), half_tail, 1.0f - half_tail);  // (-0: both are 1/2)
    pdf = g * 0.3989422804014327f;
}

POLA_INLINE wfloat load_bias(const float* bias, int64_t c) { return bias ? wload(bias + c) : wfloat{}; }

// One row: y = gelu(h + b); `count` channels, a multiple of kWide.
POLA_MULTIVERSION
void gelu_row(const float* h, const float* bias, int64_t count, float* y) {
    for (int64_t c = 0; c < count; c += kWide) {
        const wfloat x = wload(h + c) + load_bias(bias, c);
        wfloat cdf, pdf;
        normal_cdf_pdf(x, cdf, pdf);
        wstore(y + c, x * cdf);
    }
}

// One row: dh = dy * gelu'(h + b), added into bias_acc when given.
POLA_MULTIVERSION
void gelu_grad_row(const float* dy, const float* h, const float* bias, int64_t count, float* dh, float* bias_acc) {
    for (int64_t c = 0; c < count; c += kWide) {
        const wfloat x = wload(h + c) + load_bias(bias, c);
        wfloat cdf, pdf;
        normal_cdf_pdf(x, cdf, pdf);
        const wfloat g = wload(dy + c) * (cdf + x * pdf);
        wstore(dh + c, g);
        if (bias_acc) wstore(bias_acc + c, wload(bias_acc + c) + g);
    }
}

// The rows' last C % kWide channels go through zero-padded lane buffers.
struct Tail {
    float h[kWide] = {}, b[kWide] = {}, dy[kWide] = {}, out[kWide] = {};
};

const float* bias_data(const c10::optional<torch::Tensor>& bias, int64_t C) {
    if (!bias.has_value()) return nullptr;
    check_float_vector(*bias, "bias", C);
    return bias->data_ptr<float>();
}

constexpr int64_t kGrainRows = 16;

}  // namespace

torch::Tensor bias_gelu(const torch::Tensor& h, const c10::optional<torch::Tensor>& bias) {
    check_float_rows(h, "h", 2);
    const int64_t rows = h.size(0), C = h.size(1), body = C / kWide * kWide;
    const float* b = bias_data(bias, C);
    auto y = torch::empty({rows, C}, h.options());
    const float* hp = h.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t hs = h.stride(0);
    at::parallel_for(0, rows, kGrainRows, [&](int64_t begin, int64_t end) {
        Tail tail;
        for (int64_t r = begin; r < end; ++r) {
            gelu_row(hp + r * hs, b, body, yp + r * C);
            if (body == C) continue;
            std::copy(hp + r * hs + body, hp + r * hs + C, tail.h);
            if (b) std::copy(b + body, b + C, tail.b);
            gelu_row(tail.h, tail.b, kWide, tail.out);
            std::copy(tail.out, tail.out + (C - body), yp + r * C + body);
        }
    });
    return y;
}

std::tuple<torch::Tensor, c10::optional<torch::Tensor>> bias_gelu_backward(
        const torch::Tensor& grad_y, const torch::Tensor& h, const c10::optional<torch::Tensor>& bias,
        bool bias_grad) {
    check_float_rows(grad_y, "grad_y", 2);
    check_float_rows(h, "h", 2);
    TORCH_CHECK(grad_y.sizes() == h.sizes(), "grad_y and h must have the same shape");
    const int64_t rows = h.size(0), C = h.size(1), body = C / kWide * kWide;
    const float* b = bias_data(bias, C);
    auto grad_h = torch::empty({rows, C}, h.options());
    const float* gp = grad_y.data_ptr<float>();
    const float* hp = h.data_ptr<float>();
    float* op = grad_h.data_ptr<float>();
    const int64_t gs = grad_y.stride(0), hs = h.stride(0);
    const int64_t threads = at::get_num_threads(), padded = body + (body == C ? 0 : kWide);
    std::vector<float> acc(bias_grad ? threads * padded : 0, 0.0f);
    at::parallel_for(0, rows, kGrainRows, [&](int64_t begin, int64_t end) {
        float* my_acc = bias_grad ? acc.data() + at::get_thread_num() * padded : nullptr;
        Tail tail;
        for (int64_t r = begin; r < end; ++r) {
            gelu_grad_row(gp + r * gs, hp + r * hs, b, body, op + r * C, my_acc);
            if (body == C) continue;
            std::copy(gp + r * gs + body, gp + r * gs + C, tail.dy);
            std::copy(hp + r * hs + body, hp + r * hs + C, tail.h);
            if (b) std::copy(b + body, b + C, tail.b);
            gelu_grad_row(tail.dy, tail.h, tail.b, kWide, tail.out, my_acc ? my_acc + body : nullptr);
            std::copy(tail.out, tail.out + (C - body), op + r * C + body);
        }
    });
    c10::optional<torch::Tensor> grad_bias;
    if (bias_grad) {
        grad_bias = torch::zeros({C}, h.options());
        float* bp = grad_bias->data_ptr<float>();
        for (int64_t t = 0; t < threads; ++t)
            for (int64_t c = 0; c < C; ++c) bp[c] += acc[t * padded + c];
    }
    return {grad_h, grad_bias};
}

void bind_bias_gelu(pybind11::module_& m) {
    m.def("bias_gelu", &bias_gelu, "y = gelu(h + bias) (exact erf form) for (rows, C) h",
          py::arg("h"), py::arg("bias") = py::none());
    m.def("bias_gelu_backward", &bias_gelu_backward,
          "dh = dy * gelu'(h + bias), and the bias gradient (its column sums) when asked", py::arg("grad_y"),
          py::arg("h"), py::arg("bias") = py::none(), py::arg("bias_grad") = false);
}

}  // namespace polaformerpp
