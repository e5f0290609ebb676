// CHORUS_IB_HCA: which devices and ports the ib backend may use, in NCCL_IB_HCA's syntax.
//
//   mlx5_0:1,mlx5_1     devices whose name starts with mlx5_0 (port 1 only) or mlx5_1 (any port)
//   =mlx5_0             exactly mlx5_0 (no prefix match)
//   ^mlx5_2             every device except those starting with mlx5_2
//   ^=mlx5_2:1          every port except exactly mlx5_2's port 1
// Empty: every device. Names are 1..63 characters of [A-Za-z0-9_.-]; ports 1..255.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "transport/ib/verbs.h"

namespace chorus::transport::ib {

struct HcaFilter {
  struct Entry {
    std::string name;
    int port = -1;  // -1: any
  };
  bool exclude = false;
  bool exact = false;
  std::vector<Entry> entries;
  bool allows(const std::string& device, int port) const;
};

Result<HcaFilter> parse_hca(const std::string& spec);
// The active ports the filter allows, in listed order; the error names every port seen and why
// none qualified (down, filtered out).
Result<std::vector<Port>> choose_ports(const std::vector<Port>& ports, const HcaFilter& f,
                                       const std::string& spec);

}  // namespace chorus::transport::ib
