// The weight and bias gradients of a depthwise 2-D convolution (stride 1, zero
// padding) on channels-last CPU tensors, for the backbone's LePE and residual
// depthwise convolutions in training. oneDNN computes their input gradient fast,
// but falls back to a slow path for the weight gradient of these kernels (5x5
// above all), which dominated their backward.
//
//   grad_weight[c, i, j] = sum_{b, y, x} grad_out[b, c, y, x] * input[b, c, y + i - ph, x + j - pw]
//   grad_bias[c]         = sum_{b, y, x} grad_out[b, c, y, x]
//
// Per output row (b, y) and kLanes channels, each tap is one pass over the row's
// valid pixels with four independent accumulators; every thread sums into its
// own (kh, kw, C) buffer, added up at the end.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "kernels.h"
#include "vectors.h"

namespace polaformerpp {

namespace {

// One output row's contribution for channels [c0, c0 + 16): taps into acc (kh, kw, C), the
// gradient sum into bias_acc (C). Pointers are at channel c0 of pixel 0 of their rows;
// `gp`, `ip` are the strides between neighbouring pixels of the gradient and the input;
// in_rows[i] is input row y + i - ph or nullptr outside the image.
POLA_MULTIVERSION
void weight_grad_row(const float* grad, const float* const* in_rows, int64_t width, int64_t gp, int64_t ip,
                     int64_t kh, int64_t kw, int64_t pw, int64_t channels, float* acc, float* bias_acc) {
    vfloat bias = vfloat{};
    for (int64_t x = 0; x < width; ++x) bias += vload(grad + x * gp);
    vstore(bias_acc, vload(bias_acc) + bias);
    for (int64_t i = 0; i < kh; ++i) {
        const float* in = in_rows[i];
        if (in == nullptr) continue;
        for (int64_t j = 0; j < kw; ++j) {
            const int64_t shift = j - pw;  // input pixel x + shift
            const int64_t lo = std::max<int64_t>(0, -shift), hi = std::min(width, width - shift);
            vfloat a0 = vfloat{}, a1 = vfloat{}, a2 = vfloat{}, a3 = vfloat{};
            int64_t x = lo;
            for (; x + 4 <= hi; x += 4) {
                a0 += vload(grad + x * gp) * vload(in + (x + shift) * ip);
                a1 += vload(grad + (x + 1) * gp) * vload(in + (x + 1 + shift) * ip);
                a2 += vload(grad + (x + 2) * gp) * vload(in + (x + 2 + shift) * ip);
                a3 += vload(grad + (x + 3) * gp) * vload(in + (x + 3 + shift) * ip);
            }
            for (; x < hi; ++x) a0 += vload(grad + x * gp) * vload(in + (x + shift) * ip);
            float* out = acc + (i * kw + j) * channels;
            vstore(out, vload(out) + ((a0 + a1) + (a2 + a3)));
        }
    }
}

void check_channels_last(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name, " must be a float32 CPU tensor");
    TORCH_CHECK(t.dim() == 4 && t.stride(1) == 1, name, " must be (B, C, H, W) in channels-last memory");
}

}  // namespace

// grad_out and input (B, C, H, W), channel stride 1 (any other strides), C a multiple of kLanes, 'same' output size
// (stride 1, zero padding ph, pw with kh = 2 ph + 1, kw = 2 pw + 1).
// Returns grad_weight (C, 1, kh, kw) and grad_bias (C).
std::tuple<torch::Tensor, torch::Tensor> depthwise_conv_weight_grad(const torch::Tensor& grad_out,
                                                                    const torch::Tensor& input, int64_t kh,
                                                                    int64_t kw) {
    check_channels_last(grad_out, "grad_out");
    check_channels_last(input, "input");
    TORCH_CHECK(grad_out.sizes() == input.sizes(), "grad_out and input must have the same shape");
    const int64_t B = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
    TORCH_CHECK(C % kLanes == 0, "channels must be a multiple of ", kLanes, ", got ", C);
    TORCH_CHECK(kh > 0 && kw > 0 && kh % 2 == 1 && kw % 2 == 1, "kernel sizes must be odd");
    const int64_t ph = kh / 2, pw = kw / 2;
    const int64_t threads = at::get_num_threads();
    std::vector<float> acc(threads * kh * kw * C, 0.0f), bias_acc(threads * C, 0.0f);
    const float* gp = grad_out.data_ptr<float>();
    const float* xp = input.data_ptr<float>();
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
        const int tid = at::get_thread_num();
        float* my_acc = acc.data() + tid * kh * kw * C;
        float* my_bias = bias_acc.data() + tid * C;
        std::vector<const float*> in_rows(kh);
        for (int64_t row = begin; row < end; ++row) {
            const int64_t b = row / H, y = row % H;
            for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
                for (int64_t i = 0; i < kh; ++i) {
                    const int64_t yy = y + i - ph;
                    in_rows[i] = yy >= 0 && yy < H ? xp + b * input.stride(0) + yy * input.stride(2) + c0 : nullptr;
                }
                weight_grad_row(gp + b * grad_out.stride(0) + y * grad_out.stride(2) + c0, in_rows.data(), W,
                                grad_out.stride(3), input.stride(3), kh, kw, pw, C, my_acc + c0, my_bias + c0);
            }
        }
    });
    auto grad_weight = torch::zeros({kh * kw, C}, input.options());
    auto grad_bias = torch::zeros({C}, input.options());
    float* wp = grad_weight.data_ptr<float>();
    float* bp = grad_bias.data_ptr<float>();
    for (int64_t t = 0; t < threads; ++t) {
        for (int64_t e = 0; e < kh * kw * C; ++e) wp[e] += acc[t * kh * kw * C + e];
        for (int64_t c = 0; c < C; ++c) bp[c] += bias_acc[t * C + c];
    }
    // (kh * kw, C) -> (C, 1, kh, kw)
    return {grad_weight.t().contiguous().view({C, 1, kh, kw}), grad_bias};
}

void bind_depthwise(pybind11::module_& m) {
    m.def("depthwise_conv_weight_grad", &depthwise_conv_weight_grad,
          "weight and bias gradients of a stride-1 'same' depthwise conv on channels-last tensors",
          py::arg("grad_out"), py::arg("input"), py::arg("kh"), py::arg("kw"));
}

}  // namespace polaformerpp
