// Rendering of an OOM explanation: JSON (exact bytes, stable keys) and a short human report.
// Must not compute anything new: every number comes from OomMessage / OomExplanation.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/bytes.h"
#include "diag/oom_explain.h"

namespace vlac::diag {
namespace {

using Json = nlohmann::ordered_json;

Json size_json(const std::optional<PrintedSize>& s) { return s ? Json(s->bytes) : Json(nullptr); }
template <typename T>
Json opt_json(const std::optional<T>& v) { return v ? Json(*v) : Json(nullptr); }

std::string signed_bytes(int64_t b) {
  return b < 0 ? "-" + format_bytes(static_cast<uint64_t>(-(b + 1)) + 1) : format_bytes(static_cast<uint64_t>(b));
}

void row(std::string& out, const std::string& label, const std::string& value, const std::string& note = "") {
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-28s %14s", label.c_str(), value.c_str());
  out += buf;
  if (!note.empty()) out += "   " + note;
  out += "\n";
}

// "  - text" wrapped.
std::string wrap(const std::string& text, const std::string& indent, size_t width = 96);
std::string bullet(const std::string& text) {
  std::string w = wrap(text, "    ");
  if (w.size() >= 4) w.replace(2, 2, "- ");
  return w;
}

// Wraps `text` at ~96 columns with `indent`.
std::string wrap(const std::string& text, const std::string& indent, size_t width) {
  std::string out, line;
  size_t i = 0;
  while (i < text.size()) {
    size_t e = text.find(' ', i);
    if (e == std::string::npos) e = text.size();
    std::string word = text.substr(i, e - i);
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    i = e + 1;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

}  // namespace

std::string oom_report_json(const OomMessage& m, const OomExplanation& ex) {
  Json j;
  j["kind"] = to_string(m.kind);
  j["kind_assumed"] = m.kind_assumed;
  j["torch_generation"] = ex.torch_generation;
  j["exception_type"] = m.exception_type.empty() ? Json(nullptr) : Json(m.exception_type);
  j["device"] = opt_json(m.device);
  j["tried_to_allocate_bytes"] = size_json(m.tried_to_allocate);
  j["total_capacity_bytes"] = size_json(m.total_capacity);
  j["free_bytes"] = size_json(m.free);
  j["allowed_bytes"] = size_json(m.allowed);
  j["allocated_by_pytorch_bytes"] = size_json(m.allocated_by_pytorch);
  j["private_pools_bytes"] = size_json(m.private_pools);
  j["reserved_unallocated_bytes"] = opt_json(ex.reserved_unallocated_bytes);
  j["reserved_bytes"] = opt_json(ex.reserved_bytes);
  Json procs = Json::array();
  for (const auto& p : m.processes) {
    Json pj;
    pj["pid"] = opt_json(p.pid);
    pj["bytes"] = p.used ? Json(p.used->bytes) : Json(nullptr);
    pj["self"] = p.is_self;
    pj["printed"] = p.used_text;
    procs.push_back(pj);
  }
  j["processes"] = procs;
  j["this_process_bytes"] = opt_json(ex.this_process_bytes);
  j["this_process_inferred"] = ex.this_process_inferred;
  j["non_pytorch_bytes"] = opt_json(ex.non_pytorch_bytes);
  j["other_processes_bytes"] = opt_json(ex.other_processes_bytes);
  j["other_processes_estimated"] = ex.other_processes_estimated;
  j["unexplained_bytes"] = opt_json(ex.unexplained_bytes);
  j["fragmentation_ratio"] = opt_json(ex.fragmentation_ratio);
  j["request_min_bytes"] = opt_json(ex.request_min_bytes);
  j["request_max_bytes"] = opt_json(ex.request_max_bytes);
  j["request_meaning"] = ex.request_meaning;
  if (m.kind == OomKind::Mps) {
    j["mps"] = {{"allocated_bytes", size_json(m.mps_allocated)},
                {"other_allocations_bytes", size_json(m.mps_other)},
                {"max_allowed_bytes", size_json(m.mps_max_allowed)},
                {"pool", m.mps_pool}};
  }
  j["hints"] = {{"max_split_size_mb", m.hint_max_split},
                {"expandable_segments", m.hint_expandable},
                {"empty_cache", m.hint_empty_cache},
                {"mps_high_watermark_ratio", m.hint_mps_watermark},
                {"env_var", m.hint_env_var.empty() ? Json(nullptr) : Json(m.hint_env_var)},
                {"docs_url", m.docs_url.empty() ? Json(nullptr) : Json(m.docs_url)}};
  j["allocator_env_var"] = ex.allocator_env_var;
  j["allocator_setting"] = ex.allocator_setting;
  j["truncated"] = m.truncated;
  j["n_messages"] = m.n_messages;
  j["messages_differ"] = m.messages_differ;
  j["warnings"] = ex.warnings;
  j["notes"] = ex.notes;
  Json levers = Json::array();
  for (const auto& l : ex.levers)
    levers.push_back({{"name", l.name}, {"why", l.why}, {"how", l.how}, {"changes_policy", l.changes_policy},
                      {"pointed", l.pointed}});
  j["levers"] = levers;
  Json printed = Json::object();
  auto add = [&](const char* k, const std::optional<PrintedSize>& s) {
    if (s) printed[k] = s->text;
  };
  add("tried_to_allocate", m.tried_to_allocate);
  add("total_capacity", m.total_capacity);
  add("free", m.free);
  add("allowed", m.allowed);
  add("allocated_by_pytorch", m.allocated_by_pytorch);
  add("private_pools", m.private_pools);
  add("reserved_unallocated", m.reserved_unallocated);
  add("reserved_total", m.reserved_total);
  add("mps_allocated", m.mps_allocated);
  add("mps_other", m.mps_other);
  add("mps_max_allowed", m.mps_max_allowed);
  j["printed"] = printed;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string oom_report_text(const OomMessage& m, const OomExplanation& ex) {
  std::string out;
  std::string kind = m.kind == OomKind::Mps ? "MPS" : (m.kind == OomKind::Hip ? "HIP" : (m.kind == OomKind::Xpu ? "XPU" : "CUDA"));
  out += "PyTorch " + kind + " out of memory";
  if (m.device) out += " on GPU " + std::to_string(*m.device);
  out += " (wording of torch " + ex.torch_generation;
  if (!m.exception_type.empty()) out += ", " + m.exception_type;
  out += ")\n\n";

  out += "as printed\n";
  auto prow = [&](const std::string& label, const std::optional<PrintedSize>& s, const std::string& note = "") {
    if (s) row(out, label, s->text, note);
  };
  prow("tried to allocate", m.tried_to_allocate);
  prow("total capacity", m.total_capacity);
  prow("free", m.free);
  prow("allowed (memory fraction)", m.allowed);
  prow("MPS allocated", m.mps_allocated);
  prow("other allocations", m.mps_other);
  prow("max allowed", m.mps_max_allowed);
  prow("allocated by PyTorch", m.allocated_by_pytorch, m.private_pools ? "incl. " + m.private_pools->text + " in private pools" : "");
  prow(m.wording == OomWording::Cached ? "cached (reserved, unused)" : "reserved but unallocated", m.reserved_unallocated);
  prow("reserved in total", m.reserved_total);
  for (const auto& p : m.processes) {
    std::string label = p.is_self ? "this process (NVML)" : "process " + std::to_string(p.pid.value_or(0));
    std::string note = p.used ? "" : "impossible, ignored";
    if (!p.is_self && ex.this_process_inferred && p.used && ex.this_process_bytes && p.used->bytes == *ex.this_process_bytes)
      note = "read as this process";
    row(out, label, p.used_text, note);
  }
  if (m.truncated) out += "  (the message is cut after '" + m.truncated_after + "')\n";

  out += "\nderived (PyTorch does not print these)\n";
  if (ex.request_min_bytes && ex.request_max_bytes && m.tried_to_allocate) {
    std::string range = *ex.request_min_bytes == *ex.request_max_bytes
                            ? format_bytes(*ex.request_min_bytes)
                            : format_bytes(*ex.request_min_bytes) + " .. " + format_bytes(*ex.request_max_bytes);
    row(out, "tensor that failed", range);
    out += wrap(ex.request_meaning, "      ");
  }
  if (ex.reserved_bytes) row(out, "reserved by PyTorch", format_bytes(*ex.reserved_bytes), "allocated + unallocated");
  if (ex.reserved_unallocated_bytes && !m.reserved_unallocated) row(out, "reserved but unallocated", format_bytes(*ex.reserved_unallocated_bytes));
  if (ex.fragmentation_ratio) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", *ex.fragmentation_ratio * 100.0);
    row(out, "fragmentation", buf, "unallocated / reserved");
  }
  if (ex.this_process_bytes) row(out, "this process", format_bytes(*ex.this_process_bytes), ex.this_process_inferred ? "inferred" : "NVML");
  if (ex.non_pytorch_bytes) row(out, "non-PyTorch, this process", signed_bytes(*ex.non_pytorch_bytes), "context, workspaces, other allocators");
  if (ex.other_processes_bytes)
    row(out, "other processes", format_bytes(*ex.other_processes_bytes),
        ex.other_processes_estimated ? "estimate: capacity - free - reserved" : "sum of the NVML lines");
  if (ex.unexplained_bytes) row(out, "unexplained", signed_bytes(*ex.unexplained_bytes), "capacity - free - listed processes");

  if (!ex.warnings.empty()) {
    out += "\nwarnings\n";
    for (const auto& w : ex.warnings) out += bullet(w);
  }
  if (!ex.notes.empty()) {
    out += "\nnotes\n";
    for (const auto& n : ex.notes) out += bullet(n);
  }
  out += "\nlevers, in order (" + std::string(ex.levers.empty() || !ex.levers.front().pointed ? "the guide's order"
                                                                                               : "first what the numbers point to, then the guide's order") + ")\n";
  int i = 0;
  for (const auto& l : ex.levers) {
    ++i;
    char head[160];
    std::snprintf(head, sizeof head, "  %2d. %-24s %s%s\n", i, l.name.c_str(),
                  l.changes_policy ? "[changes what the policy learns]" : "[keeps the policy]", l.pointed ? "  <- the numbers" : "");
    out += head;
    out += wrap(l.why, "      ");
    out += wrap("how: " + l.how, "      ");
  }
  if (!ex.allocator_env_var.empty())
    out += "\nallocator variable for this torch: " + ex.allocator_env_var + " (" + ex.allocator_setting + ")\n";
  return out;
}

}  // namespace vlac::diag
