// The bindings of each op's kernels: every op folder defines its bind_* function,
// extension.cpp puts them all into one Python module (polaformerpp.ops._C).
#pragma once

#include <torch/extension.h>

namespace polaformerpp {

// pola_attention/: the fused CPU feature maps, passes and backward of the polarity-aware attention
void bind_pola_attention(pybind11::module_& m);
// depthwise/: the weight and bias gradients of a 'same' depthwise conv on channels-last tensors
void bind_depthwise(pybind11::module_& m);
// linear_epilogues/: bias + GELU, and bias + layer scale + residual, after a product (with backward)
void bind_bias_gelu(pybind11::module_& m);
void bind_scaled_residual(pybind11::module_& m);

}  // namespace polaformerpp
