// chorus-perf output (see report.h). The table copies nccl-tests' layout column for column.
#include "perf/report.h"

#include <fmt/core.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

namespace perf {
namespace {

// nccl-tests: 2 decimals below 100 us, 1 below 10 ms, none above.
std::string time_str(double us) {
  if (us >= 10000.0) return fmt::format("{:7.0f}", us);
  if (us >= 100.0) return fmt::format("{:7.1f}", us);
  return fmt::format("{:7.2f}", us);
}

std::string wrong_str(long long wrong) {
  return wrong < 0 ? "N/A" : std::to_string(wrong);
}

std::string env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : dflt;
}

nlohmann::json measure_json(const Measure& m) {
  nlohmann::json j = {{"time_us", m.avg_us}, {"median_us", m.median_us}, {"p10_us", m.p10_us},
                      {"p90_us", m.p90_us},  {"min_us", m.min_us},       {"max_us", m.max_us},
                      {"iters", m.iters},    {"algbw_GBps", m.algbw},    {"busbw_GBps", m.busbw}};
  j["wrong"] = m.wrong < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.wrong);
  if (m.eff >= 0) j["efficiency"] = m.eff;
  if (m.host_us >= 0) j["host_us"] = m.host_us;
  return j;
}

}  // namespace

void Reporter::header(const std::vector<std::string>& rank_lines) {
  if (!active_) return;
  if (opt_.csv) {
    std::printf(
        "size,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong,"
        "ip_time_us,ip_algbw_GBps,ip_busbw_GBps,ip_wrong\n");
    std::fflush(stdout);
    return;
  }
  std::printf(
      "# chorus-perf %s: nranks %d minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d "
      "iters: %d validation: %d\n",
      coll_name(opt_.coll), nranks_, opt_.min_bytes, opt_.max_bytes,
      opt_.factor > 1 ? opt_.factor : static_cast<double>(opt_.step_bytes),
      opt_.factor > 1 ? "factor" : "bytes", opt_.warmup, opt_.iters, opt_.check ? 1 : 0);
  std::printf("# CHORUS_TRANSPORT=%s CHORUS_ALGO=%s CHORUS_DETERMINISTIC=%s\n",
              env_or("CHORUS_TRANSPORT", "auto").c_str(), env_or("CHORUS_ALGO", "auto").c_str(),
              env_or("CHORUS_DETERMINISTIC", "0").c_str());
  const bool dev = opt_.device == "cuda";
  if (dev)
    std::printf(
        "# buffers on the GPU; local copy traffic %.0f GB/s; eff = least traffic / time / that "
        "rate;\n# host = the host's time per call (enqueueing; time - host: the GPU's alone)\n",
        opt_.copy_gbs);
  std::printf("#\n# Using ranks\n");
  for (const auto& line : rank_lines) std::printf("#  %s\n", line.c_str());
  std::printf("#\n");
  std::printf(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
      "\n",
      "", "", "", "", "");
  std::printf("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
  for (int v = 0; v < 2; ++v) {
    std::printf("  %7s  %6s  %6s  %6s", "time", "algbw", "busbw", "#wrong");
    if (dev) std::printf("  %5s  %7s", "eff", "host");
  }
  std::printf("\n# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
  for (int v = 0; v < 2; ++v) {
    std::printf("  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "");
    if (dev) std::printf("  %5s  %7s", "", "(us)");
  }
  std::printf("\n");
  std::fflush(stdout);
}

void Reporter::row(const Row& r) {
  rows_.push_back(r);
  for (const Measure* m : {&r.out_of_place, &r.in_place}) {
    busbw_sum_ += m->busbw;
    busbw_count_ += 1;
    if (m->wrong > 0) wrong_ += m->wrong;
  }
  if (!active_) return;
  if (!opt_.result_label.empty()) {  // bench_common.h's print_result(), from the median
    const Measure& m = r.out_of_place;
    const double algbw = m.median_us > 0 ? r.bytes / (m.median_us * 1e3) : 0;
    std::printf(
        "RESULT peer=%s ranks=%d bytes=%zu iters=%d median_us=%.3f p10_us=%.3f p90_us=%.3f "
        "min_us=%.3f algbw_GBps=%.4f busbw_GBps=%.4f\n",
        opt_.result_label.c_str(), nranks_, r.bytes, m.iters, m.median_us, m.p10_us, m.p90_us,
        m.min_us, algbw, algbw * bus_factor(opt_.coll, nranks_));
  }
  if (opt_.csv) {
    std::string line = fmt::format("{},{},{},{},{}", r.bytes, r.count, r.type, r.redop, r.root);
    for (const Measure* m : {&r.out_of_place, &r.in_place}) {
      line += fmt::format(",{:.3f},{:.4f},{:.4f},{}", m->avg_us, m->algbw, m->busbw,
                          wrong_str(m->wrong));
    }
    std::printf("%s\n", line.c_str());
  } else {
    std::printf("%12zu  %12zu  %8s  %6s  %6d", r.bytes, r.count, r.type, r.redop, r.root);
    for (const Measure* m : {&r.out_of_place, &r.in_place}) {
      std::printf("  %7s  %6.2f  %6.2f  %5s", time_str(m->avg_us).c_str(), m->algbw, m->busbw,
                  wrong_str(m->wrong).c_str());
      if (m->eff >= 0) std::printf("  %5.3f", m->eff);
      if (m->host_us >= 0) std::printf("  %7s", time_str(m->host_us).c_str());
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

long long Reporter::footer() {
  if (active_ && !opt_.csv) {
    std::printf("# Wrong elements       : %lld %s\n", wrong_, wrong_ ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n", busbw_count_ ? busbw_sum_ / busbw_count_ : 0.0);
    std::printf("#\n");
    std::fflush(stdout);
  }
  return wrong_;
}

bool Reporter::write_json(const std::vector<std::string>& rank_lines) const {
  if (!active_ || opt_.json_path.empty()) return true;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  char date[32] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json j = {
      {"program", "chorus-perf"},
      {"coll", coll_name(opt_.coll)},
      {"nranks", nranks_},
      {"host", host},
      {"date", date},
      {"transport", env_or("CHORUS_TRANSPORT", "auto")},
      {"algo", env_or("CHORUS_ALGO", "auto")},
      {"deterministic", env_or("CHORUS_DETERMINISTIC", "0") == "1"},
      {"iters", opt_.iters},
      {"warmup_iters", opt_.warmup},
      {"check", opt_.check},
      {"device", opt_.device},
      {"ranks", rank_lines},
      {"avg_busbw_GBps", busbw_count_ ? busbw_sum_ / busbw_count_ : 0.0},
      {"wrong", wrong_},
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& r : rows_) {
    rows.push_back({{"size", r.bytes},
                    {"count", r.count},
                    {"type", r.type},
                    {"redop", r.redop},
                    {"root", r.root},
                    {"out_of_place", measure_json(r.out_of_place)},
                    {"in_place", measure_json(r.in_place)}});
  }
  j["results"] = rows;
  std::ofstream f(opt_.json_path);
  f << j.dump(2) << "\n";
  if (!f) {
    std::fprintf(stderr, "chorus-perf: cannot write %s\n", opt_.json_path.c_str());
    return false;
  }
  return true;
}

}  // namespace perf
