// Package engines (see package_engines.h). Engines share one activation arena (they run one
// after another); values crossing engines and stages are copied into buffers owned here.
#include "runtime/package_engines.h"

#include <algorithm>
#include <cstring>

#include "backends/registry.h"
#include "core/quant.h"
#include "exec/memo_plan.h"
#include "ir/serialize.h"
#include "ir/walk.h"

namespace vlac {

using nlohmann::json;

struct PackageEngines::Engine {
  std::string name, stage;
  ir::Graph program;                       // as packaged (compile-time shapes)
  std::vector<std::string> output_names;   // manifest names of program outputs, in order
  std::vector<std::string> store_keys;     // by output: its buffer in store_ (assign_store_keys)
  std::vector<ir::WeightRef> refs;         // file_id = index into `segments`, offset within it
  std::vector<DType> run;                  // = stored dtype
  std::vector<bool> gather_only;           // by ref: only gathered from (an embedding table)
  std::vector<bool> on_demand;             // by ref: only the memo reads it (exec::memo_only_weights)
  std::vector<const PackageSegment*> segments;
  uint64_t budget_bytes = 0;               // weight bytes a run touches (gathered tables: 0)
  bool resident = false;
  Backend* backend = nullptr;              // from the registry, by the manifest's name
  std::unique_ptr<BoundWeights> weights;
  std::unique_ptr<Executable> exec;
  std::map<std::string, std::vector<int64_t>> planned;  // input shapes exec was planned for
};

PackageEngines::PackageEngines() = default;
PackageEngines::PackageEngines(PackageEngines&&) noexcept = default;
PackageEngines& PackageEngines::operator=(PackageEngines&&) noexcept = default;
PackageEngines::~PackageEngines() = default;

Result<PackageEngines> PackageEngines::open(const Package& pkg, PackageRunOptions options,
                                            const BackendRegistry* registry) {
  if (options.pack_weights && options.mem_budget > 0)
    return invalid_argument("packed weights are copies held by each engine and cannot be evicted: use either a "
                            "memory budget or packed weights, not both");
  const BackendRegistry& reg = registry ? *registry : backend_registry();
  PackageEngines pe_out;
  pe_out.pkg_ = &pkg;
  pe_out.options_ = std::move(options);
  const std::string& where = pkg.path();
  // Engines: programs and weight tables (bytes stay untouched until first use).
  for (const PackageEngine& pe : pkg.manifest().engines) {
    auto e = std::make_unique<Engine>();
    e->name = pe.name;
    const std::string ew = where + ": engine '" + pe.name + "'";
    VLAC_ASSIGN_OR_RETURN(e->backend, reg.get(pe_out.options_.backend.empty() ? pe.backend : pe_out.options_.backend, ew));
    const json& x = pe.extra;
    if (!x.contains("stage") || !x["stage"].is_string() || !x.contains("program") || !x.contains("weights") ||
        !x["weights"].is_array())
      return invalid_format(ew + ": needs stage, program and weights");
    e->stage = x["stage"].get<std::string>();
    VLAC_ASSIGN_OR_RETURN(e->program, ir::graph_from_json(x["program"], ew));
    if (e->program.outputs().size() != pe.outputs.size() || e->program.inputs().size() != pe.inputs.size())
      return invalid_format(ew + ": program inputs/outputs differ from the manifest's");
    for (const auto& o : pe.outputs) e->output_names.push_back(o.name);
    for (const json& w : x["weights"]) {
      if (!w.is_object() || !w.contains("name") || !w["name"].is_string() || !w.contains("dtype") ||
          !w["dtype"].is_string() || !w.contains("segment") || !w["segment"].is_string() || !w.contains("offset") ||
          !w["offset"].is_number_unsigned() || !w.contains("shape") || !w["shape"].is_array())
        return invalid_format(ew + ": a weight record needs name, dtype, shape, segment, offset");
      ir::WeightRef r;
      r.name = w["name"].get<std::string>();
      auto dt = dtype_from_name(w["dtype"].get<std::string>());
      if (!dt || (*dt != DType::F32 && *dt != DType::BF16 && !is_quant_dtype(*dt)))
        return invalid_format(ew + ": weight '" + r.name + "' has a dtype the runtime does not bind (F32, BF16, I8, F8_E4M3)");
      r.dtype = *dt;
      for (const json& s : w["shape"]) {
        if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > (int64_t(1) << 40))
          return invalid_format(ew + ": weight '" + r.name + "' has a bad shape");
        r.shape.push_back(s.get<int64_t>());
      }
      if (r.shape.size() > 8) return invalid_format(ew + ": weight '" + r.name + "' has a bad shape");
      if (is_quant_dtype(r.dtype) && r.shape.size() != 2)
        return invalid_format(ew + ": weight '" + r.name + "' is " + dtype_name(r.dtype) + " but not a matrix");
      r.bytes = stored_weight_bytes(r.dtype, r.shape);
      r.offset = w["offset"].get<uint64_t>();
      const PackageSegment* seg = pkg.find(w["segment"].get<std::string>());
      if (!seg || seg->kind != package::SegmentKind::Engine)
        return invalid_format(ew + ": weight '" + r.name + "' names no engine segment");
      uint64_t end = 0;
      if (__builtin_add_overflow(r.offset, r.bytes, &end) || end > seg->size)
        return invalid_format(ew + ": weight '" + r.name + "' lies outside segment '" + seg->name + "'");
      auto it = std::find(e->segments.begin(), e->segments.end(), seg);
      r.file_id = uint32_t(it - e->segments.begin());
      if (it == e->segments.end()) e->segments.push_back(seg);
      e->refs.push_back(r);
      e->run.push_back(r.dtype);
    }
    // Budget accounting: a weight only gathered from (embedding table) costs its looked-up rows.
    const ir::Graph& g = e->program;
    const ir::UseLists uses = ir::build_use_lists(g);
    std::map<std::string, uint64_t> stored_bytes;
    std::map<std::string, bool> gathered;
    for (const auto& r : e->refs) stored_bytes[r.name] = r.bytes;
    for (const ir::Node& n : g.nodes()) {
      if (n.op != ir::OpKind::Weight) continue;
      const ir::ValueId v = n.outputs[0];
      bool gather_only = true;
      for (int64_t u = uses.offsets[size_t(v)]; u < uses.offsets[size_t(v) + 1]; ++u)
        if (g.node(uses.node_ids[size_t(u)]).op != ir::OpKind::Embedding) gather_only = false;
      const std::string& wname = g.weights()[size_t(n.weight)].name;
      auto it = stored_bytes.find(wname);
      if (!gather_only && it != stored_bytes.end()) e->budget_bytes += it->second;
      auto [gi, fresh] = gathered.emplace(wname, gather_only);
      if (!fresh) gi->second = gi->second && gather_only;
    }
    for (const auto& r : e->refs) {
      auto gi = gathered.find(r.name);
      e->gather_only.push_back(gi != gathered.end() && gi->second);
    }
    // Weights only the memo reads (pi0.5's time conditioning): a GPU backend may leave them in
    // the package and read them at a memo miss (WeightBinding::on_demand).
    if (pe_out.options_.memo_slots > 0) {
      const std::vector<std::string> memo_only = exec::memo_only_weights(g, pe_out.options_.memo_inputs);
      for (const auto& r : e->refs)
        e->on_demand.push_back(std::find(memo_only.begin(), memo_only.end(), r.name) != memo_only.end());
    }
    if (!pe_out.stage_engines_.count(e->stage)) pe_out.stage_order_.push_back(e->stage);
    pe_out.stage_engines_[e->stage].push_back(pe_out.engines_.size());
    pe_out.engines_.push_back(std::move(e));
  }
  pe_out.assign_store_keys(pkg.manifest().engines);
  if (pe_out.engines_.empty()) {
    VLAC_ASSIGN_OR_RETURN(pe_out.backend0_,
                          reg.get(pe_out.options_.backend.empty() ? std::string(kDefaultBackend) : pe_out.options_.backend,
                                  where));
  } else {
    pe_out.backend0_ = pe_out.engines_.front()->backend;
  }
  pe_out.rt_ = &pe_out.backend0_->runtime();
  return pe_out;
}

// Outputs of an engine cross into buffers owned here, which stay put (recorded chunks point at
// them). An internal value ('%' names: no caller reads it) whose readers all come later in its own
// stage lives from its producer's run to its last reader's; two such values of one stage, dtype
// and shape whose lives do not overlap share one buffer. A reader's kernels are done with an input
// before the outputs of its run are copied (stream order), so a value may take the buffer of one
// its producer reads last. The LM chain's 16 hidden states of [P, 2048] fp32 (127 MB at 968
// tokens) take 2 buffers; stages run their engines in this order on every pass, so the lives
// repeat the same way when a stage runs again (the 10 steps).
void PackageEngines::assign_store_keys(const std::vector<PackageEngine>& manifest) {
  struct Slot {
    std::string cls;
    size_t free_from = 0;  // engine index from which it may take a new value
  };
  std::vector<Slot> slots;
  for (size_t i = 0; i < engines_.size(); ++i) {
    Engine& e = *engines_[i];
    e.store_keys.clear();
    for (size_t o = 0; o < e.output_names.size(); ++o) {
      const std::string& name = e.output_names[o];
      std::string key = e.stage + "/" + name;
      size_t last = 0;
      bool shareable = !name.empty() && name[0] == '%';
      for (size_t j = 0; j < engines_.size() && shareable; ++j) {
        bool reads = false;
        for (const PackageTensor& t : manifest[j].inputs) reads = reads || t.name == name;
        if (!reads) continue;
        if (j <= i || engines_[j]->stage != e.stage) shareable = false;
        last = std::max(last, j);
      }
      if (shareable && last > i) {
        const PackageTensor& t = manifest[i].outputs[o];
        std::string cls = e.stage + "/" + dtype_name(t.dtype);
        for (int64_t d : t.shape) {
          cls += ",";
          cls += std::to_string(d);
        }
        size_t s = 0;
        while (s < slots.size() && (slots[s].cls != cls || slots[s].free_from > i)) ++s;
        if (s == slots.size()) slots.push_back(Slot{cls, 0});
        slots[s].free_from = last;
        key = "shared/";  // appends: GCC 12 warns falsely (-Wrestrict) on "lit" + std::string&&
        key += std::to_string(s);
        key += "/";
        key += cls;
      }
      e.store_keys.push_back(std::move(key));
    }
  }
}

std::string PackageEngines::device_description() const { return backend0_->device().description; }

std::optional<ir::ValueInfo> PackageEngines::input_info(const std::string& stage, const std::string& name) const {
  auto st = stage_engines_.find(stage);
  if (st == stage_engines_.end()) return std::nullopt;
  for (size_t id : st->second) {
    const ir::Graph& g = engines_[id]->program;
    for (ir::ValueId v : g.inputs())
      if (ir::input_name(g, v) == name) return g.info(v);
  }
  return std::nullopt;
}

bool PackageEngines::has_stage(const std::string& stage) const {
  auto it = stage_engines_.find(stage);
  return it != stage_engines_.end() && !it->second.empty();
}

void PackageEngines::make_room(const Engine& next) {
  if (options_.mem_budget == 0) return;
  const uint64_t overhead = stats_.activation_bytes + (64ull << 20);
  const uint64_t limit = options_.mem_budget > overhead ? options_.mem_budget - overhead : 0;
  for (size_t i = 0; i < lru_.size() && resident_ + (next.resident ? 0 : next.budget_bytes) > limit;) {
    Engine& e = *engines_[lru_[i]];
    if (&e == &next) {
      ++i;
      continue;
    }
    for (const PackageSegment* s : e.segments) pkg_->drop(*s);
    resident_ -= std::min(resident_, e.budget_bytes);
    e.resident = false;
    ++stats_.evictions;
    stats_.evicted_bytes += e.budget_bytes;
    lru_.erase(lru_.begin() + std::ptrdiff_t(i));
  }
}

Status PackageEngines::prepare(Engine& e, const std::map<std::string, PackageValue>& values) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (ir::ValueId v : e.program.inputs()) {
    const std::string name = ir::input_name(e.program, v);
    auto it = values.find(name);
    if (it == values.end())
      return invalid_format(pkg_->path() + ": engine '" + e.name + "' reads '" + name + "', which no earlier engine makes");
    if (it->second.info.dtype != e.program.info(v).dtype)
      return invalid_format(pkg_->path() + ": engine '" + e.name + "': '" + name + "' has the wrong dtype");
    shapes[name] = it->second.info.shape;
  }
  if (e.exec && shapes == e.planned) return Status::ok();
  if (!e.weights) {
    // First use: check the bytes of every segment it reads, then bind the weights in place.
    for (const PackageSegment* s : e.segments) VLAC_RETURN_IF_ERROR(pkg_->verify(*s));
    const bool copies = e.backend->runtime().memory_kind() != MemoryKind::Host;
    WeightBinding wb;
    wb.refs = e.refs;
    wb.run_dtypes = e.run;
    wb.gather_only = e.gather_only;
    wb.on_demand = e.on_demand;
    for (const PackageSegment* s : e.segments) {
      auto span = pkg_->data(*s);
      WeightFileView v{span.data(), span.size(), pkg_->path() + ": segment '" + s->name + "'", nullptr};
      // A backend that copies the weights (a GPU) gives each chunk's pages back as it goes, so
      // an engine's upload never holds its whole segment (the release after the bind is for
      // everything else it touched, e.g. the checksum's reads), and reads gathered rows of a
      // table it keeps on the host from the file (fd), mapping nothing.
      if (copies) {
        v.release = [pkg = pkg_, s](uint64_t off, uint64_t n) { pkg->release(*s, off, n); };
        v.fd = pkg_->fd();
        v.file_offset = s->offset;
      }
      wb.files.push_back(std::move(v));
    }
    VLAC_ASSIGN_OR_RETURN(e.weights, e.backend->runtime().bind_weights(wb));
    // A backend that copied the weights into its own memory (a GPU) reads the segments no more,
    // except gathered rows of a table it keeps mapped: the pages leave this process (memory rule 6).
    if (e.backend->runtime().memory_kind() != MemoryKind::Host)
      for (const PackageSegment* s : e.segments) pkg_->release(*s);
  }
  VLAC_ASSIGN_OR_RETURN(ir::Graph g, ir::respecialize(e.program, shapes));
  ExecOptions eo;
  eo.label = e.name;
  eo.threads = options_.threads;
  eo.shared_memory = true;
  eo.pack_weights = options_.pack_weights;
  eo.bf16_mqa_attention = options_.bf16_mqa_attention;
  eo.fast_vision = options_.fast_vision && e.stage == "vision";
  eo.fp8_activations = options_.fp8_activations;
  eo.memo_inputs = options_.memo_inputs;
  eo.memo_slots = options_.memo_slots;
  eo.stable_inputs = options_.stable_inputs;
  e.exec.reset();
  VLAC_ASSIGN_OR_RETURN(e.exec, e.backend->runtime().plan(std::move(g), *e.weights, eo));
  // The executable now holds packed copies of its weights: give the mapped pages back (they
  // stay in the page cache; the few in-place weights left, norms and biases, fault in again on
  // use), so packing trades the mapping for the copy instead of holding both.
  if (options_.pack_weights)
    for (const PackageSegment* s : e.segments) pkg_->release(*s);
  stats_.packed_weight_bytes = 0;
  for (const auto& other : engines_)
    if (other->exec) stats_.packed_weight_bytes += other->exec->memory().packed_bytes;
  e.planned = std::move(shapes);
  ++stats_.engines_loaded;
  return Status::ok();
}

Status PackageEngines::run_stage(const std::string& stage, std::map<std::string, PackageValue>* values,
                                 bool mark_outputs) {
  auto st = stage_engines_.find(stage);
  if (st == stage_engines_.end()) return invalid_format(pkg_->path() + ": no engine of stage '" + stage + "'");
  for (size_t id : st->second) {
    Engine& e = *engines_[id];
    VLAC_RETURN_IF_ERROR(prepare(e, *values));
    // One arena and scratch shared by all engines of a backend (grown only when a new plan needs
    // more), in the memory kind the plan asks for; a stage that may run beside the others has its own.
    const MemoryPlan mp = e.exec->memory();
    BackendRuntime& rt = e.backend->runtime();
    const auto& own = options_.own_memory_stages;
    const bool apart = rt.lanes() > 1 && std::find(own.begin(), own.end(), stage) != own.end();
    Shared& sh = shared_[{&rt, apart ? stage : std::string()}];
    if (!sh.arena || mp.arena_bytes > sh.arena->bytes() || mp.scratch_bytes > sh.scratch->bytes()) {
      const uint64_t ab = std::max<uint64_t>(mp.arena_bytes, sh.arena ? sh.arena->bytes() : 0);
      const uint64_t sb = std::max<uint64_t>(mp.scratch_bytes, sh.scratch ? sh.scratch->bytes() : 0);
      sh.arena.reset();
      sh.scratch.reset();
      VLAC_ASSIGN_OR_RETURN(sh.arena, rt.allocate(ab, mp.kind, pkg_->path() + ": the activation arena (engine '" + e.name + "')"));
      VLAC_ASSIGN_OR_RETURN(sh.scratch, rt.allocate(sb, mp.kind, pkg_->path() + ": the kernel scratch (engine '" + e.name + "')"));
    }
    e.exec->bind_memory(sh.arena->data(), sh.scratch->data());
    if (auto mk = memo_keys_.find(stage); mk != memo_keys_.end()) e.exec->set_memo_key(mk->second.data(), mk->second.size());
    const auto& ins = e.exec->graph().inputs();
    const MemoryKind kind = e.exec->memory_kind();
    for (size_t i = 0; i < ins.size(); ++i) {
      const PackageValue& pv = values->at(ir::input_name(e.exec->graph(), ins[i]));
      e.exec->wait_input(int(i), pv.kind == kind ? pv.mark : -1);
      if (pv.kind == kind) {
        e.exec->bind_input(int(i), pv.data);
      } else if (pv.kind == MemoryKind::Host) {  // e.g. host inputs of a GPU engine: uploaded
        VLAC_RETURN_IF_ERROR(e.exec->write_input(int(i), pv.data, pv.info.bytes()));
      } else {
        return unsupported(pkg_->path() + ": engine '" + e.name + "' (" + memory_kind_name(kind) + " memory) reads '" +
                           ir::input_name(e.exec->graph(), ins[i]) + "' from " + memory_kind_name(pv.kind) +
                           " memory: engines of one package must share a memory kind");
      }
    }
    uint64_t act = 0;
    for (const auto& [r, b] : shared_) act += b.arena->bytes() + b.scratch->bytes();
    for (const auto& [n, b] : store_) act += b->bytes();
    for (const auto& other : engines_)
      if (other->exec) act += other->exec->memory().memo_bytes;  // e.g. pi0.5's time-only results
    stats_.activation_bytes = act;
    make_room(e);
    VLAC_RETURN_IF_ERROR(e.exec->run());
    if (!e.resident) {
      e.resident = true;
      resident_ += e.budget_bytes;
    }
    lru_.erase(std::remove(lru_.begin(), lru_.end(), id), lru_.end());
    lru_.push_back(id);
    stats_.peak_resident_weight_bytes = std::max(stats_.peak_resident_weight_bytes, resident_);
    // Outputs leave the shared arena: copy them into buffers owned here.
    const auto& outs = e.exec->graph().outputs();
    for (size_t i = 0; i < outs.size(); ++i) {
      const ir::ValueInfo& info = e.exec->graph().info(outs[i]);
      std::unique_ptr<BackendBuffer>& buf = store_[e.store_keys[i]];
      if (!buf || buf->bytes() != info.bytes() || buf->kind() != kind) {
        buf.reset();
        VLAC_ASSIGN_OR_RETURN(buf, rt.allocate(info.bytes(), kind, pkg_->path() + ": output '" + e.output_names[i] +
                                                                         "' of engine '" + e.name + "'"));
      }
      VLAC_RETURN_IF_ERROR(rt.copy(buf->data(), e.exec->data(outs[i]), info.bytes()));
      (*values)[e.output_names[i]] = PackageValue{buf->data(), info, kind};
    }
    if (mark_outputs) {
      VLAC_ASSIGN_OR_RETURN(const int m, rt.mark());
      for (const std::string& name : e.output_names) (*values)[name].mark = m;
    }
  }
  return Status::ok();
}

void PackageEngines::inputs_changed(const std::string& stage) {
  auto st = stage_engines_.find(stage);
  if (st == stage_engines_.end()) return;
  for (size_t id : st->second)
    if (engines_[id]->exec) engines_[id]->exec->inputs_changed();
}

void PackageEngines::set_memo_key(const std::string& stage, const void* key, uint64_t bytes) {
  std::vector<uint8_t>& k = memo_keys_[stage];
  k.assign(static_cast<const uint8_t*>(key), static_cast<const uint8_t*>(key) + bytes);
}

void PackageEngines::release_stage(const std::string& stage) {
  auto st = stage_engines_.find(stage);
  if (st == stage_engines_.end()) return;
  for (size_t id : st->second) {
    Engine& e = *engines_[id];
    if (!e.resident) continue;
    for (const PackageSegment* s : e.segments) pkg_->release(*s);
    e.resident = false;
    resident_ -= std::min(resident_, e.budget_bytes);
    lru_.erase(std::remove(lru_.begin(), lru_.end(), id), lru_.end());
  }
}

}  // namespace vlac
