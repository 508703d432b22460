// The W4A8 rows' conversion of int4 weights to e4m3 (sm90/grouped_kernels.cuh, the kW4A8
// producer). Plain data and host code, no CUDA headers: the kernels run the same selector
// arithmetic with the device's byte permute (__byte_perm, PTX prmt), the host tests with
// host_byte_perm.
//
// Codes: uint4b8 (the library's int4 layout and the Quark W4A8 method's: nibble u holds the value
// u - 8), element 2i of a row in the low nibble of byte i. Every value -8 .. 7 is an e4m3 code
// exactly, so the conversion is a table lookup: int4x4_to_e4m3, two byte permutes look each
// nibble's low three bits up in the table of the negative values (u < 8) and of the non-negative
// ones (u >= 8), a third picks per byte by the nibble's bit 3 (six instructions per four).
//
// The kernels read split codes (int4_split_word, applied to the weights at load: bits 2 and 3 of
// every nibble swapped), whose lookup takes two byte permutes and an xor (int4x4_split_to_e4m3):
// the low three bits i of a split code name a pair of values of one sign, u = (u3, 0, u1, u0) and
// u + 4, and bit 3 picks within the pair. One permute looks i up in the table T of the pair's
// second values; the other looks the whole code up in the table S = T ^ (codes of the first
// values) with the permute's sign mode: for a code with bit 3 set it yields S[i]'s sign bit spread
// over the byte, 0 (every S byte is below 0x80: a pair shares its sign), so T[i] ^ 0 = the second
// value; with bit 3 clear it yields S[i], and T[i] ^ S[i] = the first value.
#pragma once

#include <cstdint>

namespace moekit::cuda::sm90 {

// e4m3 codes of u - 8, four per word (byte i: u = 4 * word + i). Read only with constant
// indices (device code reading a host array element at a runtime index traps).
inline constexpr uint32_t kInt4E4m3Neg[2] = {0xCACCCED0u,   // -8, -7, -6, -5
                                             0xB8C0C4C8u};  // -4, -3, -2, -1
inline constexpr uint32_t kInt4E4m3Pos[2] = {0x44403800u,   // 0, 1, 2, 3
                                             0x4E4C4A48u};  // 4, 5, 6, 7

// The split tables (scalars: device code may read a host constexpr scalar, not an array):
// T = the codes of u = 4..7 and 12..15 (the pairs' second values), S = T ^ the codes of u = 0..3
// and 8..11 (their first values).
inline constexpr uint32_t kInt4SplitT0 = kInt4E4m3Neg[1];
inline constexpr uint32_t kInt4SplitT1 = kInt4E4m3Pos[1];
inline constexpr uint32_t kInt4SplitS0 = kInt4E4m3Neg[0] ^ kInt4E4m3Neg[1];
inline constexpr uint32_t kInt4SplitS1 = kInt4E4m3Pos[0] ^ kInt4E4m3Pos[1];
static_assert(((kInt4SplitS0 | kInt4SplitS1) & 0x80808080u) == 0,
              "each pair of values shares its sign");

// Eight uint4b8 nibbles as split codes (bits 2 and 3 of each swapped); its own inverse.
constexpr uint32_t int4_split_word(uint32_t w) {
  return (w & 0x33333333u) | ((w & 0x44444444u) << 1) | ((w & 0x88888888u) >> 1);
}

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
// prmt's default mode with the selector nibbles' bit 3: where it is set, the selected byte's sign
// bit spread over the result byte (0x00 or 0xFF).
constexpr uint32_t host_byte_perm_sign(uint32_t lo, uint32_t hi, uint32_t selector) {
  const uint32_t plain = host_byte_perm(lo, hi, selector);
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t byte = (plain >> (8 * i)) & 0xFFu;
    const bool spread = ((selector >> (4 * i)) & 8u) != 0;
    out |= (spread ? ((byte & 0x80u) != 0 ? 0xFFu : 0u) : byte) << (8 * i);
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

// The e4m3 codes of the four split codes in bits 0..15 of `codes` (element i in nibble i, code i
// in byte i): `index` is codes & 0x7777 (one mask serves both halves of a word), `perm` the byte
// permute, `perm_sign` the permute with the sign mode (host_byte_perm_sign, or prmt on the
// device), and the four table words (the device keeps them in registers).
template <typename Perm, typename PermSign>
constexpr uint32_t int4x4_split_to_e4m3(uint32_t codes, uint32_t index, Perm perm,
                                        PermSign perm_sign, uint32_t t0, uint32_t t1, uint32_t s0,
                                        uint32_t s1) {
  return perm(t0, t1, index) ^ perm_sign(s0, s1, codes);
}

}  // namespace moekit::cuda::sm90
