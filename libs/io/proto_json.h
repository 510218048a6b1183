#ifndef CKPT_LIBS_IO_PROTO_JSON_H_
#define CKPT_LIBS_IO_PROTO_JSON_H_

// A protobuf message as JSON text, the one way ckpt writes it (`ckpt show --json`, `ckpt model
// show --json`, `ckpt history --json`, the serving directory's metadata.json), so that every
// JSON a reader sees spells fields the same way.
//
// Example:
//   ASSIGN_OR_RETURN(std::string json, ProtoToJson(manifest, /*indented=*/true));

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace ckpt {

// `message` in protobuf's JSON mapping, with fields under their .proto names ("run_id", not
// "runId": what Python's MessageToDict(preserving_proto_field_name=True) gives) and every
// scalar, list and map field printed even at its default ("shape": [] of a scalar, "epoch": "0",
// "aliases": {}), so a reader need not know proto3's defaults; an unset message field or oneof
// is left out (absent is its meaning). 64-bit integers are strings, as the mapping has them.
// `indented`: one field a line, for people; else one line.
// INTERNAL when protobuf cannot print the message (an Any of a type it does not know).
absl::StatusOr<std::string> ProtoToJson(const google::protobuf::Message& message,
                                        bool indented = false);

// `json` (protobuf's JSON mapping; either spelling of field names) into `message`.
// INVALID_ARGUMENT naming what protobuf could not read, an unknown field included.
absl::Status JsonToProto(absl::string_view json, google::protobuf::Message& message);

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_PROTO_JSON_H_
