#ifndef CKPT_LIBS_AUTH_METADATA_H_
#define CKPT_LIBS_AUTH_METADATA_H_

// The gRPC metadata by which a call says who it is, in one header that the clients
// (libs/rpc/client_channel) that send it and AccessPolicy (access_policy.h) that reads it share.

namespace ckpt {

// "authorization: Bearer <token>" (the prefix is matched without regard to case).
inline constexpr char kAuthorizationMetadata[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

// Sent by a front end that terminates its users' mutual TLS (the console), one value per name of
// the user's verified certificate (access_policy.h, "Forwarded certificates").
inline constexpr char kForwardedCertificateMetadata[] = "ckpt-forwarded-certificate";

}  // namespace ckpt

#endif  // CKPT_LIBS_AUTH_METADATA_H_
