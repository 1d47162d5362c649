// The HTML page in headless Chromium (Debian's chromium): it loads, its DOM holds the seed's
// figures and both charts, and a screenshot is taken. Skips when chromium is absent.
// LOOM_RENDER_SCREENSHOT=FILE.png keeps the screenshot for a look.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "recipe/render.h"
#include "recipe_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// chromium on PATH (or LOOM_CHROMIUM); "" when there is none.
std::string find_chromium() {
  if (const char* given = std::getenv("LOOM_CHROMIUM"); given && *given) return given;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    for (const char* name : {"chromium", "chromium-browser"}) {
      const fs::path candidate = fs::path(dirs.substr(start, end - start)) / name;
      if (!candidate.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
    start = end + 1;
  }
  return "";
}

std::pair<std::string, int> run_capture(const std::string& command) {
  std::string out;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {"", -1};
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

TEST(RenderBrowser, SeedPageLoadsInChromiumWithItsFigures) {
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "chromium is not installed (Debian package chromium; scripts/setup.sh)";
  test::TempDir tmp;
  RunSeries run;
  run.source = "runs/seed";
  for (int64_t step = 1; step <= 20; ++step) {
    run.steps.push_back(step);
    run.loss.push_back(1.05 - 0.3 * (1.0 - std::exp(-0.15 * static_cast<double>(step))));
    run.step_time_s.push_back(step <= 3 ? 75.0 - 5.0 * static_cast<double>(step)
                                        : 59.6 + 0.3 * static_cast<double>((step * 7) % 5) / 4.0);
  }
  const std::string text = test::read_text(test::seed_path());
  const std::string html = tmp.file("seed.html");
  test::write_text(html, recipe_render(YAML::Load(text), text, RenderFormat::html, &run));

  // A profile of its own in the scratch folder; --no-sandbox: tests may run as root.
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run"
      " --user-data-dir=" +
      tmp.file("profile") + " --window-size=1100,2400 ";
  const char* keep = std::getenv("LOOM_RENDER_SCREENSHOT");
  const std::string png = keep && *keep ? std::string(keep) : tmp.file("seed.png");
  // One launch takes the screenshot and prints the DOM after the page has loaded.
  auto [dom, status] =
      run_capture(chromium + flags + "--screenshot=" + png + " --dump-dom file://" + html + " 2>/dev/null");
  ASSERT_EQ(status, 0) << dom;
  ASSERT_TRUE(fs::exists(png));
  const std::string bytes = test::read_text(png);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_GT(bytes.size(), 20000u) << "a blank page compresses to a few KB";
  for (const char* figure : {"Training Qwen3-32B on H200", "2,200.16", "$1.00", "42.7%", "31,983,534,080",
                             "0.45%", "0.9999998", "0.00012", "2026-10-18", "3.02", "8 x H200 141 GB"})
    EXPECT_NE(dom.find(figure), std::string::npos) << figure << " is not in the DOM";
  EXPECT_NE(dom.find("aria-label=\"Loss per step\""), std::string::npos);
  EXPECT_NE(dom.find("aria-label=\"Step time per step\""), std::string::npos);
  EXPECT_NE(dom.find("<circle"), std::string::npos) << "the SVG points are parsed into the DOM";
}

}  // namespace
}  // namespace loom
