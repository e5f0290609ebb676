// What both verbs implementations share: addresses on the wire, status names, the choice.
#include "transport/ib/verbs.h"

#include <fmt/format.h>

#include <cstdio>

#include "common/env.h"

namespace chorus::transport::ib {

std::string QpAddr::encode() const {
  std::string g;
  for (uint8_t b : gid) g += fmt::format("{:02x}", b);
  return fmt::format("{} {} {} {}", qpn, psn, lid, g);
}

Result<QpAddr> QpAddr::decode(const std::string& s) {
  QpAddr a;
  unsigned long long qpn = 0, psn = 0, lid = 0;
  char g[33] = {};
  int end = 0;
  if (std::sscanf(s.c_str(), "%llu %llu %llu %32[0-9a-f]%n", &qpn, &psn, &lid, g, &end) != 4 ||
      static_cast<size_t>(end) != s.size() || qpn >= (1u << 24) || psn >= (1u << 24) ||
      lid > 0xffff || std::string(g).size() != 32)
    return make_error(Code::kRemoteError,
                      "ib: malformed queue pair address '{}' (expected 'qpn psn lid gid' with a "
                      "24-bit qpn and psn, a 16-bit lid and 32 hex digits)",
                      s.substr(0, 120));
  a.qpn = static_cast<uint32_t>(qpn);
  a.psn = static_cast<uint32_t>(psn);
  a.lid = static_cast<uint16_t>(lid);
  for (int i = 0; i < 16; ++i) {
    unsigned v = 0;
    std::sscanf(g + 2 * i, "%2x", &v);
    a.gid[i] = static_cast<uint8_t>(v);
  }
  return a;
}

const char* wc_status_name(int status) {
  switch (status) {
    case kWcSuccess:
      return "success";
    case kWcLocLenErr:
      return "local length error";
    case kWcLocProtErr:
      return "local protection error";
    case kWcWrFlushErr:
      return "work request flushed error";
    case kWcRemAccessErr:
      return "remote access error";
    case kWcRetryExcErr:
      return "transport retry counter exceeded";
    case kWcRnrRetryExcErr:
      return "RNR retry counter exceeded";
    case kWcGeneralErr:
      return "general error";
    default:
      return "unknown status";
  }
}

bool emulated() {
  return !env_str("CHORUS_IB_EMULATE", "").empty();
}

Result<std::vector<Port>> list_ports() {
  if (emulated()) return emu_list_ports(env_str("CHORUS_IB_EMULATE", ""));
  return ibv_list_ports();
}

Result<std::shared_ptr<Nic>> open_nic(const Port& port, int gid_index) {
  if (emulated()) return emu_open_nic(port);
  return ibv_open_nic(port, gid_index);
}

}  // namespace chorus::transport::ib
