// Host identity: which ranks share a machine (and so can use shared memory).
#pragma once

#include <string>

namespace chorus::transport {

// hostname + boot id + network namespace: robust where IP addresses are not (several NICs,
// NAT, containers), and two network namespaces on one machine count as two hosts.
// CHORUS_HOSTID overrides it (tests, unusual setups).
std::string host_id();
std::string host_name();

}  // namespace chorus::transport
