// Store and watch frames: encoders and bounded parsers (see store_proto.h).
#include "transport/store_proto.h"

#include "common/bytes.h"

#include <algorithm>
#include <cstring>

namespace chorus::transport {
namespace {

template <typename T>
Result<T> read_header(const void* p, size_t n, const char* what) {
  T h;
  if (n != sizeof h) return make_error(Code::kRemoteError, "{}: {} of {} bytes", what, n, sizeof h);
  std::memcpy(&h, p, sizeof h);
  return h;
}

}  // namespace

Result<StoreReqHeader> parse_store_request_header(const void* p, size_t n) {
  CHORUS_ASSIGN_OR_RETURN(StoreReqHeader h,
                          read_header<StoreReqHeader>(p, n, "short store request"));
  if (h.op != kSet && h.op != kGet && h.op != kJoin)
    return make_error(Code::kInvalidArgument, "unknown request {}", h.op);
  if (h.key_len > kMaxKeyBytes || h.val_len > kMaxValueBytes)
    return make_error(
        Code::kInvalidArgument,
        "request with a {} byte key and a {} byte value exceeds the limits ({} and {})", h.key_len,
        h.val_len, kMaxKeyBytes, kMaxValueBytes);
  return h;
}

Result<StoreRespHeader> parse_store_response_header(const void* p, size_t n) {
  CHORUS_ASSIGN_OR_RETURN(StoreRespHeader h,
                          read_header<StoreRespHeader>(p, n, "short store reply"));
  if (h.len > kMaxValueBytes)
    return make_error(Code::kRemoteError, "reply of {} bytes exceeds the {} byte limit", h.len,
                      kMaxValueBytes);
  return h;
}

Result<WatchHeader> parse_watch_header(const void* p, size_t n) {
  CHORUS_ASSIGN_OR_RETURN(WatchHeader h, read_header<WatchHeader>(p, n, "short watch message"));
  if (h.type < static_cast<uint32_t>(WatchType::kBye) ||
      h.type > static_cast<uint32_t>(WatchType::kShutdown))
    return make_error(Code::kRemoteError, "unknown watch message type {}", h.type);
  if (h.text_len > kMaxTextBytes)
    return make_error(Code::kRemoteError, "watch message of {} bytes exceeds {}", h.text_len,
                      kMaxTextBytes);
  return h;
}

Result<StoreRequest> decode_store_request(const void* p, size_t n) {
  auto b = static_cast<const char*>(p);
  CHORUS_ASSIGN_OR_RETURN(StoreReqHeader h,
                          parse_store_request_header(b, std::min(n, sizeof(StoreReqHeader))));
  size_t need = sizeof h + h.key_len + h.val_len;
  if (n != need)
    return make_error(Code::kRemoteError, "store request frame of {} bytes, its header says {}", n,
                      need);
  StoreRequest r{h, std::string(b + sizeof h, h.key_len),
                 std::string(b + sizeof h + h.key_len, h.val_len)};
  return r;
}

Result<StoreResponse> decode_store_response(const void* p, size_t n) {
  auto b = static_cast<const char*>(p);
  CHORUS_ASSIGN_OR_RETURN(StoreRespHeader h,
                          parse_store_response_header(b, std::min(n, sizeof(StoreRespHeader))));
  if (n != sizeof h + h.len)
    return make_error(Code::kRemoteError, "store reply frame of {} bytes, its header says {}", n,
                      sizeof h + h.len);
  return StoreResponse{code_from_wire(h.code), std::string(b + sizeof h, h.len)};
}

Result<WatchFrame> decode_watch_frame(const void* p, size_t n) {
  auto b = static_cast<const char*>(p);
  CHORUS_ASSIGN_OR_RETURN(WatchHeader h, parse_watch_header(b, std::min(n, sizeof(WatchHeader))));
  if (n != sizeof h + h.text_len)
    return make_error(Code::kRemoteError, "watch frame of {} bytes, its header says {}", n,
                      sizeof h + h.text_len);
  return WatchFrame{h, std::string(b + sizeof h, h.text_len)};
}

std::string encode_store_request(uint32_t op, const std::string& key, const std::string& value,
                                 uint32_t timeout_ms) {
  StoreReqHeader h{op, static_cast<uint32_t>(key.size()), value.size(), timeout_ms, 0};
  return bytes_of(h) + key + value;
}

std::string encode_store_response(Code code, const std::string& payload) {
  StoreRespHeader h{static_cast<int32_t>(code), 0, payload.size()};
  return bytes_of(h) + payload;
}

std::string encode_watch(WatchType type, int32_t rank, uint64_t comm_uid, uint64_t qid,
                         int32_t target, const std::string& text) {
  size_t n = std::min(text.size(), kMaxTextBytes);
  WatchHeader h{static_cast<uint32_t>(type), rank, comm_uid, qid, target, static_cast<uint32_t>(n)};
  return bytes_of(h) + text.substr(0, n);
}

}  // namespace chorus::transport
