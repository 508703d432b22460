// GPU test of the Hopper kernel kit's wgmma wrappers (src/experts/cuda/sm90/ptx.cuh) for every
// operand type (bf16, f16, fp8 e4m3, fp8 e5m2, int8) and N = 8, 64, 128, 256, in the GEMM
// mainloops' 128-byte-swizzle layout and in the probes' no-swizzle layout
// (../shared/probes/wgmma_*_probe.cu), against a host reference. Inputs are small integers and
// halves, so every product and sum is exact in fp32 / int32: results are compared bitwise, and the
// output is poisoned before each run.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_seam.h"
#include "kernels/sm90_mma_selftest.h"
#include "moekit/core/device.h"
#include "moekit/core/half.h"
#include "moekit/quant/formats.h"
#include "require_gpu.h"

namespace moekit {
namespace {

using cuda::ElemType;
using testing::MmaLayout;

constexpr int kM = 64;
constexpr int kKBytes = 128;

// The bytes of value v (exactly representable) as element type t.
void put(ElemType t, float v, uint8_t* dst) {
  switch (t) {
    case ElemType::kBF16: {
      const uint16_t b = float_to_bf16_bits(v);
      std::memcpy(dst, &b, 2);
      break;
    }
    case ElemType::kF16: {
      const uint16_t b = float_to_f16_bits(v);
      std::memcpy(dst, &b, 2);
      break;
    }
    case ElemType::kE4M3:
      *dst = quant::encode_e4m3(v);
      break;
    case ElemType::kE5M2:
      *dst = quant::encode_e5m2(v);
      break;
    default:
      *dst = static_cast<uint8_t>(static_cast<int8_t>(v));
      break;
  }
}

// Row-major rows x K operand: value(r, k) as raw bytes, plus the values.
std::vector<uint8_t> operand(ElemType t, int rows, int salt, std::vector<double>* values) {
  const int es = cuda::elem_bytes(t), K = kKBytes / es;
  std::vector<uint8_t> bytes(static_cast<size_t>(rows) * kKBytes);
  values->assign(static_cast<size_t>(rows) * K, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < K; ++k) {
      const int i = r * K + k;
      // int8: [-127, 127]; float types: halves in [-4, 4] (A) or integers in [-3, 3] (B), never
      // all zero in a row.
      const double v = t == ElemType::kS8 ? static_cast<double>((i * 37 + salt * 11) % 255 - 127)
                       : salt == 0        ? 0.5 * ((i * 7 + r) % 17 - 8)
                                          : static_cast<double>((i * 3 + r) % 7 - 3);
      (*values)[static_cast<size_t>(i)] = v;
      put(t, static_cast<float>(v), &bytes[static_cast<size_t>(i) * es]);
    }
  }
  return bytes;
}

TEST(Sm90Kit, WgmmaEveryOperandTypeMatchesTheHostReference) {
  if constexpr (!kCudaBuild) {
    GTEST_SKIP() << "moekit was built without CUDA";
  } else {
    REQUIRE_SM90_GPU();
    for (ElemType t :
         {ElemType::kBF16, ElemType::kF16, ElemType::kE4M3, ElemType::kE5M2, ElemType::kS8}) {
      for (int n : {8, 64, 128, 256}) {
        for (MmaLayout layout : {MmaLayout::kSwizzle128, MmaLayout::kNoSwizzle}) {
          SCOPED_TRACE(::testing::Message()
                       << cuda::elem_type_name(t) << " n=" << n << " layout "
                       << (layout == MmaLayout::kSwizzle128 ? "swizzle128" : "no swizzle"));
          const int K = kKBytes / cuda::elem_bytes(t);
          std::vector<double> av, bv;
          const auto a = operand(t, kM, 0, &av);
          const auto b = operand(t, n, 1, &bv);
          std::vector<uint32_t> d(static_cast<size_t>(kM) * n);
          ASSERT_EQ(testing::run_wgmma_selftest(t, n, layout, a.data(), b.data(), d.data()), "");
          int64_t bad = 0;
          for (int r = 0; r < kM; ++r) {
            for (int c = 0; c < n; ++c) {
              double ref = 0;
              for (int k = 0; k < K; ++k)
                ref += av[static_cast<size_t>(r) * K + k] * bv[static_cast<size_t>(c) * K + k];
              const uint32_t bits = d[static_cast<size_t>(r) * n + c];
              double got;
              if (t == ElemType::kS8) {
                got = static_cast<int32_t>(bits);
              } else {
                float f;
                std::memcpy(&f, &bits, 4);
                got = f;
              }
              if (got != ref && bad++ < 5) {
                ADD_FAILURE() << "D[" << r << "," << c << "] = " << got << ", reference " << ref;
              }
            }
          }
          EXPECT_EQ(bad, 0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace moekit
