// Host identity.
#include "transport/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "common/env.h"

namespace chorus::transport {

std::string host_name() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string host_id() {
  if (auto v = env_get("CHORUS_HOSTID")) return *v;
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  struct stat st {};
  std::string netns = stat("/proc/self/ns/net", &st) == 0 ? std::to_string(st.st_ino) : "?";
  return host_name() + "/" + boot + "/net:" + netns;
}

}  // namespace chorus::transport
