// The foundation: Tensor, DLPack interop, WorkspaceManager, logging, environment helpers, argument
// checks and their messages, the 16-bit float conversions (exhaustive over every code), the
// configs (parallel, MoE, quant keys, activations, routing methods) and the tolerance table.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/config/activation.h"
#include "moekit/config/moe_config.h"
#include "moekit/config/parallel_config.h"
#include "moekit/config/quant_key.h"
#include "moekit/config/routing.h"
#include "moekit/core/checks.h"
#include "moekit/core/device.h"
#include "moekit/core/dlpack.h"
#include "moekit/core/dtype.h"
#include "moekit/core/env.h"
#include "moekit/core/error.h"
#include "moekit/core/half.h"
#include "moekit/core/logging.h"
#include "moekit/core/tensor.h"
#include "moekit/core/tolerance.h"
#include "moekit/core/workspace.h"
#include "moekit/modular/types.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::contains_all;
using testing::error_of;

using testing::random_tensor;

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::vector<float> iota_floats(size_t n, float start = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = start + static_cast<float>(i);
  return v;
}

// ---- Tensor -----------------------------------------------------------------------------------

TEST(Tensor, EmptyHasContiguousStridesAndTheRequestedDtype) {
  const Tensor t = Tensor::empty({2, 3, 4}, DType::kBF16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_NE(t.data(), nullptr);
  EXPECT_TRUE(contains_all(error_of([&] { (void)t.size(3); }), {"dimension 3", "[2, 3, 4]"}));
  EXPECT_TRUE(contains_all(error_of([] {
                             (void)Tensor::empty({2, -1}, DType::kF32);
                           }),
                           {"negative", "[2, -1]"}));
}

TEST(Tensor, ZeroSizedTensorsAreDefined) {
  const Tensor t = Tensor::empty({0, 16}, DType::kF32);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_TRUE(t.to_float_vector().empty());
}

TEST(Tensor, ZerosAreZeroBytes) {
  Tensor t = Tensor::empty({5, 7}, DType::kF16);
  t.fill_bytes(0xAB);
  t = Tensor::zeros({5, 7}, DType::kF16);
  const auto* b = static_cast<const uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i)
    ASSERT_EQ(b[i], 0) << "byte " << i;
}

TEST(Tensor, FromFloatsRoundsToTheDtype) {
  const std::vector<float> v = {1.0f / 3.0f, -2.5f, 1e-3f, 70000.0f};
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    const Tensor t = Tensor::from_floats(v, {2, 2}, dt);
    const std::vector<float> back = t.to_float_vector();
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(back[i], round_to_dtype(v[i], dt)) << dtype_name(dt) << " element " << i;
  }
  EXPECT_EQ(Tensor::from_floats(v, {4}, DType::kF16).to_float_vector()[3],
            std::numeric_limits<float>::infinity())
      << "70000 overflows fp16";
  EXPECT_TRUE(contains_all(error_of([&] { (void)Tensor::from_floats(v, {3}, DType::kF32); }),
                           {"4 values", "[3]"}));
}

TEST(Tensor, FromIntsForEveryIntegerDtype) {
  const std::vector<int64_t> v = {-3, 0, 7, 100};
  for (DType dt : {DType::kInt32, DType::kInt64, DType::kInt8}) {
    EXPECT_EQ(Tensor::from_ints(v, {4}, dt).to_int_vector(), v) << dtype_name(dt);
  }
  EXPECT_EQ(
      Tensor::from_ints({std::vector<int64_t>{0, 200, 255}}, {3}, DType::kUInt8).to_int_vector(),
      (std::vector<int64_t>{0, 200, 255}));
  EXPECT_EQ(Tensor::from_ints(v, {2, 2}, DType::kF32).to_float_vector(),
            (std::vector<float>{-3, 0, 7, 100}));
}

TEST(Tensor, ViewSliceSelect) {
  const std::vector<float> v = iota_floats(24);
  const Tensor t = Tensor::from_floats(v, {2, 3, 4}, DType::kF32);
  const Tensor flat = t.view({6, 4});
  EXPECT_EQ(flat.data(), t.data());
  EXPECT_EQ(flat.to_float_vector(), v);
  EXPECT_TRUE(contains_all(error_of([&] { (void)t.view({5, 5}); }), {"view", "[5, 5]"}));

  // Slice along the last dimension: a strided view sharing memory.
  const Tensor cols = t.slice(2, 1, 3);
  EXPECT_EQ(cols.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(cols.strides(), (Shape{12, 4, 1}));
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.data(), static_cast<const char*>(t.data()) + sizeof(float));
  const std::vector<float> c = cols.to_float_vector();
  ASSERT_EQ(c.size(), 12u);
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t k = 0; k < 2; ++k)
        EXPECT_EQ(c[static_cast<size_t>((a * 3 + b) * 2 + k)],
                  v[static_cast<size_t>(a * 12 + b * 4 + k + 1)]);
  EXPECT_TRUE(contains_all(error_of([&] { (void)cols.view({12}); }), {"not contiguous"}));
  EXPECT_TRUE(contains_all(error_of([&] { (void)t.slice(1, 2, 4); }), {"[2, 4)", "out of bounds"}));
  EXPECT_TRUE(contains_all(error_of([&] { (void)t.slice(3, 0, 1); }), {"slice", "dimension 3"}));

  // Select along dim 0.
  const Tensor second = t.select(1);
  EXPECT_EQ(second.shape(), (Shape{3, 4}));
  EXPECT_TRUE(second.is_contiguous());
  EXPECT_EQ(second.to_float_vector(), std::vector<float>(v.begin() + 12, v.end()));
  EXPECT_TRUE(contains_all(error_of([&] { (void)t.select(2); }), {"out of bounds"}));
  // Views keep the storage alive.
  Tensor view;
  {
    const Tensor owner = Tensor::from_floats(v, {24}, DType::kF32);
    view = owner.slice(0, 20, 24);
  }
  EXPECT_EQ(view.to_float_vector(), (std::vector<float>{21, 22, 23, 24}));
}

TEST(Tensor, Reinterpret) {
  const Tensor t = Tensor::from_floats(std::vector<float>{1.0f, -2.0f}, {2}, DType::kF32);
  const Tensor bytes = t.reinterpret({8}, DType::kUInt8);
  EXPECT_EQ(bytes.data(), t.data());
  const std::vector<int64_t> b = bytes.to_int_vector();
  // 1.0f = 0x3F800000 little endian.
  EXPECT_EQ(b[3], 0x3F);
  EXPECT_EQ(b[2], 0x80);
  const Tensor halves = t.reinterpret({2}, DType::kBF16);  // first 4 bytes: the two halves of 1.0f
  EXPECT_EQ(halves.to_float_vector()[1], 1.0f);
  EXPECT_TRUE(contains_all(error_of([&] { (void)t.reinterpret({3}, DType::kF32); }),
                           {"reinterpret", "12 bytes", "8"}));
  EXPECT_TRUE(contains_all(
      error_of([&] {
        (void)Tensor::zeros({2, 4}, DType::kF32).slice(1, 0, 2).reinterpret({2}, DType::kF32);
      }),
      {"not contiguous"}));
}

TEST(Tensor, CloneCopiesAndStridedCopy) {
  const Tensor t = random_tensor({4, 6}, DType::kBF16, 3);
  Tensor c = t.clone();
  EXPECT_NE(c.data(), t.data());
  EXPECT_EQ(c.to_float_vector(), t.to_float_vector());
  c.fill(0.5);
  EXPECT_NE(c.to_float_vector(), t.to_float_vector()) << "clone shares memory with its source";
  for (float v : c.to_float_vector())
    EXPECT_EQ(v, 0.5f);

  // A strided source (columns 2..4 of every row) copied into a contiguous destination.
  const Tensor strided = t.slice(1, 2, 5);
  Tensor dst = Tensor::empty({4, 3}, DType::kBF16);
  dst.fill_bytes(0xFF);
  dst.copy_from(strided);
  const std::vector<float> all = t.to_float_vector();
  const std::vector<float> got = dst.to_float_vector();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t k = 0; k < 3; ++k)
      EXPECT_EQ(got[static_cast<size_t>(r * 3 + k)], all[static_cast<size_t>(r * 6 + 2 + k)]);
  const Tensor strided_clone = strided.clone();
  EXPECT_TRUE(strided_clone.is_contiguous());
  EXPECT_EQ(strided_clone.to_float_vector(), got);

  EXPECT_TRUE(contains_all(error_of([&] {
                             dst.copy_from(Tensor::empty({4, 3}, DType::kF32));
                           }),
                           {"copy_from"}));
  Tensor non_contig = Tensor::zeros({4, 6}, DType::kBF16).slice(1, 0, 3);
  EXPECT_TRUE(
      contains_all(error_of([&] { non_contig.copy_from(dst); }), {"copy_from", "contiguous"}));
}

TEST(Tensor, ToDtypeRoundTrips) {
  const Tensor f = random_tensor({64}, DType::kF32, 9, -3.0f, 3.0f);
  const std::vector<float> v = f.to_float_vector();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const Tensor h = f.to_dtype(dt);
    EXPECT_EQ(h.dtype(), dt);
    const std::vector<float> back = h.to_dtype(DType::kF32).to_float_vector();
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(back[i], round_to_dtype(v[i], dt));
    // A value already in the format survives the round trip unchanged.
    EXPECT_EQ(h.to_dtype(DType::kF32).to_dtype(dt).to_float_vector(), h.to_float_vector());
  }
  // fp8: every finite code survives decode -> f32 -> encode -> decode.
  for (DType dt : {DType::kFp8E4M3, DType::kFp8E5M2}) {
    std::vector<int64_t> codes(256);
    for (int i = 0; i < 256; ++i)
      codes[static_cast<size_t>(i)] = i;
    const Tensor raw = Tensor::from_ints(codes, {256}, DType::kUInt8).reinterpret({256}, dt);
    const std::vector<float> values = raw.to_float_vector();
    const std::vector<float> again = raw.to_dtype(DType::kF32).to_dtype(dt).to_float_vector();
    int finite = 0;
    for (int i = 0; i < 256; ++i) {
      const float x = values[static_cast<size_t>(i)];
      if (!std::isfinite(x)) continue;
      ++finite;
      EXPECT_EQ(again[static_cast<size_t>(i)], x) << dtype_name(dt) << " code " << i;
    }
    EXPECT_GE(finite, dt == DType::kFp8E4M3 ? 254 : 248) << dtype_name(dt);
  }
  // fp8 e4m3 rounds to nearest: 0.3 lies between 0.28125 and 0.3125.
  EXPECT_EQ(Tensor::from_floats(std::vector<float>{0.3f, -448.0f}, {2}, DType::kFp8E4M3)
                .to_float_vector(),
            (std::vector<float>{0.3125f, -448.0f}));
}

TEST(Tensor, DescribeAndHelpers) {
  EXPECT_EQ(Tensor::empty({4, 8}, DType::kBF16).describe(), "bf16[4, 8] cpu");
  EXPECT_EQ(Tensor::empty({}, DType::kF32).describe(), "f32[] cpu");
  EXPECT_EQ(shape_to_string({3, 0, 2}), "[3, 0, 2]");
  EXPECT_EQ(numel_of({3, 0, 2}), 0);
  EXPECT_EQ(numel_of({}), 1);
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(Device::cpu().to_string(), "cpu");
  EXPECT_EQ(Device::cuda(1).to_string(), "cuda:1");
  EXPECT_EQ(round_to_dtype(1.0f + 1.0f / 1024.0f, DType::kBF16), 1.0f);
  EXPECT_EQ(round_to_dtype(1.0f + 1.0f / 1024.0f, DType::kF16), 1.0f + 1.0f / 1024.0f);
  EXPECT_EQ(round_to_dtype(0.1f, DType::kF32), 0.1f);
  Tensor t = Tensor::empty({3}, DType::kF32);
  t.fill_bytes(0xFF);
  EXPECT_TRUE(testing::has_nan(t));
}

TEST(Tensor, StorageDeleterRunsOnceWhenTheLastViewDies) {
  static int deleted = 0;
  deleted = 0;
  std::vector<float> backing(8, 1.0f);
  {
    auto storage = std::make_shared<Storage>(backing.data(), backing.size() * sizeof(float),
                                             Device::cpu(), [](void*) { ++deleted; });
    Tensor a = Tensor::from_storage(storage, backing.data(), {8}, DType::kF32);
    storage.reset();
    Tensor b = a.slice(0, 2, 6);
    Tensor c = b.view({2, 2});
    a = Tensor();
    EXPECT_EQ(deleted, 0);
    b = Tensor();
    EXPECT_EQ(deleted, 0);
    EXPECT_EQ(c.to_float_vector(), (std::vector<float>(4, 1.0f)));
  }
  EXPECT_EQ(deleted, 1);
}

TEST(Tensor, CudaWithoutACudaBuildIsAClearError) {
  if (built_with_cuda()) GTEST_SKIP() << "this build has CUDA";
  EXPECT_FALSE(cuda_unavailable_reason().empty());
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_TRUE(contains_all(error_of([] { (void)Tensor::empty({4}, DType::kF32, Device::cuda(0)); }),
                           {"CUDA"}));
}

// ---- DLPack -----------------------------------------------------------------------------------

TEST(DLPack, ExportDescribesTheTensorAndKeepsItAlive) {
  const Tensor t = random_tensor({3, 5}, DType::kBF16, 4);
  const Tensor view = t.slice(1, 1, 4);  // strided
  const long before = t.storage().use_count();
  DLManagedTensor* m = to_dlpack(view);
  ASSERT_NE(m, nullptr);
  EXPECT_GT(t.storage().use_count(), before) << "the export must hold a reference";
  const DLTensor& dl = m->dl_tensor;
  EXPECT_EQ(dl.data, view.data());
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.shape[0], 3);
  EXPECT_EQ(dl.shape[1], 3);
  EXPECT_EQ(dl.strides[0], 5);
  EXPECT_EQ(dl.strides[1], 1);
  EXPECT_EQ(dl.dtype.code, kDLBfloat);
  EXPECT_EQ(dl.dtype.bits, 16);
  EXPECT_EQ(dl.dtype.lanes, 1);
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  m->deleter(m);
  EXPECT_EQ(t.storage().use_count(), before);

  DLManagedTensor* f8 = to_dlpack(Tensor::empty({4}, DType::kFp8E4M3));
  EXPECT_EQ(f8->dl_tensor.dtype.code, kDLUInt);
  EXPECT_EQ(f8->dl_tensor.dtype.bits, 8);
  f8->deleter(f8);
}

TEST(DLPack, RoundTripSharesTheDataPointer) {
  const Tensor t = random_tensor({4, 6}, DType::kF32, 5);
  const long before = t.storage().use_count();
  {
    const Tensor back = from_dlpack(to_dlpack(t.slice(1, 2, 6)));
    EXPECT_EQ(back.data(), static_cast<const char*>(t.data()) + 2 * sizeof(float));
    EXPECT_EQ(back.shape(), (Shape{4, 4}));
    EXPECT_EQ(back.strides(), (Shape{6, 1}));
    EXPECT_EQ(back.dtype(), DType::kF32);
    EXPECT_EQ(back.to_float_vector(), t.slice(1, 2, 6).to_float_vector());
    EXPECT_GT(t.storage().use_count(), before);
  }
  EXPECT_EQ(t.storage().use_count(), before) << "the imported tensor released the export";
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF64, DType::kInt8, DType::kInt32,
                   DType::kInt64, DType::kUInt8}) {
    const Tensor x = Tensor::zeros({3}, dt);
    EXPECT_EQ(from_dlpack(to_dlpack(x)).dtype(), dt) << dtype_name(dt);
  }
}

int g_dl_deleter_calls = 0;

TEST(DLPack, ImportedDeleterRunsExactlyOnce) {
  g_dl_deleter_calls = 0;
  static float data[6] = {1, 2, 3, 4, 5, 6};
  static int64_t shape[2] = {2, 3};
  auto* m = new DLManagedTensor{};
  m->dl_tensor.data = data;
  m->dl_tensor.device = {kDLCPU, 0};
  m->dl_tensor.ndim = 2;
  m->dl_tensor.dtype = {kDLFloat, 32, 1};
  m->dl_tensor.shape = shape;
  m->dl_tensor.strides = nullptr;  // contiguous
  m->dl_tensor.byte_offset = 0;
  m->deleter = [](DLManagedTensor* self) {
    ++g_dl_deleter_calls;
    delete self;
  };
  {
    Tensor t = from_dlpack(m);
    EXPECT_EQ(t.data(), data);
    EXPECT_EQ(t.strides(), (Shape{3, 1}));
    Tensor row = t.select(1);
    Tensor copy = t;  // NOLINT: a second owner
    t = Tensor();
    copy = Tensor();
    EXPECT_EQ(g_dl_deleter_calls, 0);
    EXPECT_EQ(row.to_float_vector(), (std::vector<float>{4, 5, 6}));
  }
  EXPECT_EQ(g_dl_deleter_calls, 1);
}

TEST(DLPack, UnsupportedInputsAreErrors) {
  static float data[4] = {1, 2, 3, 4};
  static int64_t shape[1] = {2};
  DLManagedTensor m{};
  m.dl_tensor.data = data;
  m.dl_tensor.device = {kDLCPU, 0};
  m.dl_tensor.ndim = 1;
  m.dl_tensor.shape = shape;
  m.dl_tensor.dtype = {kDLFloat, 32, 2};
  m.deleter = nullptr;
  EXPECT_TRUE(contains_all(error_of([&] { (void)from_dlpack(&m); }), {"lanes=2"}));
  EXPECT_TRUE(contains_all(error_of([] { (void)from_dlpack(nullptr); }), {"null"}));
}

// ---- WorkspaceManager -------------------------------------------------------------------------

TEST(Workspace, NamedSlotsReserveGrowthAndLock) {
  WorkspaceManager ws;
  EXPECT_TRUE(ws.device().is_cpu());
  EXPECT_EQ(ws.capacity("a"), 0u);  // never reserved
  EXPECT_EQ(ws.total_bytes(), 0u);
  EXPECT_FALSE(ws.growth_locked());
  EXPECT_TRUE(contains_all(error_of([&] { ws.reserve("", 10); }), {"empty"}));

  ws.reserve({{"a", 1000}, {"b", 5u << 20}});
  const size_t ca = ws.capacity("a"), cb = ws.capacity("b");
  EXPECT_GE(ca, 1000u);
  EXPECT_GE(cb, 5u << 20);
  EXPECT_EQ(ws.total_bytes(), ca + cb);
  ws.reserve("a", 10);  // never shrinks
  ws.reserve("b", 10);
  EXPECT_EQ(ws.capacity("a"), ca);
  EXPECT_EQ(ws.capacity("b"), cb);
  const std::vector<WorkspaceRequest> slots = ws.slots();
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0], (WorkspaceRequest{"a", ca}));
  EXPECT_EQ(slots[1], (WorkspaceRequest{"b", cb}));

  // Distinct slots never alias; views of the requested shapes.
  const Tensor a = ws.get("a", {10, 20}, DType::kF32);
  const Tensor b = ws.get("b", {7}, DType::kBF16);
  EXPECT_EQ(a.shape(), (Shape{10, 20}));
  EXPECT_EQ(a.dtype(), DType::kF32);
  EXPECT_EQ(b.shape(), (Shape{7}));
  EXPECT_EQ(b.dtype(), DType::kBF16);
  EXPECT_TRUE(a.is_contiguous() && b.is_contiguous());
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  EXPECT_TRUE(pa + a.nbytes() <= pb || pb + b.nbytes() <= pa) << "the two slots overlap";
  // Reuse: the same memory again while it fits.
  EXPECT_EQ(ws.get("a", {5}, DType::kF32).data(), a.data());
  EXPECT_EQ(ws.get("b", {3}, DType::kF32).data(), b.data());
  // An empty request of a slot never reserved is an empty view.
  EXPECT_EQ(ws.get("c", {0}, DType::kF32).numel(), 0);

  // Unlocked: a larger request grows the slot.
  const size_t big = ca + (4u << 20);
  const Tensor g = ws.get("a", {static_cast<int64_t>(big)}, DType::kUInt8);
  EXPECT_GE(ws.capacity("a"), big);
  EXPECT_EQ(g.nbytes(), big);

  // Locked: requests within capacity work, larger ones fail and do not allocate.
  ws.set_growth_locked(true);
  EXPECT_TRUE(ws.growth_locked());
  const size_t locked = ws.capacity("a");
  EXPECT_NO_THROW((void)ws.get("a", {static_cast<int64_t>(locked)}, DType::kUInt8));
  const std::string msg =
      error_of([&] { (void)ws.get("a", {static_cast<int64_t>(locked + 1)}, DType::kUInt8); });
  EXPECT_TRUE(contains_all(msg, {"locked", "max_num_tokens", "slot 'a'"}));
  EXPECT_EQ(ws.capacity("a"), locked);
  EXPECT_TRUE(contains_all(error_of([&] { (void)ws.get("new", {1}, DType::kUInt8); }),
                           {"slot 'new'", "locked"}));
}

// ---- logging ----------------------------------------------------------------------------------

class LogCapture {
 public:
  explicit LogCapture(log::Level level) : old_(log::level()) {
    log::set_level(level);
    id_ = log::add_callback(
        [this](log::Level l, const std::string& m) { messages.emplace_back(l, m); });
  }
  ~LogCapture() {
    log::remove_callback(id_);
    log::set_level(old_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::vector<std::pair<log::Level, std::string>> messages;

 private:
  log::Level old_;
  int id_ = 0;
};

TEST(Logging, OnceHelpersPrintOnce) {
  LogCapture cap(log::Level::kInfo);
  log::reset_once_cache();
  log::info_once("test_core: printed once");
  log::info_once("test_core: printed once");
  log::info_once("test_core: another message");
  ASSERT_EQ(cap.messages.size(), 2u);
  EXPECT_EQ(cap.messages[0].first, log::Level::kInfo);
  EXPECT_EQ(cap.messages[0].second, "test_core: printed once");
  log::reset_once_cache();
  log::info_once("test_core: printed once");
  EXPECT_EQ(cap.messages.size(), 3u);
  // warn_once and info_once share nothing but the text-based memory.
  log::warn_once("test_core: warn once");
  log::warn_once("test_core: warn once");
  EXPECT_EQ(cap.messages.size(), 4u);
  EXPECT_EQ(cap.messages.back().first, log::Level::kWarn);
}

TEST(Logging, LevelFiltersMessagesAndCallbacksCanBeRemoved) {
  LogCapture cap(log::Level::kWarn);
  EXPECT_EQ(log::level(), log::Level::kWarn);
  EXPECT_FALSE(log::enabled(log::Level::kInfo));
  EXPECT_TRUE(log::enabled(log::Level::kError));
  log::debug("test_core: hidden debug");
  log::info("test_core: hidden info");
  log::warn("test_core: shown warn");
  log::error("test_core: shown error");
  ASSERT_EQ(cap.messages.size(), 2u);
  EXPECT_EQ(cap.messages[0].second, "test_core: shown warn");
  EXPECT_EQ(cap.messages[1].first, log::Level::kError);
  log::set_level(log::Level::kOff);
  EXPECT_FALSE(log::enabled(log::Level::kError));
  log::error("test_core: off");
  EXPECT_EQ(cap.messages.size(), 2u);
  log::set_level(log::Level::kTrace);
  log::debug("test_core: debug at trace");
  EXPECT_EQ(cap.messages.size(), 3u);

  std::vector<std::string> second;
  const int id = log::add_callback([&](log::Level, const std::string& m) { second.push_back(m); });
  log::warn("test_core: both");
  log::remove_callback(id);
  log::warn("test_core: first only");
  EXPECT_EQ(second, (std::vector<std::string>{"test_core: both"}));
  EXPECT_EQ(cap.messages.size(), 5u);
}

// ---- environment ------------------------------------------------------------------------------

TEST(Env, GetIntAndBool) {
  const char* kName = "MOEKIT_TEST_CORE_VARIABLE";
  {
    ScopedEnv unset(kName, nullptr);
    EXPECT_FALSE(env::get(kName).has_value());
    EXPECT_FALSE(env::get_int(kName).has_value());
    EXPECT_TRUE(env::get_bool(kName, true));
    EXPECT_FALSE(env::get_bool(kName, false));
    EXPECT_FALSE(env::get_choice(kName, {"a", "b"}).has_value());
  }
  {
    ScopedEnv empty(kName, "");
    EXPECT_FALSE(env::get(kName).has_value()) << "an empty variable counts as unset";
    EXPECT_TRUE(env::get_bool(kName, true));
  }
  {
    ScopedEnv v(kName, "42");
    EXPECT_EQ(env::get(kName), std::optional<std::string>("42"));
    EXPECT_EQ(env::get_int(kName), std::optional<long long>(42));
    EXPECT_EQ(env::get_int(kName, 0, 42), std::optional<long long>(42));
  }
  {
    ScopedEnv v(kName, "-7");
    EXPECT_EQ(env::get_int(kName), std::optional<long long>(-7));
  }
  for (const char* yes : {"1", "true", "TRUE", "yes", "On"}) {
    ScopedEnv v(kName, yes);
    EXPECT_TRUE(env::get_bool(kName, false)) << yes;
  }
  for (const char* no : {"0", "false", "No", "OFF"}) {
    ScopedEnv v(kName, no);
    EXPECT_FALSE(env::get_bool(kName, true)) << no;
  }
  {
    ScopedEnv v(kName, "Warn");
    EXPECT_EQ(env::get_choice(kName, {"info", "warn"}), std::optional<std::string>("warn"));
  }
}

// An unrecognised value is an error naming the variable, the value and what is accepted; never a
// silent fallback.
TEST(Env, UnrecognisedValuesAreErrors) {
  const char* kName = "MOEKIT_TEST_CORE_VARIABLE";
  for (const char* bad : {"maybe", "2", "-1", "yes please", " 1", "tru"}) {
    ScopedEnv v(kName, bad);
    EXPECT_TRUE(contains_all(error_of([&] { env::get_bool(kName, true); }),
                             {kName, std::string("'") + bad + "'", "1, true, yes, on, 0, false"}))
        << bad;
  }
  for (const char* bad : {"4x", "x", "1.5", " 4", "4 ", "1e3", "99999999999999999999"}) {
    ScopedEnv v(kName, bad);
    EXPECT_TRUE(contains_all(error_of([&] { env::get_int(kName); }),
                             {kName, std::string("'") + bad + "'", "an integer"}))
        << bad;
  }
  {
    ScopedEnv v(kName, "9");
    EXPECT_TRUE(
        contains_all(error_of([&] { env::get_int(kName, 0, 8); }), {kName, "'9'", "[0, 8]"}));
  }
  {
    ScopedEnv v(kName, "purple");
    EXPECT_TRUE(contains_all(error_of([&] {
                               env::get_choice(kName, {"red", "green"});
                             }),
                             {kName, "'purple'", "one of red, green"}));
  }
}

TEST(Env, LogLevelGarbageIsAnErrorNamingTheLevels) {
  {
    ScopedEnv v("MOEKIT_LOG_LEVEL", "garbage");
    log::reset_level();
    const std::string e = error_of([] { log::warn("test_core: must not print"); });
    EXPECT_TRUE(contains_all(
        e, {"MOEKIT_LOG_LEVEL", "'garbage'", "trace, debug, info, warn, warning, error, off"}));
    EXPECT_THROW(log::level(), Error) << "keeps failing until the variable is fixed";
    log::set_level(log::Level::kError);  // an explicit level overrides the variable
    EXPECT_EQ(log::level(), log::Level::kError);
  }
  for (const auto& [text, level] :
       {std::pair{"trace", log::Level::kTrace}, std::pair{"DEBUG", log::Level::kDebug},
        std::pair{"info", log::Level::kInfo}, std::pair{"warning", log::Level::kWarn},
        std::pair{"error", log::Level::kError}, std::pair{"off", log::Level::kOff}}) {
    ScopedEnv v("MOEKIT_LOG_LEVEL", text);
    EXPECT_EQ(log::level_from_env(), level) << text;
  }
  {
    ScopedEnv unset("MOEKIT_LOG_LEVEL", nullptr);
    EXPECT_EQ(log::level_from_env(), log::Level::kWarn);
  }
  log::reset_level();
}

// ---- checks and errors ------------------------------------------------------------------------

TEST(Checks, MessagesNameTheTensorTheValueAndTheRequirement) {
  const Tensor t = Tensor::zeros({2, 3}, DType::kF16);
  EXPECT_NO_THROW(expect_dtype(t, "x", {DType::kBF16, DType::kF16}));
  EXPECT_TRUE(contains_all(error_of([&] {
                             expect_dtype(t, "x", {DType::kBF16, DType::kF32});
                           }),
                           {"'x'", "f16", "[bf16, f32]"}));
  EXPECT_TRUE(contains_all(error_of([&] { expect_dim(t, "x", 3); }), {"'x'", "[2, 3]", "3-d"}));
  EXPECT_NO_THROW(expect_shape(t, "x", {kAnyDim, 3}));
  EXPECT_TRUE(contains_all(error_of([&] {
                             expect_shape(t, "x", {kAnyDim, 4});
                           }),
                           {"'x'", "[2, 3]", "[*, 4]"}));
  EXPECT_TRUE(contains_all(error_of([&] { expect_shape(t, "x", {2, 3, 1}); }), {"'x'", "3-d"}));
  EXPECT_TRUE(contains_all(error_of([&] { expect_device(t, "x", Device::cuda(0)); }),
                           {"'x'", "cpu", "cuda:0"}));
  EXPECT_TRUE(contains_all(error_of([&] { expect_contiguous(t.slice(1, 0, 2), "x"); }),
                           {"'x'", "contiguous"}));
  EXPECT_TRUE(
      contains_all(error_of([] { expect_defined(Tensor(), "w13"); }), {"'w13'", "required"}));
  EXPECT_TRUE(
      contains_all(error_of([] { expect_dtype(Tensor(), "w2", {DType::kF32}); }), {"'w2'"}));
}

TEST(Checks, CheckMacroAndStatus) {
  const int top_k = 9;
  const std::string msg =
      error_of([&] { MOEKIT_CHECK(top_k <= 8, "top_k={} > num_experts={}", top_k, 8); });
  EXPECT_TRUE(contains_all(msg, {"top_k=9 > num_experts=8", "top_k <= 8", "test_core.cpp"}));
  EXPECT_NO_THROW(throw_if_error(Status::ok()));
  EXPECT_THROW(throw_if_error(Status(StatusCode::kUnsupported, "nope")), UnsupportedError);
  try {
    throw_if_error(Status(StatusCode::kInvalidArgument, "bad argument"));
    ADD_FAILURE() << "no throw";
  } catch (const UnsupportedError&) {
    ADD_FAILURE() << "an invalid argument is not 'unsupported'";
  } catch (const Error& e) {
    EXPECT_TRUE(contains_all(e.what(), {"bad argument"}));
  }
  const Status s(StatusCode::kCudaError, "launch failed");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kCudaError);
  EXPECT_EQ(s.message(), "launch failed");
}

// ---- half conversions: exhaustive -------------------------------------------------------------

// IEEE binary16 decoded from first principles.
double f16_reference(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return sign ? -v : v;
}

bool is_f16_nan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

TEST(Half, F16DecodeAndRoundTripEveryCode) {
  int nans = 0;
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    const float f = f16_bits_to_float(h);
    const double ref = f16_reference(h);
    if (std::isnan(ref)) {
      ++nans;
      ASSERT_TRUE(std::isnan(f)) << "code " << c;
      ASSERT_TRUE(is_f16_nan(float_to_f16_bits(f))) << "NaN code " << c << " must stay NaN";
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ref) << "code " << c;
    ASSERT_EQ(std::signbit(f), (c >> 15) != 0) << "code " << c;
    ASSERT_EQ(float_to_f16_bits(f), h) << "round trip of code " << c;
    ASSERT_EQ(to_float(f16_t{h}), f);
    ASSERT_EQ(to_f16(f).bits, h);
  }
  EXPECT_EQ(nans, 2 * 1023);
}

// Round to nearest even at every boundary: the midpoint between neighbouring codes goes to the
// even code; one float ulp either side goes to the nearer code.
TEST(Half, F16EncodeRoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t c = 0; c < 0x7bff; ++c) {  // positive finite codes and their successor
    const auto lo = static_cast<uint16_t>(c), hi = static_cast<uint16_t>(c + 1);
    const double mid = (f16_reference(lo) + f16_reference(hi)) / 2;
    const auto m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid) << "midpoint not exact in float";
    const uint16_t even = (lo & 1) == 0 ? lo : hi;
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(float_to_f16_bits(sign * m), even | s) << "midpoint above code " << c;
      ASSERT_EQ(float_to_f16_bits(sign * std::nextafter(m, 0.0f)), lo | s) << "below mid " << c;
      ASSERT_EQ(float_to_f16_bits(sign * std::nextafter(m, 1e9f)), hi | s) << "above mid " << c;
    }
  }
  // Overflow: 65504 is the largest finite value; the midpoint to the next binade (65520) rounds
  // to infinity, anything below it to 65504.
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  // Underflow: half the smallest subnormal (2^-25) ties to zero, just above it to 2^-24.
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_f16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_f16_bits(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_TRUE(is_f16_nan(float_to_f16_bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_to_f16(0.1f), static_cast<float>(f16_reference(0x2e66)));
}

TEST(Half, Bf16DecodeAndRoundTripEveryCode) {
  int nans = 0;
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    const float f = bf16_bits_to_float(h);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), c << 16) << "code " << c;
    if (std::isnan(f)) {
      ++nans;
      const uint16_t back = float_to_bf16_bits(f);
      ASSERT_TRUE(std::isnan(bf16_bits_to_float(back))) << "NaN code " << c << " must stay NaN";
      continue;
    }
    ASSERT_EQ(float_to_bf16_bits(f), h) << "round trip of code " << c;
    ASSERT_EQ(to_bf16(f).bits, h);
    ASSERT_EQ(to_float(bf16_t{h}), f);
  }
  EXPECT_EQ(nans, 2 * 127);
}

TEST(Half, Bf16EncodeRoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t c = 0; c < 0x7f80; ++c) {  // positive finite codes; 0x7f7f's successor is +inf
    const auto lo = static_cast<uint16_t>(c), hi = static_cast<uint16_t>(c + 1);
    const float mid = std::bit_cast<float>((c << 16) | 0x8000u);  // exactly halfway
    const uint16_t even = (lo & 1) == 0 ? lo : hi;
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(float_to_bf16_bits(sign * mid), even | s) << "midpoint above code " << c;
      ASSERT_EQ(float_to_bf16_bits(sign * std::nextafter(mid, 0.0f)), lo | s) << c;
      ASSERT_EQ(float_to_bf16_bits(sign * std::nextafter(mid, 1e38f * 10)), hi | s) << c;
    }
  }
  EXPECT_EQ(round_to_bf16(1.0f / 3.0f), bf16_bits_to_float(0x3eab));
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the low 16 bits must not become infinity.
  EXPECT_TRUE(
      std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::bit_cast<float>(0x7f800001u)))));
}

// ---- dtype and tolerance ----------------------------------------------------------------------

TEST(DType, NamesSizesAndParsing) {
  EXPECT_EQ(element_size(DType::kBF16), 2u);
  EXPECT_EQ(element_size(DType::kF32), 4u);
  EXPECT_EQ(element_size(DType::kF64), 8u);
  EXPECT_EQ(element_size(DType::kFp8E4M3), 1u);
  EXPECT_EQ(element_size(DType::kInt64), 8u);
  EXPECT_EQ(element_size(DType::kFp4E2M1x2), 1u);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32, DType::kF64, DType::kFp8E4M3,
                   DType::kFp8E5M2, DType::kInt8, DType::kUInt8, DType::kInt32, DType::kInt64,
                   DType::kBool, DType::kFp4E2M1x2, DType::kUE8M0, DType::kUE4M3}) {
    EXPECT_EQ(parse_dtype(dtype_name(dt)), dt) << dtype_name(dt);
  }
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("half"), DType::kF16);
  EXPECT_EQ(parse_dtype("Float32"), DType::kF32);
  EXPECT_FALSE(parse_dtype("float128").has_value());
  EXPECT_TRUE(is_floating(DType::kBF16));
  EXPECT_FALSE(is_floating(DType::kInt32));
}

TEST(Tolerance, TableLookups) {
  EXPECT_EQ(tolerance_for(DType::kBF16).name, "bf16");
  EXPECT_EQ(tolerance_for(DType::kF16).name, "f16");
  EXPECT_EQ(tolerance_for(DType::kF32).name, "f32");
  // Coarser formats get looser tolerances.
  EXPECT_LT(tolerance("f32").rel_l2, tolerance("f16").rel_l2);
  EXPECT_LT(tolerance("f16").rel_l2, tolerance("bf16").rel_l2);
  EXPECT_LT(tolerance("bf16").rel_l2, tolerance("fp8_w8a8").rel_l2);
  for (const char* name : {"f32", "f16", "bf16", "fp8_w8a8", "int8_w8a8", "mxfp4", "nvfp4", "mxfp6",
                           "w4a8", "int4_w4a16"}) {
    EXPECT_EQ(tolerance(name).name, name);
  }
  EXPECT_TRUE(contains_all(error_of([] { (void)tolerance("fp3"); }), {"fp3"}));
}

// ---- configs ----------------------------------------------------------------------------------

TEST(ParallelConfigTest, MakeFlattensTensorParallelism) {
  // TP=2 x DP=2 without EP: TP spans all four ranks.
  const ParallelConfig tp = ParallelConfig::make(2, 2, 1, 1, /*enable_ep=*/false);
  EXPECT_FALSE(tp.use_ep);
  EXPECT_EQ(tp.tp_size, 4);
  EXPECT_EQ(tp.tp_rank, 3);
  EXPECT_EQ(tp.ep_size, 1);
  EXPECT_EQ(tp.ep_rank, 0);
  EXPECT_EQ(tp.dp_size, 2);
  EXPECT_EQ(tp.dp_rank, 1);
  EXPECT_FALSE(tp.use_all2all_kernels());

  // With EP the experts are split over the four ranks and TP becomes 1.
  const ParallelConfig ep = ParallelConfig::make(2, 2, 1, 0, /*enable_ep=*/true);
  EXPECT_TRUE(ep.use_ep);
  EXPECT_EQ(ep.ep_size, 4);
  EXPECT_EQ(ep.ep_rank, 2);
  EXPECT_EQ(ep.tp_size, 1);
  EXPECT_EQ(ep.tp_rank, 0);
  EXPECT_TRUE(ep.use_all2all_kernels());
  EXPECT_FALSE(ep.use_batched_activation_format());
  EXPECT_FALSE(ep.use_megakernel());

  const ParallelConfig ll =
      ParallelConfig::make(1, 2, 0, 0, true, All2AllBackend::kBatchedLowLatency);
  EXPECT_TRUE(ll.use_batched_activation_format());
  const ParallelConfig mk = ParallelConfig::make(2, 1, 0, 1, true, All2AllBackend::kMegakernel);
  EXPECT_TRUE(mk.use_megakernel());
  EXPECT_FALSE(mk.use_all2all_kernels()) << "EP over TP ranks only: no DP, no all-to-all";

  // A single rank never uses EP.
  const ParallelConfig one = ParallelConfig::make(1, 1, 0, 0, true);
  EXPECT_FALSE(one.use_ep);
  EXPECT_EQ(one, ParallelConfig::single());

  // PCP is flattened too.
  const ParallelConfig pcp = ParallelConfig::make(2, 1, 0, 1, true, All2AllBackend::kNaive, 2, 1);
  EXPECT_EQ(pcp.ep_size, 4);
  EXPECT_EQ(pcp.ep_rank, 3);

  EXPECT_TRUE(contains_all(error_of([] { (void)ParallelConfig::make(2, 1, 0, 2, false); }),
                           {"tp_rank=2", "tp_size=2"}));
  EXPECT_TRUE(contains_all(error_of([] { (void)ParallelConfig::make(1, 2, 2, 0, false); }),
                           {"dp_rank=2", "dp_size=2"}));
  EXPECT_TRUE(
      contains_all(error_of([] { (void)ParallelConfig::make(0, 1, 0, 0, false); }), {"tp=0"}));
  EXPECT_EQ(ParallelConfig::make(1, 2, 1, 0, true).to_string(),
            "ParallelConfig(tp=1/0, dp=2/1, ep=2/1, use_ep=true, all2all=naive)");
}

TEST(ParallelConfigTest, All2AllBackendNamesRoundTrip) {
  for (All2AllBackend b : {All2AllBackend::kNaive, All2AllBackend::kAllGatherReduceScatter,
                           All2AllBackend::kNcclAllToAll, All2AllBackend::kBatchedLowLatency,
                           All2AllBackend::kMegakernel}) {
    All2AllBackend parsed = All2AllBackend::kNaive;
    ASSERT_TRUE(parse_all2all_backend(all2all_backend_name(b), &parsed)) << all2all_backend_name(b);
    EXPECT_EQ(parsed, b);
  }
  All2AllBackend out = All2AllBackend::kMegakernel;
  EXPECT_FALSE(parse_all2all_backend("pplx", &out));
  EXPECT_EQ(out, All2AllBackend::kMegakernel) << "a failed parse leaves the output alone";
}

MoEConfig valid_moe() {
  MoEConfig c;
  c.num_experts = 8;
  c.experts_per_token = 2;
  c.hidden_dim = 64;
  c.intermediate_size = 96;
  c.num_local_experts = 8;
  c.num_logical_experts = 8;
  return c;
}

TEST(MoEConfigTest, ValidateNamesTheField) {
  EXPECT_NO_THROW(valid_moe().validate());
  auto fails = [](auto mutate, std::initializer_list<std::string_view> needles) {
    MoEConfig c = valid_moe();
    mutate(c);
    const std::string msg = error_of([&] { c.validate(); });
    EXPECT_TRUE(contains_all(msg, needles));
  };
  fails([](MoEConfig& c) { c.experts_per_token = 9; }, {"top_k=9 > num_experts=8"});
  fails([](MoEConfig& c) { c.experts_per_token = 0; }, {"top_k=0"});
  fails([](MoEConfig& c) { c.num_experts = 0; }, {"num_experts=0"});
  fails([](MoEConfig& c) { c.hidden_dim = 0; }, {"hidden_dim=0"});
  fails([](MoEConfig& c) { c.intermediate_size = -4; }, {"intermediate_size=-4"});
  fails(
      [](MoEConfig& c) {
        c.intermediate_size = 100;
        c.parallel.tp_size = 3;
      },
      {"intermediate_size=100", "tp_size=3"});
  fails([](MoEConfig& c) { c.num_local_experts = 9; }, {"num_local_experts=9", "num_experts=8"});
  fails([](MoEConfig& c) { c.num_local_experts = 0; }, {"num_local_experts=0"});
  fails([](MoEConfig& c) { c.max_num_tokens = 0; }, {"max_num_tokens=0"});
  fails([](MoEConfig& c) { c.in_dtype = DType::kInt8; }, {"in_dtype=int8"});
}

TEST(MoEConfigTest, DerivedValues) {
  MoEConfig c = valid_moe();
  c.parallel.tp_size = 2;
  EXPECT_EQ(c.intermediate_size_per_partition(), 48);
  EXPECT_TRUE(c.is_act_and_mul());
  EXPECT_EQ(c.w13_num_shards(), 2);
  c.activation = Activation::kRelu2NoMul;
  EXPECT_FALSE(c.is_act_and_mul());
  EXPECT_EQ(c.w13_num_shards(), 1);
  EXPECT_EQ(c.activation_format(), ActivationFormat::kStandard);
  c.parallel = ParallelConfig::make(1, 2, 0, 0, true, All2AllBackend::kBatchedLowLatency);
  EXPECT_EQ(c.activation_format(), ActivationFormat::kBatchedExperts);
  const ActivationParams defaults = valid_moe().activation_params();
  EXPECT_FALSE(defaults.clamp_limit.has_value());
  EXPECT_FLOAT_EQ(defaults.alpha, 1.702f);
  EXPECT_FLOAT_EQ(defaults.beta, 1.0f);
  c.swiglu_limit = 7.0f;
  c.swiglu_alpha = 1.5f;
  c.swiglu_beta = 0.5f;
  const ActivationParams p = c.activation_params();
  EXPECT_EQ(p.clamp_limit, std::optional<float>(7.0f));
  EXPECT_EQ(p.alpha, 1.5f);
  EXPECT_EQ(p.beta, 0.5f);
  EXPECT_TRUE(contains_all(valid_moe().to_string(), {"E=8", "top_k=2", "H=64", "I=96"}));
}

std::vector<std::pair<std::string, QuantKey>> catalog() {
  using namespace quant_keys;
  return {{"kFp8StaticTensorSym", kFp8StaticTensorSym},
          {"kFp8DynamicTensorSym", kFp8DynamicTensorSym},
          {"kFp8StaticTokenSym", kFp8StaticTokenSym},
          {"kFp8DynamicTokenSym", kFp8DynamicTokenSym},
          {"kFp8StaticChannelSym", kFp8StaticChannelSym},
          {"kFp8Dynamic128Sym", kFp8Dynamic128Sym},
          {"kFp8Static128BlockSym", kFp8Static128BlockSym},
          {"kFp8Static128BlockE8M0Sym", kFp8Static128BlockE8M0Sym},
          {"kFp8Dynamic64Sym", kFp8Dynamic64Sym},
          {"kNvfp4Static", kNvfp4Static},
          {"kNvfp4Dynamic", kNvfp4Dynamic},
          {"kMxfp4Static", kMxfp4Static},
          {"kMxfp4Dynamic", kMxfp4Dynamic},
          {"kMxfp8Static", kMxfp8Static},
          {"kMxfp8Dynamic", kMxfp8Dynamic},
          {"kMxfp6E3M2Static", kMxfp6E3M2Static},
          {"kMxfp6E3M2Dynamic", kMxfp6E3M2Dynamic},
          {"kMxfp6E2M3Static", kMxfp6E2M3Static},
          {"kMxfp6E2M3Dynamic", kMxfp6E2M3Dynamic},
          {"kInt8StaticTensorSym", kInt8StaticTensorSym},
          {"kInt8DynamicTensorSym", kInt8DynamicTensorSym},
          {"kInt8DynamicTokenSym", kInt8DynamicTokenSym},
          {"kInt8StaticChannelSym", kInt8StaticChannelSym},
          {"kInt8DynamicTokenAsym", kInt8DynamicTokenAsym},
          {"kInt4Static", kInt4Static},
          {"kInt4StaticAsym", kInt4StaticAsym},
          {"kInt4Static32", kInt4Static32},
          {"kInt4Static32Asym", kInt4Static32Asym},
          {"kInt8Static", kInt8Static},
          {"kInt4W4A8StaticChannelSym", kInt4W4A8StaticChannelSym},
          {"kInt4W4A8StaticGroup128Sym", kInt4W4A8StaticGroup128Sym}};
}

TEST(QuantKeyTest, ToStringAndCatalogEquality) {
  using namespace quant_keys;
  EXPECT_EQ(kFp8StaticTensorSym.to_string(),
            "QuantKey(fp8_e4m3,scale(f32,static,per_tensor),symmetric)");
  EXPECT_EQ(kFp8DynamicTokenSym.to_string(),
            "QuantKey(fp8_e4m3,scale(f32,dynamic,per_token),symmetric)");
  EXPECT_TRUE(contains_all(kFp8Static128BlockSym.to_string(), {"group(128,128)"}));
  EXPECT_TRUE(contains_all(kNvfp4Dynamic.to_string(),
                           {"fp4_e2m1", "scale(ue4m3,dynamic,group(1,16))", "scale(f32,static,"}));
  EXPECT_TRUE(contains_all(kInt8DynamicTokenAsym.to_string(), {"asymmetric"}));
  EXPECT_EQ(quant_key_to_string(std::nullopt), "None");
  EXPECT_EQ(quant_key_to_string(kMxfp4Static), kMxfp4Static.to_string());

  // Every catalog key equals a copy of itself and differs from every other, and so do their
  // strings.
  const auto keys = catalog();
  std::set<std::string> strings;
  for (size_t i = 0; i < keys.size(); ++i) {
    const QuantKey copy = keys[i].second;
    EXPECT_EQ(copy, keys[i].second) << keys[i].first;
    strings.insert(keys[i].second.to_string());
    for (size_t j = i + 1; j < keys.size(); ++j) {
      EXPECT_NE(keys[i].second, keys[j].second) << keys[i].first << " == " << keys[j].first;
    }
  }
  EXPECT_EQ(strings.size(), keys.size()) << "two catalog keys print the same";
  QuantKey changed = kFp8StaticTensorSym;
  changed.symmetric = false;
  EXPECT_NE(changed, kFp8StaticTensorSym);
  EXPECT_EQ(GroupShape::per_token().to_string(), "per_token");
  EXPECT_EQ(GroupShape::per_channel().to_string(), "per_channel");
  EXPECT_EQ((GroupShape{1, 32}).to_string(), "group(1,32)");
}

TEST(ActivationTest, NamesParseAndGating) {
  int gated = 0;
  std::set<std::string_view> names;
  for (Activation a : all_activations()) {
    names.insert(activation_name(a));
    EXPECT_EQ(parse_activation(activation_name(a)), a) << activation_name(a);
    gated += is_gated(a) ? 1 : 0;
    EXPECT_EQ(activation_output_dim(a, 96), is_gated(a) ? 48 : 96);
    EXPECT_EQ(is_gated(a), activation_name(a).find("_no_mul") == std::string_view::npos)
        << activation_name(a);
  }
  EXPECT_EQ(all_activations().size(), 10u);
  EXPECT_EQ(names.size(), 10u);
  EXPECT_EQ(gated, 6);
  EXPECT_EQ(parse_activation("gelu_pytorch_tanh"), Activation::kGeluTanh);
  EXPECT_FALSE(parse_activation("tanh").has_value());
  EXPECT_FALSE(parse_activation("").has_value());
  EXPECT_EQ(activation_name(Activation::kSwigluOai), "swigluoai");
  EXPECT_EQ(activation_name(Activation::kRelu2NoMul), "relu2_no_mul");
}

// Closed forms of apply_activation_row (fp32 math, compared with float64 values).
std::vector<float> act_row(Activation a, std::vector<float> in, ActivationParams p = {}) {
  const int64_t d = activation_output_dim(a, static_cast<int64_t>(in.size()));
  std::vector<float> out(static_cast<size_t>(d), std::numeric_limits<float>::quiet_NaN());
  apply_activation_row(a, p, in.data(), out.data(), d);
  return out;
}

double sigmoid_d(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

TEST(ActivationTest, ClosedFormValues) {
  // silu: gate first half, up second half.
  std::vector<float> s = act_row(Activation::kSilu, {0.0f, 2.0f, 5.0f, 3.0f});
  EXPECT_EQ(s[0], 0.0f) << "silu(0) = 0";
  EXPECT_NEAR(s[1], 2.0 * sigmoid_d(2.0) * 3.0, 1e-6);
  // silu with a clamp limit: silu(min(g, L)) * clamp(u, -L, L).
  ActivationParams clamp;
  clamp.clamp_limit = 1.0f;
  s = act_row(Activation::kSilu, {3.0f, 5.0f}, clamp);
  EXPECT_NEAR(s[0], sigmoid_d(1.0) * 1.0, 1e-6);

  const std::vector<float> r = act_row(Activation::kRelu2, {-1.0f, 3.0f, 7.0f, 2.0f});
  EXPECT_EQ(r[0], 0.0f);
  EXPECT_EQ(r[1], 18.0f) << "relu(3)^2 * 2";
  const std::vector<float> r0 = act_row(Activation::kRelu2NoMul, {-2.0f, 3.0f, 0.5f});
  EXPECT_EQ(r0, (std::vector<float>{0.0f, 9.0f, 0.25f}));

  // swigluoai: interleaved (g, u); g clamped above at 7, u to [-7, 7]; (u + 1) * g * sig(1.702 g).
  const std::vector<float> o =
      act_row(Activation::kSwigluOai, {10.0f, 20.0f, -10.0f, -20.0f, 0.5f, 0.25f});
  EXPECT_NEAR(o[0], 8.0 * 7.0 * sigmoid_d(1.702 * 7.0), 1e-4);
  EXPECT_NEAR(o[1], (-7.0 + 1.0) * -10.0 * sigmoid_d(1.702 * -10.0), 1e-6);
  EXPECT_NEAR(o[2], 1.25 * 0.5 * sigmoid_d(1.702 * 0.5), 1e-6);
  ActivationParams oai;
  oai.clamp_limit = 2.0f;
  oai.alpha = 1.0f;
  oai.beta = 0.0f;
  EXPECT_NEAR(act_row(Activation::kSwigluOai, {5.0f, 5.0f}, oai)[0], 2.0 * 2.0 * sigmoid_d(2.0),
              1e-6);

  // swiglustep: min(silu(g), 7) * clamp(u, -7, 7).
  const std::vector<float> st = act_row(Activation::kSwigluStep, {20.0f, 1.0f, 9.0f, -0.5f});
  EXPECT_NEAR(st[0], 7.0 * 7.0, 1e-5);
  EXPECT_NEAR(st[1], 1.0 * sigmoid_d(1.0) * -0.5, 1e-6);

  // gelu (erf) and gelu_tanh at 1: 0.8413447 and 0.8411920.
  EXPECT_NEAR(act_row(Activation::kGelu, {1.0f, 1.0f})[0], 0.5 * (1 + std::erf(1 / std::sqrt(2.0))),
              1e-6);
  const double k = std::sqrt(2.0 / std::numbers::pi);
  EXPECT_NEAR(act_row(Activation::kGeluTanh, {1.0f, 2.0f})[0],
              2.0 * 0.5 * (1 + std::tanh(k * (1 + 0.044715))), 1e-6);
  EXPECT_NEAR(act_row(Activation::kGeluTanhNoMul, {-1.0f})[0],
              -0.5 * (1 + std::tanh(k * (-1 - 0.044715))), 1e-6);
  EXPECT_NEAR(act_row(Activation::kGeluNoMul, {2.0f})[0],
              2.0 * 0.5 * (1 + std::erf(std::sqrt(2.0))), 1e-6);
  EXPECT_NEAR(act_row(Activation::kSiluNoMul, {-3.0f})[0], -3.0 * sigmoid_d(-3.0), 1e-6);
}

TEST(ActivationTest, ApplyMoeActivationOnTensors) {
  const Tensor in = random_tensor({3, 8}, DType::kBF16, 17, -2.0f, 2.0f);
  Tensor out = Tensor::empty({3, 4}, DType::kBF16);
  out.fill_bytes(0xFF);
  apply_moe_activation(Activation::kSilu, {}, out, in);
  const std::vector<float> x = in.to_float_vector();
  const std::vector<float> y = out.to_float_vector();
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < 4; ++i) {
      const float want =
          round_to_bf16(act_row(Activation::kSilu, {x[static_cast<size_t>(r * 8 + i)],
                                                    x[static_cast<size_t>(r * 8 + 4 + i)]})[0]);
      EXPECT_EQ(y[static_cast<size_t>(r * 4 + i)], want) << "row " << r << " col " << i;
    }
  }
  Tensor odd = Tensor::empty({3, 7}, DType::kBF16);
  Tensor o2 = Tensor::empty({3, 3}, DType::kBF16);
  EXPECT_TRUE(contains_all(error_of([&] { apply_moe_activation(Activation::kSilu, {}, o2, odd); }),
                           {"7", "even"}));
  Tensor wrong = Tensor::empty({3, 5}, DType::kBF16);
  EXPECT_TRUE(
      contains_all(error_of([&] { apply_moe_activation(Activation::kSilu, {}, wrong, in); }),
                   {"activation output", "[3, 5]", "[3, 4]"}));
}

TEST(RoutingTest, RoutingMethodTypeTable) {
  using enum ScoringFunc;
  EXPECT_EQ(routing_method_type_for(kSoftmax, 2, true, 0, false, std::nullopt),
            RoutingMethodType::kRenormalizeNaive);
  EXPECT_EQ(routing_method_type_for(kSoftmax, 2, false, 0, false, std::nullopt),
            RoutingMethodType::kDefault);
  EXPECT_EQ(routing_method_type_for(kSigmoid, 2, true, 0, false, std::nullopt),
            RoutingMethodType::kSigmoidRenorm);
  EXPECT_EQ(routing_method_type_for(kSigmoid, 1, false, 0, false, std::nullopt),
            RoutingMethodType::kSigmoid);
  // DeepSeek-V3: sigmoid + bias + grouped + renormalize (+ scaling).
  EXPECT_EQ(routing_method_type_for(kSigmoid, 8, true, 8, true, 2.5f),
            RoutingMethodType::kDeepSeekV3);
  // MiniMax-2: sigmoid + bias + renormalize, no groups, no scaling.
  EXPECT_EQ(routing_method_type_for(kSigmoid, 8, true, 0, true, std::nullopt),
            RoutingMethodType::kMiniMax2);
  EXPECT_EQ(routing_method_type_for(kSigmoid, 8, true, 0, true, 1.0f),
            RoutingMethodType::kMiniMax2);
  EXPECT_EQ(routing_method_type_for(kSigmoid, 8, true, 0, true, 2.5f),
            RoutingMethodType::kSigmoidRenorm);

  for (RoutingMethodType m : {RoutingMethodType::kDefault, RoutingMethodType::kRenormalize,
                              RoutingMethodType::kDeepSeekV3, RoutingMethodType::kLlama4,
                              RoutingMethodType::kRenormalizeNaive, RoutingMethodType::kTopK,
                              RoutingMethodType::kSigmoidRenorm, RoutingMethodType::kMiniMax2,
                              RoutingMethodType::kSigmoid, RoutingMethodType::kUnspecified,
                              RoutingMethodType::kDeepseekV4, RoutingMethodType::kCustom,
                              RoutingMethodType::kSimulated}) {
    EXPECT_EQ(parse_routing_method(routing_method_name(m)), m) << routing_method_name(m);
  }
  EXPECT_EQ(static_cast<int>(RoutingMethodType::kDeepSeekV3), 2);
  EXPECT_EQ(static_cast<int>(RoutingMethodType::kLlama4), 3);
  EXPECT_FALSE(parse_routing_method("grouped").has_value());
  EXPECT_EQ(scoring_func_name(kSigmoid), "sigmoid");
}

TEST(TypesTest, ExpertTokensMetadataFromList) {
  const ExpertTokensMetadata m = ExpertTokensMetadata::make_from_list({3, 0, 5}, Device::cpu());
  EXPECT_EQ(m.expert_num_tokens.dtype(), DType::kInt32);
  EXPECT_EQ(m.expert_num_tokens.to_int_vector(), (std::vector<int64_t>{3, 0, 5}));
  ASSERT_TRUE(m.expert_num_tokens_cpu.has_value());
  EXPECT_EQ(*m.expert_num_tokens_cpu, (std::vector<int32_t>{3, 0, 5}));
  EXPECT_EQ(activation_format_name(ActivationFormat::kStandard), "standard");
  EXPECT_EQ(activation_format_name(ActivationFormat::kBatchedExperts), "batched_experts");
}

}  // namespace
}  // namespace moekit
