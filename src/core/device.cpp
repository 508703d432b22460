#include "moekit/core/device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <thread>

#include "core/cuda_runtime.h"
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
#ifdef MOEKIT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef MOEKIT_WITH_CUDA
  return cuda_rt::device_count(nullptr);
#else
  return 0;
#endif
}

std::string cuda_unavailable_reason() {
#ifdef MOEKIT_WITH_CUDA
  std::string reason;
  const int count = cuda_rt::device_count(&reason);
  return count > 0 ? std::string() : reason;
#else
  return "moekit was built without CUDA";
#endif
}

DeviceInfo default_device_info() {
#ifdef MOEKIT_WITH_CUDA
  if (cuda_device_count() > 0) return cuda_rt::device_info(0);
#endif
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
#ifdef MOEKIT_WITH_CUDA
  handle_ = cuda_rt::create_stream(device_index);
#else
  (void)device_index;
  throw Error("moekit: cannot create a CUDA stream: moekit was built without CUDA");
#endif
}

CudaStream::~CudaStream() {
#ifdef MOEKIT_WITH_CUDA
  if (handle_ != nullptr) cuda_rt::destroy_stream(handle_);
#endif
}

void CudaStream::synchronize() const {
  moekit::synchronize(get());
}

void synchronize(Stream stream) {
#ifdef MOEKIT_WITH_CUDA
  if (stream.handle != nullptr) cuda_rt::synchronize_stream(stream.handle);
#else
  (void)stream;
#endif
}

}  // namespace moekit
