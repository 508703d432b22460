#include "moekit/layer/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "moekit/core/error.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/io/fixtures.h"
#include "moekit/io/json.h"
#include "moekit/io/safetensors.h"
#include "moekit/quant/formats.h"
#include "moekit/quant/moe_input_quant.h"
#include "moekit/quant/quantize.h"
#include "moekit/quantization/compressed_tensors.h"
#include "moekit/quantization/hf_fp8.h"
#include "moekit/quantization/hf_mxfp4.h"
#include "moekit/quantization/modelopt.h"
#include "moekit/quantization/quark/quark_moe.h"

namespace moekit {
namespace {

using json = nlohmann::json;

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F32") return DType::kF32;
  if (s == "F64") return DType::kF64;
  if (s == "F8_E4M3") return DType::kFp8E4M3;
  if (s == "F8_E5M2") return DType::kFp8E5M2;
  if (s == "F8_E8M0") return DType::kUE8M0;
  if (s == "I8") return DType::kInt8;
  if (s == "U8") return DType::kUInt8;
  if (s == "I32") return DType::kInt32;
  if (s == "I64") return DType::kInt64;
  if (s == "BOOL") return DType::kBool;
  return std::nullopt;
}

bool is_float_dtype(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 || d == DType::kF64;
}

json read_config_json(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "config.json";
  MOEKIT_CHECK(std::filesystem::is_directory(dir),
               "{} is not a checkpoint directory (it needs a config.json and *.safetensors)",
               dir.string());
  MOEKIT_CHECK(std::filesystem::exists(file),
               "cannot open {}: not found (a checkpoint directory needs a config.json)",
               file.string());
  json j = io::read_json_file(file);
  MOEKIT_CHECK(j.is_object(), "{}: expected a JSON object, got {}", file.string(),
               io::describe_json(j));
  return j;
}

Shape squeeze_trailing(Shape s) {
  while (!s.empty() && s.back() == 1)
    s.pop_back();
  return s;
}

bool shape_matches(const Shape& got, const Shape& want) {
  return got == want ||
         (squeeze_trailing(got) == squeeze_trailing(want) && numel_of(got) == numel_of(want));
}

// The checkpoint's view of one tensor, converted to a CPU Tensor.
class Reader {
 public:
  explicit Reader(const std::filesystem::path& dir) {
    try {
      ckpt_ = io::CheckpointDir::open(dir);
    } catch (const io::SafetensorsError& e) {
      throw Error(e.what());
    }
  }
  bool contains(const std::string& name) const { return ckpt_.contains(name); }
  std::string dtype_string(const std::string& name) const { return ckpt_.find(name).dtype; }
  Tensor read(const std::string& name) const {
    const io::TensorInfo& info = find(name);
    const auto dt = dtype_from_safetensors(info.dtype);
    MOEKIT_CHECK(dt.has_value(), "tensor '{}' has dtype {}, which moekit does not load", name,
                 info.dtype);
    Tensor t = Tensor::empty(info.shape, *dt);
    MOEKIT_CHECK(t.nbytes() == info.bytes.size(),
                 "tensor '{}': {} bytes for shape {} {} (expected {})", name, info.bytes.size(),
                 shape_to_string(info.shape), info.dtype, t.nbytes());
    if (t.nbytes() > 0) std::memcpy(t.data(), info.bytes.data(), t.nbytes());
    return t;
  }
  const std::filesystem::path& dir() const { return ckpt_.dir(); }
  // A tensor in place (no copy: a fused gpt-oss tensor holds every expert of the layer), checked
  // to have shape `want` and a float dtype (`floats`) or one-byte codes (U8 or F8_E8M0).
  struct View {
    const void* data;
    DType dtype;
    // A read-only CPU tensor over the file's bytes (views and clones of it only read).
    Tensor tensor(const Shape& shape) const {
      return Tensor::from_blob(const_cast<void*>(data), shape, dtype, Device::cpu());
    }
  };
  View view(const std::string& name, const Shape& want, bool floats) const {
    const io::TensorInfo& info = find(name);
    const auto dt = dtype_from_safetensors(info.dtype);
    const bool ok =
        dt && (floats ? is_float_dtype(*dt) : *dt == DType::kUInt8 || *dt == DType::kUE8M0);
    MOEKIT_CHECK(ok, "tensor '{}' has dtype {} but the layer needs {}", name, info.dtype,
                 floats ? "BF16, F16 or F32 values" : "one-byte codes (U8)");
    MOEKIT_CHECK(shape_matches(info.shape, want), "tensor '{}' has shape {} but the layer needs {}",
                 name, shape_to_string(info.shape), shape_to_string(want));
    MOEKIT_CHECK(info.bytes.size() == static_cast<size_t>(numel_of(want)) * element_size(*dt),
                 "tensor '{}': {} bytes for shape {} {}", name, info.bytes.size(),
                 shape_to_string(info.shape), info.dtype);
    return {info.bytes.data(), *dt};
  }

 private:
  const io::TensorInfo& find(const std::string& name) const {
    MOEKIT_CHECK(ckpt_.contains(name), "tensor '{}' not found in checkpoint {} ({} tensors)", name,
                 ckpt_.dir().string(), ckpt_.size());
    return ckpt_.find(name);
  }

  io::CheckpointDir ckpt_;
};

// Throws naming the tensor, the element and the value at the first non-finite value: NaN / Inf
// in float tensors, NaN (and e5m2 Inf) codes in fp8 ones. Other dtypes have no such values.
void check_finite(const Tensor& t, const std::string& name) {
  if (!t.defined()) return;
  const Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  const int64_t n = h.numel();
  const DType d = h.dtype();
  if (d == DType::kFp8E4M3 || d == DType::kFp8E5M2) {
    const auto* b = h.data_as<const uint8_t>();
    const uint8_t mask = d == DType::kFp8E4M3 ? 0x7F : 0x7C;
    for (int64_t i = 0; i < n; ++i) {
      MOEKIT_CHECK((b[i] & mask) != mask,
                   "{} holds the non-finite {} code 0x{:02X} at element {}: weights must be finite",
                   name, dtype_name(d), b[i], i);
    }
    return;
  }
  if (!is_float_dtype(d)) return;
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_float(h.data(), d, i);
    MOEKIT_CHECK(std::isfinite(v), "{} holds {} at element {}: weights must be finite", name, v, i);
  }
}

// How a layer stores its experts: a tensor per expert and projection (Qwen, Mixtral, DeepSeek), or
// every expert in one tensor per projection, gate and up fused with their outputs interleaved
// (gpt-oss: 2j gate j, 2j + 1 up j) or concatenated (Llama 4: gate, then up).
enum class ExpertStorage { kPerExpert, kFusedInterleaved, kFusedConcatenated };

// Tensor names of one MoE layer.
struct LayerNames {
  // model.layers.N.mlp / model.layers.N.block_sparse_moe /
  // [language_model.]model.layers.N.feed_forward
  std::string moe_prefix;
  std::string gate, up, down;
  // The file's suffixes of Quark parameter suffixes a format names differently (HuggingFace fp8
  // blocks: weight_scale -> weight_scale_inv; ModelOpt NVFP4: input_scale_2 -> input_scale).
  std::map<std::string, std::string> file_suffixes = {};
  // Quark parameter suffixes whose file tensors hold the parameter's reciprocal
  // (compressed-tensors NVFP4's global scales).
  std::set<std::string> reciprocal_suffixes = {};
  // Quark parameter suffixes whose file tensors hold int4 codes as int32 words of eight
  // offset-binary nibbles (compressed-tensors pack-quantized), read as Quark's signed-nibble bytes.
  std::set<std::string> int4_word_suffixes = {};
  ExpertStorage storage = ExpertStorage::kPerExpert;
  std::string router = "gate";  // gpt-oss and Llama 4: "router" (gpt-oss's with a bias)
  bool fused() const { return storage != ExpertStorage::kPerExpert; }
  std::string expert(int64_t e, const std::string& proj, const std::string& param) const {
    return fmt::format("{}.experts.{}.{}.{}", moe_prefix, e, proj, param);
  }
  // A fused tensor: "<moe_prefix>.experts.gate_up_proj_blocks" for ("gate_up_proj", "_blocks").
  std::string fused_name(const char* proj, const char* suffix) const {
    return fmt::format("{}.experts.{}{}", moe_prefix, proj, suffix);
  }
};

LayerNames find_names(const Reader& r, int n, const ModelPreset& model) {
  const std::string qwen = fmt::format("model.layers.{}.mlp", n);
  const std::string mixtral = fmt::format("model.layers.{}.block_sparse_moe", n);
  // Llama 4: Llama4ForCausalLM's names, or Llama4ForConditionalGeneration's under language_model.
  const std::string llama4 = fmt::format("model.layers.{}.feed_forward", n);
  auto fused = [&](const std::string& prefix, ExpertStorage storage) {
    LayerNames names{prefix, "gate_proj", "up_proj", "down_proj"};
    names.storage = storage;
    names.router = "router";
    return names;
  };
  if (r.contains(qwen + ".experts.gate_up_proj") ||
      r.contains(qwen + ".experts.gate_up_proj_blocks")) {
    return fused(qwen, ExpertStorage::kFusedInterleaved);
  }
  for (const std::string& prefix : {llama4, "language_model." + llama4}) {
    if (r.contains(prefix + ".experts.gate_up_proj")) {
      return fused(prefix, ExpertStorage::kFusedConcatenated);
    }
    MOEKIT_CHECK(!r.contains(prefix + ".gate_proj.weight"),
                 "layer {} is a dense layer ({}.gate_proj is an MLP without experts), not an MoE "
                 "layer",
                 n, prefix);
  }
  // A projection's weight: "weight", or compressed-tensors' packed "weight_packed" (NVFP4, int4).
  auto has_weight = [&](const std::string& proj) {
    return r.contains(proj + ".weight") || r.contains(proj + ".weight_packed");
  };
  if (has_weight(qwen + ".experts.0.gate_proj") || has_weight(qwen + ".experts.0.up_proj")) {
    return {qwen, "gate_proj", "up_proj", "down_proj"};
  }
  if (has_weight(mixtral + ".experts.0.w1")) return {mixtral, "w1", "w3", "w2"};
  MOEKIT_CHECK(n >= 0 && (model.num_layers == 0 || n < model.num_layers),
               "layer {} is out of range: the model has num_hidden_layers={}", n, model.num_layers);
  MOEKIT_CHECK(n >= model.first_moe_layer,
               "layer {} is a dense layer (first_k_dense_replace={}), not an MoE layer", n,
               model.first_moe_layer);
  throw Error(fmt::format(
      "no MoE expert tensors for layer {} in {}: looked for '{}.experts.0.gate_proj.weight', "
      "'{}.experts.0.w1.weight', gpt-oss's '{}.experts.gate_up_proj[_blocks]' and Llama 4's "
      "'[language_model.]{}.experts.gate_up_proj'",
      n, r.dir().string(), qwen, mixtral, qwen, llama4));
}

bool byte_compatible(DType want, DType got) {
  if (want == got) return true;
  const bool want_bytes = want == DType::kUE8M0 || want == DType::kUInt8;
  const bool got_bytes = got == DType::kUE8M0 || got == DType::kUInt8;
  return want_bytes && got_bytes;
}

// The box [begin, begin + extent) of `t`, copied into a contiguous tensor.
Tensor box(Tensor t, const Shape& begin, const Shape& extent) {
  for (int d = 0; d < t.dim(); ++d) {
    if (begin[d] != 0 || extent[d] != t.size(d)) t = t.slice(d, begin[d], begin[d] + extent[d]);
  }
  return t.clone();
}

// A tensor-parallel rank's part of a checkpoint tensor `t` (named `name`) that `what` (e.g.
// "parameter w2_weight") needs in shape `want`: `t` itself when it has that shape (sizes that do
// not depend on intermediate_size: per-tensor and output-channel scales, down's rows, ...), else
// the slice at tp_rank of the one dimension that is tp_size times the rank's (gate / up rows,
// down's columns, their scale groups and blocks). Throws naming the tensor, both shapes and the
// rank otherwise (e.g. intermediate_size / tp_size not a whole number of the scheme's groups).
Tensor tp_part(const Tensor& t, const Shape& want, const ParallelConfig& p, const std::string& name,
               const std::string& what, const char* per = "") {
  if (shape_matches(t.shape(), want)) return t;
  const Shape got = squeeze_trailing(t.shape()), need = squeeze_trailing(want);
  int64_t dim = -1;
  if (p.tp_size > 1 && got.size() == need.size()) {
    for (size_t d = 0; d < got.size() && dim != -2; ++d) {
      if (got[d] == need[d]) continue;
      dim = dim == -1 && got[d] == need[d] * p.tp_size ? static_cast<int64_t>(d) : -2;
    }
  }
  if (dim < 0) {
    throw Error(fmt::format(
        "tensor '{}' has shape {} but {} needs {}{}{}", name, shape_to_string(t.shape()), what,
        shape_to_string(want), per,
        p.tp_size > 1
            ? fmt::format(" on tensor-parallel rank {} of {} (or {} times that in one dimension, "
                          "which the rank slices: intermediate_size / tp_size must be a whole "
                          "number of the scheme's groups and blocks)",
                          p.tp_rank, p.tp_size, p.tp_size)
            : std::string()));
  }
  Shape begin(need.size(), 0);
  begin[static_cast<size_t>(dim)] = p.tp_rank * need[static_cast<size_t>(dim)];
  return box(t.view(got), begin, need).view(want);
}

// Reads a per-expert piece (this tensor-parallel rank's part of it), validating shape and dtype
// against the parameter's needs.
Tensor read_piece(const Reader& r, const std::string& name, const Shape& want, DType want_dtype,
                  const std::string& param, const ParallelConfig& parallel) {
  Tensor t = tp_part(r.read(name), want, parallel, name, "parameter " + param,
                     " per expert and projection");
  const bool convert = want_dtype == DType::kF32 && is_float_dtype(t.dtype());
  MOEKIT_CHECK(convert || byte_compatible(want_dtype, t.dtype()),
               "tensor '{}' has dtype {} ({}) but parameter {} needs {}", name,
               dtype_name(t.dtype()), r.dtype_string(name), param, dtype_name(want_dtype));
  if (convert && t.dtype() != DType::kF32) t = t.to_dtype(DType::kF32);
  return t;
}

// 1 / x of every element of a float32 scale tensor read from `name` (the file holds the
// reciprocal of the parameter); each element must be finite and > 0.
Tensor reciprocal_scales(const Tensor& t, const std::string& name, const std::string& param) {
  std::vector<float> v = t.to_float_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    MOEKIT_CHECK(std::isfinite(v[i]) && v[i] > 0.0f,
                 "tensor '{}' ({}, stored as its reciprocal) holds {} at element {}: scales must "
                 "be finite and > 0",
                 name, param, v[i], i);
    v[i] = 1.0f / v[i];
  }
  return Tensor::from_floats(v, t.shape(), DType::kF32);
}

// compressed-tensors pack-quantized int4: int32 words of eight offset-binary codes (code + 8),
// code j of a row at bits 4 (j % 8) of word j / 8, so little-endian byte j / 2 holds codes j and
// j + 1 low nibble first: the words' bytes are uint4b8 pairs, and Quark's signed nibbles differ
// from them in each nibble's top bit. (N, W) int32 -> (N, 4 W) uint8.
Tensor int4_words_as_signed_bytes(const Reader& r, const std::string& name) {
  const Tensor t = r.read(name);
  MOEKIT_CHECK(t.dtype() == DType::kInt32 && t.dim() >= 1,
               "tensor '{}' has dtype {} and shape {}: pack-quantized int4 weights are int32 "
               "words of eight codes",
               name, r.dtype_string(name), shape_to_string(t.shape()));
  Shape s = t.shape();
  s.back() *= 4;
  Tensor b = Tensor::empty(s, DType::kUInt8);
  static_assert(std::endian::native == std::endian::little, "word byte j = bits 8j .. 8j + 7");
  if (t.nbytes() > 0) std::memcpy(b.data(), t.data(), t.nbytes());
  auto* p = b.data_as<uint8_t>();
  for (int64_t i = 0; i < b.numel(); ++i)
    p[i] ^= 0x88;
  return b;
}

// Fills one Quark parameter from the per-expert checkpoint tensors (this tensor-parallel rank's
// part; down's bias on rank 0 only, so that the ranks' partial outputs sum to one bias).
void load_param(const Reader& r, const LayerNames& names, quark::ExpertParams& params,
                const std::string& param, int shards, int64_t first_expert,
                const ParallelConfig& parallel) {
  const quark::ParamSpec spec = params.spec(param);
  const bool w13 = param.rfind("w13_", 0) == 0;
  const std::string param_suffix = param.substr(w13 ? 4 : 3);
  const auto renamed = names.file_suffixes.find(param_suffix);
  const std::string suffix = renamed != names.file_suffixes.end() ? renamed->second : param_suffix;
  const bool reciprocal = names.reciprocal_suffixes.count(param_suffix) > 0;
  const bool int4_words = names.int4_word_suffixes.count(param_suffix) > 0;
  std::vector<std::string> projs =
      w13 ? std::vector<std::string>{names.gate, names.up} : std::vector<std::string>{names.down};
  projs.resize(w13 ? static_cast<size_t>(shards) : 1);
  const int64_t E = spec.shape[0];
  Tensor staged = Tensor::empty(spec.shape, spec.dtype);
  const int64_t per_expert = numel_of(spec.shape) / std::max<int64_t>(E, 1);
  const size_t esz = element_size(spec.dtype);
  const std::string desc =
      fmt::format("{}.experts.*.{{{}}}.{}", names.moe_prefix, fmt::join(projs, ","), suffix);
  if (spec.shape.size() == 1) {
    // (E,): one scalar per expert; fused shards take their max (static input scales).
    std::vector<float> v(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      float m = -INFINITY;
      for (const std::string& p : projs) {
        const std::string name = names.expert(first_expert + e, p, suffix);
        const float v = read_piece(r, name, {}, DType::kF32, param, parallel).to_float_vector()[0];
        // Checked one by one: a NaN or negative shard would vanish in the max over the shards.
        MOEKIT_CHECK(std::isfinite(v) && v > 0.0f,
                     "tensor '{}' ({}) is {}: scales must be finite and > 0", name, param, v);
        m = std::max(m, reciprocal ? 1.0f / v : v);
      }
      v[e] = m;
    }
    params.load(param, Tensor::from_floats(v, {E}, DType::kF32), desc);
    return;
  }
  // (E, D1, ...): dim 1 split evenly between the shards (gate rows, then up rows).
  const int64_t S = static_cast<int64_t>(projs.size());
  MOEKIT_CHECK(spec.shape[1] % S == 0, "parameter {} dim 1 ({}) does not split into {} shards",
               param, spec.shape[1], S);
  Shape piece(spec.shape.begin() + 1, spec.shape.end());
  piece[0] /= S;
  if (piece.size() == 1 && piece[0] == 1) piece.clear();  // per-tensor: one scalar per shard
  const int64_t piece_numel = numel_of(piece);
  auto* dst = static_cast<char*>(staged.data());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < S; ++s) {
      const std::string name =
          names.expert(first_expert + e, projs[static_cast<size_t>(s)], suffix);
      Tensor t = int4_words ? tp_part(int4_words_as_signed_bytes(r, name), piece, parallel, name,
                                      "parameter " + param + " (as the bytes of its int32 words)",
                                      " per expert and projection")
                            : read_piece(r, name, piece, spec.dtype, param, parallel);
      if (reciprocal) t = reciprocal_scales(t, name, param);
      std::memcpy(dst + (e * per_expert + s * piece_numel) * esz, t.data(),
                  static_cast<size_t>(piece_numel) * esz);
    }
  }
  if (param == "w2_bias" && parallel.tp_rank != 0) std::memset(dst, 0, staged.nbytes());
  params.load(param, staged, desc);
}

// Unquantized expert weights stacked into (E, N1, H) / (E, H, I) in `dtype` (this
// tensor-parallel rank's part; down's bias on rank 0 only).
void load_unquantized(const Reader& r, const LayerNames& names, const MoEConfig& moe, DType dtype,
                      MoELayerWeights& w, bool has_bias, int64_t first_expert) {
  const int64_t E = moe.num_local_experts, H = moe.hidden_dim;
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t S = moe.w13_num_shards();
  w.w13 = Tensor::empty({E, S * I, H}, dtype);
  w.w2 = Tensor::empty({E, H, I}, dtype);
  if (has_bias) {
    w.w13_bias = Tensor::empty({E, S * I}, dtype);
    w.w2_bias = Tensor::empty({E, H}, dtype);
  }
  auto put = [&](Tensor& dst, int64_t offset, const std::string& name, const Shape& want) {
    const Tensor t = tp_part(r.read(name), want, moe.parallel, name, "the layer");
    MOEKIT_CHECK(is_float_dtype(t.dtype()),
                 "tensor '{}' has dtype {}: an unquantized layer needs BF16, F16 or F32 weights "
                 "(is quantization_config missing from config.json?)",
                 name, r.dtype_string(name));
    const std::vector<float> v = t.to_float_vector();
    for (size_t i = 0; i < v.size(); ++i)
      store_float(dst.data(), dtype, offset + static_cast<int64_t>(i), v[i]);
  };
  const std::vector<std::string> up_projs =
      S == 2 ? std::vector<std::string>{names.gate, names.up} : std::vector<std::string>{names.up};
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < S; ++s) {
      const std::string& proj = up_projs[static_cast<size_t>(s)];
      put(w.w13, (e * S + s) * I * H, names.expert(first_expert + e, proj, "weight"), {I, H});
      if (has_bias) {
        put(w.w13_bias, (e * S + s) * I, names.expert(first_expert + e, proj, "bias"), {I});
      }
    }
    put(w.w2, e * H * I, names.expert(first_expert + e, names.down, "weight"), {H, I});
    if (has_bias) put(w.w2_bias, e * H, names.expert(first_expert + e, names.down, "bias"), {H});
  }
  if (has_bias && moe.parallel.tp_rank != 0) std::memset(w.w2_bias.data(), 0, w.w2_bias.nbytes());
}

// ---- fused experts (gpt-oss, Llama 4)
// ------------------------------------------------------------- <experts>.gate_up_proj* and
// down_proj* hold every expert of the layer in one tensor each. gpt-oss interleaves gate_up's 2I
// outputs (2j: gate j, 2j + 1: up j), the order its swigluoai activation takes
// (config/activation.h), so they keep the file's order, and a tensor-parallel rank's gate and up
// [tp_rank I, (tp_rank + 1) I) are the file's contiguous outputs [2 tp_rank I, 2 (tp_rank + 1) I).
// Llama 4 concatenates them (gate, then up: the layer's [gate; up]), so a rank takes two ranges.
// Unquantized, the matrices are stored transposed (x @ W): gate_up_proj (E, H, 2I), down_proj (E,
// I, H); gpt-oss's HuggingFace MXFP4 (quantization/hf_mxfp4.h) as _blocks (E, N, K / 32, 16) codes
// and _scales (E, N, K / 32) e8m0 per output row; biases (gpt-oss) as _bias (E, N).

// One projection of the fused layout as this rank holds it: N outputs from K inputs (the rank's
// sizes) of the file's N_full x K_full, inputs from k0, outputs mapped by file_output().
struct FusedProj {
  const char* name;  // "gate_up_proj", "down_proj"
  int64_t N, K, N_full, K_full, k0;
  int64_t I, I_full, t0;  // the rank's intermediate size, the whole one, its first column
  ExpertStorage storage;  // gate_up's output order; down's outputs are H, never split
  bool gate_up;
  bool bias_here;  // down's bias only on tensor-parallel rank 0: the partial outputs sum to one
  // The file's output of the rank's output n (layer order: [gate; up], or interleaved).
  int64_t file_output(int64_t n) const {
    if (!gate_up) return n;
    if (storage == ExpertStorage::kFusedInterleaved) return 2 * t0 + n;
    return n < I ? t0 + n : I_full + t0 + (n - I);
  }
};

FusedProj fused_proj(const MoEConfig& moe, ExpertStorage storage, bool gate_up) {
  const int64_t H = moe.hidden_dim, I = moe.intermediate_size_per_partition();
  const int64_t I_full = moe.intermediate_size, t0 = moe.parallel.tp_rank * I;
  if (gate_up)
    return {"gate_up_proj", 2 * I, H, 2 * I_full, H, 0, I, I_full, t0, storage, true, true};
  return {"down_proj", H,      I,  H,       I_full, t0,
          I,           I_full, t0, storage, false,  moe.parallel.tp_rank == 0};
}

// Interleaved gate/up is gpt-oss's swigluoai; concatenated is any other gated activation.
void check_fused_activation(const LayerNames& names, const MoEConfig& moe) {
  const bool interleaved = names.storage == ExpertStorage::kFusedInterleaved;
  const bool ok = interleaved
                      ? moe.activation == Activation::kSwigluOai
                      : moe.w13_num_shards() == 2 && moe.activation != Activation::kSwigluOai;
  MOEKIT_CHECK(
      ok,
      "{}.experts.gate_up_proj holds gate and up {}, which {}; the model's activation is {} "
      "(config.json's model_type sets it)",
      names.moe_prefix, interleaved ? "interleaved (gpt-oss)" : "concatenated (Llama 4)",
      interleaved ? "gpt-oss's swigluoai reads" : "a gated activation other than swigluoai reads",
      activation_name(moe.activation));
}

// The MXFP4 codes (E, N, K / 2) and e8m0 scales (E, N, K / 32) of experts [first, first + E) of a
// projection, this rank's part (gpt-oss's interleaved layout: the rank's outputs are one range).
std::pair<Tensor, Tensor> fused_mxfp4(const Reader& r, const LayerNames& names,
                                      const MoEConfig& moe, const FusedProj& p, int64_t first) {
  const int64_t E_total = moe.num_experts, E = moe.num_local_experts;
  const Shape blocks{E_total, p.N_full, p.K_full / 32, 16},
      scales{E_total, p.N_full, p.K_full / 32};
  const Reader::View b = r.view(names.fused_name(p.name, "_blocks"), blocks, false);
  const Reader::View s = r.view(names.fused_name(p.name, "_scales"), scales, false);
  const int64_t n0 = p.file_output(0);
  Tensor codes = box(b.tensor(blocks), {first, n0, p.k0 / 32, 0}, {E, p.N, p.K / 32, 16});
  return {codes.view({E, p.N, p.K / 2}),
          box(s.tensor(scales), {first, n0, p.k0 / 32}, {E, p.N, p.K / 32})};
}

// The (E, N) biases of experts [first, first + E) in `dtype`, this rank's part (zeros where the
// bias is not this rank's: FusedProj::bias_here).
Tensor fused_bias(const Reader& r, const LayerNames& names, const MoEConfig& moe,
                  const FusedProj& p, int64_t first, DType dtype) {
  const int64_t E_total = moe.num_experts, E = moe.num_local_experts;
  const Reader::View v = r.view(names.fused_name(p.name, "_bias"), {E_total, p.N_full}, true);
  Tensor out = Tensor::empty({E, p.N}, dtype);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t n = 0; n < p.N; ++n) {
      const float b = load_float(v.data, v.dtype, (first + e) * p.N_full + p.file_output(n));
      store_float(out.data(), dtype, e * p.N + n, p.bias_here ? b : 0.0f);
    }
  }
  return out;
}

// The MXFP4 parameters of the Quark OCP MX method (w13_weight (E, 2I, H / 2), w13_weight_scale
// (E, 2I, H / 32), w2_*, the f32 biases) from the fused _blocks / _scales / _bias tensors.
void load_fused_mxfp4_params(const Reader& r, const LayerNames& names, const MoEConfig& moe,
                             quark::ExpertParams& params, int64_t first) {
  check_fused_activation(names, moe);
  const std::string desc = fmt::format("{}.experts.{{gate_up,down}}_proj_*", names.moe_prefix);
  for (const bool gate_up : {true, false}) {
    const FusedProj p = fused_proj(moe, names.storage, gate_up);
    const std::string w = gate_up ? "w13" : "w2";
    auto [codes, scales] = fused_mxfp4(r, names, moe, p, first);
    params.load(w + "_weight", codes, desc);
    params.load(w + "_weight_scale", scales, desc);
    if (params.has(w + "_bias")) {
      params.load(w + "_bias", fused_bias(r, names, moe, p, first, DType::kF32), desc);
    }
  }
}

// The experts in `dtype` (w13 (E, 2I, H), w2 (E, H, I), biases) from the unquantized fused
// tensors, or decoded from the MXFP4 ones (`mxfp4`: a checkpoint asking for "dequantize"; exact
// for bf16 and f32 layers, whose range holds every MXFP4 value but 6 x 2^127).
void load_fused_unquantized(const Reader& r, const LayerNames& names, const MoEConfig& moe,
                            DType dtype, MoELayerWeights& w, bool has_bias, int64_t first,
                            bool mxfp4) {
  check_fused_activation(names, moe);
  const int64_t E_total = moe.num_experts, E = moe.num_local_experts;
  for (const bool gate_up : {true, false}) {
    const FusedProj p = fused_proj(moe, names.storage, gate_up);
    Tensor& dst = gate_up ? w.w13 : w.w2;
    dst = Tensor::empty({E, p.N, p.K}, dtype);
    if (mxfp4) {
      const auto [codes, scales] = fused_mxfp4(r, names, moe, p, first);
      const auto* c = codes.data_as<const uint8_t>();
      const auto* sc = scales.data_as<const uint8_t>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < E * p.N * p.K; ++i) {  // element k of a row: low nibble if k is even
        const uint8_t code = (c[i / 2] >> (4 * (i % 2))) & 0xF;
        store_float(dst.data(), dtype, i,
                    quant::decode_fp4_e2m1(code) * quant::decode_e8m0(sc[i / 32]));
      }
    } else {
      // Transposed: element (n, k) of expert e at [e][k][n].
      const Reader::View v =
          r.view(names.fused_name(p.name, ""), {E_total, p.K_full, p.N_full}, true);
      // (A bf16 gpt-oss-120b layer holds 2 G elements: spread over the cores.)
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t k = 0; k < p.K; ++k) {
          const int64_t row = ((first + e) * p.K_full + p.k0 + k) * p.N_full;
          for (int64_t n = 0; n < p.N; ++n) {
            store_float(dst.data(), dtype, (e * p.N + n) * p.K + k,
                        load_float(v.data, v.dtype, row + p.file_output(n)));
          }
        }
      }
    }
    if (has_bias) (gate_up ? w.w13_bias : w.w2_bias) = fused_bias(r, names, moe, p, first, dtype);
  }
}

// A tensor read as f32 in shape `want` (under tensor parallelism: the rank's part, tp_part).
Tensor read_float(const Reader& r, const std::string& name, const Shape& want,
                  const ParallelConfig& parallel = {}) {
  const Tensor t = tp_part(r.read(name), want, parallel, name, "the layer");
  MOEKIT_CHECK(is_float_dtype(t.dtype()),
               "tensor '{}' has dtype {}; moekit loads it unquantized (BF16, F16 or F32 only)",
               name, r.dtype_string(name));
  return t.to_dtype(DType::kF32).view(want);
}

// The shared experts, unquantized: this tensor-parallel rank's rows of gate and up and columns of
// down (MoELayer::shared_width); the per-token gate whole. Under the layer's prefix:
// shared_experts (DeepSeek) or shared_expert (Qwen2-MoE, Llama 4), Qwen2-MoE's shared_expert_gate.
void load_shared(const Reader& r, const LayerNames& names, const ModelPreset& model,
                 const ParallelConfig& parallel, Tensor& w13, Tensor& w2, Tensor& gate) {
  if (model.num_shared_experts <= 0) return;
  if (model.shared_expert_gate) {  // Qwen2-MoE: mlp.shared_expert_gate.weight (1, H)
    gate = read_float(r, names.moe_prefix + ".shared_expert_gate.weight", {1, model.hidden_size});
  }
  const int64_t H = model.hidden_size;
  const int64_t Is = MoELayer::shared_width(model, parallel);
  std::string prefix = names.moe_prefix + ".shared_experts";
  if (!r.contains(prefix + ".gate_proj.weight") &&
      r.contains(names.moe_prefix + ".shared_expert.gate_proj.weight")) {
    prefix = names.moe_prefix + ".shared_expert";
  }
  const Tensor g = read_float(r, prefix + ".gate_proj.weight", {Is, H}, parallel);
  const Tensor u = read_float(r, prefix + ".up_proj.weight", {Is, H}, parallel);
  w2 = read_float(r, prefix + ".down_proj.weight", {H, Is}, parallel);
  w13 = Tensor::empty({2 * Is, H}, DType::kF32);
  std::memcpy(w13.data(), g.data(), g.nbytes());
  std::memcpy(static_cast<char*>(w13.data()) + g.nbytes(), u.data(), u.nbytes());
}

// The layer of a processed Quark method: its codes and its QuantConfig's scales and biases moved
// to the layer's device (the rest of w is already there), and its plan (the method planned once;
// the layer does not select again).
MoELayer quark_layer(const ModelPreset& model, const quark::QuarkMoEMethod& method,
                     const quark::ExpertParams& params, MoELayerWeights w,
                     const MoELayerOptions& options) {
  const Device device = options.device.device();
  auto placed = [&](const Tensor& t) { return !t.defined() || device.is_cpu() ? t : t.to(device); };
  w.w13 = placed(params.get("w13_weight"));
  w.w2 = placed(params.get("w2_weight"));
  QuantConfig quant = method.moe_quant_config();
  for (QuantDesc* d : {&quant.a1, &quant.a2, &quant.w1, &quant.w2}) {
    for (Tensor* t : {&d->scale, &d->alpha_or_gscale, &d->zp, &d->bias})
      *t = placed(*t);
  }
  return MoELayer(model, std::move(quant), std::move(w), options, method.plan());
}

// The checkpoint's quantization: its Quark config (other formats' configs translated) and the
// file suffixes that differ from Quark's (LayerNames::file_suffixes).
struct CheckpointQuant {
  std::optional<quark::QuarkConfig> quark;
  std::map<std::string, std::string> file_suffixes = {};
  std::set<std::string> reciprocal_suffixes = {};  // LayerNames::reciprocal_suffixes
  std::set<std::string> int4_word_suffixes = {};   // LayerNames::int4_word_suffixes
  bool hf_mxfp4 = false;                           // quant_method "mxfp4" (gpt-oss's fused layout)
  bool dequantize_mxfp4 = false;  // ... with "dequantize": the experts decoded, run unquantized
};

CheckpointQuant read_checkpoint_quant(const std::filesystem::path& dir) {
  const json root = read_config_json(dir);
  auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return {};
  const std::string where = (dir / "config.json").string() + ": quantization_config";
  if (!it->is_object()) {
    throw Error(fmt::format("{}: expected an object, got {}", where, it->type_name()));
  }
  if (const auto m = it->find("quant_method"); m != it->end() && m->is_string()) {
    const std::string method = m->get<std::string>();
    MOEKIT_CHECK(method == "quark" || method == "fp8" || method == "mxfp4" ||
                     method == "compressed-tensors" || method == "modelopt",
                 "{}.quant_method: '{}' is not supported: moekit loads Quark (\"quark\"), "
                 "HuggingFace fp8 (\"fp8\") and MXFP4 (\"mxfp4\", gpt-oss), compressed-tensors "
                 "(8-bit, NVFP4, W4AFP8) and ModelOpt (FP8, NVFP4) checkpoints",
                 where, method);
  }
  CheckpointQuant q;
  if (quantization::is_hf_fp8_config(*it)) {
    const quantization::HfFp8Config hf = quantization::parse_hf_fp8_config(*it, where);
    q.quark = hf.to_quark_config();
    q.file_suffixes["weight_scale"] = hf.weight_scale_suffix();
  } else if (quantization::is_modelopt_config(*it)) {
    const quantization::ModelOptConfig mo = quantization::parse_modelopt_config(*it, where);
    q.quark = mo.to_quark_config();
    q.file_suffixes["input_scale_2"] = mo.file_suffix("input_scale_2");
  } else if (quantization::is_compressed_tensors_config(*it)) {
    const quantization::CompressedTensorsConfig ct =
        quantization::parse_compressed_tensors_config(*it, where);
    q.quark = ct.to_quark_config();
    for (const char* suffix : {"weight", "weight_scale_2", "input_scale_2"}) {
      if (ct.file_suffix(suffix) != suffix) q.file_suffixes[suffix] = ct.file_suffix(suffix);
      if (ct.reciprocal_in_file(suffix)) q.reciprocal_suffixes.insert(suffix);
      if (ct.int4_words_in_file(suffix)) q.int4_word_suffixes.insert(suffix);
    }
  } else if (quantization::is_hf_mxfp4_config(*it)) {
    const quantization::HfMxfp4Config hf = quantization::parse_hf_mxfp4_config(*it, where);
    q.hf_mxfp4 = true;
    q.dequantize_mxfp4 = hf.dequantize;
    if (!hf.dequantize) q.quark = hf.to_quark_config();
  } else {
    q.quark = quark::QuarkConfig::from_json(*it, where);
  }
  return q;
}

}  // namespace

std::optional<quark::QuarkConfig> read_quark_config(const std::filesystem::path& dir) {
  return read_checkpoint_quant(dir).quark;
}

MoELayer load_moe_layer(const std::filesystem::path& dir, int layer_index,
                        const MoELayerOptions& options, CheckpointInfo* info) {
  const CheckpointQuant quant = read_checkpoint_quant(dir);
  const std::optional<quark::QuarkConfig>& qc = quant.quark;
  const ModelPreset model = preset_from_hf_config(dir / "config.json");
  const MoEConfig moe = MoELayer::make_moe_config(model, options);

  const Reader r(dir);
  LayerNames names = find_names(r, layer_index, model);
  names.file_suffixes = quant.file_suffixes;
  names.reciprocal_suffixes = quant.reciprocal_suffixes;
  names.int4_word_suffixes = quant.int4_word_suffixes;
  const int64_t E = moe.num_local_experts, H = moe.hidden_dim;
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t first = moe.parallel.ep_rank * E;  // this rank's experts
  MoELayerWeights w;
  const std::string router_name = fmt::format("{}.{}.weight", names.moe_prefix, names.router);
  const std::string router_bias_name = fmt::format("{}.{}.bias", names.moe_prefix, names.router);
  if (r.contains(router_name)) {
    w.router_weight = read_float(r, router_name, {moe.num_experts, H});
  }
  if (r.contains(router_bias_name)) {  // gpt-oss
    w.router_bias = read_float(r, router_bias_name, {moe.num_experts});
  }
  Tensor e_score_bias;
  if (model.has_e_score_correction_bias) {
    e_score_bias =
        read_float(r, names.moe_prefix + ".gate.e_score_correction_bias", {moe.num_experts});
  }
  Tensor shared_w13, shared_w2;
  Tensor shared_gate;
  load_shared(r, names, model, moe.parallel, shared_w13, shared_w2, shared_gate);
  const Device device = options.device.device();
  auto placed = [&](const Tensor& t, DType dtype) {
    if (!t.defined()) return t;
    const Tensor c = t.dtype() == dtype ? t : t.to_dtype(dtype);
    return device.is_cpu() ? c : c.to(device);
  };
  w.e_score_correction_bias = placed(e_score_bias, DType::kF32);
  w.shared_w13 = placed(shared_w13, options.dtype);
  w.shared_w2 = placed(shared_w2, options.dtype);
  w.shared_gate = placed(shared_gate, DType::kF32);
  if (info != nullptr) {
    info->dir = dir;
    info->layer_index = layer_index;
    info->method = "unquantized";
  }

  if (options.check_finite_weights) {
    check_finite(w.router_weight, router_name);
    check_finite(w.router_bias, router_bias_name);
    check_finite(e_score_bias, names.moe_prefix + ".gate.e_score_correction_bias");
    check_finite(shared_w13, "the shared experts' gate/up weights");
    check_finite(shared_w2, "the shared experts' down weight");
    check_finite(shared_gate, "the shared experts' per-token gate");
  }
  const std::string layer_name = names.moe_prefix + ".experts";
  const std::string experts_desc = fmt::format("{}.experts.*", names.moe_prefix);
  if (!qc || qc->is_excluded(layer_name)) {
    if (names.fused()) {
      MOEKIT_CHECK(quant.dequantize_mxfp4 || r.contains(names.fused_name("gate_up_proj", "")) ||
                       !r.contains(names.fused_name("gate_up_proj", "_blocks")),
                   "{} holds MXFP4 codes but {}/config.json has no quantization_config with "
                   "quant_method \"mxfp4\" to read them with",
                   names.fused_name("gate_up_proj", "_blocks"), dir.string());
      load_fused_unquantized(r, names, moe, options.dtype, w, model.has_bias, first,
                             quant.dequantize_mxfp4);
    } else {
      load_unquantized(r, names, moe, options.dtype, w, model.has_bias, first);
    }
    if (options.check_finite_weights) {
      for (const auto& [t, what] :
           {std::pair{&w.w13, "gate/up weights"}, std::pair{&w.w2, "down weights"},
            std::pair{&w.w13_bias, "gate/up biases"}, std::pair{&w.w2_bias, "down biases"}}) {
        check_finite(*t, fmt::format("{} ({})", experts_desc, what));
      }
    }
    for (Tensor* t : {&w.w13, &w.w2, &w.w13_bias, &w.w2_bias})
      *t = placed(*t, options.dtype);
    return MoELayer(model, std::move(w), options);
  }

  const quark::QuarkMoETarget target = quark::get_moe_method_target(*qc, layer_name);
  std::unique_ptr<quark::QuarkMoEMethod> method = quark::get_moe_method(*qc, moe, target);
  method->plan().check();
  const auto [H2, I2] = method->maybe_roundup_sizes(H, I, options.dtype, moe.parallel);
  MOEKIT_CHECK(H2 == H && I2 == I,
               "{}: hidden_size={} and intermediate_size={} must already be aligned for backend "
               "{} (needs {} and {}); padding checkpoints on load is not supported",
               method->name(), H, I, method->backend(), H2, I2);
  quark::ExpertParams params;
  method->create_weights(params, E, H, I, options.dtype);
  params.swiglu = SwigluParams{model.swiglu_alpha, model.swiglu_beta, model.swiglu_limit};
  if (names.fused()) {
    MOEKIT_CHECK(quant.hf_mxfp4 && names.storage == ExpertStorage::kFusedInterleaved,
                 "{}.experts holds every expert fused (gate_up_proj, down_proj), which moekit "
                 "loads unquantized, or as HuggingFace MXFP4 (quant_method \"mxfp4\") in "
                 "gpt-oss's layout; not with {}",
                 names.moe_prefix, method->name());
    load_fused_mxfp4_params(r, names, moe, params, first);
  } else {
    for (const std::string& p : params.names())
      load_param(r, names, params, p, moe.w13_num_shards(), first, moe.parallel);
  }
  method->process_weights_after_loading(params);
  if (info != nullptr) info->method = method->name();
  if (options.check_finite_weights) {
    for (const std::string& p : params.names())
      check_finite(params.get(p), fmt::format("{} (parameter {})", experts_desc, p));
  }
  return quark_layer(model, *method, params, std::move(w), options);
}

MoELayer random_quantized_layer(const ModelPreset& model, const std::string& scheme,
                                const MoELayerOptions& options, uint64_t seed) {
  if (scheme == "bf16" || scheme == "unquantized") {
    return MoELayer(model, MoELayer::random_weights(model, options, seed), options);
  }
  const quark::QuarkConfig qc = quark::QuarkConfig::parse(io::fixture_quantization_config(scheme));
  const MoEConfig moe = MoELayer::make_moe_config(model, options);
  const auto method = quark::get_moe_method(
      qc, moe, quark::get_moe_method_target(qc, "model.layers.0.mlp.experts"));
  method->plan().check();
  const int64_t E = moe.num_local_experts, H = moe.hidden_dim;
  const int64_t I = moe.intermediate_size_per_partition();
  quark::ExpertParams params;
  params.zero_fill = false;  // fill_random_parameters writes every parameter
  method->create_weights(params, E, H, I, options.dtype);
  params.swiglu = SwigluParams{model.swiglu_alpha, model.swiglu_beta, model.swiglu_limit};
  quark::fill_random_parameters(
      params, *method, H, I, seed * 1000003ull + static_cast<uint64_t>(options.parallel.ep_rank));
  method->process_weights_after_loading(params);
  // The router bias and the shared experts as the unquantized random layer has them.
  MoELayerWeights w = MoELayer::random_weights(model, options, seed, /*routed_experts=*/false);
  return quark_layer(model, *method, params, std::move(w), options);
}

}  // namespace moekit
