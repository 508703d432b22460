// Consecutive regions of one buffer (a workspace, a peer-exchange buffer), each starting at a
// multiple of `align` bytes: take(bytes) returns the next region's offset, size() the bytes
// taken so far, padding included.
#pragma once

#include <cstddef>

namespace moekit {

class ByteRegions {
 public:
  explicit ByteRegions(size_t align = 256) : align_(align) {}
  size_t take(size_t bytes) {
    const size_t start = at_;
    at_ = (at_ + bytes + align_ - 1) / align_ * align_;
    return start;
  }
  size_t size() const { return at_; }

 private:
  size_t align_;
  size_t at_ = 0;
};

}  // namespace moekit
