// The base of the token-exchanging prepare/finalize (prepare_finalize/exchange.h).
#include "moekit/prepare_finalize/exchange.h"

#include "moekit/core/error.h"

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

}  // namespace moekit
