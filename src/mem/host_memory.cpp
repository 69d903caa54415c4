// Host memory by mapping (host_memory.h): one pass over /proc/self/smaps.
#include "mem/host_memory.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string_view>

namespace vlac {

namespace {

struct Vma {
  uintptr_t start = 0, end = 0;
  char perms[5] = {};
  std::string path;
  uint64_t rss = 0, anon = 0, locked = 0;
};

uint64_t kb_field(std::string_view line) {
  const size_t c = line.find(':');
  return c == std::string_view::npos ? 0 : std::strtoull(std::string(line.substr(c + 1)).c_str(), nullptr, 10) * 1024;
}

// Calls f(vma) for every mapping of /proc/self/smaps; false when it cannot be read.
template <class F>
bool for_each_vma(F&& f) {
  std::ifstream in("/proc/self/smaps");
  if (!in) return false;
  std::string line;
  Vma v;
  bool have = false;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const char c = line[0];
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) {  // "start-end perms offset dev inode path"
      if (have) f(v);
      v = Vma{};
      have = true;
      unsigned long long a = 0, b = 0;
      int n = 0;
      if (std::sscanf(line.c_str(), "%llx-%llx %4s %*s %*s %*s %n", &a, &b, v.perms, &n) < 3) {
        have = false;
        continue;
      }
      v.start = uintptr_t(a);
      v.end = uintptr_t(b);
      if (n > 0 && size_t(n) <= line.size()) v.path = line.substr(size_t(n));
      while (!v.path.empty() && v.path.back() == ' ') v.path.pop_back();
    } else if (have) {
      const std::string_view l(line);
      if (l.rfind("Rss:", 0) == 0) v.rss = kb_field(l);
      else if (l.rfind("Anonymous:", 0) == 0) v.anon = kb_field(l);
      else if (l.rfind("Locked:", 0) == 0) v.locked = kb_field(l);
    }
  }
  if (have) f(v);
  return true;
}

uint64_t status_kb(const std::string& status, const char* key) {
  const size_t p = status.find(key);
  if (p == std::string::npos) return 0;
  return std::strtoull(status.c_str() + p + std::strlen(key), nullptr, 10) * 1024;
}

std::string read_status() {
  std::ifstream in("/proc/self/status");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct MallocUse {
  uint64_t in_use = 0, free = 0;
};
MallocUse malloc_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  return {mi.uordblks + mi.hblkhd, mi.fordblks};
#else
  return {};
#endif
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

bool clean_file_mapping(const Vma& v) {
  if (v.path.empty() || v.path[0] != '/') return false;  // anonymous, [heap], [stack], [vdso]...
  if (v.path.rfind("/dev/", 0) == 0 || v.path.rfind("/memfd:", 0) == 0) return false;  // device / shmem
  const std::string_view del = " (deleted)";
  if (v.path.size() >= del.size() && v.path.compare(v.path.size() - del.size(), del.size(), del) == 0) return false;
  return v.perms[1] != 'w' && v.anon == 0 && v.locked == 0;
}

}  // namespace

uint64_t malloc_in_use_bytes() { return malloc_use().in_use; }

uint64_t rss_anon_bytes() { return status_kb(read_status(), "RssAnon:"); }

HostMemory read_host_memory(size_t top, const std::vector<std::string>& keep) {
  HostMemory m;
  {
    const std::string s = read_status();
    m.rss_bytes = status_kb(s, "VmRSS:");
    m.anon_bytes = status_kb(s, "RssAnon:");
    m.file_bytes = status_kb(s, "RssFile:");
    m.shmem_bytes = status_kb(s, "RssShmem:");
  }
  const MallocUse mu = malloc_use();
  m.heap_in_use_bytes = mu.in_use;
  m.heap_free_bytes = mu.free;
  std::map<std::string, HostMapping> by;
  m.ok = for_each_vma([&](const Vma& v) {
    const std::string name = v.path.empty() ? "[anon]" : v.path;
    HostMapping& h = by[name];
    h.name = name;
    h.rss_bytes += v.rss;
    h.anon_bytes += v.anon;
  });
  std::vector<HostMapping> all;
  for (auto& [k, h] : by) all.push_back(std::move(h));
  std::sort(all.begin(), all.end(), [](const HostMapping& a, const HostMapping& b) {
    return a.rss_bytes != b.rss_bytes ? a.rss_bytes > b.rss_bytes : a.name < b.name;
  });
  HostMapping rest{"(the rest)", 0, 0};
  for (size_t i = 0; i < all.size(); ++i) {
    const bool kept = std::find(keep.begin(), keep.end(), all[i].name) != keep.end();
    if (i < top || kept) m.by_mapping.push_back(all[i]);
    else rest.rss_bytes += all[i].rss_bytes, rest.anon_bytes += all[i].anon_bytes;
  }
  for (const std::string& k : keep)
    if (!by.count(k)) m.by_mapping.push_back({k, 0, 0});
  if (rest.rss_bytes > 0) m.by_mapping.push_back(rest);
  return m;
}

std::string host_memory_json(const HostMemory& m) {
  std::string s = "{\"rss_bytes\": " + std::to_string(m.rss_bytes) + ", \"anon_bytes\": " + std::to_string(m.anon_bytes) +
                  ", \"file_bytes\": " + std::to_string(m.file_bytes) + ", \"shmem_bytes\": " +
                  std::to_string(m.shmem_bytes) + ", \"heap_in_use_bytes\": " + std::to_string(m.heap_in_use_bytes) +
                  ", \"heap_free_bytes\": " + std::to_string(m.heap_free_bytes) + ", \"by_mapping\": [";
  for (size_t i = 0; i < m.by_mapping.size(); ++i) {
    const HostMapping& h = m.by_mapping[i];
    s += (i ? ", " : "") + std::string("{\"name\": ") + json_string(h.name) + ", \"rss_bytes\": " +
         std::to_string(h.rss_bytes) + ", \"anon_bytes\": " + std::to_string(h.anon_bytes) + "}";
  }
  return s + "]}";
}

uint64_t release_clean_file_pages(uint64_t min_rss_bytes) {
  // Collected first, released after: smaps is not read while the mappings change under it.
  struct Range {
    uintptr_t start, end;
    uint64_t rss;
  };
  std::vector<Range> ranges;
  for_each_vma([&](const Vma& v) {
    if (v.rss >= min_rss_bytes && v.rss > 0 && clean_file_mapping(v)) ranges.push_back({v.start, v.end, v.rss});
  });
  uint64_t released = 0;
  for (const Range& r : ranges)
    if (madvise(reinterpret_cast<void*>(r.start), r.end - r.start, MADV_DONTNEED) == 0) released += r.rss;
  return released;
}

}  // namespace vlac
