#include "moekit/oracle/make_moe_kernel.h"

#include <fmt/format.h>

#include <utility>

#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/prepare_finalize/factory.h"

namespace moekit {

std::unique_ptr<FusedMoEKernel> assemble_moe_kernel(
    const QuantConfig& quant, const MoEConfig& moe, const ExpertsClass& experts_class,
    std::unique_ptr<PrepareFinalize> prepare_finalize,
    std::shared_ptr<SharedExperts> shared_experts, std::string_view experts_log) {
  MOEKIT_CHECK(prepare_finalize != nullptr, "make_moe_kernel: no prepare/finalize for {}",
               experts_class.name());
  const ActivationFormat pf_format = prepare_finalize->activation_format();
  if (experts_class.activation_format() != pf_format) {
    throw Error(fmt::format("{} expects {} activations but the selected prepare/finalize uses {}",
                            experts_class.name(),
                            activation_format_name(experts_class.activation_format()),
                            activation_format_name(pf_format)));
  }
  log::info_once("Using " + prepare_finalize->name());
  if (!experts_log.empty()) {
    log::info_once(fmt::format(fmt::runtime(experts_log), experts_class.name()));
  }

  std::optional<int64_t> max_num_tokens;
  std::optional<int> num_dispatchers;
  if (is_batched(pf_format)) {
    max_num_tokens = prepare_finalize->max_num_tokens_per_rank();
    MOEKIT_CHECK(max_num_tokens.has_value(),
                 "batched prepare/finalize {} does not report max_num_tokens_per_rank",
                 prepare_finalize->name());
    num_dispatchers = prepare_finalize->num_dispatchers();
  }
  std::unique_ptr<Experts> experts =
      experts_class.make(moe, quant, max_num_tokens, num_dispatchers);
  MOEKIT_CHECK(experts != nullptr, "experts class {} returned no experts", experts_class.name());
  experts->bind_communicator(prepare_finalize->communicator());
  return std::make_unique<FusedMoEKernel>(std::move(prepare_finalize), std::move(experts),
                                          std::move(shared_experts), moe.parallel);
}

std::unique_ptr<FusedMoEKernel> make_moe_kernel(const QuantConfig& quant, const MoEConfig& moe,
                                                const ExpertsClass& experts_class,
                                                std::shared_ptr<SharedExperts> shared_experts,
                                                std::string_view experts_log, Communicator* comm) {
  const PrepareFinalizeRequest request{&moe, &quant, &experts_class, comm};
  const PrepareFinalizeSelection pf = select_prepare_finalize(request);
  if (!pf.chosen) throw Error(pf.report.error);
  return assemble_moe_kernel(quant, moe, experts_class, pf.chosen->make(request),
                             std::move(shared_experts), experts_log);
}

}  // namespace moekit
