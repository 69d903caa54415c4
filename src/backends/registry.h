// The backend registry: every backend built into this vlac, by name. Built-in backends are
// added explicitly (registry.cpp calls each one's factory on first use: nothing relies on static
// initializers a linker may drop). Tests and embedders may add their own backend at run time.
// compile/, runtime/ and policy/ find a backend here by name ("cpu" by default) and reach it
// only through ir/backend.h.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "ir/backend.h"

namespace vlac {

class BackendRegistry {
 public:
  /// Adds `backend` under its name; AlreadyExists-style error when the name is taken.
  Status add(std::unique_ptr<Backend> backend);
  /// The backend named `name`, or null.
  Backend* find(std::string_view name) const;
  /// The backend named `name`, or an error "<context>: backend '<name>' is not built into this
  /// vlac (available: cpu, ...)".
  Result<Backend*> get(std::string_view name, const std::string& context) const;
  /// Registered names, in registration order (built-ins first).
  std::vector<std::string> names() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Backend>> backends_;
};

/// The process-wide registry, holding the built-in backends (cpu) from the first call on.
BackendRegistry& backend_registry();

/// The default backend of compile and run: "cpu".
inline constexpr const char* kDefaultBackend = "cpu";

}  // namespace vlac
