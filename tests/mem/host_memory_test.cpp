// Host memory by mapping, and giving clean file pages back without changing a byte.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mem/host_memory.h"

namespace vlac {
namespace {

constexpr size_t kBytes = 8u << 20;

std::string make_file() {
  char path[] = "/tmp/vlac_host_memory_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  std::vector<unsigned char> b(kBytes);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(i * 131 + 7);
  EXPECT_EQ(write(fd, b.data(), b.size()), ssize_t(b.size()));
  close(fd);
  char* real = realpath(path, nullptr);
  std::string out = real ? real : path;
  free(real);
  return out;
}

uint64_t rss_of(const std::string& path) {
  const HostMemory m = read_host_memory(0, {path});
  for (const auto& h : m.by_mapping)
    if (h.name == path) return h.rss_bytes;
  return ~0ull;
}

// Reads one byte per page (volatile: the reads must happen even where the sum is unused).
uint64_t touch(const unsigned char* p) {
  const volatile unsigned char* v = p;
  uint64_t sum = 0;
  for (size_t i = 0; i < kBytes; i += 4096) sum += v[i];
  return sum;
}

TEST(HostMemory, ListsTheProcessAndAMappedFile) {
  const std::string path = make_file();
  const int fd = open(path.c_str(), O_RDONLY);
  auto* p = static_cast<const unsigned char*>(mmap(nullptr, kBytes, PROT_READ, MAP_PRIVATE, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  touch(p);
  const HostMemory m = read_host_memory(3, {path, "/no/such/file"});
  ASSERT_TRUE(m.ok);
  EXPECT_GT(m.rss_bytes, 0u);
  EXPECT_EQ(m.rss_bytes, m.anon_bytes + m.file_bytes + m.shmem_bytes);
  EXPECT_GE(rss_of(path), kBytes / 2);  // the file's pages, resident once touched
  bool listed_absent = false;
  for (const auto& h : m.by_mapping) listed_absent |= h.name == "/no/such/file" && h.rss_bytes == 0;
  EXPECT_TRUE(listed_absent);
  const std::string j = host_memory_json(m);
  EXPECT_NE(j.find("\"by_mapping\": [{\"name\": "), std::string::npos) << j;
  munmap(const_cast<unsigned char*>(p), kBytes);
  close(fd);
  unlink(path.c_str());
}

TEST(HostMemory, CleanFilePagesGoBackAndReadTheSame) {
  const std::string path = make_file();
  const int fd = open(path.c_str(), O_RDONLY);
  auto* p = static_cast<const unsigned char*>(mmap(nullptr, kBytes, PROT_READ, MAP_PRIVATE, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t sum = touch(p);
  ASSERT_GE(rss_of(path), kBytes / 2);
  EXPECT_GE(release_clean_file_pages(1u << 20), kBytes / 2);
  EXPECT_LT(rss_of(path), 1u << 20);
  EXPECT_EQ(touch(p), sum);  // faulted in again from the file, same bytes
  munmap(const_cast<unsigned char*>(p), kBytes);
  close(fd);
  unlink(path.c_str());
}

TEST(HostMemory, WrittenPrivatePagesAreNeverReleased) {
  const std::string path = make_file();
  const int fd = open(path.c_str(), O_RDONLY);
  auto* p = static_cast<unsigned char*>(mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  touch(p);
  p[12345] = 0xAB;  // a copy-on-write page: only this process has it
  // Read-only again (as the loader leaves RELRO pages): still not clean, never dropped.
  ASSERT_EQ(mprotect(p, kBytes, PROT_READ), 0);
  const uint64_t before = rss_of(path);
  release_clean_file_pages(0);
  EXPECT_EQ(p[12345], 0xAB);
  EXPECT_EQ(rss_of(path), before);
  munmap(p, kBytes);
  close(fd);
  unlink(path.c_str());
}

}  // namespace
}  // namespace vlac
