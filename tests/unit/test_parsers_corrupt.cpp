// Corrupt inputs to the checkpoint loader's JSON parsers: config.json and quantization_config
// truncated at every length, keys of the wrong type, missing keys, out-of-range and fractional
// integers, unknown enum strings, overflowing products, files that are directories, and the
// fixture writer's own limits. Never a crash; always a moekit::Error that names the file or the
// key, the value and the requirement.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "moekit/core/error.h"
#include "moekit/io/fixtures.h"
#include "moekit/io/json.h"
#include "moekit/io/safetensors.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/layer/presets.h"
#include "moekit/quantization/quark/quark_config.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::contains_all;
using testing::error_of;

namespace fs = std::filesystem;
using nlohmann::json;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CorruptQuarkConfig, EveryTruncationIsAnError) {
  for (const char* scheme : {"nvfp4", "fp8_block128", "w4a8_fp8"}) {
    const std::string text = io::fixture_quantization_config(scheme);
    ASSERT_NO_THROW(quark::QuarkConfig::parse(text));
    for (size_t n = 0; n < text.size(); n += 3) {
      const std::string e = error_of([&] { quark::QuarkConfig::parse(text.substr(0, n)); });
      EXPECT_NE(e.find("quantization_config: not valid JSON"), std::string::npos) << n << ": " << e;
    }
  }
}

TEST(CorruptQuarkConfig, WrongTypesAndMissingKeysNameTheKey) {
  const json good = json::parse(io::fixture_quantization_config("nvfp4"));
  struct Case {
    std::string pointer;
    json value;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"/quant_method", 5, "quantization_config.quant_method: expected a string, got number"},
      {"/quant_method", "awq", "'awq' is not supported by the Quark parser"},
      {"/global_quant_config", "x", "quantization_config.global_quant_config: expected an object"},
      {"/global_quant_config/weight", 7,
       "quantization_config.global_quant_config.weight: expected null, an object or a list"},
      {"/global_quant_config/weight/0/dtype", 4,
       "global_quant_config.weight[0].dtype: expected a string, got number 4"},
      {"/global_quant_config/weight/1/group_size", "16",
       "global_quant_config.weight[1].group_size: expected an integer, got string"},
      {"/global_quant_config/input_tensors/0/is_dynamic", "yes",
       "input_tensors[0].is_dynamic: expected true or false"},
      {"/global_quant_config/input_tensors/1", json::array(),
       "input_tensors[1]: expected an object"},
      {"/global_quant_config/weight/0/block_size", json::array({128, "x"}),
       "weight[0].block_size[1]: expected an integer"},
      {"/global_quant_config/weight/0/block_size", 128, "weight[0].block_size: expected a list"},
      {"/layer_quant_config", json::array(),
       "quantization_config.layer_quant_config: expected an "
       "object"},
      {"/layer_type_quant_config", json::object({{"FusedMoE", 3}}),
       "layer_type_quant_config.FusedMoE: expected an object"},
      {"/exclude", "lm_head", "quantization_config.exclude: expected a list"},
      {"/exclude", json::array({1}), "quantization_config.exclude[0]: expected a string"},
  };
  for (const Case& c : cases) {
    json j = good;
    j[json::json_pointer(c.pointer)] = c.value;
    // Through the text, as a checkpoint holds it (parsed non-negative integers are unsigned).
    const std::string e = error_of([&] { quark::QuarkConfig::parse(j.dump()); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.pointer << ": " << e;
  }
  json no_dtype = good;
  no_dtype["global_quant_config"]["weight"][1].erase("dtype");
  EXPECT_NE(error_of([&] {
              quark::QuarkConfig::from_json(no_dtype);
            }).find("global_quant_config.weight[1]: missing required key 'dtype'"),
            std::string::npos);
  json no_method = good;
  no_method.erase("quant_method");
  EXPECT_NE(error_of([&] {
              quark::QuarkConfig::from_json(no_method);
            }).find("missing required key 'quant_method'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { quark::QuarkConfig::parse("[1, 2]"); }).find("expected an object"),
            std::string::npos);
}

class CorruptConfigJson : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moekit_corrupt_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    io::FixtureOptions o;
    o.scheme = "mxfp4_a8";
    io::write_fixture_checkpoint(dir_, o);
    text_ = read(dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& s) { std::ofstream(dir_ / "config.json") << s; }
  std::string load_error() {
    return error_of([&] { load_moe_layer(dir_, 1); });
  }
  fs::path dir_;
  std::string text_;
};

TEST_F(CorruptConfigJson, TruncationsAreErrorsNamingTheFile) {
  for (size_t n = 0; n < text_.size(); n += 41) {
    write(text_.substr(0, n));
    const std::string e = load_error();
    EXPECT_NE(e.find("config.json"), std::string::npos) << n << ": " << e;
  }
  write(text_);
  EXPECT_NO_THROW(load_moe_layer(dir_, 1));
}

TEST_F(CorruptConfigJson, WrongTypesAndMissingKeys) {
  const json good = json::parse(text_);
  json j = good;
  j["quantization_config"] = "quark";
  write(j.dump());
  EXPECT_NE(load_error().find("quantization_config: expected an object, got string"),
            std::string::npos)
      << load_error();
  j = good;
  j["quantization_config"]["global_quant_config"]["input_tensors"]["qscheme"] = 1;
  write(j.dump());
  EXPECT_NE(load_error().find("global_quant_config.input_tensors.qscheme: expected a string"),
            std::string::npos)
      << load_error();
  j = good;
  j.erase("hidden_size");
  write(j.dump());
  EXPECT_NE(load_error().find("hidden_size"), std::string::npos) << load_error();
  j = good;
  j["num_experts"] = "eight";
  write(j.dump());
  EXPECT_NE(load_error().find("config.json"), std::string::npos) << load_error();
  j = good;
  j["hidden_size"] = 100;  // disagrees with the tensors
  write(j.dump());
  EXPECT_NE(load_error().find("model.layers.1.mlp"), std::string::npos) << load_error();
  write("[]");
  EXPECT_NE(load_error().find("expected a JSON object"), std::string::npos) << load_error();
  fs::remove(dir_ / "config.json");
  EXPECT_NE(load_error().find("cannot open"), std::string::npos) << load_error();
}

// ---- HuggingFace config.json: every value checked ---------------------------------------------

class HfConfigValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moekit_hfcfg_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static json good() {
    return json::parse(R"({"model_type": "deepseek_v3", "n_routed_experts": 16,
      "num_experts_per_tok": 4, "hidden_size": 64, "moe_intermediate_size": 32, "n_group": 4,
      "topk_group": 2, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
      "routed_scaling_factor": 2.5, "n_shared_experts": 1, "norm_topk_prob": true,
      "num_hidden_layers": 3, "first_k_dense_replace": 1, "hidden_act": "silu",
      "torch_dtype": "bfloat16"})");
  }
  fs::path write(const std::string& text) {
    const fs::path p = dir_ / "config.json";
    std::ofstream(p) << text;
    return p;
  }
  // The error of reading `j` with j[key] = value.
  std::string error_with(const std::string& key, const json& value) {
    json j = good();
    j[key] = value;
    return error_of([&] { (void)preset_from_hf_config(write(j.dump())); });
  }
  fs::path dir_;
};

TEST_F(HfConfigValidation, TheGoodConfigReads) {
  const ModelPreset p = preset_from_hf_config(write(good().dump()));
  EXPECT_EQ(p.num_experts, 16);
  EXPECT_EQ(p.first_moe_layer, 1);
  EXPECT_EQ(p.routing_method(), RoutingMethodType::kDeepSeekV3);
}

TEST_F(HfConfigValidation, IntegersMustBeWholeAndInRange) {
  // 2^32 + 8 must not read as 8, 192.5 not as 192.
  EXPECT_TRUE(contains_all(error_with("n_routed_experts", 4294967304ull),
                           {"config.json", "n_routed_experts=4294967304", "[1, 65536]"}));
  EXPECT_TRUE(contains_all(error_with("hidden_size", 192.5),
                           {"config.json", "hidden_size=192.5", "must be an integer"}));
  for (const json& bad : {json(-64), json(0), json(1e3), json(18446744073709551615ull),
                          json(-9223372036854775807ll - 1), json(4294967296ll)}) {
    EXPECT_TRUE(contains_all(error_with("hidden_size", bad), {"hidden_size=", "an integer in"}))
        << bad.dump();
  }
  EXPECT_TRUE(contains_all(error_with("moe_intermediate_size", -1), {"moe_intermediate_size=-1"}));
  EXPECT_TRUE(
      contains_all(error_with("num_experts_per_tok", 17), {"num_experts_per_tok=17", "[1, 16]"}));
  EXPECT_TRUE(contains_all(error_with("num_experts_per_tok", 0), {"num_experts_per_tok=0"}));
  EXPECT_TRUE(contains_all(error_with("num_hidden_layers", 2.5), {"num_hidden_layers=2.5"}));
  EXPECT_TRUE(
      contains_all(error_with("first_k_dense_replace", 4), {"first_k_dense_replace=4", "[0, 3]"}));
  EXPECT_TRUE(contains_all(error_with("n_shared_experts", -1), {"n_shared_experts=-1"}));
  EXPECT_TRUE(contains_all(error_with("n_group", 17), {"n_group=17"}));
  // Wrong JSON types say so.
  EXPECT_TRUE(contains_all(error_with("hidden_size", "64"),
                           {"hidden_size=\"64\"", "wrong type (string)", "an integer"}));
  EXPECT_TRUE(contains_all(error_with("hidden_size", true), {"hidden_size=true", "wrong type"}));
  EXPECT_TRUE(contains_all(error_with("hidden_size", json::array({64})),
                           {"hidden_size=an array of 1 elements", "wrong type"}));
  EXPECT_TRUE(
      contains_all(error_with("norm_topk_prob", "yes"), {"norm_topk_prob", "true or false"}));
  EXPECT_TRUE(contains_all(error_with("routed_scaling_factor", "2.5"),
                           {"routed_scaling_factor", "a number"}));
  EXPECT_TRUE(
      contains_all(error_with("routed_scaling_factor", -1.0), {"routed_scaling_factor=-1"}));
  EXPECT_TRUE(contains_all(error_with("routed_scaling_factor", 0.0), {"routed_scaling_factor=0"}));
  // A deeply nested value is described, never dumped recursively.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string text = good().dump();
  text.replace(text.find("\"hidden_size\":64"), 16, "\"hidden_size\":" + deep);
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(write(text)); }),
                           {"hidden_size=an array of 1 elements"}));
}

TEST_F(HfConfigValidation, EnumStringsMustBeKnown) {
  // An unknown activation is never silently silu.
  for (const char* act : {"gelu_new", "swish", "garbage", "SILU", ""}) {
    EXPECT_TRUE(contains_all(error_with("hidden_act", act),
                             {"hidden_act=\"", act, "not a supported activation", "silu",
                              "gelu_pytorch_tanh", "relu2_no_mul"}))
        << act;
  }
  EXPECT_TRUE(contains_all(error_with("hidden_act", 3), {"hidden_act=3", "a string"}));
  EXPECT_TRUE(contains_all(error_with("scoring_func", "softplus"),
                           {"scoring_func=\"softplus\"", "one of softmax, sigmoid"}));
  EXPECT_TRUE(contains_all(error_with("topk_method", "noaux"),
                           {"topk_method=\"noaux\"", "greedy, group_limited_greedy, noaux_tc"}));
  for (const char* dtype : {"float8_e4m3fn", "int8", "fp64x", "auto"}) {
    EXPECT_TRUE(contains_all(error_with("torch_dtype", dtype),
                             {"torch_dtype=\"", dtype, "bfloat16, float16, float32"}))
        << dtype;
  }
  EXPECT_TRUE(contains_all(error_with("model_type", 7), {"model_type=7", "a string"}));
  // Known values still read.
  for (const char* act : {"silu", "gelu", "gelu_pytorch_tanh", "swiglu"}) {
    json j = good();
    j["hidden_act"] = act;
    EXPECT_NO_THROW((void)preset_from_hf_config(write(j.dump()))) << act;
  }
}

TEST_F(HfConfigValidation, GroupedRoutingMustBeConsistent) {
  EXPECT_TRUE(contains_all(error_with("n_group", 3), {"n_group=3", "divide", "16"}));
  EXPECT_TRUE(contains_all(error_with("topk_group", 5), {"topk_group=5", "n_group=4"}));
  EXPECT_TRUE(contains_all(error_with("topk_group", 0), {"topk_group=0"}));
  json j = good();
  j["topk_group"] = 1;  // one group of 4 experts kept, but top_k = 4 is fine; 5 is not
  j["num_experts_per_tok"] = 5;
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(write(j.dump())); }),
                           {"num_experts_per_tok=5", "4 experts", "topk_group=1"}));
}

TEST_F(HfConfigValidation, OverflowingProductsNameTheProduct) {
  json j = good();
  j.erase("n_group");
  j.erase("topk_group");
  j["n_routed_experts"] = 65536;
  j["hidden_size"] = 2147483647;
  j["moe_intermediate_size"] = 2147483647;
  const std::string e = error_of([&] { (void)preset_from_hf_config(write(j.dump())); });
  EXPECT_TRUE(contains_all(e, {"config.json",
                               "num_experts * gate_up * intermediate_size * "
                               "hidden_size * bytes per element",
                               "65536 * 2 * 2147483647", "overflows"}))
      << e;
  // Large but representable sizes read (memory is planned later, not here).
  j["n_routed_experts"] = 256;
  j["hidden_size"] = 7168;
  j["moe_intermediate_size"] = 2048;
  EXPECT_NO_THROW((void)preset_from_hf_config(write(j.dump())));
}

TEST_F(HfConfigValidation, FileProblemsAreErrorsNotAborts) {
  // A directory named config.json, inside the directory given.
  fs::create_directories(dir_ / "sub" / "config.json");
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(dir_ / "sub"); }),
                           {"config.json", "is a directory"}));
  // A path that does not exist, and one below a regular file.
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(dir_ / "absent.json"); }),
                           {"absent.json", "cannot open"}));
  write(good().dump());
  EXPECT_TRUE(contains_all(
      error_of([&] { (void)preset_from_hf_config(dir_ / "config.json" / "x.json"); }), {"x.json"}));
  // A FIFO is not read (reading it would block).
  const fs::path fifo = dir_ / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(fifo); }),
                           {"fifo.json", "not a regular file"}));
  // Too large to be a config (sparse, so the test writes nothing).
  const fs::path huge = dir_ / "huge.json";
  std::ofstream(huge) << "{}";
  fs::resize_file(huge, io::kMaxJsonFileBytes + 1);
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(huge); }),
                           {"huge.json", "above the limit"}));
  // Not an object; a repeated key; text_config of the wrong type; every truncation.
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(write("[1]")); }),
                           {"config.json", "must hold a JSON object"}));
  EXPECT_TRUE(contains_all(error_of([&] {
                             (void)preset_from_hf_config(
                                 write(R"({"hidden_size": 1, "hidden_size": 2})"));
                           }),
                           {"config.json", "repeats the key 'hidden_size'"}));
  EXPECT_TRUE(contains_all(error_with("text_config", "x"), {"text_config=\"x\"", "an object"}));
  const std::string text = good().dump();
  for (size_t n = 0; n < text.size(); n += 7) {
    EXPECT_TRUE(
        contains_all(error_of([&] { (void)preset_from_hf_config(write(text.substr(0, n))); }),
                     {"config.json", "not valid JSON"}))
        << n;
  }
}

// ---- Quark quantization_config: dtypes, qschemes, group sizes ----------------------------------

TEST(QuarkValidation, UnknownDtypesAndQschemesNameTheValidOnes) {
  const json good = json::parse(io::fixture_quantization_config("nvfp4"));
  struct Case {
    std::string pointer;
    json value;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"/global_quant_config/weight/0/dtype",
       "fp7",
       {"global_quant_config.weight[0].dtype", "\"fp7\"", "not a known Quark dtype", "fp4",
        "fp8_e4m3", "int4"}},
      {"/global_quant_config/weight/0/dtype", "FP4", {"\"FP4\"", "not a known Quark dtype"}},
      {"/global_quant_config/input_tensors/1/qscheme",
       "per_row",
       {"input_tensors[1].qscheme", "\"per_row\"", "per_tensor, per_channel, per_group"}},
      {"/global_quant_config/weight/0/group_size",
       0,
       {"weight[0].group_size", "0 is out of range", "[1, 1048576]"}},
      {"/global_quant_config/weight/0/group_size", -16, {"group_size", "-16 is out of range"}},
      {"/global_quant_config/weight/0/group_size",
       18446744073709551615ull,
       {"group_size", "18446744073709551615 is out of range"}},
      {"/global_quant_config/weight/0/group_size",
       16.5,
       {"group_size", "expected an integer, got number 16.5"}},
      {"/global_quant_config/weight/0/group_size",
       nullptr,
       {"weight[0]", "per_group", "needs a group_size"}},
      {"/global_quant_config/weight/0/ch_axis", 100, {"ch_axis", "100 is out of range"}},
      {"/global_quant_config/weight/0/block_size", json::array(), {"block_size", "0 block dims"}},
      {"/global_quant_config/weight/0/block_size",
       json::array({128, 0}),
       {"block_size[1]", "0 is out of range"}},
      {"/global_quant_config/weight/0/block_size",
       json::array({1, 1, 1, 1, 1}),
       {"block_size", "5 block dims"}},
      {"/exclude/0", "re:" + std::string(2000, 'a'), {"exclude[0]", "longer than 1024"}},
  };
  for (const Case& c : cases) {
    json j = good;
    j[json::json_pointer(c.pointer)] = c.value;
    // Through the text, as a checkpoint holds it (parsed non-negative integers are unsigned).
    const std::string e = error_of([&] { quark::QuarkConfig::parse(j.dump()); });
    for (const std::string& part : c.expect)
      EXPECT_NE(e.find(part), std::string::npos)
          << c.pointer << " = " << c.value.dump() << ": " << e;
  }
  // An invalid "re:" exclude entry is reported when it is first matched.
  const quark::QuarkConfig bad_re =
      quark::QuarkConfig::parse(R"({"quant_method": "quark", "exclude": ["re:(unclosed"]})");
  EXPECT_TRUE(contains_all(error_of([&] { (void)bad_re.is_excluded("lm_head"); }),
                           {"re:(unclosed", "not a valid regular expression"}));
  // Patterns that make a backtracking matcher take exponential time match in polynomial time
  // (fuzz_quark_config found an exclude entry that hung the loader).
  const quark::QuarkConfig redos = quark::QuarkConfig::parse(
      R"({"quant_method": "quark", "exclude": ["re:(.*)*#", "re:(\\w*\\.?)*#", "re:mo**#"]})");
  EXPECT_FALSE(redos.is_excluded("model.layers.3.mlp.shared_experts.gate_proj"));
  EXPECT_FALSE(redos.is_excluded("model.layers.10.mlp.experts"));
  // Deep nesting where a string belongs is described, not dumped.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string text = good.dump();
  const std::string key = "\"dtype\":\"fp4\"";
  text.replace(text.find(key), key.size(), "\"dtype\":" + deep);
  EXPECT_TRUE(contains_all(error_of([&] { quark::QuarkConfig::parse(text); }),
                           {"dtype", "an array of 1 elements"}));
  EXPECT_TRUE(contains_all(error_of([&] {
                             quark::QuarkConfig::parse(R"({"quant_method": "quark", "exclude": [],
                                                   "exclude": ["x"]})");
                           }),
                           {"repeats the key 'exclude'"}));
  // Every fixture scheme's config passes the stricter checks.
  for (const std::string& scheme : io::fixture_schemes()) {
    if (scheme == "bf16") continue;
    EXPECT_NO_THROW(quark::QuarkConfig::parse(io::fixture_quantization_config(scheme))) << scheme;
  }
}

// ---- fixture writer: shard counts and failed writes ---------------------------------------------

class FixtureWrite : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("moekit_fixture_write_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  // Every entry directly in root_ and in `dir`.
  std::vector<std::string> listing(const fs::path& dir) const {
    std::vector<std::string> out;
    for (const fs::path& d : {root_, dir}) {
      if (!fs::is_directory(d)) continue;
      for (const auto& f : fs::directory_iterator(d))
        out.push_back(f.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path root_;
};

TEST_F(FixtureWrite, ShardCountsBeyondTheTensorsAreRefusedBeforeWriting) {
  io::FixtureOptions o;
  o.num_shards = 100000;
  const fs::path dir = root_ / "fx";
  EXPECT_TRUE(contains_all(error_of([&] { io::write_fixture_checkpoint(dir, o); }),
                           {"num_shards=100000", "must be in [1, ", "tensors"}));
  EXPECT_FALSE(fs::exists(dir));
  o.num_shards = 0;
  EXPECT_TRUE(
      contains_all(error_of([&] { io::write_fixture_checkpoint(dir, o); }), {"num_shards=0"}));
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(FixtureWrite, EveryShardHoldsATensorUpToOneTensorPerShard) {
  io::FixtureOptions o;
  const fs::path one = root_ / "one";
  io::write_fixture_checkpoint(one, o);
  const size_t tensors = io::CheckpointDir::open(one).size();
  for (int shards : {2, 7, static_cast<int>(tensors)}) {
    o.num_shards = shards;
    const fs::path dir = root_ / ("s" + std::to_string(shards));
    io::write_fixture_checkpoint(dir, o);
    const io::CheckpointDir ckpt = io::CheckpointDir::open(dir);
    EXPECT_EQ(ckpt.files().size(), static_cast<size_t>(shards));
    EXPECT_EQ(ckpt.size(), tensors);
    for (const io::SafetensorsFile& f : ckpt.files())
      EXPECT_GE(f.size(), 1u) << f.path();
    EXPECT_NO_THROW(load_moe_layer(dir, 1)) << shards;
  }
  o.num_shards = static_cast<int>(tensors) + 1;
  EXPECT_TRUE(contains_all(error_of([&] { io::write_fixture_checkpoint(root_ / "x", o); }),
                           {"num_shards=" + std::to_string(tensors + 1)}));
}

TEST_F(FixtureWrite, AFailedWriteLeavesNoPartialCheckpoint) {
  io::FixtureOptions o;
  // config.json cannot be replaced (it is a non-empty directory): nothing is written.
  const fs::path dir = root_ / "blocked";
  fs::create_directories(dir / "config.json" / "keep");
  const std::string e = error_of([&] { io::write_fixture_checkpoint(dir, o); });
  EXPECT_TRUE(contains_all(e, {"cannot write fixture checkpoint", "config.json"})) << e;
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"blocked", "config.json"}))
      << "no model.safetensors and no staging directory left behind";

  // An existing checkpoint stays whole when its replacement fails.
  const fs::path ckpt = root_ / "ckpt";
  io::write_fixture_checkpoint(ckpt, o);
  fs::remove_all(dir);
  fs::create_directories(ckpt / "model.safetensors.index.json");  // cannot be replaced
  o.seed = 5;
  EXPECT_THROW(io::write_fixture_checkpoint(ckpt, o), Error);
  EXPECT_TRUE(fs::is_regular_file(ckpt / "model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(ckpt / "config.json"));
  EXPECT_EQ(listing(ckpt), (std::vector<std::string>{"ckpt", "config.json", "model.safetensors",
                                                     "model.safetensors.index.json"}));

  // The output below a regular file: an error, nothing created.
  std::ofstream(root_ / "file") << "x";
  EXPECT_THROW(io::write_fixture_checkpoint(root_ / "file" / "sub", o), Error);
  EXPECT_EQ(listing(root_ / "none"), (std::vector<std::string>{"ckpt", "file"}));
}

// ---- safetensors: a zero dim does not excuse an overflowing shape -------------------------------

TEST(SafetensorsShapes, NonZeroDimsMustMultiplyWithinInt64EvenWithAZeroDim) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THROW(io::tensor_nbytes("U8", std::vector<int64_t>{big, big, 0}), io::SafetensorsError);
  EXPECT_THROW(io::tensor_nbytes("U8", std::vector<int64_t>{0, big, big}), io::SafetensorsError);
  EXPECT_EQ(io::tensor_nbytes("U8", std::vector<int64_t>{big, 0, 1024}), 0u);
}

}  // namespace
}  // namespace moekit
