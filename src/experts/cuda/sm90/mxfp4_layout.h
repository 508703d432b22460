// The order of the e2m1 codes inside each 32-element MXFP4 (or NVFP4) group of W as the Hopper
// W4A16 kernels read it, and the NVFP4 scales' kernel codes. Plain data and host code, no CUDA
// headers; the same function serves the device kernels (constexpr) and the weight layout of the
// sm90_mxfp4 backend.
//
// Standard layout (the checkpoint's, cuda::WPacking::kMxfp4 before this reorder): element 2i of a
// row in the low nibble of byte i. Kernel layout: each group's 16 bytes are 4 words; word q holds
// the 8 codes that lane q (lane % 4) of a wgmma fragment needs, nibble p of the word (bits 4p ..
// 4p + 3) being element mxfp4_kernel_element(8q + p) of the group:
//   p = 0..3 and p + 4 form the pair (e, e + 1), e = 16 * (p / 2) + 8 * (p % 2) + 2q,
// so one shift per half gives a bf16 pair (element e low, e + 1 high) straight from the word, and
// the four words of a group converted pair by pair give 8 consecutive elements per p.
#pragma once

#include <cstdint>

namespace moekit::cuda::sm90 {

inline constexpr int kMxfp4GroupBytes = 16;  // 32 elements, one e8m0 scale

// The element of a group held by nibble `nibble` (0..31) of the group in the kernel layout.
constexpr int mxfp4_kernel_element(int nibble) {
  const int q = nibble / 8, p = nibble % 8;
  return 16 * ((p % 4) / 2) + 8 * (p % 2) + 2 * q + p / 4;
}

// The W4A16 kernels' conversion. Pair p (0..3) of a kernel-order word as a bf16 pair (nibble p
// low, nibble p + 4 high): each code's magnitude bits go to bits 6..8 and its sign to bit 15 of
// its half, so the bf16 value is the e2m1 value times 2^-126 (a subnormal for the code 0.5, which
// bf16 arithmetic keeps); multiplying by w4_first_factor(s), and for s > 128 by
// w4_second_factor(s), gives e2m1 x 2^(s - 127) exactly (every such value is a bf16). Two shifts,
// an AND and a LOP3 per pair.
template <int kP>
constexpr uint32_t e2m1_pair_bits(uint32_t word) {
  static_assert(kP >= 0 && kP < 4);
  constexpr int kMag = 6 - 4 * kP;    // nibble bits 0..2 -> 6..8 (and 16.. -> 22..24)
  constexpr int kSign = 12 - 4 * kP;  // nibble bit 3 -> 15 (and 19 -> 31)
  const uint32_t mag = kMag >= 0 ? word << kMag : word >> -kMag;
  const uint32_t sign = word << kSign;
  return (mag & 0x01C001C0u) | (sign & 0x80008000u);
}
// The bf16x2 factors, without branches: f1 = 2^(min(s, 128) - 1) (a bf16 normal); f2 =
// 2^(max(s, 128) - 128), which is 1 unless s > 128 (the only case that needs the second
// multiply); s = 255 (NaN) gives f2 = NaN. 2^(b - 127) as a bf16 pair is b * 0x00800080.
constexpr uint32_t w4_first_factor(uint32_t s) {
  return (s + 126u < 254u ? s + 126u : 254u) * 0x00800080u;
}
constexpr uint32_t w4_second_factor(uint32_t s) {
  return s == 255u ? 0x7FC07FC0u : ((s > 128u ? s : 128u) - 1u) * 0x00800080u;
}

// NVFP4 (e2m1 codes, one ue4m3 scale per 16 elements) reuses the codes' layout above: each 16-byte
// group holds two scale groups, pairs p = 0, 1 of a word (elements 0..15) and p = 2, 3 (16..31).
// Its scales are rewritten once on the host into kernel scale codes b that expand to the bf16x2
// factor F = s x 2^118 with a shift and an add: the kernel's pair (e2m1 x 2^-126) times F is
// e2m1 x s x 2^-8 exactly (|e2m1 x s| <= 6 x 448 and >= 0.5 x 2^-9: a bf16 with at most 6
// significant bits), and the GEMM's epilogue multiplies by the expert's global scale times 2^8.
// Code b: 0 for s = 0, else bits 3..7 hold e' = log2-exponent of s + 21 (12..29 for the ue4m3
// range 2^-9 .. 448) and bits 0..2 its mantissa, so F's bf16 bits are (b << 4) + (224 << 7).
inline constexpr int kNvfp4GroupElems = 16;
inline constexpr float kNvfp4PairExponentScale = 256.0f;  // 2^8, applied in the epilogue

// The kernel scale code of a ue4m3 scale code c (0 .. 0x7E: finite and non-negative; callers
// check), normalising the seven subnormal codes (m x 2^-9).
constexpr uint8_t nvfp4_kernel_scale(uint32_t c) {
  if (c == 0) return 0;
  if (c >= 8) return static_cast<uint8_t>(c + 112);  // 2^(E - 7) x 1.m: e' = E + 14
  int k = 2;  // m x 2^-9 = 2^(k - 9) x (m / 2^k), 2^k <= m < 2^(k + 1)
  while ((c >> k) == 0)
    --k;
  const uint32_t mantissa = ((c - (1u << k)) << (3 - k)) & 7u;
  return static_cast<uint8_t>(((12 + k) << 3) | mantissa);
}

// The bf16x2 factor F of kernel scale code b, both halves (0 for b = 0).
constexpr uint32_t nvfp4_factor(uint32_t b) {
  return b == 0 ? 0u : ((b << 4) + 0x7000u) * 0x00010001u;
}

// Rewrites `groups` consecutive 16-byte groups at `bytes` from the standard layout into the kernel
// layout (to_kernel) or back.
inline void mxfp4_reorder_groups(uint8_t* bytes, int64_t groups, bool to_kernel) {
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* b = bytes + g * kMxfp4GroupBytes;
    uint8_t src[kMxfp4GroupBytes];
    for (int i = 0; i < kMxfp4GroupBytes; ++i)
      src[i] = b[i];
    auto nibble = [&](int n) { return (src[n / 2] >> (4 * (n % 2))) & 0xF; };
    uint8_t dst[kMxfp4GroupBytes] = {};
    for (int n = 0; n < 2 * kMxfp4GroupBytes; ++n) {
      const int e = mxfp4_kernel_element(n);
      // to_kernel: nibble n <- element e; back: element e <- nibble n.
      const int from = to_kernel ? e : n, to = to_kernel ? n : e;
      dst[to / 2] = static_cast<uint8_t>(dst[to / 2] | (nibble(from) << (4 * (to % 2))));
    }
    for (int i = 0; i < kMxfp4GroupBytes; ++i)
      b[i] = dst[i];
  }
}

}  // namespace moekit::cuda::sm90
