// vlac._core: the Python extension under vlac.Policy (python/vlac/policy.py). A thin nanobind layer
// over Pi05Session (src/session/): arrays are read in place (no copy) as an ObsSource, the GIL is
// released while the policy runs, and a failed Status becomes one Python exception carrying the
// message `vlac run` prints (BadInputError, a ValueError, for bad input; Error otherwise).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "policy/pi05_policy.h"
#include "session/pi05_session.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void raise(const vlac::Status& st) {
  if (st.is_ok()) return;
  if (st.exit_code() == 2) throw BadInput(st.message());
  throw Failure(st.message());
}

using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

// The safetensors dtype of a numpy/DLPack dtype vlac's observation reader may take.
vlac::DType to_dtype(const std::string& key, nb::dlpack::dtype dt) {
  if (dt == nb::dtype<float>()) return vlac::DType::F32;
  if (dt == nb::dtype<uint8_t>()) return vlac::DType::U8;
  if (dt == nb::dtype<bool>()) return vlac::DType::BOOL;
  if (dt == nb::dtype<int64_t>()) return vlac::DType::I64;
  if (dt == nb::dtype<int32_t>()) return vlac::DType::I32;
  if (dt == nb::dtype<double>()) return vlac::DType::F64;
  throw BadInput("batch: '" + key + "' has an unsupported element type (code " + std::to_string(int(dt.code)) +
                 ", " + std::to_string(int(dt.bits)) + " bits): use float32, uint8, bool, int64 or int32");
}

OutArray to_numpy(std::vector<float> v, size_t rows, size_t cols) {
  auto* heap = new std::vector<float>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return OutArray(heap->data(), {rows, cols}, owner);
}

class Session {
 public:
  Session(const std::string& path, const std::string& device, const std::string& dtype, int threads, uint64_t seed,
          const std::string& tokenizer, bool pack_weights) {
    vlac::Pi05SessionOptions o;
    o.device = device;
    o.dtype = dtype;
    o.threads = threads;
    o.seed = seed;
    o.tokenizer = tokenizer;
    o.pack_weights = pack_weights;
    vlac::Result<std::unique_ptr<vlac::Pi05Session>> r = [&] {
      nb::gil_scoped_release unlocked;
      return vlac::Pi05Session::open(path, o);
    }();
    raise(r.status());
    s_ = std::move(r.value());
  }

  nb::dict info() const {
    const vlac::Pi05SessionInfo& i = s_->info();
    nb::dict d;
    d["path"] = i.path;
    d["kind"] = i.kind;
    d["device"] = i.device;
    d["dtype"] = i.dtype;
    d["chunk_size"] = i.chunk_size;
    d["n_action_steps"] = i.n_action_steps;
    d["max_action_dim"] = i.max_action_dim;
    d["max_state_dim"] = i.max_state_dim;
    d["action_dim"] = i.action_dim;
    d["state_dim"] = i.state_dim;
    d["image_resolution"] = i.image_resolution;
    d["channels"] = i.channels;
    d["num_inference_steps"] = i.num_inference_steps;
    d["cameras"] = i.cameras;
    d["camera_shapes"] = i.camera_shapes;
    d["has_preprocessor"] = i.has_preprocessor;
    d["has_postprocessor"] = i.has_postprocessor;
    d["task_key"] = i.task_key;
    return d;
  }

  // tensors: [(key, array)], C-contiguous CPU arrays (vlac/policy.py prepares them). Returns
  // (action [chunk, action_dim], action_normalized [chunk, max_action_dim], stats dict).
  nb::tuple predict(const std::vector<std::pair<std::string, InArray>>& tensors, const std::string& task,
                    nb::object noise_obj) {
    vlac::ObsSource src;
    src.origin = "batch";
    for (const auto& [key, a] : tensors) {
      vlac::ObsTensor t;
      t.dtype = to_dtype(key, a.dtype());
      for (size_t d = 0; d < a.ndim(); ++d) t.shape.push_back(int64_t(a.shape(d)));
      t.bytes = static_cast<const uint8_t*>(a.data());
      if (!src.tensors.emplace(key, std::move(t)).second) throw BadInput("batch: key '" + key + "' given twice");
    }
    const vlac::Pi05SessionInfo& i = s_->info();
    const float* noise = nullptr;
    nb::ndarray<nb::ro, float, nb::c_contig, nb::device::cpu> na;
    if (!noise_obj.is_none()) {
      if (!nb::try_cast(noise_obj, na))
        throw BadInput("noise: expected a float32 C-contiguous CPU array [chunk_size, max_action_dim]");
      if (na.size() != size_t(i.chunk_size * i.max_action_dim))
        throw BadInput("noise: has " + std::to_string(na.size()) + " values, expected [" + std::to_string(i.chunk_size) +
                       ", " + std::to_string(i.max_action_dim) + "] = " +
                       std::to_string(i.chunk_size * i.max_action_dim));
      noise = na.data();
    }
    vlac::Pi05SessionOutput out;
    vlac::Status st;
    {
      nb::gil_scoped_release unlocked;  // arrays stay alive: the caller's list holds them
      st = s_->predict(src, task, noise, &out);
    }
    raise(st);
    nb::dict stats;
    stats["preprocess_ms"] = out.preprocess_ms;
    stats["prefix_ms"] = out.prefix_ms;
    stats["denoise_ms"] = out.denoise_ms;
    stats["postprocess_ms"] = out.postprocess_ms;
    stats["prompt"] = out.prompt;
    if (out.seeded) stats["seed"] = out.seed;
    const size_t H = size_t(i.chunk_size);
    return nb::make_tuple(to_numpy(std::move(out.action), H, size_t(out.action_dim)),
                          to_numpy(std::move(out.action_normalized), H, size_t(i.max_action_dim)), stats);
  }

 private:
  std::unique_ptr<vlac::Pi05Session> s_;
};

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "vlac's C++ core (pi0.5 policy sessions); use vlac.Policy";
  nb::exception<Failure>(m, "Error", PyExc_RuntimeError);
  nb::exception<BadInput>(m, "BadInputError", PyExc_ValueError);
  m.def(
      "gaussian_noise",
      [](uint64_t seed, size_t rows, size_t cols) {
        return to_numpy(vlac::pi05_gaussian_noise(seed, int64_t(rows * cols)), rows, cols);
      },
      "seed"_a, "rows"_a, "cols"_a, "vlac's noise of a seed as `vlac run --seed` draws it: float32 [rows, cols]");
  nb::class_<Session>(m, "Session")
      .def(nb::init<const std::string&, const std::string&, const std::string&, int, uint64_t, const std::string&,
                    bool>(),
           "path"_a, "device"_a = "auto", "dtype"_a = "", "threads"_a = 2, "seed"_a = 0, "tokenizer"_a = "",
           "pack_weights"_a = false)
      .def("info", &Session::info)
      .def("predict", &Session::predict, "tensors"_a, "task"_a = "", "noise"_a = nb::none());
}
