#include "libs/store/internal/failpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckpt::failpoint {
namespace {

// Raw write(2): no stdio buffer, nothing that a SIGKILL right after could lose. Best effort.
void WriteToStderr(const std::string& message) {
  const ssize_t written = ::write(STDERR_FILENO, message.data(), message.size());
  (void)written;
}

struct Armed {
  std::string name;  // empty: nothing armed.
  int64_t hit = 1;   // dies on this hit of `name`, counting from 1.
  std::atomic<int64_t> hits{0};
};

// CKPT_FAILPOINT as "NAME" or "NAME:N", read once. A malformed N kills the process at once: a
// typo must not make a crash test pass by never crashing.
Armed& ArmedPoint() {
  static Armed* armed = [] {
    auto* parsed = new Armed();
    const char* value = std::getenv("CKPT_FAILPOINT");
    if (value == nullptr) return parsed;
    absl::string_view text(value);
    const size_t colon = text.rfind(':');
    parsed->name = std::string(text.substr(0, colon));
    if (colon != absl::string_view::npos &&
        (!absl::SimpleAtoi(text.substr(colon + 1), &parsed->hit) || parsed->hit < 1)) {
      const std::string message =
          absl::StrCat("CKPT_FAILPOINT='", text, "': expected NAME or NAME:N with N >= 1\n");
      WriteToStderr(message);
      ::_exit(2);
    }
    return parsed;
  }();
  return *armed;
}

void Append(const std::string& line) {
  static const int fd = [] {
    const char* path = std::getenv("CKPT_SYNC_LOG");
    if (path == nullptr) return -1;
    const int opened = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (opened < 0) {
      // Without the log the test would cut files it cannot know about: stop rather than mislead.
      const std::string message =
          absl::StrCat("CKPT_SYNC_LOG=", path, ": cannot open: ", std::strerror(errno), "\n");
      WriteToStderr(message);
      ::_exit(2);
    }
    return opened;
  }();
  if (fd < 0) return;
  // One write per record: appends with O_APPEND do not interleave, and a short write to a local
  // file only happens when the disk is full, which would make the test meaningless anyway.
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    const std::string message = absl::StrCat("CKPT_SYNC_LOG: write failed: ", line);
    WriteToStderr(message);
    ::_exit(2);
  }
}

}  // namespace

void Hit(const char* name) {
  Armed& armed = ArmedPoint();
  if (armed.name.empty() || armed.name != name) return;
  if (armed.hits.fetch_add(1) + 1 != armed.hit) return;
  const std::string message = absl::StrCat("failpoint ", name, " fired\n");
  WriteToStderr(message);
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);  // not reached: SIGKILL cannot be caught.
}

void RecordCreated(const std::string& path) { Append(absl::StrCat("created\t", path, "\n")); }

void RecordSynced(const std::string& path, int64_t length) {
  Append(absl::StrCat("synced\t", path, "\t", length, "\n"));
}

void RecordRenamed(const std::string& from, const std::string& to) {
  Append(absl::StrCat("renamed\t", from, "\t", to, "\n"));
}

void RecordRemoved(const std::string& path) { Append(absl::StrCat("removed\t", path, "\n")); }

}  // namespace ckpt::failpoint
