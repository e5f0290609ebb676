// The bootstrap store's frames: requests and responses on store connections, messages on watch
// connections. Fixed little-endian headers followed by bounded bytes; the parsers below are pure
// functions over bytes from a peer (the server, the clients and the fuzzers call them).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "transport/wire.h"

namespace chorus::transport {

enum StoreOp : uint32_t { kSet = 1, kGet = 2, kJoin = 3 };

// The limit for reading or writing one frame on a store connection, client and server alike.
constexpr double kStoreIoSeconds = 10.0;

struct StoreReqHeader {
  uint32_t op;
  uint32_t key_len;
  uint64_t val_len;
  uint32_t timeout_ms;
  uint32_t reserved;
};
static_assert(sizeof(StoreReqHeader) == 24);

struct StoreRespHeader {
  int32_t code;
  uint32_t reserved;
  uint64_t len;
};
static_assert(sizeof(StoreRespHeader) == 16);

// Messages on a watch connection.
enum class WatchType : uint32_t { kBye = 1, kDead, kError, kQuery, kState, kShutdown };

struct WatchHeader {
  uint32_t type;
  int32_t rank;
  uint64_t comm_uid;
  uint64_t qid;
  int32_t target;
  uint32_t text_len;
};
static_assert(sizeof(WatchHeader) == 32);

struct StoreRequest {
  StoreReqHeader h;
  std::string key, value;
};
struct StoreResponse {
  Code code;
  std::string payload;
};
struct WatchFrame {
  WatchHeader h;
  std::string text;
};

// Header parsers: exactly sizeof(header) bytes; check the op/type and bound every length
// before the caller allocates for what follows.
Result<StoreReqHeader> parse_store_request_header(const void* p, size_t n);
Result<StoreRespHeader> parse_store_response_header(const void* p, size_t n);
Result<WatchHeader> parse_watch_header(const void* p, size_t n);
// Whole frames from one buffer of exactly the frame's size (header + what it announces).
Result<StoreRequest> decode_store_request(const void* p, size_t n);
Result<StoreResponse> decode_store_response(const void* p, size_t n);
Result<WatchFrame> decode_watch_frame(const void* p, size_t n);

std::string encode_store_request(uint32_t op, const std::string& key, const std::string& value,
                                 uint32_t timeout_ms);
std::string encode_store_response(Code code, const std::string& payload);
std::string encode_watch(WatchType type, int32_t rank, uint64_t comm_uid, uint64_t qid,
                         int32_t target, const std::string& text);

}  // namespace chorus::transport
