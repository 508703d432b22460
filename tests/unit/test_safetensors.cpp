// Safetensors reader/writer: round trips, every validation error (with its message), truncation at
// every cut point, deterministic header mutations, and sharded checkpoint directories.
#include "moekit/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace moekit::io {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed (with its contents) on scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("moekit_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<std::byte>((i * 131 + seed * 7 + 1) & 0xff);
  return out;
}

void write_file(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_text(const fs::path& path, const std::string& text) {
  write_file(path, std::as_bytes(std::span(text.data(), text.size())));
}

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

// A raw file: 8-byte little-endian length of `header`, `header`, then `data_size` pattern bytes.
std::vector<std::byte> raw_file(const std::string& header, std::size_t data_size) {
  std::vector<std::byte> out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<std::byte>((n >> (8 * i)) & 0xff));
  for (char c : header)
    out.push_back(static_cast<std::byte>(c));
  const auto data = pattern(data_size, 3);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

bool equal_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Runs `fn`, requires a SafetensorsError, and requires every `parts` substring in its message.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected SafetensorsError containing '" << *parts.begin() << "'";
  } catch (const SafetensorsError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    }
  }
}

// Every tensor's bytes must lie in the data buffer (past the prefix and header), be as long as
// its dtype and shape say, and be readable.
uint64_t touch_all(const SafetensorsFile& f) {
  const std::span<const std::byte> file = f.file_bytes();
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(std::to_integer<uint8_t>(file[i])) << (8 * i);
  const std::byte* data_begin = file.data() + 8 + n;
  const std::byte* data_end = file.data() + file.size();
  uint64_t sum = 0;
  for (const std::string& name : f.names()) {
    const TensorInfo& t = f.info(name);
    EXPECT_EQ(t.bytes.size(), tensor_nbytes(t.dtype, t.shape)) << name;
    if (!t.bytes.empty()) {
      EXPECT_GE(t.bytes.data(), data_begin) << name;
      EXPECT_LE(t.bytes.data() + t.bytes.size(), data_end) << name;
    }
    for (std::byte b : t.bytes)
      sum += std::to_integer<uint8_t>(b);
  }
  return sum;
}

// ---- dtypes ------------------------------------------------------------------------------------

TEST(SafetensorsDtype, ItemsizeOfEveryDtype) {
  const std::vector<std::pair<std::string, std::size_t>> expected = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},     {"C64", 8}};
  for (const auto& [dtype, size] : expected)
    EXPECT_EQ(itemsize(dtype), size) << dtype;
  EXPECT_EQ(dtype_bits("F4"), 4u);
  EXPECT_EQ(dtype_bits("F6_E2M3"), 6u);
  EXPECT_EQ(dtype_bits("F6_E3M2"), 6u);
  EXPECT_EQ(dtype_bits("bf16"), std::nullopt);  // case matters
  expect_error([] { itemsize("Q4_K"); }, {"unknown", "\"Q4_K\"", "BF16"});
  expect_error([] { itemsize("F4"); }, {"F4", "4 bits"});
}

TEST(SafetensorsDtype, TensorNbytes) {
  EXPECT_EQ(tensor_nbytes("BF16", std::vector<int64_t>{3, 5}), 30u);
  EXPECT_EQ(tensor_nbytes("F32", std::vector<int64_t>{}), 4u);  // 0-dim: one element
  EXPECT_EQ(tensor_nbytes("F32", std::vector<int64_t>{7, 0, 9}), 0u);
  EXPECT_EQ(tensor_nbytes("F4", std::vector<int64_t>{6}), 3u);
  EXPECT_EQ(tensor_nbytes("F6_E2M3", std::vector<int64_t>{4}), 3u);
  // A zero dim makes the tensor empty, but the other dims must still multiply within int64 (a
  // running product over the shape, e.g. TensorInfo::numel, would overflow before reaching the 0).
  EXPECT_EQ(tensor_nbytes("F32", std::vector<int64_t>{int64_t{1} << 40, 0, int64_t{1} << 20}), 0u);
  expect_error(
      [] {
        tensor_nbytes("F32", std::vector<int64_t>{int64_t{1} << 62, int64_t{1} << 62, 0});
      },
      {"[4611686018427387904, 4611686018427387904, 0]", "2^63-1"});
  expect_error([] { tensor_nbytes("F4", std::vector<int64_t>{3}); }, {"[3]", "whole bytes"});
  expect_error([] { tensor_nbytes("F32", std::vector<int64_t>{2, -1}); }, {"[2, -1]", "negative"});
  expect_error(
      [] {
        tensor_nbytes("U8", std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 32});
      },
      {"[4294967296, 4294967296]", "2^63-1"});
  expect_error([] { tensor_nbytes("F64", std::vector<int64_t>{int64_t{1} << 62}); },
               {"[4611686018427387904]", "F64", "overflows"});
  expect_error([] { tensor_nbytes("X", std::vector<int64_t>{1}); }, {"unknown", "\"X\""});
}

// ---- non-finite values --------------------------------------------------------------------------

TEST(SafetensorsValues, FirstNonFiniteDecodesEveryFloatDtype) {
  struct Case {
    std::string dtype;
    std::vector<uint8_t> finite;  // one finite element (the largest finite value where it matters)
    std::vector<std::vector<uint8_t>> bad;  // NaN / Inf encodings
  };
  const std::vector<Case> cases = {
      {"F64",
       {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xef, 0x7f},
       {{0, 0, 0, 0, 0, 0, 0xf0, 0x7f}, {1, 0, 0, 0, 0, 0, 0xf8, 0xff}}},
      {"F32", {0xff, 0xff, 0x7f, 0x7f}, {{0, 0, 0x80, 0x7f}, {0, 0, 0xc0, 0xff}}},
      {"C64", {0, 0, 0x80, 0x3f, 0, 0, 0, 0}, {{0, 0, 0, 0, 0, 0, 0x80, 0xff}}},
      {"F16", {0xff, 0x7b}, {{0x00, 0x7c}, {0x01, 0xfe}}},
      {"BF16", {0x7f, 0x7f}, {{0x80, 0x7f}, {0xc1, 0xff}}},
      {"F8_E4M3", {0x7e}, {{0x7f}, {0xff}}},
      {"F8_E5M2", {0x7b}, {{0x7c}, {0xfe}}},
      {"F8_E8M0", {0xfe}, {{0xff}}},
  };
  for (const Case& c : cases) {
    for (const auto& bad : c.bad) {
      std::vector<std::byte> bytes;
      for (int i = 0; i < 4; ++i) {
        for (uint8_t b : i == 2 ? bad : c.finite)
          bytes.push_back(static_cast<std::byte>(b));
      }
      TensorInfo t{c.dtype, {4}, bytes};
      EXPECT_EQ(first_non_finite(t), std::optional<int64_t>(2)) << c.dtype;
      t.bytes = std::span<const std::byte>(bytes).first(2 * c.finite.size());
      t.shape = {2};
      EXPECT_EQ(first_non_finite(t), std::nullopt) << c.dtype;
    }
  }
  // Integer and packed types have no non-finite codes.
  const std::vector<std::byte> ones(8, std::byte{0xff});
  for (const char* dtype : {"U8", "I8", "I32", "I64", "BOOL", "F4", "F6_E3M2"})
    EXPECT_EQ(first_non_finite(TensorInfo{dtype, {}, ones}), std::nullopt) << dtype;
}

// ---- round trip --------------------------------------------------------------------------------

struct Spec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

const std::vector<Spec>& round_trip_specs() {
  static const std::vector<Spec> specs = {
      {"model.layers.0.mlp.experts.w13", "BF16", {4, 6, 3}},
      {"model.layers.0.mlp.experts.w2", "F16", {4, 3, 3}},
      {"model.layers.0.mlp.gate.weight", "F32", {4, 6}},
      {"e_score_correction_bias", "F64", {4}},
      {"w13_weight_scale_inv", "F8_E8M0", {4, 2, 1}},
      {"w13_fp8", "F8_E4M3", {33}},
      {"w2_fp8", "F8_E5M2", {1, 1}},
      {"packed_fp4", "F4", {2, 6}},
      {"expert_map", "I32", {4}},
      {"positions", "I64", {2, 2}},
      {"mask", "BOOL", {5}},
      {"u16", "U16", {3}},
      {"i8", "I8", {7}},
      {"scalar_scale", "F32", {}},     // 0-dim: one element
      {"no_tokens", "BF16", {0, 16}},  // zero-size
      {"empty_last", "I32", {3, 0}},   // zero-size
  };
  return specs;
}

SafetensorsWriter make_writer() {
  SafetensorsWriter w;
  unsigned seed = 0;
  for (const Spec& s : round_trip_specs()) {
    w.add(s.name, s.dtype, s.shape, pattern(tensor_nbytes(s.dtype, s.shape), ++seed));
  }
  w.set_metadata("format", "pt");
  w.set_metadata("model", "deepseek-v3 (toy)");
  w.set_metadata("note", "unicode ✓");
  return w;
}

TEST(SafetensorsRoundTrip, BytesShapesDtypesAndMetadataSurvive) {
  TempDir dir;
  const fs::path path = dir / "model.safetensors";
  const SafetensorsWriter w = make_writer();
  w.write(path);
  EXPECT_FALSE(fs::exists(dir / ("model.safetensors.tmp." + std::to_string(::getpid()))));

  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.size(), round_trip_specs().size());
  std::vector<std::string> expected_names;
  unsigned seed = 0;
  for (const Spec& s : round_trip_specs()) {
    expected_names.push_back(s.name);
    ASSERT_TRUE(f.contains(s.name)) << s.name;
    const TensorInfo& t = f.info(s.name);
    EXPECT_EQ(t.dtype, s.dtype) << s.name;
    EXPECT_EQ(t.shape, s.shape) << s.name;
    EXPECT_TRUE(equal_bytes(t.bytes, pattern(tensor_nbytes(s.dtype, s.shape), ++seed))) << s.name;
  }
  std::sort(expected_names.begin(), expected_names.end());
  EXPECT_EQ(f.names(), expected_names);  // documented: sorted
  EXPECT_EQ(f.info("scalar_scale").numel(), 1);
  EXPECT_EQ(f.info("no_tokens").numel(), 0);
  EXPECT_TRUE(f.info("no_tokens").bytes.empty());
  EXPECT_FALSE(f.contains("missing"));
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"model", "deepseek-v3 (toy)"}, {"note", "unicode ✓"}};
  EXPECT_EQ(f.metadata(), meta);
  touch_all(f);
}

TEST(SafetensorsRoundTrip, LayoutIsPaddedContiguousAndInInsertionOrder) {
  TempDir dir;
  const fs::path path = dir / "m.safetensors";
  const SafetensorsWriter w = make_writer();
  w.write(path);
  const std::vector<std::byte> bytes = read_file(path);
  EXPECT_TRUE(equal_bytes(bytes, w.serialize()));

  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(std::to_integer<uint8_t>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  uint64_t total = 0;
  for (const Spec& s : round_trip_specs())
    total += tensor_nbytes(s.dtype, s.shape);
  EXPECT_EQ(bytes.size(), 8 + n + total);

  // Data follows insertion order, not name order.
  const SafetensorsFile f = SafetensorsFile::open(path);
  const std::byte* data_start = f.info(round_trip_specs()[0].name).bytes.data();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data_start) % 8,
            0u);  // mapping is page-aligned, N % 8 == 0
  uint64_t offset = 0;
  for (const Spec& s : round_trip_specs()) {
    const TensorInfo& t = f.info(s.name);
    if (!t.bytes.empty()) {
      EXPECT_EQ(t.bytes.data() - data_start, static_cast<std::ptrdiff_t>(offset)) << s.name;
    }
    offset += t.bytes.size();
  }
}

TEST(SafetensorsRoundTrip, EmptyWriterAndMovedFile) {
  TempDir dir;
  SafetensorsWriter().write(dir / "empty.safetensors");
  const SafetensorsFile empty = SafetensorsFile::open(dir / "empty.safetensors");
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_TRUE(empty.metadata().empty());

  make_writer().write(dir / "m.safetensors");
  SafetensorsFile a = SafetensorsFile::open(dir / "m.safetensors");
  const std::span<const std::byte> before = a.info("w13_fp8").bytes;
  SafetensorsFile b = std::move(a);  // spans stay valid across moves
  EXPECT_EQ(b.info("w13_fp8").bytes.data(), before.data());
  EXPECT_TRUE(equal_bytes(before, pattern(33, 6)));
}

TEST(SafetensorsWriter, RejectsBadArguments) {
  SafetensorsWriter w;
  w.add("a", "F32", {2}, pattern(8, 0));
  expect_error([&] { w.add("a", "F32", {2}, pattern(8, 0)); }, {"'a'", "already added"});
  expect_error([&] { w.add("", "F32", {2}, pattern(8, 0)); }, {"empty"});
  expect_error([&] { w.add("__metadata__", "F32", {2}, pattern(8, 0)); }, {"reserved"});
  expect_error([&] { w.add("b", "F31", {2}, pattern(8, 0)); }, {"'b'", "\"F31\"", "unknown"});
  expect_error([&] { w.add("c", "F32", {2, -1}, {}); }, {"'c'", "[2, -1]", "negative"});
  expect_error(
      [&] {
        w.add("d", "F32", {2, 3}, pattern(20, 0));
      },
      {"'d'", "20 bytes", "[2, 3]", "needs 24"});
  expect_error([&] { w.add("e", "F4", {3}, pattern(2, 0)); }, {"'e'", "whole bytes"});
  expect_error([&] { w.add(std::string("bad\xff", 4), "U8", {1}, pattern(1, 0)); }, {"UTF-8"});
  expect_error([&] { w.set_metadata("k", std::string("\xc3", 1)); }, {"'k'", "UTF-8"});
  EXPECT_EQ(w.size(), 1u);  // failed adds leave nothing behind

  TempDir dir;
  expect_error([&] { w.write(dir / "no_such_dir" / "x.safetensors"); },
               {"x.safetensors", "cannot create"});
}

// ---- corrupt input -----------------------------------------------------------------------------

TEST(SafetensorsCorrupt, EveryTruncationThrowsNeverCrashes) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("w13", "BF16", {2, 3}, pattern(12, 1));
  w.add("s", "F32", {}, pattern(4, 2));
  w.add("z", "I8", {0}, {});
  w.set_metadata("format", "pt");
  const std::vector<std::byte> full = w.serialize();
  const fs::path path = dir / "cut.safetensors";
  for (std::size_t len = 0; len <= full.size(); ++len) {
    write_file(path, std::span(full).first(len));
    for (bool holes : {false, true}) {
      try {
        const SafetensorsFile f = SafetensorsFile::open(path, {.allow_holes = holes});
        EXPECT_EQ(len, full.size()) << "a truncated file loaded";
        touch_all(f);
      } catch (const SafetensorsError& e) {
        EXPECT_LT(len, full.size()) << e.what();
        EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
      }
    }
  }
  // Appending bytes is caught too, unless holes are allowed.
  std::vector<std::byte> longer = full;
  longer.push_back(std::byte{0});
  write_file(path, longer);
  expect_error([&] { SafetensorsFile::open(path); }, {"1 bytes after the last tensor"});
  EXPECT_EQ(SafetensorsFile::open(path, {.allow_holes = true}).size(), 3u);
}

TEST(SafetensorsCorrupt, RandomHeaderMutationsLoadOrThrow) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("model.layers.3.mlp.experts.w13_weight", "BF16", {2, 4, 3}, pattern(48, 1));
  w.add("model.layers.3.mlp.experts.w2_weight", "F8_E4M3", {2, 3, 2}, pattern(12, 2));
  w.add("scale", "F32", {}, pattern(4, 3));
  w.add("empty", "F16", {0, 2}, {});
  w.set_metadata("format", "pt");
  const std::vector<std::byte> good = w.serialize();
  const std::size_t header_end =
      8 + (std::to_integer<std::size_t>(good[0]) | (std::to_integer<std::size_t>(good[1]) << 8));
  const std::string_view interesting = "0123456789-[]{},:\"e.E+ \\u";
  std::vector<std::size_t> digits;  // positions of digits in the header: shapes and offsets
  for (std::size_t i = 8; i < header_end; ++i) {
    if (std::isdigit(std::to_integer<unsigned char>(good[i]))) digits.push_back(i);
  }
  const fs::path path = dir / "mut.safetensors";
  int loaded = 0, rejected = 0;
  for (unsigned seed = 0; seed < 400; ++seed) {
    std::mt19937 rng(seed);
    std::vector<std::byte> bytes = good;
    const unsigned flips = 1 + rng() % 4;
    for (unsigned k = 0; k < flips; ++k) {
      if (seed % 3 == 0) {  // numeric mutations reach the shape/offset/size checks
        bytes[digits[rng() % digits.size()]] = static_cast<std::byte>("0123456789-.e"[rng() % 13]);
        continue;
      }
      // Mostly inside the JSON; one draw in 32 hits the length prefix.
      const std::size_t pos = rng() % 32 == 0 ? rng() % 8 : 8 + rng() % (header_end - 8);
      if (rng() % 2 == 0) {
        bytes[pos] ^= static_cast<std::byte>(1 + rng() % 255);
      } else {
        bytes[pos] = static_cast<std::byte>(interesting[rng() % interesting.size()]);
      }
    }
    write_file(path, bytes);
    try {
      const SafetensorsFile f = SafetensorsFile::open(path);
      touch_all(f);
      ++loaded;
    } catch (const SafetensorsError&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": wrong exception type: " << e.what();
    }
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(rejected, 0);
  std::printf("header mutations: %d loaded, %d rejected\n", loaded, rejected);
}

class SafetensorsValidation : public ::testing::Test {
 protected:
  // Writes a file with this header and data size, opens it, and requires an error naming the file
  // and every `parts` substring.
  void expect_rejected(const std::string& header, std::size_t data_size,
                       std::initializer_list<std::string> parts) {
    write_file(path_, raw_file(header, data_size));
    expect_error([&] { SafetensorsFile::open(path_); }, parts);
    expect_error([&] { SafetensorsFile::open(path_); }, {path_.string() + ": "});
  }
  SafetensorsFile open_ok(const std::string& header, std::size_t data_size, bool holes = false) {
    write_file(path_, raw_file(header, data_size));
    return SafetensorsFile::open(path_, {.allow_holes = holes});
  }

  TempDir dir_;
  fs::path path_ = dir_ / "model.safetensors";
};

TEST_F(SafetensorsValidation, LengthPrefix) {
  for (std::size_t len : {0, 1, 7}) {
    write_file(path_, pattern(len, 0));
    expect_error([&] { SafetensorsFile::open(path_); },
                 {path_.string(), std::to_string(len) + " bytes", "shorter than the 8-byte"});
  }
  std::vector<std::byte> bytes = raw_file("{}", 0);
  bytes[0] = std::byte{100};  // N = 100 > 2 bytes present
  write_file(path_, bytes);
  expect_error([&] { SafetensorsFile::open(path_); }, {"header length 100", "exceeds the 2 bytes"});
  bytes[0] = std::byte{0};
  bytes[7] = std::byte{0x80};  // N = 2^63
  write_file(path_, bytes);
  expect_error([&] { SafetensorsFile::open(path_); },
               {"header length 9223372036854775808", "limit of 100000000"});
  bytes = raw_file("{}", 0);
  bytes[0] = std::byte{0x01};  // N = 100000001 (0x05F5E101): over the cap, checked before the size
  bytes[1] = std::byte{0xE1};
  bytes[2] = std::byte{0xF5};
  bytes[3] = std::byte{0x05};
  write_file(path_, bytes);
  expect_error([&] { SafetensorsFile::open(path_); }, {"header length 100000001", "limit"});
}

TEST_F(SafetensorsValidation, HeaderJson) {
  expect_rejected("", 0, {"not valid JSON"});
  expect_rejected("{\"a\": ", 0, {"not valid JSON"});
  expect_rejected("{} trailing", 0, {"not valid JSON"});
  expect_rejected("{\"a\xff\": 1}", 0, {"not valid JSON"});  // invalid UTF-8
  expect_rejected(std::string("{\0}", 3), 0, {"not valid JSON"});
  expect_rejected("[1, 2]", 0, {"must be a JSON object", "an array of 2 elements"});
  expect_rejected("\"str\"", 0, {"must be a JSON object", "\"str\""});
  expect_rejected(
      "{\"w\": {\"dtype\": \"U8\", \"shape\": [], \"data_offsets\": [0, 1]},"
      " \"w\": {\"dtype\": \"U8\", \"shape\": [], \"data_offsets\": [1, 2]}}",
      2, {"repeats the key 'w'"});
  expect_rejected(
      "{\"w\": {\"dtype\": \"U8\", \"dtype\": \"I8\", \"shape\": [],"
      " \"data_offsets\": [0, 1]}}",
      1, {"repeats the key 'dtype'"});
  // Deep nesting must neither overflow the stack nor be accepted.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_rejected("{\"w\": {\"dtype\": \"U8\", \"shape\": " + deep + ", \"data_offsets\": [0, 1]}}",
                  1, {"'w'", "shape[0]", "an array of 1 elements"});
  expect_rejected(deep, 0, {"must be a JSON object"});
  // Whitespace padding (as the writer produces) is fine.
  EXPECT_EQ(open_ok("{}      ", 0).size(), 0u);
}

TEST_F(SafetensorsValidation, Metadata) {
  expect_rejected("{\"__metadata__\": [1]}", 0, {"'__metadata__'", "an array of 1 elements"});
  expect_rejected("{\"__metadata__\": {\"format\": 5}}", 0, {"'format'", "must be a string", "5"});
  EXPECT_TRUE(open_ok("{\"__metadata__\": null}", 0).metadata().empty());
}

TEST_F(SafetensorsValidation, EntryFields) {
  expect_rejected("{\"w13\": 7}", 0, {"tensor 'w13'", "must be an object", "7"});
  expect_rejected("{\"w13\": {\"shape\": [], \"data_offsets\": [0, 1]}}", 1,
                  {"tensor 'w13'", "missing 'dtype'"});
  expect_rejected("{\"w13\": {\"dtype\": \"U8\", \"data_offsets\": [0, 1]}}", 1,
                  {"tensor 'w13'", "missing 'shape'"});
  expect_rejected("{\"w13\": {\"dtype\": \"U8\", \"shape\": []}}", 1,
                  {"tensor 'w13'", "missing 'data_offsets'"});
  expect_rejected("{\"w13\": {\"dtype\": 16, \"shape\": [], \"data_offsets\": [0, 1]}}", 1,
                  {"tensor 'w13'", "dtype must be a string", "16"});
  expect_rejected("{\"w13\": {\"dtype\": \"Q4_K\", \"shape\": [], \"data_offsets\": [0, 1]}}", 1,
                  {"tensor 'w13'", "unknown dtype", "\"Q4_K\""});
  // The writer refuses an empty name, so the reader does too (fuzz_safetensors checks that every
  // accepted file survives a write / re-open round trip).
  expect_rejected("{\"\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1,
                  {"empty name"});
  // Extra fields are ignored, as in the reference reader.
  EXPECT_EQ(open_ok("{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1],"
                    " \"extra\": 1}}",
                    1)
                .size(),
            1u);
}

TEST_F(SafetensorsValidation, Shape) {
  const auto entry = [](const std::string& shape) {
    return "{\"w2\": {\"dtype\": \"F32\", \"shape\": " + shape + ", \"data_offsets\": [0, 4]}}";
  };
  expect_rejected(entry("4"), 4, {"tensor 'w2'", "shape must be an array", "4"});
  expect_rejected(entry("[2, -3]"), 4, {"tensor 'w2'", "shape[1] = -3", "non-negative integer"});
  expect_rejected(entry("[2.5]"), 4, {"tensor 'w2'", "shape[0] = 2.5"});
  expect_rejected(entry("[1e3]"), 4, {"tensor 'w2'", "shape[0] = 1000.0"});
  expect_rejected(entry("[\"4\"]"), 4, {"tensor 'w2'", "shape[0] = \"4\""});
  expect_rejected(entry("[null]"), 4, {"tensor 'w2'", "shape[0] = null"});
  expect_rejected(entry("[9223372036854775808]"), 4,
                  {"tensor 'w2'", "shape[0] = 9223372036854775808", "below 2^63"});
  expect_rejected(entry("[99999999999999999999999]"), 4, {"tensor 'w2'", "shape[0]"});
  expect_rejected(entry("[4294967296, 4294967296]"), 4,
                  {"tensor 'w2'", "[4294967296, 4294967296]", "2^63-1"});
  expect_rejected(entry("[2305843009213693952]"), 4,
                  {"tensor 'w2'", "[2305843009213693952]", "F32", "overflows"});
  expect_rejected("{\"p\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 2]}}", 2,
                  {"tensor 'p'", "[3]", "whole bytes"});
  expect_rejected(entry("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"), 4,
                  {"tensor 'w2'", "[1, 2, 3, 4, 5, 6, 7, 8, ... (10 dims)]", "needs 14515200"});
}

TEST_F(SafetensorsValidation, DataOffsets) {
  const auto entry = [](const std::string& offsets) {
    return "{\"w13\": {\"dtype\": \"F32\", \"shape\": [4, 4], \"data_offsets\": " + offsets + "}}";
  };
  expect_rejected(entry("{}"), 64, {"tensor 'w13'", "data_offsets must be [begin, end]"});
  expect_rejected(entry("[0]"), 64, {"tensor 'w13'", "an array of 1 elements"});
  expect_rejected(entry("[0, 32, 64]"), 64, {"tensor 'w13'", "an array of 3 elements"});
  expect_rejected(entry("[-1, 63]"), 64, {"tensor 'w13'", "[-1, 63]"});
  expect_rejected(entry("[0.0, 64]"), 64, {"tensor 'w13'", "[0.0, 64]"});
  expect_rejected(entry("[64, 0]"), 64, {"tensor 'w13'", "[64, 0]", "begin <= end"});
  expect_rejected(entry("[0, 100]"), 64,
                  {"model.safetensors: tensor 'w13' data_offsets [0, 100] exceed the data buffer "
                   "of 64 bytes"});
  expect_rejected(entry("[18446744073709551615, 18446744073709551615]"), 64,
                  {"tensor 'w13'", "exceed the data buffer"});
  expect_rejected(entry("[0, 60]"), 64,
                  {"tensor 'w13'", "[0, 60] span 60 bytes", "F32 shape [4, 4] needs 64"});
}

TEST_F(SafetensorsValidation, OverlapsHolesAndTrailingBytes) {
  const std::string overlap =
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]},"
      " \"b\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [8, 24]}}";
  expect_rejected(overlap, 24, {"'a'", "[0, 16]", "'b'", "[8, 24]", "overlap"});
  write_file(path_, raw_file(overlap, 24));
  expect_error([&] { SafetensorsFile::open(path_, {.allow_holes = true}); }, {"overlap"});
  // Identical ranges overlap as well.
  expect_rejected(
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
      " \"b\": {\"dtype\": \"I8\", \"shape\": [4], \"data_offsets\": [0, 4]}}",
      4, {"'a'", "'b'", "overlap"});

  const std::string hole =
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]},"
      " \"b\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [24, 40]}}";
  expect_rejected(hole, 40, {"'b'", "[24, 40]", "hole of 8 bytes at offset 16"});
  EXPECT_EQ(open_ok(hole, 40, /*holes=*/true).info("b").bytes.size(), 16u);
  expect_rejected("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]}}", 8,
                  {"'a'", "hole of 4 bytes at offset 0"});
  expect_rejected("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 9,
                  {"data buffer of 9 bytes", "5 bytes after the last tensor"});
  expect_rejected("{}", 3, {"data buffer of 3 bytes", "3 bytes after"});

  // Zero-size tensors cover no bytes: anywhere inside the buffer is fine, beyond it is not.
  const SafetensorsFile f = open_ok(
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
      " \"z\": {\"dtype\": \"BF16\", \"shape\": [0, 5], \"data_offsets\": [4, 4]}}",
      8);
  EXPECT_TRUE(f.info("z").bytes.empty());
  expect_rejected("{\"z\": {\"dtype\": \"BF16\", \"shape\": [0], \"data_offsets\": [9, 9]}}", 8,
                  {"'z'", "[9, 9]", "exceed the data buffer of 8 bytes"});
}

TEST_F(SafetensorsValidation, FileSystemErrors) {
  expect_error([&] { SafetensorsFile::open(dir_ / "absent.safetensors"); },
               {"absent.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile::open(dir_.path()); }, {"not a regular file"});
  const SafetensorsFile f = open_ok("{}", 0);
  expect_error([&] { f.info("w13"); }, {"model.safetensors", "'w13'", "not found"});
}

// ---- checkpoint directories --------------------------------------------------------------------

void write_shard(const fs::path& path, std::initializer_list<std::string> names, unsigned seed) {
  SafetensorsWriter w;
  for (const std::string& name : names)
    w.add(name, "BF16", {2, 2}, pattern(8, seed++));
  w.write(path);
}

TEST(CheckpointDir, ShardsWithIndex) {
  TempDir dir;
  write_shard(dir / "model-00001-of-00002.safetensors", {"a", "b"}, 10);
  write_shard(dir / "model-00002-of-00002.safetensors", {"c", "shared"}, 20);
  write_shard(dir / "stale-copy.safetensors", {"shared"}, 30);  // duplicate, resolved by the index
  write_text(dir / "model.safetensors.index.json",
             R"({"metadata": {"total_size": 32}, "weight_map": {
                  "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                  "c": "model-00002-of-00002.safetensors",
                  "shared": "model-00002-of-00002.safetensors"}})");
  write_text(dir / "README.md", "not a shard");

  const CheckpointDir ckpt = CheckpointDir::open(dir.path());
  EXPECT_TRUE(ckpt.has_index());
  EXPECT_EQ(ckpt.files().size(), 3u);
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a", "b", "c", "shared"}));
  EXPECT_TRUE(equal_bytes(ckpt.find("b").bytes, pattern(8, 11)));
  EXPECT_TRUE(equal_bytes(ckpt.find("shared").bytes, pattern(8, 21)));  // not the stale copy
  EXPECT_EQ(ckpt.file_of("c").path().filename(), "model-00002-of-00002.safetensors");
  expect_error([&] { ckpt.find("x"); }, {"tensor 'x' not found in checkpoint " +
                                         dir.path().string() + " (4 tensors in 3 files)"});
}

TEST(CheckpointDir, WithoutIndex) {
  TempDir dir;
  write_shard(dir / "a.safetensors", {"x"}, 1);
  write_shard(dir / "b.safetensors", {"y", "z"}, 2);
  const CheckpointDir ckpt = CheckpointDir::open(dir.path());
  EXPECT_FALSE(ckpt.has_index());
  EXPECT_EQ(ckpt.size(), 3u);
  EXPECT_TRUE(equal_bytes(ckpt.find("z").bytes, pattern(8, 3)));

  write_shard(dir / "c.safetensors", {"y"}, 9);
  expect_error([&] { CheckpointDir::open(dir.path()); },
               {"'y'", "b.safetensors, c.safetensors", "no model.safetensors.index.json"});
}

TEST(CheckpointDir, BadDirectoriesAndIndexes) {
  TempDir dir;
  expect_error([&] { CheckpointDir::open(dir.path()); }, {"no *.safetensors files"});
  expect_error([&] { CheckpointDir::open(dir / "absent"); }, {"absent", "not a directory"});

  write_shard(dir / "s1.safetensors", {"a"}, 1);
  write_shard(dir / "s2.safetensors", {"b"}, 2);
  const fs::path index = dir / "model.safetensors.index.json";
  const auto expect_index_error = [&](const std::string& text,
                                      std::initializer_list<std::string> parts) {
    write_text(index, text);
    expect_error([&] { CheckpointDir::open(dir.path()); }, parts);
    expect_error([&] { CheckpointDir::open(dir.path()); }, {index.string()});
  };
  expect_index_error("{", {"not valid JSON"});
  expect_index_error("[]", {"must be a JSON object"});
  expect_index_error("{}", {"'weight_map'", "none"});
  expect_index_error(R"({"weight_map": []})", {"'weight_map'", "an array"});
  expect_index_error(R"({"weight_map": {"a": 1}})", {"'a'", "file name", "1"});
  expect_index_error(R"({"weight_map": {"a": "s3.safetensors"}})",
                     {"'a'", "\"s3.safetensors\"", "not a *.safetensors file"});
  expect_index_error(R"({"weight_map": {"a": "../s1.safetensors"}})",
                     {"'a'", "not a *.safetensors file"});
  expect_index_error(R"({"weight_map": {"a": "s2.safetensors"}})",
                     {"'a'", "\"s2.safetensors\"", "has no such tensor"});

  // A corrupt shard is reported with its own path.
  write_text(index, R"({"weight_map": {"a": "s1.safetensors"}})");
  write_file(dir / "s3.safetensors", pattern(5, 0));
  expect_error([&] { CheckpointDir::open(dir.path()); }, {"s3.safetensors", "shorter"});
}

}  // namespace
}  // namespace moekit::io
