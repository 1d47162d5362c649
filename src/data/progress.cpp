#include "data/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace loom {
namespace {

// One number through a printf format.
std::string format(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

std::string clock_text(double seconds) {
  const long s = std::lround(std::max(seconds, 0.0));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

}  // namespace

ProgressStyle progress_style_for_stderr() {
  return ::isatty(STDERR_FILENO) ? ProgressStyle::bar : ProgressStyle::lines;
}

Progress::Progress(std::string label, double total, std::string unit, ProgressStyle style, std::FILE* out,
                   double line_interval_s)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      style_(style),
      out_(out),
      line_interval_s_(line_interval_s),
      start_(Clock::now()),
      last_draw_(start_) {}

double Progress::scaled(double units) const {
  return unit_ == "MB" ? units / 1e6 : units;
}

// Megabytes with one decimal, counts whole.
std::string Progress::amount(double units) const {
  return format(unit_ == "MB" ? "%.1f" : "%.0f", scaled(units));
}

// "45% (450.0 of 1000.0 MB), 41.2 MB/s, ETA 0:13", without what is unknown.
std::string Progress::status(double done, double seconds) const {
  const double rate = seconds > 0 ? done / seconds : 0;
  std::string s;
  if (total_ > 0)
    s = format("%.0f%% (", 100 * std::min(done / total_, 1.0)) + amount(done) + " of " + amount(total_) +
        " " + unit_ + ")";
  else
    s = amount(done) + " " + unit_;
  s += ", " + amount(rate) + " " + unit_ + "/s";
  if (total_ > 0 && done > 0 && seconds > 0) s += ", ETA " + clock_text((total_ - done) / (done / seconds));
  return s;
}

void Progress::update(double done) {
  if (style_ == ProgressStyle::none) return;
  const auto now = Clock::now();
  const double since_draw = std::chrono::duration<double>(now - last_draw_).count();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  if (style_ == ProgressStyle::lines) {
    if (since_draw < line_interval_s_) return;
    std::fprintf(out_, "loom: %s %s\n", label_.c_str(), status(done, seconds).c_str());
  } else {
    if (drawn_ && since_draw < 0.2) return;
    constexpr int kWidth = 30;
    const double fraction = total_ > 0 ? std::min(done / total_, 1.0) : 0;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(out_, "\r%s [%s] %s\x1b[K", label_.c_str(), bar.c_str(), status(done, seconds).c_str());
  }
  std::fflush(out_);
  last_draw_ = now;
  drawn_ = true;
}

void Progress::finish(double done) {
  if (style_ == ProgressStyle::none) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  if (style_ == ProgressStyle::bar && drawn_) std::fprintf(out_, "\r\x1b[K");
  std::fprintf(out_, "loom: %s done: %s %s in %.1f s (%s %s/s)\n", label_.c_str(), amount(done).c_str(),
               unit_.c_str(), seconds, amount(seconds > 0 ? done / seconds : 0.0).c_str(), unit_.c_str());
  std::fflush(out_);
}

}  // namespace loom
