// make_moe_kernel: the step every oracle runs once its experts class is chosen. It builds the
// prepare/finalize for the deployment's parallel config (the factory of prepare_finalize/
// factory.h), checks that the two parts agree on the activation format, passes max tokens /
// dispatchers to batched experts, constructs the experts and returns the FusedMoEKernel.
#pragma once

#include <memory>
#include <string_view>

#include "moekit/comm/communicator.h"
#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/modular/experts.h"
#include "moekit/modular/kernel.h"
#include "moekit/modular/prepare_finalize.h"
#include "moekit/modular/types.h"

namespace moekit {

// Builds the kernel for `experts_class` with the prepare/finalize select_prepare_finalize chooses
// for the deployment (`comm` for deployments that exchange tokens). Throws moekit::Error with the
// prepare/finalize table's error when none fits, and when the prepare/finalize's activation
// format differs from the experts' ("<Experts> expects <fmt> activations but the selected
// prepare/finalize uses <fmt>"). Logs "Using <prepare/finalize name>" once, and `experts_log`
// once when given, with "{}" replaced by the experts class name (e.g. "Using {} MoE experts").
std::unique_ptr<FusedMoEKernel> make_moe_kernel(
    const QuantConfig& quant, const MoEConfig& moe, const ExpertsClass& experts_class,
    std::shared_ptr<SharedExperts> shared_experts = nullptr, std::string_view experts_log = {},
    Communicator* comm = nullptr);

// make_moe_kernel with an already built prepare/finalize (tests, custom communicators): the same
// format check, logging and batched arguments.
std::unique_ptr<FusedMoEKernel> assemble_moe_kernel(
    const QuantConfig& quant, const MoEConfig& moe, const ExpertsClass& experts_class,
    std::unique_ptr<PrepareFinalize> prepare_finalize,
    std::shared_ptr<SharedExperts> shared_experts = nullptr, std::string_view experts_log = {});

}  // namespace moekit
