// comm/mpi.h in a build without MPI (CMake did not find it): the same entry points, each saying
// why. Compiled instead of comm/mpi/mpi_communicator.cpp.
#include "moekit/comm/mpi.h"
#include "moekit/core/error.h"

namespace moekit {

bool mpi_available() {
  return false;
}

std::string mpi_unavailable_reason() {
  return "moekit was built without MPI (install libopenmpi-dev and reconfigure: "
         "scripts/install-deps.sh does)";
}

std::shared_ptr<Communicator> mpi_world_communicator() {
  throw Error("the MPI communicator is unavailable: " + mpi_unavailable_reason());
}

}  // namespace moekit
