// One-warpgroup exercise of the kit's wgmma wrappers (see sm90_mma_selftest.h).
//
// This kernel does:
//   1. stage A (64 x 128 bytes) and B (n x 128 bytes) from global into shared memory in the chosen
//      layout, then fence.proxy.async so the tensor cores see the generic-proxy stores;
//   2. issue four Wgmma<T, n> (32 bytes of K each) into a zeroed accumulator, as one wgmma group;
//   3. store the m64nN accumulator fragment (warp w: rows 16w + lane/4 (+8), columns 8j +
//      (lane%4)*2 (+1)) to D.
#include "sm90_mma_selftest.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "experts/cuda/sm90/ptx.cuh"

namespace moekit::testing {
namespace {

namespace sm90 = cuda::sm90;

constexpr int kM = 64;
constexpr int kKBytes = 128;

// Byte offset of (row, k byte) of a rows x 128-byte operand in shared memory.
template <MmaLayout kLayout>
__device__ int staged_offset(int rows, int r, int c) {
  if constexpr (kLayout == MmaLayout::kSwizzle128) {
    return r * kKBytes + (((c >> 4) ^ (r & 7)) << 4) + (c & 15);
  } else {
    const int ks = c / sm90::kMmaKBytes, cc = c % sm90::kMmaKBytes;
    return ks * rows * sm90::kMmaKBytes + ((r / 8) * 2 + cc / 16) * 128 + (r % 8) * 16 + cc % 16;
  }
}

// Descriptor of K step ks of an operand staged at `base`.
template <MmaLayout kLayout>
__device__ uint64_t step_desc(uint32_t base, int rows, int ks) {
  if constexpr (kLayout == MmaLayout::kSwizzle128) {
    return sm90::sw128_desc(base + ks * sm90::kMmaKBytes);
  } else {
    return sm90::interleave_desc(base + ks * rows * sm90::kMmaKBytes, 128, 256);
  }
}

template <typename T, int N, MmaLayout kLayout>
__global__ void __launch_bounds__(128, 1)
    wgmma_selftest_kernel(const uint8_t* a, const uint8_t* b, typename sm90::Wgmma<T, N>::Acc* d) {
  using Acc = typename sm90::Wgmma<T, N>::Acc;
  __shared__ alignas(1024) uint8_t sa[kM * kKBytes];
  __shared__ alignas(1024) uint8_t sb[N * kKBytes];
  const int t = static_cast<int>(threadIdx.x);
  // 1. stage
  for (int i = t; i < kM * kKBytes; i += 128)
    sa[staged_offset<kLayout>(kM, i / kKBytes, i % kKBytes)] = a[i];
  for (int i = t; i < N * kKBytes; i += 128)
    sb[staged_offset<kLayout>(N, i / kKBytes, i % kKBytes)] = b[i];
  sm90::fence_proxy_async();
  __syncthreads();
  // 2. four K steps, one group
  Acc acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i)
    acc[i] = 0;
  const uint32_t base_a = sm90::smem_u32(sa), base_b = sm90::smem_u32(sb);
  sm90::fence_registers(acc);
  sm90::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kKBytes / sm90::kMmaKBytes; ++ks) {
    sm90::Wgmma<T, N>::run(acc, step_desc<kLayout>(base_a, kM, ks),
                           step_desc<kLayout>(base_b, N, ks));
  }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_registers(acc);
  // 3. store the fragment
  const int w = t / 32, lane = t % 32;
  const int r0 = 16 * w + lane / 4, c0 = (lane % 4) * 2;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      d[(r0 + 8 * h) * N + 8 * j + c0] = acc[4 * j + 2 * h];
      d[(r0 + 8 * h) * N + 8 * j + c0 + 1] = acc[4 * j + 2 * h + 1];
    }
  }
}

template <typename T, int N, MmaLayout kLayout>
cudaError_t launch(const uint8_t* a, const uint8_t* b, void* d) {
  using Acc = typename sm90::Wgmma<T, N>::Acc;
  wgmma_selftest_kernel<T, N, kLayout><<<1, 128>>>(a, b, static_cast<Acc*>(d));
  return cudaGetLastError();
}

template <typename T, MmaLayout kLayout>
cudaError_t launch_n(int n, const uint8_t* a, const uint8_t* b, void* d) {
  switch (n) {
    case 8:
      return launch<T, 8, kLayout>(a, b, d);
    case 64:
      return launch<T, 64, kLayout>(a, b, d);
    case 128:
      return launch<T, 128, kLayout>(a, b, d);
    case 256:
      return launch<T, 256, kLayout>(a, b, d);
    default:
      return cudaErrorInvalidValue;
  }
}

template <MmaLayout kLayout>
cudaError_t launch_typed(cuda::ElemType type, int n, const uint8_t* a, const uint8_t* b, void* d) {
  switch (type) {
    case cuda::ElemType::kBF16:
      return launch_n<__nv_bfloat16, kLayout>(n, a, b, d);
    case cuda::ElemType::kF16:
      return launch_n<__half, kLayout>(n, a, b, d);
    case cuda::ElemType::kE4M3:
      return launch_n<__nv_fp8_e4m3, kLayout>(n, a, b, d);
    case cuda::ElemType::kE5M2:
      return launch_n<__nv_fp8_e5m2, kLayout>(n, a, b, d);
    case cuda::ElemType::kS8:
      return launch_n<int8_t, kLayout>(n, a, b, d);
    default:
      return cudaErrorInvalidValue;
  }
}

// Owning device allocation.
struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  ~DeviceBytes() {
    if (p != nullptr) cudaFree(p);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

}  // namespace

std::string run_wgmma_selftest(cuda::ElemType type, int n, MmaLayout layout, const void* a,
                               const void* b, void* d) {
  const size_t a_bytes = kM * kKBytes, b_bytes = static_cast<size_t>(n) * kKBytes;
  const size_t d_bytes = static_cast<size_t>(kM) * n * 4;
  DeviceBytes da(a_bytes), db(b_bytes), dd(d_bytes);
  if (da.p == nullptr || db.p == nullptr || dd.p == nullptr) return "cudaMalloc failed";
  cudaError_t e = cudaMemcpy(da.p, a, a_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(db.p, b, b_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemset(dd.p, 0xFF, d_bytes);  // poison
  const auto* pa = static_cast<const uint8_t*>(da.p);
  const auto* pb = static_cast<const uint8_t*>(db.p);
  if (e == cudaSuccess) {
    e = layout == MmaLayout::kSwizzle128
            ? launch_typed<MmaLayout::kSwizzle128>(type, n, pa, pb, dd.p)
            : launch_typed<MmaLayout::kNoSwizzle>(type, n, pa, pb, dd.p);
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(d, dd.p, d_bytes, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

}  // namespace moekit::testing
