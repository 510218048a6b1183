#ifndef CKPT_TOOLS_CKPT_OUTPUT_H_
#define CKPT_TOOLS_CKPT_OUTPUT_H_

// What several `ckpt` commands print the same way: a progress bar while a long call runs (only on
// a terminal, so pipes and tests see the same lines with or without one), and what a written file
// left out.

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

bool StdoutIsTerminal();

// A one-line progress bar on stdout, redrawn in place; only on a terminal. The line is ended when
// the bar goes, if it was drawn.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `done` of `total` (nothing drawn while `total` <= 0), with `unit_text` after the percentage.
  void Update(int64_t done, int64_t total, const std::string& unit_text);

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
};

// What a written file does not hold, one item a line; nothing when `left_out` is empty.
void PrintLeftOut(const std::vector<std::string>& left_out);

}  // namespace ckpt

#endif  // CKPT_TOOLS_CKPT_OUTPUT_H_
