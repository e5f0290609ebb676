// libFuzzer target: the checkpoint readers -- a safetensors file (parse_safetensors) and a
// snapshot record (parse_snapshot_record) -- on arbitrary bytes. Each must either return or throw
// std::runtime_error/std::invalid_argument; a crash, a leak, an out-of-bounds access or any other
// exception is a finding. What it returns is checked against the bytes it came from.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>

#include "ddp/tensor/buffer_cache.h"
#include "ddp/train/checkpoint_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    std::map<std::string, std::string> meta;
    uint64_t total = 0;
    for (const auto& [name, t] : chorus::parse_safetensors(bytes, "fuzz.safetensors", &meta))
      total += 4 * static_cast<uint64_t>(t.numel());
    if (total > size) std::abort();  // tensors must tile the data: never more than the input
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  try {
    const chorus::SnapshotRecord r = chorus::parse_snapshot_record(bytes, "fuzz.json");
    if (r.tensors.find('/') != std::string::npos || r.state.epoch < 1 || r.state.world_size < 1)
      std::abort();
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  chorus::buffer_cache_release();  // the cache keeps every size it saw: not a leak, but rss
  return 0;
}
