// The test suite's own comparison helpers (tests/support/testing.h) must fail on NaN and Inf: a
// NaN makes every comparison false, so a naive `err <= tol` or `err > tol` check passes silently.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "testing.h"

namespace moekit::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();

Tensor f32(const std::vector<float>& values) {
  return Tensor::from_floats(values, {static_cast<int64_t>(values.size())}, DType::kF32);
}

TEST(TestingSupport, RelativeL2ErrorClosedForm) {
  EXPECT_EQ(relative_l2_error(std::vector<double>{3, 4}, std::vector<double>{3, 4}), 0.0);
  // ||(0, 1)|| / ||(3, 4)|| = 1 / 5.
  EXPECT_DOUBLE_EQ(relative_l2_error(std::vector<double>{3, 5}, std::vector<double>{3, 4}), 0.2);
  EXPECT_EQ(relative_l2_error(std::vector<double>{0, 0}, std::vector<double>{0, 0}), 0.0);
  EXPECT_EQ(relative_l2_error(std::vector<double>{1, 0}, std::vector<double>{0, 0}), kInf);
  EXPECT_EQ(relative_l2_error(std::vector<double>{}, std::vector<double>{}), 0.0);
  EXPECT_THROW(relative_l2_error(std::vector<double>{1}, std::vector<double>{1, 2}),
               std::invalid_argument);
}

TEST(TestingSupport, RelativeL2ErrorIsInfiniteOnNaNOrInfInEitherInput) {
  const std::vector<double> ref = {1, 2, 3, 4};
  for (double bad : {kNaN, -kNaN, kInf, -kInf}) {
    for (size_t i = 0; i < ref.size(); ++i) {
      std::vector<double> poisoned = ref;
      poisoned[i] = bad;
      EXPECT_EQ(relative_l2_error(poisoned, ref), kInf) << "out[" << i << "] = " << bad;
      EXPECT_EQ(relative_l2_error(ref, poisoned), kInf) << "ref[" << i << "] = " << bad;
      EXPECT_EQ(relative_l2_error(poisoned, poisoned), kInf) << "both[" << i << "] = " << bad;
    }
  }
  // Finite values whose squares overflow.
  EXPECT_EQ(relative_l2_error(std::vector<double>{1e300, 0}, std::vector<double>{-1e300, 1}), kInf);
  // The Tensor overload: a NaN row in a float tensor (e.g. poison left unwritten).
  EXPECT_EQ(relative_l2_error(f32({1.0f, kNaNf}), std::vector<double>{1, 2}), kInf);
}

TEST(TestingSupport, ToleranceChecksWrittenEitherWayFailOnNaN) {
  const Tolerance& tol = tolerance("f32");
  const std::vector<double> ref = {1, 2};
  const std::vector<double> nan_out = {1, kNaN};
  // The suite's idiom fails...
  EXPECT_NONFATAL_FAILURE(EXPECT_LE(relative_l2_error(nan_out, ref), tol.rel_l2), "rel_l2");
  // ...and so does the inverted idiom some checks use.
  EXPECT_TRUE(relative_l2_error(nan_out, ref) > tol.rel_l2);
}

TEST(TestingSupport, FirstBadElementFlagsNaNAndInf) {
  const Tolerance& tol = tolerance("f32");
  const Tensor good = f32({1.0f, 2.0f, 3.0f});
  EXPECT_EQ(first_bad_element(good, {1, 2, 3}, tol), -1);
  EXPECT_EQ(first_bad_element(good, {1, kNaN, 3}, tol), 1);
  EXPECT_EQ(first_bad_element(good, {1, 2, kInf}, tol), 2);
  const Tensor inf = f32({1.0f, std::numeric_limits<float>::infinity(), 3.0f});
  EXPECT_EQ(first_bad_element(inf, {1, kInf, 3}, tol), 1) << "Inf == Inf is still not a match";
  EXPECT_TRUE(has_nan(f32({0.0f, kNaNf})));
}

}  // namespace
}  // namespace moekit::testing
