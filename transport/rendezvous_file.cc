// The mpirun rendezvous file (see rendezvous_file.h).
#include "transport/rendezvous_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sstream>

#include "common/env.h"
#include "common/process.h"
#include "common/socket.h"

namespace chorus::transport {
namespace {

constexpr size_t kMaxFileBytes = 4096;

std::string mode_text(mode_t m) {
  return fmt::format("{:04o}", m & 07777);
}

// Opens the directory without following a link and checks that only this user can use it.
Result<Fd> open_private_dir(const std::string& dir) {
  Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    int e = errno;
    struct stat st {};
    if (lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      return make_error(
          Code::kInvalidUsage,
          "bootstrap: {} is a symbolic link: refusing to use it for the rendezvous file "
          "(remove it, or export MASTER_ADDR and MASTER_PORT)",
          dir);
    return make_error(Code::kSystemError, "bootstrap: cannot open {}: {}", dir, strerror(e));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0)
    return make_error(Code::kSystemError, "bootstrap: stat {}: {}", dir, strerror(errno));
  if (st.st_uid != geteuid())
    return make_error(
        Code::kInvalidUsage,
        "bootstrap: {} belongs to uid {}, not to this user (uid {}): refusing to use it "
        "for the rendezvous file (remove it, or export MASTER_ADDR and MASTER_PORT)",
        dir, st.st_uid, geteuid());
  if ((st.st_mode & 077) != 0)
    return make_error(Code::kInvalidUsage,
                      "bootstrap: {} has mode {}, readable by others: refusing to use it for the "
                      "rendezvous file (chmod 700 it, or remove it)",
                      dir, mode_text(st.st_mode));
  return fd;
}

std::string file_name(const Secret& secret) {
  uint64_t id = derive_id(secret, "chorus/v2/rendezvous-file");
  return fmt::format("rdzv-{:016x}", id);
}

bool pid_alive(int pid) {
  return pid > 0 && !process_gone(pid);
}

bool all_digits(const std::string& v) {
  return !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos;
}

Result<int> parse_int(const std::string& v, const char* field, long lo, long hi) {
  if (!all_digits(v))
    return make_error(Code::kRemoteError, "rendezvous file: {} '{}' is not a number in {}..{}",
                      field, v, lo, hi);
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
    return make_error(Code::kRemoteError, "rendezvous file: {} '{}' is not a number in {}..{}",
                      field, v, lo, hi);
  return static_cast<int>(x);
}

}  // namespace

Result<RendezvousRecord> parse_rendezvous_record(const std::string& text) {
  if (text.size() > kMaxFileBytes)
    return make_error(Code::kRemoteError, "rendezvous file: {} bytes (limit {})", text.size(),
                      kMaxFileBytes);
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != "chorus-rdzv 1")
    return make_error(Code::kRemoteError, "rendezvous file: first line is not 'chorus-rdzv 1'");
  RendezvousRecord r;
  bool have_host = false, have_port = false, have_pid = false;
  while (std::getline(in, line)) {
    auto sp = line.find(' ');
    if (sp == std::string::npos)
      return make_error(Code::kRemoteError, "rendezvous file: line without a value");
    std::string key = line.substr(0, sp), v = line.substr(sp + 1);
    if (key == "host") {
      if (v.empty() || v.size() > 255 || v.find_first_of(" \t\r") != std::string::npos)
        return make_error(Code::kRemoteError,
                          "rendezvous file: host is empty, too long or has blanks");
      r.host = v;
      have_host = true;
    } else if (key == "port") {
      CHORUS_ASSIGN_OR_RETURN(r.port, parse_int(v, "port", 1, 65535));
      have_port = true;
    } else if (key == "pid") {
      CHORUS_ASSIGN_OR_RETURN(r.pid, parse_int(v, "pid", 1, (1L << 31) - 1));
      have_pid = true;
    } else if (key == "job") {
      if (v.empty() || v.size() > 255)
        return make_error(Code::kRemoteError, "rendezvous file: job id is empty or too long");
      r.job = v;
    } else if (key == "start") {
      char* end = nullptr;
      errno = 0;
      unsigned long long x = all_digits(v) ? std::strtoull(v.c_str(), &end, 10) : 0;
      if (!all_digits(v) || *end != '\0' || errno != 0)
        return make_error(Code::kRemoteError, "rendezvous file: start '{}' is not a number", v);
      r.start_ns = x;
    }  // unknown keys: written by a newer chorus, ignored
  }
  if (!have_host || !have_port || !have_pid)
    return make_error(Code::kRemoteError, "rendezvous file: host, port or pid missing");
  return r;
}

std::string format_rendezvous_record(const RendezvousRecord& r) {
  return fmt::format("chorus-rdzv 1\nhost {}\nport {}\npid {}\njob {}\nstart {}\n", r.host, r.port,
                     r.pid, r.job, r.start_ns);
}

std::string launcher_job_id() {
  for (const char* v : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"})
    if (auto id = env_get(v);
        id && !id->empty() && id->size() <= 255 && id->find_first_of(" \n") == std::string::npos)
      return *id;
  return "-";
}

Result<std::string> rendezvous_dir() {
  std::string base = env_str("TMPDIR", "/tmp");
  if (base.empty() || base[0] != '/') base = "/tmp";
  std::string dir = fmt::format("{}/chorus-{}", base, geteuid());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return make_error(Code::kSystemError, "bootstrap: cannot create {}: {}", dir, strerror(errno));
  CHORUS_TRY(open_private_dir(dir));
  return dir;
}

Result<std::string> rendezvous_path(const Secret& secret) {
  CHORUS_ASSIGN_OR_RETURN(std::string dir, rendezvous_dir());
  return dir + "/" + file_name(secret);
}

Result<std::function<void()>> publish_rendezvous(const Secret& secret, const RendezvousRecord& r) {
  CHORUS_ASSIGN_OR_RETURN(std::string dir, rendezvous_dir());
  CHORUS_ASSIGN_OR_RETURN(Fd dfd, open_private_dir(dir));
  const std::string name = file_name(secret);
  std::string tmp;
  Fd f;
  for (int attempt = 0; attempt < 16 && !f.valid(); ++attempt) {
    uint32_t salt = 0;
    CHORUS_TRY(random_bytes(&salt, sizeof salt));
    tmp = fmt::format("{}.tmp.{}.{:08x}", name, getpid(), salt);
    f.reset(
        openat(dfd.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!f.valid() && errno != EEXIST)
      return make_error(Code::kSystemError, "bootstrap: cannot create {}/{}: {}", dir, tmp,
                        strerror(errno));
  }
  if (!f.valid())
    return make_error(Code::kSystemError, "bootstrap: no free temporary name in {}", dir);
  std::string text = format_rendezvous_record(r);
  bool ok = write(f.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
  struct stat st {};
  ok = ok && fstat(f.get(), &st) == 0;
  f.reset();
  if (!ok || renameat(dfd.get(), tmp.c_str(), dfd.get(), name.c_str()) != 0) {
    int e = errno;
    unlinkat(dfd.get(), tmp.c_str(), 0);
    return make_error(Code::kSystemError, "bootstrap: cannot publish {}/{}: {}", dir, name,
                      strerror(e));
  }
  dev_t dev = st.st_dev;
  ino_t ino = st.st_ino;
  return std::function<void()>([dir, name, dev, ino] {
    auto d = open_private_dir(dir);
    if (!d.is_ok()) return;
    struct stat now {};
    if (fstatat(d->get(), name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == dev &&
        now.st_ino == ino)
      unlinkat(d->get(), name.c_str(), 0);
  });
}

Result<RendezvousRecord> read_rendezvous(const Secret& secret, const std::string& my_job) {
  CHORUS_ASSIGN_OR_RETURN(std::string dir, rendezvous_dir());
  CHORUS_ASSIGN_OR_RETURN(Fd dfd, open_private_dir(dir));
  const std::string path = dir + "/" + file_name(secret);
  Fd f(
      openat(dfd.get(), file_name(secret).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!f.valid()) {
    if (errno == ENOENT) return make_error(Code::kTimeout, "no file {} yet", path);
    return make_error(Code::kTimeout, "skipped {}: {}", path,
                      errno == ELOOP ? "a symbolic link" : strerror(errno));
  }
  struct stat st {};
  if (fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode))
    return make_error(Code::kTimeout, "skipped {}: not a regular file", path);
  if (st.st_uid != geteuid())
    return make_error(Code::kTimeout, "skipped {}: it belongs to uid {}, not to this user", path,
                      st.st_uid);
  if ((st.st_mode & 077) != 0)
    return make_error(Code::kTimeout, "skipped {}: mode {}, open to others", path,
                      mode_text(st.st_mode));
  std::string text(kMaxFileBytes + 1, '\0');
  ssize_t n = read(f.get(), text.data(), text.size());
  if (n < 0) return make_error(Code::kTimeout, "skipped {}: {}", path, strerror(errno));
  text.resize(static_cast<size_t>(n));
  auto r = parse_rendezvous_record(text);
  if (!r.is_ok())
    return Status(Code::kTimeout, fmt::format("skipped {}: {}", path, r.status().message()));
  if (r->job != my_job)
    return make_error(Code::kTimeout, "skipped {}: written for job {}, this is job {}", path,
                      r->job, my_job);
  if (!pid_alive(r->pid))
    return make_error(Code::kTimeout, "skipped {}: its writer (pid {}) is gone (a stale file)",
                      path, r->pid);
  return r;
}

}  // namespace chorus::transport
