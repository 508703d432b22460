#include "moekit/config/quant_config.h"

#include <fmt/format.h>

namespace moekit {

QuantConfig QuantConfig::unquantized() {
  return QuantConfig{};
}

QuantConfig QuantConfig::biased(const Tensor& w1_bias, const Tensor& w2_bias) {
  QuantConfig config;
  config.w1.bias = w1_bias;
  config.w2.bias = w2_bias;
  return config;
}

std::vector<int64_t> QuantConfig::block_shape() const {
  if (w1.shape.row > 1 && w1.shape.col > 1) return {w1.shape.row, w1.shape.col};
  return {};
}

std::string QuantConfig::describe() const {
  if (!is_quantized()) return has_bias() ? "unquantized (biased)" : "unquantized";
  std::string w = std::string(quant_dtype_name(w1.dtype));
  std::string a = a1.dtype == QuantDType::kNone ? std::string("act_dtype")
                                                : std::string(quant_dtype_name(a1.dtype));
  return fmt::format("w:{} ({}) x a:{} ({})", w, w1.shape.to_string(), a, a1.shape.to_string());
}

}  // namespace moekit
