// The expert-parallel forward of Sm90EpPeerExperts as one persistent launch (the megakernel of
// the seeds' expert-parallel experts, on Hopper): the steps of ep_peer.h's forward — dispatch,
// barrier, the local experts on the received rows, combine, barrier, sum — in one kernel whose
// grid is resident at once and waits on grid-wide barriers between the steps, so a decode step
// pays one launch instead of about ten:
//   1. dispatch this rank's tokens into the ranks' buffers (ep_peer_device.cuh); grid barrier;
//      the ranks' barrier (one warp of CTA 0); grid barrier;
//   2. CTA 0 sorts the received slots (rows below their source's count, ids of this rank's
//      experts) by local expert, in slot order (deterministic): each expert's first row, the
//      received row of each sorted row and the sorted row of each slot; grid barrier;
//   3. GEMM1 with the fused gated activation and GEMM2 on the sorted rows: the decode pair's tasks
//      (sm90/grouped_kernels.cuh, simt_pair_tasks: CUDA-core dot products, GEMM2's work of an
//      expert waiting on counters of its GEMM1 work) on the 16-bit CUDA-core row, or for packed
//      W4A16 weights (MXFP4, NVFP4 with its per-expert global scale) on the W4A16 one; grid
//      barrier;
//   4. combine: each received row with an expert here sums w_j * y (fp32 fused multiply-adds in j
//      order, as the unpermute does), rounds it once and writes it into its source rank's buffer;
//      grid barrier; the ranks' barrier; grid barrier;
//   5. sum each of this rank's tokens over the ranks' partials.
// The outputs are bitwise those of the launch sequence whose local GEMMs run on the same row
// (tile 1x64simt). Used at decode sizes (Sm90EpPeerExperts decides); larger batches
// run the launch sequence with the tensor-core tiles.
//
// Included by .cu files only (sm90_grouped_gemm.h names CUDA runtime types).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "experts/cuda/ep_peer.h"
#include "experts/cuda/sm90_grouped_gemm.h"

namespace moekit::cuda::ep {

// Byte offsets of the launch's scratch in its workspace (S = world * capacity * topk slots, each
// at most one sorted row): offsets (E + 1) int32, done (E) int32, gather (S) int32, row_of_slot
// (S) int32, act (S, act_cols) and y (S, hidden) in the activation dtype.
struct OneLaunchWorkspace {
  size_t offsets = 0, done = 0, gather = 0, row_of_slot = 0, act = 0, y = 0, bytes = 0;
};
OneLaunchWorkspace one_launch_workspace(const PeerLayout& layout, int64_t local_experts,
                                        int64_t act_cols);

struct OneLaunchArgs {
  // GEMM1 (w1, bias, n = 2 * act_cols, k = hidden, dtype, the fused activation) and GEMM2 (w2,
  // bias, n = hidden, k = act_cols); the launch fills in A, C, the gather and the schedule.
  GroupedGemmArgs g1, g2;
  void* workspace = nullptr;  // one_launch_workspace(...).bytes, 256-byte aligned
};

// Why this forward cannot run as one launch (empty: it can).
std::string one_launch_unsupported_reason(const ForwardArgs& f, const OneLaunchArgs& o);
// Launches the forward on f.stream; returns a cudaError_t as int (cudaErrorInvalidValue when
// one_launch_unsupported_reason is not empty).
int launch_one_forward(const ForwardArgs& f, const OneLaunchArgs& o);

}  // namespace moekit::cuda::ep
