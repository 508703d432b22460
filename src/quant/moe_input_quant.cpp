#include "moekit/quant/moe_input_quant.h"

#include "moekit/core/error.h"

namespace moekit {

QuantizedInput quantize_moe_input(const Tensor& a, const QuantDesc& desc, RunContext ctx) {
  if (desc.dtype == QuantDType::kNone) return {a, Tensor{}};
  throw UnsupportedError(fmt::format(
      "quantize_moe_input: quantizing the MoE input {} to {} (group {}) is not implemented yet; "
      "only unquantized activations (kNone) are supported",
      a.describe(), quant_dtype_name(desc.dtype), desc.shape.to_string()));
}

}  // namespace moekit
