// Internal: the argument checks every communicator runs before its engine (MPI, NCCL) sees a
// call, so a bad call is the same error on every rank rather than a hang, and the row arithmetic
// they share.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/core/tensor.h"

namespace moekit::detail {

// Bytes of one row (dim 0) of t.
inline int64_t row_bytes(const Tensor& t) {
  int64_t b = static_cast<int64_t>(element_size(t.dtype()));
  for (int d = 1; d < t.dim(); ++d)
    b *= t.size(d);
  return b;
}

inline bool same_rows(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int d = 1; d < a.dim(); ++d) {
    if (a.size(d) != b.size(d)) return false;
  }
  return true;
}

// send and recv: contiguous, on `device`, with a row dimension, of one dtype.
inline void check_collective_pair(const Tensor& send, const Tensor& recv, Device device,
                                  const char* op) {
  for (const auto& [t, name] : {std::pair{&send, "send"}, std::pair{&recv, "recv"}}) {
    expect_device(*t, name, device);
    expect_contiguous(*t, name);
    MOEKIT_CHECK(t->dim() >= 1, "{}: {} {} must have a row dimension", op, name, t->describe());
  }
  MOEKIT_CHECK(send.dtype() == recv.dtype(), "{}: send is {} but recv is {}", op,
               dtype_name(send.dtype()), dtype_name(recv.dtype()));
}

inline void check_all_gather(const Tensor& send, const Tensor& recv, int world, Device device) {
  check_collective_pair(send, recv, device, "all_gather");
  MOEKIT_CHECK(
      recv.dim() == send.dim() && recv.size(0) == world * send.size(0) && same_rows(send, recv),
      "all_gather over {} ranks: recv {} must be ({} * {}, ...) rows of send {}", world,
      recv.describe(), world, send.size(0), send.describe());
}

inline void check_reduce_scatter(const Tensor& send, const Tensor& recv, int world, Device device) {
  check_collective_pair(send, recv, device, "reduce_scatter");
  MOEKIT_CHECK(
      send.dim() == recv.dim() && send.size(0) == world * recv.size(0) && same_rows(send, recv),
      "reduce_scatter over {} ranks: send {} must be ({} * {}, ...) rows of recv {}", world,
      send.describe(), world, recv.size(0), recv.describe());
}

// Checks an all_to_all_v; returns the rows it sends and receives in all.
inline std::pair<int64_t, int64_t> check_all_to_all_v(const Tensor& send,
                                                      const std::vector<int64_t>& send_counts,
                                                      const Tensor& recv,
                                                      const std::vector<int64_t>& recv_counts,
                                                      int world, Device device) {
  check_collective_pair(send, recv, device, "all_to_all_v");
  MOEKIT_CHECK(same_rows(send, recv),
               "all_to_all_v: send {} and recv {} must have the same row shape", send.describe(),
               recv.describe());
  const size_t W = static_cast<size_t>(world);
  MOEKIT_CHECK(send_counts.size() == W && recv_counts.size() == W,
               "all_to_all_v over {} ranks needs {} send and recv counts, got {} and {}", world,
               world, send_counts.size(), recv_counts.size());
  int64_t sent = 0, received = 0;
  for (size_t r = 0; r < W; ++r) {
    MOEKIT_CHECK(send_counts[r] >= 0 && recv_counts[r] >= 0,
                 "all_to_all_v: send_counts[{}]={} and recv_counts[{}]={} must be >= 0", r,
                 send_counts[r], r, recv_counts[r]);
    sent += send_counts[r];
    received += recv_counts[r];
  }
  MOEKIT_CHECK(sent <= send.size(0) && received <= recv.size(0),
               "all_to_all_v: the counts need {} send rows and {} recv rows, but send {} and "
               "recv {} hold fewer",
               sent, received, send.describe(), recv.describe());
  return {sent, received};
}

}  // namespace moekit::detail
