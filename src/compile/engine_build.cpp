// Engine building (see engine_build.h).
#include "compile/engine_build.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <set>

#include "core/atomic_file.h"
#include "core/bytes.h"
#include "core/quant.h"
#include "ir/serialize.h"
#include "ir/walk.h"
#include "partition/partition.h"

namespace vlac {

namespace {

using nlohmann::json;

// Engine folders of compiles that were killed (".vlac-engines-<pid>" whose process is gone):
// removed, so a SIGKILLed compile does not leave gigabytes behind for good.
void remove_stale_engine_dirs(const std::string& parent, const std::function<void(const std::string&)>& log) {
  DIR* d = ::opendir(parent.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    const std::string prefix = ".vlac-engines-";
    if (n.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(n.c_str() + prefix.size(), &end, 10);
    if (!end || *end != '\0' || pid <= 0) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    stale.push_back(parent + "/" + n);
  }
  ::closedir(d);
  for (const auto& dir : stale) {
    if (DIR* sd = ::opendir(dir.c_str())) {
      while (dirent* e = ::readdir(sd)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") ::unlink((dir + "/" + n).c_str());
      }
      ::closedir(sd);
    }
    if (::rmdir(dir.c_str()) == 0 && log) log("  removed " + dir + " (left by a compile that was killed)");
  }
}

}  // namespace

Result<std::unique_ptr<EngineFolder>> EngineFolder::open(const std::string& out, const std::string& engine_dir,
                                                         const std::function<void(const std::string&)>& log) {
  std::string dir = engine_dir;
  bool own = false;
  if (dir.empty()) {
    remove_stale_engine_dirs(parent_dir(out), log);
    dir = parent_dir(out) + "/.vlac-engines-" + std::to_string(::getpid());
    own = true;
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_error("compile: cannot create " + dir, errno);
  if (!is_dir(dir)) return invalid_argument("compile: --engine-dir " + dir + " is not a folder");
  return std::unique_ptr<EngineFolder>(new EngineFolder(dir, own));
}

void EngineFolder::cleanup() {
  for (const auto& f : files_) ::unlink(f.c_str());
  files_.clear();
  if (own_) ::rmdir(dir_.c_str());
  own_ = false;
}

Result<std::vector<std::string>> EngineBuilder::add_stage(const ir::Graph& given, const std::string& stage,
                                                          const std::map<ir::ValueId, std::string>& given_named) {
  auto log = [&](const std::string& s) {
    if (opt_.log) opt_.log(s);
  };
  // 8-bit weights (core/quant.h) are for a Linear's W and a gathered table (rows with their
  // scales): a weight with any other use that the option would quantize is stored bf16 instead.
  std::set<std::string> not_linear_w;
  auto run_dtype = [&](const ir::WeightRef& r) {
    const DType d = opt_.run_dtype ? opt_.run_dtype(r) : r.dtype;
    if (is_quant_dtype(d) && (r.shape.size() != 2 || not_linear_w.count(r.name))) return DType::BF16;
    return d;
  };
  // The backend's own rewrite of the stage (e.g. fused projections), before partitioning.
  VLAC_ASSIGN_OR_RETURN(std::optional<LoweredGraph> lowered, compiler_.lower(given));
  std::map<ir::ValueId, std::string> lowered_named;
  if (lowered) {
    for (const auto& [v, n] : given_named) {
      const ir::ValueId nv = size_t(v) < lowered->value_map.size() ? lowered->value_map[size_t(v)] : ir::kNone;
      if (nv == ir::kNone)
        return internal_error("compile: backend '" + std::string(compiler_.name()) + "' dropped output '" + n +
                              "' of stage " + stage);
      lowered_named[nv] = n;
    }
  }
  const ir::Graph& g = lowered ? lowered->graph : given;
  const std::map<ir::ValueId, std::string>& named = lowered ? lowered_named : given_named;
  for (const ir::Node& n : g.nodes())
    for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
      const ir::Node& p = g.node(g.value(n.inputs[slot]).producer);
      if (p.op == ir::OpKind::Weight && !(n.op == ir::OpKind::Linear && slot == 1) &&
          !(n.op == ir::OpKind::Embedding && slot == 0))
        not_linear_w.insert(g.weights()[size_t(p.weight)].name);
    }
  // A fused weight is stored in one dtype: its parts must agree with it.
  for (const ir::WeightRef& r : g.weights())
    for (const ir::WeightRef& part : r.parts)
      if (run_dtype(part) != run_dtype(r))
        return unsupported("compile: fused weight '" + r.name + "' would run in " + dtype_name(run_dtype(r)) +
                           " but its part '" + part.name + "' in " + dtype_name(run_dtype(part)));
  auto packed_bytes = [&](const ir::WeightRef& r) {
    return stored_weight_bytes(run_dtype(r), r.shape);
  };
  // The backend must run every node the stage schedules (the partitioner keeps one backend).
  VLAC_ASSIGN_OR_RETURN(std::vector<ir::NodeId> order, ir::schedule(g));
  for (ir::NodeId id : order)
    if (!compiler_.supports(g, id))
      return unsupported("compile: backend '" + std::string(compiler_.name()) + "' cannot run node '" + g.node(id).name +
                         "' (" + ir::op_name(g.node(id).op) + ") of stage " + stage);
  partition::Options popt;
  popt.engine_cap = opt_.engine_cap;
  VLAC_ASSIGN_OR_RETURN(partition::Plan plan, partition::partition_graph(g, stage, packed_bytes, popt));
  sum_.plan_text += partition::plan_summary(g, plan, named);
  // Where each weight of this stage is stored: engine segment + offset.
  std::map<ir::WeightId, std::pair<std::string, BlobWeight>> home;
  std::vector<std::string> names;
  for (size_t ei = 0; ei < plan.engines.size(); ++ei) {
    const partition::EnginePlan& ep = plan.engines[ei];
    if (opt_.on_stage) opt_.on_stage("engine:" + ep.name);
    std::vector<StoredWeight> store;
    for (ir::WeightId w : ep.owned) {
      const ir::WeightRef& r = g.weights()[size_t(w)];
      store.push_back({r, run_dtype(r)});
      sum_.source_weight_bytes += r.bytes;
    }
    const std::string seg = "engine/" + ep.name;
    folder_.track(folder_.path() + "/" + ep.name + ".engine");
    VLAC_ASSIGN_OR_RETURN(ir::Graph sub, partition::extract_engine(g, plan, ei, named));
    VLAC_ASSIGN_OR_RETURN(Subgraph subgraph, whole_graph(sub));
    CompileOptions copt;
    copt.engine_dir = folder_.path();
    copt.engine_name = ep.name;
    copt.calibration = opt_.calibration;
    VLAC_ASSIGN_OR_RETURN(EngineBlob ef, compiler_.compile(subgraph, store, source_, copt));
    if (ef.path != folder_.path() + "/" + ep.name + ".engine") folder_.track(ef.path);
    if (ef.weights.size() != store.size())
      return internal_error("compile: backend '" + ef.backend + "' stored " + std::to_string(ef.weights.size()) +
                            " weights of engine " + ep.name + ", expected " + std::to_string(store.size()));
    for (size_t i = 0; i < ep.owned.size(); ++i) home[ep.owned[i]] = {seg, ef.weights[i]};
    VLAC_RETURN_IF_ERROR(writer_.add_file(seg, package::SegmentKind::Engine, ef.path));

    PackageEngine pe;
    pe.name = ep.name;
    pe.segment = seg;
    pe.backend = ef.backend;
    for (ir::ValueId v : sub.inputs()) pe.inputs.push_back({ir::input_name(sub, v), sub.info(v).dtype, sub.info(v).shape});
    for (size_t i = 0; i < sub.outputs().size(); ++i)
      pe.outputs.push_back({partition::boundary_name(g, ep.outputs[i], named), sub.info(sub.outputs()[i]).dtype,
                            sub.info(sub.outputs()[i]).shape});
    json wt = json::array();
    for (ir::WeightId w : ep.weights) {
      const auto& [wseg, ew] = home.at(w);
      wt.push_back(json::object({{"name", ew.name}, {"dtype", dtype_name(ew.dtype)}, {"shape", ew.shape},
                                 {"segment", wseg}, {"offset", ew.offset}, {"bytes", ew.bytes}}));
    }
    json frees = json::array();
    for (ir::WeightId w : ep.weights)
      if (plan.weight_last_use[size_t(w)] == int(ei)) frees.push_back(g.weights()[size_t(w)].name);
    pe.extra = json::object({{"stage", stage},
                             {"program", ir::graph_to_json(sub)},
                             {"weights", std::move(wt)},
                             {"weight_bytes", ep.weight_bytes},
                             {"over_cap", ep.over_cap},
                             {"last_use", std::move(frees)}});
    if (ep.over_cap) pe.extra["over_cap_node"] = ep.over_cap_node;
    if (!ef.backend_info.empty()) {
      json info = json::parse(ef.backend_info, nullptr, false);
      if (!info.is_object())
        return internal_error("compile: backend '" + ef.backend + "' gave engine " + ep.name +
                              " a backend_info that is not a JSON object");
      pe.extra["backend_info"] = std::move(info);
    }
    manifest_.engines.push_back(std::move(pe));
    names.push_back(ep.name);

    CompiledEngine se;
    se.name = ep.name;
    se.stage = stage;
    se.weight_bytes = ep.weight_bytes;
    se.file_bytes = ef.bytes;
    se.weights_stored = int(ep.owned.size());
    se.weights_read = int(ep.weights.size());
    se.over_cap = ep.over_cap;
    se.over_cap_node = ep.over_cap_node;
    for (ir::ValueId v : ep.inputs)
      if (g.node(g.value(v).producer).op != ir::OpKind::Input) se.crossing_in_bytes += g.info(v).bytes();
    sum_.packed_weight_bytes += ef.bytes;
    log("  engine " + ep.name + ": " + std::to_string(ep.owned.size()) + " weights, " + format_bytes(ef.bytes) +
        (ep.over_cap ? " (over the cap: '" + ep.over_cap_node + "' alone is larger)" : ""));
    sum_.engines.push_back(std::move(se));
  }
  for (const partition::Crossing& c : plan.crossings) {
    PackageCrossing pc;
    pc.name = partition::boundary_name(g, c.value, named);
    pc.dtype = g.info(c.value).dtype;
    pc.shape = g.info(c.value).shape;
    pc.bytes = c.bytes;
    pc.producer = plan.engines[size_t(c.producer)].name;
    for (int e : c.consumers) pc.consumers.push_back(plan.engines[size_t(e)].name);
    sum_.crossing_bytes += c.bytes;
    manifest_.crossing.push_back(std::move(pc));
  }
  return names;
}

}  // namespace vlac
