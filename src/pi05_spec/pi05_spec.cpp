// pi0.5 spec (see pi05_spec.h): config.json parsing and the Euler times.
#include "pi05_spec/pi05_spec.h"

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "io/json_reader.h"

namespace vlac {

std::string pi05_image_input(const std::string& camera_key) { return "image." + camera_key; }

float Pi05EulerSpec::time(int64_t k) const {
  const double dt_double = -1.0 / double(steps);
  return float(1.0 + double(k) * dt_double);
}

// ---------------------------------------------------------------------------------------------
// config.json

Result<Pi05Config> parse_pi05_config(const std::string& path) {
  VLAC_ASSIGN_OR_RETURN(nlohmann::json c, read_json_file(path));
  (void)c;  // read_json_file checked size, UTF-8 and syntax with file-level messages
  VLAC_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  return parse_pi05_config_text(std::string_view(reinterpret_cast<const char*>(map.data()), map.size()), path);
}

Result<Pi05Config> parse_pi05_config_text(std::string_view text, const std::string& path) {
  nlohmann::json c = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (c.is_discarded()) return invalid_format(path + ": invalid JSON");
  if (!c.is_object()) return invalid_format(path + ": config is not a JSON object");
  Pi05Config cfg;
  if (auto it = c.find("type"); it != c.end() && it->is_string() && it->get<std::string>() != "pi05")
    return unsupported(path + ": policy type '" + it->get<std::string>() + "' is not pi05");
  auto integer = [&](const char* key, int64_t* out, int64_t min) -> Status {
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) return Status::ok();
    if (!it->is_number_integer() || it->get<int64_t>() < min)
      return invalid_format(path + ": '" + key + "' must be an integer >= " + std::to_string(min));
    *out = it->get<int64_t>();
    return Status::ok();
  };
  auto real = [&](const char* key, double* out) -> Status {
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) return Status::ok();
    if (!it->is_number() || !(it->get<double>() > 0))
      return invalid_format(path + ": '" + key + "' must be a positive number");
    *out = it->get<double>();
    return Status::ok();
  };
  VLAC_RETURN_IF_ERROR(integer("chunk_size", &cfg.chunk_size, 1));
  VLAC_RETURN_IF_ERROR(integer("n_action_steps", &cfg.n_action_steps, 1));
  VLAC_RETURN_IF_ERROR(integer("num_inference_steps", &cfg.num_inference_steps, 1));
  VLAC_RETURN_IF_ERROR(integer("max_state_dim", &cfg.max_state_dim, 1));
  VLAC_RETURN_IF_ERROR(integer("max_action_dim", &cfg.max_action_dim, 1));
  VLAC_RETURN_IF_ERROR(integer("tokenizer_max_length", &cfg.tokenizer_max_length, 1));
  VLAC_RETURN_IF_ERROR(integer("empty_cameras", &cfg.empty_cameras, 0));
  VLAC_RETURN_IF_ERROR(integer("vision_num_attention_heads", &cfg.vision_heads, 1));
  VLAC_RETURN_IF_ERROR(real("min_period", &cfg.min_period));
  VLAC_RETURN_IF_ERROR(real("max_period", &cfg.max_period));
  if (cfg.n_action_steps > cfg.chunk_size)
    return invalid_format(path + ": n_action_steps " + std::to_string(cfg.n_action_steps) +
                          " is larger than chunk_size " + std::to_string(cfg.chunk_size));
  if (auto it = c.find("dtype"); it != c.end() && !it->is_null()) {
    if (!it->is_string() || (it->get<std::string>() != "float32" && it->get<std::string>() != "bfloat16"))
      return invalid_format(path + ": 'dtype' must be \"float32\" or \"bfloat16\"");
    cfg.dtype = it->get<std::string>();
  }
  if (auto it = c.find("image_resolution"); it != c.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() ||
        !(*it)[1].is_number_integer() || (*it)[0].get<int64_t>() <= 0)
      return invalid_format(path + ": 'image_resolution' must be a list of two positive integers");
    if ((*it)[0] != (*it)[1]) return unsupported(path + ": 'image_resolution' must be square for pi0.5");
    cfg.image_resolution = (*it)[0].get<int64_t>();
  }
  for (const char* key : {"use_visual_memory", "use_proprioceptive_memory"}) {
    auto it = c.find(key);
    if (it != c.end() && it->is_boolean() && it->get<bool>())
      return unsupported(path + ": '" + key + "' is true; vlac does not implement pi0.5's MEM history features");
  }
  if (auto it = c.find("rtc_config"); it != c.end() && !it->is_null())
    return unsupported(path + ": 'rtc_config' is set; vlac does not implement real-time chunking");
  if (auto it = c.find("output_features"); it != c.end() && it->is_object()) {
    auto a = it->find("action");
    if (a != it->end() && a->is_object()) {
      auto s = a->find("shape");
      if (s != a->end() && s->is_array() && s->size() == 1 && (*s)[0].is_number_integer())
        cfg.action_dim = (*s)[0].get<int64_t>();
    }
  }
  if (cfg.action_dim > cfg.max_action_dim)
    return invalid_format(path + ": action dim " + std::to_string(cfg.action_dim) +
                          " is larger than max_action_dim " + std::to_string(cfg.max_action_dim));
  // Camera order is the order of input_features in the file: parse it again keeping order.
  {
    auto oj = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, false);
    if (oj.is_discarded() || !oj.is_object()) return invalid_format(path + ": invalid JSON");
    auto it = oj.find("input_features");
    if (it != oj.end() && !it->is_null()) {
      if (!it->is_object()) return invalid_format(path + ": 'input_features' must be an object");
      for (auto f = it->begin(); f != it->end(); ++f) {
        if (!f.value().is_object()) return invalid_format(path + ": input feature '" + f.key() + "' must be an object");
        auto t = f.value().find("type");
        if (t != f.value().end() && t->is_string() && t->get<std::string>() == "VISUAL")
          cfg.cameras.push_back(f.key());
      }
    }
  }
  for (int64_t i = 0; i < cfg.empty_cameras; ++i)
    cfg.cameras.push_back("observation.images.empty_camera_" + std::to_string(i));
  if (cfg.cameras.empty())
    return invalid_format(path + ": no VISUAL input feature (pi0.5 needs at least one camera)");
  return cfg;
}

}  // namespace vlac
