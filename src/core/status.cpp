// Status helpers.
#include "core/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vlac {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::Ok: return "ok";
    case StatusCode::InvalidArgument: return "invalid argument";
    case StatusCode::InvalidFormat: return "invalid format";
    case StatusCode::NotFound: return "not found";
    case StatusCode::ShapeMismatch: return "shape mismatch";
    case StatusCode::Unsupported: return "unsupported";
    case StatusCode::IoError: return "i/o error";
    case StatusCode::ResourceExhausted: return "resource exhausted";
    case StatusCode::Internal: return "internal error";
    case StatusCode::Backend: return "backend error";
    case StatusCode::Cancelled: return "cancelled";
  }
  return "unknown";
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return {code_, context + ": " + message_};
}

Status errno_error(const std::string& what, int err) {
  return io_error(what + ": " + std::strerror(err));
}

void check_failed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "vlac: internal check failed: %s (%s:%d)\n", cond, file, line);
  std::abort();
}

}  // namespace vlac
