// libFuzzer target: lerobot processor files from hostile bytes (policy_preprocessor.json,
// policy_postprocessor.json, a stats safetensors) through parse_pi05_processor, then the pure
// steps on the result. Input: the three files separated by "\n@@@\n". Must never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "policy/pi05_processor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  size_t pos = 0;
  while (parts.size() < 2) {
    const size_t sep = in.find("\n@@@\n", pos);
    if (sep == std::string_view::npos) break;
    parts.push_back(in.substr(pos, sep - pos));
    pos = sep + 5;
  }
  parts.push_back(in.substr(pos));
  static const char* kNames[] = {"policy_preprocessor.json", "policy_postprocessor.json", "stats.safetensors"};
  vlac::ProcessorFiles files;
  files.origin = "fuzz";
  for (size_t i = 0; i < parts.size(); ++i)
    files.files[kNames[i]] = {reinterpret_cast<const uint8_t*>(parts[i].data()), parts[i].size()};
  auto p = vlac::parse_pi05_processor(files);
  if (p.is_ok()) {
    std::vector<float> v{0.5f, -2.0f, 3.0f, 0.0f, 1.0f, -1.0f};
    for (const auto* n : {p->normalizer ? &*p->normalizer : nullptr, p->unnormalizer ? &*p->unnormalizer : nullptr}) {
      if (!n) continue;
      for (const char* key : {"observation.state", "action"})
        for (size_t axis : {size_t(1), size_t(2), size_t(3), size_t(6)}) {
          (void)n->apply(key, "STATE", v.data(), v.size(), false, axis);
          (void)n->apply(key, "ACTION", v.data(), v.size(), true, axis);
        }
    }
    (void)p->relative_mask(int64_t(size % 40));
  }
  const std::string task = vlac::pi05_clean_task(in.substr(0, 256));
  std::vector<float> s;
  for (size_t i = 0; i + 4 <= size && s.size() < 16; i += 4) {
    float f;
    __builtin_memcpy(&f, data + i, 4);
    s.push_back(f);
  }
  (void)vlac::pi05_prompt(task, vlac::pi05_discretize_state(s.data(), s.size()));
  return 0;
}
