// Device entry points of core: the CUDA runtime calls the CPU-side code needs (runtime.cu). Callers
// reach them through the seam of core/cuda_seam.h (if constexpr (kCudaBuild)).
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "moekit/core/device.h"

namespace moekit::cuda_rt {

// Number of devices; on failure 0 and the reason.
int device_count(std::string* reason);
DeviceInfo device_info(int index);
// (free, total) bytes of device memory, after synchronizing the device.
std::pair<size_t, size_t> memory_info(int index);
void* allocate(size_t bytes, int device_index);
void release(void* ptr) noexcept;
// Synchronous copy between any two devices (host pointers for the CPU).
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Stream-ordered copy and memset (device memory).
void copy_async(void* dst, const void* src, size_t bytes, Stream stream);
void memset_async(void* dst, int value, size_t bytes, Stream stream);

void* create_stream(int device_index);
void destroy_stream(void* stream) noexcept;
void synchronize_stream(void* stream);
// Whether work queued on `stream` is being captured into a CUDA graph (not run).
bool stream_is_capturing(void* stream);

// Events (without timing) that order work between streams: `waiter` runs what is queued on it
// after `event` was recorded only once the work queued on the recording stream before it is done.
void* create_event(int device_index);
void destroy_event(void* event) noexcept;
void record_event(void* event, void* stream);
void stream_wait_event(void* waiter, void* event);

}  // namespace moekit::cuda_rt
