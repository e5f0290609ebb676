// A trivially copyable value's bytes as a string, for the wire formats (transport/wire.cc,
// transport/store_proto.cc) that append fixed headers to their payloads.
#pragma once

#include <string>
#include <type_traits>

namespace chorus {

template <typename T>
std::string bytes_of(const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace chorus
