#include <fmt/format.h>

#include "comm/collective_checks.h"
#include "moekit/comm/communicator.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

class CompletedCollective final : public PendingCollective {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<PendingCollective> Communicator::all_to_all_v_start(
    const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
    const std::vector<int64_t>& recv_counts, Stream stream) {
  all_to_all_v(send, send_counts, recv, recv_counts, stream);
  return std::make_unique<CompletedCollective>();
}

std::vector<int64_t> Communicator::all_to_all_host(const std::vector<int64_t>& send) {
  MOEKIT_CHECK(static_cast<int64_t>(send.size()) == world_size(),
               "all_to_all_host over {} ranks: send holds {} values, needs one per rank",
               world_size(), send.size());
  std::vector<int64_t> out;
  for (int d = 0; d < world_size(); ++d) {
    std::vector<int64_t> to_d = all_gather_host(send[static_cast<size_t>(d)]);
    if (d == rank()) out = std::move(to_d);
  }
  return out;
}

void SingleRankCommunicator::all_gather(const Tensor& send, Tensor& recv, Stream stream) {
  detail::check_collective_pair(send, recv, device_, "all_gather");
  MOEKIT_CHECK(send.shape() == recv.shape(),
               "all_gather over 1 rank: recv {} must have the shape of send {}", recv.describe(),
               send.describe());
  if (send.data() != recv.data()) recv.copy_from_async(send, stream);
}

void SingleRankCommunicator::reduce_scatter(const Tensor& send, Tensor& recv, Stream stream) {
  all_gather(send, recv, stream);  // one rank: the sum of one block is the block
}

void SingleRankCommunicator::all_reduce(Tensor& inout, Stream) {
  expect_device(inout, "inout", device_);
}

void SingleRankCommunicator::all_to_all_v(const Tensor& send,
                                          const std::vector<int64_t>& send_counts, Tensor& recv,
                                          const std::vector<int64_t>& recv_counts, Stream stream) {
  detail::check_collective_pair(send, recv, device_, "all_to_all_v");
  MOEKIT_CHECK(send_counts.size() == 1 && recv_counts.size() == 1,
               "all_to_all_v over 1 rank needs one count each, got {} and {}", send_counts.size(),
               recv_counts.size());
  MOEKIT_CHECK(send_counts[0] == recv_counts[0] && send_counts[0] >= 0 && send.dim() >= 1 &&
                   recv.dim() >= 1 && send_counts[0] <= send.size(0) &&
                   recv_counts[0] <= recv.size(0),
               "all_to_all_v over 1 rank: send_counts[0]={} and recv_counts[0]={} must be equal "
               "and fit send {} and recv {}",
               send_counts[0], recv_counts[0], send.describe(), recv.describe());
  if (send_counts[0] == 0) return;
  Tensor dst = recv.slice(0, 0, recv_counts[0]);
  dst.copy_from_async(send.slice(0, 0, send_counts[0]), stream);
}

}  // namespace moekit
