// The CPU-only build's stand-in for the GPU router (see router_cuda_hook.h).
#include "router/router_cuda_hook.h"

#ifndef MOEKIT_WITH_CUDA

#include "moekit/core/error.h"

namespace moekit {

RoutingResult route_on_device(const RouterConfig& config, const Tensor& router_logits,
                              RunContext /*ctx*/) {
  MOEKIT_CHECK(false,
               "router_logits ({}) is on a CUDA device but there is no CUDA router in this build "
               "(moekit was built without CUDA); router: {}",
               router_logits.describe(), config.to_string());
}

void route_on_device_into(const RouterConfig& config, const Tensor& router_logits,
                          const Tensor& /*topk_weights*/, const Tensor& /*topk_ids*/,
                          RunContext /*ctx*/) {
  MOEKIT_CHECK(false,
               "router_logits ({}) is on a CUDA device but there is no CUDA router in this build "
               "(moekit was built without CUDA); router: {}",
               router_logits.describe(), config.to_string());
}

}  // namespace moekit

#endif  // MOEKIT_WITH_CUDA
