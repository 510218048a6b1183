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

// The client options of the --store and --loader connections, spelled as the other binaries
// spell them (store_access.h), and the spellings they replace.
std::vector<cli::OptionSpec> ConnectionOptions() {
  std::vector<cli::OptionSpec> options;
  for (const std::string connection : {"store", "loader"}) {
    const std::string flag = "--" + connection;
    const std::string prefix = connection + "_";
    options.push_back({prefix + "auth_token_file", "FILE",
                       "bearer token for " + flag + " (whitespace around it ignored)", ""});
    options.push_back({prefix + "tls_ca_file", "PEM",
                       "TLS to " + flag + ": the CA that signed its certificate", ""});
    options.push_back({prefix + "tls_cert_file", "PEM",
                       "with --" + prefix + "tls_ca_file: this client's certificate (mutual TLS)",
                       ""});
    options.push_back(
        {prefix + "tls_key_file", "PEM", "the private key of --" + prefix + "tls_cert_file", ""});
    options.push_back({prefix + "tls_server_name", "NAME",
                       "the name " + flag + "'s certificate carries, if not its host", ""});
  }
  for (const std::string name :
       {"auth_token_file", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name"}) {
    const char* value = name == "auth_token_file"   ? "FILE"
                        : name == "tls_server_name" ? "NAME"
                                                    : "PEM";
    options.push_back({name, value, "deprecated: --store_" + name + " or --loader_" + name, ""});
  }
  return options;
}

const std::vector<cli::OptionSpec>& GlobalOptions() {
  static const auto* options = [] {
    auto* specs = new std::vector<cli::OptionSpec>{
        {"store_dir", "DIR", "open the checkpoint store in DIR in-process (embedded)",
         "./ckpt-data"},
        {"store", "HOST:PORT", "talk to a checkpoint_store service instead of opening --store_dir",
         ""},
        {"chunks_s3_endpoint", "URL",
         "with --store_dir: chunk bytes in this S3-compatible object store (http://HOST:PORT or "
         "https://HOST[:PORT], path-style) instead of pack files in DIR, which keeps the index; "
         "credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
         "--chunks_s3_credentials_file",
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
    const std::vector<cli::OptionSpec> connections = ConnectionOptions();
    specs->insert(specs->begin() + 2, connections.begin(), connections.end());  // after --store
    return specs;
  }();
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
        {CheckCommand(), RunCheck},     {WhoAmICommand(), RunWhoAmI},
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
