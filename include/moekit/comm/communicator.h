// Communicator: how the ranks of an expert-parallel deployment exchange tokens. Implemented on
// existing engines — NCCL for GPU ranks, MPI for CPU ranks (and to bootstrap NCCL) — never on a
// home-made transport. Prepare/finalize implementations that move tokens between ranks take one
// (MoELayerOptions::communicator); single-rank deployments need none.
//
// Every collective is called by all ranks of the communicator in the same order. Tensors are
// contiguous and on device(); dtypes match between ranks. On a GPU communicator the operations are
// ordered on `stream` and never synchronise with the host (graph-capturable where the engine
// allows it); a CPU communicator completes them before returning.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/core/device.h"
#include "moekit/core/tensor.h"

namespace moekit {

// A collective in flight (Communicator::all_to_all_v_start): wait() completes it; calling it again
// does nothing. The buffers must stay alive and untouched until then. Destroying a pending
// collective waits for it.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::string name() const = 0;  // "single", "nccl", "mpi"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual Device device() const = 0;  // where the buffers live

  // recv (world_size * n, ...) = the ranks' send (n, ...) in rank order.
  virtual void all_gather(const Tensor& send, Tensor& recv, Stream stream) = 0;
  // recv (n, ...) = the sum over ranks of their send (world_size * n, ...)'s block `rank`.
  virtual void reduce_scatter(const Tensor& send, Tensor& recv, Stream stream) = 0;
  // inout = the sum over ranks of inout.
  virtual void all_reduce(Tensor& inout, Stream stream) = 0;
  // Rows (dim 0) [offset_r, offset_r + send_counts[r]) of send go to rank r, which receives them
  // at rows [recv offset of this rank, + recv_counts[this rank]) of its recv; offsets are the
  // prefix sums of the counts. Counts are known on the host.
  virtual void all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                            Tensor& recv, const std::vector<int64_t>& recv_counts,
                            Stream stream) = 0;
  // all_to_all_v started without waiting for it, so that work can overlap the transfer (the
  // async prepare/finalize's hook waits). Default: the synchronous call, returned completed.
  virtual std::unique_ptr<PendingCollective> all_to_all_v_start(
      const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
      const std::vector<int64_t>& recv_counts, Stream stream);
  // One int64 per rank, exchanged on the host (token counts): out[r] = rank r's value. Host
  // memory whatever device() is, so no stream is synchronised (a GPU communicator routes it
  // through its bootstrap transport).
  virtual std::vector<int64_t> all_gather_host(int64_t value) = 0;
  // One int64 from every rank to every rank, on the host (per-destination counts): send has
  // world_size() values, send[d] for rank d; out[r] = rank r's send[rank()]. Default: one
  // all_gather_host per destination; the MPI communicator makes it one MPI_Alltoall.
  virtual std::vector<int64_t> all_to_all_host(const std::vector<int64_t>& send);
  // Blocks until every rank has arrived (host side; orders nothing on a stream).
  virtual void barrier() = 0;
};

// A communicator of one rank: every collective is a local copy (or nothing). What a deployment
// without token exchange would use, and the reference the engines' tests compare with.
class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(Device device = Device::cpu()) : device_(device) {}

  std::string name() const override { return "single"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Device device() const override { return device_; }

  void all_gather(const Tensor& send, Tensor& recv, Stream stream) override;
  void reduce_scatter(const Tensor& send, Tensor& recv, Stream stream) override;
  void all_reduce(Tensor& inout, Stream stream) override;
  void all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                    const std::vector<int64_t>& recv_counts, Stream stream) override;
  std::vector<int64_t> all_gather_host(int64_t value) override { return {value}; }
  void barrier() override {}

 private:
  Device device_;
};

}  // namespace moekit
