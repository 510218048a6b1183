#include "libs/io/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace ckpt {
namespace {

// Pages that lie wholly inside [data, data + size): madvise needs a page-aligned start, and
// partial pages at the ends are left to fault normally.
bool WholePages(const void* data, size_t size, void** start, size_t* length) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t end = (begin + size) / page * page;
  if (end <= first) return false;
  *start = reinterpret_cast<void*>(first);
  *length = end - first;
  return true;
}

bool Populate(const void* data, size_t size, int advice) {
  void* start = nullptr;
  size_t length = 0;
  if (!WholePages(data, size, &start, &length)) return false;
  // EINVAL on kernels before 5.14: nothing is lost, the pages fault on first touch instead.
  return ::madvise(start, length, advice) == 0;
}

}  // namespace

bool PrefaultForRead(const void* data, size_t size) {
#ifdef MADV_POPULATE_READ
  return Populate(data, size, MADV_POPULATE_READ);
#else
  return false;
#endif
}

bool PrefaultForWrite(void* data, size_t size) {
#ifdef MADV_POPULATE_WRITE
  return Populate(data, size, MADV_POPULATE_WRITE);
#else
  return false;
#endif
}

}  // namespace ckpt
