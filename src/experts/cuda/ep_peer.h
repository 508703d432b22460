// Device entry points of Sm90EpPeerExperts (experts/sm90_ep_peer.cpp): expert-parallel ranks
// exchanging tokens through each other's memory (CUDA IPC; NVLink between GPUs, the same memory
// for two processes on one GPU).
//
// Every rank holds one symmetric buffer of the same layout (PeerLayout); rank r writes into rank
// d's buffer directly:
//   x[s][m]      the hidden row of source rank s's token m (only where m has an expert on d)
//   ids[s][m][j] its j-th expert id if that expert lives on d, else -1; w[s][m][j] its weight
//   comb[d][m]   rank d's partial output of this rank's token m (only where m had an expert on d)
//   count[s]     source s's token count of the forward
//   flag[s]      the last barrier epoch source s reached
//   grid         this rank's own: the grid barrier of the one-launch forward (ep_one_launch.h)
// A forward is: dispatch -> barrier -> mask (ids past count[s] -> -1) -> the local experts on the
// (world * capacity) received rows -> combine -> barrier -> sum, as a sequence of launches (the
// entry points below) or as one persistent launch (ep_one_launch.h); both write the same regions
// and pass the same two barriers, so ranks may take either form in the same forward. Nothing
// synchronizes with the host and nothing allocates, so a forward can be captured in a CUDA graph;
// every rank must run the same number of forwards (the barriers pair them up).
//
// Declared without CUDA types so the host file compiles in every build; defined in ep_peer.cu.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace moekit::cuda::ep {

inline constexpr int kMaxRanks = 8;  // one NVLink domain of GPUs

struct PeerLayout {
  int world = 1;
  int64_t capacity = 0;  // tokens per rank (the layer's max_num_tokens)
  int64_t hidden = 0;    // K
  int topk = 0;
  size_t elem = 2;  // bytes of one activation (bf16 / f16)
  // Byte offsets of the regions inside one rank's buffer, and its size.
  size_t x = 0, ids = 0, w = 0, comb = 0, count = 0, flag = 0, epoch = 0, grid = 0, bytes = 0;
};
PeerLayout make_peer_layout(int world, int64_t capacity, int64_t hidden, int topk, size_t elem);

// Every rank's buffer base, as this rank addresses it (its own at index rank).
struct PeerPointers {
  std::array<char*, kMaxRanks> base{};
};

// One rank's buffer: allocated (cudaMalloc, zeroed) and its IPC handle.
struct OwnBuffer {
  char* base = nullptr;
  std::array<int64_t, 8> handle{};  // cudaIpcMemHandle_t as 64 bytes
};
// Throws moekit::Error naming the failing call.
OwnBuffer allocate_peer_buffer(const PeerLayout& layout, int device);
char* open_peer_buffer(const std::array<int64_t, 8>& handle, int device);
void close_peer_buffer(char* base);  // never throws (destructors)
void free_peer_buffer(char* base);   // never throws (destructors)

struct ForwardArgs {
  PeerLayout layout;
  PeerPointers peers;
  int rank = 0;
  int64_t local_experts = 0;          // experts per rank: expert e lives on rank e / local_experts
  int64_t global_experts = 0;         // ids outside [0, global_experts) go nowhere
  int64_t M = 0;                      // this rank's tokens
  const void* x = nullptr;            // (M, hidden) this rank's tokens
  const int32_t* topk_ids = nullptr;  // (M, topk) global ids
  const float* topk_weights = nullptr;  // (M, topk)
  const void* partial = nullptr;        // (world * capacity, hidden): the local experts' output
  void* out = nullptr;                  // (M, hidden)
  bool f16 = false;                     // activations are f16 (else bf16)
  void* stream = nullptr;               // cudaStream_t
};

// The steps of a forward (see above), each one or a few launches on args.stream. They return a
// cudaError_t as int (0 = success).
int launch_dispatch(const ForwardArgs& args);
int launch_barrier(const ForwardArgs& args);
int launch_mask_received(const ForwardArgs& args);
int launch_combine(const ForwardArgs& args);
int launch_sum(const ForwardArgs& args);

}  // namespace moekit::cuda::ep
