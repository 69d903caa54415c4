// libcublasLt.so.13 loaded at the first GEMM runner (cublaslt_api.h).
#include "backends/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <cuda_runtime_api.h>

#include <string>

namespace vlac::cuda {
namespace {

struct Loaded {
  CublasLt fns;
  Status status = Status::ok();
};

// The directory of the loaded libcudart (the toolkit's lib directory, where cuBLASLt lives too).
std::string cudart_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&cudaGetDeviceCount), &info) == 0 || !info.dli_fname) return {};
  const std::string f = info.dli_fname;
  const size_t slash = f.rfind('/');
  return slash == std::string::npos ? std::string() : f.substr(0, slash + 1);
}

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded x;
    const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const std::string dir = cudart_dir();
      if (!dir.empty()) h = dlopen((dir + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
      const char* e = dlerror();
      x.status = Status(StatusCode::Backend, "cuda: cannot load " + name + " (the CUDA toolkit's cuBLASLt): " +
                                                 (e ? e : "not found") +
                                                 "; add its directory to LD_LIBRARY_PATH");
      return x;
    }
#define VLAC_CUBLASLT_RESOLVE(fn)                                                                        \
  if (x.status.is_ok()) {                                                                                \
    x.fns.fn = reinterpret_cast<decltype(x.fns.fn)>(dlsym(h, "cublasLt" #fn));                           \
    if (!x.fns.fn) x.status = Status(StatusCode::Backend, "cuda: " + name + " has no cublasLt" #fn);   \
  }
    VLAC_CUBLASLT_FUNCTIONS(VLAC_CUBLASLT_RESOLVE)
#undef VLAC_CUBLASLT_RESOLVE
    return x;
  }();
  return l;
}

}  // namespace

Status cublaslt_load() { return loaded().status; }

const CublasLt& lt() { return loaded().fns; }

}  // namespace vlac::cuda
