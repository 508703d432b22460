// CUDA versions of the layer's elementwise ops (see elementwise.h).
#include "core/cuda/elementwise.h"

#include <climits>

#include "core/cuda/cuda_check.cuh"
#include "core/cuda/elem_io.cuh"

namespace moekit {
namespace {

using cuda::from_f32;
using cuda::to_f32;

// row_scale null: plain sum; else row i / row of `other` is scaled by row_scale[i / row].
template <typename T>
__global__ void add_kernel(T* out, const T* other, const float* row_scale, int64_t row, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float o = to_f32(other[i]);
    out[i] = from_f32<T>(to_f32(out[i]) + (row_scale ? row_scale[i / row] * o : o));
  }
}

// sigmoid(x_row . g) for one token, computed by the whole block (kGateThreads threads, every
// thread gets the value): each thread's few products are independent loads, so the dot product
// costs about one memory latency rather than H / 32 of them.
constexpr int kGateThreads = 256;

template <typename T>
__device__ float block_gate(const T* x_row, const float* g, int64_t H) {
  __shared__ float partial[kGateThreads / 32];
  float acc = 0.0f;
#pragma unroll 4
  for (int64_t h = threadIdx.x; h < H; h += kGateThreads)
    acc += to_f32(x_row[h]) * g[h];
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
  __syncthreads();
  float dot = 0.0f;
#pragma unroll
  for (int w = 0; w < kGateThreads / 32; ++w)
    dot += partial[w];
  __syncthreads();  // partial is reused by the next token
  return 1.0f / (1.0f + expf(-dot));
}

// One block per token (the loop bound is block-uniform).
template <typename T>
__global__ void shared_gate_kernel(const T* x, const float* g, float* out, int64_t M, int64_t H) {
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    const float v = block_gate(x + m * H, g, H);
    if (threadIdx.x == 0) out[m] = v;
  }
}

// One block per token: the k routed slots copied, then `count` shared slots (append_shared_slots).
template <typename T>
__global__ void append_slots_kernel(const int32_t* ids, const float* w, int first_id, int count,
                                    const T* x, const float* g, int32_t* out_ids, float* out_w,
                                    int64_t M, int k, int64_t H) {
  const int k2 = k + count;
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    const float slot_w = g != nullptr ? block_gate(x + m * H, g, H) : 1.0f;
    for (int j = static_cast<int>(threadIdx.x); j < k2; j += kGateThreads) {
      out_ids[m * k2 + j] = j < k ? ids[m * k + j] : first_id + (j - k);
      out_w[m * k2 + j] = j < k ? w[m * k + j] : slot_w;
    }
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

void add_inplace_cuda(Tensor& out, const Tensor& other, const Tensor& row_scale, Stream stream) {
  const int64_t n = out.numel();
  if (n == 0) return;
  MOEKIT_CHECK(stream.handle != nullptr, "add_inplace: a CUDA stream is required");
  MOEKIT_CHECK(cuda::is_float_storage(out.dtype()),
               "add_inplace: dtype {} is not supported (bf16, f16, f32)", dtype_name(out.dtype()));
  const float* scale = row_scale.defined() ? row_scale.data_as<const float>() : nullptr;
  const int64_t row = row_scale.defined() ? out.size(1) : n;
  cuda::dispatch_float_type(cuda::elem_type_of(out.dtype()), [&](auto tag) {
    using T = decltype(tag);
    add_kernel<<<grid_for(n), 256, 0, to_cuda(stream)>>>(out.data_as<T>(), other.data_as<const T>(),
                                                         scale, row, n);
  });
  MOEKIT_CUDA_CHECK(cudaGetLastError());
}

void shared_expert_gate_cuda(const Tensor& x, const Tensor& gate_weight, Tensor& gate,
                             Stream stream) {
  const int64_t M = x.size(0), H = x.size(1);
  if (M == 0) return;
  MOEKIT_CHECK(stream.handle != nullptr, "shared_expert_gate: a CUDA stream is required");
  MOEKIT_CHECK(cuda::is_float_storage(x.dtype()), "shared_expert_gate: dtype {} is not supported",
               dtype_name(x.dtype()));
  cuda::dispatch_float_type(cuda::elem_type_of(x.dtype()), [&](auto tag) {
    using T = decltype(tag);
    shared_gate_kernel<<<grid_for(256 * M), kGateThreads, 0, to_cuda(stream)>>>(
        x.data_as<const T>(), gate_weight.data_as<const float>(), gate.data_as<float>(), M, H);
  });
  MOEKIT_CUDA_CHECK(cudaGetLastError());
}

void append_shared_slots_cuda(const Tensor& ids, const Tensor& weights, int first_id, int count,
                              const Tensor& x, const Tensor& gate_weight, Tensor& out_ids,
                              Tensor& out_weights, Stream stream) {
  const int64_t M = ids.size(0);
  if (M == 0) return;
  MOEKIT_CHECK(stream.handle != nullptr, "append_shared_slots: a CUDA stream is required");
  const bool gated = gate_weight.defined();
  const int64_t H = gated ? x.size(1) : 0;
  const cuda::ElemType xt = gated ? cuda::elem_type_of(x.dtype()) : cuda::ElemType::kF32;
  MOEKIT_CHECK(!gated || cuda::is_float_storage(x.dtype()),
               "append_shared_slots: dtype {} is not supported", dtype_name(x.dtype()));
  cuda::dispatch_float_type(xt, [&](auto tag) {
    using T = decltype(tag);
    append_slots_kernel<<<grid_for(256 * M), kGateThreads, 0, to_cuda(stream)>>>(
        ids.data_as<const int32_t>(), weights.data_as<const float>(), first_id, count,
        gated ? x.data_as<const T>() : nullptr,
        gated ? gate_weight.data_as<const float>() : nullptr, out_ids.data_as<int32_t>(),
        out_weights.data_as<float>(), M, static_cast<int>(ids.size(1)), H);
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
