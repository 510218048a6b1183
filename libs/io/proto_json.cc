#include "libs/io/proto_json.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace ckpt {

absl::StatusOr<std::string> ProtoToJson(const google::protobuf::Message& message, bool indented) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = indented;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  const auto status = google::protobuf::util::MessageToJsonString(message, &text, options);
  if (!status.ok()) return absl::InternalError(status.ToString());
  return text;
}

absl::Status JsonToProto(absl::string_view json, google::protobuf::Message& message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(std::string(json), &message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a ", message.GetTypeName(), " in JSON: ", status.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
