// Align / permute (token slots grouped by local expert) and the BatchedExperts copies.
//
// Align, M*k <= 8192 (decode and small prefill; align_chunked_kernel, one launch with
// programmatic dependent launch): the slots in chunks of up to 1024, every block counts and scans
// all of them, block b places chunk b (see below).
// Align, large M*k (three launches): each block owns a contiguous slot range; (K1) per-block
// histograms to the workspace, (K2) one block turns them into per-block bases and scans the
// offsets, (K3) each block places its range from its bases, then pads. Placement (both): rank
// inside a warp from __match_any_sync, rank across warps from a [warp][expert] table of group
// sizes, plus the expert's base, so the order inside an expert is the slot order; counts are
// shared-memory atomics (sums: order-free, deterministic); -1 goes into every padding row and the
// tail [total, capacity).
#include "experts/cuda/moe_permute.h"

#include "core/cuda/pdl.cuh"

namespace moekit::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxE = kMoeAlignMaxLocalExperts;
constexpr int64_t kSlotsPerBlock = 2048;  // multi-block path: slots per block (at least)
constexpr int64_t kMaxBlocks = 1024;
constexpr unsigned kFull = 0xffffffffu;

struct AlignSmem {
  int count[kMaxE];
  int base[kMaxE];
  int offset[kMaxE + 1];
  int warp_sum[kWarps];
  uint8_t tbl[kWarps][kMaxE];  // group size of expert e in warp w for the current chunk
};

__device__ __forceinline__ int64_t capacity_of(const MoeAlignParams& p) {
  return p.num_tokens * p.top_k + static_cast<int64_t>(p.num_local_experts) * (p.row_align - 1);
}

__device__ __forceinline__ int local_expert(const MoeAlignParams& p, int64_t slot) {
  const int g = p.topk_ids[slot];
  if (g < 0 || g >= p.num_global_experts) return -1;
  const int l = p.expert_map != nullptr ? p.expert_map[g] : g;
  return (l >= 0 && l < p.num_local_experts) ? l : -1;
}

// Row r of the permutation holds `slot` (-1: padding or tail) and, when the caller asks for it,
// token_rows[r] its token (slot / top_k; -1 with it): the gather index GEMM1 reads.
__device__ __forceinline__ void put_row(const MoeAlignParams& p, int64_t r, int32_t slot) {
  p.permuted_rows[r] = slot;
  if (p.token_rows != nullptr) p.token_rows[r] = slot < 0 ? -1 : slot / p.top_k;
}

__device__ __forceinline__ void zero_table(AlignSmem& sm) {
  uint32_t* t = reinterpret_cast<uint32_t*>(&sm.tbl[0][0]);
  for (int i = threadIdx.x; i < kWarps * kMaxE / 4; i += kThreads)
    t[i] = 0u;
}

// Exclusive scan of the padded counts (threads e < E hold count[e]); writes sm.offset[0..E].
__device__ void scan_offsets(AlignSmem& sm, int E, int align) {
  const int e = threadIdx.x;
  const int lane = e & 31, warp = e >> 5;
  const int c = e < E ? sm.count[e] : 0;
  const int v = (c + align - 1) / align * align;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += t;
  }
  if (lane == 31) sm.warp_sum[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = sm.warp_sum[lane];
    int winc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(kFull, winc, o);
      if (lane >= o) winc += t;
    }
    sm.warp_sum[lane] = winc - w;  // exclusive
  }
  __syncthreads();
  const int excl = sm.warp_sum[warp] + inc - v;
  if (e < E) sm.offset[e] = excl;
  if (e == E - 1) sm.offset[E] = excl + v;
  __syncthreads();
}

// Step 3: stable placement of the slots in [begin, end); sm.base[e] = first row for expert e.
// NOTE: sm.tbl must be zero on entry; it is zero again on exit. sm.base advances by the counts.
__device__ void place_range(const MoeAlignParams& p, AlignSmem& sm, int64_t begin, int64_t end) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int64_t c = begin; c < end; c += kThreads) {
    const int64_t slot = c + threadIdx.x;
    const int x = slot < end ? local_expert(p, slot) : -1;
    const unsigned peers = __match_any_sync(kFull, x);
    const int rank = __popc(peers & lt_mask);
    const int cnt = __popc(peers);
    if (x >= 0 && rank == 0) sm.tbl[warp][x] = static_cast<uint8_t>(cnt);
    __syncthreads();
    if (x >= 0) {
      int pos = sm.base[x] + rank;
      for (int w = 0; w < warp; ++w)
        pos += sm.tbl[w][x];
      put_row(p, pos, static_cast<int32_t>(slot));
      p.slot_to_row[slot] = pos;
    } else if (slot < end) {
      p.slot_to_row[slot] = -1;
    }
    __syncthreads();
    if (x >= 0 && rank == 0) {
      atomicAdd(&sm.base[x], cnt);
      sm.tbl[warp][x] = 0;
    }
    __syncthreads();
  }
}

// Step 4 for experts e = first, first + stride, ...: one warp per expert.
__device__ void pad_experts(const MoeAlignParams& p, const int* offset, const int* count, int first,
                            int stride) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = first + warp * stride; e < p.num_local_experts; e += kWarps * stride) {
    const int end = offset[e + 1];
    for (int r = offset[e] + count[e] + lane; r < end; r += 32)
      put_row(p, r, -1);
  }
}

__device__ __forceinline__ int64_t range_begin(int64_t n, int64_t per_block, int b) {
  const int64_t v = per_block * b;
  return v < n ? v : n;
}

// K1: per-block histograms, ws[b * E + e].
__global__ void __launch_bounds__(kThreads)
    align_count_kernel(const MoeAlignParams p, int64_t per_block, int32_t* ws) {
  __shared__ int count[kMaxE];
  const int E = p.num_local_experts;
  const int64_t n = p.num_tokens * p.top_k;
  for (int e = threadIdx.x; e < E; e += kThreads)
    count[e] = 0;
  __syncthreads();
  const int64_t begin = range_begin(n, per_block, blockIdx.x);
  const int64_t end = range_begin(n, per_block, blockIdx.x + 1);
  for (int64_t s = begin + threadIdx.x; s < end; s += kThreads) {
    const int x = local_expert(p, s);
    if (x >= 0) atomicAdd(&count[x], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kThreads)
    ws[static_cast<int64_t>(blockIdx.x) * E + e] = count[e];
}

// K2: ws[b][e] becomes the exclusive prefix over blocks; counts and offsets are written.
__global__ void __launch_bounds__(kThreads)
    align_scan_kernel(const MoeAlignParams p, int num_blocks, int32_t* ws) {
  __shared__ AlignSmem sm;
  const int E = p.num_local_experts;
  const int e = threadIdx.x;
  if (e < E) {
    int run = 0;
    int b = 0;
    for (; b + 8 <= num_blocks; b += 8) {
      int v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        v[i] = ws[static_cast<int64_t>(b + i) * E + e];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ws[static_cast<int64_t>(b + i) * E + e] = run;
        run += v[i];
      }
    }
    for (; b < num_blocks; ++b) {
      const int v = ws[static_cast<int64_t>(b) * E + e];
      ws[static_cast<int64_t>(b) * E + e] = run;
      run += v;
    }
    sm.count[e] = run;
  }
  __syncthreads();
  scan_offsets(sm, E, p.row_align);
  if (e < E) {
    p.expert_counts[e] = sm.count[e];
    if (p.expert_done != nullptr) p.expert_done[e] = 0;
  }
  for (int i = e; i < p.zero_words; i += kThreads)
    p.zero[i] = 0;
  if (e <= E) p.expert_offsets[e] = sm.offset[e];
  if (e == 0 && p.total_rows != nullptr) *p.total_rows = sm.offset[E];
}

// K3: place each block's range from its bases, then pad (experts spread over the blocks).
__global__ void __launch_bounds__(kThreads)
    align_scatter_kernel(const MoeAlignParams p, int64_t per_block, const int32_t* ws) {
  __shared__ AlignSmem sm;
  const int E = p.num_local_experts;
  const int64_t n = p.num_tokens * p.top_k;
  for (int e = threadIdx.x; e <= E; e += kThreads) {
    const int off = p.expert_offsets[e];
    sm.offset[e] = off;
    if (e < E) {
      sm.base[e] = off + ws[static_cast<int64_t>(blockIdx.x) * E + e];
      sm.count[e] = p.expert_counts[e];
    }
  }
  zero_table(sm);
  __syncthreads();
  place_range(p, sm, range_begin(n, per_block, blockIdx.x),
              range_begin(n, per_block, blockIdx.x + 1));
  pad_experts(p, sm.offset, sm.count, blockIdx.x, gridDim.x);
  const int64_t cap = capacity_of(p);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t r = sm.offset[E] + static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       r < cap; r += stride)
    put_row(p, r, -1);
}

// ---- align, M*k <= kChunkedSlots: one launch, no block waits on another ----------------------
// The slots are cut into chunks of T (= blockDim.x) slots, at most kChunks of them. Every block
// loads all of them (kChunks ids per thread, issued together: one round trip to L2 for the lot)
// and counts them; block b builds the [warp][expert] table of chunk b (rank inside the warp from
// match_any, group sizes per warp turned into an exclusive prefix over warps) and places chunk
// b: that rank + the prefix + the expert's slots in earlier chunks + the expert's offset, so the
// order inside an expert is the slot order. kChunks == 1 (decode, n <= T): the counts are the
// table's column sums, every block builds it, block 0 places; kChunks > 1: the other chunks are
// counted with one shared atomic per slot (sums: order-free, deterministic). Block 0 writes
// counts and offsets; every block shares the -1 fill of padding rows and the tail.
constexpr int kMaxChunks = 8;
constexpr int64_t kChunkedSlots = int64_t{kMaxChunks} * kThreads;

struct ChunkedSmem {
  uint16_t tbl[kWarps * kMaxE];  // [warp][Es]: group sizes in the block's chunk, then the prefix
  int count[kMaxE];              // slots of each expert, every chunk
  int before[kMaxE];             // slots of each expert in the chunks before the block's
  int offset[kMaxE + 1];
  int warp_sum[kWarps];
};

template <int kChunks>
__global__ void __launch_bounds__(kThreads) align_chunked_kernel(const MoeAlignParams p) {
  __shared__ ChunkedSmem sm;
  pdl_wait_and_release();
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int T = blockDim.x, W = T >> 5;
  const int E = p.num_local_experts;
  const int Es = (E + 1) & ~1;
  const int n = static_cast<int>(p.num_tokens * p.top_k);
  const int chunks = (n + T - 1) / T;
  const int b = blockIdx.x;
  const int own_chunk = kChunks == 1 ? 0 : b;  // the chunk whose table this block builds
  int x[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int slot = c * T + tid;
    x[c] = c < chunks && slot < n ? local_expert(p, slot) : -1;
  }
  {
    uint32_t* t = reinterpret_cast<uint32_t*>(sm.tbl);
    for (int i = tid; i < (W * Es) >> 1; i += T)
      t[i] = 0u;
    if constexpr (kChunks > 1) {
      for (int e = tid; e < E; e += T) {
        sm.count[e] = 0;
        sm.before[e] = 0;
      }
    }
  }
  __syncthreads();
  int own = -1, own_rank = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c >= chunks) continue;  // uniform over the block
    if (c == own_chunk) {
      const unsigned peers = __match_any_sync(kFull, x[c]);
      const int rank = __popc(peers & ((1u << lane) - 1u));
      if (x[c] >= 0 && rank == 0) {
        sm.tbl[warp * Es + x[c]] = static_cast<uint16_t>(__popc(peers));
        if constexpr (kChunks > 1) atomicAdd(&sm.count[x[c]], __popc(peers));
      }
      own = x[c];
      own_rank = rank;
    } else if (x[c] >= 0) {
      atomicAdd(&sm.count[x[c]], 1);
      if (c < b) atomicAdd(&sm.before[x[c]], 1);
    }
  }
  __syncthreads();
  int count = 0;
  if (tid < E) {
    for (int w = 0; w < W; ++w) {
      const int t = sm.tbl[w * Es + tid];
      sm.tbl[w * Es + tid] = static_cast<uint16_t>(count);
      count += t;
    }
    if constexpr (kChunks > 1) count = sm.count[tid];
  }
  // Exclusive scan of the counts rounded up to row_align (thread e holds expert e: T >= E).
  const int align = p.row_align;
  const int v = (count + align - 1) / align * align;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += t;
  }
  if (lane == 31) sm.warp_sum[warp] = inc;
  __syncthreads();
  int excl = inc - v;
  for (int w = 0; w < warp; ++w)
    excl += sm.warp_sum[w];
  if (tid < E) {
    sm.offset[tid] = excl;
    sm.count[tid] = count;
  }
  if (tid == E - 1) sm.offset[E] = excl + v;
  __syncthreads();
  const int total = sm.offset[E];
  if (b == 0) {
    if (tid < E) {
      p.expert_counts[tid] = count;
      p.expert_offsets[tid] = excl;
      if (p.expert_done != nullptr) p.expert_done[tid] = 0;
    }
    for (int i = tid; i < p.zero_words; i += static_cast<int>(blockDim.x))
      p.zero[i] = 0;
    if (tid == E - 1) {
      p.expert_offsets[E] = total;
      if (p.total_rows != nullptr) *p.total_rows = total;
    }
  }
  const int slot = b * T + tid;
  if (b == own_chunk && b < chunks && slot < n) {
    if (own >= 0) {
      const int earlier = kChunks > 1 ? sm.before[own] : 0;
      const int pos = sm.offset[own] + earlier + sm.tbl[warp * Es + own] + own_rank;
      put_row(p, pos, slot);
      p.slot_to_row[slot] = pos;
    } else {
      p.slot_to_row[slot] = -1;
    }
  }
  if (align > 1) {
    const int gw = b * W + warp;
    const int nw = gridDim.x * W;
    for (int e = gw; e < E; e += nw) {
      const int end = sm.offset[e + 1];
      for (int r = sm.offset[e] + sm.count[e] + lane; r < end; r += 32)
        put_row(p, r, -1);
    }
  }
  const int64_t cap = capacity_of(p);
  const int64_t gt = static_cast<int64_t>(b) * T + tid;
  const int64_t gstride = static_cast<int64_t>(gridDim.x) * T;
  int64_t body = total;
  if (((reinterpret_cast<uintptr_t>(p.permuted_rows) | reinterpret_cast<uintptr_t>(p.token_rows)) &
       15u) == 0) {
    const int64_t a4 = ((static_cast<int64_t>(total) + 3) & ~static_cast<int64_t>(3));
    const int64_t head_end = a4 < cap ? a4 : cap;
    if (gt < head_end - total) put_row(p, total + gt, -1);
    const int64_t q_end = head_end + ((cap - head_end) & ~static_cast<int64_t>(3));
    int4* v4 = reinterpret_cast<int4*>(p.permuted_rows);
    int4* t4 = reinterpret_cast<int4*>(p.token_rows);
    for (int64_t q = head_end / 4 + gt; q < q_end / 4; q += gstride) {
      v4[q] = make_int4(-1, -1, -1, -1);
      if (t4 != nullptr) t4[q] = make_int4(-1, -1, -1, -1);
    }
    body = q_end;
  }
  for (int64_t r = body + gt; r < cap; r += gstride)
    put_row(p, r, -1);
}

// T = the slots rounded up to a warp, at least E and 64, at most kThreads; one block per chunk,
// more (up to 64) where the padding rows and the tail need them.
cudaError_t launch_align_chunked(const MoeAlignParams& p, int64_t n, cudaStream_t stream) {
  const int E = p.num_local_experts;
  int need = static_cast<int>(n < kThreads ? n : kThreads);
  if (need < E) need = E;
  if (need < 64) need = 64;
  const int T = (need + 31) / 32 * 32;
  const int W = T / 32;
  const int chunks = static_cast<int>((n + T - 1) / T);
  int blocks = chunks > 1 ? chunks : 1;
  if (p.row_align > 1) {
    const int64_t cap = moe_align_capacity(p.num_tokens, p.top_k, p.num_local_experts, p.row_align);
    const int64_t by_experts = (E + W - 1) / W;
    const int64_t by_tail =
        (cap - n + static_cast<int64_t>(T) * 8 - 1) / (static_cast<int64_t>(T) * 8);
    int64_t fill = by_experts > by_tail ? by_experts : by_tail;
    if (fill > 64) fill = 64;
    if (fill > blocks) blocks = static_cast<int>(fill);
  }
  if (chunks <= 1) return launch_pdl(align_chunked_kernel<1>, dim3(blocks), dim3(T), 0, stream, p);
  return launch_pdl(align_chunked_kernel<kMaxChunks>, dim3(blocks), dim3(T), 0, stream, p);
}

int64_t slots_per_block(int64_t n) {
  const int64_t per = (n + kMaxBlocks - 1) / kMaxBlocks;
  const int64_t rounded = (per + kThreads - 1) / kThreads * kThreads;
  return rounded > kSlotsPerBlock ? rounded : kSlotsPerBlock;
}

// ---- batched layout -----------------------------------------------------------------------------

// Copies `bytes` bytes from src to dst with one warp, widest access both pointers allow.
__device__ __forceinline__ void warp_copy_row(void* dst, const void* src, int64_t bytes, int lane) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  if (((a | static_cast<uintptr_t>(bytes)) & 15u) == 0) {
    const uint4* s = static_cast<const uint4*>(src);
    uint4* d = static_cast<uint4*>(dst);
    for (int64_t i = lane; i < bytes / 16; i += 32)
      d[i] = s[i];
  } else if (((a | static_cast<uintptr_t>(bytes)) & 3u) == 0) {
    const uint32_t* s = static_cast<const uint32_t*>(src);
    uint32_t* d = static_cast<uint32_t*>(dst);
    for (int64_t i = lane; i < bytes / 4; i += 32)
      d[i] = s[i];
  } else {
    const uint8_t* s = static_cast<const uint8_t*>(src);
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (int64_t i = lane; i < bytes; i += 32)
      d[i] = s[i];
  }
}

__device__ __forceinline__ void warp_zero_row(void* dst, int64_t bytes, int lane) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  if (((a | static_cast<uintptr_t>(bytes)) & 15u) == 0) {
    uint4* d = static_cast<uint4*>(dst);
    for (int64_t i = lane; i < bytes / 16; i += 32)
      d[i] = make_uint4(0, 0, 0, 0);
  } else {
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (int64_t i = lane; i < bytes; i += 32)
      d[i] = 0;
  }
}

constexpr int kCopyWarps = 4;

__global__ void __launch_bounds__(kCopyWarps * 32)
    batched_scatter_kernel(const BatchedScatterParams p) {
  const int lane = threadIdx.x & 31;
  const int e = blockIdx.y;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kCopyWarps + (threadIdx.x >> 5);
  if (blockIdx.x == 0 && e == 0) {
    int over = 0;
    for (int i = threadIdx.x; i < p.num_local_experts; i += blockDim.x) {
      const int c = p.expert_counts[i];
      p.out_counts[i] = c < p.max_tokens ? c : p.max_tokens;
      over |= c > p.max_tokens;
    }
    over = __syncthreads_or(over);
    if (threadIdx.x == 0) *p.overflow = over ? 1 : 0;
  }
  const int cnt = p.expert_counts[e];
  if (t >= cnt || t >= p.max_tokens) return;
  const int slot = p.permuted_rows[p.expert_offsets[e] + t];
  const int64_t token = slot / p.top_k;
  const int64_t row_bytes = p.hidden * p.elem_bytes;
  const char* src = static_cast<const char*>(p.x) + token * p.x_row_stride * p.elem_bytes;
  char* dst = static_cast<char*>(p.out) + (static_cast<int64_t>(e) * p.max_tokens + t) * row_bytes;
  warp_copy_row(dst, src, row_bytes, lane);
}

// Expert of row r: the largest e with offsets[e] <= r (empty experts share offsets).
__device__ __forceinline__ int expert_of_row(const int32_t* offsets, int E, int r) {
  int lo = 0, hi = E;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (offsets[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__global__ void __launch_bounds__(kCopyWarps * 32)
    batched_gather_kernel(const BatchedGatherParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kCopyWarps + (threadIdx.x >> 5);
  if (s >= p.num_slots) return;
  const int64_t row_bytes = p.hidden * p.elem_bytes;
  char* dst = static_cast<char*>(p.out) + s * row_bytes;
  const int r = p.slot_to_row[s];
  if (r >= 0) {
    const int e = expert_of_row(p.expert_offsets, p.num_local_experts, r);
    const int t = r - p.expert_offsets[e];
    if (t < p.max_tokens) {
      const char* src = static_cast<const char*>(p.batched) +
                        (static_cast<int64_t>(e) * p.max_tokens + t) * row_bytes;
      warp_copy_row(dst, src, row_bytes, lane);
      return;
    }
  }
  warp_zero_row(dst, row_bytes, lane);
}

__global__ void __launch_bounds__(kCopyWarps * 32)
    exchange_pack_kernel(const ExchangePackParams p) {
  const int lane = threadIdx.x & 31;
  const int e = blockIdx.y, s = blockIdx.z;
  const int El = p.num_local_experts;
  const int t = blockIdx.x * kCopyWarps + (threadIdx.x >> 5);
  if (p.expert_num_tokens != nullptr && !p.unpack && blockIdx.x == 0 && s == 0 &&
      threadIdx.x == 0) {
    int total = 0;
    for (int r = 0; r < p.world; ++r)
      total += p.counts[r * El + e];
    p.expert_num_tokens[e] = total;
  }
  if (t >= p.counts[s * El + e]) return;
  int offset = 0;
  for (int r = 0; r < s; ++r)
    offset += p.counts[r * El + e];
  const int64_t row_bytes = p.hidden * p.elem_bytes;
  char* ex = static_cast<char*>(p.exchanged) +
             ((static_cast<int64_t>(s) * El + e) * p.capacity + t) * row_bytes;
  char* pk = static_cast<char*>(p.packed) +
             (static_cast<int64_t>(e) * p.world * p.capacity + offset + t) * row_bytes;
  if (p.unpack) {
    warp_copy_row(ex, pk, row_bytes, lane);
  } else {
    warp_copy_row(pk, ex, row_bytes, lane);
  }
}

__global__ void __launch_bounds__(kCopyWarps * 32) gather_rows_kernel(const GatherRowsParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kCopyWarps + (threadIdx.x >> 5);
  if (i >= p.num_rows) return;
  char* dst = static_cast<char*>(p.out) + i * p.row_bytes;
  const int32_t r = p.index[i];
  if (r < 0) {
    warp_zero_row(dst, p.row_bytes, lane);
  } else {
    warp_copy_row(dst, static_cast<const char*>(p.src) + r * p.row_bytes, p.row_bytes, lane);
  }
}

}  // namespace

size_t moe_align_workspace_bytes(int64_t num_tokens, int top_k, int num_local_experts) {
  const int64_t n = num_tokens * top_k;
  if (n <= kChunkedSlots) return 0;
  const int64_t per = slots_per_block(n);
  const int64_t blocks = (n + per - 1) / per;
  return static_cast<size_t>(blocks) * num_local_experts * sizeof(int32_t);
}

const char* moe_align_unsupported_reason(const MoeAlignParams& p) {
  if (p.num_tokens < 0) return "num_tokens < 0";
  if (p.top_k < 1) return "top_k < 1";
  if (p.num_local_experts < 1 || p.num_local_experts > kMaxE)
    return "num_local_experts must be in [1, 512]";
  if (p.num_global_experts < 1) return "num_global_experts < 1";
  if (p.row_align < 1) return "row_align < 1";
  if (moe_align_capacity(p.num_tokens, p.top_k, p.num_local_experts, p.row_align) > 0x7fffffff)
    return "capacity exceeds int32 row indices";
  if (p.expert_counts == nullptr || p.expert_offsets == nullptr) return "null counts / offsets";
  if (p.zero_words < 0 || (p.zero_words > 0 && p.zero == nullptr))
    return "zero_words < 0, or zero_words > 0 with a null zero";
  const int64_t n = p.num_tokens * p.top_k;
  if (n > 0 && (p.topk_ids == nullptr || p.slot_to_row == nullptr))
    return "null topk_ids / slot_to_row";
  if (moe_align_capacity(p.num_tokens, p.top_k, p.num_local_experts, p.row_align) > 0 &&
      p.permuted_rows == nullptr)
    return "null permuted_rows";
  const size_t need = moe_align_workspace_bytes(p.num_tokens, p.top_k, p.num_local_experts);
  if (need > 0 && (p.workspace == nullptr || p.workspace_bytes < need))
    return "workspace smaller than moe_align_workspace_bytes()";
  if (need > 0 && (reinterpret_cast<uintptr_t>(p.workspace) & 3u) != 0)
    return "workspace not 4-byte aligned";
  return nullptr;
}

cudaError_t launch_moe_align(const MoeAlignParams& p, cudaStream_t stream) {
  if (moe_align_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  const int64_t n = p.num_tokens * p.top_k;
  if (n <= kChunkedSlots) {
    const cudaError_t err = launch_align_chunked(p, n, stream);
    if (err != cudaSuccess) return err;
    return cudaGetLastError();
  }
  const int64_t per = slots_per_block(n);
  const int blocks = static_cast<int>((n + per - 1) / per);
  int32_t* ws = static_cast<int32_t*>(p.workspace);
  align_count_kernel<<<blocks, kThreads, 0, stream>>>(p, per, ws);
  align_scan_kernel<<<1, kThreads, 0, stream>>>(p, blocks, ws);
  align_scatter_kernel<<<blocks, kThreads, 0, stream>>>(p, per, ws);
  return cudaGetLastError();
}

const char* batched_scatter_unsupported_reason(const BatchedScatterParams& p) {
  if (p.num_local_experts < 1 || p.num_local_experts > 65535)
    return "num_local_experts out of range";
  if (p.max_tokens < 0) return "max_tokens < 0";
  if (p.hidden < 0 || p.x_row_stride < p.hidden) return "x_row_stride < hidden";
  if (p.elem_bytes != 1 && p.elem_bytes != 2 && p.elem_bytes != 4)
    return "elem_bytes not 1, 2 or 4";
  if (p.top_k < 1) return "top_k < 1";
  if (p.expert_counts == nullptr || p.expert_offsets == nullptr || p.out_counts == nullptr ||
      p.overflow == nullptr)
    return "null counts / offsets / out_counts / overflow";
  return nullptr;
}

cudaError_t launch_batched_scatter(const BatchedScatterParams& p, cudaStream_t stream) {
  if (batched_scatter_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  const int64_t bx = (static_cast<int64_t>(p.max_tokens) + kCopyWarps - 1) / kCopyWarps;
  const dim3 grid(static_cast<unsigned>(bx > 0 ? bx : 1), p.num_local_experts);
  batched_scatter_kernel<<<grid, kCopyWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

const char* batched_gather_unsupported_reason(const BatchedGatherParams& p) {
  if (p.num_local_experts < 1) return "num_local_experts < 1";
  if (p.max_tokens < 0 || p.hidden < 0 || p.num_slots < 0) return "negative size";
  if (p.elem_bytes != 1 && p.elem_bytes != 2 && p.elem_bytes != 4)
    return "elem_bytes not 1, 2 or 4";
  if (p.num_slots > 0 &&
      (p.slot_to_row == nullptr || p.expert_offsets == nullptr || p.out == nullptr))
    return "null slot_to_row / expert_offsets / out";
  return nullptr;
}

cudaError_t launch_batched_gather(const BatchedGatherParams& p, cudaStream_t stream) {
  if (batched_gather_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (p.num_slots == 0) return cudaSuccess;
  const int64_t blocks = (p.num_slots + kCopyWarps - 1) / kCopyWarps;
  batched_gather_kernel<<<static_cast<unsigned>(blocks), kCopyWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

const char* exchange_pack_unsupported_reason(const ExchangePackParams& p) {
  if (p.world < 1 || p.world > 65535) return "world must be in [1, 65535]";
  if (p.num_local_experts < 1 || p.num_local_experts > 65535)
    return "num_local_experts must be in [1, 65535]";
  if (p.capacity < 0 || p.hidden < 0) return "negative capacity or hidden";
  if (p.elem_bytes != 1 && p.elem_bytes != 2 && p.elem_bytes != 4)
    return "elem_bytes not 1, 2 or 4";
  if (p.counts == nullptr) return "null counts";
  if (p.capacity > 0 && (p.exchanged == nullptr || p.packed == nullptr))
    return "null exchanged / packed";
  return nullptr;
}

cudaError_t launch_exchange_pack(const ExchangePackParams& p, cudaStream_t stream) {
  if (exchange_pack_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  const int bx = (p.capacity + kCopyWarps - 1) / kCopyWarps;
  const dim3 grid(static_cast<unsigned>(bx > 0 ? bx : 1),
                  static_cast<unsigned>(p.num_local_experts), static_cast<unsigned>(p.world));
  exchange_pack_kernel<<<grid, kCopyWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

const char* gather_rows_unsupported_reason(const GatherRowsParams& p) {
  if (p.num_rows < 0 || p.row_bytes < 0) return "negative num_rows or row_bytes";
  if (p.num_rows > 0 && (p.src == nullptr || p.index == nullptr || p.out == nullptr))
    return "null src / index / out";
  return nullptr;
}

cudaError_t launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  if (gather_rows_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (p.num_rows == 0 || p.row_bytes == 0) return cudaSuccess;
  const int64_t blocks = (p.num_rows + kCopyWarps - 1) / kCopyWarps;
  gather_rows_kernel<<<static_cast<unsigned>(blocks), kCopyWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace moekit::cuda
