// MpiCommunicator (comm/mpi.h) over MPI_COMM_WORLD. Rows (dim 0) travel as one contiguous MPI
// datatype each, so counts stay within MPI's int for any row size.
#include <mpi.h>

#include <fmt/format.h>

#include <climits>
#include <mutex>
#include <numeric>

#include "comm/collective_checks.h"
#include "moekit/comm/mpi.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

// One check for every MPI call: the failing call and MPI's own message.
void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("{} failed: {}", call, std::string(text, static_cast<size_t>(len))));
}
#define MOEKIT_MPI(call) mpi_check((call), #call)

// MPI is initialized once per process (by us, unless the program did) and finalized at exit when
// we initialized it.
class MpiRuntime {
 public:
  static void ensure() {
    static MpiRuntime runtime;
    (void)runtime;
  }

 private:
  MpiRuntime() {
    int initialized = 0;
    MOEKIT_MPI(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      MOEKIT_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      owned_ = true;
    }
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Finalize();
  }
  bool owned_ = false;
};

// A datatype of one row of t (freed with the object).
class RowType {
 public:
  explicit RowType(int64_t bytes) {
    MOEKIT_CHECK(bytes > 0 && bytes <= INT_MAX, "MPI rows of {} bytes: must be in [1, 2^31)",
                 bytes);
    MOEKIT_MPI(MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &type_));
    MOEKIT_MPI(MPI_Type_commit(&type_));
  }
  ~RowType() { MPI_Type_free(&type_); }
  RowType(const RowType&) = delete;
  RowType& operator=(const RowType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

MPI_Datatype sum_type(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    default:
      throw Error(
          fmt::format("{} of {}: MPI sums f32, f64, int32 and int64 (it has no {} sum); "
                      "convert to f32 first",
                      op, t.describe(), dtype_name(t.dtype())));
  }
}

int as_int(int64_t v, const char* what) {
  MOEKIT_CHECK(v >= 0 && v <= INT_MAX, "{}={} must be in [0, 2^31) for MPI", what, v);
  return static_cast<int>(v);
}

// One all_to_all_v's MPI arguments, checked; `row` is null when there is nothing to move.
struct AllToAllV {
  std::vector<int> sc, sd, rc, rd;
  std::unique_ptr<RowType> row;
  const void* send = nullptr;
  void* recv = nullptr;
};

// MPI wants non-null buffers even for zero counts on some implementations.
char g_empty_buffer = 0;

AllToAllV prepare_all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                               const Tensor& recv, const std::vector<int64_t>& recv_counts,
                               int world_size) {
  detail::check_all_to_all_v(send, send_counts, recv, recv_counts, world_size, Device::cpu());
  const size_t W = static_cast<size_t>(world_size);
  AllToAllV op;
  op.sc.resize(W);
  op.sd.resize(W);
  op.rc.resize(W);
  op.rd.resize(W);
  int64_t soff = 0, roff = 0;
  for (size_t r = 0; r < W; ++r) {
    op.sc[r] = as_int(send_counts[r], "all_to_all_v send count");
    op.rc[r] = as_int(recv_counts[r], "all_to_all_v recv count");
    op.sd[r] = as_int(soff, "all_to_all_v send offset");
    op.rd[r] = as_int(roff, "all_to_all_v recv offset");
    soff += send_counts[r];
    roff += recv_counts[r];
  }
  const int64_t rb = detail::row_bytes(send);
  if (rb == 0) return op;
  op.row = std::make_unique<RowType>(rb);
  op.send = send.numel() > 0 ? send.data() : &g_empty_buffer;
  op.recv = recv.numel() > 0 ? recv.data() : &g_empty_buffer;
  return op;
}

// MPI_Ialltoallv in flight; the request and the row datatype live until wait().
class PendingAllToAllV final : public PendingCollective {
 public:
  explicit PendingAllToAllV(std::unique_ptr<AllToAllV> op) : op_(std::move(op)) {}
  ~PendingAllToAllV() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void start() {
    if (!op_->row) return;
    MOEKIT_MPI(MPI_Ialltoallv(op_->send, op_->sc.data(), op_->sd.data(), op_->row->get(), op_->recv,
                              op_->rc.data(), op_->rd.data(), op_->row->get(), MPI_COMM_WORLD,
                              &request_));
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    MOEKIT_MPI(MPI_Wait(&request_, MPI_STATUS_IGNORE));
  }

 private:
  std::unique_ptr<AllToAllV> op_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MpiRuntime::ensure();
    MOEKIT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MOEKIT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  }

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  Device device() const override { return Device::cpu(); }

  void all_gather(const Tensor& send, Tensor& recv, Stream) override {
    detail::check_all_gather(send, recv, size_, Device::cpu());
    if (recv.numel() == 0) return;
    const RowType row(detail::row_bytes(send));
    const int n = as_int(send.size(0), "all_gather rows");
    MOEKIT_MPI(MPI_Allgather(send.data(), n, row.get(), recv.data(), n, row.get(), MPI_COMM_WORLD));
  }

  void reduce_scatter(const Tensor& send, Tensor& recv, Stream) override {
    detail::check_reduce_scatter(send, recv, size_, Device::cpu());
    const MPI_Datatype type = sum_type(send, "reduce_scatter");
    if (recv.numel() == 0) return;
    MOEKIT_MPI(MPI_Reduce_scatter_block(send.data(), recv.data(),
                                        as_int(recv.numel(), "reduce_scatter elements per rank"),
                                        type, MPI_SUM, MPI_COMM_WORLD));
  }

  void all_reduce(Tensor& inout, Stream) override {
    expect_device(inout, "inout", Device::cpu());
    expect_contiguous(inout, "inout");
    const MPI_Datatype type = sum_type(inout, "all_reduce");
    if (inout.numel() == 0) return;
    MOEKIT_MPI(MPI_Allreduce(MPI_IN_PLACE, inout.data(),
                             as_int(inout.numel(), "all_reduce elements"), type, MPI_SUM,
                             MPI_COMM_WORLD));
  }

  void all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts, Tensor& recv,
                    const std::vector<int64_t>& recv_counts, Stream) override {
    AllToAllV op = prepare_all_to_all_v(send, send_counts, recv, recv_counts, size_);
    if (!op.row) return;
    MOEKIT_MPI(MPI_Alltoallv(op.send, op.sc.data(), op.sd.data(), op.row->get(), op.recv,
                             op.rc.data(), op.rd.data(), op.row->get(), MPI_COMM_WORLD));
  }

  std::unique_ptr<PendingCollective> all_to_all_v_start(const Tensor& send,
                                                        const std::vector<int64_t>& send_counts,
                                                        Tensor& recv,
                                                        const std::vector<int64_t>& recv_counts,
                                                        Stream) override {
    auto op = std::make_unique<AllToAllV>(
        prepare_all_to_all_v(send, send_counts, recv, recv_counts, size_));
    auto pending = std::make_unique<PendingAllToAllV>(std::move(op));
    pending->start();
    return pending;
  }

  std::vector<int64_t> all_gather_host(int64_t value) override {
    std::vector<int64_t> out(static_cast<size_t>(size_));
    MOEKIT_MPI(MPI_Allgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, MPI_COMM_WORLD));
    return out;
  }

  std::vector<int64_t> all_to_all_host(const std::vector<int64_t>& send) override {
    MOEKIT_CHECK(static_cast<int>(send.size()) == size_,
                 "all_to_all_host over {} ranks: send holds {} values, needs one per rank", size_,
                 send.size());
    std::vector<int64_t> out(static_cast<size_t>(size_));
    MOEKIT_MPI(
        MPI_Alltoall(send.data(), 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, MPI_COMM_WORLD));
    return out;
  }

  void barrier() override { MOEKIT_MPI(MPI_Barrier(MPI_COMM_WORLD)); }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool mpi_available() {
  return true;
}
std::string mpi_unavailable_reason() {
  return "";
}

std::shared_ptr<Communicator> mpi_world_communicator() {
  static std::mutex mutex;
  static std::weak_ptr<Communicator> world;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto c = world.lock()) return c;
  auto c = std::make_shared<MpiCommunicator>();
  world = c;
  return c;
}

}  // namespace moekit
