#include "moekit/oracle/unquantized.h"

#include "core/elementwise.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/experts/sm90_experts.h"

namespace moekit {

KernelRegistry<UnquantizedMoeBackend>& UnquantizedMoEKernelOracle::registry() {
  // NOTE: the documented registry of this oracle (KernelRegistry guards it with its mutex).
  static KernelRegistry<UnquantizedMoeBackend> instance(
      KernelRegistry<UnquantizedMoeBackend>::Table{
          {UnquantizedMoeBackend::kSm90Grouped, {&Sm90GroupedExperts::klass()}},
          {UnquantizedMoeBackend::kSm90Batched, {&Sm90BatchedExperts::klass()}},
          {UnquantizedMoeBackend::kCpu, {&CpuReferenceExperts::klass()}},
          {UnquantizedMoeBackend::kCpuBatched, {&CpuBatchedReferenceExperts::klass()}},
          {UnquantizedMoeBackend::kCpuMonolithic, {&CpuReferenceMonolithicExperts::klass()}},
      });
  return instance;
}

std::vector<UnquantizedMoeBackend> UnquantizedMoEKernelOracle::backend_values() const {
  return {Backend::kSm90Grouped, Backend::kSm90Batched, Backend::kCpu, Backend::kCpuBatched,
          Backend::kCpuMonolithic};
}

std::string UnquantizedMoEKernelOracle::backend_name(Backend backend) const {
  switch (backend) {
    case Backend::kSm90Grouped:
      return "sm90_grouped";
    case Backend::kSm90Batched:
      return "sm90_batched";
    case Backend::kCpu:
      return "cpu";
    case Backend::kCpuBatched:
      return "cpu_batched";
    case Backend::kCpuMonolithic:
      return "cpu_monolithic";
  }
  return "unknown";
}

std::vector<std::pair<std::string, UnquantizedMoeBackend>>
UnquantizedMoEKernelOracle::backend_aliases() const {
  return {{"cuda", Backend::kSm90Grouped},
          {"reference", Backend::kCpu},
          {"cpu_reference", Backend::kCpu}};
}

std::vector<UnquantizedMoeBackend> UnquantizedMoEKernelOracle::priority_backends(
    const MoEConfig& moe_config) const {
  // NOTE: cpu_monolithic is last on purpose. On the CPU, routing inside the experts saves nothing:
  // it runs the same router and the same reference pipeline as cpu (bitwise the same result), so
  // it can only win when forced (MoEConfig::moe_backend or MOEKIT_MOE_BACKEND), which is what it
  // is for: exercising the monolithic path end to end. A GPU monolithic kernel, which fuses the
  // router into the experts' launch and does save work, would go first in the CUDA list instead.
  if (moe_config.device.type == DeviceType::kCUDA) {
    return {Backend::kSm90Grouped, Backend::kSm90Batched, Backend::kCpu, Backend::kCpuBatched,
            Backend::kCpuMonolithic};
  }
  return {Backend::kCpu, Backend::kCpuBatched, Backend::kCpuMonolithic};
}

std::optional<UnquantizedMoeBackend> UnquantizedMoEKernelOracle::batched_variant(
    Backend backend) const {
  switch (backend) {
    case Backend::kSm90Grouped:
      return Backend::kSm90Batched;
    case Backend::kCpu:
      return Backend::kCpuBatched;
    case Backend::kSm90Batched:
    case Backend::kCpuBatched:
      return std::nullopt;  // already batched
    case Backend::kCpuMonolithic:
      return std::nullopt;  // monolithic experts take the standard format only
  }
  return std::nullopt;
}

namespace {

bool uses_sm90_layout(UnquantizedMoeBackend backend, const MoEConfig& moe) {
  return (backend == UnquantizedMoeBackend::kSm90Grouped ||
          backend == UnquantizedMoeBackend::kSm90Batched) &&
         sm90_fuses_activation(moe);
}

Tensor interleaved_copy(const Tensor& t, bool pairwise) {
  if (t.device().is_cuda() && t.dim() == 2) {  // a bias: small, reorder on the host
    const Tensor host = t.to(Device::cpu());
    Tensor out = Tensor::empty(host.shape(), host.dtype());
    interleave_gate_up_blocks(out, host, pairwise, Stream{});
    return out.to(t.device());
  }
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  interleave_gate_up_blocks(out, t, pairwise, Stream{});
  return out;
}

}  // namespace

std::pair<Tensor, Tensor> UnquantizedMoEKernelOracle::convert_to_kernel_format(
    Backend backend, const MoEConfig& moe_config, Tensor w13, Tensor w2) const {
  if (!uses_sm90_layout(backend, moe_config)) return {std::move(w13), std::move(w2)};
  return {interleaved_copy(w13, moe_config.activation == Activation::kSwigluOai), std::move(w2)};
}

Tensor UnquantizedMoEKernelOracle::convert_w13_bias_to_kernel_format(Backend backend,
                                                                     const MoEConfig& moe_config,
                                                                     Tensor w13_bias) const {
  if (!w13_bias.defined() || !uses_sm90_layout(backend, moe_config)) return w13_bias;
  return interleaved_copy(w13_bias, moe_config.activation == Activation::kSwigluOai);
}

}  // namespace moekit
