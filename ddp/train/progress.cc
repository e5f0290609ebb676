// ProgressBar drawing.
#include "ddp/train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

namespace chorus {

ProgressBar::ProgressBar(std::FILE* out, std::string label, int64_t total_steps, bool enabled,
                         int ranks)
    : out_(out),
      label_(std::move(label)),
      total_(total_steps > 0 ? total_steps : 1),
      loss_label_(ranks > 1 ? "loss (rank 0)" : "loss"),
      rate_label_(ranks > 1 ? fmt::format("images/s ({} ranks)", ranks) : "images/s"),
      enabled_(enabled),
      tty_(isatty(fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  next_plain_ = total_ / 10;
}

void ProgressBar::update(int64_t step, double mean_loss, int64_t images) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double ips = secs > 0 ? static_cast<double>(images) / secs : 0.0;
  if (tty_) {
    if (step < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * step / total_);
    fmt::print(out_, "\r{} [{}{}] {:3d}% {} {:.4f} {:.0f} {}", label_, std::string(filled, '='),
               std::string(kWidth - filled, ' '), static_cast<int>(100 * step / total_),
               loss_label_, mean_loss, ips, rate_label_);
    std::fflush(out_);
    return;
  }
  if (step < next_plain_ || step >= total_) return;
  next_plain_ += total_ / 10 > 0 ? total_ / 10 : 1;
  fmt::print(out_, "{} step {}/{} {} {:.4f} {:.0f} {}\n", label_, step, total_, loss_label_,
             mean_loss, ips, rate_label_);
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (!enabled_ || !tty_) return;
  fmt::print(out_, "\r{}\r", std::string(label_.size() + 80, ' '));
  std::fflush(out_);
}

}  // namespace chorus
