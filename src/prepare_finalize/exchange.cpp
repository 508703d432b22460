// The base of the token-exchanging prepare/finalize (prepare_finalize/exchange.h).
#include "moekit/prepare_finalize/exchange.h"

#include "moekit/core/error.h"
#include "prepare_finalize/prepare_common.h"

namespace moekit {

PrepareFinalizeExchange::PrepareFinalizeExchange(Communicator* comm, int64_t num_experts,
                                                 const char* who)
    : comm_(comm), num_experts_(num_experts) {
  MOEKIT_CHECK(comm_ != nullptr, "{} needs a communicator", who);
  world_ = comm_->world_size();
  rank_ = comm_->rank();
  MOEKIT_CHECK(num_experts > 0 && num_experts % world_ == 0,
               "{}: num_experts = {} must be a positive multiple of the {} ranks", who, num_experts,
               world_);
  local_experts_ = num_experts / world_;
}

Tensor PrepareFinalizeExchange::input_to_send(const PrepareArgs& args, const char* who,
                                              Stream stream) {
  MOEKIT_CHECK(args.a1.device() == comm_->device(),
               "{}: a1 is on {} but the {} communicator's buffers are on {}", who,
               args.a1.device().to_string(), comm_->name(), comm_->device().to_string());
  if (!args.apply_router_weight_on_input) return args.a1;
  return detail::apply_router_weight_to_input(args.a1, args.topk_weights, who, &weighted_input_,
                                              stream);
}

}  // namespace moekit
