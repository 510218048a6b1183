#ifndef CKPT_LIBS_TRAIN_LINEAGE_H_
#define CKPT_LIBS_TRAIN_LINEAGE_H_

// What the trainer records about where its versions come from (v1::Lineage): the run's id and
// the revision of the code that trained it. The trainer fills the rest (parent, dataset,
// producer_info) from what it knows at commit time (libs/train/trainer.h).
//
// Example:
//   std::string run = NewRunId("mlp-synthetic", absl::Now());  //
//   "mlp-synthetic-20240501T120000Z-9f3a51c2" std::string rev = GitCodeRevision("/home/me/ckpt");
//   // "3e1f...c0" or "3e1f...c0+dirty"

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::train {

// "<model_name>-<UTC time as YYYYMMDDTHHMMSSZ>-<8 random hex digits>": readable, sortable by
// start time, and distinct for two runs started in the same second.
std::string NewRunId(absl::string_view model_name, absl::Time now);

// The commit checked out at `dir` (`git -C dir rev-parse HEAD`), with "+dirty" appended when
// `git status --porcelain` lists anything (modified, staged or untracked files). "" when `dir` is
// not inside a git checkout, the checkout has no commit yet, or git is not installed: the
// revision is a record for people, and its absence must never stop a run.
std::string GitCodeRevision(const std::string& dir);

}  // namespace ckpt::train

#endif  // CKPT_LIBS_TRAIN_LINEAGE_H_
