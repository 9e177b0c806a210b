// Argument checks shared by the CPU kernels: each names the parameter and what was expected.
#pragma once

#include <torch/extension.h>

namespace polaformerpp {

// A float32 CPU tensor of `dim` dims whose last dim is contiguous (other strides arbitrary).
inline void check_float_rows(const torch::Tensor& t, const char* name, int64_t dim) {
    TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32, got ", t.scalar_type());
    TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dims, got ", t.dim());
    TORCH_CHECK(t.stride(-1) == 1, name, " must have a contiguous last dim");
}

// A contiguous float32 CPU vector of `size` values (per-channel or per-sample factors).
inline void check_float_vector(const torch::Tensor& t, const char* name, int64_t size) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.dim() == 1 && t.size(0) == size &&
                    t.is_contiguous(),
                name, " must be a contiguous float32 CPU tensor of ", size, " values");
}

}  // namespace polaformerpp
