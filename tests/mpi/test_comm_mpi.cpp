// The MPI communicator (comm/mpi.h) under mpirun with 2 and 4 processes (ctest labels mpi): every
// collective against closed-form values of what each rank sent (rank and row encoded in the
// value), uneven and zero counts, every dtype for data movement, the sums' dtypes, and bad
// arguments refused on every rank before any MPI call (no hang).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "moekit/comm/mpi.h"
#include "moekit/core/half.h"
#include "testing.h"

namespace moekit {
namespace {

std::shared_ptr<Communicator> world() {
  if (!mpi_available()) return nullptr;
  return mpi_world_communicator();
}

#define REQUIRE_MPI()                                  \
  std::shared_ptr<Communicator> comm = world();        \
  if (!comm) GTEST_SKIP() << mpi_unavailable_reason(); \
  const int R = comm->rank(), W = comm->world_size();  \
  (void)R;                                             \
  (void)W

// A value that names its sender and place: rank r, row i, column j.
float value(int r, int64_t i, int64_t j) {
  return static_cast<float>(1000 * r + 10 * i + j);
}

TEST(MpiComm, WorldIsTheJob) {
  REQUIRE_MPI();
  EXPECT_EQ(comm->name(), "mpi");
  EXPECT_GE(W, 1);
  EXPECT_GE(R, 0);
  EXPECT_LT(R, W);
  EXPECT_EQ(comm->device(), Device::cpu());
  EXPECT_EQ(mpi_world_communicator().get(), comm.get());  // one per process
  comm->barrier();
}

TEST(MpiComm, AllGatherMovesEveryDtypeInRankOrder) {
  REQUIRE_MPI();
  for (const DType dt : {DType::kF32, DType::kBF16, DType::kInt32, DType::kUInt8}) {
    SCOPED_TRACE(dtype_name(dt));
    for (const int64_t n : {0, 1, 5}) {
      std::vector<float> v;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < 3; ++j)
          v.push_back(dt == DType::kUInt8 ? static_cast<float>((R * 7 + i * 3 + j) % 200)
                                          : value(R, i, j));
      const Tensor send = Tensor::from_floats(v, {n, 3}, DType::kF32).to_dtype(dt);
      Tensor recv = testing::poisoned({W * n, 3}, dt);
      comm->all_gather(send, recv, Stream{});
      const std::vector<float> got = recv.to_float_vector();
      for (int r = 0; r < W; ++r)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < 3; ++j) {
            const float want = dt == DType::kUInt8 ? static_cast<float>((r * 7 + i * 3 + j) % 200)
                                                   : value(r, i, j);
            // bf16 holds these integers up to 256 exactly; compare after the same rounding.
            const float w = Tensor::from_floats(std::vector<float>{want}, {1}, DType::kF32)
                                .to_dtype(dt)
                                .to_float_vector()[0];
            ASSERT_EQ(got[static_cast<size_t>((r * n + i) * 3 + j)], w)
                << "from rank " << r << " row " << i;
          }
    }
  }
}

TEST(MpiComm, ReduceScatterAndAllReduceSum) {
  REQUIRE_MPI();
  const int64_t n = 4;
  for (const DType dt : {DType::kF32, DType::kF64, DType::kInt32, DType::kInt64}) {
    SCOPED_TRACE(dtype_name(dt));
    // Rank r sends, for block b, rows whose values are (r + 1) * (b * 100 + i * 2 + j).
    std::vector<float> v;
    for (int b = 0; b < W; ++b)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < 2; ++j)
          v.push_back(static_cast<float>((R + 1) * (b * 100 + i * 2 + j)));
    const Tensor send = Tensor::from_floats(v, {W * n, 2}, DType::kF32).to_dtype(dt);
    Tensor recv = testing::poisoned({n, 2}, dt);
    comm->reduce_scatter(send, recv, Stream{});
    const double ranks_sum = W * (W + 1) / 2.0;  // sum over r of (r + 1)
    const std::vector<float> got = recv.to_float_vector();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < 2; ++j)
        EXPECT_EQ(got[static_cast<size_t>(i * 2 + j)], ranks_sum * (R * 100 + i * 2 + j));
    Tensor all = Tensor::from_floats(std::vector<float>{1.0f * (R + 1), 2.0f}, {2}, DType::kF32)
                     .to_dtype(dt);
    comm->all_reduce(all, Stream{});
    EXPECT_EQ(all.to_float_vector(), (std::vector<float>{static_cast<float>(ranks_sum), 2.0f * W}));
  }
}

TEST(MpiComm, AllToAllVUnevenAndEmptyCounts) {
  REQUIRE_MPI();
  // Rank r sends (r + d) % 3 rows to rank d: some pairs send nothing.
  auto count = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
  std::vector<int64_t> sc(static_cast<size_t>(W)), rc(static_cast<size_t>(W));
  std::vector<float> v;
  for (int d = 0; d < W; ++d) {
    sc[static_cast<size_t>(d)] = count(R, d);
    rc[static_cast<size_t>(d)] = count(d, R);
    for (int64_t i = 0; i < count(R, d); ++i)
      for (int64_t j = 0; j < 2; ++j)
        v.push_back(value(R, 100 * d + i, j));  // sender R, for d, its i-th row
  }
  int64_t total_recv = 0;
  for (int64_t c : rc)
    total_recv += c;
  const Tensor send = Tensor::from_floats(v, {static_cast<int64_t>(v.size() / 2), 2}, DType::kF32);
  Tensor recv = testing::poisoned({total_recv + 1, 2}, DType::kF32);  // one spare row
  comm->all_to_all_v(send, sc, recv, rc, Stream{});
  const std::vector<float> got = recv.to_float_vector();
  int64_t row = 0;
  for (int s = 0; s < W; ++s)
    for (int64_t i = 0; i < count(s, R); ++i, ++row)
      for (int64_t j = 0; j < 2; ++j)
        ASSERT_EQ(got[static_cast<size_t>(row * 2 + j)], value(s, 100 * R + i, j))
            << "row " << row << " from rank " << s;
  EXPECT_TRUE(std::isnan(got[static_cast<size_t>(row * 2)])) << "the spare row was written";
}

// Host counts: rank r sends 100 r + d to rank d; rank d receives 100 r + d from each r.
TEST(MpiComm, AllToAllHostMovesOneValuePerPair) {
  REQUIRE_MPI();
  std::vector<int64_t> send;
  for (int d = 0; d < W; ++d)
    send.push_back(100 * R + d);
  const std::vector<int64_t> got = comm->all_to_all_host(send);
  ASSERT_EQ(got.size(), static_cast<size_t>(W));
  for (int r = 0; r < W; ++r)
    EXPECT_EQ(got[static_cast<size_t>(r)], 100 * r + R) << "from rank " << r;
  // The default (one all-gather per destination) agrees.
  const std::vector<int64_t> by_gathers = comm->Communicator::all_to_all_host(send);
  EXPECT_EQ(by_gathers, got);
}

TEST(MpiComm, BadArgumentsAreErrorsOnEveryRank) {
  REQUIRE_MPI();
  const Tensor send = Tensor::from_floats(std::vector<float>{1, 2, 3, 4}, {2, 2}, DType::kF32);
  Tensor short_recv = Tensor::empty({2, 2}, DType::kF32);
  if (W > 1) {
    EXPECT_TRUE(testing::contains_all(
        testing::error_of([&] { comm->all_gather(send, short_recv, Stream{}); }),
        {"all_gather", "recv", "ranks"}));
  }
  Tensor bf = Tensor::empty({W * 2, 2}, DType::kBF16), bf_out = Tensor::empty({2, 2}, DType::kBF16);
  EXPECT_TRUE(
      testing::contains_all(testing::error_of([&] { comm->reduce_scatter(bf, bf_out, Stream{}); }),
                            {"reduce_scatter", "bf16", "f32"}));
  Tensor other = Tensor::empty({W * 2, 2}, DType::kInt32);
  EXPECT_TRUE(
      testing::contains_all(testing::error_of([&] { comm->all_gather(send, other, Stream{}); }),
                            {"send is f32 but recv is int32"}));
  std::vector<int64_t> too_few(static_cast<size_t>(W), 0);
  too_few[0] = 5;  // more rows than send holds
  EXPECT_TRUE(testing::contains_all(
      testing::error_of([&] { comm->all_to_all_v(send, too_few, short_recv, too_few, Stream{}); }),
      {"all_to_all_v", "5 send rows"}));
  EXPECT_TRUE(
      testing::contains_all(testing::error_of([&] {
                              comm->all_to_all_v(send, {1}, short_recv, {1, 1, 1, 1, 1}, Stream{});
                            }),
                            {"counts"}));
  comm->barrier();  // every rank got here: nothing hung
}

}  // namespace
}  // namespace moekit
