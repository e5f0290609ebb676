// CHORUS_IB_HCA parsing and port choice (hca.h).
#include "transport/ib/hca.h"

#include <fmt/format.h>

namespace chorus::transport::ib {
namespace {

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

}  // namespace

bool HcaFilter::allows(const std::string& device, int port) const {
  if (entries.empty()) return true;
  bool hit = false;
  for (const Entry& e : entries) {
    bool name_ok = exact ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (name_ok && (e.port < 0 || e.port == port)) hit = true;
  }
  return hit != exclude;
}

Result<HcaFilter> parse_hca(const std::string& spec) {
  HcaFilter f;
  size_t i = 0;
  if (i < spec.size() && spec[i] == '^') f.exclude = true, ++i;
  if (i < spec.size() && spec[i] == '=') f.exact = true, ++i;
  if (i == spec.size()) {
    if (i == 0) return f;
    return make_error(Code::kInvalidArgument, "CHORUS_IB_HCA='{}': no device after '{}'", spec,
                      spec.substr(0, i));
  }
  while (true) {
    size_t end = spec.find(',', i);
    std::string item = spec.substr(i, end == std::string::npos ? std::string::npos : end - i);
    size_t colon = item.find(':');
    HcaFilter::Entry e;
    e.name = item.substr(0, colon);
    if (e.name.empty() || e.name.size() > 63)
      return make_error(Code::kInvalidArgument,
                        "CHORUS_IB_HCA='{}': device name '{}' must be 1..63 characters", spec,
                        e.name);
    for (char c : e.name)
      if (!name_char(c))
        return make_error(Code::kInvalidArgument,
                          "CHORUS_IB_HCA='{}': '{}' in device name '{}' (expected letters, "
                          "digits, '_', '.', '-')",
                          spec, std::string(1, c), e.name);
    if (colon != std::string::npos) {
      std::string p = item.substr(colon + 1);
      bool digits = !p.empty() && p.size() <= 3;
      for (char c : p) digits = digits && c >= '0' && c <= '9';
      int v = digits ? std::stoi(p) : 0;
      if (!digits || v < 1 || v > 255)
        return make_error(Code::kInvalidArgument,
                          "CHORUS_IB_HCA='{}': port '{}' of '{}' must be 1..255", spec, p, e.name);
      e.port = v;
    }
    f.entries.push_back(std::move(e));
    if (end == std::string::npos) break;
    i = end + 1;
  }
  return f;
}

Result<std::vector<Port>> choose_ports(const std::vector<Port>& ports, const HcaFilter& f,
                                       const std::string& spec) {
  std::vector<Port> out;
  std::string seen;
  for (const Port& p : ports) {
    bool allowed = f.allows(p.device, p.port);
    if (allowed && p.active) out.push_back(p);
    seen += fmt::format("{}{} ({})", seen.empty() ? "" : ", ", p.name(),
                        !allowed   ? "not in CHORUS_IB_HCA"
                        : p.active ? "active"
                                   : "down");
  }
  if (out.empty())
    return make_error(Code::kSystemError, "ib: no active port{}; ports: {}",
                      spec.empty() ? "" : fmt::format(" allowed by CHORUS_IB_HCA='{}'", spec),
                      seen.empty() ? "none" : seen);
  return out;
}

}  // namespace chorus::transport::ib
