// Internal: what the C API's translation units share — the exception-to-status guard, DLPack
// arguments as moekit tensors, options, and C strings.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "moekit/core/tensor.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/moekit_c.h"

namespace moekit::c_api {

// Records `message` as this thread's last error.
void set_last_error(std::string message);

// Runs `body`, turning every exception into a status and the thread's last error. Never throws.
moekit_status guarded(void (*body)(void*), void* context) noexcept;
template <typename F>
moekit_status guarded(F&& body) noexcept {
  return guarded([](void* f) { (*static_cast<F*>(f))(); }, &body);
}

// A borrowed DLTensor as a moekit view (nothing retained from `dl` itself). Throws naming `name`
// for a NULL pointer or an unsupported dtype / device.
Tensor borrowed_tensor(const DLTensor* dl, std::string_view name);
// Same, or an undefined tensor for NULL.
Tensor optional_borrowed_tensor(const DLTensor* dl, std::string_view name);
// Takes a DLManagedTensor over (undefined for NULL). On failure its deleter runs before the throw.
Tensor owned_tensor(DLManagedTensor* managed, std::string_view name);

// A C struct that begins with uint32_t struct_size, read from a caller that may be older (a
// smaller struct: the missing fields keep `defaults`' values) or newer (extra bytes ignored).
template <typename T>
T read_versioned(const T* in, const T& defaults) {
  T out = defaults;
  if (in == nullptr) return out;
  const size_t n = in->struct_size < sizeof(T) ? in->struct_size : sizeof(T);
  std::memcpy(static_cast<void*>(&out), static_cast<const void*>(in), n);
  out.struct_size = sizeof(T);
  return out;
}

// The library's options from the C struct (NULL: defaults). `device` names as in the header.
MoELayerOptions layer_options(const moekit_layer_options* options);
DeviceInfo device_from_name(const std::string& name);
// A preset name, or a config.json (file or directory).
ModelPreset model_from_name(const std::string& model);

// A malloc'd copy for the caller (moekit_string_free).
char* copy_string(const std::string& text);
// `value` or the default when NULL / empty.
std::string string_or(const char* value, std::string_view fallback);

}  // namespace moekit::c_api
