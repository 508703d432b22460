// The MPI communicator: CPU ranks of an expert-parallel deployment (one process per rank, launched
// by mpirun), on the MPI library of the system (OpenMPI from Debian). Also what bootstraps NCCL
// (its unique id travels over MPI). No MPI header leaks into this one: builds without MPI compile
// the same code and say why at run time.
#pragma once

#include <memory>
#include <string>

#include "moekit/comm/communicator.h"

namespace moekit {

// Whether this build has MPI (CMake found it), and if not, why communicators are unavailable.
bool mpi_available();
std::string mpi_unavailable_reason();

// The communicator over all processes of the job (MPI_COMM_WORLD), CPU buffers. Initializes MPI
// on first use (MPI_THREAD_FUNNELED: collectives from one thread) and finalizes it at exit when it
// initialized it. Throws moekit::Error without MPI.
//
// Collectives (communicator.h) move any dtype; the sums (reduce_scatter, all_reduce) take f32,
// f64, int32 and int64 — MPI has no bf16 / f16 sum, so those are an error naming the dtype. Every
// argument is checked before any MPI call, with the same outcome on every rank when the ranks pass
// consistent shapes, so a bad call is an error rather than a hang.
std::shared_ptr<Communicator> mpi_world_communicator();

}  // namespace moekit
