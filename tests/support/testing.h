// Shared test helpers: seeded random tensors (never all zeros), poisoning, error norms, and the one
// table of per-dtype / per-scheme tolerances.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/error.h"
#include "moekit/core/tensor.h"
#include "moekit/core/tolerance.h"

namespace moekit::testing {

// The tolerance table lives in the library (moekit/core/tolerance.h) so tests, `moekit run` and the
// GPU checks share it.
using moekit::tolerance;
using moekit::Tolerance;
using moekit::tolerance_for;

// Uniform values in [lo, hi) with a fixed seed, rounded to dtype; never all zeros.
Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, float lo = -1.f,
                     float hi = 1.f);
// Random top-k routing: distinct ids in [0, E) per row and softmax-like positive weights.
void random_routing(int64_t M, int topk, int num_experts, uint64_t seed, Tensor* topk_ids,
                    Tensor* topk_weights);
// Sets every third slot of host int32 topk_ids (M, topk) to -1, and all of token 0's (it goes
// to no expert): routing with ids of -1 for the layers' "-1 contributes nothing" tests.
void drop_some_slots(Tensor& topk_ids);

// ||out - ref||_2 / ||ref||_2 (0 when both are zero). NaN-safe: a NaN or Inf in either input, or
// sums that overflow, give +infinity, so every `err <= tol` check fails (and `err > tol` holds).
double relative_l2_error(const std::vector<double>& out, const std::vector<double>& ref);
double relative_l2_error(const Tensor& out, const std::vector<double>& ref);
// Index of the first element that violates the element tolerance (a NaN or Inf on either side
// always does), or -1.
int64_t first_bad_element(const Tensor& out, const std::vector<double>& ref, const Tolerance& tol);
// True if any element is NaN (poison left behind = an unwritten element).
bool has_nan(const Tensor& t);
// A CPU tensor of 0xFF bytes: NaN in every float format, so an unwritten element shows.
Tensor poisoned(const Shape& shape, DType dtype);
// Same shape, dtype and bytes (either may be strided or on any device).
bool bitwise_equal(const Tensor& a, const Tensor& b);

// A gtest parameter name from preset / scheme names: '-' becomes '_' ("small-deepseek_M1").
std::string param_name(std::string name);

// The message of the ErrorT that f throws; a test failure (and "") when f throws nothing or an
// exception of another type.
template <typename ErrorT = Error, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ErrorT& e) {
    return e.what();
  } catch (...) {
    ADD_FAILURE() << "threw an exception of another type than expected";
    return "<wrong exception>";
  }
  ADD_FAILURE() << "no exception was thrown";
  return {};
}

// EXPECT_TRUE(contains_all(message, {...})): every needle is in the message.
::testing::AssertionResult contains_all(const std::string& message,
                                        std::initializer_list<std::string_view> needles);

}  // namespace moekit::testing
