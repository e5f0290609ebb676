// [cuda] The library's view of a real GPU (run by tests/gpu/run.sh where a GPU is lent):
//   shared_gpu_probe CHORUS_RUN     runs two workers on device 0: without the override (started
//                                   side by side) both must fail naming the GPU's UUID; with
//                                   CHORUS_ALLOW_SHARED_GPU=1 (through chorus-run) both create
//                                   the communicator, all-reduces of host and of device memory
//                                   work, and a chorusIsend of device memory (a call without a
//                                   device path: device sends go in a group) is refused by name.
//   shared_gpu_probe --worker       one worker (uses CUDA first, as GPU programs do).
// Exits 77 with the reason where no GPU is visible.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

#include <chorus/chorus.h>

namespace {

int worker() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // a refused rank's line must not die in a buffer
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) return 10;
  chorusComm_t comm;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::printf("init refused: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  float x = 1.0f;
  if (chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess ||
      x != 2.0f) {
    std::printf("host all-reduce failed: %s\n", chorusGetLastError(comm));
    return 3;
  }
  float* dev = nullptr;
  if (cudaMalloc(&dev, 64) != cudaSuccess) return 11;
  const float one[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  float back[16] = {0};
  // A device all-reduce runs (CUDA IPC); a device chorusIsend (no device path) is refused by
  // name.
  int rc = 0;
  if (cudaMemcpy(dev, one, sizeof one, cudaMemcpyHostToDevice) != cudaSuccess ||
      chorusAllReduce(dev, dev, 16, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess ||
      cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost) != cudaSuccess ||
      back[15] != 2.0f) {
    std::printf("device all-reduce failed: %s (got %g)\n", chorusGetLastError(comm), back[15]);
    rc = 4;
  }
  int rank = 0;
  chorusCommUserRank(comm, &rank);
  chorusRequest_t req = nullptr;
  chorusResult_t b = chorusIsend(dev, 8, chorusFloat32, 1 - rank, 0, comm, &req);
  std::printf("device chorusIsend: %s\n",
              b == chorusSuccess ? "accepted" : chorusGetLastError(comm));
  if (b != chorusInvalidArgument) rc = 5;
  cudaFree(dev);
  chorusCommDestroy(comm);
  return rc;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  std::fputs(out.c_str(), stdout);
  return out;
}

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t i = s.find(part); i != std::string::npos; i = s.find(part, i + 1)) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--worker") == 0) return worker();
  if (argc != 2) {
    std::fprintf(stderr, "usage: shared_gpu_probe CHORUS_RUN | --worker\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skip: no CUDA device visible\n");
    return 77;
  }
  std::string self = std::string(argv[0]) + " --worker";
  int failed = 0;
  // Without the override the two workers are started side by side (torchrun-style variables)
  // rather than by chorus-run: chorus-run stops the other ranks as soon as one fails, which can
  // cut the second refusal off before it is printed (seen on an H200).
  int port = 20000 + static_cast<int>(getpid() % 20000);
  std::string env =
      "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
      " CHORUS_TIMEOUT=30 ";
  std::string refused = run("(" + env + "RANK=0 LOCAL_RANK=0 " + self + " & " + env +
                            "RANK=1 LOCAL_RANK=1 " + self + " & wait)");
  if (count(refused, "ranks 0 and 1 both use GPU GPU-") != 2) {
    std::printf("FAIL: without the override, not both ranks named the shared GPU\n");
    failed++;
  }
  std::string allowed = run("CHORUS_ALLOW_SHARED_GPU=1 " + std::string(argv[1]) + " -n 2 " + self);
  if (count(allowed, "device all-reduce failed") != 0) {
    std::printf("FAIL: with the override, the device all-reduce failed\n");
    failed++;
  }
  if (count(allowed, "device buffers are sent by chorusSend") != 2) {
    std::printf(
        "FAIL: with the override, the device chorusIsend was not refused by name on both ranks\n");
    failed++;
  }
  std::printf("%s\n", failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
