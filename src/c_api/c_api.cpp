// The C API (include/moekit/moekit_c.h): library queries, layer handles over moekit::MoELayer,
// and the plan of a deployment. Bindings only validate; every exception becomes a status.
#include <dlpack/dlpack.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>

#include "c_api_internal.h"
#include "core/cuda/runtime.h"
#include "core/cuda_seam.h"
#include "moekit/core/checks.h"
#include "moekit/core/dlpack.h"
#include "moekit/core/error.h"
#include "moekit/core/tolerance.h"
#include "moekit/io/fixtures.h"
#include "moekit/io/safetensors.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/oracle/plan.h"
#include "moekit/quantization/quark/quark_moe.h"

struct moekit_layer {
  moekit::MoELayer layer;
};

namespace moekit::c_api {
namespace {

thread_local std::string last_error;

// The kind of a managed tensor's deleter: DLPack 0.6 and 1.x agree on it.
void run_deleter(DLManagedTensor* managed) {
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

// Empty tensors may come with any strides (PyTorch exports [1, 1] for a (0, H) tensor): they
// address nothing, so they are read as contiguous.
void normalize_empty(DLTensor& dl) {
  for (int d = 0; d < dl.ndim; ++d) {
    if (dl.shape[d] == 0) dl.strides = nullptr;
  }
}

}  // namespace

void set_last_error(std::string message) {
  last_error = std::move(message);
}

moekit_status guarded(void (*body)(void*), void* context) noexcept {
  try {
    body(context);
    return MOEKIT_OK;
  } catch (const UnsupportedError& e) {
    set_last_error(e.what());
    return MOEKIT_ERROR_UNSUPPORTED;
  } catch (const std::bad_alloc&) {
    set_last_error("moekit: out of memory");
    return MOEKIT_ERROR_OUT_OF_MEMORY;
  } catch (const Error& e) {
    set_last_error(e.what());
    return MOEKIT_ERROR;
  } catch (const io::SafetensorsError& e) {
    set_last_error(e.what());
    return MOEKIT_ERROR;
  } catch (const std::filesystem::filesystem_error& e) {
    set_last_error(e.what());
    return MOEKIT_ERROR;
  } catch (const std::exception& e) {
    set_last_error(fmt::format("moekit: internal error: {}", e.what()));
    return MOEKIT_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("moekit: internal error: unknown exception");
    return MOEKIT_ERROR_INTERNAL;
  }
}

Tensor borrowed_tensor(const DLTensor* dl, std::string_view name) {
  MOEKIT_CHECK(dl != nullptr, "{} is NULL", name);
  // A managed shell around a copy of the borrowed descriptor: from_dlpack copies the shape and
  // strides at once, and the shell's deleter frees only the shell.
  auto* shell = new DLManagedTensor{};
  shell->dl_tensor = *dl;
  normalize_empty(shell->dl_tensor);
  shell->deleter = [](DLManagedTensor* self) { delete self; };
  try {
    return from_dlpack(shell);
  } catch (const Error& e) {
    // NOTE: from_dlpack throws only before it takes ownership, so the shell is still ours.
    delete shell;
    throw Error(fmt::format("{}: {}", name, e.what()));
  }
}

Tensor optional_borrowed_tensor(const DLTensor* dl, std::string_view name) {
  return dl == nullptr ? Tensor{} : borrowed_tensor(dl, name);
}

Tensor owned_tensor(DLManagedTensor* managed, std::string_view name) {
  if (managed == nullptr) return Tensor{};
  normalize_empty(managed->dl_tensor);
  try {
    return from_dlpack(managed);
  } catch (const Error& e) {
    run_deleter(managed);  // not taken over by from_dlpack (see borrowed_tensor)
    throw Error(fmt::format("{}: {}", name, e.what()));
  }
}

DeviceInfo device_from_name(const std::string& name) {
  if (name == "cuda" || name.starts_with("cuda:")) {
    const int count = cuda_device_count();
    MOEKIT_CHECK(count > 0, "device '{}': no GPU is usable ({})", name, cuda_unavailable_reason());
    int index = 0;
    if (name != "cuda") {
      const std::string digits = name.substr(5);
      MOEKIT_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
                   "device '{}': expected cuda:N with a device index N", name);
      index = std::stoi(digits);
    }
    MOEKIT_CHECK(index < count, "device '{}': only {} CUDA device(s) are present", name, count);
    if constexpr (kCudaBuild) {
      return cuda_rt::device_info(index);
    } else {
      throw_no_cuda("a CUDA device");
    }
  }
  return device_info_by_name(name);
}

MoELayerOptions layer_options(const moekit_layer_options* in) {
  moekit_layer_options defaults;
  moekit_layer_options_init(&defaults);
  const moekit_layer_options o = read_versioned(in, defaults);
  MoELayerOptions out;
  const std::string dtype = string_or(o.dtype, "bf16");
  const auto parsed = parse_dtype(dtype);
  MOEKIT_CHECK(parsed.has_value(), "options.dtype: unknown dtype '{}' (bf16, f16 or f32)", dtype);
  out.dtype = *parsed;
  out.device = device_from_name(string_or(o.device, "auto"));
  All2AllBackend a2a = All2AllBackend::kNaive;
  const std::string all2all = string_or(o.all2all, "naive");
  MOEKIT_CHECK(parse_all2all_backend(all2all, &a2a), "options.all2all: unknown backend '{}'",
               all2all);
  out.parallel =
      ParallelConfig::make(o.tp_size, o.dp_size, o.dp_rank, o.tp_rank, o.enable_ep != 0, a2a);
  out.backend = string_or(o.backend, "auto");
  out.tile_config = string_or(o.tile_config, "auto");
  out.max_num_tokens = o.max_num_tokens;
  return out;
}

ModelPreset model_from_name(const std::string& model) {
  MOEKIT_CHECK(!model.empty(), "model is empty: give a preset name or a config.json path");
  const bool looks_like_path = model.find('/') != std::string::npos || model.ends_with(".json");
  if (!looks_like_path) {
    for (const ModelPreset& p : model_presets()) {
      if (p.name == model) return p;
    }
    if (!std::filesystem::exists(model)) return find_preset(model);  // throws, listing presets
  }
  return preset_from_hf_config(model);
}

char* copy_string(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

std::string string_or(const char* value, std::string_view fallback) {
  return value != nullptr && value[0] != '\0' ? std::string(value) : std::string(fallback);
}

namespace {

MoELayer& checked(moekit_layer* layer) {
  MOEKIT_CHECK(layer != nullptr, "layer is NULL");
  return layer->layer;
}
const MoELayer& checked(const moekit_layer* layer) {
  MOEKIT_CHECK(layer != nullptr, "layer is NULL");
  return layer->layer;
}

template <typename T>
T& out_param(T* p, std::string_view name) {
  MOEKIT_CHECK(p != nullptr, "{} (the result pointer) is NULL", name);
  return *p;
}

void publish(moekit_layer** out, MoELayer layer) {
  *out = new moekit_layer{std::move(layer)};
}

// What `moekit explain` prints: the model, the deployment, the scheme, how the shared experts run,
// then the plan.
std::string explain_text(const ModelPreset& model, const MoEConfig& moe,
                         const std::string& quantization, const MoEPlan& plan,
                         const std::string& shared_note) {
  std::string text = fmt::format("model        {}\ndeployment   {}\nquantization {}\n",
                                 model.summary(), moe.to_string(), quantization);
  if (!shared_note.empty()) text += "shared       " + shared_note + "\n";
  if (!moe.device.present) {
    text += fmt::format(
        "note         {} is not present here: GPU kernels are listed but cannot be chosen\n",
        moe.device.to_string());
  }
  return text + "\n" + plan.to_string();
}

// Checks of a forward's arguments beyond the layer's own: contiguous tensors, the output's shape.
void check_forward_tensors(const MoELayer& layer, const Tensor& x, const Tensor& output,
                           std::initializer_list<std::pair<const Tensor*, const char*>> others) {
  expect_shape(x, "hidden_states", {kAnyDim, layer.moe_config().hidden_dim});
  expect_contiguous(x, "hidden_states");
  expect_shape(output, "output", {x.size(0), layer.moe_config().hidden_dim});
  expect_dtype(output, "output", {layer.options().dtype});
  expect_device(output, "output", layer.options().device.device());
  expect_contiguous(output, "output");
  for (const auto& [t, name] : others)
    expect_contiguous(*t, name);
}

// NULL: the layer's own stream, and the call waits for the result.
RunContext context_for(void* stream) {
  return RunContext{Stream{stream}, nullptr};
}
void finish(const MoELayer& layer, void* stream) {
  if (stream == nullptr) synchronize(layer.default_stream());
}

DLManagedTensor* export_optional(const Tensor& t) {
  return t.defined() ? to_dlpack(t) : nullptr;
}

}  // namespace
}  // namespace moekit::c_api

using namespace moekit;         // NOLINT: the C entry points below are thin wrappers
using namespace moekit::c_api;  // NOLINT

extern "C" {

const char* moekit_version(void) {
  return MOEKIT_VERSION_STRING;
}

int32_t moekit_c_api_version(void) {
  return MOEKIT_C_API_VERSION;
}

int32_t moekit_built_with_cuda(void) {
  return built_with_cuda() ? 1 : 0;
}

int32_t moekit_cuda_device_count(void) {
  return cuda_device_count();
}

const char* moekit_last_error(void) {
  return moekit::c_api::last_error.c_str();
}

void moekit_string_free(char* text) {
  std::free(text);
}

size_t moekit_struct_size(const char* struct_name) {
  const std::string_view n = struct_name == nullptr ? "" : struct_name;
  if (n == "moekit_layer_options") return sizeof(moekit_layer_options);
  if (n == "moekit_layer_tensors") return sizeof(moekit_layer_tensors);
  if (n == "moekit_layer_info") return sizeof(moekit_layer_info);
  if (n == "moekit_expert_tensors") return sizeof(moekit_expert_tensors);
  if (n == "moekit_fused_experts_args") return sizeof(moekit_fused_experts_args);
  if (n == "DLTensor") return sizeof(DLTensor);
  if (n == "DLManagedTensor") return sizeof(DLManagedTensor);
  return 0;
}

void moekit_layer_options_init(moekit_layer_options* options) {
  if (options == nullptr) return;
  *options = moekit_layer_options{};
  options->struct_size = sizeof(moekit_layer_options);
  options->dtype = "bf16";
  options->device = "auto";
  options->backend = "auto";
  options->tile_config = "auto";
  options->max_num_tokens = 8192;
  options->tp_size = 1;
  options->dp_size = 1;
  options->all2all = "naive";
}

moekit_status moekit_layer_create(const char* model, uint64_t seed,
                                  const moekit_layer_options* options, moekit_layer** layer) {
  return guarded([&] {
    moekit_layer*& out = out_param(layer, "layer");
    out = nullptr;
    const ModelPreset preset = model_from_name(string_or(model, ""));
    const MoELayerOptions o = layer_options(options);
    publish(&out, MoELayer(preset, MoELayer::random_weights(preset, o, seed), o));
  });
}

moekit_status moekit_layer_load(const char* checkpoint_dir, int32_t layer_index,
                                const moekit_layer_options* options, moekit_layer** layer) {
  return guarded([&] {
    moekit_layer*& out = out_param(layer, "layer");
    out = nullptr;
    const std::string dir = string_or(checkpoint_dir, "");
    MOEKIT_CHECK(!dir.empty(), "checkpoint_dir is empty");
    publish(&out, load_moe_layer(dir, layer_index, layer_options(options)));
  });
}

moekit_status moekit_layer_create_from_tensors(const char* model,
                                               const moekit_layer_tensors* tensors,
                                               const moekit_layer_options* options,
                                               moekit_layer** layer) {
  // Every tensor is taken over first, so that a failure anywhere releases all of them.
  moekit_layer_tensors given{};
  if (tensors != nullptr) given = read_versioned(tensors, moekit_layer_tensors{});
  DLManagedTensor* raw[] = {given.w13,
                            given.w2,
                            given.w13_bias,
                            given.w2_bias,
                            given.e_score_correction_bias,
                            given.shared_w13,
                            given.shared_w2,
                            given.router_weight,
                            given.shared_gate,
                            given.router_bias};
  const char* names[] = {
      "w13",        "w2",        "w13_bias",      "w2_bias",     "e_score_correction_bias",
      "shared_w13", "shared_w2", "router_weight", "shared_gate", "router_bias"};
  return guarded([&] {
    constexpr size_t n = sizeof(raw) / sizeof(raw[0]);
    Tensor t[n];
    for (size_t i = 0; i < n; ++i) {
      DLManagedTensor* managed = raw[i];
      raw[i] = nullptr;
      try {
        t[i] = owned_tensor(managed, names[i]);
      } catch (...) {
        for (size_t j = i + 1; j < n; ++j)
          run_deleter(raw[j]);
        throw;
      }
    }
    moekit_layer*& out = out_param(layer, "layer");
    out = nullptr;
    MOEKIT_CHECK(tensors != nullptr, "tensors is NULL");
    MOEKIT_CHECK(t[0].defined() && t[1].defined(), "w13 and w2 are required (w13 {}, w2 {})",
                 t[0].defined() ? "given" : "NULL", t[1].defined() ? "given" : "NULL");
    const ModelPreset preset = model_from_name(string_or(model, ""));
    MoELayerWeights w;
    w.w13 = t[0];
    w.w2 = t[1];
    w.w13_bias = t[2];
    w.w2_bias = t[3];
    w.e_score_correction_bias = t[4];
    w.shared_w13 = t[5];
    w.shared_w2 = t[6];
    w.router_weight = t[7];
    w.shared_gate = t[8];
    w.router_bias = t[9];
    publish(&out, MoELayer(preset, std::move(w), layer_options(options)));
  });
}

void moekit_layer_destroy(moekit_layer* layer) {
  delete layer;
}

moekit_status moekit_layer_get_info(const moekit_layer* layer, moekit_layer_info* info) {
  return guarded([&] {
    const MoELayer& l = checked(layer);
    moekit_layer_info& out = out_param(info, "info");
    MOEKIT_CHECK(out.struct_size >= sizeof(moekit_layer_info),
                 "info.struct_size={} is smaller than this library's moekit_layer_info ({})",
                 out.struct_size, sizeof(moekit_layer_info));
    const MoEConfig& moe = l.moe_config();
    out = moekit_layer_info{};
    out.struct_size = sizeof(moekit_layer_info);
    out.num_experts = moe.num_experts;
    out.num_local_experts = moe.num_local_experts;
    out.first_local_expert = l.first_local_expert();
    out.top_k = moe.experts_per_token;
    out.hidden_size = moe.hidden_dim;
    out.intermediate_size = moe.intermediate_size_per_partition();
    out.max_num_tokens = l.options().max_num_tokens;
    // The dtype and device as a DLPack export of a zero-size tensor says them.
    const Tensor probe =
        Tensor::from_blob(nullptr, {0}, l.options().dtype, l.options().device.device());
    DLManagedTensor* exported = to_dlpack(probe);
    out.dtype = exported->dl_tensor.dtype;
    out.device = exported->dl_tensor.device;
    exported->deleter(exported);
    out.is_quantized = l.is_quantized() ? 1 : 0;
    out.is_monolithic = l.kernel().is_monolithic() ? 1 : 0;
    out.has_shared_experts = l.has_shared_experts() ? 1 : 0;
    out.has_router_weight = l.weights().router_weight.defined() ? 1 : 0;
    out.tolerance_rel_l2 = tolerance(l.tolerance_name()).rel_l2;
  });
}

moekit_status moekit_layer_get_text(const moekit_layer* layer, moekit_layer_text what,
                                    char** text) {
  return guarded([&] {
    const MoELayer& l = checked(layer);
    char*& out = out_param(text, "text");
    out = nullptr;
    std::string s;
    switch (what) {
      case MOEKIT_TEXT_EXPLAIN:
        s = explain_text(l.model(), l.moe_config(), l.scheme(), l.plan(),
                         MoELayer::shared_experts_note(l.model(), l.moe_config(), l.quant_config(),
                                                       l.plan(), l.options().shared_experts));
        break;
      case MOEKIT_TEXT_PLAN:
        s = l.plan().to_string();
        break;
      case MOEKIT_TEXT_MODEL:
        s = l.model().summary();
        break;
      case MOEKIT_TEXT_SCHEME:
        s = l.scheme();
        break;
      case MOEKIT_TEXT_BACKEND:
        s = l.plan().backend ? l.plan().backend->name : std::string();
        break;
      case MOEKIT_TEXT_EXPERTS:
        s = std::string(l.kernel().fused_experts().name());
        break;
      case MOEKIT_TEXT_TOLERANCE:
        s = l.tolerance_name();
        break;
      default:
        throw Error(
            fmt::format("what={} is not a moekit_layer_text value (0..6)", static_cast<int>(what)));
    }
    out = copy_string(s);
  });
}

moekit_status moekit_layer_forward(moekit_layer* layer, const DLTensor* hidden_states,
                                   const DLTensor* router_logits, const DLTensor* output,
                                   void* stream) {
  return guarded([&] {
    MoELayer& l = checked(layer);
    const Tensor x = borrowed_tensor(hidden_states, "hidden_states");
    const Tensor logits = borrowed_tensor(router_logits, "router_logits");
    Tensor out = borrowed_tensor(output, "output");
    check_forward_tensors(l, x, out, {{&logits, "router_logits"}});
    l.forward_into(out, x, logits, context_for(stream));
    finish(l, stream);
  });
}

moekit_status moekit_layer_forward_routed(moekit_layer* layer, const DLTensor* hidden_states,
                                          const DLTensor* topk_ids, const DLTensor* topk_weights,
                                          const DLTensor* output, void* stream) {
  return guarded([&] {
    MoELayer& l = checked(layer);
    const Tensor x = borrowed_tensor(hidden_states, "hidden_states");
    const Tensor ids = borrowed_tensor(topk_ids, "topk_ids");
    const Tensor weights = borrowed_tensor(topk_weights, "topk_weights");
    Tensor out = borrowed_tensor(output, "output");
    check_forward_tensors(l, x, out, {{&ids, "topk_ids"}, {&weights, "topk_weights"}});
    expect_shape(ids, "topk_ids", {x.size(0), l.moe_config().experts_per_token});
    expect_shape(weights, "topk_weights", {x.size(0), l.moe_config().experts_per_token});
    expect_dtype(weights, "topk_weights", {DType::kF32});
    l.forward_routed_into(out, x, ids, weights, context_for(stream));
    finish(l, stream);
  });
}

moekit_status moekit_layer_route(moekit_layer* layer, const DLTensor* hidden_states,
                                 const DLTensor* router_logits, const DLTensor* topk_weights,
                                 const DLTensor* topk_ids, void* stream) {
  return guarded([&] {
    MoELayer& l = checked(layer);
    const Tensor x = borrowed_tensor(hidden_states, "hidden_states");
    const Tensor logits = borrowed_tensor(router_logits, "router_logits");
    const Tensor weights = borrowed_tensor(topk_weights, "topk_weights");
    const Tensor ids = borrowed_tensor(topk_ids, "topk_ids");
    const int64_t M = x.size(0), k = l.moe_config().experts_per_token;
    expect_shape(logits, "router_logits", {M, l.moe_config().num_experts});
    expect_shape(weights, "topk_weights", {M, k});
    expect_shape(ids, "topk_ids", {M, k});
    expect_dtype(weights, "topk_weights", {DType::kF32});
    expect_dtype(ids, "topk_ids", {DType::kInt32});
    RunContext ctx = context_for(stream);
    if (ctx.stream.handle == nullptr) ctx.stream = l.default_stream();
    l.router().select_experts_into(x, logits, weights, ids, ctx);
    finish(l, stream);
  });
}

moekit_status moekit_layer_router_logits(const moekit_layer* layer, const DLTensor* hidden_states,
                                         DLManagedTensor** router_logits) {
  return guarded([&] {
    const MoELayer& l = checked(layer);
    DLManagedTensor*& out = out_param(router_logits, "router_logits");
    out = nullptr;
    out = to_dlpack(l.router_logits(borrowed_tensor(hidden_states, "hidden_states")));
  });
}

moekit_status moekit_layer_expert_reference(const moekit_layer* layer, int64_t expert,
                                            moekit_expert_tensors* tensors) {
  return guarded([&] {
    const MoELayer& l = checked(layer);
    moekit_expert_tensors& out = out_param(tensors, "tensors");
    MOEKIT_CHECK(out.struct_size >= sizeof(moekit_expert_tensors),
                 "tensors.struct_size={} is smaller than this library's moekit_expert_tensors "
                 "({})",
                 out.struct_size, sizeof(moekit_expert_tensors));
    const ExpertWeights w = l.expert_reference(expert);
    out = moekit_expert_tensors{};
    out.struct_size = sizeof(moekit_expert_tensors);
    out.w13 = to_dlpack(w.w13);
    out.w2 = to_dlpack(w.w2);
    out.w13_bias = export_optional(w.w13_bias);
    out.w2_bias = export_optional(w.w2_bias);
  });
}

moekit_status moekit_layer_benchmark(moekit_layer* layer, const DLTensor* hidden_states,
                                     const DLTensor* router_logits, const DLTensor* output,
                                     void* stream, int32_t iterations, double* host_us,
                                     double* wall_us) {
  return guarded([&] {
    MoELayer& l = checked(layer);
    double& host = out_param(host_us, "host_us");
    double& wall = out_param(wall_us, "wall_us");
    MOEKIT_CHECK(iterations >= 1, "iterations={} must be >= 1", iterations);
    const Tensor x = borrowed_tensor(hidden_states, "hidden_states");
    const Tensor logits = borrowed_tensor(router_logits, "router_logits");
    Tensor out = borrowed_tensor(output, "output");
    check_forward_tensors(l, x, out, {{&logits, "router_logits"}});
    RunContext ctx = context_for(stream);
    if (ctx.stream.handle == nullptr) ctx.stream = l.default_stream();
    for (int i = 0; i < 2; ++i)
      l.forward_into(out, x, logits, ctx);
    synchronize(ctx.stream);
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    for (int i = 0; i < iterations; ++i)
      l.forward_into(out, x, logits, ctx);
    const auto t1 = clock::now();
    synchronize(ctx.stream);
    const auto t2 = clock::now();
    const auto us = [&](clock::duration d) {
      return std::chrono::duration<double, std::micro>(d).count() / iterations;
    };
    host = us(t1 - t0);
    wall = us(t2 - t0);
  });
}

moekit_status moekit_explain(const char* model, const char* quantization,
                             const moekit_layer_options* options, char** text) {
  return guarded([&] {
    char*& out = out_param(text, "text");
    out = nullptr;
    const std::string model_name = string_or(model, "");
    const std::string scheme = string_or(quantization, "");
    const ModelPreset preset = model_from_name(model_name);
    const MoEConfig moe = MoELayer::make_moe_config(preset, layer_options(options));
    // The Quark config: a fixture scheme's, or a checkpoint directory's own.
    std::optional<quark::QuarkConfig> qc;
    std::string source = scheme;
    if (!scheme.empty()) {
      const std::string json = io::fixture_quantization_config(scheme);
      if (!json.empty()) qc = quark::QuarkConfig::parse(json);
    } else if (std::filesystem::is_directory(model_name)) {
      qc = read_quark_config(model_name);
      source = model_name;
    }
    PlanOptions plan_options;
    plan_options.log = false;
    const std::string layer_name =
        fmt::format("model.layers.{}.mlp.experts", preset.first_moe_layer);
    if (!qc || qc->is_excluded(layer_name)) {
      const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized(), plan_options);
      const std::string q = fmt::format("unquantized ({})", dtype_name(moe.in_dtype));
      out = copy_string(explain_text(
          preset, moe, q, plan,
          MoELayer::shared_experts_note(preset, moe, QuantConfig::unquantized(), plan)));
      return;
    }
    const auto method =
        quark::get_moe_method(*qc, moe, quark::get_moe_method_target(*qc, layer_name));
    const std::string q =
        fmt::format("quark {}\nmethod       {} (weight {}, activation {})", source, method->name(),
                    quant_key_to_string(method->weight_quant_key()),
                    quant_key_to_string(method->activation_quant_key()));
    out = copy_string(explain_text(
        preset, moe, q, method->plan(),
        MoELayer::shared_experts_note(preset, moe, method->moe_quant_config(), method->plan())));
  });
}

moekit_status moekit_write_fixture_checkpoint(const char* dir, const char* scheme,
                                              const char* model, uint64_t seed) {
  return guarded([&] {
    const std::string d = string_or(dir, "");
    MOEKIT_CHECK(!d.empty(), "dir is empty");
    io::FixtureOptions o;
    o.scheme = string_or(scheme, "bf16");
    o.model = string_or(model, "tiny");
    o.seed = seed;
    io::write_fixture_checkpoint(d, o);
  });
}

}  // extern "C"
