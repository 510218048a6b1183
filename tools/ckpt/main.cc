// ckpt: the command-line tool for checkpoints. This file holds the global options and the table
// of commands; each command lives in the file of its group (file_commands, store_commands,
// maintenance_commands, loader_commands, registry_commands, sync_command), where its options are
// read into plain structs and passed to libs/.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/ckpt/command_line.h"
#include "tools/ckpt/file_commands.h"
#include "tools/ckpt/loader_commands.h"
#include "tools/ckpt/maintenance_commands.h"
#include "tools/ckpt/registry_commands.h"
#include "tools/ckpt/store_commands.h"
#include "tools/ckpt/sync_command.h"

namespace ckpt {
namespace {

constexpr char kDescription[] =
    "Read, convert and version PyTorch checkpoints: torch.save files (zip and legacy, read\n"
    "without running any pickled code), whole pickled models, bundles, safetensors; a versioned,\n"
    "deduplicated, checksummed store of them (embedded in --store_dir, or a checkpoint_store\n"
    "service with --store=HOST:PORT).";

const std::vector<cli::OptionSpec>& GlobalOptions() {
  static const auto* options = new std::vector<cli::OptionSpec>{
      {"store_dir", "DIR", "open the checkpoint store in DIR in-process (embedded)", "./ckpt-data"},
      {"store", "HOST:PORT", "talk to a checkpoint_store service instead of opening --store_dir",
       ""},
      {"store_auth_token_file", "FILE", "bearer token for --store (whitespace around it ignored)",
       ""},
      {"store_tls_ca_file", "PEM", "TLS to --store: the CA that signed its certificate", ""},
      {"store_tls_cert_file", "PEM",
       "with --store_tls_ca_file: this client's certificate (mutual TLS)", ""},
      {"store_tls_key_file", "PEM", "the private key of --store_tls_cert_file", ""},
      {"store_tls_server_name", "NAME", "the name --store's certificate carries, if not its host",
       ""},
      {"loader_auth_token_file", "FILE", "bearer token for --loader", ""},
      {"loader_tls_ca_file", "PEM", "TLS to --loader: the CA that signed its certificate", ""},
      {"loader_tls_cert_file", "PEM",
       "with --loader_tls_ca_file: this client's certificate (mutual TLS)", ""},
      {"loader_tls_key_file", "PEM", "the private key of --loader_tls_cert_file", ""},
      {"loader_tls_server_name", "NAME", "the name --loader's certificate carries, if not its host",
       ""},
      {"auth_token_file", "FILE", "deprecated: --store_auth_token_file or --loader_auth_token_file",
       ""},
      {"tls_ca_file", "PEM", "deprecated: --store_tls_ca_file or --loader_tls_ca_file", ""},
      {"tls_cert_file", "PEM", "deprecated: --store_tls_cert_file or --loader_tls_cert_file", ""},
      {"tls_key_file", "PEM", "deprecated: --store_tls_key_file or --loader_tls_key_file", ""},
      {"tls_server_name", "NAME", "deprecated: --store_tls_server_name or --loader_tls_server_name",
       ""},
      {"chunks_s3_endpoint", "URL",
       "with --store_dir: chunk bytes in this S3-compatible object store (http://HOST:PORT or "
       "https://HOST[:PORT], path-style) instead of pack files in DIR, which keeps the index; "
       "credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or --chunks_s3_credentials_file",
       ""},
      {"chunks_s3_bucket", "BUCKET", "with --chunks_s3_endpoint: the (existing) bucket", ""},
      {"chunks_s3_prefix", "PREFIX",
       "with --chunks_s3_endpoint: key prefix ending in '/', one per store (gc deletes pack "
       "objects under it that the store does not name)",
       ""},
      {"chunks_s3_region", "REGION", "with --chunks_s3_endpoint: the SigV4 region", "us-east-1"},
      {"chunks_s3_credentials_file", "FILE",
       "with --chunks_s3_endpoint: AWS shared-credentials file (aws_access_key_id = ..., "
       "aws_secret_access_key = ...) instead of the environment",
       ""},
      {"chunks_s3_ca_file", "PEM", "with an https --chunks_s3_endpoint: CA certificates to trust",
       ""},
  };
  return *options;
}

using Runner = absl::Status (*)(const cli::ParsedCommandLine&);

struct Command {
  cli::CommandSpec spec;
  Runner run;
};

// Every command with what runs it, in the order `ckpt --help` lists them.
const std::vector<Command>& CommandTable() {
  static const auto* table = [] {
    auto* commands = new std::vector<Command>{
        {InspectCommand(), RunInspect}, {ConvertCommand(), RunConvert},
        {ImportCommand(), RunImport},   {ListCommand(), RunList},
        {ShowCommand(), RunShow},       {TagCommand(), RunTag},
        {UntagCommand(), RunUntag},     {RemoveCommand(), RunRemove},
        {RetainCommand(), RunRetain},   {GcCommand(), RunGc},
        {VerifyCommand(), RunVerify},   {RepairCommand(), RunRepair},
        {DiffCommand(), RunDiff},       {StatsCommand(), RunStats},
        {AuditCommand(), RunAudit},     {ExportCommand(), RunExport},
        {CheckCommand(), RunCheck},
    };
    for (const cli::CommandSpec& spec : RegistryCommands()) {
      commands->push_back({spec, RunRegistryCommand});
    }
    commands->push_back({SyncCommand(), RunSync});
    return commands;
  }();
  return *table;
}

const std::vector<cli::CommandSpec>& Commands() {
  static const auto* specs = [] {
    auto* all = new std::vector<cli::CommandSpec>;
    for (const Command& command : CommandTable()) all->push_back(command.spec);
    return all;
  }();
  return *specs;
}

int Main(int argc, char** argv) {
  // Under `bazel run`, relative paths (FILEs, --store_dir) mean the caller's directory.
  if (const char* caller = std::getenv("BUILD_WORKING_DIRECTORY"); caller != nullptr) {
    if (chdir(caller) != 0) std::perror("ckpt: chdir to BUILD_WORKING_DIRECTORY");
  }
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<cli::ParsedCommandLine> line =
      cli::ParseCommandLine(Commands(), GlobalOptions(), args);
  if (!line.ok()) {
    std::cerr << "ckpt: " << line.status().message() << "\n";
    return 2;
  }
  if (line->command().empty()) {
    std::cout << cli::ProgramHelp("ckpt", kDescription, Commands(), GlobalOptions());
    return line->help_requested() ? 0 : 2;
  }
  for (const Command& command : CommandTable()) {
    if (command.spec.name != line->command()) continue;
    if (line->help_requested()) {
      std::cout << cli::CommandHelp("ckpt", command.spec, GlobalOptions());
      return 0;
    }
    const absl::Status status = command.run(*line);
    if (!status.ok()) {
      std::cerr << "ckpt " << line->command() << ": " << absl::StatusCodeToString(status.code())
                << ": " << status.message() << "\n";
      return 1;
    }
    return 0;
  }
  return 2;  // ParseCommandLine accepts only the commands it was given.
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
