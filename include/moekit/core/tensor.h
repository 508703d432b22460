// moekit::Tensor: a strided view (data pointer, dtype, device, shape, strides) that may share
// ownership of its storage. Views made from a tensor keep the storage alive.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moekit/core/device.h"
#include "moekit/core/dtype.h"

namespace moekit {

using Shape = std::vector<int64_t>;

// An owned block of memory on one device, freed by its deleter.
class Storage {
 public:
  Storage(void* data, size_t bytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  std::function<void(void*)> deleter_;
};

// Allocates device memory for tensors. The CPU allocator is built in; the CUDA allocator is
// registered by the CUDA build (a documented registry, see set_allocator).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::shared_ptr<Storage> allocate(size_t bytes, Device device) = 0;
};
Allocator& allocator_for(DeviceType type);
// Replaces the allocator of a device type (e.g. a caching allocator of an inference engine).
void set_allocator(DeviceType type, std::shared_ptr<Allocator> allocator);

class Tensor {
 public:
  Tensor() = default;

  // New contiguous tensor; contents uninitialized.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // A non-owning view of existing memory (strides default to contiguous).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                          const Shape& strides = {});
  // A view of `data` that keeps `storage` alive (imports from other frameworks).
  static Tensor from_storage(std::shared_ptr<Storage> storage, void* data, const Shape& shape,
                             DType dtype, const Shape& strides = {});
  // A CPU tensor holding a copy of the values, converted to dtype.
  static Tensor from_floats(std::span<const float> values, const Shape& shape, DType dtype);
  static Tensor from_ints(std::span<const int64_t> values, const Shape& shape, DType dtype);

  bool defined() const { return data_ != nullptr || (numel() == 0 && dtype_set_); }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t stride(int d) const;
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Views. view() needs a contiguous tensor and the same number of elements.
  Tensor view(const Shape& shape) const;
  Tensor slice(int d, int64_t begin, int64_t end) const;
  Tensor select(int64_t index) const;  // along dim 0
  // Reinterpret the first `numel(shape)` elements of a contiguous buffer as `shape`/`dtype`
  // (the seed's _resize_cache): the buffer must be large enough.
  Tensor reinterpret(const Shape& shape, DType dtype) const;

  // Copies. to() and clone() return contiguous tensors; copy_from() copies values between any two
  // tensors of the same shape and dtype (CPU<->CUDA needs the CUDA build; the copy is synchronous).
  Tensor to(Device device) const;
  Tensor clone() const;
  void copy_from(const Tensor& src);
  // Stream-ordered copy between two contiguous tensors of the same shape and dtype on the same CUDA
  // device (no host synchronization); plain copy_from on the CPU.
  void copy_from_async(const Tensor& src, Stream stream);
  // CPU only: converts to another dtype (float formats round to nearest even).
  Tensor to_dtype(DType dtype) const;
  // CPU only: every element as float / double / int64, in row-major order.
  std::vector<float> to_float_vector() const;
  std::vector<int64_t> to_int_vector() const;
  // CPU only: fills every byte with `byte` (0xFF poisons floats with NaN).
  void fill_bytes(uint8_t byte);
  void fill(double value);

  // "bf16[4, 8] cpu"
  std::string describe() const;

 private:
  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  bool dtype_set_ = false;
  Device device_;
  Shape shape_;
  Shape strides_;
};

int64_t numel_of(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string shape_to_string(const Shape& shape);

// CPU element access as float / int64 at a flat contiguous index (any dtype).
float load_float(const void* data, DType dtype, int64_t index);
void store_float(void* data, DType dtype, int64_t index, float value);
int64_t load_int(const void* data, DType dtype, int64_t index);

// Rounds a float to the precision of dtype (identity for f32/f64).
float round_to_dtype(float value, DType dtype);

}  // namespace moekit
