// How fast can a decode GEMM stream its weights? A probe of the load patterns alone (no math):
// the weights of a decode GEMM at one token per expert (tiles of 64 weight rows x all of K, the
// swap-AB / single-role layout, row pitch = K bytes) read into a shared-memory ring by several
// methods, and the same bytes read as one contiguous range per CTA (a pre-tiled layout).
//
// Build:  nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -o stream_probe \
//           bench/probes/weight_stream_probe.cu
// Run:    ./stream_probe            (prints a markdown table, one line per shape and method)
//
// Method: 8 windows of the shape's bytes (past L2) rotated over 24 launches captured in one CUDA
// graph; median of 7 replays / 24 = one launch including the gap between graph nodes.
//
// Load methods (each CTA: a 128-thread ring of kStages stages, a stage refilled once every thread
// passed the __syncthreads after reading it):
//   cp16:   every thread copies 16-byte chunks of the stage's 64 row segments (cp.async.cg), as the
//           single-role kernels do;
//   bulk:   one cp.async.bulk per row segment (64 per stage) on the stage's mbarrier;
//   contig: the tile stored contiguously (pre-tiled): one cp.async.bulk of the whole stage.
// Grids: `tile` = one CTA per 64-row tile (all of K); `split` = persistent, 132 x ctas_per_sm
// CTAs, each taking an equal contiguous share of the (tile, K stage) units (split-K streaming).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace {

constexpr int kRows = 64;
constexpr int kThreads = 128;

enum class Method { kCp16, kBulk, kContig };

struct Shape {
  const char* name;
  int tiles;      // 64-row tiles (experts x n-tiles)
  int row_bytes;  // K * 2 (bf16)
};

struct Params {
  const uint8_t* base;  // this launch's window
  int tiles;
  int row_bytes;
  int stage_bytes;  // per row
  int units_per_tile;
  long long total_units;
  uint32_t* sink;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes));
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::
          "r"(smem_addr(bar)),
      "r"(parity));
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
}

// Unit u = (tile u / units_per_tile, K stage u % units_per_tile). Tile-major layout: row r of tile
// t at base + (t * 64 + r) * row_bytes; contiguous layout: the unit's 64 x stage_bytes in one run.
template <Method kMethod, int kStages>
__global__ void __launch_bounds__(kThreads) stream_kernel(Params p, long long first_unit_stride) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full[kStages];
  const int stage_size = kRows * p.stage_bytes;
  // This CTA's contiguous share of the units.
  const long long per_cta = (p.total_units + gridDim.x - 1) / gridDim.x;
  const long long u0 = blockIdx.x * per_cta;
  const long long u1 = u0 + per_cta < p.total_units ? u0 + per_cta : p.total_units;
  const int n = u1 > u0 ? static_cast<int>(u1 - u0) : 0;
  (void)first_unit_stride;
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s)
      mbar_init(&full[s], 1);
  __syncthreads();

  auto issue = [&](int i) {
    if (i >= n) {
      if constexpr (kMethod == Method::kCp16) asm volatile("cp.async.commit_group;");
      return;
    }
    const long long u = u0 + i;
    const long long t = u / p.units_per_tile;
    const int ks = static_cast<int>(u % p.units_per_tile);
    uint8_t* dst = smem + (i % kStages) * stage_size;
    if constexpr (kMethod == Method::kCp16) {
      const int chunks_per_row = p.stage_bytes / 16;
      for (int c = threadIdx.x; c < kRows * chunks_per_row; c += kThreads) {
        const int r = c / chunks_per_row, q = c % chunks_per_row;
        cp16(dst + r * p.stage_bytes + q * 16,
             p.base + (t * kRows + r) * p.row_bytes + ks * p.stage_bytes + q * 16);
      }
      asm volatile("cp.async.commit_group;");
    } else if constexpr (kMethod == Method::kBulk) {
      uint64_t* bar = &full[i % kStages];
      if (threadIdx.x == 0) mbar_expect_tx(bar, stage_size);
      __syncwarp();
      if (threadIdx.x < 32)
        for (int r = threadIdx.x; r < kRows; r += 32)
          bulk_copy(dst + r * p.stage_bytes,
                    p.base + (t * kRows + r) * p.row_bytes + ks * p.stage_bytes, p.stage_bytes,
                    bar);
    } else {
      uint64_t* bar = &full[i % kStages];
      if (threadIdx.x == 0) {
        mbar_expect_tx(bar, stage_size);
        bulk_copy(dst, p.base + u * stage_size, stage_size, bar);
      }
    }
  };

  uint32_t acc = 0;
  for (int i = 0; i < kStages - 1; ++i)
    issue(i);
  for (int i = 0; i < n; ++i) {
    if constexpr (kMethod == Method::kCp16) {
      asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2));
      __syncthreads();
    } else {
      mbar_wait(&full[i % kStages], (i / kStages) & 1);
    }
    const uint8_t* src = smem + (i % kStages) * stage_size;
    for (int c = threadIdx.x * 16; c < stage_size; c += kThreads * 16)
      acc ^= *reinterpret_cast<const uint32_t*>(src + c);
    __syncthreads();  // every thread is done with slot i % kStages (refilled just below)
    issue(i + kStages - 1);
  }
  if constexpr (kMethod == Method::kCp16) asm volatile("cp.async.wait_all;");
  if (acc == 0x12345678u) p.sink[blockIdx.x] = acc;  // keeps the reads
}

// A plain streaming read of the same bytes: every thread 16-byte loads, 4 in flight, grid-strided.
__global__ void __launch_bounds__(256) read_kernel(const uint4* p, long long n, uint32_t* sink) {
  uint32_t acc = 0;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
          d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride)
    acc ^= __ldcs(p + i).x;
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

struct Case {
  Method method;
  int stages;
  int stage_bytes;  // per row
  bool split;
  int ctas_per_sm;  // split grids
};

const char* method_name(Method m) {
  return m == Method::kCp16 ? "cp16" : m == Method::kBulk ? "bulk/row" : "contig";
}

template <Method kMethod, int kStages>
void launch(const Params& p, int grid, cudaStream_t s) {
  const int smem = kStages * kRows * p.stage_bytes;
  static bool configured = false;
  if (!configured) {
    CHECK(cudaFuncSetAttribute(stream_kernel<kMethod, kStages>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    configured = true;
  }
  stream_kernel<kMethod, kStages><<<grid, kThreads, smem, s>>>(p, 0);
}

void dispatch(const Case& c, const Params& p, int grid, cudaStream_t s) {
#define MOEKIT_PROBE_CASE(M, S) \
  if (c.method == M && c.stages == S) return launch<M, S>(p, grid, s);
  MOEKIT_PROBE_CASE(Method::kCp16, 3)
  MOEKIT_PROBE_CASE(Method::kCp16, 8)
  MOEKIT_PROBE_CASE(Method::kCp16, 12)
  MOEKIT_PROBE_CASE(Method::kBulk, 3)
  MOEKIT_PROBE_CASE(Method::kBulk, 8)
  MOEKIT_PROBE_CASE(Method::kBulk, 12)
  MOEKIT_PROBE_CASE(Method::kContig, 3)
  MOEKIT_PROBE_CASE(Method::kContig, 8)
  MOEKIT_PROBE_CASE(Method::kContig, 12)
#undef MOEKIT_PROBE_CASE
  std::printf("no instance %d %d\n", static_cast<int>(c.method), c.stages);
  std::exit(1);
}

template <typename F>
double time_graph(F&& launch_one, cudaStream_t s) {
  constexpr int kLaunches = 24;
  launch_one(0);  // outside the capture: the first launch sets the kernel's shared-memory limit
  CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kLaunches; ++i)
    launch_one(i);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < 9; ++r) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (r >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  return ms[ms.size() / 2] * 1e3 / kLaunches;
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // The decode GEMMs at one token per expert (bf16): experts x N / 64 tiles, K * 2 bytes per row.
  const std::vector<Shape> shapes = {
      {"qwen3 GEMM1 M=1 (8 x 1536 x 2048)", 8 * 1536 / 64, 2048 * 2},
      {"qwen3 GEMM2 M=1 (8 x 2048 x 768)", 8 * 2048 / 64, 768 * 2},
      {"gpt-oss GEMM1 M=1 (4 x 5760 x 2880)", 4 * 5760 / 64, 2880 * 2},
      {"gpt-oss GEMM2 M=1 (4 x 2880 x 2880)", 4 * 2880 / 64, 2880 * 2},
      {"deepseek GEMM1 M=1 (8 x 4096 x 7168)", 8 * 4096 / 64, 7168 * 2},
  };
  // Stages of 8 KB (64 x 128 B) or 32 KB (64 x 512 B); 8 x 8 KB and 3 x 32 KB leave room for two
  // CTAs per SM, 12 x 8 KB too (96 KB each).
  const std::vector<Case> cases = {
      {Method::kCp16, 8, 128, false, 0},   {Method::kCp16, 12, 128, false, 0},
      {Method::kCp16, 3, 512, false, 0},   {Method::kBulk, 8, 128, false, 0},
      {Method::kBulk, 12, 128, false, 0},  {Method::kBulk, 3, 512, false, 0},
      {Method::kContig, 8, 128, false, 0}, {Method::kContig, 3, 512, false, 0},
      {Method::kCp16, 8, 128, true, 2},    {Method::kCp16, 12, 128, true, 2},
      {Method::kCp16, 3, 512, true, 2},    {Method::kBulk, 8, 128, true, 2},
      {Method::kBulk, 12, 128, true, 2},   {Method::kBulk, 3, 512, true, 2},
      {Method::kContig, 8, 128, true, 2},  {Method::kContig, 12, 128, true, 1},
      {Method::kContig, 3, 512, true, 2},  {Method::kBulk, 12, 128, true, 1},
  };
  size_t max_bytes = 0;
  for (const Shape& s : shapes)
    max_bytes = std::max(max_bytes, size_t(s.tiles) * kRows * s.row_bytes);
  constexpr int kWindows = 8;
  uint8_t* buf;
  CHECK(cudaMalloc(&buf, max_bytes * kWindows));
  CHECK(cudaMemset(buf, 0x5a, max_bytes * kWindows));
  uint32_t* sink;
  CHECK(cudaMalloc(&sink, 4096 * sizeof(uint32_t)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  std::printf("| shape | MB | method | stage (rows x B) | stages | grid | us | TB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    const size_t bytes = size_t(sh.tiles) * kRows * sh.row_bytes;
    const double us_read = time_graph(
        [&](int i) {
          read_kernel<<<sms * 4, 256, 0, s>>>(
              reinterpret_cast<const uint4*>(buf + (i % kWindows) * max_bytes),
              static_cast<long long>(bytes / 16), sink);
        },
        s);
    std::printf("| %s | %.1f | plain read | - | - | %d | %.1f | %.2f |\n", sh.name, bytes / 1e6,
                sms * 4, us_read, bytes / us_read / 1e6);
    for (const Case& c : cases) {
      if (sh.row_bytes % c.stage_bytes != 0) continue;
      Params p{};
      p.tiles = sh.tiles;
      p.row_bytes = sh.row_bytes;
      p.stage_bytes = c.stage_bytes;
      p.units_per_tile = sh.row_bytes / c.stage_bytes;
      p.total_units = static_cast<long long>(sh.tiles) * p.units_per_tile;
      p.sink = sink;
      const int grid = c.split ? sms * c.ctas_per_sm : sh.tiles;
      const double us = time_graph(
          [&](int i) {
            Params q = p;
            q.base = buf + (i % kWindows) * max_bytes;
            dispatch(c, q, grid, s);
          },
          s);
      std::printf("| %s | %.1f | %s | 64 x %d | %d | %s %d | %.1f | %.2f |\n", sh.name, bytes / 1e6,
                  method_name(c.method), c.stage_bytes, c.stages, c.split ? "split" : "tile", grid,
                  us, bytes / us / 1e6);
    }
  }
  CHECK(cudaGetLastError());
  return 0;
}
