// The kernel-selection oracle: the generic MoEKernelOracle (registry, forcing, rejections, log
// lines, explain), make_moe_kernel and the unquantized oracle. Selection only: no kernel runs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moekit/config/quant_key.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/oracle/make_moe_kernel.h"
#include "moekit/oracle/oracle.h"
#include "moekit/oracle/unquantized.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/prepare_finalize/no_ep.h"

namespace moekit {
namespace {

using Backend = UnquantizedMoeBackend;

// ---- helpers
// -------------------------------------------------------------------------------------

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
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

// Captures every log message at debug level and above.
class LogCapture {
 public:
  LogCapture() : old_level_(log::level()) {
    log::set_level(log::Level::kDebug);
    log::reset_once_cache();
    id_ = log::add_callback([this](log::Level level, const std::string& message) {
      lines_.push_back({level, message});
    });
  }
  ~LogCapture() {
    log::remove_callback(id_);
    log::set_level(old_level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  bool has(log::Level level, const std::string& message) const {
    for (const auto& [l, m] : lines_) {
      if (l == level && m == message) return true;
    }
    return false;
  }
  int count_containing(const std::string& needle) const {
    int n = 0;
    for (const auto& line : lines_)
      n += line.second.find(needle) != std::string::npos ? 1 : 0;
    return n;
  }
  std::string dump() const {
    std::string out;
    for (const auto& line : lines_)
      out += line.second + "\n";
    return out;
  }

 private:
  log::Level old_level_;
  int id_ = 0;
  std::vector<std::pair<log::Level, std::string>> lines_;
};

// An experts part that can be constructed but never runs.
class FakeExperts final : public ExpertsModular {
 public:
  using ExpertsModular::ExpertsModular;
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk, int64_t, int64_t,
                                   const ExpertTokensMetadata*, Activation) const override {
    return {{M * topk, N}, {M * topk, N / 2}, {M, topk, K}};
  }
  std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const override {
    return std::make_shared<TopKWeightAndReduceNoOp>();
  }
  void apply(const ExpertsApplyArgs&, RunContext) override {
    throw Error("FakeExperts never runs in the oracle tests");
  }
};

// A test-made experts class whose factory records the batched arguments it was given.
class FakeKind {
 public:
  explicit FakeKind(ExpertsCapabilities caps)
      : klass_(std::move(caps),
               [this](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> tokens,
                      std::optional<int> dispatchers) -> std::unique_ptr<Experts> {
                 ++made;
                 last_max_num_tokens = tokens;
                 last_num_dispatchers = dispatchers;
                 return std::make_unique<FakeExperts>(klass_, moe, quant, tokens, dispatchers);
               }) {}
  FakeKind(const FakeKind&) = delete;
  FakeKind& operator=(const FakeKind&) = delete;

  const ExpertsClass& klass() const { return klass_; }
  const ExpertsClass* ptr() const { return &klass_; }

  int made = 0;
  std::optional<int64_t> last_max_num_tokens;
  std::optional<int> last_num_dispatchers;

 private:
  ExpertsClass klass_;
};

// A capability record that accepts the default test deployment on the CPU.
ExpertsCapabilities cpu_caps(std::string name,
                             ActivationFormat format = ActivationFormat::kStandard) {
  ExpertsCapabilities caps;
  caps.name = std::move(name);
  caps.format = format;
  caps.device_types = {DeviceType::kCPU};
  caps.activations = {Activation::kSilu, Activation::kGelu};
  caps.quant_schemes = {QuantScheme{std::nullopt, std::nullopt}};
  return caps;
}

// E = 12 experts, top-3, H = 40, I = 56 on the CPU (awkward, non-power-of-two sizes).
MoEConfig cpu_moe() {
  MoEConfig moe;
  moe.num_experts = 12;
  moe.experts_per_token = 3;
  moe.hidden_dim = 40;
  moe.intermediate_size = 56;
  moe.num_local_experts = 12;
  moe.num_logical_experts = 12;
  moe.activation = Activation::kSilu;
  moe.device = cpu_device_info();
  moe.in_dtype = DType::kBF16;
  moe.hidden_dim_unpadded = 40;
  moe.intermediate_size_per_partition_unpadded = 56;
  moe.max_num_tokens = 37;
  return moe;
}

// DP=2 x EP with the batched low-latency all-to-all: the batched activation format.
MoEConfig batched_moe() {
  MoEConfig moe = cpu_moe();
  moe.parallel.use_ep = true;
  moe.parallel.dp_size = 2;
  moe.parallel.ep_size = 2;
  moe.parallel.ep_rank = 1;
  moe.parallel.dp_rank = 1;
  moe.parallel.all2all_backend = All2AllBackend::kBatchedLowLatency;
  moe.num_local_experts = 6;
  return moe;
}

// A CUDA device description (planning only; never used to run anything).
DeviceInfo h200_info() {
  DeviceInfo d;
  d.type = DeviceType::kCUDA;
  d.compute_capability = 90;
  d.name = "NVIDIA H200";
  d.num_sms = 132;
  d.present = false;
  return d;
}

template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Every test starts without MOEKIT_MOE_BACKEND and with a fresh *_once cache.
class OracleTest : public ::testing::Test {
 protected:
  void SetUp() override { log::reset_once_cache(); }
  ScopedEnv no_env_{kMoeBackendEnvVar, std::nullopt};
};

// ---- a generic oracle over a test enum
// -----------------------------------------------------------

enum class ToyBackend { kFast, kSlow, kSpare };

class ToyOracle final : public MoEKernelOracle<ToyBackend> {
 public:
  using MoEKernelOracle::MoEKernelOracle;
  static KernelRegistry<ToyBackend>& registry() {
    static KernelRegistry<ToyBackend> instance;  // empty by default
    return instance;
  }
  std::string name() const override { return "Toy"; }
  std::string type_name() const override { return "ToyOracle"; }
  std::vector<ToyBackend> backend_values() const override {
    return {ToyBackend::kFast, ToyBackend::kSlow, ToyBackend::kSpare};
  }
  std::string backend_name(ToyBackend b) const override {
    switch (b) {
      case ToyBackend::kFast:
        return "fast";
      case ToyBackend::kSlow:
        return "slow";
      case ToyBackend::kSpare:
        return "spare";
    }
    return "?";
  }
  std::vector<ToyBackend> priority_backends(const MoEConfig&) const override {
    return {ToyBackend::kFast, ToyBackend::kSlow};
  }
  KernelRegistry<ToyBackend>& kernel_registry() const override { return registry(); }
};

// ---- the unquantized oracle on the CPU
// ------------------------------------------------------------

TEST_F(OracleTest, CpuSelectionPicksCpuReference) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  EXPECT_EQ(oracle.name(), "Unquantized");
  // cpu_monolithic is last: it serves this deployment too, but only when forced.
  EXPECT_EQ(oracle.priority_backends(moe),
            (std::vector<Backend>{Backend::kCpu, Backend::kCpuBatched, Backend::kCpuMonolithic}));

  const auto selection = oracle.select_backend(moe, std::nullopt, std::nullopt);
  EXPECT_EQ(selection.backend, Backend::kCpu);
  EXPECT_EQ(selection.experts, &CpuReferenceExperts::klass());
  EXPECT_TRUE(selection.rejections.empty());
  EXPECT_EQ(selection.forced_by, "");
  // The no-argument overload uses the oracle's own deployment.
  EXPECT_EQ(oracle.select_backend().experts, &CpuReferenceExperts::klass());
}

TEST_F(OracleTest, CudaPriorityListsGpuBackendsFirst) {
  MoEConfig moe = cpu_moe();
  moe.device = h200_info();
  UnquantizedMoEKernelOracle oracle(moe);
  EXPECT_EQ(oracle.priority_backends(moe),
            (std::vector<Backend>{Backend::kSm90Grouped, Backend::kSm90Batched, Backend::kCpu,
                                  Backend::kCpuBatched, Backend::kCpuMonolithic}));
  // Nothing serves a CUDA device in the default table here (the CPU reference rejects it), so
  // selection fails and names every candidate with its reason, in priority order.
  const std::string msg =
      error_message([&] { (void)oracle.select_backend(moe, std::nullopt, std::nullopt); });
  const size_t sm90 = msg.find("sm90_grouped / ");
  const size_t cpu = msg.find("cpu / CpuReferenceExperts: kernel does not support current device");
  const size_t cpu_b = msg.find("cpu_batched / CpuBatchedReferenceExperts: ");
  const size_t cpu_m = msg.find(
      "cpu_monolithic / CpuReferenceMonolithicExperts: kernel does not support current device");
  ASSERT_NE(sm90, std::string::npos) << msg;
  ASSERT_NE(cpu, std::string::npos) << msg;
  ASSERT_NE(cpu_b, std::string::npos) << msg;
  ASSERT_NE(cpu_m, std::string::npos) << msg;
  EXPECT_LT(sm90, cpu);
  EXPECT_LT(cpu, cpu_b);
  EXPECT_LT(cpu_b, cpu_m);
}

TEST_F(OracleTest, ScopedRegistrationInjectsAndRestores) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  FakeKind fake(cpu_caps("FakeFirstExperts"));
  const auto before = UnquantizedMoEKernelOracle::registry().classes(Backend::kCpu);
  {
    ScopedKernelRegistration<Backend> reg(UnquantizedMoEKernelOracle::registry(), Backend::kCpu,
                                          {fake.ptr()}, RegistrationMode::kPrepend);
    EXPECT_EQ(oracle.backend_to_kernel_classes(Backend::kCpu),
              (std::vector<const ExpertsClass*>{fake.ptr(), &CpuReferenceExperts::klass()}));
    const auto selection = oracle.select_backend();
    EXPECT_EQ(selection.backend, Backend::kCpu);
    EXPECT_EQ(selection.experts, fake.ptr());
    {
      // Nested replacement, restored in reverse order.
      FakeKind other(cpu_caps("FakeOtherExperts"));
      ScopedKernelRegistration<Backend> inner(UnquantizedMoEKernelOracle::registry(), Backend::kCpu,
                                              {other.ptr()});
      EXPECT_EQ(oracle.select_backend().experts, other.ptr());
    }
    EXPECT_EQ(oracle.select_backend().experts, fake.ptr());
  }
  EXPECT_EQ(UnquantizedMoEKernelOracle::registry().classes(Backend::kCpu), before);
  EXPECT_EQ(oracle.select_backend().experts, &CpuReferenceExperts::klass());
}

TEST_F(OracleTest, InjectedClassWinsAtHigherPriorityBackend) {
  const MoEConfig moe = cpu_moe();
  ToyOracle oracle(moe);
  FakeKind slow(cpu_caps("SlowExperts"));
  ScopedKernelRegistration<ToyBackend> slow_reg(ToyOracle::registry(), ToyBackend::kSlow,
                                                {slow.ptr()});
  // Nothing at "fast": "slow" wins, and the empty backend is a recorded rejection.
  auto selection = oracle.select_backend();
  EXPECT_EQ(selection.backend, ToyBackend::kSlow);
  EXPECT_EQ(selection.experts, slow.ptr());
  ASSERT_EQ(selection.rejections.size(), 1u);
  EXPECT_EQ(selection.rejections[0].backend, ToyBackend::kFast);
  EXPECT_EQ(selection.rejections[0].experts, nullptr);
  EXPECT_EQ(selection.rejections[0].reason, kNoKernelRegisteredReason);

  FakeKind fast(cpu_caps("FastExperts"));
  ScopedKernelRegistration<ToyBackend> fast_reg(ToyOracle::registry(), ToyBackend::kFast,
                                                {fast.ptr()});
  selection = oracle.select_backend();
  EXPECT_EQ(selection.backend, ToyBackend::kFast);
  EXPECT_EQ(selection.experts, fast.ptr());
  EXPECT_TRUE(selection.rejections.empty());
}

TEST_F(OracleTest, EveryRejectionIsKeptInOrder) {
  const MoEConfig moe = cpu_moe();
  ToyOracle oracle(moe);

  ExpertsCapabilities cuda_only = cpu_caps("CudaOnlyExperts");
  cuda_only.device_types = {DeviceType::kCUDA};
  ExpertsCapabilities gelu_only = cpu_caps("GeluOnlyExperts");
  gelu_only.activations = {Activation::kGelu};
  ExpertsCapabilities fp8_only = cpu_caps("Fp8OnlyExperts");
  fp8_only.quant_schemes = {{quant_keys::kFp8StaticTensorSym, quant_keys::kFp8DynamicTokenSym}};
  FakeKind a(cuda_only), b(gelu_only), c(fp8_only), winner(cpu_caps("WinnerExperts")),
      after(cpu_caps("NeverProbedExperts"));

  ScopedKernelRegistration<ToyBackend> fast(ToyOracle::registry(), ToyBackend::kFast,
                                            {a.ptr(), b.ptr()});
  ScopedKernelRegistration<ToyBackend> slow(ToyOracle::registry(), ToyBackend::kSlow,
                                            {c.ptr(), winner.ptr(), after.ptr()});

  // try_backend on one backend: both misses, in order.
  const auto probe = oracle.try_backend(ToyBackend::kFast);
  EXPECT_EQ(probe.experts, nullptr);
  ASSERT_EQ(probe.rejections.size(), 2u);
  EXPECT_EQ(probe.rejections[0].experts, a.ptr());
  EXPECT_EQ(probe.rejections[1].experts, b.ptr());

  // try_backend with explicit classes ignores the registry.
  const auto explicit_probe = oracle.try_backend(
      ToyBackend::kFast, std::vector<const ExpertsClass*>{b.ptr(), winner.ptr(), a.ptr()});
  EXPECT_EQ(explicit_probe.experts, winner.ptr());
  ASSERT_EQ(explicit_probe.rejections.size(), 1u);
  EXPECT_EQ(explicit_probe.rejections[0].experts, b.ptr());

  const auto selection = oracle.select_backend();
  EXPECT_EQ(selection.backend, ToyBackend::kSlow);
  EXPECT_EQ(selection.experts, winner.ptr());
  ASSERT_EQ(selection.rejections.size(), 3u);
  const ExpertsClass* expected[] = {a.ptr(), b.ptr(), c.ptr()};
  const ToyBackend expected_backend[] = {ToyBackend::kFast, ToyBackend::kFast, ToyBackend::kSlow};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(selection.rejections[i].experts, expected[i]) << i;
    EXPECT_EQ(selection.rejections[i].backend, expected_backend[i]) << i;
    // The reason is exactly the class's own verdict.
    EXPECT_EQ(
        selection.rejections[i].reason,
        expected[i]
            ->is_supported_config(moe, std::nullopt, std::nullopt, ActivationFormat::kStandard)
            .reason)
        << i;
  }
  EXPECT_TRUE(contains(selection.rejections[0].reason, "current device"))
      << selection.rejections[0].reason;
  EXPECT_TRUE(contains(selection.rejections[1].reason, "silu activation"))
      << selection.rejections[1].reason;
  EXPECT_TRUE(contains(selection.rejections[2].reason, "quantization scheme"))
      << selection.rejections[2].reason;
  EXPECT_EQ(a.made + b.made + c.made + winner.made + after.made, 0)
      << "selection constructed experts";

  // With no winner anywhere: UnsupportedError listing all five candidates, one per line.
  ScopedKernelRegistration<ToyBackend> slow_bad(ToyOracle::registry(), ToyBackend::kSlow,
                                                {c.ptr()});
  const std::string msg = error_message([&] { (void)oracle.select_backend(); });
  EXPECT_TRUE(contains(msg, "No Toy MoE backend supports the deployment configuration")) << msg;
  EXPECT_TRUE(contains(msg, "['fast', 'slow']")) << msg;
  EXPECT_TRUE(contains(msg, "\n  fast / CudaOnlyExperts: kernel does not support current device"))
      << msg;
  EXPECT_TRUE(contains(msg, "\n  fast / GeluOnlyExperts: kernel does not support silu activation"))
      << msg;
  EXPECT_TRUE(
      contains(msg, "\n  slow / Fp8OnlyExperts: kernel does not support quantization scheme"))
      << msg;
  EXPECT_THROW((void)oracle.select_backend(), UnsupportedError);
}

TEST_F(OracleTest, ReturnOrRaiseListsEveryCandidate) {
  const MoEConfig moe = cpu_moe();
  ToyOracle oracle(moe);
  ExpertsCapabilities cuda_only = cpu_caps("CudaOnlyExperts");
  cuda_only.device_types = {DeviceType::kCUDA};
  ExpertsCapabilities gelu_only = cpu_caps("GeluOnlyExperts");
  gelu_only.activations = {Activation::kGelu};
  FakeKind a(cuda_only), b(gelu_only), ok(cpu_caps("OkExperts"));
  ScopedKernelRegistration<ToyBackend> fast(ToyOracle::registry(), ToyBackend::kFast,
                                            {a.ptr(), b.ptr()});
  try {
    (void)oracle.return_or_raise(ToyBackend::kFast);
    ADD_FAILURE() << "return_or_raise did not throw";
  } catch (const UnsupportedError& e) {
    const std::string msg = e.what();
    // First line: the seed's unsupported line with the LAST reason; then each candidate.
    const std::string first = msg.substr(0, msg.find('\n'));
    EXPECT_EQ(first,
              "Toy MoE backend 'fast' does not support the deployment configuration since "
              "kernel does not support silu activation.");
    EXPECT_TRUE(contains(msg, "\n  fast / CudaOnlyExperts: kernel does not support current device"))
        << msg;
    EXPECT_TRUE(
        contains(msg, "\n  fast / GeluOnlyExperts: kernel does not support silu activation"))
        << msg;
  }
  LogCapture logs;
  ScopedKernelRegistration<ToyBackend> slow(ToyOracle::registry(), ToyBackend::kSlow, {ok.ptr()});
  const auto [backend, klass] =
      oracle.return_or_raise(ToyBackend::kSlow, std::vector<ToyBackend>{ToyBackend::kSlow});
  EXPECT_EQ(backend, ToyBackend::kSlow);
  EXPECT_EQ(klass, ok.ptr());
  EXPECT_TRUE(logs.has(log::Level::kInfo,
                       "Using slow Toy MoE backend out of potential backends: ['slow']."))
      << logs.dump();
}

// ---- forcing
// -------------------------------------------------------------------------------------

TEST_F(OracleTest, ForcedUnsupportedBackendThrowsAndNeverFallsBack) {
  MoEConfig moe = cpu_moe();
  moe.moe_backend = "sm90_grouped";
  UnquantizedMoEKernelOracle oracle(moe);
  // First with no kernel at the forced backend at all.
  std::optional<ScopedKernelRegistration<Backend>> empty_sm90(
      std::in_place, UnquantizedMoEKernelOracle::registry(), Backend::kSm90Grouped,
      std::vector<const ExpertsClass*>{}, RegistrationMode::kReplace);
  LogCapture logs;
  try {
    (void)oracle.select_backend();
    ADD_FAILURE() << "forced unsupported backend did not throw";
  } catch (const UnsupportedError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.substr(0, msg.find('\n')),
              "Unquantized MoE backend 'sm90_grouped' does not support the deployment "
              "configuration since no kernel is registered for this backend.");
    EXPECT_TRUE(contains(msg, "forced by config")) << msg;
    EXPECT_TRUE(
        contains(msg, "\n  sm90_grouped / <none>: no kernel is registered for this backend"))
        << msg;
    EXPECT_FALSE(contains(msg, "CpuReferenceExperts")) << msg;
  }
  EXPECT_EQ(logs.count_containing("Using "), 0) << logs.dump();
  empty_sm90.reset();

  // A registered class that rejects the CPU: its device reason is in the error.
  ExpertsCapabilities cuda_caps = cpu_caps("FakeSm90Experts");
  cuda_caps.device_types = {DeviceType::kCUDA};
  cuda_caps.min_compute_capability = 90;
  cuda_caps.max_compute_capability = 90;
  FakeKind cuda(cuda_caps);
  ScopedKernelRegistration<Backend> reg(UnquantizedMoEKernelOracle::registry(),
                                        Backend::kSm90Grouped, {cuda.ptr()});
  const std::string msg = error_message([&] { (void)oracle.select_backend(); });
  EXPECT_TRUE(contains(msg,
                       "\n  sm90_grouped / FakeSm90Experts: kernel does not support current "
                       "device cpu"))
      << msg;

  // Forcing the batched CPU backend on a standard-format deployment is rejected, not mapped back.
  moe.moe_backend = "cpu_batched";
  const std::string batched_msg =
      error_message([&] { (void)oracle.select_backend(moe, std::nullopt, std::nullopt); });
  EXPECT_TRUE(contains(batched_msg, "Unquantized MoE backend 'cpu_batched' does not support"))
      << batched_msg;
  EXPECT_TRUE(contains(batched_msg, "standard activation format")) << batched_msg;
  EXPECT_THROW((void)oracle.select_backend(moe, std::nullopt, std::nullopt), UnsupportedError);
}

TEST_F(OracleTest, EnvVarForcesBackend) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  {
    ScopedKernelRegistration<Backend> empty(
        UnquantizedMoEKernelOracle::registry(), Backend::kSm90Batched,
        std::vector<const ExpertsClass*>{}, RegistrationMode::kReplace);
    ScopedEnv env(kMoeBackendEnvVar, "sm90_batched");
    const std::string msg = error_message([&] { (void)oracle.select_backend(); });
    EXPECT_EQ(msg.substr(0, msg.find('\n')),
              "Unquantized MoE backend 'sm90_batched' does not support the deployment "
              "configuration since no kernel is registered for this backend.");
    EXPECT_TRUE(contains(msg, "forced by env MOEKIT_MOE_BACKEND")) << msg;
    EXPECT_THROW((void)oracle.select_backend(), UnsupportedError);
  }
  {
    // A supported forced backend: chosen, with its source; the alias works too.
    ScopedEnv env(kMoeBackendEnvVar, "reference");
    LogCapture logs;
    const auto selection = oracle.select_backend();
    EXPECT_EQ(selection.backend, Backend::kCpu);
    EXPECT_EQ(selection.experts, &CpuReferenceExperts::klass());
    EXPECT_EQ(selection.forced_by, "env MOEKIT_MOE_BACKEND");
    EXPECT_TRUE(logs.has(log::Level::kInfo, "Using cpu Unquantized MoE backend.")) << logs.dump();
  }
  {
    // The config wins over the environment.
    ScopedEnv env(kMoeBackendEnvVar, "sm90_grouped");
    MoEConfig forced = moe;
    forced.moe_backend = "CPU";
    const auto selection = oracle.select_backend(forced, std::nullopt, std::nullopt);
    EXPECT_EQ(selection.backend, Backend::kCpu);
    EXPECT_EQ(selection.forced_by, "config");
  }
  {
    // "auto" in the environment means no force.
    ScopedEnv env(kMoeBackendEnvVar, "auto");
    EXPECT_EQ(oracle.select_backend().forced_by, "");
  }
}

TEST_F(OracleTest, UnknownBackendNameListsValidNames) {
  MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  EXPECT_EQ(oracle.map_backend("sm90_grouped"), Backend::kSm90Grouped);
  EXPECT_EQ(oracle.map_backend("sm90_batched"), Backend::kSm90Batched);
  EXPECT_EQ(oracle.map_backend("cpu"), Backend::kCpu);
  EXPECT_EQ(oracle.map_backend("cpu_batched"), Backend::kCpuBatched);
  EXPECT_EQ(oracle.map_backend("cpu_monolithic"), Backend::kCpuMonolithic);
  EXPECT_EQ(oracle.map_backend("cuda"), Backend::kSm90Grouped);
  EXPECT_EQ(oracle.map_backend("reference"), Backend::kCpu);

  const std::string msg = error_message([&] { (void)oracle.map_backend("triton"); });
  EXPECT_TRUE(contains(msg, "Unknown Unquantized MoE backend 'triton'")) << msg;
  for (const char* name : {"sm90_grouped", "sm90_batched", "cpu", "cpu_batched", "cpu_monolithic",
                           "cuda -> sm90_grouped", "reference -> cpu"}) {
    EXPECT_TRUE(contains(msg, name)) << name << " missing from: " << msg;
  }
  EXPECT_THROW((void)oracle.map_backend("triton"), Error);

  moe.moe_backend = "triton";
  const std::string cfg_msg =
      error_message([&] { (void)oracle.select_backend(moe, std::nullopt, std::nullopt); });
  EXPECT_TRUE(contains(cfg_msg, "'triton'")) << cfg_msg;
  EXPECT_TRUE(contains(cfg_msg, "requested by config")) << cfg_msg;
  ScopedEnv env(kMoeBackendEnvVar, "tpu");
  const std::string env_msg = error_message([&] { (void)oracle.select_backend(); });
  EXPECT_TRUE(contains(env_msg, "'tpu'")) << env_msg;
  EXPECT_TRUE(contains(env_msg, "requested by env MOEKIT_MOE_BACKEND")) << env_msg;
}

// ---- log lines
// -----------------------------------------------------------------------------------

TEST_F(OracleTest, SeedLogLineWording) {
  UnquantizedMoEKernelOracle oracle(cpu_moe());
  EXPECT_EQ(oracle.make_log_backend(Backend::kCpu), "Using cpu Unquantized MoE backend.");
  EXPECT_EQ(oracle.make_log_backend(Backend::kCpu,
                                    std::vector<Backend>{Backend::kCpu, Backend::kCpuBatched}),
            "Using cpu Unquantized MoE backend out of potential backends: ['cpu', 'cpu_batched'].");
  EXPECT_EQ(oracle.make_log_backend(Backend::kSm90Grouped, std::vector<Backend>{}, true),
            "Using sm90_grouped Unquantized MoE LoRA backend out of potential backends: [].");
  EXPECT_EQ(oracle.make_log_unsupported(Backend::kCpuBatched, "kernel does not support LoRA"),
            "Unquantized MoE backend 'cpu_batched' does not support the deployment configuration "
            "since kernel does not support LoRA.");
  EXPECT_EQ(oracle.make_log_unsupported(Backend::kCpu, ""),
            "Unquantized MoE backend 'cpu' does not support the deployment configuration.");
  EXPECT_EQ(oracle.make_log_unsupported(Backend::kCpu, "x", true),
            "Unquantized MoE LoRA backend 'cpu' does not support the deployment configuration "
            "since x.");
}

TEST_F(OracleTest, SelectionEmitsSeedLogLines) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  ExpertsCapabilities gelu_only = cpu_caps("GeluOnlyExperts");
  gelu_only.activations = {Activation::kGelu};
  FakeKind gelu(gelu_only);
  ScopedKernelRegistration<Backend> reg(UnquantizedMoEKernelOracle::registry(), Backend::kCpu,
                                        {gelu.ptr()}, RegistrationMode::kPrepend);
  LogCapture logs;
  (void)oracle.select_backend();
  (void)oracle.select_backend();  // *_once: no second copy
  EXPECT_TRUE(
      logs.has(log::Level::kDebug,
               "Unquantized MoE backend 'cpu' does not support the deployment configuration "
               "since kernel does not support silu activation."))
      << logs.dump();
  EXPECT_TRUE(logs.has(log::Level::kInfo,
                       "Using cpu Unquantized MoE backend out of potential backends: ['cpu', "
                       "'cpu_batched', 'cpu_monolithic']."))
      << logs.dump();
  EXPECT_EQ(logs.count_containing("Using cpu Unquantized"), 1) << logs.dump();
  EXPECT_EQ(logs.count_containing("since kernel does not support silu activation"), 1)
      << logs.dump();
}

// ---- is_supported_config order
// -------------------------------------------------------------------

TEST_F(OracleTest, IsSupportedConfigReportsFirstFailingCheckInSeedOrder) {
  MoEConfig moe = cpu_moe();
  moe.activation = Activation::kSiluNoMul;
  moe.parallel.use_ep = true;
  moe.parallel.ep_size = 2;
  moe.routing_method = RoutingMethodType::kRenormalizeNaive;

  // Fails everything: device, no-act-and-mul, activation, quant scheme, parallel, routing,
  // router-logits dtype, hidden dim, activation format.
  ExpertsCapabilities caps = cpu_caps("FailsEverythingExperts", ActivationFormat::kBatchedExperts);
  caps.device_types = {DeviceType::kCUDA};
  caps.supports_no_act_and_mul = false;
  caps.activations = {Activation::kGelu};
  caps.quant_schemes = {{quant_keys::kFp8StaticTensorSym, quant_keys::kFp8StaticTensorSym}};
  caps.parallel.expert_parallel = false;
  caps.routing_methods = {RoutingMethodType::kDeepSeekV3};
  caps.router_logits_dtypes = {DType::kF32};
  caps.hidden_dim_multiple = 128;

  auto reason = [&](const ExpertsCapabilities& c) {
    FakeKind k(c);
    const SupportResult r =
        k.klass().is_supported_config(moe, std::nullopt, std::nullopt, ActivationFormat::kStandard);
    EXPECT_FALSE(r.supported);
    return r.reason;
  };
  const std::vector<std::pair<std::string, std::function<void(ExpertsCapabilities&)>>> steps = {
      {"kernel does not support current device cpu",
       [](ExpertsCapabilities& c) { c.device_types = {DeviceType::kCPU}; }},
      {"kernel does not support no act_and_mul",
       [](ExpertsCapabilities& c) { c.supports_no_act_and_mul = true; }},
      {"kernel does not support silu_no_mul activation",
       [](ExpertsCapabilities& c) { c.activations.push_back(Activation::kSiluNoMul); }},
      {"kernel does not support quantization scheme",
       [](ExpertsCapabilities& c) {
         c.quant_schemes.push_back({std::nullopt, std::nullopt});
       }},
      {"kernel does not support parallel config",
       [](ExpertsCapabilities& c) { c.parallel.expert_parallel = true; }},
      {"kernel does not support routing method",
       [](ExpertsCapabilities& c) { c.routing_methods.clear(); }},
      {"kernel does not support router logits dtype",
       [](ExpertsCapabilities& c) { c.router_logits_dtypes.clear(); }},
      {"kernel does not support 40 hidden dim",
       [](ExpertsCapabilities& c) { c.hidden_dim_multiple = 8; }},
      {"kernel does not support standard activation format",
       [](ExpertsCapabilities& c) { c.format = ActivationFormat::kStandard; }},
  };
  for (const auto& [expected_prefix, fix] : steps) {
    const std::string r = reason(caps);
    EXPECT_EQ(r.rfind(expected_prefix, 0), 0u)
        << "expected '" << expected_prefix << "' got '" << r << "'";
    fix(caps);
  }
  FakeKind all_fixed(caps);
  EXPECT_TRUE(all_fixed.klass()
                  .is_supported_config(moe, std::nullopt, std::nullopt, ActivationFormat::kStandard)
                  .supported);
}

// ---- make_moe_kernel
// -----------------------------------------------------------------------------

TEST_F(OracleTest, MakeMoeKernelStandardUsesNoEP) {
  const MoEConfig moe = cpu_moe();
  FakeKind fake(cpu_caps("FakeStandardExperts"));
  LogCapture logs;
  auto kernel = make_moe_kernel(QuantConfig::unquantized(), moe, fake.klass(), nullptr,
                                "Using {} MoE experts");
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(kernel->prepare_finalize().name(), "PrepareFinalizeNoEP");
  EXPECT_EQ(&kernel->fused_experts().klass(), fake.ptr());
  EXPECT_EQ(fake.made, 1);
  EXPECT_FALSE(fake.last_max_num_tokens.has_value());
  EXPECT_FALSE(fake.last_num_dispatchers.has_value());
  EXPECT_TRUE(logs.has(log::Level::kInfo, "Using PrepareFinalizeNoEP")) << logs.dump();
  EXPECT_TRUE(logs.has(log::Level::kInfo, "Using FakeStandardExperts MoE experts")) << logs.dump();

  // The oracle's make_kernel goes through the same path.
  UnquantizedMoEKernelOracle oracle(moe);
  auto via_oracle =
      oracle.make_kernel(QuantConfig::unquantized(), moe, Backend::kCpu, fake.klass());
  EXPECT_EQ(via_oracle->prepare_finalize().name(), "PrepareFinalizeNoEP");
  EXPECT_EQ(fake.made, 2);
}

TEST_F(OracleTest, MakeMoeKernelBatchedPassesTokensAndDispatchers) {
  const MoEConfig moe = cpu_moe();
  FakeKind fake(cpu_caps("FakeBatchedExperts", ActivationFormat::kBatchedExperts));
  auto kernel = make_moe_kernel(QuantConfig::unquantized(), moe, fake.klass());
  EXPECT_EQ(kernel->prepare_finalize().name(), "PrepareFinalizeBatched");
  EXPECT_EQ(kernel->prepare_finalize().max_num_tokens_per_rank(), std::optional<int64_t>(37));
  EXPECT_EQ(fake.last_max_num_tokens, std::optional<int64_t>(37));
  EXPECT_EQ(fake.last_num_dispatchers, std::optional<int>(1));
  EXPECT_EQ(kernel->fused_experts().max_num_tokens(), std::optional<int64_t>(37));
  const auto* batched = dynamic_cast<const PrepareFinalizeBatched*>(&kernel->prepare_finalize());
  ASSERT_NE(batched, nullptr);
  EXPECT_EQ(batched->num_local_experts(), 12);
}

TEST_F(OracleTest, MakeMoeKernelFormatMismatch) {
  const MoEConfig moe = cpu_moe();
  FakeKind batched(cpu_caps("FakeBatchedExperts", ActivationFormat::kBatchedExperts));
  FakeKind standard(cpu_caps("FakeStandardExperts"));
  EXPECT_EQ(error_message([&] {
              (void)assemble_moe_kernel(QuantConfig::unquantized(), moe, batched.klass(),
                                        std::make_unique<PrepareFinalizeNoEP>());
            }),
            "FakeBatchedExperts expects batched_experts activations but the selected "
            "prepare/finalize uses standard");
  EXPECT_EQ(error_message([&] {
              (void)assemble_moe_kernel(QuantConfig::unquantized(), moe, standard.klass(),
                                        std::make_unique<PrepareFinalizeBatched>(16, 12));
            }),
            "FakeStandardExperts expects standard activations but the selected prepare/finalize "
            "uses batched_experts");
  EXPECT_EQ(batched.made + standard.made, 0) << "experts were built despite the mismatch";
}

TEST_F(OracleTest, MakeMoeKernelRejectsUnavailableParallelDeployments) {
  MoEConfig moe = cpu_moe();
  moe.parallel.use_ep = true;
  moe.parallel.dp_size = 2;
  moe.parallel.ep_size = 2;
  moe.parallel.all2all_backend = All2AllBackend::kNcclAllToAll;
  moe.num_local_experts = 6;
  FakeKind fake(cpu_caps("FakeStandardExperts"));
  const std::string msg =
      error_message([&] { (void)make_moe_kernel(QuantConfig::unquantized(), moe, fake.klass()); });
  EXPECT_TRUE(contains(msg, "prepare/finalize for ")) << msg;
  EXPECT_TRUE(contains(msg, "is not available yet")) << msg;
  EXPECT_EQ(fake.made, 0);
}

TEST_F(OracleTest, PrepareFinalizeChoice) {
  const MoEConfig moe = cpu_moe();
  const QuantConfig q = QuantConfig::unquantized();
  EXPECT_EQ(maybe_make_prepare_finalize(moe, q, ActivationFormat::kStandard, false)->name(),
            "PrepareFinalizeNoEP");
  auto mono = maybe_make_prepare_finalize(moe, q, ActivationFormat::kStandard, true);
  EXPECT_EQ(mono->name(), "PrepareFinalizeMonolithicNoEP");
  EXPECT_TRUE(mono->is_monolithic());
  EXPECT_EQ(maybe_make_prepare_finalize(moe, q, ActivationFormat::kBatchedExperts, false)->name(),
            "PrepareFinalizeBatched");
  EXPECT_THROW((void)maybe_make_prepare_finalize(moe, q, ActivationFormat::kBatchedExperts, true),
               Error);
  // TP=2 without DP: no dispatch, NoEP.
  MoEConfig tp = moe;
  tp.parallel.tp_size = 2;
  EXPECT_EQ(maybe_make_prepare_finalize(tp, q, ActivationFormat::kStandard, false)->name(),
            "PrepareFinalizeNoEP");
  // The batched-format parallel config (DP+EP over the low-latency all-to-all) needs communication
  // between ranks: refused clearly rather than scattering only this rank's tokens.
  const std::string msg = error_message([&] {
    (void)maybe_make_prepare_finalize(batched_moe(), q, ActivationFormat::kBatchedExperts, false);
  });
  EXPECT_TRUE(contains(msg, "not available yet")) << msg;
  EXPECT_TRUE(contains(msg, "batched_low_latency")) << msg;
  // One rank whose experts want the batched format: the local batched P/F with this rank's range.
  MoEConfig local = cpu_moe();
  local.num_local_experts = 6;
  auto batched = maybe_make_prepare_finalize(local, q, ActivationFormat::kBatchedExperts, false);
  const auto* b = dynamic_cast<const PrepareFinalizeBatched*>(batched.get());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->num_local_experts(), 6);
  EXPECT_EQ(b->rank(), 0);
  EXPECT_EQ(b->num_dispatchers(), 1);
}

// ---- the rest of the seed's surface
// ----------------------------------------------------------------

TEST_F(OracleTest, MakeQuantConfigThrowsForUnquantized) {
  UnquantizedMoEKernelOracle oracle(cpu_moe());
  EXPECT_EQ(error_message([&] { (void)oracle.make_quant_config(); }),
            "UnquantizedMoEKernelOracle does not implement make_quant_config; this oracle has no "
            "quantization-specific config to build.");
  EXPECT_THROW((void)oracle.make_quant_config(), Error);
}

TEST_F(OracleTest, ConvertToKernelFormatDefaultIsIdentity) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  std::vector<float> v13(2 * 6 * 5), v2(2 * 5 * 3);
  for (size_t i = 0; i < v13.size(); ++i)
    v13[i] = 0.25f * static_cast<float>(i) - 3.0f;
  for (size_t i = 0; i < v2.size(); ++i)
    v2[i] = 1.5f - 0.125f * static_cast<float>(i);
  Tensor w13 = Tensor::from_floats(v13, {2, 6, 5}, DType::kF32);
  Tensor w2 = Tensor::from_floats(v2, {2, 5, 3}, DType::kF32);
  auto [c13, c2] = oracle.convert_to_kernel_format(Backend::kCpu, moe, w13, w2);
  EXPECT_EQ(c13.data(), w13.data());
  EXPECT_EQ(c2.data(), w2.data());
  EXPECT_EQ(c13.to_float_vector(), v13);
  EXPECT_EQ(c2.to_float_vector(), v2);
}

// ---- explain
// -------------------------------------------------------------------------------------

TEST_F(OracleTest, ExplainOnCpuShowsDeviceReasonForCudaOnlyBackend) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  ExpertsCapabilities cuda_caps = cpu_caps("FakeSm90Experts");
  cuda_caps.device_types = {DeviceType::kCUDA};
  cuda_caps.min_compute_capability = 90;
  cuda_caps.max_compute_capability = 90;
  FakeKind cuda(cuda_caps);
  ScopedKernelRegistration<Backend> reg(UnquantizedMoEKernelOracle::registry(),
                                        Backend::kSm90Grouped, {cuda.ptr()});

  const OracleReport report = oracle.explain();
  EXPECT_EQ(report.oracle_name, "Unquantized");
  EXPECT_TRUE(report.ok()) << report.error;
  EXPECT_EQ(report.chosen_backend, "cpu");
  EXPECT_EQ(report.chosen_experts, "CpuReferenceExperts");
  EXPECT_EQ(report.forced_by, "");
  // Considered backends first (cpu, cpu_batched, cpu_monolithic), then the rest in enum order.
  ASSERT_EQ(report.candidates.size(), 5u);
  EXPECT_EQ(report.candidates[0].backend, "cpu");
  EXPECT_TRUE(report.candidates[0].supported);
  EXPECT_TRUE(report.candidates[0].considered);
  EXPECT_EQ(report.candidates[1].backend, "cpu_batched");
  EXPECT_EQ(report.candidates[1].experts_class, "CpuBatchedReferenceExperts");
  EXPECT_FALSE(report.candidates[1].supported);
  EXPECT_TRUE(contains(report.candidates[1].reason, "activation format"))
      << report.candidates[1].reason;
  // Supported too, but after cpu in priority, so not chosen.
  EXPECT_EQ(report.candidates[2].backend, "cpu_monolithic");
  EXPECT_EQ(report.candidates[2].experts_class, "CpuReferenceMonolithicExperts");
  EXPECT_TRUE(report.candidates[2].supported) << report.candidates[2].reason;
  EXPECT_TRUE(report.candidates[2].considered);
  EXPECT_EQ(report.candidates[3].backend, "sm90_grouped");
  EXPECT_EQ(report.candidates[3].experts_class, "FakeSm90Experts");
  EXPECT_FALSE(report.candidates[3].supported);
  EXPECT_FALSE(report.candidates[3].considered);
  EXPECT_EQ(report.candidates[3].reason, "kernel does not support current device cpu");
  EXPECT_EQ(report.candidates[4].backend, "sm90_batched");
  EXPECT_EQ(report.candidates[4].experts_class, "Sm90BatchedExperts");
  EXPECT_EQ(report.candidates[4].reason, "kernel does not support current device cpu");
  const std::string table = report.to_string();
  EXPECT_TRUE(contains(table, "CHOSEN")) << table;
  EXPECT_TRUE(contains(table, "kernel does not support current device cpu")) << table;
  EXPECT_EQ(cuda.made, 0);
}

TEST_F(OracleTest, ExplainNeverThrowsForUnsupportedOrUnknown) {
  MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  moe.moe_backend = "sm90_grouped";
  OracleReport report;
  {
    LogCapture logs;
    EXPECT_NO_THROW(report = oracle.explain(moe, std::nullopt, std::nullopt));
    EXPECT_EQ(logs.dump(), "") << "explain logs nothing";
  }
  // The same error select_backend throws.
  EXPECT_EQ(report.error,
            error_message([&] { (void)oracle.select_backend(moe, std::nullopt, std::nullopt); }));
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.forced_by, "config");
  EXPECT_EQ(report.chosen_backend, "");
  EXPECT_TRUE(contains(report.error, "'sm90_grouped'")) << report.error;
  // The forced backend is the only one considered; cpu is listed but skipped.
  ASSERT_FALSE(report.candidates.empty());
  EXPECT_EQ(report.candidates[0].backend, "sm90_grouped");
  EXPECT_TRUE(report.candidates[0].considered);
  for (size_t i = 1; i < report.candidates.size(); ++i)
    EXPECT_FALSE(report.candidates[i].considered);

  moe.moe_backend = "nonsense";
  EXPECT_NO_THROW(report = oracle.explain(moe, std::nullopt, std::nullopt));
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(contains(report.error, "Unknown Unquantized MoE backend 'nonsense'")) << report.error;

  ScopedEnv env(kMoeBackendEnvVar, "cpu");
  report = oracle.explain();
  EXPECT_TRUE(report.ok()) << report.error;
  EXPECT_EQ(report.forced_by, "env MOEKIT_MOE_BACKEND");
  EXPECT_EQ(report.chosen_backend, "cpu");
}

// ---- batched variant swap
// ------------------------------------------------------------------------

TEST_F(OracleTest, BatchedFormatSwapsInBatchedVariant) {
  const MoEConfig moe = batched_moe();
  ASSERT_TRUE(moe.parallel.use_batched_activation_format());
  ASSERT_EQ(moe.activation_format(), ActivationFormat::kBatchedExperts);
  UnquantizedMoEKernelOracle oracle(moe);
  // Classes that accept this deployment (selection only: no kernel is constructed).
  FakeKind batched(cpu_caps("FakeBatchedExperts", ActivationFormat::kBatchedExperts));
  FakeKind standard(cpu_caps("FakeStandardExperts"));
  ScopedKernelRegistration<Backend> reg_b(UnquantizedMoEKernelOracle::registry(),
                                          Backend::kCpuBatched, {batched.ptr()});
  ScopedKernelRegistration<Backend> reg_s(UnquantizedMoEKernelOracle::registry(), Backend::kCpu,
                                          {standard.ptr()});

  EXPECT_EQ(oracle.batched_variant(Backend::kCpu), Backend::kCpuBatched);
  EXPECT_EQ(oracle.batched_variant(Backend::kSm90Grouped), Backend::kSm90Batched);
  EXPECT_EQ(oracle.batched_variant(Backend::kCpuBatched), std::nullopt);

  // Forced through the config: "cpu" becomes "cpu_batched".
  MoEConfig forced = moe;
  forced.moe_backend = "cpu";
  auto selection = oracle.select_backend(forced, std::nullopt, std::nullopt);
  EXPECT_EQ(selection.backend, Backend::kCpuBatched);
  EXPECT_EQ(selection.experts, batched.ptr());
  EXPECT_EQ(selection.forced_by, "config");
  // And through the environment.
  {
    ScopedEnv env(kMoeBackendEnvVar, "cpu");
    selection = oracle.select_backend();
    EXPECT_EQ(selection.backend, Backend::kCpuBatched);
    EXPECT_EQ(selection.forced_by, "env MOEKIT_MOE_BACKEND");
  }
  // "sm90_grouped" becomes "sm90_batched" (and fails there: nothing is registered).
  forced.moe_backend = "sm90_grouped";
  const std::string msg =
      error_message([&] { (void)oracle.select_backend(forced, std::nullopt, std::nullopt); });
  EXPECT_TRUE(contains(msg, "Unquantized MoE backend 'sm90_batched' does not support")) << msg;
  // Auto: the standard class is rejected for its format, the batched one wins.
  selection = oracle.select_backend();
  EXPECT_EQ(selection.backend, Backend::kCpuBatched);
  ASSERT_EQ(selection.rejections.size(), 1u);
  EXPECT_EQ(selection.rejections[0].experts, standard.ptr());
  EXPECT_TRUE(contains(selection.rejections[0].reason, "batched_experts activation format"))
      << selection.rejections[0].reason;
  EXPECT_EQ(batched.made + standard.made, 0);
}

}  // namespace
}  // namespace moekit
