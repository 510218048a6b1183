#ifndef CKPT_SERVICES_CONSOLE_WEB_ASSETS_H_
#define CKPT_SERVICES_CONSOLE_WEB_ASSETS_H_

// The console's page (services/console/web: index.html, app.js, app.css, favicon.svg), built into
// the binary by tools/build_defs/embed_files.py, so `console` serves it from any directory
// (--web_dir serves a directory instead, for work on the page).

#include <cstddef>

namespace ckpt::console_web {

struct EmbeddedFile {
  const char* name;  // the base name, e.g. "app.js".
  const char* data;
  size_t size;
};

extern const EmbeddedFile kEmbeddedFiles[];
extern const size_t kEmbeddedFileCount;

}  // namespace ckpt::console_web

#endif  // CKPT_SERVICES_CONSOLE_WEB_ASSETS_H_
