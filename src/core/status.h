// Status and Result<T>: errors as values across module boundaries (no exceptions in src/).
// Codes are grouped by range and stable; exit_code() maps them to the CLI's 1/2 convention.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace vlac {

enum class StatusCode : int {
  Ok = 0,
  // 1xx: bad input (files, flags, observations). CLI exit code 2.
  InvalidArgument = 100,  // a flag or API argument is wrong
  InvalidFormat = 101,    // a file's bytes break its format's rules
  NotFound = 102,         // a named file, tensor or key is missing
  ShapeMismatch = 103,    // a tensor has the wrong dtype or shape
  Unsupported = 104,      // valid input asking for something we do not implement
  // 2xx: environment failures. CLI exit code 1.
  IoError = 200,          // read/write/mmap/rename failed
  ResourceExhausted = 201,
  Internal = 202,
  Backend = 203,
  Cancelled = 204,
};

/// Human name of a code ("invalid format").
const char* to_string(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == StatusCode::Ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// True for the codes that mean "the input is bad" (CLI exit 2).
  bool is_bad_input() const { int c = static_cast<int>(code_); return c >= 100 && c < 200; }
  /// 0 for ok, 2 for bad input, 1 otherwise.
  int exit_code() const { return is_ok() ? 0 : (is_bad_input() ? 2 : 1); }
  /// Returns a copy whose message is prefixed with `context: `.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::Ok;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::InvalidArgument, std::move(m)}; }
inline Status invalid_format(std::string m) { return {StatusCode::InvalidFormat, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::NotFound, std::move(m)}; }
inline Status shape_mismatch(std::string m) { return {StatusCode::ShapeMismatch, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::Unsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::IoError, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::Internal, std::move(m)}; }
/// io_error with strerror(errno) appended.
Status errno_error(const std::string& what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {}          // NOLINT(implicit); must not be ok
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

#define VLAC_CONCAT_INNER(a, b) a##b
#define VLAC_CONCAT(a, b) VLAC_CONCAT_INNER(a, b)

#define VLAC_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::vlac::Status vlac_status_ = (expr);       \
    if (!vlac_status_.is_ok()) return vlac_status_; \
  } while (0)

#define VLAC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.is_ok()) return tmp.status();           \
  lhs = std::move(tmp).value()

#define VLAC_ASSIGN_OR_RETURN(lhs, expr) \
  VLAC_ASSIGN_OR_RETURN_IMPL(VLAC_CONCAT(vlac_result_, __LINE__), lhs, expr)

/// Always-on check of our own invariants (never of file data): aborts with a message.
#define VLAC_CHECK(cond)                                              \
  do {                                                                \
    if (!(cond)) ::vlac::check_failed(#cond, __FILE__, __LINE__);     \
  } while (0)

[[noreturn]] void check_failed(const char* cond, const char* file, int line);

}  // namespace vlac
