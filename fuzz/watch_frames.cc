// Fuzz target: messages on a watch connection (store_proto.h), as a hostile rank sends them to
// the store and the store relays them to every rank: the header parser and the frame decoder.
#include <cstddef>
#include <cstdint>

#include "transport/store_proto.h"

using namespace chorus::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)parse_watch_header(data, size);
  if (size >= sizeof(WatchHeader)) (void)parse_watch_header(data, sizeof(WatchHeader));
  auto frame = decode_watch_frame(data, size);
  if (frame.is_ok()) {
    std::string again = encode_watch(static_cast<WatchType>(frame->h.type), frame->h.rank,
                                     frame->h.comm_uid, frame->h.qid, frame->h.target, frame->text);
    if (again.size() != size) __builtin_trap();
  }
  return 0;
}
