#ifndef CKPT_LIBS_RPC_REFLECTION_V1_SERVICE_H_
#define CKPT_LIBS_RPC_REFLECTION_V1_SERVICE_H_

// ReflectionV1Service: gRPC server reflection under its stable name, grpc.reflection.v1
// (proto/grpc/reflection/v1/reflection.proto), answered from the descriptors linked into the
// binary, as gRPC's own v1alpha service answers. Debian's gRPC 1.51 serves only v1alpha, and
// clients that speak only v1 (grpcurl >= 1.8.8 asks v1 first; newer grpcio-reflection and
// grpc-js tools) got UNIMPLEMENTED. GrpcServer registers it beside v1alpha (reflection = true).
//
// Each request on the stream gets one response, in order: the services served (list_services),
// a file with every file it imports that this stream has not sent yet (file_by_filename,
// file_containing_symbol, file_containing_extension), or a message type's extension numbers;
// NOT_FOUND in error_response for a name the binary does not know.
//
// Thread-safe (streams share nothing but the immutable service list).

#include <string>
#include <vector>

#include "grpcpp/server_context.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/grpc/reflection/v1/reflection.grpc.pb.h"

namespace ckpt {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // `services`: the fully qualified names list_services answers with.
  explicit ReflectionV1Service(std::vector<std::string> services)
      : services_(std::move(services)) {}

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

 private:
  const std::vector<std::string> services_;
};

}  // namespace ckpt

#endif  // CKPT_LIBS_RPC_REFLECTION_V1_SERVICE_H_
