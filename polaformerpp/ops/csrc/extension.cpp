// The project's one compiled extension, polaformerpp.ops._C: the kernels of every op,
// laid out by op (pola_attention/, depthwise/, linear_epilogues/; shared headers in include/).
// polaformerpp/ops/library.py loads it and registers the kernels as torch custom ops.
#include <torch/extension.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "Fused CPU kernels of PolaFormer++ (attention, depthwise conv, linear epilogues)";
    polaformerpp::bind_pola_attention(m);
    polaformerpp::bind_depthwise(m);
    polaformerpp::bind_bias_gelu(m);
    polaformerpp::bind_scaled_residual(m);
}
