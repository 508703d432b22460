// The layout of MXFP6 (OCP e2m3 / e3m2 codes, one e8m0 scale per 32 elements) weights for the
// Hopper W4A16 kernels, and their conversion to bf16. Plain data and host code, no CUDA headers:
// the same functions serve the device kernels (constexpr) and the host's repacking at load time.
//
// Standard layout (the checkpoint's, quant/formats.h): four 6-bit codes in three bytes, code i of
// a row at bits [6i, 6i + 6) of the little-endian 24-bit words; 24 bytes per 32-element group,
// which breaks the kernels' 16-byte chunks. Kernel layout of a row of k elements (k a multiple of
// 32; the same 3k / 4 bytes): first the low plane, k / 2 bytes holding the low four bits of every
// code exactly as an MXFP4 row holds its e2m1 codes (16 bytes per group in the kernel nibble order,
// sm90/mxfp4_layout.h), then the high plane, k / 4 bytes holding the top two bits (code bit 4, an
// exponent bit, and bit 5, the sign) of every code, 8 bytes per group: two little-endian words
// H0, H1. The code at nibble n (0..7) of low-plane word q (0..3) of a group keeps its bit 4 at bit
// 16 (n / 4) + 8 (q % 2) + 2 (n % 4) and its sign one bit above, in H[q / 2]. So a kernel thread
// holding word q reads H[q / 2] >> 8 (q % 2), and pair p of its word (nibbles p and p + 4, the
// elements e and e + 1 of the MXFP4 order) finds both codes' top bits 16 bits apart, like their
// nibbles: one shift per field serves both halves of the bf16 pair.
//
// Conversion: the pair functions below place each code's five magnitude bits so that the bf16
// value is the fp6 value times 2^-126 (e2m3: mantissa at bits 4..6, exponent at 7..8) or 2^-124
// (e3m2: mantissa at 5..6, exponent at 7..9), subnormal codes included, and the sign at bit 15;
// multiplying by mxfp6_first_factor and, where the scale needs it, mxfp6_second_factor gives
// fp6 x 2^(s - 127) exactly (every such value is a bf16: at most 4 significant bits).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "experts/cuda/sm90/mxfp4_layout.h"

namespace moekit::cuda::sm90 {

inline constexpr int kMxfp6GroupElems = 32;
inline constexpr int kMxfp6LowGroupBytes = 16;  // the group's nibbles (kMxfp4GroupBytes)
inline constexpr int kMxfp6HighGroupBytes = 8;  // the group's top two bits
inline constexpr int kMxfp6StandardGroupBytes = 24;

// The bit of high-plane word H[q / 2] holding bit 4 of the code at nibble n of low word q (the
// sign is the bit above).
constexpr int mxfp6_high_bit(int q, int n) {
  return 16 * (n / 4) + 8 * (q % 2) + 2 * (n % 4);
}

// Pair p (0..3) of low-plane word `word` (nibbles p and p + 4) with its high bits `high` (H[q / 2]
// already shifted right by 8 (q % 2)) as a bf16 pair: code of nibble p in the low half.
template <int kP, bool kE3M2>
constexpr uint32_t fp6_pair_bits(uint32_t word, uint32_t high) {
  static_assert(kP >= 0 && kP < 4);
  // nibble bits 0..3 -> 4..7 (e2m3) or 5..8 (e3m2); code bit 4 (at 2p in high) -> 8 or 9; the
  // sign (2p + 1) -> 15. The high half's fields sit 16 bits above, in both sources.
  constexpr int kNibble = (kE3M2 ? 5 : 4) - 4 * kP;
  constexpr int kBit4 = (kE3M2 ? 9 : 8) - 2 * kP;
  constexpr int kSign = 14 - 2 * kP;
  constexpr uint32_t kNibbleMask = kE3M2 ? 0x01E001E0u : 0x00F000F0u;
  constexpr uint32_t kBit4Mask = kE3M2 ? 0x02000200u : 0x01000100u;
  const uint32_t nibbles = kNibble >= 0 ? word << kNibble : word >> -kNibble;
  return (nibbles & kNibbleMask) | ((high << kBit4) & kBit4Mask) | ((high << kSign) & 0x80008000u);
}

// The bf16x2 factors of e8m0 code s for a pair from fp6_pair_bits: the total is 2^t with t =
// s - 1 (e2m3, as e2m1) or s - 3 (e3m2); f1 = 2^min(t, 127), f2 = 2^(t - 127) (1 unless t > 127,
// the only case that needs the second multiply); s = 255 (NaN) gives f2 = NaN.
constexpr int mxfp6_factor_exponent(uint32_t s, bool e3m2) {
  return static_cast<int>(s) - (e3m2 ? 3 : 1);
}
constexpr uint32_t mxfp6_first_factor(uint32_t s, bool e3m2) {
  const int t = mxfp6_factor_exponent(s, e3m2);
  return static_cast<uint32_t>((t < 127 ? t : 127) + 127) * 0x00800080u;
}
constexpr uint32_t mxfp6_second_factor(uint32_t s, bool e3m2) {
  const int t = mxfp6_factor_exponent(s, e3m2);
  return s == 255u ? 0x7FC07FC0u
                   : static_cast<uint32_t>((t > 127 ? t - 127 : 0) + 127) * 0x00800080u;
}
// Whether scale code s needs the second multiply.
constexpr bool mxfp6_two_steps(uint32_t s, bool e3m2) {
  return s == 255u || mxfp6_factor_exponent(s, e3m2) > 127;
}

// The 32 codes of group g of a row of k elements, from the standard layout or the kernel layout
// (constexpr: the device repack calls it too).
constexpr void mxfp6_read_group(const uint8_t* row, int64_t k, int64_t g, bool kernel,
                                uint8_t (&codes)[kMxfp6GroupElems]) {
  if (!kernel) {
    const uint8_t* s = row + g * kMxfp6StandardGroupBytes;
    for (int i = 0; i < kMxfp6GroupElems; ++i) {
      const int bit = 6 * i;
      const uint32_t two =
          s[bit / 8] | (bit / 8 + 1 < kMxfp6StandardGroupBytes ? s[bit / 8 + 1] << 8 : 0);
      codes[i] = static_cast<uint8_t>((two >> (bit % 8)) & 0x3Fu);
    }
    return;
  }
  const uint8_t* lo = row + g * kMxfp6LowGroupBytes;
  const uint8_t* hi = row + k / 2 + g * kMxfp6HighGroupBytes;
  for (int n = 0; n < kMxfp6GroupElems; ++n) {  // nibble n of the group: word n / 8, nibble n % 8
    const int bit = 32 * (n / 16) + mxfp6_high_bit(n / 8, n % 8);
    const uint32_t top = (hi[bit / 8] >> (bit % 8)) & 0x3u;
    codes[mxfp4_kernel_element(n)] =
        static_cast<uint8_t>(((lo[n / 2] >> (4 * (n % 2))) & 0xFu) | (top << 4));
  }
}

// Writes the 32 codes of group g into a row of k elements in either layout (the group's bytes
// zeroed first: ORs only; constexpr as mxfp6_read_group).
constexpr void mxfp6_write_group(uint8_t* row, int64_t k, int64_t g, bool kernel,
                                 const uint8_t (&codes)[kMxfp6GroupElems]) {
  if (!kernel) {
    uint8_t* s = row + g * kMxfp6StandardGroupBytes;
    for (int i = 0; i < kMxfp6StandardGroupBytes; ++i)
      s[i] = 0;
    for (int i = 0; i < kMxfp6GroupElems; ++i) {
      const int bit = 6 * i;
      const uint32_t two = static_cast<uint32_t>(codes[i] & 0x3Fu) << (bit % 8);
      s[bit / 8] = static_cast<uint8_t>(s[bit / 8] | (two & 0xFFu));
      if (two > 0xFFu) s[bit / 8 + 1] = static_cast<uint8_t>(s[bit / 8 + 1] | (two >> 8));
    }
    return;
  }
  uint8_t* lo = row + g * kMxfp6LowGroupBytes;
  uint8_t* hi = row + k / 2 + g * kMxfp6HighGroupBytes;
  for (int i = 0; i < kMxfp6LowGroupBytes; ++i)
    lo[i] = 0;
  for (int i = 0; i < kMxfp6HighGroupBytes; ++i)
    hi[i] = 0;
  for (int n = 0; n < kMxfp6GroupElems; ++n) {
    const uint8_t c = codes[mxfp4_kernel_element(n)];
    lo[n / 2] = static_cast<uint8_t>(lo[n / 2] | ((c & 0xFu) << (4 * (n % 2))));
    const int bit = 32 * (n / 16) + mxfp6_high_bit(n / 8, n % 8);
    hi[bit / 8] = static_cast<uint8_t>(hi[bit / 8] | (((c >> 4) & 0x3u) << (bit % 8)));
  }
}

// Rewrites `rows` rows of k elements (k a positive multiple of 32; 3k / 4 bytes each) at `bytes`
// from the standard layout into the kernel layout (to_kernel) or back. Plain loops (load time);
// the two layouts of a row overlap, so each row is read whole before it is rewritten.
inline void mxfp6_repack_rows(uint8_t* bytes, int64_t rows, int64_t k, bool to_kernel) {
  const int64_t row_bytes = 3 * k / 4, groups = k / kMxfp6GroupElems;
  std::vector<uint8_t> source(static_cast<size_t>(row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = bytes + r * row_bytes;
    std::memcpy(source.data(), row, source.size());
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t codes[kMxfp6GroupElems];
      mxfp6_read_group(source.data(), k, g, !to_kernel, codes);
      mxfp6_write_group(row, k, g, to_kernel, codes);
    }
  }
}

}  // namespace moekit::cuda::sm90
