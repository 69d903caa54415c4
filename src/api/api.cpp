// libvlac's public API (include/vlac/vlac.h) over the internal modules; turns Status into Error.
#include "vlac/vlac.h"

#include "io/convert.h"
#include "io/safetensors.h"

namespace vlac::api {

namespace {
Error to_error(const Status& st) { return st.is_ok() ? Error{} : Error{st.exit_code(), st.message()}; }
}  // namespace

const char* version_string() { return "0.1.0"; }

Error convert(const ConvertRequest& request) {
  if (request.struct_size != sizeof(ConvertRequest))
    return Error{2, "ConvertRequest: struct_size mismatch (built against another vlac version)"};
  auto target = parse_convert_target(request.dtype);
  if (!target.is_ok()) return to_error(target.status());
  ConvertOptions o;
  o.input = request.input;
  o.output = request.output;
  o.target = target.value();
  o.prefix = request.prefix;
  o.max_shard_size = request.max_shard_bytes;
  return to_error(convert_checkpoint(o));
}

Error summarize_checkpoint(const std::string& path, CheckpointSummary* out) {
  auto set = TensorSet::open(path);
  if (!set.is_ok()) return to_error(set.status());
  CheckpointSummary s;
  s.n_tensors = set->tensors().size();
  s.total_bytes = set->total_bytes();
  for (const auto& f : set->files()) s.files.push_back(f->path());
  if (out != nullptr) *out = std::move(s);
  return {};
}

}  // namespace vlac::api
