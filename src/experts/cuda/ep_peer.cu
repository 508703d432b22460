// The peer-memory token exchange of Sm90EpPeerExperts (see ep_peer.h for the buffer layout and
// the order of a forward).
#include <algorithm>
#include <cstring>

#include "core/byte_regions.h"
#include "core/cuda/cuda_check.cuh"
#include "experts/cuda/ep_peer.h"
#include "experts/cuda/ep_peer_device.cuh"

namespace moekit::cuda::ep {
namespace {

// Restores the calling thread's current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    MOEKIT_CUDA_CHECK(cudaGetDevice(&previous_));
    MOEKIT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { (void)cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// One block per token of this rank (dispatch_token); block 0 also publishes this rank's count.
__global__ void dispatch_kernel(ForwardArgs a) {
  if (blockIdx.x == 0) publish_count(a);
  if (static_cast<int64_t>(blockIdx.x) >= a.M) return;
  __shared__ DispatchShared s;
  dispatch_token(a, blockIdx.x, s);
}

__global__ void barrier_kernel(ForwardArgs a) {
  rank_barrier_warp(a);
}

// Received rows past a source's count go nowhere this forward (their ids are stale).
__global__ void mask_kernel(ForwardArgs a) {
  const PeerLayout& l = a.layout;
  char* base = a.peers.base[a.rank];
  const auto* count = reinterpret_cast<const int32_t*>(base + l.count);
  auto* ids = reinterpret_cast<int32_t*>(base + l.ids);
  const int64_t total = l.world * l.capacity * l.topk;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / l.topk;
    if (row % l.capacity >= count[row / l.capacity]) ids[i] = -1;
  }
}

// Each received row that had an expert here sends its partial output back to its source rank.
__global__ void combine_kernel(ForwardArgs a) {
  const PeerLayout& l = a.layout;
  const char* base = a.peers.base[a.rank];
  const auto* count = reinterpret_cast<const int32_t*>(base + l.count);
  const auto* ids = reinterpret_cast<const int32_t*>(base + l.ids);
  const int64_t rows = l.world * l.capacity;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int s = static_cast<int>(row / l.capacity);
    const int64_t m = row % l.capacity;
    if (m >= count[s]) continue;
    bool here = false;
    for (int j = 0; j < l.topk; ++j)
      here |= ids[row * l.topk + j] >= 0;
    if (!here) continue;
    copy_row(
        a.peers.base[s] + l.comb + (static_cast<size_t>(a.rank) * l.capacity + m) * row_bytes(l),
        static_cast<const char*>(a.partial) + static_cast<size_t>(row) * row_bytes(l),
        row_bytes(l));
  }
}

// One block per token of this rank (sum_token).
template <typename T>
__global__ void sum_kernel(ForwardArgs a) {
  __shared__ int from[kMaxRanks];
  sum_token<T>(a, blockIdx.x, from);
}

cudaStream_t stream_of(const ForwardArgs& a) {
  return static_cast<cudaStream_t>(a.stream);
}

}  // namespace

PeerLayout make_peer_layout(int world, int64_t capacity, int64_t hidden, int topk, size_t elem) {
  PeerLayout l;
  l.world = world;
  l.capacity = capacity;
  l.hidden = hidden;
  l.topk = topk;
  l.elem = elem;
  const size_t rows = static_cast<size_t>(world) * static_cast<size_t>(capacity);
  ByteRegions r;
  l.x = r.take(rows * static_cast<size_t>(hidden) * elem);
  l.ids = r.take(rows * static_cast<size_t>(topk) * sizeof(int32_t));
  l.w = r.take(rows * static_cast<size_t>(topk) * sizeof(float));
  l.comb = r.take(rows * static_cast<size_t>(hidden) * elem);
  l.count = r.take(static_cast<size_t>(world) * sizeof(int32_t));
  l.flag = r.take(static_cast<size_t>(world) * sizeof(unsigned long long));
  l.epoch = r.take(sizeof(unsigned long long));
  l.grid = r.take(2 * sizeof(uint32_t));
  l.bytes = r.size();
  return l;
}

OwnBuffer allocate_peer_buffer(const PeerLayout& layout, int device) {
  DeviceScope scope(device);
  OwnBuffer b;
  void* p = nullptr;
  MOEKIT_CUDA_CHECK(cudaMalloc(&p, layout.bytes));
  b.base = static_cast<char*>(p);
  // Zero counts, flags and the epoch (and the rest: no stale NaN ever reaches a GEMM) before any
  // peer can learn the handle.
  MOEKIT_CUDA_CHECK(cudaMemset(p, 0, layout.bytes));
  MOEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  MOEKIT_CUDA_CHECK(cudaIpcGetMemHandle(&h, p));
  static_assert(sizeof(h) == sizeof(b.handle));
  std::memcpy(b.handle.data(), &h, sizeof(h));
  return b;
}

char* open_peer_buffer(const std::array<int64_t, 8>& handle, int device) {
  DeviceScope scope(device);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  MOEKIT_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return static_cast<char*>(p);
}

void close_peer_buffer(char* base) {
  if (base != nullptr) (void)cudaIpcCloseMemHandle(base);
}

void free_peer_buffer(char* base) {
  if (base != nullptr) (void)cudaFree(base);
}

int launch_dispatch(const ForwardArgs& a) {
  dispatch_kernel<<<static_cast<unsigned>(std::max<int64_t>(a.M, 1)), 128, 0, stream_of(a)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_barrier(const ForwardArgs& a) {
  barrier_kernel<<<1, 32, 0, stream_of(a)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_mask_received(const ForwardArgs& a) {
  const int64_t total = a.layout.world * a.layout.capacity * a.layout.topk;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1024));
  mask_kernel<<<std::max(blocks, 1u), 256, 0, stream_of(a)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_combine(const ForwardArgs& a) {
  const int64_t rows = a.layout.world * a.layout.capacity;
  combine_kernel<<<static_cast<unsigned>(std::min<int64_t>(rows, 2048)), 128, 0, stream_of(a)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_sum(const ForwardArgs& a) {
  if (a.M == 0) return 0;
  const auto blocks = static_cast<unsigned>(a.M);
  if (a.f16) {
    sum_kernel<__half><<<blocks, 128, 0, stream_of(a)>>>(a);
  } else {
    sum_kernel<__nv_bfloat16><<<blocks, 128, 0, stream_of(a)>>>(a);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace moekit::cuda::ep
