// make_moe_kernel: the step every oracle runs once its experts class is chosen. It builds the
// prepare/finalize for the deployment's parallel config, checks that the two parts agree on the
// activation format, passes max tokens / dispatchers to batched experts, constructs the experts and
// returns the FusedMoEKernel.
#pragma once

#include <memory>
#include <string_view>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/modular/experts.h"
#include "moekit/modular/kernel.h"
#include "moekit/modular/prepare_finalize.h"
#include "moekit/modular/types.h"

namespace moekit {

// The prepare/finalize for `moe`'s parallel config:
//   - a single rank (no all-to-all, no DP) whose experts want BatchedExperts:
//     PrepareFinalizeBatched(max_num_tokens = moe.max_num_tokens, moe.num_local_experts,
//     num_dispatchers = 1, rank = moe.parallel.ep_rank);
//   - a single rank otherwise: PrepareFinalizeNoEP, or PrepareFinalizeMonolithicNoEP for
//     monolithic experts;
//   - any deployment that moves tokens between ranks (DP+EP, the batched low-latency all-to-all,
//     the megakernel): moekit::Error "... is not available yet" (the EP communicators come later).
// Monolithic experts with the batched format are an error.
std::unique_ptr<PrepareFinalize> maybe_make_prepare_finalize(const MoEConfig& moe,
                                                             const QuantConfig& quant,
                                                             ActivationFormat wanted_by_experts,
                                                             bool monolithic);

// Builds the kernel for `experts_class`. Throws moekit::Error when the prepare/finalize's
// activation format differs from the experts' ("<Experts> expects <fmt> activations but the
// selected prepare/finalize uses <fmt>"). Logs "Using <prepare/finalize name>" once, and
// `experts_log` once when given, with "{}" replaced by the experts class name (e.g. "Using {} MoE
// experts").
std::unique_ptr<FusedMoEKernel> make_moe_kernel(
    const QuantConfig& quant, const MoEConfig& moe, const ExpertsClass& experts_class,
    std::shared_ptr<SharedExperts> shared_experts = nullptr, std::string_view experts_log = {});

// make_moe_kernel with an already built prepare/finalize (tests, custom communicators): the same
// format check, logging and batched arguments.
std::unique_ptr<FusedMoEKernel> assemble_moe_kernel(
    const QuantConfig& quant, const MoEConfig& moe, const ExpertsClass& experts_class,
    std::unique_ptr<PrepareFinalize> prepare_finalize,
    std::shared_ptr<SharedExperts> shared_experts = nullptr, std::string_view experts_log = {});

}  // namespace moekit
