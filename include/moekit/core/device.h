// Devices and streams. A Device names where memory lives; a DeviceInfo describes the hardware a
// deployment targets (what the oracle checks); a Stream carries the CUDA stream through every GPU
// entry point (CPU work ignores it).
#pragma once

#include <cstdint>
#include <string>

namespace moekit {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::kCPU, 0}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;  // "cpu", "cuda:0"
};

// The hardware a deployment runs on, as the oracle sees it.
struct DeviceInfo {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  int compute_capability = 0;  // e.g. 90 for sm_90 (H100/H200); 0 on the CPU
  std::string name = "cpu";
  int num_sms = 0;
  // False when this describes a device that is not present (e.g. `moekit explain --device h200` on
  // a machine without a GPU). Kernels never run on such a device.
  bool present = true;
  // Planning only: judge kernels as they would be on this device with a build that has its
  // kernels (absence of the device or of CUDA in this build is not a reason). `moekit explain
  // --device h200` previews the H200 decision on any machine this way; layers refuse it.
  bool preview = false;

  Device device() const { return {type, index}; }
  std::string to_string() const;
};

// The CPU of this process.
DeviceInfo cpu_device_info();
// The current CUDA device when this build has CUDA and a GPU is present; otherwise the CPU.
DeviceInfo default_device_info();
// Whether the library was built with the CUDA path.
bool built_with_cuda();
// Number of usable CUDA devices (0 without CUDA or without a GPU). Never throws.
int cuda_device_count();
// Why no GPU is usable ("moekit was built without CUDA", "cudaGetDeviceCount: no CUDA-capable
// device is detected"), or "" when one is.
std::string cuda_unavailable_reason();
// Bytes of device memory in use on CUDA device `index` (total - free, after synchronizing the
// device): what `moekit soak` and the memory tests watch. Throws without CUDA.
size_t cuda_memory_in_use(int index);
// Free bytes of device memory on CUDA device `index`. Throws without CUDA.
size_t cuda_memory_free(int index);
// A named device for planning (`h200`, `h100`, `cpu`), marked not present unless it is this
// machine's.
DeviceInfo device_info_by_name(const std::string& name);

// A CUDA stream as an opaque handle (cudaStream_t). A null handle is rejected by GPU entry points:
// moekit never launches on the legacy default stream.
struct Stream {
  void* handle = nullptr;
};

// An owned CUDA stream (non-blocking, so it never serializes with the legacy default stream).
class CudaStream {
 public:
  explicit CudaStream(int device_index = 0);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  Stream get() const { return {handle_}; }
  void synchronize() const;

 private:
  void* handle_ = nullptr;
};

// Waits for all work queued on `stream` (no-op for a null stream on the CPU path).
void synchronize(Stream stream);

}  // namespace moekit
