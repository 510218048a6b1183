#ifndef CKPT_LIBS_SERVER_SERVICE_FLAGS_H_
#define CKPT_LIBS_SERVER_SERVICE_FLAGS_H_

// The flags every ckpt server binary shares, defined once: each main.cc expands these macros
// (so the flags stay in main.cc, where --help looks for them, and each binary links only what it
// uses) and reads them back with the matching *_FROM_FLAGS macro; what they mean and which go
// together is checked by the library functions they feed (LoadServerSecurity,
// StoreLocationFromFlags, S3ChunkStorageFromFlags, ServeUntilStopped), also once.
//
//   flags                                       macro                         used by
//   --tls_cert_file --tls_key_file              CKPT_DEFINE_SERVER_SECURITY_  checkpoint_store, loader,
//   --tls_client_ca_file --tls_reload_interval  FLAGS(prefix)                 trainer (prefix control_)
//   --identities_file --auth_token_file         (the --tls_* ones alone:      (console)
//                                               CKPT_DEFINE_SERVER_TLS_FLAGS)
//   --listen --port_file                        CKPT_DEFINE_LISTEN_FLAGS      the same, console
//   --shutdown_grace                            CKPT_DEFINE_SHUTDOWN_GRACE_FLAG
//   --store --store_dir --store_auth_token_file CKPT_DEFINE_STORE_CLIENT_     loader, trainer
//   --store_tls_{ca,cert,key}_file              FLAGS(store_dir_default)
//   --store_tls_server_name
//   --chunks_s3_{endpoint,bucket,prefix,region, CKPT_DEFINE_S3_CHUNK_FLAGS    checkpoint_store, loader
//   credentials_file,ca_file}                                                 (ckpt: the same names)
//
// Example (a server's main.cc):
//   CKPT_DEFINE_SERVER_SECURITY_FLAGS()
//   CKPT_DEFINE_LISTEN_FLAGS(, "127.0.0.1:0")
//   ...
//   ASSIGN_OR_RETURN(ServerSecurity security,
//                    LoadServerSecurity(CKPT_SERVER_SECURITY_FROM_FLAGS(), "--"));

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/time/time.h"
// The structs the *_FROM_FLAGS macros build: StoreClientFlags, ServerSecurityFlags, S3ChunkFlags.
#include "libs/client/open_store.h"
#include "libs/server/server_security.h"
#include "libs/store/s3_chunk_backend.h"

// ---- Server security: TLS, mutual TLS, identities or one shared token. `prefix` is pasted in
// front of every name (empty, or e.g. control_ for the trainer's control API). The TLS flags
// alone (CKPT_DEFINE_SERVER_TLS_FLAGS) are for a server that holds no identities of its own (the
// console, whose callers the store authenticates).
#define CKPT_DEFINE_SERVER_SECURITY_FLAGS(prefix) \
  CKPT_DEFINE_SERVER_TLS_FLAGS(prefix);           \
  CKPT_DEFINE_SERVER_ACCESS_FLAGS(prefix)

#define CKPT_DEFINE_SERVER_TLS_FLAGS(prefix)                                                      \
  ABSL_FLAG(std::string, prefix##tls_cert_file, "",                                             \
            "PEM certificate chain of this server: serve TLS (with --" #prefix                   \
            "tls_key_file). Re-read when it changes. Default: plaintext, with a warning at "      \
            "start-up on any address other than loopback (the console refuses those).");         \
  ABSL_FLAG(std::string, prefix##tls_key_file, "", "PEM private key of --" #prefix "tls_cert_file."); \
  ABSL_FLAG(std::string, prefix##tls_client_ca_file, "",                                        \
            "PEM CA bundle: require every client to present a certificate signed by it (mutual " \
            "TLS); its SAN or CN is the caller's identity. Default: no client certificates.");   \
  ABSL_FLAG(absl::Duration, prefix##tls_reload_interval, absl::Seconds(60),                     \
            "How often the TLS files are checked for a rotated certificate. Default 60s.")

#define CKPT_DEFINE_SERVER_ACCESS_FLAGS(prefix)                                                 \
  ABSL_FLAG(std::string, prefix##identities_file, "",                                           \
            "JSON file of named identities, each with a role (reader, writer, admin), optional " \
            "model-name patterns, and a token_sha256 or a client certificate name "              \
            "(libs/auth/access_policy.h; docs/security.md). Re-read when it changes. Instead of " \
            "--" #prefix "auth_token_file. Default: none (every caller is admitted).");          \
  ABSL_FLAG(std::string, prefix##auth_token_file, "",                                           \
            "File holding one bearer token every call must present as metadata 'authorization: " \
            "Bearer <token>' (surrounding whitespace is ignored; health checks and reflection "  \
            "stay open); its holder may do anything. For named identities with roles use --"     \
            #prefix "identities_file instead. Default: none.")

#define CKPT_SERVER_SECURITY_FROM_FLAGS(prefix)                                          \
  ::ckpt::ServerSecurityFlags {                                                         \
    absl::GetFlag(FLAGS_##prefix##tls_cert_file), absl::GetFlag(FLAGS_##prefix##tls_key_file), \
        absl::GetFlag(FLAGS_##prefix##tls_client_ca_file),                              \
        absl::GetFlag(FLAGS_##prefix##tls_reload_interval),                             \
        absl::GetFlag(FLAGS_##prefix##identities_file),                                 \
        absl::GetFlag(FLAGS_##prefix##auth_token_file)                                  \
  }

// ---- Where a server listens and where it writes the port it bound.
#define CKPT_DEFINE_LISTEN_FLAGS(prefix, default_listen)                                       \
  ABSL_FLAG(std::string, prefix##listen, default_listen,                                      \
            "HOST:PORT to serve on. Port 0 picks a free port (see --" #prefix                  \
            "port_file). 127.0.0.1 serves this machine only; serving other machines "          \
            "(0.0.0.0:PORT) is an explicit choice. Default " default_listen ".");              \
  ABSL_FLAG(std::string, prefix##port_file, "",                                               \
            "If set, the port actually bound is written to this file (decimal, one line), "    \
            "atomically, once the server is serving, for scripts that start it on port 0. "    \
            "Default: none.")

#define CKPT_DEFINE_SHUTDOWN_GRACE_FLAG()                                                    \
  ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),                               \
            "On SIGINT / SIGTERM, how long in-flight calls may run before they are cancelled. " \
            "A duration such as 10s or 500ms. Default 10s.")

// ---- A client of the checkpoint store: a service (--store) or an embedded store (--store_dir).
#define CKPT_DEFINE_STORE_CLIENT_FLAGS(store_dir_default)                                      \
  ABSL_FLAG(std::string, store, "",                                                           \
            "HOST:PORT (or HOST:PORT,HOST:PORT, or dns:///NAME:PORT) of a checkpoint_store "   \
            "service to use instead of the embedded --store_dir.");                           \
  ABSL_FLAG(std::string, store_dir, store_dir_default,                                        \
            "Directory of a checkpoint store to open in this process (embedded; no other "     \
            "process may have it open), relative to where the command was run. Default: '"     \
            store_dir_default "' (empty: none; then --store is required).");                   \
  ABSL_FLAG(std::string, store_auth_token_file, "",                                           \
            "With --store: file holding the bearer token for the checkpoint store. Default: "  \
            "none.");                                                                         \
  ABSL_FLAG(std::string, store_tls_ca_file, "",                                               \
            "With --store: PEM CA that signed the store server's certificate; turns TLS on. "  \
            "Default: plaintext.");                                                           \
  ABSL_FLAG(std::string, store_tls_cert_file, "",                                             \
            "With --store_tls_ca_file: PEM certificate presented to the store (mutual TLS), "  \
            "with --store_tls_key_file.");                                                    \
  ABSL_FLAG(std::string, store_tls_key_file, "", "PEM private key of --store_tls_cert_file."); \
  ABSL_FLAG(std::string, store_tls_server_name, "",                                           \
            "Name the store's certificate must carry when it differs from --store's host.")

#define CKPT_STORE_CLIENT_FROM_FLAGS()                                                    \
  ::ckpt::StoreClientFlags {                                                             \
    absl::GetFlag(FLAGS_store), absl::GetFlag(FLAGS_store_dir),                          \
        absl::GetFlag(FLAGS_store_auth_token_file), absl::GetFlag(FLAGS_store_tls_ca_file), \
        absl::GetFlag(FLAGS_store_tls_cert_file), absl::GetFlag(FLAGS_store_tls_key_file),  \
        absl::GetFlag(FLAGS_store_tls_server_name),                                      \
        absl::GetFlagReflectionHandle(FLAGS_store_dir).DefaultValue()                    \
  }

// ---- An embedded store's chunk bytes in an S3-compatible object store.
#define CKPT_DEFINE_S3_CHUNK_FLAGS()                                                           \
  ABSL_FLAG(std::string, chunks_s3_endpoint, "",                                              \
            "Keep chunk bytes in an S3-compatible object store at this endpoint "             \
            "(http://HOST:PORT or https://HOST[:PORT]; path-style, e.g. radosgw, MinIO, AWS) " \
            "instead of pack files beside the store's RocksDB index. Open the store with the " \
            "same --chunks_s3_* flags every time. Credentials come from AWS_ACCESS_KEY_ID / "  \
            "AWS_SECRET_ACCESS_KEY in the environment, or --chunks_s3_credentials_file; never " \
            "from a flag value. Default: unset (pack files).");                               \
  ABSL_FLAG(std::string, chunks_s3_bucket, "",                                                \
            "With --chunks_s3_endpoint: the bucket (it must exist). Required then.");         \
  ABSL_FLAG(std::string, chunks_s3_prefix, "",                                                \
            "With --chunks_s3_endpoint: a key prefix ending in '/' (e.g. team-a/), so one "    \
            "bucket can hold several stores; objects are PREFIXpacks/<16 hex>.pack. One "      \
            "prefix serves one store: garbage collection deletes pack objects under it that "  \
            "this store does not name. Default: empty.");                                     \
  ABSL_FLAG(std::string, chunks_s3_region, "",                                                \
            "With --chunks_s3_endpoint: the region in the SigV4 signature (radosgw: its "      \
            "zonegroup, usually 'default', though it accepts any). Default us-east-1.");       \
  ABSL_FLAG(std::string, chunks_s3_credentials_file, "",                                      \
            "With --chunks_s3_endpoint: a file in AWS's shared-credentials format "           \
            "(aws_access_key_id = ... / aws_secret_access_key = ...) to read the key from "    \
            "instead of the environment. Default: the environment.");                         \
  ABSL_FLAG(std::string, chunks_s3_ca_file, "",                                               \
            "With an https --chunks_s3_endpoint: PEM CA certificates to trust instead of the " \
            "system's. Default: the system's.")

#define CKPT_S3_CHUNK_FROM_FLAGS()                                                            \
  ::ckpt::S3ChunkFlags {                                                                     \
    absl::GetFlag(FLAGS_chunks_s3_endpoint), absl::GetFlag(FLAGS_chunks_s3_bucket),          \
        absl::GetFlag(FLAGS_chunks_s3_prefix), absl::GetFlag(FLAGS_chunks_s3_region),        \
        absl::GetFlag(FLAGS_chunks_s3_credentials_file), absl::GetFlag(FLAGS_chunks_s3_ca_file) \
  }

#endif  // CKPT_LIBS_SERVER_SERVICE_FLAGS_H_
