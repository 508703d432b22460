#include "moekit/core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/cuda/runtime.h"
#include "core/cuda_seam.h"
#include "moekit/core/error.h"
#include "moekit/core/half.h"
#include "moekit/quant/formats.h"

namespace moekit {

Storage::Storage(void* data, size_t bytes, Device device, std::function<void(void*)> deleter)
    : data_(data), bytes_(bytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_ && data_ != nullptr) deleter_(data_);
}

namespace {

class CpuAllocator final : public Allocator {
 public:
  std::shared_ptr<Storage> allocate(size_t bytes, Device device) override {
    // 64-byte alignment for vector loads; at least one byte so the pointer is never null.
    const size_t rounded = ((bytes + 63) / 64) * 64;
    void* ptr = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    MOEKIT_CHECK(ptr != nullptr, "host allocation of {} bytes failed", bytes);
    return std::make_shared<Storage>(ptr, bytes, device, [](void* p) { std::free(p); });
  }
};

class CudaAllocator final : public Allocator {
 public:
  std::shared_ptr<Storage> allocate(size_t bytes, Device device) override {
    if constexpr (kCudaBuild) {
      void* ptr = cuda_rt::allocate(bytes, device.index);
      return std::make_shared<Storage>(ptr, bytes, device, [](void* p) { cuda_rt::release(p); });
    } else {
      throw_no_cuda(fmt::format("allocating {} bytes on {}", bytes, device.to_string()));
    }
  }
};

// NOTE: the allocator registry is the library's documented global state (set_allocator).
struct AllocatorRegistry {
  std::mutex mutex;
  std::shared_ptr<Allocator> cpu = std::make_shared<CpuAllocator>();
  std::shared_ptr<Allocator> cuda = std::make_shared<CudaAllocator>();
};

AllocatorRegistry& registry() {
  static AllocatorRegistry r;
  return r;
}

}  // namespace

Allocator& allocator_for(DeviceType type) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return type == DeviceType::kCPU ? *registry().cpu : *registry().cuda;
}

void set_allocator(DeviceType type, std::shared_ptr<Allocator> allocator) {
  MOEKIT_CHECK(allocator != nullptr, "set_allocator: allocator must not be null");
  std::lock_guard<std::mutex> lock(registry().mutex);
  (type == DeviceType::kCPU ? registry().cpu : registry().cuda) = std::move(allocator);
}

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

std::string shape_to_string(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    MOEKIT_CHECK(d >= 0, "Tensor::empty: shape {} has a negative dimension",
                 shape_to_string(shape));
  }
  Tensor t;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  t.device_ = device;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.storage_ = allocator_for(device.type).allocate(t.nbytes(), device);
  t.data_ = t.storage_->data();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    std::memset(t.data_, 0, t.nbytes());
  } else {
    const std::vector<uint8_t> zeros(t.nbytes(), 0);
    t.copy_from(from_blob(const_cast<uint8_t*>(zeros.data()), shape, dtype, Device::cpu()));
  }
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         const Shape& strides) {
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.dtype_set_ = true;
  t.device_ = device;
  t.shape_ = shape;
  t.strides_ = strides.empty() ? contiguous_strides(shape) : strides;
  MOEKIT_CHECK(t.strides_.size() == shape.size(), "from_blob: {} strides for a {}-d shape",
               t.strides_.size(), shape.size());
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, void* data, const Shape& shape,
                            DType dtype, const Shape& strides) {
  MOEKIT_CHECK(storage != nullptr, "from_storage: storage must not be null");
  Tensor t = from_blob(data, shape, dtype, storage->device(), strides);
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::from_floats(std::span<const float> values, const Shape& shape, DType dtype) {
  MOEKIT_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape),
               "from_floats: {} values for shape {}", values.size(), shape_to_string(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i)
    store_float(t.data_, dtype, static_cast<int64_t>(i), values[i]);
  return t;
}

Tensor Tensor::from_ints(std::span<const int64_t> values, const Shape& shape, DType dtype) {
  MOEKIT_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape),
               "from_ints: {} values for shape {}", values.size(), shape_to_string(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t v = values[i];
    switch (dtype) {
      case DType::kInt32:
        t.data_as<int32_t>()[i] = static_cast<int32_t>(v);
        break;
      case DType::kInt64:
        t.data_as<int64_t>()[i] = v;
        break;
      case DType::kInt8:
        t.data_as<int8_t>()[i] = static_cast<int8_t>(v);
        break;
      case DType::kUInt8:
        t.data_as<uint8_t>()[i] = static_cast<uint8_t>(v);
        break;
      default:
        store_float(t.data_, dtype, static_cast<int64_t>(i), static_cast<float>(v));
    }
  }
  return t;
}

int64_t Tensor::size(int d) const {
  const int n = dim();
  const int i = d < 0 ? d + n : d;
  MOEKIT_CHECK(i >= 0 && i < n, "dimension {} out of range for a tensor of shape {}", d,
               shape_to_string(shape_));
  return shape_[i];
}

int64_t Tensor::stride(int d) const {
  const int n = dim();
  const int i = d < 0 ? d + n : d;
  MOEKIT_CHECK(i >= 0 && i < n, "dimension {} out of range for a tensor of shape {}", d,
               shape_to_string(shape_));
  return strides_[i];
}

int64_t Tensor::numel() const {
  return numel_of(shape_);
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  MOEKIT_CHECK(is_contiguous(), "view: tensor {} is not contiguous", describe());
  MOEKIT_CHECK(numel_of(shape) == numel(), "view: cannot view {} as shape {}", describe(),
               shape_to_string(shape));
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  const int i = d < 0 ? d + dim() : d;
  MOEKIT_CHECK(i >= 0 && i < dim(), "slice: dimension {} out of range for {}", d, describe());
  MOEKIT_CHECK(0 <= begin && begin <= end && end <= shape_[i],
               "slice: range [{}, {}) out of bounds for dimension {} of {}", begin, end, d,
               describe());
  Tensor t = *this;
  t.data_ =
      static_cast<char*>(data_) + begin * strides_[i] * static_cast<int64_t>(element_size(dtype_));
  t.shape_[i] = end - begin;
  return t;
}

Tensor Tensor::select(int64_t index) const {
  MOEKIT_CHECK(dim() >= 1, "select: tensor {} has no dimension to select", describe());
  Tensor t = slice(0, index, index + 1);
  t.shape_.erase(t.shape_.begin());
  t.strides_.erase(t.strides_.begin());
  return t;
}

Tensor Tensor::reinterpret(const Shape& shape, DType dtype) const {
  MOEKIT_CHECK(is_contiguous(), "reinterpret: tensor {} is not contiguous", describe());
  const size_t need = static_cast<size_t>(numel_of(shape)) * element_size(dtype);
  MOEKIT_CHECK(need <= nbytes(), "reinterpret: {} bytes needed for {} {} but buffer {} holds {}",
               need, dtype_name(dtype), shape_to_string(shape), describe(), nbytes());
  Tensor t = *this;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

namespace {

// Copies a strided CPU tensor into contiguous memory.
void gather_contiguous(const Tensor& src, void* dst) {
  const size_t es = element_size(src.dtype());
  if (src.is_contiguous()) {
    std::memcpy(dst, src.data(), src.nbytes());
    return;
  }
  const int64_t n = src.numel();
  std::vector<int64_t> index(src.dim(), 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t offset = 0;
    for (int d = 0; d < src.dim(); ++d)
      offset += index[d] * src.strides()[d];
    std::memcpy(static_cast<char*>(dst) + flat * es,
                static_cast<const char*>(src.data()) + offset * es, es);
    for (int d = src.dim() - 1; d >= 0; --d) {
      if (++index[d] < src.shape()[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

Tensor Tensor::to(Device device) const {
  Tensor out = empty(shape_, dtype_, device);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::clone() const {
  return to(device_);
}

void Tensor::copy_from(const Tensor& src) {
  MOEKIT_CHECK(src.shape() == shape_ && src.dtype() == dtype_,
               "copy_from: source {} does not match destination {}", src.describe(), describe());
  if (numel() == 0) return;
  if (device_.is_cpu() && src.device().is_cpu()) {
    if (is_contiguous()) {
      gather_contiguous(src, data_);
      return;
    }
    MOEKIT_CHECK(false, "copy_from: destination {} must be contiguous", describe());
  }
  if constexpr (!kCudaBuild) {
    throw_no_cuda(fmt::format("copy from {} to {}", src.describe(), describe()));
  } else {
    MOEKIT_CHECK(is_contiguous(), "copy_from: destination {} must be contiguous", describe());
    if (src.is_contiguous()) {
      cuda_rt::copy(data_, device_, src.data(), src.device(), nbytes());
    } else {
      MOEKIT_CHECK(src.device().is_cpu(), "copy_from: strided source {} on a GPU is not supported",
                   src.describe());
      std::vector<char> staging(src.nbytes());
      gather_contiguous(src, staging.data());
      cuda_rt::copy(data_, device_, staging.data(), Device::cpu(), nbytes());
    }
  }
}

void Tensor::copy_from_async(const Tensor& src, Stream stream) {
  if (device_.is_cpu() && src.device().is_cpu()) {
    copy_from(src);
    return;
  }
  MOEKIT_CHECK(src.shape() == shape_ && src.dtype() == dtype_,
               "copy_from_async: source {} does not match destination {}", src.describe(),
               describe());
  MOEKIT_CHECK(is_contiguous() && src.is_contiguous() && src.device() == device_,
               "copy_from_async: {} and {} must be contiguous and on one device", src.describe(),
               describe());
  if constexpr (kCudaBuild) {
    MOEKIT_CHECK(stream.handle != nullptr, "copy_from_async on {} needs a CUDA stream",
                 device_.to_string());
    cuda_rt::copy_async(data_, src.data(), nbytes(), stream);
  } else {
    throw_no_cuda("copy_from_async on a GPU");
  }
}

Tensor Tensor::to_dtype(DType dtype) const {
  MOEKIT_CHECK(device_.is_cpu(), "to_dtype: tensor {} must be on the CPU", describe());
  const Tensor src = is_contiguous() ? *this : clone();
  Tensor out = empty(shape_, dtype);
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i)
    store_float(out.data_, dtype, i, load_float(src.data_, dtype_, i));
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  const Tensor src = device_.is_cpu() ? (is_contiguous() ? *this : clone()) : to(Device::cpu());
  const int64_t n = numel();
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = load_float(src.data_, dtype_, i);
  return out;
}

std::vector<int64_t> Tensor::to_int_vector() const {
  const Tensor src = device_.is_cpu() ? (is_contiguous() ? *this : clone()) : to(Device::cpu());
  const int64_t n = numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = load_int(src.data_, dtype_, i);
  return out;
}

void Tensor::fill_bytes(uint8_t byte) {
  if (device_.is_cpu()) {
    MOEKIT_CHECK(is_contiguous(), "fill_bytes: tensor {} must be contiguous", describe());
    std::memset(data_, byte, nbytes());
    return;
  }
  std::vector<uint8_t> host(nbytes(), byte);
  copy_from(from_blob(host.data(), shape_, dtype_, Device::cpu()));
}

void Tensor::fill(double value) {
  Tensor host = empty(shape_, dtype_);
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i)
    store_float(host.data_, dtype_, i, static_cast<float>(value));
  copy_from(host);
}

std::string Tensor::describe() const {
  return fmt::format("{}{} {}", dtype_name(dtype_), shape_to_string(shape_), device_.to_string());
}

float load_float(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return f16_bits_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF64:
      return static_cast<float>(static_cast<const double*>(data)[i]);
    case DType::kFp8E4M3:
      return quant::decode_e4m3(static_cast<const uint8_t*>(data)[i]);
    case DType::kFp8E5M2:
      return quant::decode_e5m2(static_cast<const uint8_t*>(data)[i]);
    case DType::kUE8M0:
      return quant::decode_e8m0(static_cast<const uint8_t*>(data)[i]);
    case DType::kUE4M3:
      return quant::decode_ue4m3(static_cast<const uint8_t*>(data)[i]);
    case DType::kInt8:
      return static_cast<const int8_t*>(data)[i];
    case DType::kUInt8:
    case DType::kBool:
    case DType::kFp4E2M1x2:
      return static_cast<const uint8_t*>(data)[i];
    case DType::kInt32:
      return static_cast<float>(static_cast<const int32_t*>(data)[i]);
    case DType::kInt64:
      return static_cast<float>(static_cast<const int64_t*>(data)[i]);
  }
  return 0.f;
}

void store_float(void* data, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kBF16:
      static_cast<uint16_t*>(data)[i] = float_to_bf16_bits(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(data)[i] = float_to_f16_bits(v);
      break;
    case DType::kF32:
      static_cast<float*>(data)[i] = v;
      break;
    case DType::kF64:
      static_cast<double*>(data)[i] = v;
      break;
    case DType::kFp8E4M3:
      static_cast<uint8_t*>(data)[i] = quant::encode_e4m3(v);
      break;
    case DType::kFp8E5M2:
      static_cast<uint8_t*>(data)[i] = quant::encode_e5m2(v);
      break;
    case DType::kUE8M0:
      static_cast<uint8_t*>(data)[i] = quant::encode_e8m0(v, quant::E8M0Rounding::kCeil);
      break;
    case DType::kUE4M3:
      static_cast<uint8_t*>(data)[i] = quant::encode_ue4m3(v);
      break;
    case DType::kInt8:
      static_cast<int8_t*>(data)[i] = static_cast<int8_t>(std::lrint(v));
      break;
    case DType::kUInt8:
    case DType::kBool:
    case DType::kFp4E2M1x2:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(std::lrint(v));
      break;
    case DType::kInt32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(std::lrint(v));
      break;
    case DType::kInt64:
      static_cast<int64_t*>(data)[i] = std::llrint(v);
      break;
  }
}

int64_t load_int(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kInt32:
      return static_cast<const int32_t*>(data)[i];
    case DType::kInt64:
      return static_cast<const int64_t*>(data)[i];
    case DType::kInt8:
      return static_cast<const int8_t*>(data)[i];
    case DType::kUInt8:
    case DType::kBool:
      return static_cast<const uint8_t*>(data)[i];
    default:
      return static_cast<int64_t>(load_float(data, dtype, i));
  }
}

float round_to_dtype(float value, DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return round_to_bf16(value);
    case DType::kF16:
      return round_to_f16(value);
    default:
      return value;
  }
}

}  // namespace moekit
