// NcclCommunicator (comm/nccl.h): NCCL collectives on device buffers, bootstrapped and helped on
// the host by a host communicator of the same ranks. Data movement goes as bytes (ncclUint8), so
// every dtype moves; sums use the dtype's NCCL type.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include <fmt/format.h>

#include <mutex>

#include "comm/collective_checks.h"
#include "moekit/comm/mpi.h"
#include "moekit/comm/nccl.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

void nccl_check(ncclResult_t rc, const char* call, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) return;
  std::string detail = ncclGetErrorString(rc);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') detail += std::string(": ") + last;
  }
  throw Error(fmt::format("{} failed: {}", call, detail));
}
#define MOEKIT_NCCL(call) nccl_check((call), #call, comm_)

void cuda_check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) throw Error(fmt::format("{} failed: {}", call, cudaGetErrorString(rc)));
}
#define MOEKIT_CUDA_RT(call) cuda_check((call), #call)

ncclDataType_t sum_type(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    default:
      throw Error(fmt::format("{} of {}: NCCL sums f32, f64, f16, bf16, int32 and int64, not {}",
                              op, t.describe(), dtype_name(t.dtype())));
  }
}

cudaStream_t as_cuda(Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> host, int device_index) : host_(std::move(host)) {
    MOEKIT_CHECK(host_ != nullptr && host_->device().is_cpu(),
                 "the NCCL communicator needs a host communicator with CPU buffers (MPI, or "
                 "SingleRankCommunicator for one rank)");
    rank_ = host_->rank();
    size_ = host_->world_size();
    int devices = 0;
    MOEKIT_CUDA_RT(cudaGetDeviceCount(&devices));
    MOEKIT_CHECK(devices > 0, "the NCCL communicator needs a GPU; none is visible");
    device_ = device_index >= 0 ? device_index : rank_ % devices;
    MOEKIT_CHECK(device_ < devices, "NCCL communicator: GPU {} requested but {} are visible",
                 device_, devices);
    MOEKIT_CUDA_RT(cudaSetDevice(device_));
    // Rank 0's unique id to every rank, through the host communicator (an all-gather of which
    // every rank keeps block 0).
    ncclUniqueId id{};
    if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    constexpr int64_t kIdBytes = sizeof(ncclUniqueId);
    Tensor mine = Tensor::zeros({1, kIdBytes}, DType::kUInt8);
    std::memcpy(mine.data(), &id, sizeof(id));
    Tensor all = Tensor::empty({size_, kIdBytes}, DType::kUInt8);
    host_->all_gather(mine, all, Stream{});
    std::memcpy(&id, all.data(), sizeof(id));
    nccl_check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  Device device() const override { return Device::cuda(device_); }

  void all_gather(const Tensor& send, Tensor& recv, Stream stream) override {
    detail::check_all_gather(send, recv, size_, device());
    if (recv.numel() == 0) return;
    MOEKIT_NCCL(
        ncclAllGather(send.data(), recv.data(), send.nbytes(), ncclUint8, comm_, as_cuda(stream)));
  }

  void reduce_scatter(const Tensor& send, Tensor& recv, Stream stream) override {
    detail::check_reduce_scatter(send, recv, size_, device());
    const ncclDataType_t type = sum_type(send, "reduce_scatter");
    if (recv.numel() == 0) return;
    MOEKIT_NCCL(ncclReduceScatter(send.data(), recv.data(), static_cast<size_t>(recv.numel()), type,
                                  ncclSum, comm_, as_cuda(stream)));
  }

  void all_reduce(Tensor& inout, Stream stream) override {
    expect_device(inout, "inout", device());
    expect_contiguous(inout, "inout");
    const ncclDataType_t type = sum_type(inout, "all_reduce");
    if (inout.numel() == 0) return;
    MOEKIT_NCCL(ncclAllReduce(inout.data(), inout.data(), static_cast<size_t>(inout.numel()), type,
                              ncclSum, comm_, as_cuda(stream)));
  }

  void all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                    const std::vector<int64_t>& recv_counts, Stream stream) override {
    const auto [sent, received] =
        detail::check_all_to_all_v(send, send_counts, recv, recv_counts, size_, device());
    const int64_t rb = detail::row_bytes(send);
    if (rb == 0 || (sent == 0 && received == 0)) return;
    const auto* sp = static_cast<const char*>(send.data());
    auto* rp = static_cast<char*>(recv.data());
    MOEKIT_NCCL(ncclGroupStart());
    int64_t soff = 0, roff = 0;
    for (int r = 0; r < size_; ++r) {
      const size_t s = static_cast<size_t>(r);
      if (send_counts[s] > 0) {
        MOEKIT_NCCL(ncclSend(sp + soff * rb, static_cast<size_t>(send_counts[s] * rb), ncclUint8, r,
                             comm_, as_cuda(stream)));
      }
      if (recv_counts[s] > 0) {
        MOEKIT_NCCL(ncclRecv(rp + roff * rb, static_cast<size_t>(recv_counts[s] * rb), ncclUint8, r,
                             comm_, as_cuda(stream)));
      }
      soff += send_counts[s];
      roff += recv_counts[s];
    }
    MOEKIT_NCCL(ncclGroupEnd());
  }

  std::vector<int64_t> all_gather_host(int64_t value) override {
    return host_->all_gather_host(value);
  }
  std::vector<int64_t> all_to_all_host(const std::vector<int64_t>& send) override {
    return host_->all_to_all_host(send);
  }
  void barrier() override { host_->barrier(); }

 private:
  std::shared_ptr<Communicator> host_;  // bootstrap, counts, barrier
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
};

}  // namespace

bool nccl_available() {
  return true;
}
std::string nccl_unavailable_reason() {
  return "";
}

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> host,
                                                     int device_index) {
  return std::make_shared<NcclCommunicator>(std::move(host), device_index);
}

std::shared_ptr<Communicator> nccl_world_communicator(int device_index) {
  static std::mutex mutex;
  static std::weak_ptr<Communicator> world;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto c = world.lock()) return c;
  auto c = make_nccl_communicator(mpi_world_communicator(), device_index);
  world = c;
  return c;
}

}  // namespace moekit
