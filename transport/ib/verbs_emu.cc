// Verbs emulated between processes of one host (verbs.h): what an RC queue pair does, in
// shared memory, so the ib link's protocol runs for real in tests on machines without an HCA.
//
// Per opened Nic, POSIX shm objects named /chorus-ibemu-<pid>-<serial>...:
//   ""        the Nic's doorbell (its wake-up source), rung by peers after every write;
//   "-q<qpn>" per queue pair: its state, the receives its owner posted, and a ring of the
//             immediates peers' writes delivered (one entry per consumed receive);
//   "-m<key>" per alloc_remote: a header page (owner's address, size), then the memory.
// A write with immediate runs at once in the writer: check the local key and range (local
// protection error), the peer process and queue pair (retry exceeded), the remote key and range
// (remote access error) and a posted receive (receiver not ready); copy; publish the entry;
// ring the peer. Its send completion is queued locally. After an error completion the queue
// pair is in the error state and every later request completes "flushed", as on hardware.
// Remote writes reach only alloc_remote memory (all the link writes into).
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>

#include "common/log.h"
#include "common/process.h"
#include "transport/ib/verbs.h"
#include "transport/shm/segment.h"

namespace chorus::transport::ib {
namespace {

constexpr uint32_t kNicMagic = 0x4e494345;  // "ECIN"
constexpr uint32_t kQpMagic = 0x51504551;
constexpr uint32_t kMemMagic = 0x4d454d45;
constexpr size_t kMemHeader = 4096;

struct NicShm {
  Doorbell db;
  uint32_t magic;
};

struct alignas(64) QpEntry {
  uint32_t imm;
  uint32_t bytes;
  std::atomic<uint64_t> seq;  // n + 1 once entry n is written
};

struct QpShm {
  uint32_t magic;
  uint32_t depth;
  std::atomic<uint32_t> state;               // 0 reset, 1 ready, 2 error or destroyed
  alignas(64) std::atomic<uint64_t> posted;  // receives posted (owner)
  alignas(64) std::atomic<uint64_t> taken;   // receives consumed by the peer's writes (peer)
  QpEntry entries[1];                        // depth of them
};

struct MemShm {
  uint32_t magic;
  uint64_t owner_base;
  uint64_t bytes;
};

// A mapped shm object.
struct Mapping {
  std::string name;
  void* base = nullptr;
  size_t size = 0;
  bool owner = false;
  ~Mapping() {
    if (base) munmap(base, size);
    if (owner) shm_unlink(name.c_str());
  }
};

Result<std::unique_ptr<Mapping>> map_shm(const std::string& name, size_t size, bool create) {
  int fd = create ? shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600)
                  : shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    return make_error(Code::kSystemError, "ib (emulated): cannot {} /dev/shm{}: {}",
                      create ? "create" : "open", name, strerror(errno));
  if (create && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    return make_error(Code::kSystemError, "ib (emulated): cannot size /dev/shm{} to {} bytes: {}",
                      name, size, strerror(e));
  }
  if (!create) {
    struct stat st {};
    fstat(fd, &st);
    size = static_cast<size_t>(st.st_size);
  }
  void* p = size ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    if (create) shm_unlink(name.c_str());
    return make_error(Code::kSystemError, "ib (emulated): cannot map /dev/shm{} ({} bytes): {}",
                      name, size, strerror(e));
  }
  auto m = std::make_unique<Mapping>();
  m->name = name;
  m->base = p;
  m->size = size;
  m->owner = create;
  return m;
}

std::string nic_name(int pid, uint32_t serial) {
  return fmt::format("/chorus-ibemu-{}-{}", pid, serial);
}

std::atomic<uint32_t> g_serial{0};

class EmuNic final : public Nic {
 private:
  struct Qp {
    std::unique_ptr<Mapping> own, peer_nic, peer_qp;
    std::map<uint32_t, std::unique_ptr<Mapping>> peer_mem;
    std::string peer_base;
    PeerProcess peer;  // the peer rank's process (pid 0 until connected)
    int depth = 0;
    int sends_outstanding = 0;
    bool error = false;
    uint64_t consumed = 0;
    std::deque<uint64_t> recv_ids;
    std::deque<Wc> done;
  };

 public:
  EmuNic(std::string name, uint32_t serial, std::unique_ptr<Mapping> shm)
      : name_(std::move(name)), serial_(serial), shm_(std::move(shm)) {}
  const std::string& name() const override { return name_; }
  bool follows_mapping() const override { return true; }  // writes copy what is there now

  Result<Mr> reg(void* p, size_t n, bool remote_write) override {
    Mr mr;
    mr.base = static_cast<char*>(p);
    mr.bytes = n;
    mr.lkey = next_key_++;
    mr.rkey = 0;
    if (remote_write) {
      auto it = remote_by_addr_.find(mr.base);
      if (it == remote_by_addr_.end())
        return make_error(Code::kInvalidArgument,
                          "ib (emulated): {}: remote writes reach only alloc_remote memory", name_);
      mr.rkey = it->second;
    }
    lkeys_[mr.lkey] = mr;
    return mr;
  }
  void dereg(Mr& mr) override {
    lkeys_.erase(mr.lkey);
    mr = Mr{};
  }

  Result<char*> alloc_remote(size_t n) override {
    uint32_t key = next_key_++;
    CHORUS_ASSIGN_OR_RETURN(auto m,
                            map_shm(fmt::format("{}-m{}", shm_->name, key), kMemHeader + n, true));
    auto* h = static_cast<MemShm*>(m->base);
    char* data = static_cast<char*>(m->base) + kMemHeader;
    h->owner_base = reinterpret_cast<uint64_t>(data);
    h->bytes = n;
    h->magic = kMemMagic;
    remote_by_addr_[data] = key;
    mem_[key] = std::move(m);
    return data;
  }
  void free_remote(char* p, size_t) override {
    auto it = remote_by_addr_.find(p);
    if (it == remote_by_addr_.end()) return;
    mem_.erase(it->second);
    remote_by_addr_.erase(it);
  }

  Result<int> create_qp(int depth, QpAddr* addr) override {
    uint32_t qpn = next_qpn_++;
    size_t size = sizeof(QpShm) + sizeof(QpEntry) * static_cast<size_t>(depth);
    CHORUS_ASSIGN_OR_RETURN(auto m, map_shm(fmt::format("{}-q{}", shm_->name, qpn), size, true));
    auto* q = new (m->base) QpShm();
    q->depth = static_cast<uint32_t>(depth);
    for (int i = 0; i < depth; ++i) new (&q->entries[i]) QpEntry();
    q->magic = kQpMagic;
    Qp qp;
    qp.own = std::move(m);
    qp.depth = depth;
    addr->qpn = qpn;
    addr->psn = qpn * 7919 % (1u << 24);
    addr->lid = 0;
    addr->gid = {};
    uint32_t pid = static_cast<uint32_t>(getpid());
    std::memcpy(&addr->gid[0], "EMU", 4);
    std::memcpy(&addr->gid[4], &pid, 4);
    std::memcpy(&addr->gid[8], &serial_, 4);
    qps_.push_back(std::move(qp));
    return static_cast<int>(qps_.size() - 1);
  }

  Status connect_qp(int i, const QpAddr& r) override {
    Qp& qp = qps_.at(i);
    uint32_t pid = 0, serial = 0;
    std::memcpy(&pid, &r.gid[4], 4);
    std::memcpy(&serial, &r.gid[8], 4);
    if (std::memcmp(&r.gid[0], "EMU", 4) != 0)
      return make_error(Code::kRemoteError,
                        "ib (emulated): {}: peer address is not an emulated port's (gid)", name_);
    std::string base = nic_name(static_cast<int>(pid), serial);
    CHORUS_ASSIGN_OR_RETURN(qp.peer_nic, map_shm(base, 0, false));
    CHORUS_ASSIGN_OR_RETURN(qp.peer_qp, map_shm(fmt::format("{}-q{}", base, r.qpn), 0, false));
    if (static_cast<NicShm*>(qp.peer_nic->base)->magic != kNicMagic ||
        static_cast<QpShm*>(qp.peer_qp->base)->magic != kQpMagic)
      return make_error(Code::kRemoteError,
                        "ib (emulated): {}: peer's objects under {} are not "
                        "an emulated port's",
                        name_, base);
    qp.peer = PeerProcess(static_cast<int>(pid));
    qp.peer_base = base;
    q(qp)->state.store(1, std::memory_order_release);
    return Status::ok();
  }

  // The peer's writable memory for rkey, mapped now (its name goes once set-up is done).
  Result<MemShm*> peer_mem(Qp& qp, uint32_t rkey) {
    auto it = qp.peer_mem.find(rkey);
    if (it != qp.peer_mem.end()) return static_cast<MemShm*>(it->second->base);
    CHORUS_ASSIGN_OR_RETURN(auto m, map_shm(fmt::format("{}-m{}", qp.peer_base, rkey), 0, false));
    auto* h = static_cast<MemShm*>(m->base);
    if (m->size < kMemHeader || h->magic != kMemMagic || h->bytes > m->size - kMemHeader)
      return make_error(Code::kRemoteError, "ib (emulated): bad memory object for rkey {}", rkey);
    qp.peer_mem[rkey] = std::move(m);
    return h;
  }

  // A key that names nothing is no error here: like a real HCA, the write with it fails (remote
  // access error).
  Status expect_writes(int i, uint32_t rkey) override {
    (void)peer_mem(qps_.at(i), rkey);
    return Status::ok();
  }

  void destroy_qp(int i) override {
    Qp& qp = qps_.at(i);
    if (qp.own) q(qp)->state.store(2, std::memory_order_release);
    if (qp.peer_nic) doorbell_ring(&static_cast<NicShm*>(qp.peer_nic->base)->db);
    qp = Qp{};
  }

  Status post_recv(int i, uint64_t wr_id) override {
    Qp& qp = qps_.at(i);
    if (qp.recv_ids.size() >= static_cast<size_t>(qp.depth))
      return make_error(Code::kInternalError, "ib (emulated): {}: receive queue full ({})", name_,
                        qp.depth);
    qp.recv_ids.push_back(wr_id);
    q(qp)->posted.fetch_add(1, std::memory_order_release);
    return Status::ok();
  }

  Status post_write_imm(int i, uint64_t wr_id, const Mr& local, const char* src, size_t n,
                        uint64_t raddr, uint32_t rkey, uint32_t imm) override {
    Qp& qp = qps_.at(i);
    if (qp.sends_outstanding >= qp.depth)
      return make_error(Code::kInternalError, "ib (emulated): {}: send queue full ({})", name_,
                        qp.depth);
    ++qp.sends_outstanding;
    qp.done.push_back({wr_id, false, write(qp, local, src, n, raddr, rkey, imm), 0, 0});
    if (qp.done.back().status != kWcSuccess) qp.error = true;
    return Status::ok();
  }

  int poll(int i, Wc* out, int max) override {
    Qp& qp = qps_.at(i);
    int k = 0;
    while (k < max && !qp.done.empty()) {
      out[k++] = qp.done.front();
      qp.done.pop_front();
      --qp.sends_outstanding;
    }
    QpShm* mine = q(qp);
    while (k < max && !qp.recv_ids.empty()) {
      QpEntry& e = mine->entries[qp.consumed % qp.depth];
      if (e.seq.load(std::memory_order_acquire) != qp.consumed + 1) break;
      out[k++] = {qp.recv_ids.front(), true, kWcSuccess, e.imm, e.bytes};
      qp.recv_ids.pop_front();
      ++qp.consumed;
    }
    return k;
  }

  Status peer_alive(int i) override {
    Qp& qp = qps_.at(i);
    if (qp.peer.gone())
      return make_error(Code::kRemoteError, "its process {} is gone (exited or killed)",
                        qp.peer.pid());
    return Status::ok();
  }

  void unlink_names() override {
    shm_unlink(shm_->name.c_str());
    shm_->owner = false;
    for (Qp& qp : qps_)
      if (qp.own) shm_unlink(qp.own->name.c_str()), qp.own->owner = false;
    for (auto& [key, m] : mem_) shm_unlink(m->name.c_str()), m->owner = false;
  }

  // WakeSource: the Nic's doorbell.
  bool has_doorbell() const override { return true; }
  uint32_t arm() override {
    db()->sleepers.fetch_add(1, std::memory_order_seq_cst);
    return db()->seq.load(std::memory_order_seq_cst);
  }
  bool rung_since(uint32_t seen) const override {
    return db()->seq.load(std::memory_order_seq_cst) != seen;
  }
  void wait(uint32_t seen, int ms) override { doorbell_wait(db(), seen, ms); }
  void disarm() override { db()->sleepers.fetch_sub(1, std::memory_order_seq_cst); }
  void ring() override { doorbell_ring(db()); }

  static QpShm* q(Qp& qp) { return static_cast<QpShm*>(qp.own->base); }
  Doorbell* db() const { return &static_cast<NicShm*>(shm_->base)->db; }

  int write(Qp& qp, const Mr& local, const char* src, size_t n, uint64_t raddr, uint32_t rkey,
            uint32_t imm) {
    if (qp.error || !qp.peer_qp) return kWcWrFlushErr;
    auto lk = lkeys_.find(local.lkey);
    if (lk == lkeys_.end() || !lk->second.covers(src, n)) return kWcLocProtErr;
    auto* peer = static_cast<QpShm*>(qp.peer_qp->base);
    if (peer->state.load(std::memory_order_acquire) != 1 ||
        (kill(qp.peer.pid(), 0) != 0 && errno == ESRCH))  // per write: the cheap look only
      return kWcRetryExcErr;
    auto mem = peer_mem(qp, rkey);
    if (!mem.is_ok()) return kWcRemAccessErr;
    MemShm* h = *mem;
    if (raddr < h->owner_base || n > h->bytes || raddr - h->owner_base > h->bytes - n)
      return kWcRemAccessErr;
    uint64_t t = peer->taken.load(std::memory_order_relaxed);
    if (t >= peer->posted.load(std::memory_order_acquire)) return kWcRnrRetryExcErr;
    if (n) std::memcpy(reinterpret_cast<char*>(h) + kMemHeader + (raddr - h->owner_base), src, n);
    QpEntry& e = peer->entries[t % peer->depth];
    e.imm = imm;
    e.bytes = static_cast<uint32_t>(n);
    e.seq.store(t + 1, std::memory_order_release);
    peer->taken.store(t + 1, std::memory_order_release);
    doorbell_ring(&static_cast<NicShm*>(qp.peer_nic->base)->db);
    return kWcSuccess;
  }

  std::string name_;
  uint32_t serial_;
  std::unique_ptr<Mapping> shm_;
  std::deque<Qp> qps_;
  std::map<uint32_t, Mr> lkeys_;
  std::map<char*, uint32_t> remote_by_addr_;
  std::map<uint32_t, std::unique_ptr<Mapping>> mem_;
  uint32_t next_key_ = 1;
  uint32_t next_qpn_ = 1;
};

}  // namespace

// "emu0", "emu0:1,emu1:2=down": devices, their ports, and which are down.
Result<std::vector<Port>> emu_list_ports(const std::string& spec) {
  std::vector<Port> out;
  size_t i = 0;
  while (i <= spec.size()) {
    size_t end = spec.find(',', i);
    std::string item = spec.substr(i, end == std::string::npos ? std::string::npos : end - i);
    Port p;
    p.active = true;
    if (item.size() > 5 && item.compare(item.size() - 5, 5, "=down") == 0) {
      p.active = false;
      item.resize(item.size() - 5);
    }
    size_t colon = item.find(':');
    p.device = item.substr(0, colon);
    if (colon != std::string::npos) {
      std::string port = item.substr(colon + 1);
      p.port = port.size() == 1 && port[0] >= '1' && port[0] <= '9' ? port[0] - '0' : 0;
    }
    if (p.device.empty() || p.port == 0)
      return make_error(Code::kInvalidArgument,
                        "CHORUS_IB_EMULATE='{}': '{}' is not a device[:port 1-9][=down]", spec,
                        item);
    out.push_back(p);
    if (end == std::string::npos) break;
    i = end + 1;
  }
  return out;
}

Result<std::shared_ptr<Nic>> emu_open_nic(const Port& port) {
  uint32_t serial = g_serial.fetch_add(1);
  CHORUS_ASSIGN_OR_RETURN(auto m, map_shm(nic_name(getpid(), serial), sizeof(NicShm), true));
  auto* h = new (m->base) NicShm();
  h->magic = kNicMagic;
  return std::shared_ptr<Nic>(new EmuNic(port.name() + " (emulated)", serial, std::move(m)));
}

}  // namespace chorus::transport::ib
