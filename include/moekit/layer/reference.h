// An independent float64 recomputation of sampled rows of a MoELayer's forward, for checks (the
// CLI's `moekit run`, tests). It reads only the experts the rows use (MoELayer::
// expert_reference: one expert at a time, back in the standard layout, dequantized) and the
// shared experts.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "moekit/layer/moe_layer.h"
#include "moekit/router/router.h"

namespace moekit {

// Rows `rows` of layer.forward(x, .) with the given routing (x (M, H), routing ids/weights (M, k),
// all on the CPU; ids are global, experts outside this rank contribute nothing): float64
// accumulation over the dequantized weights; the scheme's activation quantization applied as the
// layer's QuantConfig says (a dynamic per-tensor scale of the intermediate is taken over the
// sampled rows only); GEMM1 outputs and the intermediate rounded to x's dtype, as stored.
// The shared experts are added (on the EP rank that adds them). Returns (rows.size(), H)
// row-major.
// `all_experts`: where global expert e's weights come from when the rows' experts are not all on
// this rank (f32 host, standard layout; e.g. MoELayer::random_expert) — a DP+EP rank's tokens
// visit every rank's experts. Then every routed id counts, not only the local ones (unquantized
// layers only).
using ExpertSource = std::function<ExpertWeights(int64_t global_expert)>;
std::vector<double> reference_forward(const MoELayer& layer, const Tensor& x,
                                      const RoutingResult& routing,
                                      const std::vector<int64_t>& rows,
                                      const ExpertSource& all_experts = {});

// ||out[rows] - ref|| / ||ref||, with out (M, H) on the CPU and ref from reference_forward.
// NaN when either holds a NaN or an infinity (so a check that compares it with a tolerance fails).
double relative_error(const Tensor& out, const std::vector<double>& ref,
                      const std::vector<int64_t>& rows);

}  // namespace moekit
