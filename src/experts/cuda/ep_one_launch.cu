// The expert-parallel forward as one persistent launch (see ep_one_launch.h for its steps).
#include "experts/cuda/ep_one_launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <tuple>
#include <type_traits>

#include "core/byte_regions.h"
#include "experts/cuda/ep_peer_device.cuh"
#include "experts/cuda/sm90/grouped_kernels.cuh"

namespace moekit::cuda::ep {
namespace {

constexpr size_t kRegionAlign = 256;  // of the workspace's regions (and its base)

// A family's CUDA-core row: the pair's tasks run on it.
constexpr int simt_row(sm90::TileFamily family) {
  for (int r = 0; r < sm90::kNumTiles; ++r) {
    if (sm90::kTileTable[r].family == family &&
        sm90::kTileTable[r].kind == sm90::MainloopKind::kSimt) {
      return r;
    }
  }
  return -1;
}
constexpr int kRow16 = simt_row(sm90::TileFamily::k16Bit);
constexpr int kRowW4 = simt_row(sm90::TileFamily::kW4A16);
static_assert(kRow16 >= 0 && kRowW4 >= 0, "the tile table has 16-bit and W4A16 CUDA-core rows");

// The row of a problem: W4A16's for packed weights, else the 16-bit one.
int row_of(const GroupedGemmArgs& g) {
  return g.w_packing == WPacking::kNone ? kRow16 : kRowW4;
}

// What the kernel needs beyond ForwardArgs: the GEMMs' parameter blocks and the scratch.
struct OneParams {
  sm90::KernelParams p1, p2;
  int32_t* offsets;      // (E + 1,) first sorted row of each local expert
  int32_t* done;         // (E,) the pair's counters
  int32_t* gather;       // (S,) received row of each sorted row
  int32_t* row_of_slot;  // (S,) sorted row of each received slot, -1: no expert here
  const void* y;         // (S, hidden) GEMM2's output
  uint32_t* grid;        // {arrived, generation}: the grid barrier
};

// Every CTA of the grid (all resident) arrives; none leaves before the last has arrived. What a
// CTA wrote before is visible to every CTA after (release / acquire at GPU scope through thread
// 0, ordered with the block's other threads by the block barriers). Self-resetting.
__device__ __forceinline__ void grid_barrier(uint32_t* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* arrived = bar;
    uint32_t* generation = bar + 1;
    uint32_t gen;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(generation) : "memory");
    __threadfence();
    if (atomicAdd(arrived, 1u) == gridDim.x - 1) {
      atomicExch(arrived, 0u);
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(generation), "r"(gen + 1)
                   : "memory");
    } else {
      for (;;) {
        uint32_t now;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                     : "=r"(now)
                     : "l"(generation)
                     : "memory");
        if (now != gen) break;
        __nanosleep(32);
      }
    }
    __threadfence();  // the last arriver too: the others' writes before its reads
  }
  __syncthreads();
}

// The ranks' barrier between two grid barriers: every CTA's writes into the peers' buffers are
// fenced at system scope, CTA 0's first warp meets the other ranks, and the grid waits for it.
__device__ __forceinline__ void ranks_barrier(const ForwardArgs& a, uint32_t* bar) {
  __threadfence_system();
  grid_barrier(bar);
  if (blockIdx.x == 0 && threadIdx.x < 32) rank_barrier_warp(a);
  grid_barrier(bar);
}

__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// Step 2, by CTA 0: the received slots sorted by local expert, in slot order. s_count and
// s_cursor: E ints of shared memory each (E <= kMaxExperts).
__device__ void sort_received(const ForwardArgs& a, const OneParams& o, int* s_count,
                              int* s_cursor) {
  const PeerLayout& l = a.layout;
  const char* own = a.peers.base[a.rank];
  const auto* count = reinterpret_cast<const int32_t*>(own + l.count);
  const auto* ids = reinterpret_cast<const int32_t*>(own + l.ids);
  const int E = static_cast<int>(a.local_experts);
  const int64_t first = static_cast<int64_t>(a.rank) * a.local_experts;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5, warps = static_cast<int>(blockDim.x) / 32;
  auto local_of = [&](int64_t slot) {
    const int64_t e = static_cast<int64_t>(ids[slot]) - first;
    return e >= 0 && e < E ? static_cast<int>(e) : -1;
  };
  for (int e = tid; e < E; e += static_cast<int>(blockDim.x)) {
    s_count[e] = 0;
    o.done[e] = 0;
  }
  __syncthreads();
  // Counts; every slot of a received row routed nowhere here yet.
  for (int s = 0; s < l.world; ++s) {
    const int64_t base = static_cast<int64_t>(s) * l.capacity * l.topk;
    const int64_t n = static_cast<int64_t>(count[s]) * l.topk;
    for (int64_t i = tid; i < n; i += blockDim.x) {
      const int e = local_of(base + i);
      if (e >= 0) atomicAdd(&s_count[e], 1);
      o.row_of_slot[base + i] = -1;
    }
  }
  __syncthreads();
  // Each expert's first sorted row (warp 0).
  if (warp == 0) {
    const int total = sm90::warp_exclusive_prefix(
        E, lane, [&](int e) { return s_count[e]; },
        [&](int e, int prefix) {
          s_cursor[e] = prefix;
          o.offsets[e] = prefix;
        });
    if (lane == 0) o.offsets[E] = total;
  }
  __syncthreads();
  // Stable scatter: chunks of blockDim slots in order; within a chunk the warps take their turn
  // in order and each warp's lanes of one expert take consecutive rows in lane order.
  for (int s = 0; s < l.world; ++s) {
    const int64_t base = static_cast<int64_t>(s) * l.capacity * l.topk;
    const int64_t n = static_cast<int64_t>(count[s]) * l.topk;
    for (int64_t chunk = 0; chunk < n; chunk += blockDim.x) {
      const int64_t i = chunk + tid;
      const int e = i < n ? local_of(base + i) : -1;
      const uint32_t same = __match_any_sync(0xffffffffu, e);
      const int before = __popc(same & lanemask_lt());
      for (int w = 0; w < warps; ++w) {
        if (warp == w && e >= 0) {
          const int row = s_cursor[e] + before;
          o.gather[row] = static_cast<int32_t>((base + i) / l.topk);
          o.row_of_slot[base + i] = row;
        }
        __syncwarp();
        if (warp == w && e >= 0 && before == 0) s_cursor[e] += __popc(same);
        __syncthreads();
      }
    }
  }
}

// Step 4 for received row `row` (below its source's count), by the whole block: its weighted sum
// over its slots with an expert here, into its source rank's buffer (nothing when it has none).
template <typename T>
__device__ void combine_row(const ForwardArgs& a, const OneParams& o, int64_t row, int* s_rows,
                            float* s_weights) {
  const PeerLayout& l = a.layout;
  const char* own = a.peers.base[a.rank];
  if (threadIdx.x < static_cast<unsigned>(l.topk)) {
    const int j = static_cast<int>(threadIdx.x);
    s_rows[j] = o.row_of_slot[row * l.topk + j];
    s_weights[j] = reinterpret_cast<const float*>(own + l.w)[row * l.topk + j];
  }
  __syncthreads();
  bool any = false;
  for (int j = 0; j < l.topk; ++j)
    any |= s_rows[j] >= 0;
  if (any) {
    const int src = static_cast<int>(row / l.capacity);
    const int64_t m = row % l.capacity;
    T* dst = reinterpret_cast<T*>(a.peers.base[src] + l.comb +
                                  (static_cast<size_t>(a.rank) * l.capacity + m) * row_bytes(l));
    const T* y = static_cast<const T*>(o.y);
    constexpr int kVec = 16 / sizeof(T);
    for (int64_t c = threadIdx.x * static_cast<int64_t>(kVec); c < l.hidden;
         c += static_cast<int64_t>(blockDim.x) * kVec) {
      float acc[kVec] = {};
      for (int j = 0; j < l.topk; ++j) {
        const int r = s_rows[j];
        if (r < 0) continue;
        const uint4 raw =
            *reinterpret_cast<const uint4*>(y + static_cast<int64_t>(r) * l.hidden + c);
        const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          acc[i] = __fmaf_rn(s_weights[j], to_f32(v[i]), acc[i]);
      }
      uint4 packed;
      T* out = reinterpret_cast<T*>(&packed);
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        out[i] = from_f32<T>(acc[i]);
      *reinterpret_cast<uint4*>(dst + c) = packed;
    }
  }
  __syncthreads();  // s_rows / s_weights are reused by the block's next row
}

// T: the activations (and 16-bit weights); kRow: the CUDA-core row; kPacking: packed W's format
// (W4A16 rows).
template <typename T, int kRow, WPacking kPacking>
__global__ void __launch_bounds__(sm90::ShapeOf<T, kRow>::kThreads,
                                  sm90::ShapeOf<T, kRow>::kMinBlocks)
    one_forward_kernel(const ForwardArgs a, const OneParams o) {
  pdl_wait();                                // the router's ids and weights
  __shared__ int s_prefix[kMaxExperts + 1];  // the pair's tile prefix; step 2's cursors
  __shared__ int s_count[kMaxExperts];
  __shared__ DispatchShared s_dispatch;
  __shared__ int s_rows[kMaxTopk];
  __shared__ float s_weights[kMaxTopk];
  const PeerLayout& l = a.layout;
  // 1. dispatch.
  if (blockIdx.x == 0) publish_count(a);
  for (int64_t m = blockIdx.x; m < a.M; m += gridDim.x)
    dispatch_token(a, m, s_dispatch);
  ranks_barrier(a, o.grid);
  // 2. sort the received slots.
  if (blockIdx.x == 0) sort_received(a, o, s_count, s_prefix);
  grid_barrier(o.grid);
  // 3. GEMM1 + activation, GEMM2.
  sm90::simt_pair_tasks<T, T, kRow, kPacking, true>(o.p1, o.p2, o.done, s_prefix);
  grid_barrier(o.grid);
  // 4. combine: the received rows below their source's count, walked over the grid.
  const auto* count = reinterpret_cast<const int32_t*>(a.peers.base[a.rank] + l.count);
  int64_t valid = 0;
  for (int s = 0; s < l.world; ++s)
    valid += count[s];
  for (int64_t v = blockIdx.x; v < valid; v += gridDim.x) {
    int s = 0;
    int64_t m = v;
    while (m >= count[s])
      m -= count[s++];
    combine_row<T>(a, o, static_cast<int64_t>(s) * l.capacity + m, s_rows, s_weights);
  }
  ranks_barrier(a, o.grid);
  // 5. sum over the ranks.
  for (int64_t m = blockIdx.x; m < a.M; m += gridDim.x)
    sum_token<T>(a, m, s_rows);
}

// A and C, the gather and the schedule of the GEMMs in the workspace.
void complete(const ForwardArgs& f, const OneLaunchArgs& o, GroupedGemmArgs* g1,
              GroupedGemmArgs* g2, OneLaunchWorkspace* ws) {
  const PeerLayout& l = f.layout;
  const int64_t act_cols = o.g1.n / 2;
  *ws = one_launch_workspace(l, f.local_experts, act_cols);
  char* base = static_cast<char*>(o.workspace);
  const int64_t slots = static_cast<int64_t>(l.world) * l.capacity * l.topk;
  *g1 = o.g1;
  g1->a = f.peers.base[f.rank] + l.x;
  g1->lda = l.hidden;
  g1->gather_rows = reinterpret_cast<const int32_t*>(base + ws->gather);
  g1->expert_offsets = reinterpret_cast<const int32_t*>(base + ws->offsets);
  g1->expert_counts = nullptr;
  g1->num_experts = static_cast<int>(f.local_experts);
  g1->num_rows_upper_bound = slots;
  g1->c = base + ws->act;
  g1->ldc = act_cols;
  *g2 = o.g2;
  g2->a = g1->c;
  g2->lda = act_cols;
  g2->gather_rows = nullptr;
  g2->expert_offsets = g1->expert_offsets;
  g2->expert_counts = nullptr;
  g2->num_experts = g1->num_experts;
  g2->num_rows_upper_bound = slots;
  g2->c = base + ws->y;
  g2->ldc = l.hidden;
}

// CTAs of the kernel resident at once on every SM (the grid barriers and the pair's counters
// need the whole grid resident), queried once per process and element type.
template <typename T, int kRow, WPacking kPacking>
cudaError_t resident_grid(int* grid) {
  static const auto blocks_and_sms = [] {
    int blocks = 0, sms = 0;
    cudaError_t e = sm90::pair_residency<T, kRow>(&one_forward_kernel<T, kRow, kPacking>, &blocks);
    if (e == cudaSuccess) e = sm90::current_device_sms(&sms);
    return std::tuple<cudaError_t, int, int>(e, blocks, sms);
  }();
  const auto [e, blocks, sms] = blocks_and_sms;
  *grid = blocks * sms;
  return e;
}

}  // namespace

OneLaunchWorkspace one_launch_workspace(const PeerLayout& l, int64_t local_experts,
                                        int64_t act_cols) {
  const size_t slots =
      static_cast<size_t>(l.world) * static_cast<size_t>(l.capacity) * static_cast<size_t>(l.topk);
  OneLaunchWorkspace w;
  ByteRegions r(kRegionAlign);
  w.offsets = r.take(static_cast<size_t>(local_experts + 1) * sizeof(int32_t));
  w.done = r.take(static_cast<size_t>(local_experts) * sizeof(int32_t));
  w.gather = r.take(slots * sizeof(int32_t));
  w.row_of_slot = r.take(slots * sizeof(int32_t));
  w.act = r.take(slots * static_cast<size_t>(act_cols) * l.elem);
  w.y = r.take(slots * static_cast<size_t>(l.hidden) * l.elem);
  w.bytes = r.size();
  return w;
}

std::string one_launch_unsupported_reason(const ForwardArgs& f, const OneLaunchArgs& o) {
  using std::to_string;
  const PeerLayout& l = f.layout;
  if (o.g1.dtype != ElemType::kBF16 && o.g1.dtype != ElemType::kF16) {
    return "the one-launch forward runs bf16 / f16 activations only";
  }
  if (o.g1.w_packing != o.g2.w_packing ||
      (o.g1.w_packing != WPacking::kNone &&
       (o.g1.dtype != ElemType::kBF16 || o.g1.w_packing == WPacking::kInt4))) {
    return "the one-launch forward runs 16-bit weights or packed W4A16 weights (MXFP4, NVFP4, "
           "MXFP6) with bf16 activations";
  }
  if (l.topk > kMaxTopk) return "top_k " + to_string(l.topk) + " > " + to_string(kMaxTopk);
  if (f.local_experts < 1 || f.local_experts > kMaxExperts) {
    return "local experts " + to_string(f.local_experts) + " outside [1, " +
           to_string(kMaxExperts) + "]";
  }
  if (l.hidden % 8 != 0) return "hidden " + to_string(l.hidden) + " is not a multiple of 8";
  if (o.workspace == nullptr || reinterpret_cast<uintptr_t>(o.workspace) % kRegionAlign != 0) {
    return "the workspace is null or not 256-byte aligned";
  }
  GroupedGemmArgs g1, g2;
  OneLaunchWorkspace ws;
  complete(f, o, &g1, &g2, &ws);
  return detail::simt_pair_unsupported_reason(g1, g2, row_of(g1));
}

int launch_one_forward(const ForwardArgs& f, const OneLaunchArgs& o) {
  if (!one_launch_unsupported_reason(f, o).empty()) return cudaErrorInvalidValue;
  GroupedGemmArgs g1, g2;
  OneLaunchWorkspace ws;
  complete(f, o, &g1, &g2, &ws);
  char* base = static_cast<char*>(o.workspace);
  auto run = [&](auto type, auto row, auto packing) -> cudaError_t {
    using T = decltype(type);
    constexpr int kRow = decltype(row)::value;
    constexpr WPacking kPacking = decltype(packing)::value;
    OneParams p{};
    p.p1 = sm90::kernel_params<T, kRow>(g1);
    p.p2 = sm90::kernel_params<T, kRow>(g2);
    p.offsets = reinterpret_cast<int32_t*>(base + ws.offsets);
    p.done = reinterpret_cast<int32_t*>(base + ws.done);
    p.gather = reinterpret_cast<int32_t*>(base + ws.gather);
    p.row_of_slot = reinterpret_cast<int32_t*>(base + ws.row_of_slot);
    p.y = base + ws.y;
    p.grid = reinterpret_cast<uint32_t*>(f.peers.base[f.rank] + f.layout.grid);
    int grid = 0;
    MOEKIT_CUDA_TRY((resident_grid<T, kRow, kPacking>(&grid)));
    return launch_pdl(&one_forward_kernel<T, kRow, kPacking>, dim3(static_cast<unsigned>(grid)),
                      dim3(sm90::ShapeOf<T, kRow>::kThreads), 0,
                      static_cast<cudaStream_t>(f.stream), f, p);
  };
  using Row16 = std::integral_constant<int, kRow16>;
  using NoPacking = std::integral_constant<WPacking, WPacking::kMxfp4>;  // unused by 16-bit rows
  cudaError_t e = cudaSuccess;
  if (o.g1.w_packing != WPacking::kNone) {
    e = sm90::with_packing(o.g1.w_packing, [&](auto packing) {
      return run(__nv_bfloat16{}, std::integral_constant<int, kRowW4>{}, packing);
    });
  } else if (o.g1.dtype == ElemType::kF16) {
    e = run(__half{}, Row16{}, NoPacking{});
  } else {
    e = run(__nv_bfloat16{}, Row16{}, NoPacking{});
  }
  return static_cast<int>(e);
}

}  // namespace moekit::cuda::ep
