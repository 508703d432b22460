// CUDA versions of the layer's elementwise ops (see elementwise.h).
#include "core/cuda/elementwise.h"

#include <climits>

#include "core/cuda/cuda_check.cuh"
#include "core/cuda/elem_io.cuh"

namespace moekit {
namespace {

using cuda::from_f32;
using cuda::to_f32;

template <typename T>
__global__ void add_kernel(T* out, const T* other, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = from_f32<T>(to_f32(out[i]) + to_f32(other[i]));
  }
}

__global__ void ids_kernel(const int64_t* src, int32_t* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = src[i];
    dst[i] = (v < -1 || v > INT_MAX) ? INT_MAX : static_cast<int32_t>(v);
  }
}

__device__ float hashed_uniform_dev(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename T>
__global__ void fill_uniform_kernel(T* out, int64_t n, uint64_t seed, float scale,
                                    uint64_t first_index) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = from_f32<T>(scale * hashed_uniform_dev(seed, first_index + static_cast<uint64_t>(i)));
  }
}

template <typename T>
__global__ void scale_rows_kernel(T* out, const T* in, const float* w, int64_t M, int64_t K) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * K;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = from_f32<T>(to_f32(in[i]) * w[i / K]);
  }
}

// One thread per 16-byte (or element) chunk of a destination row; rows permuted per elementwise.h.
__global__ void interleave_rows_kernel(char* dst, const char* src, int64_t E, int64_t n,
                                       int64_t row_bytes, bool pairwise) {
  const int64_t chunks = row_bytes / 16;
  const int64_t total = E * n * chunks;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks, c = i % chunks;
    const int64_t e = row / n, r = row % n;
    const int64_t block = r / 64, w = r % 64, col = block * 32 + (w % 32);
    const int64_t s_r =
        w < 32 ? (pairwise ? 2 * col : col) : (pairwise ? 2 * col + 1 : n / 2 + col);
    reinterpret_cast<uint4*>(dst + (e * n + r) * row_bytes)[c] =
        reinterpret_cast<const uint4*>(src + (e * n + s_r) * row_bytes)[c];
  }
}

int grid_for(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
}

}  // namespace

void add_inplace_cuda(Tensor& out, const Tensor& other, Stream stream) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MOEKIT_CHECK(stream.handle != nullptr, "add_inplace: a CUDA stream is required");
  MOEKIT_CHECK(cuda::is_float_storage(out.dtype()),
               "add_inplace: dtype {} is not supported (bf16, f16, f32)", dtype_name(out.dtype()));
  cuda::dispatch_float_type(cuda::elem_type_of(out.dtype()), [&](auto tag) {
    using T = decltype(tag);
    add_kernel<<<grid_for(n), 256, 0, to_cuda(stream)>>>(out.data_as<T>(), other.data_as<const T>(),
                                                         n);
  });
  MOEKIT_CUDA_CHECK(cudaGetLastError());
}

void interleave_gate_up_blocks_cuda(Tensor& dst, const Tensor& src, bool pairwise, Stream stream) {
  const int64_t E = src.size(0), n = src.size(1), K = src.dim() == 3 ? src.size(2) : 1;
  const int64_t row_bytes = K * static_cast<int64_t>(element_size(src.dtype()));
  MOEKIT_CHECK(row_bytes % 16 == 0,
               "interleave_gate_up_blocks on the GPU needs rows of a multiple of 16 bytes, got {}",
               row_bytes);
  cudaStream_t s = to_cuda(stream);
  cudaStream_t own = nullptr;
  if (s == nullptr) {
    MOEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
    s = own;
  }
  interleave_rows_kernel<<<grid_for(E * n * (row_bytes / 16)), 256, 0, s>>>(
      static_cast<char*>(dst.data()), static_cast<const char*>(src.data()), E, n, row_bytes,
      pairwise);
  MOEKIT_CUDA_CHECK(cudaGetLastError());
  if (own != nullptr) {
    MOEKIT_CUDA_CHECK(cudaStreamSynchronize(own));
    MOEKIT_CUDA_CHECK(cudaStreamDestroy(own));
  }
}

void scale_rows_cuda(Tensor& out, const Tensor& in, const Tensor& weights, Stream stream) {
  const int64_t M = in.size(0), K = in.size(1);
  if (M * K == 0) return;
  MOEKIT_CHECK(stream.handle != nullptr, "scale_rows: a CUDA stream is required");
  MOEKIT_CHECK(out.dtype() == in.dtype(), "scale_rows: {} vs {}", out.describe(), in.describe());
  MOEKIT_CHECK(cuda::is_float_storage(in.dtype()), "scale_rows: dtype {} is not supported",
               dtype_name(in.dtype()));
  const float* w = weights.data_as<const float>();
  cuda::dispatch_float_type(cuda::elem_type_of(in.dtype()), [&](auto tag) {
    using T = decltype(tag);
    scale_rows_kernel<<<grid_for(M * K), 256, 0, to_cuda(stream)>>>(out.data_as<T>(),
                                                                    in.data_as<const T>(), w, M, K);
  });
  MOEKIT_CUDA_CHECK(cudaGetLastError());
}

void fill_uniform_cuda(Tensor& t, uint64_t seed, float scale, Stream stream, uint64_t first_index) {
  const int64_t n = t.numel();
  if (n == 0) return;
  // A null stream means "synchronous": use a private stream and wait for it.
  cudaStream_t s = to_cuda(stream);
  cudaStream_t own = nullptr;
  if (s == nullptr) {
    MOEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
    s = own;
  }
  MOEKIT_CHECK(cuda::is_float_storage(t.dtype()),
               "fill_uniform: dtype {} is not supported on the GPU (bf16, f16, f32)",
               dtype_name(t.dtype()));
  cuda::dispatch_float_type(cuda::elem_type_of(t.dtype()), [&](auto tag) {
    using T = decltype(tag);
    fill_uniform_kernel<<<grid_for(n), 256, 0, s>>>(t.data_as<T>(), n, seed, scale, first_index);
  });
  MOEKIT_CUDA_CHECK(cudaGetLastError());
  if (own != nullptr) {
    MOEKIT_CUDA_CHECK(cudaStreamSynchronize(own));
    MOEKIT_CUDA_CHECK(cudaStreamDestroy(own));
  }
}

void convert_ids_to_int32_cuda(const Tensor& ids64, Tensor& ids32, Stream stream) {
  const int64_t n = ids64.numel();
  if (n == 0) return;
  MOEKIT_CHECK(stream.handle != nullptr, "convert_ids_to_int32: a CUDA stream is required");
  ids_kernel<<<grid_for(n), 256, 0, to_cuda(stream)>>>(ids64.data_as<const int64_t>(),
                                                       ids32.data_as<int32_t>(), n);
  MOEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit
