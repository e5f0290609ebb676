// Shape: every Shape is valid -- no negative dimension, no element count (or byte count) that
// overflows, also for sub-shapes of a shape with a zero dimension.
#include <catch2/catch.hpp>

#include <cstdint>
#include <stdexcept>

#include "ddp/tensor/tensor.h"

using chorus::Shape;

TEST_CASE("shape: negative dimensions are refused, naming the dimension", "[tensor]") {
  CHECK_THROWS_WITH((Shape{-2, -2}), "shape (-2, -2): dimension 0 is -2, expected >= 0");
  CHECK_THROWS_WITH(Shape::of({3, 4, -1}), "shape (3, 4, -1): dimension 2 is -1, expected >= 0");
  CHECK_THROWS_AS(Shape::of({1, 2, 3, 4, 5, 6, 7}), std::invalid_argument);
}

TEST_CASE("shape: element counts that overflow are refused", "[tensor]") {
  const int64_t big = int64_t{1} << 62;
  CHECK_THROWS_WITH((Shape{big, 4}),
                    Catch::StartsWith("shape (4611686018427387904, 4): more than"));
  CHECK_THROWS_AS((Shape{int64_t{1} << 31, int64_t{1} << 31}),
                  std::invalid_argument);  // 2^62 > 2^60
  // A zero dimension does not excuse the others: (C, H, W) of (0, C, H, W) must fit too.
  CHECK_THROWS_AS((Shape{0, int64_t{1} << 31, int64_t{1} << 31}), std::invalid_argument);
  CHECK((Shape{Shape::kMaxNumel}.numel() == Shape::kMaxNumel));
  CHECK_THROWS_AS((Shape{Shape::kMaxNumel, 2}), std::invalid_argument);
  CHECK((Shape{0, 5}.numel() == 0));
  CHECK((Shape{}.numel() == 1));
}
