// Who holds a process's host memory: an LD_PRELOAD library that attributes every live malloc
// block and anonymous mmap to the first shared object on its call stack that is not the C/C++
// runtime (libcuda, libcublasLt, the vlac binary...), and prints the table at exit.
//
//   cc -O2 -shared -fPIC -o /tmp/host_alloc_trace.so tools/host_alloc_trace.c -ldl
//   HOST_ALLOC_TRACE_OUT=/tmp/trace.txt LD_PRELOAD=/tmp/host_alloc_trace.so build/bench/pi05_chunk_bench ...
//
// A diagnostic (it slows allocation down by a stack walk each); the numbers are live bytes at exit
// and the peak of the live total, by owner, in HOST_ALLOC_TRACE_OUT.<pid> (one file per process:
// a wrapper such as timeout is traced too). Not linked into anything.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define TABLE_BITS 22
#define TABLE_SIZE (1u << TABLE_BITS)
#define MAX_OWNERS 128

typedef struct {
  uintptr_t p;      // 0: empty, 1: deleted
  uint64_t bytes : 56;
  uint64_t owner : 7;
  uint64_t is_mmap : 1;
} Slot;

static Slot* table;
static char owner_name[MAX_OWNERS][160];
static uintptr_t owner_lo[MAX_OWNERS], owner_hi[MAX_OWNERS];
static int owners = 1;  // 0: unknown
static int64_t live[MAX_OWNERS][2], total[MAX_OWNERS][2], count[MAX_OWNERS][2];
static int64_t live_sum, peak_sum;
static atomic_flag lock = ATOMIC_FLAG_INIT;
static __thread int inside;

static void* (*real_malloc)(size_t);
static void (*real_free)(void*);
static void* (*real_calloc)(size_t, size_t);
static void* (*real_realloc)(void*, size_t);
static int (*real_posix_memalign)(void**, size_t, size_t);
static void* (*real_memalign)(size_t, size_t);
static void* (*real_aligned_alloc)(size_t, size_t);
static void* (*real_mmap)(void*, size_t, int, int, int, off_t);
static int (*real_munmap)(void*, size_t);

// dlsym calls calloc before real_calloc is known: a small static arena serves it.
static char boot[8192];
static size_t boot_used;

static void init(void) {
  if (real_malloc) return;
  real_malloc = dlsym(RTLD_NEXT, "malloc");
  real_free = dlsym(RTLD_NEXT, "free");
  real_calloc = dlsym(RTLD_NEXT, "calloc");
  real_realloc = dlsym(RTLD_NEXT, "realloc");
  real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
  real_memalign = dlsym(RTLD_NEXT, "memalign");
  real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
  real_mmap = dlsym(RTLD_NEXT, "mmap");
  real_munmap = dlsym(RTLD_NEXT, "munmap");
}

static int is_runtime(const char* path) {
  static const char* skip[] = {"libc.so", "libstdc++", "libgcc_s", "ld-linux", "host_alloc_trace", "libpthread"};
  for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); ++i)
    if (strstr(path, skip[i])) return 1;
  return 0;
}

// Owner index of the first non-runtime frame; called with the lock held and `inside` set.
static int owner_of_stack(void) {
  void* frames[16];
  const int n = backtrace(frames, 16);
  for (int i = 1; i < n; ++i) {
    const uintptr_t a = (uintptr_t)frames[i];
    for (int o = 1; o < owners; ++o)
      if (a >= owner_lo[o] && a < owner_hi[o]) {
        if (owner_name[o][0] == '-') break;  // a runtime object: next frame
        return o;
      }
    Dl_info info;
    if (!dladdr(frames[i], &info) || !info.dli_fname) continue;
    int o = -1;
    for (int k = 1; k < owners; ++k)
      if (owner_lo[k] == (uintptr_t)info.dli_fbase) o = k;
    if (o < 0 && owners < MAX_OWNERS) {
      o = owners++;
      owner_lo[o] = (uintptr_t)info.dli_fbase;
      owner_hi[o] = owner_lo[o];  // widened below as frames are seen
      snprintf(owner_name[o], sizeof(owner_name[o]), "%s%s", is_runtime(info.dli_fname) ? "-" : "", info.dli_fname);
    }
    if (o < 0) return 0;
    if (a >= owner_hi[o]) owner_hi[o] = a + 1;
    if (owner_name[o][0] != '-') return o;
  }
  return 0;
}

static size_t h(uintptr_t p) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ull >> (64 - TABLE_BITS)); }

static void record(void* p, size_t bytes, int is_mmap) {
  if (!p || inside) return;
  inside = 1;
  while (atomic_flag_test_and_set(&lock)) {
  }
  if (!table) {
    table = real_mmap(NULL, sizeof(Slot) * TABLE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (table == MAP_FAILED) table = NULL;
  }
  if (table) {
    const int o = owner_of_stack();
    for (size_t i = h((uintptr_t)p), k = 0; k < TABLE_SIZE; ++k, i = (i + 1) & (TABLE_SIZE - 1))
      if (table[i].p <= 1) {
        table[i].p = (uintptr_t)p;
        table[i].bytes = bytes;
        table[i].owner = (uint64_t)o;
        table[i].is_mmap = (uint64_t)is_mmap;
        live[o][is_mmap] += (int64_t)bytes;
        total[o][is_mmap] += (int64_t)bytes;
        count[o][is_mmap] += 1;
        live_sum += (int64_t)bytes;
        if (live_sum > peak_sum) peak_sum = live_sum;
        break;
      }
  }
  atomic_flag_clear(&lock);
  inside = 0;
}

static void forget(void* p) {
  if (!p || !table || inside) return;  // a free from inside the stack walk: the lock is ours
  inside = 1;
  while (atomic_flag_test_and_set(&lock)) {
  }
  for (size_t i = h((uintptr_t)p), k = 0; k < TABLE_SIZE && table[i].p != 0; ++k, i = (i + 1) & (TABLE_SIZE - 1))
    if (table[i].p == (uintptr_t)p) {
      live[table[i].owner][table[i].is_mmap] -= (int64_t)table[i].bytes;
      live_sum -= (int64_t)table[i].bytes;
      table[i].p = 1;
      break;
    }
  atomic_flag_clear(&lock);
  inside = 0;
}

void* malloc(size_t n) {
  init();
  void* p = real_malloc(n);
  record(p, n, 0);
  return p;
}
void free(void* p) {
  if ((char*)p >= boot && (char*)p < boot + sizeof(boot)) return;
  init();
  forget(p);
  real_free(p);
}
void* calloc(size_t a, size_t b) {
  if (!real_calloc) {
    if (!real_malloc && boot_used + a * b + 16 <= sizeof(boot)) {  // inside dlsym, before init finished
      void* p = boot + boot_used;
      boot_used += (a * b + 15) / 16 * 16;
      return p;
    }
    init();
  }
  void* p = real_calloc(a, b);
  record(p, a * b, 0);
  return p;
}
void* realloc(void* q, size_t n) {
  init();
  forget(q);
  void* p = real_realloc(q, n);
  record(p, n, 0);
  return p;
}
int posix_memalign(void** out, size_t al, size_t n) {
  init();
  const int r = real_posix_memalign(out, al, n);
  if (r == 0) record(*out, n, 0);
  return r;
}
void* memalign(size_t al, size_t n) {
  init();
  void* p = real_memalign(al, n);
  record(p, n, 0);
  return p;
}
void* aligned_alloc(size_t al, size_t n) {
  init();
  void* p = real_aligned_alloc(al, n);
  record(p, n, 0);
  return p;
}
void* mmap(void* a, size_t n, int prot, int flags, int fd, off_t off) {
  init();
  void* p = real_mmap(a, n, prot, flags, fd, off);
  if (p != MAP_FAILED && (flags & MAP_ANONYMOUS) && !(flags & MAP_FIXED)) record(p, n, 1);
  return p;
}
int munmap(void* a, size_t n) {
  init();
  forget(a);
  return real_munmap(a, n);
}

__attribute__((destructor)) static void report(void) {
  inside = 1;
  const char* path = getenv("HOST_ALLOC_TRACE_OUT");
  char name[4096];
  if (path) snprintf(name, sizeof(name), "%s.%d", path, (int)getpid());  // one file per process
  FILE* f = path ? fopen(name, "w") : stderr;
  if (!f) return;
  fprintf(f, "host_alloc_trace: live bytes at exit by owner (malloc | anonymous mmap, reserved not resident); "
             "peak live total %.1f MB\n", (double)peak_sum / 1e6);
  fprintf(f, "%12s %12s %12s %10s  %s\n", "malloc_MB", "mmap_MB", "malloc_total", "mallocs", "owner");
  for (int o = 0; o < owners; ++o) {
    if (!live[o][0] && !live[o][1] && !total[o][0]) continue;
    fprintf(f, "%12.1f %12.1f %12.1f %10lld  %s\n", (double)live[o][0] / 1e6, (double)live[o][1] / 1e6,
            (double)total[o][0] / 1e6, (long long)count[o][0], o ? owner_name[o] : "(unknown)");
  }
  if (f != stderr) fclose(f);
}
