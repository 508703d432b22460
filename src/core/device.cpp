#include "moekit/core/device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <thread>

#include "core/cuda/runtime.h"
#include "core/cuda_seam.h"
#include "moekit/core/error.h"

namespace moekit {

std::string Device::to_string() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

std::string DeviceInfo::to_string() const {
  if (type == DeviceType::kCPU) return "cpu";
  return fmt::format("{} (sm_{}{})", name, compute_capability, present ? "" : ", not present");
}

DeviceInfo cpu_device_info() {
  DeviceInfo info;
  info.name = "cpu";
  info.num_sms = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return info;
}

bool built_with_cuda() {
  return kCudaBuild;
}

int cuda_device_count() {
  if constexpr (kCudaBuild) {
    return cuda_rt::device_count(nullptr);
  } else {
    return 0;
  }
}

size_t cuda_memory_in_use(int index) {
  if constexpr (kCudaBuild) {
    const auto [free, total] = cuda_rt::memory_info(index);
    return total - free;
  } else {
    throw_no_cuda("cuda_memory_in_use");
  }
}

size_t cuda_memory_free(int index) {
  if constexpr (kCudaBuild) {
    return cuda_rt::memory_info(index).first;
  } else {
    throw_no_cuda("cuda_memory_free");
  }
}

std::string cuda_unavailable_reason() {
  if constexpr (kCudaBuild) {
    std::string reason;
    const int count = cuda_rt::device_count(&reason);
    return count > 0 ? std::string() : reason;
  } else {
    return "moekit was built without CUDA";
  }
}

DeviceInfo default_device_info() {
  if constexpr (kCudaBuild) {
    if (cuda_device_count() > 0) return cuda_rt::device_info(0);
  }
  return cpu_device_info();
}

DeviceInfo device_info_by_name(const std::string& name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (n == "cpu") return cpu_device_info();
  if (n == "auto" || n == "current") return default_device_info();
  DeviceInfo info;
  info.type = DeviceType::kCUDA;
  if (n == "h200") {
    info.name = "NVIDIA H200";
    info.compute_capability = 90;
    info.num_sms = 132;
  } else if (n == "h100") {
    info.name = "NVIDIA H100";
    info.compute_capability = 90;
    info.num_sms = 132;
  } else if (n == "a100") {
    info.name = "NVIDIA A100";
    info.compute_capability = 80;
    info.num_sms = 108;
  } else if (n == "b200") {
    info.name = "NVIDIA B200";
    info.compute_capability = 100;
    info.num_sms = 148;
  } else {
    throw Error(fmt::format(
        "moekit: unknown device '{}': expected one of cpu, auto, h200, h100, a100, b200", name));
  }
  const DeviceInfo current = default_device_info();
  info.present =
      current.type == DeviceType::kCUDA && current.compute_capability == info.compute_capability;
  if (info.present) return current;
  return info;
}

CudaStream::CudaStream(int device_index) {
  if constexpr (kCudaBuild) {
    handle_ = cuda_rt::create_stream(device_index);
  } else {
    throw_no_cuda("creating a CUDA stream");
  }
}

CudaStream::~CudaStream() {
  if constexpr (kCudaBuild) {
    if (handle_ != nullptr) cuda_rt::destroy_stream(handle_);
  }
}

void CudaStream::synchronize() const {
  moekit::synchronize(get());
}

void synchronize(Stream stream) {
  if constexpr (kCudaBuild) {
    if (stream.handle != nullptr) cuda_rt::synchronize_stream(stream.handle);
  }
}

}  // namespace moekit
