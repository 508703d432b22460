// The W4A8 rows' conversion of int4 weights to e4m3 (sm90/grouped_kernels.cuh, the kW4A8
// producer). Plain data and host code, no CUDA headers: the kernels run the same selector
// arithmetic with the device's byte permute (__byte_perm, PTX prmt), the host tests with
// host_byte_perm.
//
// Codes: uint4b8 (the library's int4 layout and the Quark W4A8 method's: nibble u holds the value
// u - 8), element 2i of a row in the low nibble of byte i. Every value -8 .. 7 is an e4m3 code
// exactly, so the conversion is a table lookup: two byte permutes look each nibble's low three
// bits up in the table of the negative values (u < 8) and of the non-negative ones (u >= 8), a
// third picks per byte by the nibble's bit 3. Four elements per call, six instructions.
#pragma once

#include <cstdint>

namespace moekit::cuda::sm90 {

// e4m3 codes of u - 8, four per word (byte i: u = 4 * word + i).
inline constexpr uint32_t kInt4E4m3Neg[2] = {0xCACCCED0u,   // -8, -7, -6, -5
                                             0xB8C0C4C8u};  // -4, -3, -2, -1
inline constexpr uint32_t kInt4E4m3Pos[2] = {0x44403800u,   // 0, 1, 2, 3
                                             0x4E4C4A48u};  // 4, 5, 6, 7

// Byte i of the result is byte (selector nibble i) of the eight bytes {lo, hi} (0..3 from lo,
// 4..7 from hi): prmt's default mode, selectors 0..7 only.
constexpr uint32_t host_byte_perm(uint32_t lo, uint32_t hi, uint32_t selector) {
  const uint64_t bytes = (static_cast<uint64_t>(hi) << 32) | lo;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t b = (selector >> (4 * i)) & 7u;
    out |= static_cast<uint32_t>((bytes >> (8 * b)) & 0xFFu) << (8 * i);
  }
  return out;
}

// The e4m3 codes of the four uint4b8 nibbles in bits 0..15 of `nibbles` (element i in nibble i,
// code i in byte i), with `perm` the byte permute (host_byte_perm, or __byte_perm on the device).
template <typename Perm>
constexpr uint32_t int4x4_to_e4m3(uint32_t nibbles, Perm perm) {
  const uint32_t index = nibbles & 0x7777u;
  const uint32_t neg = perm(kInt4E4m3Neg[0], kInt4E4m3Neg[1], index);
  const uint32_t pos = perm(kInt4E4m3Pos[0], kInt4E4m3Pos[1], index);
  // Nibble i of the pick: i (pos) where bit 3 of element i is set, else 4 + i (neg).
  const uint32_t pick = 0x7654u - ((nibbles >> 1) & 0x4444u);
  return perm(pos, neg, pick);
}

}  // namespace moekit::cuda::sm90
