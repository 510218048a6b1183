#include "libs/rpc/reflection_v1_service.h"

#include <string>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace ckpt {
namespace {

namespace v1 = ::grpc::reflection::v1;
using ::google::protobuf::Descriptor;
using ::google::protobuf::DescriptorPool;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::FileDescriptor;

// One stream's answers; remembers which files it has sent, so each goes once per stream (a
// client resolving a service walks many symbols of the same files).
class Answerer {
 public:
  explicit Answerer(const std::vector<std::string>& services) : services_(services) {}

  v1::ServerReflectionResponse Answer(const v1::ServerReflectionRequest& request) {
    v1::ServerReflectionResponse response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    const DescriptorPool& pool = *DescriptorPool::generated_pool();
    switch (request.message_request_case()) {
      case v1::ServerReflectionRequest::kListServices:
        for (const std::string& name : services_) {
          response.mutable_list_services_response()->add_service()->set_name(name);
        }
        break;
      case v1::ServerReflectionRequest::kFileByFilename:
        SendFile(pool.FindFileByName(request.file_by_filename()),
                 absl::StrCat("no file '", request.file_by_filename(), "'"), response);
        break;
      case v1::ServerReflectionRequest::kFileContainingSymbol:
        SendFile(pool.FindFileContainingSymbol(request.file_containing_symbol()),
                 absl::StrCat("no symbol '", request.file_containing_symbol(), "'"), response);
        break;
      case v1::ServerReflectionRequest::kFileContainingExtension: {
        const v1::ExtensionRequest& wanted = request.file_containing_extension();
        const Descriptor* type = pool.FindMessageTypeByName(wanted.containing_type());
        const FieldDescriptor* extension =
            type == nullptr ? nullptr
                            : pool.FindExtensionByNumber(type, wanted.extension_number());
        SendFile(extension == nullptr ? nullptr : extension->file(),
                 absl::StrCat("no extension ", wanted.extension_number(), " of '",
                              wanted.containing_type(), "'"),
                 response);
        break;
      }
      case v1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const Descriptor* type = pool.FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) {
          NotFound(absl::StrCat("no message type '", request.all_extension_numbers_of_type(), "'"),
                   response);
          break;
        }
        std::vector<const FieldDescriptor*> extensions;
        pool.FindAllExtensions(type, &extensions);
        v1::ExtensionNumberResponse& numbers = *response.mutable_all_extension_numbers_response();
        numbers.set_base_type_name(type->full_name());
        for (const FieldDescriptor* extension : extensions) {
          numbers.add_extension_number(extension->number());
        }
        break;
      }
      case v1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        response.mutable_error_response()->set_error_code(grpc::StatusCode::INVALID_ARGUMENT);
        response.mutable_error_response()->set_error_message(
            "a reflection request names one of file_by_filename, file_containing_symbol, "
            "file_containing_extension, all_extension_numbers_of_type or list_services");
        break;
    }
    return response;
  }

 private:
  static void NotFound(const std::string& what, v1::ServerReflectionResponse& response) {
    response.mutable_error_response()->set_error_code(grpc::StatusCode::NOT_FOUND);
    response.mutable_error_response()->set_error_message(what);
  }

  // `file` and, before it, every file it imports (transitively) not sent on this stream yet.
  void SendFile(const FileDescriptor* file, const std::string& missing,
                v1::ServerReflectionResponse& response) {
    if (file == nullptr) {
      NotFound(missing, response);
      return;
    }
    v1::FileDescriptorResponse& files = *response.mutable_file_descriptor_response();
    std::vector<const FileDescriptor*> pending = {file};
    std::vector<const FileDescriptor*> order;
    std::unordered_set<const FileDescriptor*> queued = {file};
    while (!pending.empty()) {
      const FileDescriptor* next = pending.back();
      pending.pop_back();
      // The asked-for file is always sent (a client may ask again after losing it).
      if (next != file && sent_.count(next) > 0) continue;
      order.push_back(next);
      for (int i = 0; i < next->dependency_count(); ++i) {
        if (queued.insert(next->dependency(i)).second) pending.push_back(next->dependency(i));
      }
    }
    for (const FileDescriptor* each : order) {
      google::protobuf::FileDescriptorProto proto;
      each->CopyTo(&proto);
      proto.SerializeToString(files.add_file_descriptor_proto());
      sent_.insert(each);
    }
  }

  const std::vector<std::string>& services_;
  std::unordered_set<const FileDescriptor*> sent_;
};

}  // namespace

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ServerReflectionResponse, v1::ServerReflectionRequest>* stream) {
  Answerer answerer(services_);
  v1::ServerReflectionRequest request;
  while (!context->IsCancelled() && stream->Read(&request)) {
    if (!stream->Write(answerer.Answer(request))) break;
  }
  return grpc::Status::OK;
}

}  // namespace ckpt
