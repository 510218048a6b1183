#ifndef CKPT_LIBS_IO_PREFAULT_H_
#define CKPT_LIBS_IO_PREFAULT_H_

// Prefaulting memory before a bulk read or write of it.
//
// Touching memory a page at a time costs one page fault per 4 KiB; on virtual machines whose
// faults exit to the hypervisor that dominated loads (docs/benchmarks/methods.md: fresh memory
// filled at 0.1-0.25 GiB/s against 5-13 GiB/s for memory already mapped). madvise(MADV_POPULATE_*)
// (Linux 5.14+) maps the whole range in one call. Both functions are best effort and return whether
// the kernel mapped the pages: on older kernels, or for ranges holding no whole page, they do
// nothing and return false, and the first touch faults as before.

#include <cstddef>

namespace ckpt {

// Maps the pages inside [data, data + size) readable (page cache pages of a file mapping).
bool PrefaultForRead(const void* data, size_t size);

// Maps the pages inside [data, data + size) writable (allocates anonymous memory, or a private
// copy of a private file mapping's pages).
bool PrefaultForWrite(void* data, size_t size);

}  // namespace ckpt

#endif  // CKPT_LIBS_IO_PREFAULT_H_
