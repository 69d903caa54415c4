// pi0.5 compile driver (see pi05_compile.h): builds the four stage graphs (vision per camera,
// text embedding, Gemma prefix, one denoising step), partitions each under the cap, has the
// chosen backend build one engine file at a time and streams them into the package.
#include "compile/pi05_compile.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>

#include "backends/registry.h"
#include "core/atomic_file.h"
#include "core/bytes.h"
#include "core/mapped_file.h"
#include "ir/backend.h"
#include "ir/serialize.h"
#include "ir/walk.h"
#include "models/pi05_builder.h"
#include "package/package_writer.h"
#include "partition/partition.h"
#include "policy/pi05_processor.h"

namespace vlac {

namespace {

using nlohmann::json;

// Removes the temporary engine folder on every exit path unless released.
class DirGuard {
 public:
  DirGuard(std::string dir, bool own) : dir_(std::move(dir)), own_(own) {}
  ~DirGuard() { cleanup(); }
  void track(const std::string& file) { files_.push_back(file); }
  /// Keeps the files and the folder (--keep-engines): the destructor removes nothing.
  void release() {
    files_.clear();
    own_ = false;
  }
  void cleanup() {
    for (const auto& f : files_) ::unlink(f.c_str());
    files_.clear();
    if (own_) ::rmdir(dir_.c_str());
    own_ = false;
  }

 private:
  std::string dir_;
  bool own_;
  std::vector<std::string> files_;
};

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

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

struct StageGraph {
  std::string name;
  Pi05Graph graph;
};

}  // namespace

std::vector<std::string> pi05_side_files(const std::string& policy_dir) {
  std::vector<std::string> out = pi05_processor_file_names(policy_dir);
  std::sort(out.begin(), out.end());
  return out;
}

Result<Pi05CompileSummary> compile_pi05(const std::string& policy_dir, const Pi05CompileOptions& opt) {
  auto log = [&](const std::string& s) {
    if (opt.log) opt.log(s);
  };
  auto stage_hook = [&](const std::string& s) {
    if (opt.on_stage) opt.on_stage(s);
  };
  if (opt.out.empty()) return invalid_argument("compile: -o OUT.vlac is required");
  if (opt.engine_cap < 4096) return invalid_argument("--engine-cap must be at least 4 KiB");
  VLAC_ASSIGN_OR_RETURN(Backend* backend, backend_registry().get(opt.backend, "compile"));
  BackendCompiler* compiler = backend->compiler();
  if (!compiler) return unsupported("compile: backend '" + opt.backend + "' runs packages but does not build engines");
  VLAC_ASSIGN_OR_RETURN(Pi05Model model, Pi05Model::load(policy_dir));
  // The processor files go into the package verbatim: refuse now what the runtime would refuse.
  VLAC_RETURN_IF_ERROR(load_pi05_processor(policy_dir).status());
  if (!is_dir(parent_dir(opt.out)))
    return not_found(opt.out + ": the output folder " + parent_dir(opt.out) + " does not exist");
  const Pi05Config& cfg = model.config();
  const Pi05Dims& d = model.dims();
  const int64_t L = cfg.tokenizer_max_length;
  const int64_t P = int64_t(cfg.cameras.size()) * model.image_tokens() + L;

  std::vector<StageGraph> stages;
  {
    VLAC_ASSIGN_OR_RETURN(Pi05Graph g, model.build_vision());
    stages.push_back({"vision", std::move(g)});
  }
  {
    VLAC_ASSIGN_OR_RETURN(Pi05Graph g, model.build_text_embed(L));
    stages.push_back({"text", std::move(g)});
  }
  {
    VLAC_ASSIGN_OR_RETURN(Pi05Graph g, model.build_lm(P));
    stages.push_back({"lm", std::move(g)});
  }
  {
    VLAC_ASSIGN_OR_RETURN(Pi05Graph g, model.build_step(P));
    stages.push_back({"step", std::move(g)});
  }

  const bool bf16 = opt.bf16;
  auto packed_bytes = [&](const ir::WeightRef& r) {
    return uint64_t(ir::ValueInfo{Pi05Model::run_dtype(r, bf16), r.shape}.numel()) *
           dtype_size(Pi05Model::run_dtype(r, bf16));
  };
  partition::Options popt;
  popt.engine_cap = opt.engine_cap;

  // Engine folder: the caller's, or a temporary one beside OUT (same filesystem as the package,
  // never /tmp, which may be RAM).
  std::string dir = opt.engine_dir;
  bool own_dir = false;
  if (dir.empty()) {
    remove_stale_engine_dirs(parent_dir(opt.out), opt.log);
    dir = parent_dir(opt.out) + "/.vlac-engines-" + std::to_string(::getpid());
    own_dir = true;
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_error("compile: cannot create " + dir, errno);
  if (!is_dir(dir)) return invalid_argument("compile: --engine-dir " + dir + " is not a folder");
  DirGuard guard(dir, own_dir);

  std::vector<WeightFileView> files;
  for (const auto& f : model.tensors().files()) files.push_back({f->map().data(), f->map().size(), f->path(), &f->map()});
  FileWeightSource source(std::move(files));

  Pi05CompileSummary sum;
  PackageManifest manifest;
  PackageWriterOptions wopt;
  PackageWriter writer(opt.out, wopt);
  json stage_engines = json::object();
  for (StageGraph& st : stages) {
    const ir::Graph& g = st.graph.graph;
    std::map<ir::ValueId, std::string> named;
    for (const auto& [n, v] : st.graph.outputs) named[v] = n;
    // The backend must run every node the stage schedules (the partitioner keeps one backend).
    VLAC_ASSIGN_OR_RETURN(std::vector<ir::NodeId> order, ir::schedule(g));
    for (ir::NodeId id : order)
      if (!compiler->supports(g, id))
        return unsupported("compile: backend '" + opt.backend + "' cannot run node '" + g.node(id).name + "' (" +
                           ir::op_name(g.node(id).op) + ") of stage " + st.name);
    VLAC_ASSIGN_OR_RETURN(partition::Plan plan, partition::partition_graph(g, st.name, packed_bytes, popt));
    sum.plan_text += partition::plan_summary(g, plan, named);
    // Where each weight of this stage is stored: engine segment + offset.
    std::map<ir::WeightId, std::pair<std::string, BlobWeight>> home;
    json names = json::array();
    for (size_t ei = 0; ei < plan.engines.size(); ++ei) {
      const partition::EnginePlan& ep = plan.engines[ei];
      stage_hook("engine:" + ep.name);
      std::vector<StoredWeight> store;
      for (ir::WeightId w : ep.owned) {
        const ir::WeightRef& r = g.weights()[size_t(w)];
        store.push_back({r, Pi05Model::run_dtype(r, bf16)});
        sum.source_weight_bytes += r.bytes;
      }
      const std::string seg = "engine/" + ep.name;
      guard.track(dir + "/" + ep.name + ".engine");
      VLAC_ASSIGN_OR_RETURN(ir::Graph sub, partition::extract_engine(g, plan, ei, named));
      VLAC_ASSIGN_OR_RETURN(Subgraph subgraph, whole_graph(sub));
      CompileOptions copt;
      copt.engine_dir = dir;
      copt.engine_name = ep.name;
      VLAC_ASSIGN_OR_RETURN(EngineBlob ef, compiler->compile(subgraph, store, source, copt));
      guard.track(ef.path);
      for (size_t i = 0; i < ep.owned.size(); ++i) home[ep.owned[i]] = {seg, ef.weights[i]};
      VLAC_RETURN_IF_ERROR(writer.add_file(seg, package::SegmentKind::Engine, ef.path));

      PackageEngine pe;
      pe.name = ep.name;
      pe.segment = seg;
      pe.backend = ef.backend;
      for (ir::ValueId v : sub.inputs())
        pe.inputs.push_back({ir::input_name(sub, v), sub.info(v).dtype, sub.info(v).shape});
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
      pe.extra = json::object({{"stage", st.name},
                               {"program", ir::graph_to_json(sub)},
                               {"weights", std::move(wt)},
                               {"weight_bytes", ep.weight_bytes},
                               {"over_cap", ep.over_cap},
                               {"last_use", std::move(frees)}});
      if (ep.over_cap) pe.extra["over_cap_node"] = ep.over_cap_node;
      manifest.engines.push_back(std::move(pe));
      names.push_back(ep.name);

      Pi05CompileSummary::Engine se;
      se.name = ep.name;
      se.stage = st.name;
      se.weight_bytes = ep.weight_bytes;
      se.file_bytes = ef.bytes;
      se.weights_stored = int(ep.owned.size());
      se.weights_read = int(ep.weights.size());
      se.over_cap = ep.over_cap;
      se.over_cap_node = ep.over_cap_node;
      for (ir::ValueId v : ep.inputs)
        if (g.node(g.value(v).producer).op != ir::OpKind::Input) se.crossing_in_bytes += g.info(v).bytes();
      sum.packed_weight_bytes += ef.bytes;
      log("  engine " + ep.name + ": " + std::to_string(ep.owned.size()) + " weights, " + format_bytes(ef.bytes) +
          (ep.over_cap ? " (over the cap: '" + ep.over_cap_node + "' alone is larger)" : ""));
      sum.engines.push_back(std::move(se));
    }
    for (const partition::Crossing& c : plan.crossings) {
      PackageCrossing pc;
      pc.name = partition::boundary_name(g, c.value, named);
      pc.dtype = g.info(c.value).dtype;
      pc.shape = g.info(c.value).shape;
      pc.bytes = c.bytes;
      pc.producer = plan.engines[size_t(c.producer)].name;
      for (int e : c.consumers) pc.consumers.push_back(plan.engines[size_t(e)].name);
      sum.crossing_bytes += c.bytes;
      manifest.crossing.push_back(std::move(pc));
    }
    stage_engines[st.name] = std::move(names);
  }

  // Side files (processor configs, stats, tokenizer) and config.json, verbatim.
  json side = json::array();
  std::vector<std::string> side_files = pi05_side_files(policy_dir);
  side_files.insert(side_files.begin(), "config.json");
  for (const std::string& f : side_files) {
    package::SegmentKind kind = package::SegmentKind::Config;
    if (f.rfind("tokenizer/", 0) == 0) kind = package::SegmentKind::Tokenizer;
    else if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors") kind = package::SegmentKind::Stats;
    VLAC_RETURN_IF_ERROR(writer.add_file("policy/" + f, kind, policy_dir + "/" + f));
    side.push_back(f);
    if (kind == package::SegmentKind::Stats && !manifest.normalization_segment) manifest.normalization_segment = "policy/" + f;
    if (f == "tokenizer/tokenizer.model") manifest.tokenizer_segment = "policy/" + f;
  }
  if (manifest.normalization_segment) manifest.normalization = json::object({{"segment", *manifest.normalization_segment}});
  if (manifest.tokenizer_segment) manifest.tokenizer = json::object({{"segment", *manifest.tokenizer_segment}});

  json cams = cfg.cameras;
  manifest.policy = json::object({
      {"type", "pi05"},
      {"dtype", bf16 ? "bf16" : "fp32"},
      {"files", std::move(side)},
      {"stages", std::move(stage_engines)},
      {"cameras", std::move(cams)},
      {"chunk_size", cfg.chunk_size},
      {"max_action_dim", d.max_action_dim},
      {"num_inference_steps", cfg.num_inference_steps},
      {"tokenizer_max_length", L},
      {"image_tokens", model.image_tokens()},
      {"image_size", d.image_size},
      {"channels", d.channels},
      {"lm_width", d.lm_width},
      {"lm_depth", d.lm_depth},
      {"head_dim", d.head_dim},
      {"vocab", d.vocab},
      {"engine_cap", opt.engine_cap},
  });
  manifest.metadata = json::object({{"producer", "vlac compile"}});
  writer.set_manifest(std::move(manifest));
  stage_hook("package");
  log("  packaging " + std::to_string(writer.segment_count()) + " segments into " + opt.out);
  VLAC_ASSIGN_OR_RETURN(PackageWriteSummary ws, writer.finish());
  sum.package_bytes = ws.file_size;
  if (!opt.keep_engine_files || own_dir) guard.cleanup();
  else guard.release();
  compiler->release_memory();
  return sum;
}

}  // namespace vlac
