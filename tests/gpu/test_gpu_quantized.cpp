// Quantized layers on the GPU (Sm90Fp8Experts, Sm90BatchedFp8Experts, Sm90Int8Experts,
// Sm90W4A8Experts, Sm90Mxfp4Experts, Sm90Mxfp6Experts, Sm90Nvfp4Experts) against the CPU emulation
// of the same quantization (CpuFp8Experts / CpuInt8Experts / CpuW4A8Experts / CpuMxfp4Experts /
// CpuOcpMxExperts / CpuNvfp4Experts, same random weights through the same Quark method) and against
// the float64 reference: fp8 (128x128 blocks with 1x128 activation groups, per-tensor static,
// per-channel with per-token activations), int8 (per-channel weights with per-token activations,
// per-tensor static), W4A8 (int4 weights per channel or in groups of 128 along K, fp8
// activations), MXFP4 weights with bf16
// activations (gpt-oss W4A16), MXFP6 weights with MXFP6 (e3m2 and e2m3) or fp8 activations, NVFP4
// weights with bf16 activations (a W4A16 checkpoint, and a W4A4 one that Hopper runs weight-only:
// it is held to its own W4A16 float64 recomputation and to the W4A4 emulation within the scheme's
// tolerance), H and I that are not multiples of 128, M = 0 .. 65537, an expert map, shared experts,
// every tile forced, graph replay bitwise, the device quantizer bit-exact against the host one.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <span>

#include "graph_replay.h"
#include "moekit/core/tolerance.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/layer/reference.h"
#include "moekit/oracle/make_moe_kernel.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/quant/moe_input_quant.h"
#include "require_gpu.h"
#include "testing.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "quant/cuda/moe_input_quant.h"
#include "quant/cuda/mx_qdq.h"
#endif

namespace moekit {
namespace {

// What a scheme runs on each side and the tolerances it is held to (the one table).
struct SchemeInfo {
  const char* gpu_experts;
  const char* cpu_experts;
  const char* vs_emulation;  // tolerance of the GPU against the emulation
  const char* vs_float64;    // tolerance of the scheme against float64
  // The GPU runs another QuantConfig than the emulation (a weight-only backend): the float64
  // recomputation follows the GPU layer's.
  bool gpu_weight_only = false;
};

SchemeInfo scheme_info(const std::string& scheme) {
  if (scheme == "nvfp4_w4a16") {
    return {"Sm90Nvfp4Experts", "CpuNvfp4Experts", "nvfp4_w4a16_gpu", "nvfp4_w4a16_gpu"};
  }
  if (scheme == "nvfp4") {
    return {"Sm90Nvfp4Experts", "CpuNvfp4Experts", "nvfp4", "nvfp4_w4a16_gpu", true};
  }
  if (scheme == "mxfp4_w4a16") {
    return {"Sm90Mxfp4Experts", "CpuMxfp4Experts", "mxfp4_w4a16_gpu", "mxfp4"};
  }
  if (scheme == "mxfp4_a4")
    return {"Sm90Mxfp4Experts", "CpuMxfp4Experts", "mxfp4_w4a4_gpu", "mxfp4"};
  if (scheme == "mxfp4_a8")  // fp8 codes requantized between the GEMMs: fp8's bound
    return {"Sm90Mxfp4Experts", "CpuMxfp4Experts", "fp8_w8a8_gpu", "mxfp4"};
  if (scheme == "mxfp6_e3m2" || scheme == "mxfp6_e2m3")
    return {"Sm90Mxfp6Experts", "CpuOcpMxExperts", "mxfp6_gpu", "mxfp6"};
  if (scheme == "mxfp6_e3m2_a8" || scheme == "mxfp6_e2m3_a8")  // fp8 codes, as mxfp4_a8
    return {"Sm90Mxfp6Experts", "CpuOcpMxExperts", "fp8_w8a8_gpu", "mxfp6"};
  if (scheme.rfind("int8_", 0) == 0) {
    return {"Sm90Int8Experts", "CpuInt8Experts", "int8_w8a8_gpu", "int8_w8a8"};
  }
  if (scheme == "w4a8_fp8" || scheme == "w4a8_fp8_g128") {
    return {"Sm90W4A8Experts", "CpuW4A8Experts", "w4a8_gpu", "w4a8"};
  }
  return {"Sm90Fp8Experts", "CpuFp8Experts", "fp8_w8a8_gpu", "fp8_w8a8"};
}

struct LayerPair {
  MoELayer cpu, gpu;
};

LayerPair make_pair(const ModelPreset& model, const std::string& scheme, int64_t max_tokens,
                    ParallelConfig parallel = {}, uint64_t seed = 5) {
  MoELayerOptions cpu_opt;
  cpu_opt.max_num_tokens = max_tokens;
  cpu_opt.parallel = parallel;
  MoELayerOptions gpu_opt = cpu_opt;
  gpu_opt.device = default_device_info();
  return {random_quantized_layer(model, scheme, cpu_opt, seed),
          random_quantized_layer(model, scheme, gpu_opt, seed)};
}

struct Errors {
  double vs_emulation = 0, vs_float64 = 0;
};

// Routes on the CPU, runs both layers' routed experts (and shared experts) on the same input and
// compares the GPU output with the emulation's and with the float64 recomputation.
Errors compare(LayerPair& p, int64_t M, uint64_t seed, bool gpu_weight_only = false) {
  const ModelPreset& model = p.cpu.model();
  const Tensor x = testing::random_tensor({M, model.hidden_size}, DType::kBF16, seed);
  const Tensor logits =
      testing::random_tensor({M, model.num_experts}, DType::kF32, seed + 1, -3, 3);
  const RoutingResult r = p.cpu.router().select_experts(x, logits);
  const Tensor emulated = p.cpu.forward_routed(x, r.topk_ids, r.topk_weights);
  const Device gd = p.gpu.moe_config().device.device();
  Tensor out = Tensor::empty({M, model.hidden_size}, DType::kBF16, gd);
  out.fill_bytes(0xFF);  // poison: an unwritten element stays NaN
  RunContext ctx{p.gpu.default_stream(), nullptr};
  p.gpu.forward_routed_into(out, x.to(gd), r.topk_ids.to(gd), r.topk_weights.to(gd), ctx);
  synchronize(ctx.stream);
  const Tensor got = out.to(Device::cpu());
  EXPECT_FALSE(testing::has_nan(got)) << "unwritten (poisoned) output elements";
  Errors e;
  const std::vector<float> ev = emulated.to_float_vector();
  e.vs_emulation = testing::relative_l2_error(got, std::vector<double>(ev.begin(), ev.end()));
  std::vector<int64_t> rows;
  for (int64_t m = 0; m < std::min<int64_t>(M, 64); ++m)
    rows.push_back(m);
  if (!rows.empty()) {
    e.vs_float64 =
        relative_error(got, reference_forward(gpu_weight_only ? p.gpu : p.cpu, x, r, rows), rows);
  }
  return e;
}

struct SchemeCase {
  std::string scheme, preset;
  int64_t M;
};

void PrintTo(const SchemeCase& c, std::ostream* os) {
  *os << c.scheme << "/" << c.preset << "/M=" << c.M;
}

class QuantizedGpuVsEmulation : public ::testing::TestWithParam<SchemeCase> {};

// "small" with a hidden size of 320: partial 128-blocks of K (GEMM1) and of N (GEMM2).
ModelPreset odd_hidden_preset() {
  ModelPreset m = find_preset("small");
  m.name = "small-h320";
  m.hidden_size = 320;
  return m;
}

ModelPreset preset_of(const std::string& name) {
  return name == "small-h320" ? odd_hidden_preset() : find_preset(name);
}

TEST_P(QuantizedGpuVsEmulation, MatchesEmulationAndFloat64) {
  REQUIRE_SM90_GPU();
  const SchemeCase c = GetParam();
  const SchemeInfo info = scheme_info(c.scheme);
  const ModelPreset model = preset_of(c.preset);
  if (c.scheme == "fp8_block128" && model.intermediate_size % 128 != 0) {
    // The format forbids it: a 128-row weight block would hold gate and up rows.
    MoELayerOptions opt;
    opt.device = default_device_info();
    const std::string msg =
        testing::error_of([&] { random_quantized_layer(model, c.scheme, opt, 5); });
    EXPECT_TRUE(testing::contains_all(msg, {"intermediate_size_per_partition", "multiple of 128"}))
        << msg;
    return;
  }
  if (c.scheme.rfind("mxfp6", 0) == 0 &&
      (model.hidden_size % 64 != 0 || model.intermediate_size % 64 != 0)) {
    // The kernels' MXFP6 rows are whole 16-byte chunks (3k / 4 bytes): refused with the reason
    // (a checkpoint's Quark method pads the sizes to the backend's 64 instead).
    MoELayerOptions opt;
    opt.device = default_device_info();
    const std::string msg =
        testing::error_of([&] { random_quantized_layer(model, c.scheme, opt, 5); });
    EXPECT_TRUE(testing::contains_all(msg, {"Sm90Mxfp6Experts", "multiples of 64"})) << msg;
    return;
  }
  LayerPair p = make_pair(model, c.scheme, std::max<int64_t>(c.M, 1));
  EXPECT_EQ(p.gpu.kernel().fused_experts().name(), info.gpu_experts);
  EXPECT_EQ(p.cpu.kernel().fused_experts().name(), info.cpu_experts);
  const Errors e = compare(p, c.M, 11, info.gpu_weight_only);
  if (c.M == 0) return;
  std::cout << "[quantized] " << c.scheme << " " << c.preset << " M=" << c.M << " vs emulation "
            << e.vs_emulation << ", vs float64 " << e.vs_float64 << "\n";
  EXPECT_LE(e.vs_emulation, tolerance(info.vs_emulation).rel_l2);
  EXPECT_LE(e.vs_float64, tolerance(info.vs_float64).rel_l2);
}

std::vector<SchemeCase> scheme_cases() {
  std::vector<SchemeCase> v;
  for (const char* scheme :
       {"fp8_block128", "fp8_per_tensor", "fp8_per_channel", "int8_w8a8", "int8_per_tensor",
        "mxfp4_w4a16", "nvfp4_w4a16", "nvfp4", "w4a8_fp8", "w4a8_fp8_g128", "mxfp4_a4", "mxfp4_a8",
        "mxfp6_e3m2", "mxfp6_e2m3", "mxfp6_e3m2_a8", "mxfp6_e2m3_a8"}) {
    // small: H 256, I 384 (multiples of 128); small-h320: H 320 (partial K and N blocks);
    // small-deepseek: shared experts, grouped routing; small-gpt-oss: H = I = 192, swigluoai with
    // biases; tiny: H 64, I 96 (block-128 refuses the last two: I is not a multiple of 128;
    // MXFP6 refuses tiny: I is not a multiple of 64).
    for (const char* preset : {"small", "small-h320", "small-deepseek", "small-gpt-oss", "tiny"}) {
      for (int64_t M : {0, 1, 33, 257})
        v.push_back({scheme, preset, M});
    }
    v.push_back({scheme, "small", 8192});
    v.push_back({scheme, "small", 65537});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Schemes, QuantizedGpuVsEmulation, ::testing::ValuesIn(scheme_cases()),
                         [](const auto& info) {
                           return testing::param_name(info.param.scheme + "_" + info.param.preset +
                                                      "_M" + std::to_string(info.param.M));
                         });

// Every 8-bit row of the tile table, forced by name, at decode and prefill sizes.
TEST(QuantizedGpu, Every8BitTileMatchesEmulation) {
  REQUIRE_SM90_GPU();
  struct TileCase {
    const char* tile;
    std::vector<const char*> schemes;
  };
  const std::vector<TileCase> cases = {
      {"64x128", {"fp8_block128"}},
      {"64x64",
       {"fp8_block128", "fp8_per_channel", "fp8_per_tensor", "int8_w8a8", "int8_per_tensor"}},
      {"128x128", {"fp8_block128", "fp8_per_channel", "fp8_per_tensor"}},
      {"128x256",
       {"fp8_block128", "fp8_per_channel", "fp8_per_tensor", "int8_w8a8", "int8_per_tensor"}},
      {"128x256epi", {"fp8_per_channel", "fp8_per_tensor", "int8_w8a8", "int8_per_tensor"}},
      {"128x256mc", {"fp8_block128", "fp8_per_channel", "fp8_per_tensor"}},
      {"128x128pp", {"fp8_per_channel", "fp8_per_tensor"}},
      {"16x64",
       {"fp8_block128", "fp8_per_channel", "fp8_per_tensor", "mxfp4_w4a16", "nvfp4_w4a16"}},
      {"16x64tma", {"fp8_block128", "fp8_per_channel", "fp8_per_tensor"}},
      {"64x64", {"mxfp4_w4a16", "nvfp4_w4a16", "mxfp6_e3m2", "mxfp6_e2m3"}},
      {"128x128", {"mxfp4_w4a16", "nvfp4_w4a16", "mxfp6_e3m2", "mxfp6_e2m3"}},
      {"16x64", {"mxfp6_e3m2", "mxfp6_e2m3", "mxfp6_e3m2_a8"}},
      {"1x64simt", {"mxfp4_w4a16", "nvfp4_w4a16", "mxfp6_e3m2", "mxfp6_e2m3"}},
      {"16x64tma", {"w4a8_fp8", "w4a8_fp8_g128"}},
      {"128x256", {"w4a8_fp8"}},
      {"256x128", {"w4a8_fp8"}},
      {"128x128", {"w4a8_fp8_g128"}},
  };
  for (const TileCase& tc : cases) {
    const char* tile = tc.tile;
    for (const char* scheme : tc.schemes) {
      for (int64_t M : {5, 300}) {
        MoELayerOptions cpu_opt;
        cpu_opt.max_num_tokens = M;
        MoELayerOptions gpu_opt = cpu_opt;
        gpu_opt.device = default_device_info();
        gpu_opt.tile_config = tile;
        const ModelPreset model = odd_hidden_preset();
        LayerPair p{random_quantized_layer(model, scheme, cpu_opt, 9),
                    random_quantized_layer(model, scheme, gpu_opt, 9)};
        const Errors e = compare(p, M, 13);
        EXPECT_LE(e.vs_emulation, tolerance(scheme_info(scheme).vs_emulation).rel_l2)
            << tile << " " << scheme << " M=" << M;
      }
    }
  }
}

// MXFP4 weights with static fp8 activations on the e4m3 rows (backend sm90_mxfp4_fp8, forced:
// the oracle still prefers sm90_mxfp4's bf16 rows): every preset (tiny: K = 64 and 96, partial
// K steps; small-h320: a partial last step of H; small-gpt-oss: swigluoai with biases), decode to
// prefill sizes, both rows forced, against the CPU emulation and float64 (graph replay:
// CudaGraphReplayIsBitwiseIdentical).
TEST(QuantizedGpu, Mxfp4Fp8OnTheE4m3RowsMatchesEmulation) {
  REQUIRE_SM90_GPU();
  const SchemeInfo info = scheme_info("mxfp4_a8");
  for (const char* tile : {"auto", "16x64tma", "128x128"}) {
    for (const char* preset : {"small", "small-h320", "small-deepseek", "small-gpt-oss", "tiny"}) {
      for (int64_t M : {0, 1, 33, 257, 8192}) {
        if (std::string(tile) != "auto" && (M == 0 || M == 8192)) continue;
        MoELayerOptions cpu_opt;
        cpu_opt.max_num_tokens = std::max<int64_t>(M, 1);
        MoELayerOptions gpu_opt = cpu_opt;
        gpu_opt.device = default_device_info();
        gpu_opt.backend = "sm90_mxfp4_fp8";
        gpu_opt.tile_config = tile;
        const ModelPreset model = preset_of(preset);
        LayerPair p{random_quantized_layer(model, "mxfp4_a8", cpu_opt, 21),
                    random_quantized_layer(model, "mxfp4_a8", gpu_opt, 21)};
        ASSERT_EQ(p.gpu.kernel().fused_experts().name(), "Sm90Mxfp4Fp8Experts");
        const Errors e = compare(p, M, 23);
        if (M == 0) continue;
        std::cout << "[mxfp4_fp8] " << tile << " " << preset << " M=" << M << " vs emulation "
                  << e.vs_emulation << ", vs float64 " << e.vs_float64 << "\n";
        EXPECT_LE(e.vs_emulation, tolerance(info.vs_emulation).rel_l2)
            << tile << " " << preset << " M=" << M;
        EXPECT_LE(e.vs_float64, tolerance(info.vs_float64).rel_l2)
            << tile << " " << preset << " M=" << M;
      }
    }
  }
}

TEST(QuantizedGpu, ExpertMapRanksMatchEmulation) {
  REQUIRE_SM90_GPU();
  for (const char* scheme :
       {"fp8_block128", "int8_w8a8", "mxfp4_w4a16", "nvfp4_w4a16", "w4a8_fp8", "w4a8_fp8_g128"}) {
    for (int rank = 0; rank < 2; ++rank) {
      const ParallelConfig par = ParallelConfig::make(2, 1, 0, rank, /*enable_ep=*/true);
      LayerPair p = make_pair(find_preset("small"), scheme, 64, par);
      ASSERT_TRUE(p.gpu.expert_map().defined());
      const Errors e = compare(p, 50, 5);
      EXPECT_LE(e.vs_emulation, tolerance(scheme_info(scheme).vs_emulation).rel_l2)
          << scheme << " rank " << rank;
    }
  }
}

#ifdef MOEKIT_WITH_CUDA
// The device quantizer gives the host reference's codes and scales bit for bit: every scale
// shape, static and dynamic, bf16 / f16 / f32 rows, and widths that take each chunk width of the
// kernels (16 and 8 elements, or one: 36 columns); with a device row count or the batched
// format's counts per expert, the rows that do not exist keep their poison and stay out of a
// dynamic per-tensor amax.
TEST(QuantizedGpu, DeviceQuantizerIsBitExact) {
  REQUIRE_SM90_GPU();
  const Device gd = default_device_info().device();
  struct Desc {
    const char* name;
    QuantDesc desc;
  };
  std::vector<Desc> descs;
  QuantDesc d;
  d.dtype = QuantDType::kFp8E4M3;
  d.shape = GroupShape{1, 128};
  descs.push_back({"fp8 1x128", d});
  d.shape = GroupShape::per_token();
  descs.push_back({"fp8 per token", d});
  d.shape = GroupShape::per_tensor();
  descs.push_back({"fp8 dynamic per tensor", d});
  d.scale = Tensor::from_floats(std::vector<float>{0.0137f}, {1}, DType::kF32);
  descs.push_back({"fp8 static per tensor", d});
  d.dtype = QuantDType::kInt8;
  d.scale = Tensor::from_floats(std::vector<float>{0.031f}, {1}, DType::kF32);
  descs.push_back({"int8 static per tensor", d});
  d.scale = Tensor();
  descs.push_back({"int8 dynamic per tensor", d});
  d.shape = GroupShape::per_token();
  descs.push_back({"int8 per token", d});
  // Which rows exist: all 37, the first 32 (a device row count), or the batched format's 3
  // experts x 12 rows with counts {5, 0, 15 (clamped to 12)}.
  enum class Valid { kAll, kCounted, kBatched };
  for (const Desc& c : descs) {
    for (const DType xt : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (int64_t cols : {36, 64, 200, 7168}) {
        for (const Valid mode : {Valid::kAll, Valid::kCounted, Valid::kBatched}) {
          const int64_t rows = mode == Valid::kBatched ? 36 : 37;
          std::vector<int64_t> valid_rows;
          for (int64_t r = 0; r < rows; ++r) {
            const bool valid = mode == Valid::kAll       ? true
                               : mode == Valid::kCounted ? r < rows - 5
                                                         : r % 12 < std::array{5, 0, 12}[r / 12];
            if (valid) valid_rows.push_back(r);
          }
          const int64_t valid = static_cast<int64_t>(valid_rows.size());
          const Tensor x = testing::random_tensor({rows, cols}, xt, 3, -4.0f, 4.0f);
          const std::vector<float> xs = x.to_float_vector();
          std::vector<float> valid_xs;
          for (const int64_t r : valid_rows)
            valid_xs.insert(valid_xs.end(), xs.begin() + r * cols, xs.begin() + (r + 1) * cols);
          const Tensor x_valid = Tensor::from_floats(valid_xs, {valid, cols}, xt);
          const QuantizedInput ref = quantize_moe_input(x_valid, c.desc, RunContext{});
          QuantDesc on_gpu = c.desc;
          if (on_gpu.scale.defined()) on_gpu.scale = on_gpu.scale.to(gd);
          const DeviceQuantShapes s = device_quant_shapes(rows, cols, c.desc);
          Tensor poison_data = Tensor::empty(s.data, s.data_dtype);
          std::mt19937 rng(static_cast<uint32_t>(cols + valid));
          for (size_t i = 0; i < poison_data.nbytes(); ++i)
            static_cast<uint8_t*>(poison_data.data())[i] = static_cast<uint8_t>(rng());
          Tensor data = poison_data.to(gd);
          Tensor scale = Tensor::empty(s.scale, DType::kF32, gd);
          Tensor amax = Tensor::empty({1}, DType::kInt32, gd);
          const int64_t count_value[] = {rows - 5};
          const Tensor count = Tensor::from_ints(count_value, {1}, DType::kInt32).to(gd);
          const int64_t batch_count_values[] = {5, 0, 15};
          const Tensor batch_counts =
              Tensor::from_ints(batch_count_values, {3}, DType::kInt32).to(gd);
          ValidRows which;
          if (mode == Valid::kCounted) which.num_rows = count.data_as<const int32_t>();
          if (mode == Valid::kBatched) {
            which.batch_counts = batch_counts.data_as<const int32_t>();
            which.batch_rows = 12;
          }
          CudaStream stream(gd.index);
          quantize_on_device(x.to(gd), on_gpu, data, scale, amax.data(), which, stream.get());
          synchronize(stream.get());
          const std::string what = fmt::format("{} x {} cols {} mode {} rows {}", c.name,
                                               dtype_name(xt), cols, static_cast<int>(mode), valid);
          const Tensor got_data = data.to(Device::cpu()), got_scale = scale.to(Device::cpu());
          ASSERT_EQ(ref.data.nbytes(), static_cast<size_t>(valid * cols)) << what;
          const auto* got = static_cast<const uint8_t*>(got_data.data());
          const auto* want = static_cast<const uint8_t*>(ref.data.data());
          const auto* poison = static_cast<const uint8_t*>(poison_data.data());
          for (int64_t r = 0, j = 0; r < rows; ++r) {
            const bool is_valid = j < valid && valid_rows[static_cast<size_t>(j)] == r;
            const uint8_t* expect = is_valid ? want + j * cols : poison + r * cols;
            EXPECT_EQ(std::memcmp(got + r * cols, expect, static_cast<size_t>(cols)), 0)
                << what << ": row " << r << (is_valid ? "" : " (not valid: written)");
            j += is_valid ? 1 : 0;
          }
          if (on_gpu.scale.defined()) continue;  // the static scale is the GEMM's scale
          if (c.desc.shape.is_per_tensor()) {
            EXPECT_EQ(got_scale.to_float_vector()[0], ref.scale.to_float_vector()[0]) << what;
            continue;
          }
          const int64_t per_row = valid > 0 ? ref.scale.numel() / valid : 0;
          for (int64_t j = 0; j < valid; ++j) {
            EXPECT_EQ(std::memcmp(static_cast<const float*>(got_scale.data()) +
                                      valid_rows[static_cast<size_t>(j)] * per_row,
                                  static_cast<const float*>(ref.scale.data()) + j * per_row,
                                  static_cast<size_t>(per_row) * sizeof(float)),
                      0)
                << what << ": scales of row " << valid_rows[static_cast<size_t>(j)];
          }
        }
      }
    }
  }
}

// The device MX quantize-dequantize (quant/cuda/mx_qdq.h) gives the host's quant_dequant_rows
// bit for bit, for each element format: random rows over many binades, an all-zero group, NaN and
// infinity, values at the grid's ties; rows past the device count left untouched.
TEST(QuantizedGpu, DeviceMxQuantDequantIsBitExact) {
  REQUIRE_SM90_GPU();
  const Device gd = default_device_info().device();
  const int64_t rows = 9, cols = 256;
  std::vector<float> xs(static_cast<size_t>(rows * cols));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t i = 0; i < xs.size(); ++i)
    xs[i] = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  for (int64_t c = 0; c < 32; ++c)
    xs[static_cast<size_t>(cols + c)] = 0.0f;  // row 1, group 0: all zero
  xs[static_cast<size_t>(2 * cols + 3)] = std::nanf("");
  xs[static_cast<size_t>(2 * cols + 40)] = INFINITY;
  for (int64_t c = 0; c < 32; ++c) {  // row 3, group 0: ties of the e2m1 grid times 2^-3
    xs[static_cast<size_t>(3 * cols + c)] =
        std::ldexp(0.25f + 0.5f * static_cast<float>(c % 12), -3);
  }
  const Tensor x = Tensor::from_floats(xs, {rows, cols}, DType::kBF16);
  for (const QuantDType fmt : {QuantDType::kFp4E2M1, QuantDType::kFp6E3M2, QuantDType::kFp6E2M3}) {
    QuantDesc d;
    d.dtype = fmt;
    d.shape = GroupShape{1, 32};
    std::vector<float> want = x.to_float_vector();
    const int64_t valid = rows - 2;  // the last two rows stay as they were
    quant_dequant_rows(std::span<float>(want.data(), static_cast<size_t>(valid * cols)), valid,
                       cols, d);
    Tensor got = x.to(gd);
    const std::vector<int64_t> count_host = {valid};
    const Tensor count = Tensor::from_ints(count_host, {1}, DType::kInt32).to(gd);
    cuda::MxQdqArgs q;
    q.x = got.data();
    q.y = got.data();
    q.rows = rows;
    q.cols = q.x_ld = q.y_ld = cols;
    q.num_rows = count.data_as<const int32_t>();
    q.element = fmt == QuantDType::kFp4E2M1   ? cuda::MxElement::kE2M1
                : fmt == QuantDType::kFp6E3M2 ? cuda::MxElement::kE3M2
                                              : cuda::MxElement::kE2M3;
    ASSERT_EQ(cuda::mx_qdq_unsupported_reason(q), nullptr);
    CudaStream stream(gd.index);
    ASSERT_EQ(cuda::launch_mx_qdq(q, static_cast<cudaStream_t>(stream.get().handle)), cudaSuccess);
    synchronize(stream.get());
    const std::vector<float> g = got.to(Device::cpu()).to_float_vector();
    int wrong = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const float w = want[i];  // MX values are bf16 values: exact after the bf16 round trip
      const bool same = std::isnan(w) ? std::isnan(g[i]) : g[i] == w;
      if (!same && wrong++ < 5) {
        ADD_FAILURE() << quant_dtype_name(fmt) << " element " << i << " (x " << xs[i] << "): got "
                      << g[i] << ", want " << w;
      }
    }
    EXPECT_EQ(wrong, 0) << quant_dtype_name(fmt);
  }
}
// The batched fp8 experts (Sm90BatchedFp8Experts behind the local scatter, PrepareFinalizeBatched)
// against the emulation of the same scheme: codes with per-row scales scattered beside them
// (block-128, per channel / token), a static per-tensor scale quantizing the batch after the
// scatter; partial 128-blocks of K and N (small-h320), M = 0 .. 257, graph replay bitwise. One
// rank keeps the standard format, so the pair is assembled here on the GPU layer's weights and
// scales, as GpuLayer.BatchedFormatMatchesReference assembles the bf16 one.
TEST(QuantizedGpu, BatchedFp8MatchesEmulation) {
  REQUIRE_SM90_GPU();
  constexpr int64_t kT = 257;  // rows per expert: max_num_tokens of one dispatcher
  for (const char* scheme : {"fp8_block128", "fp8_per_channel", "fp8_per_tensor"}) {
    for (const ModelPreset& model : {find_preset("small"), odd_hidden_preset()}) {
      MoELayerOptions cpu_opt;
      cpu_opt.max_num_tokens = kT;
      MoELayerOptions gpu_opt = cpu_opt;
      gpu_opt.device = default_device_info();
      LayerPair p{random_quantized_layer(model, scheme, cpu_opt, 9),
                  random_quantized_layer(model, scheme, gpu_opt, 9)};
      const MoEConfig& moe = p.gpu.moe_config();
      auto kernel = assemble_moe_kernel(
          p.gpu.quant_config(), moe, Sm90BatchedFp8Experts::klass(),
          std::make_unique<PrepareFinalizeBatched>(kT, static_cast<int>(moe.num_local_experts)));
      ASSERT_EQ(kernel->fused_experts().name(), "Sm90BatchedFp8Experts");
      const Device gd = moe.device.device();
      WorkspaceManager ws(gd);
      const RunContext ctx{p.gpu.default_stream(), &ws};
      for (const int64_t M : {int64_t{0}, int64_t{1}, int64_t{33}, kT}) {
        SCOPED_TRACE(fmt::format("{} {} M={}", scheme, model.name, M));
        const Tensor x = testing::random_tensor({M, model.hidden_size}, DType::kBF16, 17 + M);
        const Tensor logits =
            testing::random_tensor({M, model.num_experts}, DType::kF32, 18 + M, -3, 3);
        const RoutingResult r = p.cpu.router().select_experts(x, logits);
        const Tensor emulated = p.cpu.forward_routed(x, r.topk_ids, r.topk_weights);
        Tensor out = Tensor::empty({M, model.hidden_size}, DType::kBF16, gd);
        out.fill_bytes(0xFF);  // poison: an unwritten element stays NaN
        ModularApplyArgs args;
        args.hidden_states = x.to(gd);
        args.w1 = p.gpu.kernel_weights().w13;  // the layout the sm90 experts read
        args.w2 = p.gpu.kernel_weights().w2;
        args.topk_ids = r.topk_ids.to(gd);
        args.topk_weights = r.topk_weights.to(gd);
        args.activation = model.activation;
        args.global_num_experts = model.num_experts;
        args.apply_router_weight_on_input = p.cpu.router().apply_router_weight_on_input();
        args.output = out;
        kernel->apply(args, ctx);
        synchronize(ctx.stream);
        const Tensor got = out.to(Device::cpu());
        EXPECT_FALSE(testing::has_nan(got)) << "unwritten (poisoned) output elements";
        if (M == 0) continue;
        const std::vector<float> ev = emulated.to_float_vector();
        const double err =
            testing::relative_l2_error(got, std::vector<double>(ev.begin(), ev.end()));
        std::cout << "[batched fp8] " << scheme << " " << model.name << " M=" << M
                  << " vs emulation " << err << "\n";
        EXPECT_LE(err, tolerance(scheme_info(scheme).vs_emulation).rel_l2);
        if (M == 33) testing::expect_apply_replay_bitwise(*kernel, args, ctx);
      }
    }
  }
}

TEST(QuantizedGpu, CudaGraphReplayIsBitwiseIdentical) {
  REQUIRE_SM90_GPU();
  const ModelPreset m = find_preset("small-deepseek");  // router + shared experts in the graph
  for (const char* scheme :
       {"fp8_block128", "int8_w8a8", "mxfp4_w4a16", "nvfp4_w4a16", "w4a8_fp8", "w4a8_fp8_g128"}) {
    MoELayerOptions opt;
    opt.device = default_device_info();
    opt.max_num_tokens = 128;
    MoELayer layer = random_quantized_layer(m, scheme, opt, 3);
    ASSERT_EQ(layer.kernel().fused_experts().name(), scheme_info(scheme).gpu_experts);
    testing::expect_graph_replay_bitwise(layer, 77);
  }
  MoELayerOptions opt;  // MXFP4 on the e4m3 rows (forced)
  opt.device = default_device_info();
  opt.max_num_tokens = 128;
  opt.backend = "sm90_mxfp4_fp8";
  MoELayer layer = random_quantized_layer(m, "mxfp4_a8", opt, 3);
  ASSERT_EQ(layer.kernel().fused_experts().name(), "Sm90Mxfp4Fp8Experts");
  testing::expect_graph_replay_bitwise(layer, 77);
}
#endif

}  // namespace
}  // namespace moekit
