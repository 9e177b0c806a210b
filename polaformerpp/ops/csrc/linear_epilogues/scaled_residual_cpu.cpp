// The layer-scale residual after a block's output product, with the product's bias,
// forward and backward, for CPU training:
//
//   forward   out = x + s_b gamma (h + bias)           one pass over the product h
//   backward  dh  = s_b gamma dy,  dbias = sum dh,
//             dgamma = sum s_b dy (h + bias)            one pass, both sums on the way
//
// s_b is the stochastic-depth scale of sample b (0 or 1 / keep probability; 1 without
// it). (torch: a bias copy before the product; in the backward the two products of
// addcmul's gradient, their broadcast sum and the product's separate bias sum.)
//
// Shapes: x, h, dy (rows, C), channels at stride 1 (rows at any stride); bias and gamma
// (C); sample_scale (B) or none, rows_per_sample = rows / B.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <tuple>
#include <vector>

#include "checks.h"
#include "kernels.h"
#include "vectors.h"

namespace polaformerpp {

namespace {

// s_b of row r (1 without stochastic depth)
struct SampleScale {
    const float* scale;
    int64_t rows_per_sample;
    float operator()(int64_t row) const { return scale ? scale[row / rows_per_sample] : 1.0f; }
};

SampleScale sample_scale_of(const c10::optional<torch::Tensor>& sample_scale, int64_t rows_per_sample,
                            int64_t rows) {
    if (!sample_scale.has_value()) return {nullptr, 1};
    TORCH_CHECK(rows_per_sample > 0 && rows % rows_per_sample == 0, "rows_per_sample must divide the rows");
    check_float_vector(*sample_scale, "sample_scale", rows / rows_per_sample);
    return {sample_scale->data_ptr<float>(), rows_per_sample};
}

POLA_MULTIVERSION
void residual_row(const float* x, const float* h, const float* bias, const float* gamma, float s, int64_t C,
                  float* out) {
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes)
        vstore(out + c, vload(x + c) + s * vload(gamma + c) * (vload(h + c) + vload(bias + c)));
    for (; c < C; ++c) out[c] = x[c] + s * gamma[c] * (h[c] + bias[c]);
}

POLA_MULTIVERSION
void residual_grad_row(const float* dy, const float* h, const float* bias, const float* gamma, float s, int64_t C,
                       float* dh, float* bias_acc, float* gamma_acc) {
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes) {
        const vfloat g = s * vload(dy + c);
        const vfloat d = g * vload(gamma + c);
        vstore(dh + c, d);
        vstore(bias_acc + c, vload(bias_acc + c) + d);
        vstore(gamma_acc + c, vload(gamma_acc + c) + g * (vload(h + c) + vload(bias + c)));
    }
    for (; c < C; ++c) {
        const float g = s * dy[c], d = g * gamma[c];
        dh[c] = d;
        bias_acc[c] += d;
        gamma_acc[c] += g * (h[c] + bias[c]);
    }
}

// The checks shared by both passes: `rows_in` (x or the gradient) and h (rows, C) alike,
// bias and gamma (C), sample_scale (rows / rows_per_sample) or none.
SampleScale check_residual_args(const torch::Tensor& rows_in, const char* name, const torch::Tensor& h,
                                const torch::Tensor& bias, const torch::Tensor& gamma,
                                const c10::optional<torch::Tensor>& sample_scale, int64_t rows_per_sample) {
    check_float_rows(rows_in, name, 2);
    check_float_rows(h, "h", 2);
    TORCH_CHECK(rows_in.sizes() == h.sizes(), name, " and h must have the same shape");
    check_float_vector(bias, "bias", h.size(1));
    check_float_vector(gamma, "gamma", h.size(1));
    return sample_scale_of(sample_scale, rows_per_sample, h.size(0));
}

constexpr int64_t kGrainRows = 16;

}  // namespace

// Writes into `out` when given (rows, C) contiguous, which may be h itself (in place), else into a new tensor.
torch::Tensor scaled_residual(const torch::Tensor& x, const torch::Tensor& h, const torch::Tensor& bias,
                              const torch::Tensor& gamma, const c10::optional<torch::Tensor>& sample_scale,
                              int64_t rows_per_sample, const c10::optional<torch::Tensor>& out_opt) {
    const SampleScale scale = check_residual_args(x, "x", h, bias, gamma, sample_scale, rows_per_sample);
    const int64_t rows = h.size(0), C = h.size(1);
    torch::Tensor out;
    if (out_opt.has_value()) {
        out = *out_opt;
        TORCH_CHECK(out.is_contiguous() && out.scalar_type() == torch::kFloat32 && out.sizes() == h.sizes(),
                    "out must be a contiguous float32 tensor shaped like h");
    } else {
        out = torch::empty({rows, C}, h.options());
    }
    const float *xp = x.data_ptr<float>(), *hp = h.data_ptr<float>();
    const float *bp = bias.data_ptr<float>(), *gp = gamma.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, rows, kGrainRows, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            residual_row(xp + r * x.stride(0), hp + r * h.stride(0), bp, gp, scale(r), C, op + r * C);
    });
    return out;
}

// Returns dh (rows, C), dbias (C) and dgamma (C).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> scaled_residual_backward(
        const torch::Tensor& grad, const torch::Tensor& h, const torch::Tensor& bias, const torch::Tensor& gamma,
        const c10::optional<torch::Tensor>& sample_scale, int64_t rows_per_sample) {
    const SampleScale scale = check_residual_args(grad, "grad", h, bias, gamma, sample_scale, rows_per_sample);
    const int64_t rows = h.size(0), C = h.size(1);
    auto grad_h = torch::empty({rows, C}, h.options());
    const float *dp = grad.data_ptr<float>(), *hp = h.data_ptr<float>();
    const float *bp = bias.data_ptr<float>(), *gp = gamma.data_ptr<float>();
    float* op = grad_h.data_ptr<float>();
    const int64_t threads = at::get_num_threads();
    std::vector<float> acc(threads * 2 * C, 0.0f);  // per thread: bias sums, gamma sums
    at::parallel_for(0, rows, kGrainRows, [&](int64_t begin, int64_t end) {
        float* my_acc = acc.data() + at::get_thread_num() * 2 * C;
        for (int64_t r = begin; r < end; ++r)
            residual_grad_row(dp + r * grad.stride(0), hp + r * h.stride(0), bp, gp, scale(r), C, op + r * C,
                              my_acc, my_acc + C);
    });
    auto grad_bias = torch::zeros({C}, h.options());
    auto grad_gamma = torch::zeros({C}, h.options());
    float *gbp = grad_bias.data_ptr<float>(), *ggp = grad_gamma.data_ptr<float>();
    for (int64_t t = 0; t < threads; ++t) {
        for (int64_t c = 0; c < C; ++c) {
            gbp[c] += acc[t * 2 * C + c];
            ggp[c] += acc[t * 2 * C + C + c];
        }
    }
    return {grad_h, grad_bias, grad_gamma};
}

void bind_scaled_residual(pybind11::module_& m) {
    m.def("scaled_residual", &scaled_residual, "out = x + s_b gamma (h + bias) for (rows, C) x, h",
          py::arg("x"), py::arg("h"), py::arg("bias"), py::arg("gamma"), py::arg("sample_scale") = py::none(),
          py::arg("rows_per_sample") = 1, py::arg("out") = py::none());
    m.def("scaled_residual_backward", &scaled_residual_backward,
          "dh = s_b gamma dy and the column sums dbias = sum dh, dgamma = sum s_b dy (h + bias)", py::arg("grad"),
          py::arg("h"), py::arg("bias"), py::arg("gamma"), py::arg("sample_scale") = py::none(),
          py::arg("rows_per_sample") = 1);
}

}  // namespace polaformerpp
