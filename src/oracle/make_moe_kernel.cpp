#include "moekit/oracle/make_moe_kernel.h"

#include <fmt/format.h>

#include <utility>

#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/prepare_finalize/no_ep.h"

namespace moekit {

std::unique_ptr<PrepareFinalize> maybe_make_prepare_finalize(const MoEConfig& moe,
                                                             const QuantConfig& quant,
                                                             ActivationFormat wanted_by_experts,
                                                             bool monolithic) {
  const ParallelConfig& p = moe.parallel;
  const bool no_dispatch = !p.use_all2all_kernels() && !p.use_megakernel() && p.dp_size == 1 &&
                           p.pcp_size == 1 && p.sp_size == 1;
  // NOTE: a multi-rank batched deployment needs the low-latency all-to-all; a local scatter would
  // silently drop the tokens routed to other ranks' experts, so it is refused until that lands.
  if (p.use_batched_activation_format()) {
    throw Error(fmt::format(
        "prepare/finalize for {} is not available yet (the batched low-latency all-to-all between "
        "ranks is not implemented)",
        p.to_string()));
  }
  const bool batched = no_dispatch && is_batched(wanted_by_experts);
  if (batched) {
    MOEKIT_CHECK(!monolithic,
                 "monolithic experts take the standard activation format, but the deployment "
                 "({}) uses the batched format",
                 p.to_string());
    MOEKIT_CHECK(moe.max_num_tokens > 0 && moe.num_local_experts > 0,
                 "the batched prepare/finalize needs max_num_tokens > 0 and num_local_experts > 0 "
                 "but got max_num_tokens={}, num_local_experts={}",
                 moe.max_num_tokens, moe.num_local_experts);
    return std::make_unique<PrepareFinalizeBatched>(moe.max_num_tokens, moe.num_local_experts,
                                                    /*num_dispatchers=*/1, /*rank=*/p.ep_rank);
  }
  if (no_dispatch) {
    if (monolithic) return std::make_unique<PrepareFinalizeMonolithicNoEP>();
    return std::make_unique<PrepareFinalizeNoEP>();
  }
  (void)quant;
  throw Error(fmt::format("prepare/finalize for {} is not available yet", p.to_string()));
}

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
  return std::make_unique<FusedMoEKernel>(std::move(prepare_finalize), std::move(experts),
                                          std::move(shared_experts), moe.parallel);
}

std::unique_ptr<FusedMoEKernel> make_moe_kernel(const QuantConfig& quant, const MoEConfig& moe,
                                                const ExpertsClass& experts_class,
                                                std::shared_ptr<SharedExperts> shared_experts,
                                                std::string_view experts_log) {
  std::unique_ptr<PrepareFinalize> prepare_finalize = maybe_make_prepare_finalize(
      moe, quant, experts_class.activation_format(), experts_class.is_monolithic());
  return assemble_moe_kernel(quant, moe, experts_class, std::move(prepare_finalize),
                             std::move(shared_experts), experts_log);
}

}  // namespace moekit
