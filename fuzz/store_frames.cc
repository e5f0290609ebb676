// Fuzz target: the bootstrap store's request and response frames (store_proto.h), as an
// authenticated but hostile peer or a broken server would send them: the header parsers and the
// whole-frame decoders. Lengths must be bounded before anything is allocated.
#include <cstddef>
#include <cstdint>

#include "transport/store_proto.h"

using namespace chorus::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)parse_store_request_header(data, size);
  (void)parse_store_response_header(data, size);
  if (size >= sizeof(StoreReqHeader))
    (void)parse_store_request_header(data, sizeof(StoreReqHeader));
  if (size >= sizeof(StoreRespHeader))
    (void)parse_store_response_header(data, sizeof(StoreRespHeader));
  auto req = decode_store_request(data, size);
  if (req.is_ok()) {
    // A decoded request re-encodes to the same bytes.
    std::string again = encode_store_request(req->h.op, req->key, req->value, req->h.timeout_ms);
    if (again.size() != size) __builtin_trap();
  }
  (void)decode_store_response(data, size);
  return 0;
}
