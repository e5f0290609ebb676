// The message of what f throws ("no error" when it returns): the tests compare errors whole.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace chorus::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace chorus::test
