#include "tools/ckpt/output.h"

#include <unistd.h>

#include <iostream>
#include <utility>

namespace ckpt {

bool StdoutIsTerminal() { return isatty(STDOUT_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), enabled_(StdoutIsTerminal()) {}

ProgressBar::~ProgressBar() {
  if (enabled_ && drawn_) std::cout << "\n" << std::flush;
}

void ProgressBar::Update(int64_t done, int64_t total, const std::string& unit_text) {
  if (!enabled_ || total <= 0) return;
  const int width = 30;
  const int filled = static_cast<int>(width * done / total);
  std::cout << "\r" << label_ << " [" << std::string(filled, '=')
            << std::string(width - filled, ' ') << "] " << (100 * done / total) << "% " << unit_text
            << std::flush;
  drawn_ = true;
}

void PrintLeftOut(const std::vector<std::string>& left_out) {
  if (left_out.empty()) return;
  std::cout << "left out:\n";
  for (const std::string& item : left_out) std::cout << "  " << item << "\n";
}

}  // namespace ckpt
