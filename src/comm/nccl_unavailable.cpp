// comm/nccl.h in a build without the NCCL communicator (no CUDA, no NCCL or no MPI): the same
// entry points, each saying why. Compiled instead of comm/nccl/nccl_communicator.cpp.
#include "moekit/comm/nccl.h"
#include "moekit/core/error.h"

namespace moekit {

#ifndef MOEKIT_NCCL_UNAVAILABLE_REASON
#define MOEKIT_NCCL_UNAVAILABLE_REASON "moekit was built without the NCCL communicator"
#endif

bool nccl_available() {
  return false;
}

std::string nccl_unavailable_reason() {
  return MOEKIT_NCCL_UNAVAILABLE_REASON;
}

std::shared_ptr<Communicator> nccl_world_communicator(int) {
  throw Error("the NCCL communicator is unavailable: " + nccl_unavailable_reason());
}

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator>, int) {
  throw Error("the NCCL communicator is unavailable: " + nccl_unavailable_reason());
}

}  // namespace moekit
