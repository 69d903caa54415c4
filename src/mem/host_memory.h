// Where this process's resident host memory is: /proc/self/smaps summed per mapped file (and
// [heap], [anon], [stack]...), the malloc heap's use (mallinfo2), and the one action that gives
// clean file pages back (release_clean_file_pages). Read on demand (a few ms for a CUDA process's
// ~2000 mappings): for reports at phase ends, never per chunk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlac {

struct HostMapping {
  std::string name;        // the file's path, or [heap], [stack], [anon], [vdso]...
  uint64_t rss_bytes = 0;  // resident (Rss)
  uint64_t anon_bytes = 0; // of which anonymous (heap, or written private pages of a file map)
};

struct HostMemory {
  uint64_t rss_bytes = 0, anon_bytes = 0, file_bytes = 0, shmem_bytes = 0;  // VmRSS = anon + file + shmem
  uint64_t heap_in_use_bytes = 0;  // malloc: bytes in use (arena + mmapped chunks)
  uint64_t heap_free_bytes = 0;    // malloc: free bytes it still holds (malloc_trim gives them back)
  std::vector<HostMapping> by_mapping;  // the largest by Rss, then "(the rest)"; `keep` always listed
  bool ok = false;                      // /proc/self/smaps was readable
};

/// Reads /proc/self/status and /proc/self/smaps. `top`: how many mappings to list by name; names in
/// `keep` (e.g. a package's path) are listed even when smaller (0 bytes when not mapped).
HostMemory read_host_memory(size_t top = 12, const std::vector<std::string>& keep = {});
/// The two cheap figures alone (no smaps walk): malloc's bytes in use (HostMemory::heap_in_use_bytes;
/// 0 without glibc 2.33's mallinfo2) and RssAnon (HostMemory::anon_bytes).
uint64_t malloc_in_use_bytes();
uint64_t rss_anon_bytes();
/// {"rss_bytes": .., "anon_bytes": .., ..., "by_mapping": [{"name": .., "rss_bytes": .., "anon_bytes": ..}]}.
std::string host_memory_json(const HostMemory& m);

/// MADV_DONTNEED on every mapping of a regular file that is read-only, not locked, holds no
/// anonymous (written, copy-on-write) page and has at least `min_rss_bytes` resident: the pages
/// are unchanged file contents, so they leave this process's RSS for the page cache and come back
/// on the next touch (a minor fault) with the same bytes. Libraries' code and read-only data and a
/// package's read pages qualify; heap, stacks, writable data, relocated (RELRO) pages and device
/// files never do. Returns the Rss of the mappings released.
uint64_t release_clean_file_pages(uint64_t min_rss_bytes);

}  // namespace vlac
