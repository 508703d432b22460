#include <string>

#include "core/cuda/cuda_check.cuh"
#include "core/cuda/runtime.h"

namespace moekit::cuda_rt {

int device_count(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason) *reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky-free error state
    return 0;
  }
  if (count == 0 && reason) *reason = "cudaGetDeviceCount returned 0 devices";
  return count;
}

DeviceInfo device_info(int index) {
  cudaDeviceProp prop{};
  MOEKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  DeviceInfo info;
  info.type = DeviceType::kCUDA;
  info.index = index;
  info.compute_capability = prop.major * 10 + prop.minor;
  info.name = prop.name;
  info.num_sms = prop.multiProcessorCount;
  info.present = true;
  return info;
}

std::pair<size_t, size_t> memory_info(int index) {
  int previous = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&previous));
  MOEKIT_CUDA_CHECK(cudaSetDevice(index));
  size_t free = 0, total = 0;
  const cudaError_t sync = cudaDeviceSynchronize();
  const cudaError_t info = cudaMemGetInfo(&free, &total);
  cudaSetDevice(previous);
  MOEKIT_CUDA_CHECK(sync);
  MOEKIT_CUDA_CHECK(info);
  return {free, total};
}

void* allocate(size_t bytes, int device_index) {
  int previous = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&previous));
  MOEKIT_CUDA_CHECK(cudaSetDevice(device_index));
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes == 0 ? 1 : bytes);
  cudaSetDevice(previous);
  MOEKIT_CHECK(status == cudaSuccess, "cudaMalloc of {} bytes on cuda:{} failed: {}", bytes,
               device_index, cudaGetErrorString(status));
  return ptr;
}

void release(void* ptr) noexcept {
  cudaFree(ptr);
}

// Returns once the bytes are at dst. Not cudaMemcpy alone: from pageable host memory it may
// return while the DMA to the device is still in flight (the runtime API's synchronization
// behavior of memcpy), and work on moekit's non-blocking streams is not ordered after the legacy
// stream's copy, so a kernel launched right after could read stale bytes (the suspected cause of
// a QuantizedGpu.DeviceQuantizerIsBitExact failure on an H100: only its largest input, 1 MB of
// f32, came out wrong, in one run of two).
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDefault;
  if (dst_device.is_cpu() && src_device.is_cuda()) kind = cudaMemcpyDeviceToHost;
  if (dst_device.is_cuda() && src_device.is_cpu()) kind = cudaMemcpyHostToDevice;
  if (dst_device.is_cuda() && src_device.is_cuda()) kind = cudaMemcpyDeviceToDevice;
  MOEKIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cudaStreamLegacy));
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void copy_async(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  MOEKIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, to_cuda(stream)));
}

void memset_async(void* dst, int value, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  MOEKIT_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, to_cuda(stream)));
}

void* create_stream(int device_index) {
  MOEKIT_CUDA_CHECK(cudaSetDevice(device_index));
  cudaStream_t stream = nullptr;
  MOEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

void destroy_stream(void* stream) noexcept {
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void synchronize_stream(void* stream) {
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

void* create_event(int device_index) {
  MOEKIT_CUDA_CHECK(cudaSetDevice(device_index));
  cudaEvent_t event = nullptr;
  MOEKIT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void destroy_event(void* event) noexcept {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void record_event(void* event, void* stream) {
  MOEKIT_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

void stream_wait_event(void* waiter, void* event) {
  MOEKIT_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), static_cast<cudaEvent_t>(event), 0));
}

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MOEKIT_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace moekit::cuda_rt
