#include "libs/store/testing/seeded_checkpoints.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "libs/status/status_macros.h"
#include "libs/store/version_ref.h"
#include "libs/testing/child_process.h"
#include "proto/ckpt/v1/checkpoint_store.pb.h"

extern char** environ;

namespace ckpt::testing {
namespace {

std::string Int32Bytes(int64_t elements, uint32_t seed) {
  std::string bytes(static_cast<size_t>(elements) * 4, '\0');
  for (int64_t i = 0; i < elements; ++i) {
    const uint32_t value = seed * 2654435761u + static_cast<uint32_t>(i);
    std::memcpy(&bytes[static_cast<size_t>(i) * 4], &value, 4);
  }
  return bytes;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> SeededContents(int64_t seed) {
  std::string step(8, '\0');
  std::memcpy(step.data(), &seed, 8);
  return {{"frozen", Int32Bytes(kFrozenElements, 0)},
          {"weight", Int32Bytes(kWeightElements, static_cast<uint32_t>(seed))},
          {"step", step}};
}

absl::StatusOr<int64_t> CommitSeeded(CheckpointStore& store, absl::string_view model,
                                     int64_t seed) {
  v1::Manifest header;
  header.set_model(std::string(model));
  header.mutable_metadata()->set_global_step(seed);
  const auto contents = SeededContents(seed);
  for (const auto& [key, bytes] : contents) {
    v1::TensorMeta* meta = header.add_tensors();
    meta->set_key(key);
    const bool step = key == "step";
    meta->set_dtype(step ? v1::DTYPE_INT64 : v1::DTYPE_INT32);
    meta->add_shape(static_cast<int64_t>(bytes.size()) / (step ? 8 : 4));
    meta->set_byte_length(static_cast<int64_t>(bytes.size()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<UploadSession> session,
                   store.BeginUpload(model, std::move(header), CommitOptions()));
  for (size_t i = 0; i < contents.size(); ++i) {
    RETURN_IF_ERROR(session->AddTensorData(static_cast<int>(i), 0, contents[i].second));
  }
  ASSIGN_OR_RETURN(CommitResult result, session->Commit());
  return result.version.version();
}

absl::Status CheckSeeded(CheckpointStore& store, absl::string_view model, int64_t version,
                         int64_t seed) {
  const std::string where = FormatVersionRef(model, version);
  ASSIGN_OR_RETURN(std::unique_ptr<VersionReader> reader,
                   store.OpenVersion(MakeVersionRef(model, version)));
  const auto contents = SeededContents(seed);
  const v1::Manifest& manifest = reader->manifest();
  if (manifest.tensors_size() != static_cast<int>(contents.size())) {
    return absl::DataLossError(absl::StrCat(where, " has ", manifest.tensors_size(),
                                            " tensors, expected ", contents.size()));
  }
  for (size_t i = 0; i < contents.size(); ++i) {
    const v1::TensorMeta& meta = manifest.tensors(static_cast<int>(i));
    const auto& [key, expected] = contents[i];
    if (meta.key() != key || meta.byte_length() != static_cast<int64_t>(expected.size())) {
      return absl::DataLossError(absl::StrCat(where, " tensor ", i, " is '", meta.key(), "' of ",
                                              meta.byte_length(), " bytes, expected '", key,
                                              "' of ", expected.size()));
    }
    std::string bytes(expected.size(), '\0');
    RETURN_IF_ERROR(reader->ReadTensorInto(meta, bytes.data()));
    if (bytes != expected) {
      return absl::DataLossError(
          absl::StrCat(where, " tensor '", key, "' differs from checkpoint ", seed));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::set<int64_t>> ListedVersions(CheckpointStore& store, absl::string_view model) {
  ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> infos, store.ListVersions(model));
  std::set<int64_t> versions;
  for (const v1::VersionInfo& info : infos) versions.insert(info.version());
  return versions;
}

absl::Status VerifyWholeStore(CheckpointStore& store) {
  ASSIGN_OR_RETURN(v1::VerifyResponse verified, store.Verify("", 0));
  if (verified.problems_size() == 0) return absl::OkStatus();
  std::string problems;
  for (const v1::VerifyProblem& problem : verified.problems()) {
    absl::StrAppend(&problems, "\n  ", problem.message());
  }
  return absl::DataLossError(absl::StrCat("Verify found problems:", problems));
}

ChildResult RunThisBinaryAsChild(const std::vector<std::string>& extra_env, const std::string& dir,
                                 absl::Duration timeout) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view text = *entry;
    if (absl::StartsWith(text, "XML_OUTPUT_FILE=") || absl::StartsWith(text, "GTEST_OUTPUT=") ||
        absl::StartsWith(text, "TEST_PREMATURE_EXIT_FILE=")) {
      continue;
    }
    env.emplace_back(text);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (std::string& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), nullptr};

  const std::string stderr_path = dir + "/child.stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir + "/child.stdout").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ChildResult result;
  if (error != 0) {
    ADD_FAILURE() << "posix_spawn: " << std::strerror(error);
    return result;
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (waitpid(pid, &result.wait_status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      waitpid(pid, &result.wait_status, 0);
      ADD_FAILURE() << "the child ran for over " << timeout;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));  // polling a child process; nothing to wait on.
  }
  result.stderr_text = ReadFileOrEmpty(stderr_path);
  return result;
}

}  // namespace ckpt::testing
