// Epilogues of the grouped GEMMs: one warpgroup's 64 x kBN fp32 accumulator fragment (+ bias)
// stored straight from registers with row (expert range) and column (N) predicates, rounded once
// to the output type; optionally with the gated activation fused (act_math.cuh). The 128x256
// rows' plain epilogue goes through shared memory instead (store_warpgroup_tile_staged).
#pragma once

#include <cstring>
#include <type_traits>
#include <utility>

#include "core/cuda/elem_io.cuh"
#include "experts/cuda/sm90/act_math.cuh"
#include "experts/cuda/sm90/kernel_params.cuh"
#include "experts/cuda/sm90/ptx.cuh"
#include "experts/cuda/sm90/scheduler.cuh"

namespace moekit::cuda::sm90 {

// v rounded to T (to nearest even) and back.
template <typename T>
__device__ __forceinline__ float rounded(float v) {
  return to_f32(from_f32<T>(v));
}

// A packed pair of T (element 0 in the low half) as two floats.
template <typename T>
__device__ __forceinline__ float2 unpack_pair(uint32_t bits) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xFFFF0000u));
  } else {
    __half2 h;
    static_assert(sizeof(h) == sizeof(bits));
    memcpy(&h, &bits, sizeof(h));
    return __half22float2(h);
  }
}

// Bias of columns (col, col + 1) of expert e, or zeros.
template <typename T>
__device__ __forceinline__ float2 bias_pair(const KernelParams& p, int expert, int col) {
  float2 b = make_float2(0.0f, 0.0f);
  if (p.bias != nullptr) {
    const int64_t bi = static_cast<int64_t>(expert) * p.n + col;
    if (p.bias_is_fp32) {
      b = *reinterpret_cast<const float2*>(static_cast<const float*>(p.bias) + bi);
    } else {
      const T* bt = static_cast<const T*>(p.bias) + bi;
      b.x = to_f32(bt[0]);
      b.y = to_f32(bt[1]);
    }
  }
  return b;
}

// Fused epilogue of one activation kind (see store_tile).
template <typename T, int kBN, act::Gated kA>
__device__ __forceinline__ void store_tile_fused(const KernelParams& p, const float (&acc)[kBN / 2],
                                                 int expert, int row0, int row_end, int n0,
                                                 int lane) {
  using P = Pair<T>;
  static_assert(kBN % 64 == 0, "the fused epilogue pairs columns within 64-column blocks");
#pragma unroll
  for (int jb = 0; jb < kBN / 64; ++jb) {
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 8 * jb + jj;  // gate group; up group is j + 4
      const int gcol = n0 + j * 8 + (lane & 3) * 2;
      if (gcol >= p.n) continue;
      const float2 bg = bias_pair<T>(p, expert, gcol);
      const float2 bu = bias_pair<T>(p, expert, gcol + kFusedGateUpBlock);
      const int ocol = (n0 + 64 * jb) / 2 + jj * 8 + (lane & 3) * 2;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + h * 8;
        if (row < row_end) {
          // NOTE: gate and up are rounded to T first, as the unfused path stores them (and the
          // CPU emulation rounds them): an fp8 requantization of the output would otherwise
          // flip ~3% of its codes against the emulation.
          const float o0 =
              act::gated<kA>(rounded<T>(acc[4 * j + 2 * h] + bg.x),
                             rounded<T>(acc[4 * (j + 4) + 2 * h] + bu.x), p.limit, p.alpha);
          const float o1 =
              act::gated<kA>(rounded<T>(acc[4 * j + 2 * h + 1] + bg.y),
                             rounded<T>(acc[4 * (j + 4) + 2 * h + 1] + bu.y), p.limit, p.alpha);
          auto* dst = reinterpret_cast<typename P::type*>(
              p.c + static_cast<int64_t>(row) * p.ldc_bytes + static_cast<int64_t>(ocol) * 2);
          *dst = P::make(o0, o1);
        }
      }
    }
  }
}

// Where the plain epilogue puts a pair of outputs: C itself (GlobalPairs), or a warpgroup's
// staging tile (store_warpgroup_tile_staged). sink(row, col, pair): row and column of C, the two
// values rounded to T.
template <typename T>
struct GlobalPairs {
  const KernelParams& p;
  __device__ __forceinline__ void operator()(int row, int col, typename Pair<T>::type v) const {
    *reinterpret_cast<typename Pair<T>::type*>(p.c + static_cast<int64_t>(row) * p.ldc_bytes +
                                               static_cast<int64_t>(col) * 2) = v;
  }
};

// The plain epilogue (no activation) of the fragment's column groups [kJ0, kJ1) of 8 columns
// (layout: store_tile below), + bias, each pair through sink.
template <typename T, int kBN, int kJ0, int kJ1, typename Sink>
__device__ __forceinline__ void store_plain_groups(const KernelParams& p,
                                                   const float (&acc)[kBN / 2], int expert,
                                                   int row0, int row_end, int n0, int lane,
                                                   Sink&& sink) {
  using P = Pair<T>;
#pragma unroll
  for (int j = kJ0; j < kJ1; ++j) {
    const int col = n0 + j * 8 + (lane & 3) * 2;
    if (col >= p.n) continue;
    const float2 b = bias_pair<T>(p, expert, col);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + h * 8;
      if (row < row_end) {
        sink(row, col, P::make(acc[4 * j + 2 * h] + b.x, acc[4 * j + 2 * h + 1] + b.y));
      }
    }
  }
}

// Calls f(std::integral_constant<act::Gated, kA>{}) with the gated kind of p's fused activation
// (p.act != kNone), so that each kind is its own straight-line instantiation of f.
template <typename F>
__device__ __forceinline__ void with_gated_kind(const KernelParams& p, F&& f) {
  using act::Gated;
  switch (p.act) {
    case FusedActivation::kSiluMul:
      if (p.has_clamp) {
        f(std::integral_constant<Gated, Gated::kSiluClamp>{});
      } else {
        f(std::integral_constant<Gated, Gated::kSilu>{});
      }
      break;
    case FusedActivation::kGeluMul:
      f(std::integral_constant<Gated, Gated::kGelu>{});
      break;
    case FusedActivation::kGeluTanhMul:
      f(std::integral_constant<Gated, Gated::kGeluTanh>{});
      break;
    case FusedActivation::kSwigluOai:
      f(std::integral_constant<Gated, Gated::kSwigluOai>{});
      break;
    case FusedActivation::kSwigluStep:
      f(std::integral_constant<Gated, Gated::kSwigluStep>{});
      break;
    default:
      f(std::integral_constant<Gated, Gated::kRelu2>{});
      break;
  }
}

// Stores one warpgroup's 64 x kBN accumulator fragment. The m64nN wgmma fragment gives this
// thread rows row0 and row0 + 8 and, for every 8-column group j, columns j*8 + (lane%4)*2 + {0,1}:
// acc[4j + 2h + {0,1}] is (row0 + 8h, n0 + 8j + (lane%4)*2 + {0,1}).
// Fused: each 64-column block jb of the tile holds gate columns [64jb, 64jb + 32) and the up
// columns 32 further on, i.e. groups j and j + 4 of the same thread; output column
// (n0 + 64jb) / 2 + 8(j%8) + (lane%4)*2. n is a multiple of 64, so the gate column's predicate
// covers its up column. The kind is resolved once per tile: each kind is its own straight-line
// unrolled copy.
template <typename T, int kBN>
__device__ __forceinline__ void store_tile(const KernelParams& p, const float (&acc)[kBN / 2],
                                           int expert, int row0, int row_end, int n0, int lane) {
  if (p.act == FusedActivation::kNone) {
    store_plain_groups<T, kBN, 0, kBN / 8>(p, acc, expert, row0, row_end, n0, lane,
                                           GlobalPairs<T>{p});
    return;
  }
  with_gated_kind(p, [&](auto kind) {
    store_tile_fused<T, kBN, decltype(kind)::value>(p, acc, expert, row0, row_end, n0, lane);
  });
}

// The epilogue of a tile held transposed in shared memory (tile[t * ld + c]: token t of the
// item, column c of its kBN; the swap-AB rows), by the kThreads threads of one warpgroup taking
// the output pairs of the item's `tokens` valid tokens in turn: a rolled loop per activation kind
// instead of the fragment epilogue's unrolled copy per thread. scale_of(t, col) gives the scales
// of columns col and col + 1 of token t (KStep::finish's: 1, NVFP4's per-expert global scale, or
// the 8-bit operands' A x W scales). The same arithmetic as KStep::finish then store_tile:
// value * scale + bias; fused: gate and up rounded to T first.
template <typename T, int kBN, int kThreads, typename ScaleOf>
__device__ __forceinline__ void store_transposed_tile(const KernelParams& p, const float* tile,
                                                      int ld, const WorkItem& w, int tokens,
                                                      ScaleOf&& scale_of, int tid) {
  using P = Pair<T>;
  static_assert(kBN == 64, "one 64-column block: gate columns [0, 32), up columns [32, 64)");
  auto value = [](float v, float scale, float bias) { return v * scale + bias; };
  if (p.act == FusedActivation::kNone) {
    constexpr int kPairs = kBN / 2;  // per token
#pragma unroll 1
    for (int e = tid; e < tokens * kPairs; e += kThreads) {
      const int t = e / kPairs;
      const int c = 2 * (e % kPairs);
      const int col = w.n0 + c;
      if (col >= p.n) continue;
      const float2 b = bias_pair<T>(p, w.expert, col);
      const float2 f = scale_of(t, col);
      const float* v = tile + t * ld + c;
      *reinterpret_cast<typename P::type*>(p.c + static_cast<int64_t>(w.m0 + t) * p.ldc_bytes +
                                           static_cast<int64_t>(col) * 2) =
          P::make(value(v[0], f.x, b.x), value(v[1], f.y, b.y));
    }
    return;
  }
  with_gated_kind(p, [&](auto kind) {
    constexpr act::Gated kA = decltype(kind)::value;
    constexpr int kPairs = kBN / 4;  // output pairs per token
#pragma unroll 1
    for (int e = tid; e < tokens * kPairs; e += kThreads) {
      const int t = e / kPairs;
      const int c = 2 * (e % kPairs);  // gate column of the tile; up: c + 32
      const int gcol = w.n0 + c;
      if (gcol >= p.n) continue;
      const float2 bg = bias_pair<T>(p, w.expert, gcol);
      const float2 bu = bias_pair<T>(p, w.expert, gcol + kFusedGateUpBlock);
      const float2 fg = scale_of(t, gcol);
      const float2 fu = scale_of(t, gcol + kFusedGateUpBlock);
      const float* v = tile + t * ld + c;
      const float o0 =
          act::gated<kA>(rounded<T>(value(v[0], fg.x, bg.x)),
                         rounded<T>(value(v[kFusedGateUpBlock], fu.x, bu.x)), p.limit, p.alpha);
      const float o1 =
          act::gated<kA>(rounded<T>(value(v[1], fg.y, bg.y)),
                         rounded<T>(value(v[kFusedGateUpBlock + 1], fu.y, bu.y)), p.limit, p.alpha);
      *reinterpret_cast<typename P::type*>(p.c + static_cast<int64_t>(w.m0 + t) * p.ldc_bytes +
                                           static_cast<int64_t>(w.n0 / 2 + c) * 2) =
          P::make(o0, o1);
    }
  });
}

// The epilogue of warpgroup `warpgroup` (64 rows of the item) for thread `tid` of the CTA.
template <typename T, int kBN>
__device__ __forceinline__ void store_warpgroup_tile(const KernelParams& p,
                                                     const float (&acc)[kBN / 2], const WorkItem& w,
                                                     int warpgroup, int tid) {
  const int lane = tid & 31;
  const int warp_in_group = (tid & 127) >> 5;
  const int row0 = w.m0 + warpgroup * 64 + warp_in_group * 16 + (lane >> 2);
  store_tile<T, kBN>(p, acc, w.expert, row0, w.row_end, w.n0, lane);
}

// 16 bytes to C at dst: one store, or four 4-byte ones where C's rows are not 16-byte aligned.
__device__ __forceinline__ void store_c_chunk(const KernelParams& p, uint8_t* dst, uint4 v) {
  if (p.c_rows_16b) {
    *reinterpret_cast<uint4*>(dst) = v;
  } else {
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    d[0] = v.x;
    d[1] = v.y;
    d[2] = v.z;
    d[3] = v.w;
  }
}

// The plain epilogue (no activation: GEMM2) of the 128x256 rows (TileShape::kStagedEpilogue): a
// warpgroup's 64 rows go to C 64 columns at a time through its staging tile in shared memory
// (kStagedPitch bytes per row: 4 words of padding put a warp's store of 8 rows x 4 words in 32
// different banks), then from there in 16-byte chunks, each row's 128 bytes by 8 consecutive lanes:
// whole 128-byte lines instead of the fragment's 16-byte pieces of 8 rows per store. Predicates
// per chunk (rows of the expert; columns below n, a multiple of 8); four 4-byte stores per chunk
// where C's rows are not 16-byte aligned. Two barriers of the warpgroup's 128 threads per round
// (named barriers 2 and 3, one per warpgroup).
// (The fused epilogue measured slower this way: its two rounds add barriers to a tile bound by
// the activation's arithmetic; bench/grouped_gemm_notes.md.)
template <typename T, int kBN>
__device__ __forceinline__ void store_warpgroup_tile_staged(const KernelParams& p,
                                                            const float (&acc)[kBN / 2],
                                                            const WorkItem& w, int warpgroup,
                                                            int tid, uint32_t stage) {
  static_assert(sizeof(T) == 2 && kBN % kStagedCols == 0);
  constexpr int kChunksPerRow = kStagedCols * 2 / 16;
  const int lane = tid & 31;
  const int wtid = tid & 127;
  const int first_row = w.m0 + warpgroup * 64;
  const int row0 = first_row + (wtid >> 5) * 16 + (lane >> 2);
  auto round = [&](auto r_tag) {
    constexpr int r = decltype(r_tag)::value;
    constexpr int kJ = kStagedCols / 8;  // column groups per round
    store_plain_groups<T, kBN, r * kJ, (r + 1) * kJ>(
        p, acc, w.expert, row0, w.row_end, w.n0, lane,
        [&](int row, int col, typename Pair<T>::type v) {
          st_shared_pair(stage + static_cast<uint32_t>((row - first_row) * kStagedPitch +
                                                       (col - w.n0 - r * kStagedCols) * 2),
                         v);
        });
    named_barrier_sync(2 + warpgroup, 128);
#pragma unroll
    for (int i = 0; i < 64 * kChunksPerRow / 128; ++i) {
      const int c = wtid + 128 * i;
      const int rl = c / kChunksPerRow, chunk = c % kChunksPerRow;
      const int row = first_row + rl;
      const int col = w.n0 + r * kStagedCols + chunk * 8;
      if (row < w.row_end && col < p.n) {
        const uint4 v = ld_shared_v4(stage + static_cast<uint32_t>(rl * kStagedPitch + chunk * 16));
        store_c_chunk(
            p, p.c + static_cast<int64_t>(row) * p.ldc_bytes + static_cast<int64_t>(col) * 2, v);
      }
    }
    named_barrier_sync(2 + warpgroup, 128);  // read out before the next round writes it
  };
  [&]<int... kR>(std::integer_sequence<int, kR...>) {
    (round(std::integral_constant<int, kR>{}), ...);
  }
  (std::make_integer_sequence<int, kBN / kStagedCols>{});
}

// ---- the epilogue warps (MainloopKind::kWarpSpecializedEpilogue)
// ---------------------------------

// The handoff tile (tiles.h, kHandoffPitch): the item's 128 x 256 values as T, 16-byte unit u of a
// row (columns 8u .. 8u + 7) stored at unit u ^ 4 where u / 8 is odd. That puts the gate units
// (the first four of each 64-column block) of two neighbouring blocks in different halves of the
// banks, so the fused epilogue's 8 lanes of a shared-memory phase (4 gate units of each of two
// blocks) hit 32 banks, as do the plain copy's 8 consecutive units.
__device__ __forceinline__ uint32_t handoff_offset(int row, int col) {
  const int u = col >> 3;
  return static_cast<uint32_t>(row * kHandoffPitch + ((u ^ ((u >> 1) & 4)) << 4) + (col & 7) * 2);
}

// Where the consumers' epilogue puts a pair for the epilogue warps: (row, col) of C relative
// to the item's first row and column, into the handoff tile at `tile`.
template <typename T>
struct HandoffPairs {
  uint32_t tile;
  int m0;
  int n0;
  __device__ __forceinline__ void operator()(int row, int col, typename Pair<T>::type v) const {
    st_shared_pair(tile + handoff_offset(row - m0, col - n0), v);
  }
};

// Plain (GEMM2): the tile's rows to C as they are, 16-byte units, a warp per 512-byte row; etid
// is this thread's index among the kThreads epilogue threads.
template <int kThreads>
__device__ __forceinline__ void store_handoff_plain(const KernelParams& p, const WorkItem& w,
                                                    uint32_t tile, int etid) {
  constexpr int kUnits = 256 / 8;  // per row
  static_assert(kThreads % kUnits == 0);
#pragma unroll 4
  for (int c = etid; c < 128 * kUnits; c += kThreads) {
    const int r = c / kUnits, u = c % kUnits;
    const int row = w.m0 + r, col = w.n0 + 8 * u;
    if (row < w.row_end && col < p.n) {
      store_c_chunk(p,
                    p.c + static_cast<int64_t>(row) * p.ldc_bytes + static_cast<int64_t>(col) * 2,
                    ld_shared_v4(tile + handoff_offset(r, 8 * u)));
    }
  }
}

// Fused: 8 outputs per task from the gate unit and its up unit 32 columns on (the layout of
// store_tile), the activation on the values the consumers rounded (as store_tile_fused), C's
// column (n0 + 64 jb) / 2 + 8 q for gate unit q of block jb; a warp per two rows of 256 bytes.
template <typename T, int kThreads, act::Gated kA>
__device__ __forceinline__ void store_handoff_fused(const KernelParams& p, const WorkItem& w,
                                                    uint32_t tile, int etid) {
  using P = Pair<T>;
  constexpr int kTasks = 256 / 2 / 8;  // per row
  static_assert(kThreads % kTasks == 0);
#pragma unroll 2
  for (int c = etid; c < 128 * kTasks; c += kThreads) {
    const int r = c / kTasks, jb = (c % kTasks) / 4, q = c % 4;
    const int row = w.m0 + r, gcol = 64 * jb + 8 * q;
    if (row >= w.row_end || w.n0 + gcol >= p.n) continue;  // n % 64 == 0: up follows gate
    const uint4 g = ld_shared_v4(tile + handoff_offset(r, gcol));
    const uint4 u = ld_shared_v4(tile + handoff_offset(r, gcol + kFusedGateUpBlock));
    const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 gf = unpack_pair<T>(gw[i]), uf = unpack_pair<T>(uw[i]);
      const typename P::type v = P::make(act::gated<kA>(gf.x, uf.x, p.limit, p.alpha),
                                         act::gated<kA>(gf.y, uf.y, p.limit, p.alpha));
      memcpy(&o[i], &v, sizeof(v));
    }
    const int ocol = (w.n0 + 64 * jb) / 2 + 8 * q;
    store_c_chunk(p, p.c + static_cast<int64_t>(row) * p.ldc_bytes + static_cast<int64_t>(ocol) * 2,
                  make_uint4(o[0], o[1], o[2], o[3]));
  }
}

// The epilogue warps' work on one handed-off item (thread etid of kThreads); the activation kind
// resolved once per item, as store_tile does.
template <typename T, int kThreads>
__device__ __forceinline__ void store_handoff(const KernelParams& p, const WorkItem& w,
                                              uint32_t tile, int etid) {
  if (p.act == FusedActivation::kNone) {
    store_handoff_plain<kThreads>(p, w, tile, etid);
    return;
  }
  with_gated_kind(p, [&](auto kind) {
    store_handoff_fused<T, kThreads, decltype(kind)::value>(p, w, tile, etid);
  });
}

}  // namespace moekit::cuda::sm90
