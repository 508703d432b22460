// The NCCL communicator: GPU ranks of an expert-parallel deployment, one process and one GPU per
// rank, launched by mpirun. A host communicator of the same ranks (MPI) bootstraps it (rank 0's
// NCCL unique id travels over it) and carries its host-side exchanges (token counts, barrier);
// the collectives are NCCL's, on device buffers, ordered on the caller's stream and never
// synchronising with the host. No NCCL header leaks into this one: builds without it compile the
// same code and say why at run time. Part of the moekit_mpi library (the communicators on system
// libraries), which loads libnccl from the system's library path.
#pragma once

#include <memory>
#include <string>

#include "moekit/comm/communicator.h"

namespace moekit {

// Whether this build has the NCCL communicator (CUDA and NCCL from the toolkit found), and if not,
// why.
bool nccl_available();
std::string nccl_unavailable_reason();

// The communicator over all processes of the MPI job on GPU `device_index` (-1: the MPI rank
// modulo the visible GPUs). Collective: every rank calls it. One per process (later calls return
// the same one). Throws moekit::Error without NCCL, without a GPU, or when NCCL refuses (e.g. two
// ranks on one GPU, which NCCL does not allow).
//
// Collectives (communicator.h) move any dtype; the sums take f32, f64, f16, bf16, int32 and
// int64. all_to_all_v is NCCL send/recv pairs in one group. Arguments are checked before any NCCL
// call, with the same outcome on every rank when ranks pass consistent shapes.
std::shared_ptr<Communicator> nccl_world_communicator(int device_index = -1);
// The same over the ranks of `host` (CPU buffers): e.g. a SingleRankCommunicator for one rank,
// which needs no MPI (how the one-GPU machine tests it). Collective over host's ranks.
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> host,
                                                     int device_index = -1);

}  // namespace moekit
