#include <iostream>
#include <random>

#include "moekit/core/tolerance.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/layer/reference.h"

int main() {
  moekit::MoELayerOptions opt;             // bf16, no parallelism, backend "auto"
  opt.device = moekit::cpu_device_info();  // or moekit::default_device_info(): the GPU if any
  const moekit::ModelPreset& model = moekit::find_preset("tiny");
  moekit::MoELayer layer(model, moekit::MoELayer::random_weights(model, opt, /*seed=*/0), opt);
  std::cout << layer.plan().to_string();  // the experts backend, the weight layout, and why

  const int64_t M = 5;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> xs(M * model.hidden_size), ls(M * model.num_experts);
  for (float& v : xs)
    v = u(rng);
  for (float& v : ls)
    v = u(rng);
  const auto x = moekit::Tensor::from_floats(xs, {M, model.hidden_size}, opt.dtype);
  const auto logits = moekit::Tensor::from_floats(ls, {M, model.num_experts}, moekit::DType::kF32);
  const moekit::Tensor y = layer.forward(x, logits);  // (M, H)

  // Checked against the library's float64 recomputation of the same rows.
  const std::vector<int64_t> rows = {0, 1, 2, 3, 4};
  const auto routing = layer.router().select_experts(x, logits);
  const double err =
      moekit::relative_error(y, moekit::reference_forward(layer, x, routing, rows), rows);
  const double tol = moekit::tolerance(layer.tolerance_name()).rel_l2;
  std::cout << "y " << y.describe() << ", relative error " << err << " (tolerance " << tol << ")\n";
  return err <= tol && layer.plan().ok() ? 0 : 1;
}
