// MXFP4 weights on the e4m3 wgmma (the kMxfp4A8 rows, sm90/grouped_kernels.cuh): the producer
// converts each 32-element group's e2m1 codes to e4m3 with the group's e8m0 scale folded in,
// relative to a reference exponent of its row and 128-element K step, and the consumers promote
// every K step with the row's reference scale (as the W4A8 group rows do). Plain data and host
// code, no CUDA headers: the kernels run the same arithmetic with the device's byte permute
// (__byte_perm), the host tests with host_byte_perm (sm90/int4_layout.h).
//
// A row's step holds four groups q with e8m0 exponents s_q. Reference: r = max(max_q s_q, 7) - 6,
// so the largest group is scaled by 2^6 (6 x 64 = 384 <= 448) and the step's scale 2^(r - 127)
// is a normal f32. Group q's codes become e4m3(e2m1 x 2^d), d = s_q - r in [-249, 6]: exact for
// d >= -8 (e4m3 subnormals included), rounded to nearest even below (values under 2^-14 of the
// largest group's), zero below -14. The table holds, for each d in [kMxShiftMin, kMxShiftMax],
// the e4m3 codes of the eight e2m1 magnitudes (byte m of the pair of words: magnitude code m);
// the sign is the code's bit 3, as for int4's negative table.
#pragma once

#include <cstdint>

namespace moekit::cuda::sm90 {

inline constexpr int kMxShiftMin = -15;  // this entry and below: every magnitude rounds to 0
inline constexpr int kMxShiftMax = 6;
inline constexpr int kMxShifts = kMxShiftMax - kMxShiftMin + 1;
inline constexpr int kMxTableWords = 2 * kMxShifts;

// e2m1 magnitudes (code & 7) in units of 0.5: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
inline constexpr int kE2m1HalfUnits[8] = {0, 1, 2, 3, 4, 6, 8, 12};

// The e4m3 code (positive, round to nearest even, finite) of h x 2^(d - 1), h = half units.
constexpr uint8_t e4m3_of_half_units(int h, int d) {
  if (h == 0) return 0;
  // value = h x 2^(d - 1); e4m3 subnormal unit 2^-9: units = h x 2^(d + 8).
  // Normal: find e with 8 <= h x 2^(d - 1) / 2^(e - 7 - 3) < 16 (mantissa with the hidden bit).
  int e = 0;  // exponent of the value's leading bit: 2^e <= value < 2^(e + 1)
  int t = h;
  int lead = 0;
  while ((t >> 1) != 0) {
    t >>= 1;
    ++lead;
  }
  e = lead + d - 1;
  if (e >= -6) {  // normal (the values here stay below 448: d <= 6)
    // mantissa: value / 2^(e - 3), an integer in [8, 16) since h has at most 2 significant bits
    const int shift = e - 3 - (d - 1);  // value / 2^(e-3) = h / 2^shift
    const int m = shift >= 0 ? h >> shift : h << -shift;
    return static_cast<uint8_t>(((e + 7) << 3) | (m - 8));
  }
  // Subnormal: units of 2^-9, rounded to nearest even.
  const int s = -(d + 8);  // units = h / 2^s
  if (s <= 0) return static_cast<uint8_t>(h << -s);
  if (s >= 8) return 0;
  const int q = h >> s;
  const int rem = h - (q << s);
  const int half = 1 << (s - 1);
  const int units = rem > half || (rem == half && (q & 1) != 0) ? q + 1 : q;
  return static_cast<uint8_t>(units >= 8 ? (1 << 3) : units);  // 8 units = 2^-6, the first normal
}

// Word w (0, 1) of the table entry of shift d: magnitudes 4w .. 4w + 3 in bytes 0 .. 3.
constexpr uint32_t mx_table_word(int d, int w) {
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i)
    out |= static_cast<uint32_t>(e4m3_of_half_units(kE2m1HalfUnits[4 * w + i], d)) << (8 * i);
  return out;
}

struct MxE4m3Table {
  uint32_t words[kMxTableWords];  // entry d - kMxShiftMin: words 2 (d - kMxShiftMin) + {0, 1}
};
constexpr MxE4m3Table make_mx_e4m3_table() {
  MxE4m3Table t{};
  for (int d = kMxShiftMin; d <= kMxShiftMax; ++d) {
    t.words[2 * (d - kMxShiftMin)] = mx_table_word(d, 0);
    t.words[2 * (d - kMxShiftMin) + 1] = mx_table_word(d, 1);
  }
  return t;
}
inline constexpr MxE4m3Table kMxE4m3Table = make_mx_e4m3_table();

// The reference exponent of a row's step from the largest of its four e8m0 codes, and from the
// codes themselves (byte q of `codes`: group q).
constexpr uint32_t mx_reference_of_max(uint32_t largest) {
  return (largest > 7u ? largest : 7u) - 6u;
}
constexpr uint32_t mx_reference(uint32_t codes) {
  uint32_t m = 0;
  for (int q = 0; q < 4; ++q) {
    const uint32_t s = (codes >> (8 * q)) & 0xFFu;
    m = s > m ? s : m;
  }
  return mx_reference_of_max(m);
}

// Shifts whose entry is arithmetic: every nonzero magnitude stays a normal e4m3 (the smallest,
// 0.5 = exponent field 6 at d = 0, keeps a field >= 1), so the entry is d = 0's with d added to
// each nonzero code's exponent field (bits 3..6; no byte borrows or carries).
constexpr bool mx_normal_shift(int d) {
  return d >= -5 && d <= kMxShiftMax;
}
// NOTE: scalars, not an array: device code may read a host constexpr scalar (its value), but an
// array element read there compiles to a trap (found on the GPU, 2026-12-07).
inline constexpr uint32_t kMxUnshiftedLo = mx_table_word(0, 0);
inline constexpr uint32_t kMxUnshiftedHi = mx_table_word(0, 1);
constexpr uint32_t mx_normal_word(int d, int w) {
  // Byte 0 of word 0 is magnitude 0 (code 0), which stays 0.
  return w == 0 ? kMxUnshiftedLo + static_cast<uint32_t>(d) * 0x08080800u
                : kMxUnshiftedHi + static_cast<uint32_t>(d) * 0x08080808u;
}

// The table entry of group code s under reference r (shifts below kMxShiftMin use its entry).
constexpr int mx_entry(uint32_t s, uint32_t r) {
  const int d = static_cast<int>(s) - static_cast<int>(r);
  return (d < kMxShiftMin ? kMxShiftMin : d) - kMxShiftMin;
}

// The e4m3 codes of the four e2m1 codes in bits 0..15 of `nibbles` (element i in nibble i, code i
// in byte i) under the entry's words (lo, hi), with `perm` the byte permute.
template <typename Perm>
constexpr uint32_t e2m1x4_to_e4m3(uint32_t nibbles, uint32_t lo, uint32_t hi, Perm perm) {
  const uint32_t pos = perm(lo, hi, nibbles & 0x7777u);
  const uint32_t neg = pos | 0x80808080u;
  // Nibble i of the pick: 4 + i (neg) where bit 3 of element i is set, else i (pos).
  const uint32_t pick = 0x3210u + ((nibbles >> 1) & 0x4444u);
  return perm(pos, neg, pick);
}

}  // namespace moekit::cuda::sm90
