// Corrupt inputs to the checkpoint loader's JSON parsers: config.json and quantization_config
// truncated at every length, keys of the wrong type, missing keys. Never a crash; always a
// moekit::Error that names the file or the key.
#include <gtest/gtest.h>

#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "moekit/core/error.h"
#include "moekit/io/fixtures.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/quantization/quark/quark_config.h"
#include "testing.h"

namespace moekit {
namespace {

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
    const std::string e = error_of([&] { quark::QuarkConfig::from_json(j); });
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

}  // namespace
}  // namespace moekit
