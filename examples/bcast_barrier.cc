// bcast_barrier: every rank joins, meets at a barrier, receives broadcasts from rank 0 and
// checks every byte; ranks 0 and 1 then measure point-to-point latency and bandwidth.
// Run: chorus-run -n 4 build/examples/bcast_barrier     (or: mpirun -n 4
// build/examples/bcast_barrier)
// --quick: the correctness part only.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "chorus/chorus.hpp"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Broadcast `bytes` from rank 0 `iters` times; returns seconds per broadcast (max over ranks via
// barrier).
double time_broadcast(chorus::Communicator& comm, std::vector<unsigned char>& buf, size_t bytes,
                      int iters) {
  comm.barrier();
  double t0 = now();
  for (int i = 0; i < iters; ++i) comm.broadcast(buf.data(), bytes, chorusUint8, 0);
  comm.barrier();
  return (now() - t0) / iters;
}

// Ping-pong between ranks 0 and 1: returns one-way seconds per message.
double time_pingpong(chorus::Communicator& comm, std::vector<unsigned char>& buf, size_t bytes,
                     int iters) {
  comm.barrier();
  double t0 = 0;
  for (int i = -iters / 10; i < iters; ++i) {  // the first tenth warms up, untimed
    if (i == 0) t0 = now();
    if (comm.rank() == 0) {
      comm.send(buf.data(), bytes, chorusUint8, 1);
      comm.recv(buf.data(), bytes, chorusUint8, 1);
    } else if (comm.rank() == 1) {
      comm.recv(buf.data(), bytes, chorusUint8, 0);
      comm.send(buf.data(), bytes, chorusUint8, 0);
    }
  }
  double t = (now() - t0) / (2.0 * iters);
  comm.barrier();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;  // correctness only
  try {
    auto comm = chorus::Communicator::from_env();
    const int rank = comm.rank(), size = comm.size();
    const char* transport = std::getenv("CHORUS_TRANSPORT");
    comm.barrier();
    if (rank == 0)
      std::printf("%d ranks joined; transport %s\n", size,
                  transport ? transport : "auto (shm on one host)");

    // Correctness: every rank checks every byte of a broadcast with a rank-0 pattern.
    const size_t check_bytes = (4u << 20) + 13;
    std::vector<unsigned char> buf(64u << 20);
    for (size_t i = 0; i < check_bytes; ++i)
      buf[i] = rank == 0 ? static_cast<unsigned char>(i * 7 + 3) : 0;
    comm.broadcast(buf.data(), check_bytes, chorusUint8, 0);
    size_t wrong = 0;
    for (size_t i = 0; i < check_bytes; ++i)
      wrong += buf[i] != static_cast<unsigned char>(i * 7 + 3);
    std::printf("rank %d: broadcast of %zu bytes checked, %zu wrong\n", rank, check_bytes, wrong);
    comm.barrier();
    if (quick) return wrong == 0 ? 0 : 1;

    if (rank == 0) std::printf("%10s %12s %12s\n", "bytes", "bcast us", "bcast GB/s");
    for (size_t bytes :
         {size_t{8}, size_t{4096}, size_t{1} << 20, size_t{16} << 20, size_t{64} << 20}) {
      int iters = bytes <= 4096 ? 2000 : bytes <= (1u << 20) ? 100 : 10;
      double t = time_broadcast(comm, buf, bytes, iters);
      if (rank == 0) std::printf("%10zu %12.2f %12.3f\n", bytes, t * 1e6, bytes / t / 1e9);
    }
    if (size >= 2) {
      if (rank == 0)
        std::printf("point-to-point, rank 0 <-> rank 1:\n%10s %12s %12s\n", "bytes", "one-way us",
                    "GB/s");
      for (size_t bytes : {size_t{8}, size_t{4096}, size_t{1} << 20, size_t{64} << 20}) {
        int iters = bytes <= 4096 ? 5000 : bytes <= (1u << 20) ? 200 : 10;
        double t = time_pingpong(comm, buf, bytes, iters);
        if (rank == 0) std::printf("%10zu %12.2f %12.3f\n", bytes, t * 1e6, bytes / t / 1e9);
      }
    }
    comm.barrier();
    return wrong == 0 ? 0 : 1;
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "bcast_barrier: %s\n", e.what());
    return 1;
  }
}
