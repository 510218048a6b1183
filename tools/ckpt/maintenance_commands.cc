#include "tools/ckpt/maintenance_commands.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/format/inspect.h"
#include "libs/status/status_macros.h"
#include "libs/store/checkpoint_store.h"
#include "libs/store/repair.h"
#include "libs/store/version_ref.h"
#include "nlohmann/json.hpp"
#include "tools/ckpt/output.h"
#include "tools/ckpt/store_access.h"

namespace ckpt {
namespace {

// "model@version", plus the alias; "-" for a call on no model (gc).
std::string AuditTarget(const v1::AuditRecord& record) {
  std::string target = record.model().empty() ? "-" : record.model();
  if (record.version() > 0) absl::StrAppend(&target, "@", record.version());
  if (!record.alias().empty()) absl::StrAppend(&target, " alias ", record.alias());
  return target;
}

std::string AuditOutcome(const v1::AuditRecord& record) {
  switch (record.outcome()) {
    case v1::AuditRecord::OK:
      return "OK";
    case v1::AuditRecord::FAILED:
      return absl::StrCat(
          "FAILED ", absl::StatusCodeToString(static_cast<absl::StatusCode>(record.error_code())),
          ": ", record.error_message());
    case v1::AuditRecord::PENDING:
      return "outcome unknown (in progress when read; the store's next open settles it if the "
             "call never finished)";
    default:
      return "outcome unrecorded";
  }
}

nlohmann::ordered_json AuditJson(const v1::AuditRecord& record) {
  nlohmann::ordered_json json;
  json["sequence"] = record.sequence();
  json["time"] = UtcTimeText(record.unix_micros());
  json["unix_micros"] = record.unix_micros();
  json["identity"] = record.identity();
  json["peer"] = record.peer();
  json["action"] = record.action();
  json["model"] = record.model();
  json["version"] = record.version();
  json["alias"] = record.alias();
  json["outcome"] = v1::AuditRecord::Outcome_Name(record.outcome());
  if (record.outcome() == v1::AuditRecord::FAILED) {
    json["error_code"] =
        absl::StatusCodeToString(static_cast<absl::StatusCode>(record.error_code()));
    json["error_message"] = record.error_message();
  }
  json["detail"] = record.detail();
  return json;
}

}  // namespace

cli::CommandSpec RetainCommand() {
  return {"retain",
          "MODEL",
          "Apply a retention policy: delete versions outside it, never aliased or latest ones.",
          1,
          1,
          {{"keep-last", "N", "keep the newest N versions (0 keeps all)", "0"},
           {"keep-every", "K", "also keep every version divisible by K", "0"},
           {"drop-optimizer-after", "N",
            "drop optimizer state (keep weights) from versions older than the newest N", "0"},
           {"dry-run", "", "report what would happen, change nothing", ""}}};
}

cli::CommandSpec GcCommand() {
  return {"gc",
          "",
          "Free chunks no version references, and abandoned uploads.",
          0,
          0,
          {{"dry-run", "", "report what would be freed, change nothing", ""}},
          "An upload that ended without a commit (a failed or killed import, a client that\n"
          "went away) leaves its chunks and its partial pack file in the store. gc leaves them\n"
          "until the abandoned-upload grace has passed since the upload began, so a client that\n"
          "reconnects can reuse them; the first gc after that reclaims them, pack file and all.\n"
          "The grace is the store's: 1 hour for a --store_dir store; with --store=HOST:PORT, the\n"
          "service's --abandoned_upload_grace (default 1h). Uploads in progress are never\n"
          "collected.\n"};
}

cli::CommandSpec VerifyCommand() {
  return {"verify",
          "[MODEL[@REF]]",
          "Re-hash every chunk of a version, a model or the whole store; exit 1 on problems.",
          0,
          1,
          {}};
}

cli::CommandSpec RepairCommand() {
  return {"repair",
          "",
          "Bring back a --store_dir store that no longer opens (damaged CURRENT, MANIFEST, SST or "
          "WAL files): back up its files, rebuild it with RocksDB's repair, drop versions that do "
          "not verify, and list the versions kept and dropped; exit 1 if problems remain.",
          0,
          0,
          {{"backup-dir", "DIR", "where the damaged files are copied first (must not exist)",
            "STORE_DIR.before-repair-TIME"}},
          "Stop every process that has the store open first (a checkpoint_store service: repair\n"
          "its --store_dir). The pack files are not changed. A version is kept only when every\n"
          "chunk re-hashes to its manifest; a version whose manifest or chunks are damaged is\n"
          "deleted (it stays in the backup). Records that named lost versions (aliases, counts,\n"
          "refcounts) are made to agree; version numbers are never reused.\n"};
}

cli::CommandSpec AuditCommand() {
  return {"audit",
          "[MODEL]",
          "Who changed the store (or MODEL), when, from where and how it ended: commits, alias "
          "moves and deletes, version deletes, retention, gc; oldest first.",
          0,
          1,
          {{"since", "DURATION|TIME",
            "only calls begun in the last DURATION (30m, 24h, 7d) or since an RFC 3339 TIME "
            "(2024-05-01T12:00:00Z)",
            "all"},
           {"json", "", "one JSON object per record and line", ""}}};
}

absl::Status RunRetain(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  v1::RetentionPolicy policy;
  ASSIGN_OR_RETURN(int64_t keep_last, line.GetInt("keep-last"));
  ASSIGN_OR_RETURN(int64_t keep_every, line.GetInt("keep-every"));
  ASSIGN_OR_RETURN(int64_t drop_after, line.GetInt("drop-optimizer-after"));
  if (keep_last < 0 || keep_every < 0 || drop_after < 0) {
    return absl::InvalidArgumentError("retention numbers must not be negative");
  }
  if (keep_last == 0 && drop_after == 0) {
    return absl::InvalidArgumentError(
        "give --keep-last N and/or --drop-optimizer-after N (nothing to do otherwise)");
  }
  policy.set_keep_last(static_cast<int32_t>(keep_last));
  policy.set_keep_every(static_cast<int32_t>(keep_every));
  policy.set_drop_optimizer_state_older_than(static_cast<int32_t>(drop_after));
  const bool dry_run = line.Has("dry-run");
  ASSIGN_OR_RETURN(v1::ApplyRetentionResponse response,
                   store->ApplyRetention(line.arguments()[0], policy, dry_run));
  const char* verb = dry_run ? "would delete" : "deleted";
  std::cout << verb << " versions: "
            << (response.deleted_versions().empty()
                    ? "none"
                    : absl::StrJoin(response.deleted_versions(), " "))
            << "\n"
            << (dry_run ? "would drop" : "dropped") << " optimizer state of versions: "
            << (response.optimizer_state_dropped().empty()
                    ? "none"
                    : absl::StrJoin(response.optimizer_state_dropped(), " "))
            << "\n";
  if (!dry_run) std::cout << "run ckpt gc to free their bytes\n";
  return absl::OkStatus();
}

absl::Status RunGc(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  const bool dry_run = line.Has("dry-run");
  ASSIGN_OR_RETURN(v1::GarbageCollectResponse response, store->GarbageCollect(dry_run));
  std::cout << (dry_run ? "would free " : "freed ") << response.chunks_freed() << " chunks, "
            << HumanBytes(response.bytes_freed())
            << "; abandoned uploads reclaimed: " << response.abandoned_uploads_reclaimed() << "\n";
  // Only when they happen, so the usual summary stays one line.
  if (response.pack_removals_failed() > 0) {
    std::cout << response.pack_removals_failed()
              << " pack removals or upload aborts failed (logged on the store's stderr: this "
                 "process's, or the checkpoint_store service's with --store=ADDR; the next gc "
                 "retries them)\n";
  }
  if (response.packs_of_unknown_age_kept() > 0) {
    std::cout << response.packs_of_unknown_age_kept()
              << " packs or pending uploads kept: the storage gave no time for them, so they "
                 "count as young\n";
  }
  return absl::OkStatus();
}

absl::Status RunVerify(const cli::ParsedCommandLine& line) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  // CheckpointStore::Verify's scope: no model is the whole store (refcounts cross-checked too),
  // version 0 every version of the model.
  std::string model;
  int64_t version = 0;
  std::string scope = "the whole store";
  if (!line.arguments().empty()) {
    const std::string& target = line.arguments()[0];
    ASSIGN_OR_RETURN(v1::VersionRef ref, ParseVersionRef(target));
    model = ref.model();
    // ParseVersionRef reads a bare MODEL as MODEL@latest; here it means every version.
    if (absl::StrContains(target, '@')) {
      ASSIGN_OR_RETURN(v1::Manifest manifest, store->GetManifest(ref));
      version = manifest.version();
      scope = FormatVersionRef(model, version);
    } else {
      ASSIGN_OR_RETURN(std::vector<v1::VersionInfo> versions, store->ListVersions(model));
      scope = absl::StrCat(model, " (", versions.size(), " versions)");
    }
  }
  if (StdoutIsTerminal()) std::cout << "verifying " << scope << "...\n";
  ASSIGN_OR_RETURN(v1::VerifyResponse total, store->Verify(model, version));
  if (model.empty() && !total.whole_store()) {
    // A caller scoped to some models verified those only: say which.
    constexpr int kNamed = 5;
    const std::vector<std::string> named(
        total.models().begin(), total.models().begin() + std::min(total.models_size(), kNamed));
    scope = absl::StrCat("the ", total.models_size(), " models in your scope (",
                         named.empty() ? "none" : absl::StrJoin(named, ", "),
                         total.models_size() > kNamed ? ", ..." : "", "; ",
                         total.versions_checked(), " versions; not the whole store)");
  } else if (model.empty()) {
    scope = absl::StrCat("the whole store (", total.models_size(), " models, ",
                         total.versions_checked(), " versions)");
  }
  std::cout << "verified " << scope << ": " << total.chunks_checked() << " chunks, "
            << HumanBytes(total.bytes_checked()) << ", " << total.problems_size() << " problems\n";
  for (const v1::VerifyProblem& problem : total.problems()) {
    std::cout << "  " << FormatVersionRef(problem.model(), problem.version()) << " "
              << problem.tensor_key() << ": " << problem.message() << "\n";
  }
  if (total.problems_size() > 0) {
    return absl::DataLossError(absl::StrCat(total.problems_size(), " problems found"));
  }
  return absl::OkStatus();
}

absl::Status RunRepair(const cli::ParsedCommandLine& line) {
  if (line.Has("store")) {
    return absl::InvalidArgumentError(
        "repair works on the store's directory: stop the service and run `ckpt repair "
        "--store_dir=DIR` with its --store_dir");
  }
  RepairOptions options;
  options.db_path = line.Get("store_dir");
  if (line.Has("backup-dir")) options.backup_dir = line.Get("backup-dir");
  ASSIGN_OR_RETURN(RepairReport report, RepairStore(options));
  std::cout << "backed up " << report.backed_up.size() << " database files to " << report.backup_dir
            << "\n";
  for (const std::string& note : report.notes) std::cout << "note: " << note << "\n";
  for (const RepairedVersion& version : report.intact) std::cout << "kept " << version.ref << "\n";
  for (const RepairedVersion& version : report.dropped) {
    std::cout << "dropped " << version.ref << ": " << version.reason << "\n";
  }
  std::cout << "repaired " << options.db_path << ": " << report.intact.size() << " versions kept, "
            << report.dropped.size() << " dropped, " << report.versions_unrecovered
            << " not recoverable, " << report.acknowledged_writes_lost
            << " acknowledged writes lost with the write-ahead log; verified "
            << report.verify.chunks_checked() << " chunks, " << report.verify.problems_size()
            << " problems\n";
  for (const v1::VerifyProblem& problem : report.verify.problems()) {
    std::cout << "  " << problem.message() << "\n";
  }
  if (report.verify.problems_size() > 0) {
    return absl::DataLossError(
        absl::StrCat(report.verify.problems_size(), " problems remain after the repair"));
  }
  return absl::OkStatus();
}

absl::Status RunAudit(const cli::ParsedCommandLine& line) {
  AuditQuery query;
  if (!line.arguments().empty()) query.model = line.arguments()[0];
  if (line.Has("since")) {
    ASSIGN_OR_RETURN(query.since, ParseTimeOption("since", line.Get("since")));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointStore> store, OpenStore(line, false));
  ASSIGN_OR_RETURN(std::vector<v1::AuditRecord> records, store->ListAudit(query));
  for (const v1::AuditRecord& record : records) {
    if (line.Has("json")) {
      std::cout << AuditJson(record).dump() << "\n";
      continue;
    }
    std::cout << UtcTimeText(record.unix_micros()) << "  " << record.identity() << "  "
              << record.peer() << "  " << record.action() << "  " << AuditTarget(record) << "  "
              << AuditOutcome(record) << "  " << record.detail() << "\n";
  }
  return absl::OkStatus();
}

}  // namespace ckpt
