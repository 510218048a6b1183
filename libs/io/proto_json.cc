#include "libs/io/proto_json.h"

#include "absl/status/status.h"
#include "google/protobuf/util/json_util.h"

namespace ckpt {

absl::StatusOr<std::string> ProtoToJson(const google::protobuf::Message& message, bool indented) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = indented;
  options.preserve_proto_field_names = true;
  std::string text;
  const auto status = google::protobuf::util::MessageToJsonString(message, &text, options);
  if (!status.ok()) return absl::InternalError(status.ToString());
  return text;
}

}  // namespace ckpt
