#include "moekit/core/dlpack.h"

#include <dlpack/dlpack.h>

#include <memory>

#include "moekit/core/error.h"

namespace moekit {
namespace {

DLDataType to_dl(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return {kDLBfloat, 16, 1};
    case DType::kF16:
      return {kDLFloat, 16, 1};
    case DType::kF32:
      return {kDLFloat, 32, 1};
    case DType::kF64:
      return {kDLFloat, 64, 1};
    case DType::kInt8:
      return {kDLInt, 8, 1};
    case DType::kInt32:
      return {kDLInt, 32, 1};
    case DType::kInt64:
      return {kDLInt, 64, 1};
    case DType::kBool:
      return {kDLUInt, 8, 1};
    default:
      return {kDLUInt, 8, 1};  // fp8 / packed formats travel as bytes
  }
}

DType from_dl(const DLDataType& t) {
  MOEKIT_CHECK(t.lanes == 1, "from_dlpack: vector lanes={} are not supported (need 1)", t.lanes);
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
  if (t.code == kDLFloat && t.bits == 16) return DType::kF16;
  if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
  if (t.code == kDLFloat && t.bits == 64) return DType::kF64;
  if (t.code == kDLInt && t.bits == 8) return DType::kInt8;
  if (t.code == kDLInt && t.bits == 32) return DType::kInt32;
  if (t.code == kDLInt && t.bits == 64) return DType::kInt64;
  if (t.code == kDLUInt && t.bits == 8) return DType::kUInt8;
  MOEKIT_CHECK(false, "from_dlpack: unsupported DLPack dtype code={} bits={}",
               static_cast<int>(t.code), static_cast<int>(t.bits));
  return DType::kUInt8;
}

// Owns the shape/stride arrays and a reference to the exported tensor.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
};

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& tensor) {
  auto ctx = std::make_unique<ExportContext>();
  ctx->tensor = tensor;
  ctx->shape = tensor.shape();
  ctx->strides = tensor.strides();
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = tensor.data();
  dl.device =
      tensor.device().is_cpu() ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, tensor.device().index};
  dl.ndim = tensor.dim();
  dl.dtype = to_dl(tensor.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  return &ctx.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  MOEKIT_CHECK(managed != nullptr, "from_dlpack: the DLManagedTensor pointer is null");
  const DLTensor& dl = managed->dl_tensor;
  MOEKIT_CHECK(dl.device.device_type == kDLCPU || dl.device.device_type == kDLCUDA,
               "from_dlpack: device type {} is not supported (CPU or CUDA)",
               static_cast<int>(dl.device.device_type));
  const Device device =
      dl.device.device_type == kDLCPU ? Device::cpu() : Device::cuda(dl.device.device_id);
  const DType dtype = from_dl(dl.dtype);
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : contiguous_strides(shape);
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  // The storage's deleter hands the tensor back to its producer.
  auto storage = std::make_shared<Storage>(data, 0, device, [managed](void*) {
    if (managed->deleter) managed->deleter(managed);
  });
  return Tensor::from_storage(std::move(storage), data, shape, dtype, strides);
}

}  // namespace moekit
