// The kernel-selection oracle: the backend registry (backends as data, BackendRegistration's
// displace-and-restore), the generic MoEKernelOracle over a private registry (priority walk,
// forcing, rejections, log lines, explain, priority_for policies, candidate_on, only_when_forced),
// the prepare/finalize factories, make_moe_kernel and the unquantized oracle. Selection only: no
// kernel runs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_seam.h"
#include "moekit/config/quant_key.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/oracle/backend.h"
#include "moekit/oracle/make_moe_kernel.h"
#include "moekit/oracle/mxfp4.h"
#include "moekit/oracle/oracle.h"
#include "moekit/oracle/plan.h"
#include "moekit/oracle/unquantized.h"
#include "moekit/oracle/w4a8.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/prepare_finalize/factory.h"
#include "moekit/prepare_finalize/no_ep.h"

namespace moekit {
namespace {

using Names = std::vector<std::string>;

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
  // Records the communicator it was given.
  void bind_communicator(Communicator* comm) override { bound = comm; }
  Communicator* bound = nullptr;
};

// A host communicator of `world` ranks that only says who it is (the prepare/finalize checks and
// the hand-over to the experts read nothing else).
class NamedCommunicator final : public Communicator {
 public:
  NamedCommunicator(int rank, int world) : rank_(rank), world_(world) {}
  std::string name() const override { return "named"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Device device() const override { return Device::cpu(); }
  void all_gather(const Tensor&, Tensor&, Stream) override { refuse(); }
  void reduce_scatter(const Tensor&, Tensor&, Stream) override { refuse(); }
  void all_reduce(Tensor&, Stream) override { refuse(); }
  void all_to_all_v(const Tensor&, const std::vector<int64_t>&, Tensor&,
                    const std::vector<int64_t>&, Stream) override {
    refuse();
  }
  std::vector<int64_t> all_gather_host(int64_t) override { refuse(); }
  void barrier() override {}

 private:
  [[noreturn]] static void refuse() { throw Error("NamedCommunicator moves nothing"); }
  int rank_, world_;
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

// ---- backends of the global registry, with other classes
// -------------------------------------------------------------------------------------

// A copy of a registered unquantized backend (name, aliases, priority, batched variant, layout)
// with other experts classes. Registered with BackendRegistration it displaces the original for
// its lifetime; the original comes back afterwards.
ExpertsBackend unquantized_with(const std::string& name, std::vector<const ExpertsClass*> classes) {
  ExpertsBackend b = UnquantizedMoEKernelOracle(cpu_moe()).backend(name);
  b.classes = std::move(classes);
  return b;
}

// The same with `klass` in front of the registered classes.
ExpertsBackend unquantized_prepending(const std::string& name, const ExpertsClass* klass) {
  ExpertsBackend b = UnquantizedMoEKernelOracle(cpu_moe()).backend(name);
  b.classes.insert(b.classes.begin(), klass);
  return b;
}

// Two decision tables agree in every field.
::testing::AssertionResult same_report(const OracleReport& a, const OracleReport& b) {
  auto fail = [&](const std::string& what) {
    return ::testing::AssertionFailure() << what << " differs:\n"
                                         << a.to_string() << "error: " << a.error << "\nvs\n"
                                         << b.to_string() << "error: " << b.error;
  };
  if (a.oracle_name != b.oracle_name) return fail("oracle_name");
  if (a.chosen_backend != b.chosen_backend) return fail("chosen_backend");
  if (a.chosen_experts != b.chosen_experts) return fail("chosen_experts");
  if (a.error != b.error) return fail("error");
  if (a.forced_by != b.forced_by) return fail("forced_by");
  if (a.candidates.size() != b.candidates.size()) return fail("the number of candidates");
  for (size_t i = 0; i < a.candidates.size(); ++i) {
    const OracleReport::Candidate &x = a.candidates[i], &y = b.candidates[i];
    if (x.backend != y.backend || x.experts_class != y.experts_class ||
        x.supported != y.supported || x.reason != y.reason || x.considered != y.considered) {
      return fail("candidate " + std::to_string(i));
    }
  }
  if (a.to_string() != b.to_string()) return fail("to_string()");
  return ::testing::AssertionSuccess();
}

// ---- a toy oracle over a private registry
// -----------------------------------------------------------

// The toy backends live in a private BackendRegistry (passed to the oracle's constructor) under
// this kind: the global registry's unquantized backends never show up in it, and back.
constexpr QuantOracleKind kToyKind = QuantOracleKind::kUnquantized;

// "fast" (alias "quick", batched variant "spare"), "slow", and "spare" (only when forced), in
// that priority order; `classes` empty: no kernel.
ExpertsBackend toy_backend(const std::string& name, std::vector<const ExpertsClass*> classes = {}) {
  ExpertsBackend b;
  b.oracle = kToyKind;
  b.name = name;
  b.classes = std::move(classes);
  if (name == "fast") {
    b.priority = 10;
    b.aliases = {"quick"};
    b.batched_variant = "spare";
  } else if (name == "slow") {
    b.priority = 20;
  } else {
    b.priority = 30;
    b.only_when_forced = true;
  }
  return b;
}

class ToyOracle final : public MoEKernelOracle {
 public:
  // An ordering policy (priority_for): nullopt leaves a backend out of the priority list.
  using Policy = std::function<std::optional<int>(const ExpertsBackend&, const MoEConfig&)>;

  ToyOracle(MoEConfig moe, const BackendRegistry& registry, Policy policy = {})
      : MoEKernelOracle(kToyKind, std::move(moe), std::nullopt, std::nullopt, registry),
        policy_(std::move(policy)) {}
  std::string name() const override { return "Toy"; }
  std::string type_name() const override { return "ToyOracle"; }

 protected:
  std::optional<int> priority_for(const ExpertsBackend& backend,
                                  const MoEConfig& moe_config) const override {
    return policy_ ? policy_(backend, moe_config)
                   : MoEKernelOracle::priority_for(backend, moe_config);
  }

 private:
  Policy policy_;
};

// Every toy test owns a private registry holding the three toy backends without classes; a test
// gives a backend classes by registering a same-named record over it (BackendRegistration puts the
// original back when it goes out of scope).
class ToyOracleTest : public OracleTest {
 protected:
  BackendRegistry registry_;
  BackendRegistration fast_{toy_backend("fast"), registry_};
  BackendRegistration slow_{toy_backend("slow"), registry_};
  BackendRegistration spare_{toy_backend("spare"), registry_};
};

// ---- the registry
// -------------------------------------------------------------------------------------

TEST(BackendRegistryTest, OrdersByPriorityThenRegistration) {
  BackendRegistry registry;
  auto add = [&](const std::string& name, int priority) {
    ExpertsBackend b;
    b.oracle = kToyKind;
    b.name = name;
    b.priority = priority;
    registry.add(b);
  };
  add("c", 30);
  add("a", 10);
  add("b2", 20);
  add("b1", 20);  // same priority as b2, registered later: after it
  Names names;
  for (const ExpertsBackend& b : registry.backends(kToyKind))
    names.push_back(b.name);
  EXPECT_EQ(names, (Names{"a", "b2", "b1", "c"}));
  // Oracles are separate tables.
  EXPECT_TRUE(registry.backends(QuantOracleKind::kFp8).empty());
  EXPECT_FALSE(registry.find(QuantOracleKind::kFp8, "a").has_value());
  ASSERT_TRUE(registry.find(kToyKind, "b1").has_value());
  EXPECT_EQ(registry.find(kToyKind, "b1")->priority, 20);
  // remove() hands the record back, once.
  const auto removed = registry.remove(kToyKind, "b2");
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->name, "b2");
  EXPECT_FALSE(registry.remove(kToyKind, "b2").has_value());
  EXPECT_FALSE(registry.find(kToyKind, "b2").has_value());
  EXPECT_EQ(registry.backends(kToyKind).size(), 3u);
}

TEST(BackendRegistryTest, RefusesDuplicateNamesAndAliases) {
  BackendRegistry registry;
  registry.add(toy_backend("fast"));  // alias "quick"
  auto named = [](const std::string& name, std::vector<std::string> aliases) {
    ExpertsBackend b;
    b.oracle = kToyKind;
    b.name = name;
    b.aliases = std::move(aliases);
    return b;
  };
  // The same name, a name that is another's alias, an alias that is another's name or alias.
  EXPECT_TRUE(contains(error_message([&] { registry.add(named("fast", {})); }),
                       "the unquantized oracle already has a backend named 'fast' (registering "
                       "'fast')"));
  EXPECT_TRUE(contains(error_message([&] { registry.add(named("quick", {})); }),
                       "the unquantized oracle already has a backend named 'quick' (registering "
                       "'quick')"));
  EXPECT_TRUE(contains(error_message([&] { registry.add(named("other", {"fast"})); }),
                       "the unquantized oracle already has a backend named 'fast' (registering "
                       "'other')"));
  EXPECT_TRUE(contains(error_message([&] { registry.add(named("other", {"quick"})); }),
                       "the unquantized oracle already has a backend named 'quick' (registering "
                       "'other')"));
  EXPECT_THROW(registry.add(named("fast", {})), Error);
  // Nameless records and null classes are refused too.
  EXPECT_TRUE(contains(error_message([&] { registry.add(named("", {})); }), "needs a name"));
  ExpertsBackend null_class = named("nulls", {});
  null_class.classes = {nullptr};
  EXPECT_TRUE(contains(error_message([&] { registry.add(null_class); }), "null experts class"));
  // A refused record leaves the table as it was.
  ASSERT_EQ(registry.backends(kToyKind).size(), 1u);
  EXPECT_EQ(registry.backends(kToyKind)[0].aliases, (Names{"quick"}));
  // The same name in another oracle is a different backend.
  ExpertsBackend fp8 = named("fast", {"quick"});
  fp8.oracle = QuantOracleKind::kFp8;
  EXPECT_NO_THROW(registry.add(fp8));
  EXPECT_TRUE(registry.find(QuantOracleKind::kFp8, "fast").has_value());
}

TEST(BackendRegistryTest, RegistrationDisplacesAndRestores) {
  BackendRegistry registry;
  FakeKind original(cpu_caps("OriginalExperts")), replacement(cpu_caps("ReplacementExperts"));
  auto record = [&](const std::string& name, int priority, const ExpertsClass* klass) {
    ExpertsBackend b;
    b.oracle = kToyKind;
    b.name = name;
    b.priority = priority;
    b.aliases = {name + "_alias"};
    b.classes = {klass};
    return b;
  };
  auto names = [&] {
    Names out;
    for (const ExpertsBackend& b : registry.backends(kToyKind))
      out.push_back(b.name);
    return out;
  };
  BackendRegistration a(record("a", 10, original.ptr()), registry);
  BackendRegistration b(record("b", 20, original.ptr()), registry);
  {
    // A new name: added, and removed again at the end of the scope.
    BackendRegistration c(record("c", 15, original.ptr()), registry);
    EXPECT_EQ(names(), (Names{"a", "c", "b"}));
  }
  EXPECT_EQ(names(), (Names{"a", "b"}));
  {
    // A taken name: the original is taken out for the registration's lifetime.
    ExpertsBackend other = record("a", 30, replacement.ptr());
    other.aliases = {"a_other"};
    BackendRegistration over(other, registry);
    EXPECT_EQ(names(), (Names{"b", "a"}));
    EXPECT_EQ(registry.find(kToyKind, "a")->classes,
              (std::vector<const ExpertsClass*>{replacement.ptr()}));
    EXPECT_EQ(registry.find(kToyKind, "a")->aliases, (Names{"a_other"}));
    {
      // Nested: restored in reverse order.
      BackendRegistration inner(record("a", 5, original.ptr()), registry);
      EXPECT_EQ(registry.find(kToyKind, "a")->priority, 5);
    }
    EXPECT_EQ(registry.find(kToyKind, "a")->priority, 30);
  }
  // The original record is back, whole: priority (hence position), aliases and classes.
  EXPECT_EQ(names(), (Names{"a", "b"}));
  const ExpertsBackend back = *registry.find(kToyKind, "a");
  EXPECT_EQ(back.priority, 10);
  EXPECT_EQ(back.aliases, (Names{"a_alias"}));
  EXPECT_EQ(back.classes, (std::vector<const ExpertsClass*>{original.ptr()}));

  // A registration that the registry refuses (its alias is b's name) throws and puts the record it
  // displaced back.
  ExpertsBackend clash = record("a", 1, replacement.ptr());
  clash.aliases = {"b"};
  EXPECT_TRUE(contains(error_message([&] { BackendRegistration bad(clash, registry); }),
                       "already has a backend named 'b' (registering 'a')"));
  EXPECT_EQ(names(), (Names{"a", "b"}));
  EXPECT_EQ(registry.find(kToyKind, "a")->priority, 10);
  EXPECT_EQ(registry.find(kToyKind, "a")->classes,
            (std::vector<const ExpertsClass*>{original.ptr()}));
}

TEST(BackendRegistryTest, LayoutForDefaultsToStandard) {
  ExpertsBackend b = toy_backend("fast");
  EXPECT_FALSE(b.layout_for(cpu_moe()).has_value());
  b.layout = [](const MoEConfig& moe) -> std::optional<WeightLayout> {
    if (moe.hidden_dim != 40) return std::nullopt;
    WeightLayout layout;
    layout.name = "toy layout";
    return layout;
  };
  ASSERT_TRUE(b.layout_for(cpu_moe()).has_value());
  EXPECT_EQ(b.layout_for(cpu_moe())->name, "toy layout");
  MoEConfig other = cpu_moe();
  other.hidden_dim = 64;
  EXPECT_FALSE(b.layout_for(other).has_value());
}

TEST(BackendRegistryTest, QuantOracleKindNames) {
  EXPECT_EQ(quant_oracle_kind_name(QuantOracleKind::kUnquantized), "unquantized");
  EXPECT_EQ(quant_oracle_kind_name(QuantOracleKind::kFp8), "fp8");
  EXPECT_EQ(quant_oracle_kind_name(QuantOracleKind::kInt8), "int8");
  EXPECT_EQ(quant_oracle_kind_name(QuantOracleKind::kIntWna16), "int_wna16");
  EXPECT_EQ(quant_oracle_kind_name(QuantOracleKind::kW4A8), "w4a8");
  EXPECT_EQ(quant_oracle_kind_name(QuantOracleKind::kNvfp4), "nvfp4");
  EXPECT_EQ(quant_oracle_kind_name(QuantOracleKind::kMxfp4), "mxfp4");
}

// ---- the unquantized oracle on the CPU
// ------------------------------------------------------------

TEST_F(OracleTest, CpuSelectionPicksCpuReference) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  EXPECT_EQ(oracle.name(), "Unquantized");
  EXPECT_EQ(oracle.kind(), QuantOracleKind::kUnquantized);
  EXPECT_EQ(&oracle.registry(), &BackendRegistry::global());
  // Every registered backend, in priority order.
  EXPECT_EQ(oracle.backend_values(), (Names{"sm90_ep_peer", "sm90_grouped", "sm90_batched", "cpu",
                                            "cpu_batched", "cpu_monolithic"}));
  // The sm90 backends are candidates on CUDA only. cpu_monolithic is last: it serves this
  // deployment too, but only when forced.
  EXPECT_EQ(oracle.priority_backends(moe), (Names{"cpu", "cpu_batched", "cpu_monolithic"}));

  const auto selection = oracle.select_backend();
  EXPECT_EQ(selection.backend.name, "cpu");
  EXPECT_EQ(selection.backend.classes,
            (std::vector<const ExpertsClass*>{&CpuReferenceExperts::klass()}));
  EXPECT_EQ(selection.experts, &CpuReferenceExperts::klass());
  EXPECT_TRUE(selection.rejections.empty());
  EXPECT_EQ(selection.forced_by, "");
  EXPECT_EQ(selection.report.chosen_backend, "cpu");
  EXPECT_EQ(selection.report.chosen_experts, "CpuReferenceExperts");
  // The oracle decides for its own deployment: another deployment needs another oracle.
  MoEConfig gelu = moe;
  gelu.activation = Activation::kGelu;
  EXPECT_EQ(UnquantizedMoEKernelOracle(gelu).moe_config().activation, Activation::kGelu);
  EXPECT_EQ(oracle.moe_config().activation, Activation::kSilu);
}

// W4A8 on an H200: sm90_w4a8 takes int4 per channel and in groups of 128 along K (the kW4A8Group
// rows), with dynamic per-token or static per-tensor fp8 activations.
TEST_F(OracleTest, W4A8OnHopperTakesPerChannelAndGroupedInt4) {
  if constexpr (!kCudaBuild) GTEST_SKIP() << "built without CUDA (the sm90 classes refuse first)";
  MoEConfig moe = cpu_moe();
  moe.device = h200_info();
  moe.device.preview = true;  // `moekit explain --device h200`: planning for a GPU not here
  moe.hidden_dim = moe.hidden_dim_unpadded = 64;
  moe.intermediate_size = moe.intermediate_size_per_partition_unpadded = 96;
  const OracleReport channel = W4A8MoEKernelOracle(moe).explain();
  EXPECT_EQ(channel.chosen_backend, "sm90_w4a8") << channel.to_string();
  EXPECT_EQ(channel.chosen_experts, "Sm90W4A8Experts");
  const OracleReport static_act = W4A8MoEKernelOracle(moe, quant_keys::kInt4W4A8StaticChannelSym,
                                                      quant_keys::kFp8StaticTensorSym)
                                      .explain();
  EXPECT_EQ(static_act.chosen_backend, "sm90_w4a8") << static_act.to_string();
  for (const QuantKey& act : {quant_keys::kFp8DynamicTokenSym, quant_keys::kFp8StaticTensorSym}) {
    const OracleReport group =
        W4A8MoEKernelOracle(moe, quant_keys::kInt4W4A8StaticGroup128Sym, act).explain();
    EXPECT_EQ(group.chosen_backend, "sm90_w4a8") << group.to_string();
    EXPECT_EQ(group.chosen_experts, "Sm90W4A8Experts");
  }
}

// MXFP4 with static fp8 activations on an H200: sm90_mxfp4 (bf16 rows) and sm90_mxfp4_fp8 (the
// e4m3 rows) both serve it, sm90_mxfp4 first; the e4m3 one takes no other activation and serves
// when forced by name.
TEST_F(OracleTest, Mxfp4WithFp8ActivationsOnHopperHasTheE4m3Rows) {
  if constexpr (!kCudaBuild) GTEST_SKIP() << "built without CUDA (the sm90 classes refuse first)";
  MoEConfig moe = cpu_moe();
  moe.device = h200_info();
  moe.device.preview = true;
  moe.hidden_dim = moe.hidden_dim_unpadded = 64;
  moe.intermediate_size = moe.intermediate_size_per_partition_unpadded = 96;
  auto candidate = [](const OracleReport& r, const std::string& backend) {
    for (const OracleReport::Candidate& c : r.candidates) {
      if (c.backend == backend) return c;
    }
    ADD_FAILURE() << backend << " is not a candidate:\n" << r.to_string();
    return OracleReport::Candidate{};
  };
  const OracleReport a8 =
      Mxfp4MoEKernelOracle(moe, quant_keys::kMxfp4Static, quant_keys::kFp8StaticTensorSym)
          .explain();
  EXPECT_EQ(a8.chosen_backend, "sm90_mxfp4") << a8.to_string();
  EXPECT_TRUE(candidate(a8, "sm90_mxfp4_fp8").supported) << a8.to_string();
  EXPECT_EQ(candidate(a8, "sm90_mxfp4_fp8").experts_class, "Sm90Mxfp4Fp8Experts");
  const OracleReport a16 = Mxfp4MoEKernelOracle(moe, quant_keys::kMxfp4Static).explain();
  EXPECT_EQ(a16.chosen_backend, "sm90_mxfp4") << a16.to_string();
  EXPECT_FALSE(candidate(a16, "sm90_mxfp4_fp8").supported) << a16.to_string();
  moe.moe_backend = "sm90_mxfp4_fp8";
  const OracleReport forced =
      Mxfp4MoEKernelOracle(moe, quant_keys::kMxfp4Static, quant_keys::kFp8StaticTensorSym)
          .explain();
  EXPECT_EQ(forced.chosen_experts, "Sm90Mxfp4Fp8Experts") << forced.to_string();
}

TEST_F(OracleTest, CudaPriorityListsGpuBackendsFirst) {
  MoEConfig moe = cpu_moe();
  moe.device = h200_info();
  UnquantizedMoEKernelOracle oracle(moe);
  EXPECT_EQ(oracle.priority_backends(moe), (Names{"sm90_ep_peer", "sm90_grouped", "sm90_batched",
                                                  "cpu", "cpu_batched", "cpu_monolithic"}));
  // With the sm90 classes replaced by one that rejects this device too, nothing serves it: the
  // selection fails and names every candidate with its reason, in priority order.
  ExpertsCapabilities sm100_caps = cpu_caps("FakeSm100Experts");
  sm100_caps.device_types = {DeviceType::kCUDA};
  sm100_caps.min_compute_capability = 100;
  FakeKind sm100(sm100_caps);
  BackendRegistration reg(unquantized_with("sm90_grouped", {sm100.ptr()}));
  const std::string msg = error_message([&] { (void)oracle.select_backend(); });
  const size_t sm90 = msg.find("sm90_grouped / FakeSm100Experts: ");
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
  EXPECT_TRUE(contains(msg,
                       "(6 tried: ['sm90_ep_peer', 'sm90_grouped', 'sm90_batched', 'cpu', "
                       "'cpu_batched', 'cpu_monolithic'])"))
      << msg;
}

TEST_F(OracleTest, ScopedRegistrationInjectsAndRestores) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  FakeKind fake(cpu_caps("FakeFirstExperts"));
  const ExpertsBackend before = oracle.backend("cpu");
  const Names values_before = oracle.backend_values();
  {
    // A record of the same name displaces the registered one; the oracle reads it at call time.
    BackendRegistration reg(unquantized_prepending("cpu", fake.ptr()));
    EXPECT_EQ(oracle.backend_to_kernel_classes("cpu"),
              (std::vector<const ExpertsClass*>{fake.ptr(), &CpuReferenceExperts::klass()}));
    const auto selection = oracle.select_backend();
    EXPECT_EQ(selection.backend.name, "cpu");
    EXPECT_EQ(selection.experts, fake.ptr());
    EXPECT_EQ(oracle.map_backend("reference"), "cpu") << "the copy keeps the aliases";
    {
      // Nested replacement, restored in reverse order.
      FakeKind other(cpu_caps("FakeOtherExperts"));
      BackendRegistration inner(unquantized_with("cpu", {other.ptr()}));
      EXPECT_EQ(oracle.select_backend().experts, other.ptr());
    }
    EXPECT_EQ(oracle.select_backend().experts, fake.ptr());
  }
  EXPECT_EQ(oracle.backend_to_kernel_classes("cpu"), before.classes);
  EXPECT_EQ(oracle.backend("cpu").aliases, before.aliases);
  EXPECT_EQ(oracle.backend("cpu").priority, before.priority);
  EXPECT_EQ(oracle.backend("cpu").batched_variant, before.batched_variant);
  EXPECT_EQ(oracle.backend_values(), values_before);
  EXPECT_EQ(oracle.select_backend().experts, &CpuReferenceExperts::klass());
}

// ---- the generic oracle (toy backends in a private registry)
// ------------------------------------------------

TEST_F(ToyOracleTest, SeesOnlyItsOwnRegistry) {
  ToyOracle oracle(cpu_moe(), registry_);
  EXPECT_EQ(&oracle.registry(), &registry_);
  EXPECT_EQ(oracle.backend_values(), (Names{"fast", "slow", "spare"}));
  // spare is only_when_forced: never in a priority list.
  EXPECT_EQ(oracle.priority_backends(cpu_moe()), (Names{"fast", "slow"}));
  EXPECT_EQ(oracle.backend("fast").aliases, (Names{"quick"}));
  EXPECT_EQ(oracle.backend_to_kernel_classes("fast"), (std::vector<const ExpertsClass*>{}));
  // The global registry's unquantized backends are not the toy's, and the toy's are not global.
  EXPECT_THROW((void)oracle.map_backend("cpu"), Error);
  EXPECT_THROW((void)oracle.backend("cpu"), Error);
  EXPECT_TRUE(oracle.backend_to_kernel_classes("cpu").empty());
  EXPECT_FALSE(BackendRegistry::global().find(kToyKind, "fast").has_value());
  EXPECT_FALSE(BackendRegistry::global().find(kToyKind, "quick").has_value());
}

TEST_F(ToyOracleTest, InjectedClassWinsAtHigherPriorityBackend) {
  const MoEConfig moe = cpu_moe();
  ToyOracle oracle(moe, registry_);
  FakeKind slow(cpu_caps("SlowExperts"));
  BackendRegistration slow_reg(toy_backend("slow", {slow.ptr()}), registry_);
  // Nothing at "fast": "slow" wins, and the empty backend is a recorded rejection.
  auto selection = oracle.select_backend();
  EXPECT_EQ(selection.backend.name, "slow");
  EXPECT_EQ(selection.experts, slow.ptr());
  ASSERT_EQ(selection.rejections.size(), 1u);
  EXPECT_EQ(selection.rejections[0].backend, "fast");
  EXPECT_EQ(selection.rejections[0].experts, nullptr);
  EXPECT_EQ(selection.rejections[0].experts_name(), "");
  EXPECT_EQ(selection.rejections[0].reason, kNoKernelRegisteredReason);

  FakeKind fast(cpu_caps("FastExperts"));
  {
    BackendRegistration fast_reg(toy_backend("fast", {fast.ptr()}), registry_);
    selection = oracle.select_backend();
    EXPECT_EQ(selection.backend.name, "fast");
    EXPECT_EQ(selection.backend.aliases, (Names{"quick"}));
    EXPECT_EQ(selection.experts, fast.ptr());
    EXPECT_TRUE(selection.rejections.empty());
  }
  // The class-less "fast" is back: "slow" wins again.
  EXPECT_EQ(oracle.select_backend().experts, slow.ptr());
  EXPECT_EQ(fast.made + slow.made, 0) << "selection constructed experts";
}

TEST_F(ToyOracleTest, EveryRejectionIsKeptInOrder) {
  const MoEConfig moe = cpu_moe();
  ToyOracle oracle(moe, registry_);

  ExpertsCapabilities cuda_only = cpu_caps("CudaOnlyExperts");
  cuda_only.device_types = {DeviceType::kCUDA};
  ExpertsCapabilities gelu_only = cpu_caps("GeluOnlyExperts");
  gelu_only.activations = {Activation::kGelu};
  ExpertsCapabilities fp8_only = cpu_caps("Fp8OnlyExperts");
  fp8_only.quant_schemes = {{quant_keys::kFp8StaticTensorSym, quant_keys::kFp8DynamicTokenSym}};
  FakeKind a(cuda_only), b(gelu_only), c(fp8_only), winner(cpu_caps("WinnerExperts")),
      after(cpu_caps("NeverProbedExperts"));

  BackendRegistration fast(toy_backend("fast", {a.ptr(), b.ptr()}), registry_);
  BackendRegistration slow(toy_backend("slow", {c.ptr(), winner.ptr(), after.ptr()}), registry_);

  // try_backend on one backend: both misses, in order.
  const auto probe = oracle.try_backend("fast");
  EXPECT_EQ(probe.experts, nullptr);
  ASSERT_EQ(probe.rejections.size(), 2u);
  EXPECT_EQ(probe.rejections[0].experts, a.ptr());
  EXPECT_EQ(probe.rejections[1].experts, b.ptr());
  EXPECT_EQ(probe.rejections[1].backend, "fast");

  // try_backend with explicit classes ignores the registry.
  const auto explicit_probe =
      oracle.try_backend("fast", std::vector<const ExpertsClass*>{b.ptr(), winner.ptr(), a.ptr()});
  EXPECT_EQ(explicit_probe.experts, winner.ptr());
  ASSERT_EQ(explicit_probe.rejections.size(), 1u);
  EXPECT_EQ(explicit_probe.rejections[0].experts, b.ptr());

  // try_backend with another activation key: the fp8 class accepts fp8 activations only with fp8
  // weights, so it still rejects; the reason names the scheme.
  const auto keyed = oracle.try_backend("slow", std::vector<const ExpertsClass*>{c.ptr()},
                                        std::optional<QuantKey>(quant_keys::kFp8DynamicTokenSym));
  EXPECT_EQ(keyed.experts, nullptr);
  ASSERT_EQ(keyed.rejections.size(), 1u);
  EXPECT_TRUE(contains(keyed.rejections[0].reason, "quantization scheme"))
      << keyed.rejections[0].reason;

  const auto selection = oracle.select_backend();
  EXPECT_EQ(selection.backend.name, "slow");
  EXPECT_EQ(selection.experts, winner.ptr());
  ASSERT_EQ(selection.rejections.size(), 3u);
  const ExpertsClass* expected[] = {a.ptr(), b.ptr(), c.ptr()};
  const char* expected_backend[] = {"fast", "fast", "slow"};
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
  // The table probes every class once, the one after the winner included (never chosen).
  ASSERT_EQ(selection.report.candidates.size(), 6u);
  EXPECT_EQ(selection.report.candidates[4].experts_class, "NeverProbedExperts");
  EXPECT_TRUE(selection.report.candidates[4].supported);
  EXPECT_EQ(selection.report.candidates[5].backend, "spare");
  EXPECT_FALSE(selection.report.candidates[5].considered);

  // With no winner anywhere: UnsupportedError listing all three candidates, one per line.
  BackendRegistration slow_bad(toy_backend("slow", {c.ptr()}), registry_);
  const std::string msg = error_message([&] { (void)oracle.select_backend(); });
  EXPECT_TRUE(contains(msg, "No Toy MoE backend supports the deployment configuration")) << msg;
  EXPECT_TRUE(contains(msg, "(2 tried: ['fast', 'slow'])")) << msg;
  EXPECT_TRUE(contains(msg, "\n  fast / CudaOnlyExperts: kernel does not support current device"))
      << msg;
  EXPECT_TRUE(contains(msg, "\n  fast / GeluOnlyExperts: kernel does not support silu activation"))
      << msg;
  EXPECT_TRUE(
      contains(msg, "\n  slow / Fp8OnlyExperts: kernel does not support quantization scheme"))
      << msg;
  EXPECT_FALSE(contains(msg, "spare")) << msg;
  EXPECT_THROW((void)oracle.select_backend(), UnsupportedError);
  EXPECT_EQ(MoEKernelOracle::format_rejections({}), "");
}

TEST_F(ToyOracleTest, ReturnOrRaiseListsEveryCandidate) {
  const MoEConfig moe = cpu_moe();
  ToyOracle oracle(moe, registry_);
  ExpertsCapabilities cuda_only = cpu_caps("CudaOnlyExperts");
  cuda_only.device_types = {DeviceType::kCUDA};
  ExpertsCapabilities gelu_only = cpu_caps("GeluOnlyExperts");
  gelu_only.activations = {Activation::kGelu};
  FakeKind a(cuda_only), b(gelu_only), ok(cpu_caps("OkExperts"));
  BackendRegistration fast(toy_backend("fast", {a.ptr(), b.ptr()}), registry_);
  try {
    (void)oracle.return_or_raise("fast");
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
  // A backend without classes: the no-kernel reason, with the "<none>" class.
  const std::string none = error_message([&] { (void)oracle.return_or_raise("slow"); });
  EXPECT_EQ(none,
            "Toy MoE backend 'slow' does not support the deployment configuration since no kernel "
            "is registered for this backend.\nCandidates:\n  slow / <none>: no kernel is "
            "registered for this backend");
  LogCapture logs;
  BackendRegistration slow(toy_backend("slow", {ok.ptr()}), registry_);
  const auto [backend, klass] = oracle.return_or_raise("slow", Names{"slow"});
  EXPECT_EQ(backend, "slow");
  EXPECT_EQ(klass, ok.ptr());
  EXPECT_TRUE(logs.has(log::Level::kInfo,
                       "Using slow Toy MoE backend out of potential backends: ['slow']."))
      << logs.dump();
  // LoRA wording.
  EXPECT_TRUE(contains(error_message([&] {
                         (void)oracle.return_or_raise("fast", std::nullopt, std::nullopt,
                                                      std::nullopt, /*is_lora=*/true);
                       }),
                       "Toy MoE LoRA backend 'fast' does not support"));
}

TEST_F(ToyOracleTest, PriorityForPolicyOrdersAndDrops) {
  const MoEConfig moe = cpu_moe();
  FakeKind fast(cpu_caps("FastExperts")), slow(cpu_caps("SlowExperts"));
  BackendRegistration fast_reg(toy_backend("fast", {fast.ptr()}), registry_);
  BackendRegistration slow_reg(toy_backend("slow", {slow.ptr()}), registry_);
  // The default policy: the registered priorities.
  EXPECT_EQ(ToyOracle(moe, registry_).select_backend().experts, fast.ptr());

  // A policy moving slow ahead of fast: it is tried (and wins) first.
  ToyOracle slow_first(moe, registry_, [](const ExpertsBackend& b, const MoEConfig&) {
    return std::optional<int>(b.name == "slow" ? 1 : b.priority);
  });
  EXPECT_EQ(slow_first.priority_backends(moe), (Names{"slow", "fast"}));
  auto selection = slow_first.select_backend();
  EXPECT_EQ(selection.backend.name, "slow");
  EXPECT_TRUE(selection.rejections.empty());
  EXPECT_TRUE(contains(selection.report.to_string(), "chosen: slow / SlowExperts"));
  EXPECT_EQ(selection.report.candidates[0].backend, "slow");
  // The policy is asked with the deployment it orders for; it never sees only_when_forced ones.
  MoEConfig gelu = moe;
  gelu.activation = Activation::kGelu;
  Names asked;
  ToyOracle by_deployment(moe, registry_, [&](const ExpertsBackend& b, const MoEConfig& m) {
    asked.push_back(b.name);
    return m.activation == Activation::kGelu ? std::optional<int>(-b.priority)
                                             : std::optional<int>(b.priority);
  });
  EXPECT_EQ(by_deployment.priority_backends(gelu), (Names{"slow", "fast"}));
  EXPECT_EQ(by_deployment.priority_backends(moe), (Names{"fast", "slow"}));
  EXPECT_EQ(asked, (Names{"fast", "slow", "fast", "slow"}));

  // A policy leaving fast out: not considered, so not chosen, but still in the table (skipped),
  // and still forceable by name.
  ToyOracle no_fast(moe, registry_, [](const ExpertsBackend& b, const MoEConfig&) {
    return b.name == "fast" ? std::nullopt : std::optional<int>(b.priority);
  });
  EXPECT_EQ(no_fast.priority_backends(moe), (Names{"slow"}));
  selection = no_fast.select_backend();
  EXPECT_EQ(selection.backend.name, "slow");
  EXPECT_TRUE(selection.rejections.empty());
  const OracleReport report = no_fast.explain();
  ASSERT_EQ(report.candidates.size(), 3u);
  EXPECT_EQ(report.candidates[0].backend, "slow");
  EXPECT_EQ(report.candidates[1].backend, "fast");
  EXPECT_FALSE(report.candidates[1].considered);
  EXPECT_TRUE(report.candidates[1].supported);
  EXPECT_TRUE(contains(report.to_string(), "skipped")) << report.to_string();
  MoEConfig forced = moe;
  forced.moe_backend = "fast";
  EXPECT_EQ(ToyOracle(forced, registry_,
                      [](const ExpertsBackend& b, const MoEConfig&) {
                        return b.name == "fast" ? std::nullopt : std::optional<int>(b.priority);
                      })
                .select_backend()
                .experts,
            fast.ptr());
}

TEST_F(ToyOracleTest, CandidateOnFiltersThePriorityListByDevice) {
  ExpertsCapabilities cuda_caps = cpu_caps("FakeCudaExperts");
  cuda_caps.device_types = {DeviceType::kCUDA};
  FakeKind cuda(cuda_caps), slow(cpu_caps("SlowExperts"));
  ExpertsBackend gpu = toy_backend("gpu", {cuda.ptr()});
  gpu.priority = 5;
  gpu.only_when_forced = false;
  gpu.candidate_on = {DeviceType::kCUDA};
  BackendRegistration gpu_reg(gpu, registry_);
  BackendRegistration slow_reg(toy_backend("slow", {slow.ptr()}), registry_);

  MoEConfig on_cuda = cpu_moe();
  on_cuda.device = h200_info();
  EXPECT_EQ(ToyOracle(on_cuda, registry_).priority_backends(on_cuda),
            (Names{"gpu", "fast", "slow"}));
  // There it is the first candidate probed (whether its class accepts an absent device depends on
  // the build, so only the order is checked).
  const OracleReport on_cuda_report = ToyOracle(on_cuda, registry_).explain();
  ASSERT_FALSE(on_cuda_report.candidates.empty());
  EXPECT_EQ(on_cuda_report.candidates[0].backend, "gpu");
  EXPECT_TRUE(on_cuda_report.candidates[0].considered);

  // On the CPU, gpu is no candidate: never probed for the selection, listed as skipped.
  const MoEConfig moe = cpu_moe();
  ToyOracle oracle(moe, registry_);
  EXPECT_EQ(oracle.backend_values(), (Names{"gpu", "fast", "slow", "spare"}));
  EXPECT_EQ(oracle.priority_backends(moe), (Names{"fast", "slow"}));
  const auto selection = oracle.select_backend();
  EXPECT_EQ(selection.backend.name, "slow");
  ASSERT_EQ(selection.rejections.size(), 1u);
  EXPECT_EQ(selection.rejections[0].backend, "fast");
  const OracleReport& report = selection.report;
  ASSERT_EQ(report.candidates.size(), 4u);
  EXPECT_EQ(report.candidates[2].backend, "gpu");
  EXPECT_FALSE(report.candidates[2].considered);
  EXPECT_EQ(report.candidates[2].reason, "kernel does not support current device cpu");

  // Forced by name it is considered (candidate_on only shapes the priority list) and rejected
  // with its class's reason; no fallback to slow.
  MoEConfig forced = moe;
  forced.moe_backend = "gpu";
  const std::string msg =
      error_message([&] { (void)ToyOracle(forced, registry_).select_backend(); });
  EXPECT_TRUE(contains(msg,
                       "Toy MoE backend 'gpu' does not support the deployment "
                       "configuration since kernel does not support current device cpu."))
      << msg;
  EXPECT_TRUE(contains(msg, "there is no fallback")) << msg;
  EXPECT_FALSE(contains(msg, "SlowExperts")) << msg;
}

TEST_F(ToyOracleTest, OnlyWhenForcedBackendServesByNameOnly) {
  FakeKind spare(cpu_caps("SpareExperts"));
  BackendRegistration spare_reg(toy_backend("spare", {spare.ptr()}), registry_);
  const MoEConfig moe = cpu_moe();
  // Auto: fast and slow have no kernel; the supported spare is never tried.
  const std::string msg = error_message([&] { (void)ToyOracle(moe, registry_).select_backend(); });
  EXPECT_TRUE(contains(msg, "(2 tried: ['fast', 'slow'])")) << msg;
  EXPECT_FALSE(contains(msg, "spare")) << msg;
  const OracleReport report = ToyOracle(moe, registry_).explain();
  EXPECT_FALSE(report.ok());
  ASSERT_EQ(report.candidates.size(), 3u);
  EXPECT_EQ(report.candidates[2].backend, "spare");
  EXPECT_TRUE(report.candidates[2].supported);
  EXPECT_FALSE(report.candidates[2].considered);

  // Forced through the config (case-insensitive) and through the environment.
  MoEConfig forced = moe;
  forced.moe_backend = "SPARE";
  auto selection = ToyOracle(forced, registry_).select_backend();
  EXPECT_EQ(selection.backend.name, "spare");
  EXPECT_TRUE(selection.backend.only_when_forced);
  EXPECT_EQ(selection.experts, spare.ptr());
  EXPECT_EQ(selection.forced_by, "config");
  EXPECT_TRUE(selection.rejections.empty());
  ScopedEnv env(kMoeBackendEnvVar, "spare");
  selection = ToyOracle(moe, registry_).select_backend();
  EXPECT_EQ(selection.backend.name, "spare");
  EXPECT_EQ(selection.forced_by, "env MOEKIT_MOE_BACKEND");
}

TEST_F(ToyOracleTest, ForcingAnAliasSwapsInTheBatchedVariant) {
  FakeKind fast(cpu_caps("FastExperts")),
      spare(cpu_caps("SpareExperts", ActivationFormat::kBatchedExperts));
  BackendRegistration fast_reg(toy_backend("fast", {fast.ptr()}), registry_);
  BackendRegistration spare_reg(toy_backend("spare", {spare.ptr()}), registry_);
  ToyOracle oracle(cpu_moe(), registry_);
  EXPECT_EQ(oracle.map_backend("QUICK"), "fast");
  EXPECT_EQ(oracle.batched_variant("fast"), std::optional<std::string>("spare"));
  EXPECT_EQ(oracle.batched_variant("slow"), std::nullopt);
  EXPECT_THROW((void)oracle.batched_variant("nonsense"), Error);

  // Standard format: forcing the alias gives fast itself.
  MoEConfig forced = cpu_moe();
  forced.moe_backend = "quick";
  EXPECT_EQ(ToyOracle(forced, registry_).select_backend().backend.name, "fast");
  // Batched format: its batched variant.
  MoEConfig batched = batched_moe();
  batched.moe_backend = "quick";
  const auto selection = ToyOracle(batched, registry_).select_backend();
  EXPECT_EQ(selection.backend.name, "spare");
  EXPECT_EQ(selection.experts, spare.ptr());
  EXPECT_EQ(selection.forced_by, "config");
}

TEST_F(ToyOracleTest, UnknownNamesListValidNamesAndAliases) {
  ToyOracle oracle(cpu_moe(), registry_);
  EXPECT_EQ(oracle.valid_names(), "auto, fast, slow, spare (aliases: quick -> fast)");
  EXPECT_EQ(error_message([&] { (void)oracle.map_backend("turbo"); }),
            "Unknown Toy MoE backend 'turbo'; valid names: auto, fast, slow, spare (aliases: "
            "quick -> fast)");
  EXPECT_EQ(error_message([&] { (void)oracle.backend("quick"); }),
            "Unknown Toy MoE backend 'quick'; valid names: auto, fast, slow, spare (aliases: "
            "quick -> fast)")
      << "backend() takes canonical names only";
  // A new registration shows up in the list at call time.
  ExpertsBackend extra = toy_backend("slow");
  extra.aliases = {"snail", "tortoise"};
  {
    BackendRegistration reg(extra, registry_);
    EXPECT_EQ(oracle.valid_names(),
              "auto, fast, slow, spare (aliases: quick -> fast, snail -> slow, tortoise -> slow)");
    EXPECT_EQ(oracle.map_backend("Tortoise"), "slow");
  }
  EXPECT_THROW((void)oracle.map_backend("tortoise"), Error);
  // Requested by config and by the environment: the source is named.
  MoEConfig moe = cpu_moe();
  moe.moe_backend = "turbo";
  const std::string cfg = error_message([&] { (void)ToyOracle(moe, registry_).select_backend(); });
  EXPECT_EQ(cfg,
            "Unknown Toy MoE backend 'turbo'; valid names: auto, fast, slow, spare (aliases: "
            "quick -> fast) (requested by config)");
  ScopedEnv env(kMoeBackendEnvVar, "warp");
  const std::string from_env = error_message([&] { (void)oracle.select_backend(); });
  EXPECT_TRUE(contains(from_env, "'warp'")) << from_env;
  EXPECT_TRUE(contains(from_env, "(requested by env MOEKIT_MOE_BACKEND)")) << from_env;
}

// ---- one pass, one answer
// -----------------------------------------------------------------------------------

TEST_F(OracleTest, SelectionReportIsExplain) {
  // Auto, forced by config, forced through the environment, the batched format, and with an
  // injected class rejected first: the selection's table is explain()'s and decide()'s.
  std::vector<MoEConfig> deployments;
  deployments.push_back(cpu_moe());
  deployments.push_back(cpu_moe());
  deployments.back().moe_backend = "cpu_monolithic";
  deployments.push_back(batched_moe());
  MoEConfig on_cuda = cpu_moe();
  on_cuda.device = h200_info();
  on_cuda.moe_backend = "cpu";  // the CPU reference rejects the device: no selection
  for (const MoEConfig& moe : deployments) {
    UnquantizedMoEKernelOracle oracle(moe);
    const auto selection = oracle.select_backend();
    EXPECT_TRUE(same_report(selection.report, oracle.explain()));
    const auto decision = oracle.decide(/*log=*/false);
    ASSERT_TRUE(decision.selection.has_value());
    EXPECT_TRUE(same_report(selection.report, decision.report));
    EXPECT_EQ(decision.error, "");
    EXPECT_EQ(decision.selection->experts, selection.experts);
    EXPECT_EQ(decision.selection->rejections.size(), selection.rejections.size());
    EXPECT_EQ(selection.report.chosen_backend, selection.backend.name);
    EXPECT_EQ(selection.report.forced_by, selection.forced_by);
  }
  {
    ScopedEnv env(kMoeBackendEnvVar, "cpu_monolithic");
    UnquantizedMoEKernelOracle oracle(cpu_moe());
    const auto selection = oracle.select_backend();
    EXPECT_EQ(selection.forced_by, "env MOEKIT_MOE_BACKEND");
    EXPECT_TRUE(same_report(selection.report, oracle.explain()));
  }
  {
    ExpertsCapabilities caps = cpu_caps("GeluOnlyExperts");
    caps.activations = {Activation::kGelu};
    FakeKind rejected(caps);
    BackendRegistration reg(unquantized_prepending("cpu", rejected.ptr()));
    UnquantizedMoEKernelOracle oracle(cpu_moe());
    const auto selection = oracle.select_backend();
    ASSERT_EQ(selection.rejections.size(), 1u);
    EXPECT_TRUE(same_report(selection.report, oracle.explain()));
  }
  // No selection: the error select_backend throws is the table's.
  UnquantizedMoEKernelOracle failing(on_cuda);
  const std::string msg = error_message([&] { (void)failing.select_backend(); });
  const auto decision = failing.decide(/*log=*/false);
  EXPECT_FALSE(decision.selection.has_value());
  EXPECT_EQ(decision.error, msg);
  EXPECT_EQ(decision.report.error, msg);
  EXPECT_TRUE(same_report(decision.report, failing.explain()));
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

  // The oracle's make_kernel builds the selection's class through the same path.
  BackendRegistration reg(unquantized_prepending("cpu", fake.ptr()));
  UnquantizedMoEKernelOracle oracle(moe);
  const auto selection = oracle.select_backend();
  ASSERT_EQ(selection.experts, fake.ptr());
  auto via_oracle = oracle.make_kernel(QuantConfig::unquantized(), selection);
  EXPECT_EQ(via_oracle->prepare_finalize().name(), "PrepareFinalizeNoEP");
  EXPECT_EQ(&via_oracle->fused_experts().klass(), fake.ptr());
  EXPECT_EQ(fake.made, 2);
  // A selection without a class is refused.
  EXPECT_THROW((void)oracle.make_kernel(QuantConfig::unquantized(), MoEKernelOracle::Selection{}),
               Error);
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

// make_moe_kernel selects through the prepare/finalize registry: a deployment that exchanges
// tokens without a communicator is refused with the exchanging factory's reason; the megakernel
// deployment's pass-through refuses experts that do not exchange tokens themselves.
TEST_F(OracleTest, MakeMoeKernelRejectsUnavailableParallelDeployments) {
  FakeKind fake(cpu_caps("FakeStandardExperts"));
  for (All2AllBackend backend :
       {All2AllBackend::kNcclAllToAll, All2AllBackend::kNaive, All2AllBackend::kMegakernel}) {
    MoEConfig moe = cpu_moe();
    moe.parallel.use_ep = true;
    moe.parallel.dp_size = 2;
    moe.parallel.ep_size = 2;
    moe.parallel.all2all_backend = backend;
    moe.num_local_experts = 6;
    const std::string name(all2all_backend_name(backend));
    const std::string msg = error_message(
        [&] { (void)make_moe_kernel(QuantConfig::unquantized(), moe, fake.klass()); });
    if (backend == All2AllBackend::kMegakernel) {
      EXPECT_TRUE(contains(msg,
                           "passthrough: FakeStandardExperts does not exchange tokens itself "
                           "(only the megakernel experts do)"))
          << msg;
    } else {
      EXPECT_TRUE(contains(msg, "no prepare/finalize can serve")) << msg;
      EXPECT_TRUE(contains(msg, "needs a communicator of 2 ranks")) << msg;
    }
    EXPECT_TRUE(contains(msg, moe.parallel.to_string())) << msg;
    EXPECT_THROW((void)make_moe_kernel(QuantConfig::unquantized(), moe, fake.klass()), Error);
  }
  EXPECT_EQ(fake.made, 0);
}

// The megakernel deployment on Hopper: the unquantized oracle chooses the peer-memory experts
// (sm90_grouped refuses the deployment, and they refuse every other one) with the pass-through
// prepare/finalize, which hands the experts the communicator.
TEST_F(OracleTest, MegakernelDeploymentTakesThePeerMemoryExperts) {
  if constexpr (!kCudaBuild) GTEST_SKIP() << "built without CUDA (the sm90 classes refuse first)";
  MoEConfig moe = cpu_moe();
  moe.device = h200_info();
  moe.device.preview = true;
  moe.parallel = ParallelConfig::make(1, 2, 1, 0, true, All2AllBackend::kMegakernel);
  moe.num_local_experts = moe.num_experts / 2;
  PlanOptions options;
  options.preview = true;
  const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized(), options);
  ASSERT_TRUE(plan.ok()) << plan.to_string();
  EXPECT_EQ(plan.backend->name, "sm90_ep_peer");
  EXPECT_EQ(plan.experts->name(), "Sm90EpPeerExperts");
  EXPECT_EQ(plan.prepare_finalize->name, "passthrough");
  const std::string table = plan.to_string();
  EXPECT_TRUE(contains(table, "sm90_grouped")) << table;
  // Every other deployment: the peer-memory experts are refused for their parallel config.
  for (All2AllBackend other : {All2AllBackend::kNcclAllToAll, All2AllBackend::kNaive}) {
    moe.parallel = ParallelConfig::make(1, 2, 1, 0, true, other);
    const MoEPlan p = plan_moe(moe, QuantConfig::unquantized(), options);
    EXPECT_NE(p.backend ? p.backend->name : std::string(), "sm90_ep_peer");
  }
  moe.parallel = ParallelConfig{};
  moe.num_local_experts = moe.num_experts;
  EXPECT_EQ(plan_moe(moe, QuantConfig::unquantized(), options).backend->name, "sm90_grouped");
}

// The megakernel deployment's pass-through prepare/finalize: chosen for experts that exchange
// tokens themselves, given a communicator of ep_size ranks at this rank; the kernel hands that
// communicator to the experts when it is assembled, and runs them on an idle rank (M = 0) too.
TEST_F(OracleTest, PassThroughHandsTheCommunicatorToTheExperts) {
  ExpertsCapabilities caps = cpu_caps("FakePeerExperts");
  caps.parallel.requires_ep = true;
  caps.parallel.all2all_backends = {All2AllBackend::kMegakernel};
  FakeKind peer(caps);
  MoEConfig moe = cpu_moe();
  moe.parallel = ParallelConfig::make(1, 2, 1, 0, true, All2AllBackend::kMegakernel);
  moe.num_local_experts = moe.num_experts / 2;
  const QuantConfig quant = QuantConfig::unquantized();
  auto choose = [&](Communicator* comm) {
    return select_prepare_finalize(PrepareFinalizeRequest{&moe, &quant, &peer.klass(), comm});
  };
  const PrepareFinalizeSelection none = choose(nullptr);
  EXPECT_FALSE(none.chosen.has_value());
  EXPECT_TRUE(contains(none.report.error, "passthrough: needs a communicator of 2 ranks"))
      << none.report.error;
  NamedCommunicator rank0(0, 2);
  const PrepareFinalizeSelection wrong = choose(&rank0);
  EXPECT_TRUE(
      contains(wrong.report.error,
               "the named communicator is rank 0 of 2 but the deployment is EP rank 1 of 2"))
      << wrong.report.error;

  NamedCommunicator comm(1, 2);
  const PrepareFinalizeSelection sel = choose(&comm);
  ASSERT_TRUE(sel.chosen.has_value()) << sel.report.to_string();
  EXPECT_EQ(sel.chosen->name, "passthrough");
  const auto pf = sel.chosen->make(PrepareFinalizeRequest{&moe, &quant, &peer.klass(), &comm});
  EXPECT_EQ(pf->name(), "PrepareFinalizePassThrough");
  EXPECT_TRUE(pf->output_is_reduced());
  EXPECT_EQ(pf->communicator(), &comm);
  EXPECT_EQ(pf->max_dispatched_tokens(8), 16);

  const auto kernel = make_moe_kernel(quant, moe, peer.klass(), nullptr, {}, &comm);
  EXPECT_EQ(dynamic_cast<const FakeExperts&>(kernel->fused_experts()).bound, &comm);
  // An idle rank still runs the experts (FakeExperts::apply says it ran by throwing).
  const int64_t K = moe.hidden_dim, I = moe.intermediate_size, E = moe.num_local_experts;
  ModularApplyArgs args;
  args.hidden_states = Tensor::empty({0, K}, DType::kBF16);
  args.w1 = Tensor::empty({E, 2 * I, K}, DType::kBF16);
  args.w2 = Tensor::empty({E, K, I}, DType::kBF16);
  args.topk_ids = Tensor::empty({0, moe.experts_per_token}, DType::kInt32);
  args.topk_weights = Tensor::empty({0, moe.experts_per_token}, DType::kF32);
  args.global_num_experts = moe.num_experts;
  const std::string ran = error_message([&] { (void)kernel->apply(args, {}); });
  EXPECT_TRUE(contains(ran, "FakeExperts never runs")) << ran;
}

// What select_prepare_finalize builds for experts of `klass` (throws its error when none fits).
std::unique_ptr<PrepareFinalize> make_prepare_finalize(const MoEConfig& moe,
                                                       const ExpertsClass& klass,
                                                       PrepareFinalizeReport* report = nullptr) {
  const QuantConfig quant = QuantConfig::unquantized();
  const PrepareFinalizeRequest request{&moe, &quant, &klass, nullptr};
  const PrepareFinalizeSelection selection = select_prepare_finalize(request);
  if (report) *report = selection.report;
  if (!selection.chosen) throw Error(selection.report.error);
  EXPECT_EQ(selection.report.chosen, selection.chosen->name);
  return selection.chosen->make(request);
}

const PrepareFinalizeReport::Candidate* find_candidate(const PrepareFinalizeReport& report,
                                                       const std::string& name) {
  for (const auto& c : report.candidates) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// The prepare/finalize factories (select_prepare_finalize), keyed by dispatch_key(parallel).
TEST_F(OracleTest, PrepareFinalizeChoice) {
  const MoEConfig moe = cpu_moe();
  FakeKind standard(cpu_caps("FakeStandardExperts"));
  FakeKind batched(cpu_caps("FakeBatchedExperts", ActivationFormat::kBatchedExperts));
  ExpertsCapabilities batched_mono_caps =
      cpu_caps("FakeBatchedMonolithicExperts", ActivationFormat::kBatchedExperts);
  batched_mono_caps.monolithic = true;
  FakeKind batched_mono(batched_mono_caps);

  PrepareFinalizeReport report;
  EXPECT_EQ(make_prepare_finalize(moe, standard.klass(), &report)->name(), "PrepareFinalizeNoEP");
  EXPECT_EQ(report.key, "no token exchange");
  EXPECT_EQ(report.chosen, "no_ep");
  const auto* local = find_candidate(report, "batched_local");
  ASSERT_NE(local, nullptr) << report.to_string();
  EXPECT_FALSE(local->supported);
  EXPECT_EQ(local->reason, "FakeStandardExperts takes the standard format");
  EXPECT_TRUE(contains(report.to_string(), "chosen: no_ep")) << report.to_string();

  auto mono = make_prepare_finalize(moe, CpuReferenceMonolithicExperts::klass());
  EXPECT_EQ(mono->name(), "PrepareFinalizeMonolithicNoEP");
  EXPECT_TRUE(mono->is_monolithic());
  EXPECT_EQ(make_prepare_finalize(moe, batched.klass(), &report)->name(), "PrepareFinalizeBatched");
  EXPECT_EQ(report.chosen, "batched_local");
  ASSERT_NE(find_candidate(report, "no_ep"), nullptr);
  EXPECT_EQ(find_candidate(report, "no_ep")->reason, "FakeBatchedExperts takes the batched format");
  // Monolithic experts on the batched format: nothing fits, every reason is given.
  const std::string mono_msg =
      error_message([&] { (void)make_prepare_finalize(moe, batched_mono.klass()); });
  EXPECT_TRUE(contains(mono_msg, "no prepare/finalize can serve")) << mono_msg;
  EXPECT_TRUE(contains(mono_msg, "no_ep: FakeBatchedMonolithicExperts takes the batched format"))
      << mono_msg;
  EXPECT_TRUE(contains(mono_msg, "batched_local: monolithic experts take the standard format"))
      << mono_msg;
  EXPECT_THROW((void)make_prepare_finalize(moe, batched_mono.klass()), Error);
  // The batched P/F needs max_num_tokens.
  MoEConfig no_tokens = moe;
  no_tokens.max_num_tokens = 0;
  EXPECT_TRUE(
      contains(error_message([&] { (void)make_prepare_finalize(no_tokens, batched.klass()); }),
               "needs max_num_tokens > 0 and num_local_experts > 0 (got 0 and 12)"));
  // TP=2 without DP, and EP inside one DP group: no dispatch, NoEP.
  MoEConfig tp = moe;
  tp.parallel.tp_size = 2;
  EXPECT_EQ(dispatch_key(tp.parallel), std::nullopt);
  EXPECT_EQ(make_prepare_finalize(tp, standard.klass())->name(), "PrepareFinalizeNoEP");
  MoEConfig ep = moe;
  ep.parallel.use_ep = true;
  ep.parallel.ep_size = 2;
  EXPECT_EQ(dispatch_key(ep.parallel), std::nullopt);
  EXPECT_EQ(make_prepare_finalize(ep, standard.klass())->name(), "PrepareFinalizeNoEP");
  // The batched-format parallel config (DP+EP over the low-latency all-to-all) needs communication
  // between ranks: without a communicator it is refused clearly rather than scattering only this
  // rank's tokens.
  const MoEConfig ll = batched_moe();
  EXPECT_EQ(dispatch_key(ll.parallel),
            std::optional<All2AllBackend>(All2AllBackend::kBatchedLowLatency));
  const std::string msg =
      error_message([&] { (void)make_prepare_finalize(ll, batched.klass(), &report); });
  EXPECT_TRUE(contains(msg, "batched_low_latency: needs a communicator of")) << msg;
  EXPECT_EQ(report.key, "batched_low_latency");
  EXPECT_EQ(report.chosen, "");
  ASSERT_NE(find_candidate(report, "batched_local"), nullptr);
  EXPECT_EQ(find_candidate(report, "batched_local")->reason,
            "serves deployments that exchange no tokens, not batched_low_latency");
  EXPECT_EQ(batched.made, 0);
  // One rank whose experts want the batched format: the local batched P/F with this rank's range.
  MoEConfig one_rank = cpu_moe();
  one_rank.num_local_experts = 6;
  auto batched_pf = make_prepare_finalize(one_rank, batched.klass());
  const auto* b = dynamic_cast<const PrepareFinalizeBatched*>(batched_pf.get());
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

// The CPU backends keep the standard layout (layout_for is nullopt), and so does the plan built
// on them.
TEST_F(OracleTest, CpuBackendsKeepTheStandardLayout) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  for (const char* name : {"cpu", "cpu_batched", "cpu_monolithic"}) {
    EXPECT_FALSE(oracle.backend(name).layout_for(moe).has_value()) << name;
  }
  const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized(), PlanOptions{.log = false});
  ASSERT_TRUE(plan.ok()) << plan.error();
  ASSERT_TRUE(plan.backend.has_value());
  EXPECT_EQ(plan.backend->name, "cpu");
  EXPECT_FALSE(plan.weight_layout.has_value());
  EXPECT_TRUE(same_report(plan.experts_report, oracle.explain()));
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
  BackendRegistration reg(unquantized_with("sm90_grouped", {cuda.ptr()}));

  const OracleReport report = oracle.explain();
  EXPECT_EQ(report.oracle_name, "Unquantized");
  EXPECT_TRUE(report.ok()) << report.error;
  EXPECT_EQ(report.chosen_backend, "cpu");
  EXPECT_EQ(report.chosen_experts, "CpuReferenceExperts");
  EXPECT_EQ(report.forced_by, "");
  // Considered backends first (cpu, cpu_batched, cpu_monolithic), then the rest in registry order.
  ASSERT_EQ(report.candidates.size(), 6u);
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
  EXPECT_EQ(report.candidates[3].backend, "sm90_ep_peer");
  EXPECT_FALSE(report.candidates[3].considered);
  EXPECT_EQ(report.candidates[4].backend, "sm90_grouped");
  EXPECT_EQ(report.candidates[4].experts_class, "FakeSm90Experts");
  EXPECT_FALSE(report.candidates[4].supported);
  EXPECT_FALSE(report.candidates[4].considered);
  EXPECT_EQ(report.candidates[4].reason, "kernel does not support current device cpu");
  EXPECT_EQ(report.candidates[5].backend, "sm90_batched");
  EXPECT_EQ(report.candidates[5].experts_class, "Sm90BatchedExperts");
  EXPECT_EQ(report.candidates[5].reason, "kernel does not support current device cpu");
  const std::string table = report.to_string();
  EXPECT_TRUE(contains(table, "CHOSEN")) << table;
  EXPECT_TRUE(contains(table, "kernel does not support current device cpu")) << table;
  EXPECT_EQ(cuda.made, 0);
}

TEST_F(OracleTest, ExplainNeverThrowsForUnsupportedOrUnknown) {
  MoEConfig moe = cpu_moe();
  moe.moe_backend = "sm90_grouped";
  UnquantizedMoEKernelOracle oracle(moe);
  OracleReport report;
  {
    LogCapture logs;
    EXPECT_NO_THROW(report = oracle.explain());
    EXPECT_EQ(logs.dump(), "") << "explain logs nothing";
  }
  // The same error select_backend throws.
  EXPECT_EQ(report.error, error_message([&] { (void)oracle.select_backend(); }));
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
  UnquantizedMoEKernelOracle unknown(moe);
  EXPECT_NO_THROW(report = unknown.explain());
  EXPECT_FALSE(report.ok());
  EXPECT_TRUE(contains(report.error, "Unknown Unquantized MoE backend 'nonsense'")) << report.error;
  EXPECT_EQ(report.error, error_message([&] { (void)unknown.select_backend(); }));

  ScopedEnv env(kMoeBackendEnvVar, "cpu");
  report = UnquantizedMoEKernelOracle(cpu_moe()).explain();
  EXPECT_TRUE(report.ok()) << report.error;
  EXPECT_EQ(report.forced_by, "env MOEKIT_MOE_BACKEND");
  EXPECT_EQ(report.chosen_backend, "cpu");
}

// ---- forcing
// -------------------------------------------------------------------------------------

TEST_F(OracleTest, ForcedUnsupportedBackendThrowsAndNeverFallsBack) {
  MoEConfig moe = cpu_moe();
  moe.moe_backend = "sm90_grouped";
  UnquantizedMoEKernelOracle oracle(moe);
  // First with no kernel at the forced backend at all.
  std::optional<BackendRegistration> empty_sm90;
  empty_sm90.emplace(unquantized_with("sm90_grouped", {}));
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
    EXPECT_TRUE(contains(msg, "there is no fallback")) << msg;
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
  BackendRegistration reg(unquantized_with("sm90_grouped", {cuda.ptr()}));
  const std::string msg = error_message([&] { (void)oracle.select_backend(); });
  EXPECT_TRUE(contains(msg,
                       "\n  sm90_grouped / FakeSm90Experts: kernel does not support current "
                       "device cpu"))
      << msg;

  // Forcing the batched CPU backend on a standard-format deployment is rejected, not mapped back.
  moe.moe_backend = "cpu_batched";
  UnquantizedMoEKernelOracle batched(moe);
  const std::string batched_msg = error_message([&] { (void)batched.select_backend(); });
  EXPECT_TRUE(contains(batched_msg, "Unquantized MoE backend 'cpu_batched' does not support"))
      << batched_msg;
  EXPECT_TRUE(contains(batched_msg, "standard activation format")) << batched_msg;
  EXPECT_THROW((void)batched.select_backend(), UnsupportedError);
}

TEST_F(OracleTest, EnvVarForcesBackend) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  {
    BackendRegistration empty(unquantized_with("sm90_batched", {}));
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
    EXPECT_EQ(selection.backend.name, "cpu");
    EXPECT_EQ(selection.experts, &CpuReferenceExperts::klass());
    EXPECT_EQ(selection.forced_by, "env MOEKIT_MOE_BACKEND");
    EXPECT_TRUE(logs.has(log::Level::kInfo, "Using cpu Unquantized MoE backend.")) << logs.dump();
  }
  {
    // The config wins over the environment.
    ScopedEnv env(kMoeBackendEnvVar, "sm90_grouped");
    MoEConfig forced = moe;
    forced.moe_backend = "CPU";
    const auto selection = UnquantizedMoEKernelOracle(forced).select_backend();
    EXPECT_EQ(selection.backend.name, "cpu");
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
  EXPECT_EQ(oracle.map_backend("sm90_grouped"), "sm90_grouped");
  EXPECT_EQ(oracle.map_backend("sm90_batched"), "sm90_batched");
  EXPECT_EQ(oracle.map_backend("cpu"), "cpu");
  EXPECT_EQ(oracle.map_backend("cpu_batched"), "cpu_batched");
  EXPECT_EQ(oracle.map_backend("cpu_monolithic"), "cpu_monolithic");
  EXPECT_EQ(oracle.map_backend("cuda"), "sm90_grouped");
  EXPECT_EQ(oracle.map_backend("reference"), "cpu");
  EXPECT_EQ(oracle.map_backend("cpu_reference"), "cpu");

  const std::string msg = error_message([&] { (void)oracle.map_backend("triton"); });
  EXPECT_TRUE(contains(msg, "Unknown Unquantized MoE backend 'triton'")) << msg;
  for (const char* name : {"sm90_grouped", "sm90_batched", "cpu", "cpu_batched", "cpu_monolithic",
                           "cuda -> sm90_grouped", "reference -> cpu", "cpu_reference -> cpu"}) {
    EXPECT_TRUE(contains(msg, name)) << name << " missing from: " << msg;
  }
  EXPECT_THROW((void)oracle.map_backend("triton"), Error);

  moe.moe_backend = "triton";
  const std::string cfg_msg =
      error_message([&] { (void)UnquantizedMoEKernelOracle(moe).select_backend(); });
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
  EXPECT_EQ(oracle.make_log_backend("cpu"), "Using cpu Unquantized MoE backend.");
  EXPECT_EQ(oracle.make_log_backend("cpu", Names{"cpu", "cpu_batched"}),
            "Using cpu Unquantized MoE backend out of potential backends: ['cpu', 'cpu_batched'].");
  EXPECT_EQ(oracle.make_log_backend("sm90_grouped", Names{}, true),
            "Using sm90_grouped Unquantized MoE LoRA backend out of potential backends: [].");
  EXPECT_EQ(oracle.make_log_unsupported("cpu_batched", "kernel does not support LoRA"),
            "Unquantized MoE backend 'cpu_batched' does not support the deployment configuration "
            "since kernel does not support LoRA.");
  EXPECT_EQ(oracle.make_log_unsupported("cpu", ""),
            "Unquantized MoE backend 'cpu' does not support the deployment configuration.");
  EXPECT_EQ(oracle.make_log_unsupported("cpu", "x", true),
            "Unquantized MoE LoRA backend 'cpu' does not support the deployment configuration "
            "since x.");
}

TEST_F(OracleTest, SelectionEmitsSeedLogLines) {
  const MoEConfig moe = cpu_moe();
  UnquantizedMoEKernelOracle oracle(moe);
  ExpertsCapabilities gelu_only = cpu_caps("GeluOnlyExperts");
  gelu_only.activations = {Activation::kGelu};
  FakeKind gelu(gelu_only);
  BackendRegistration reg(unquantized_prepending("cpu", gelu.ptr()));
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
  // explain() and decide(false) log nothing.
  LogCapture quiet;
  (void)oracle.explain();
  (void)oracle.decide(/*log=*/false);
  EXPECT_EQ(quiet.dump(), "");
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
  BackendRegistration reg_b(unquantized_with("cpu_batched", {batched.ptr()}));
  BackendRegistration reg_s(unquantized_with("cpu", {standard.ptr()}));

  EXPECT_EQ(oracle.batched_variant("cpu"), std::optional<std::string>("cpu_batched"));
  EXPECT_EQ(oracle.batched_variant("sm90_grouped"), std::optional<std::string>("sm90_batched"));
  EXPECT_EQ(oracle.batched_variant("cpu_batched"), std::nullopt);
  EXPECT_EQ(oracle.batched_variant("sm90_batched"), std::nullopt);

  // Forced through the config: "cpu" becomes "cpu_batched".
  MoEConfig forced = moe;
  forced.moe_backend = "cpu";
  auto selection = UnquantizedMoEKernelOracle(forced).select_backend();
  EXPECT_EQ(selection.backend.name, "cpu_batched");
  EXPECT_EQ(selection.experts, batched.ptr());
  EXPECT_EQ(selection.forced_by, "config");
  // And through the environment.
  {
    ScopedEnv env(kMoeBackendEnvVar, "cpu");
    selection = oracle.select_backend();
    EXPECT_EQ(selection.backend.name, "cpu_batched");
    EXPECT_EQ(selection.forced_by, "env MOEKIT_MOE_BACKEND");
  }
  // "sm90_grouped" becomes "sm90_batched" (and fails there: its class rejects the CPU).
  forced.moe_backend = "sm90_grouped";
  const std::string msg =
      error_message([&] { (void)UnquantizedMoEKernelOracle(forced).select_backend(); });
  EXPECT_TRUE(contains(msg, "Unquantized MoE backend 'sm90_batched' does not support")) << msg;
  // Auto: the standard class is rejected for its format, the batched one wins.
  selection = oracle.select_backend();
  EXPECT_EQ(selection.backend.name, "cpu_batched");
  ASSERT_EQ(selection.rejections.size(), 1u);
  EXPECT_EQ(selection.rejections[0].experts, standard.ptr());
  EXPECT_TRUE(contains(selection.rejections[0].reason, "batched_experts activation format"))
      << selection.rejections[0].reason;
  EXPECT_EQ(batched.made + standard.made, 0);
}

}  // namespace
}  // namespace moekit
