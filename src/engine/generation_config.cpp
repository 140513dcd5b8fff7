// generation_config.json reading.
#include "engine/generation_config.h"

#include <algorithm>

#include "core/error.h"
#include "core/json.h"

namespace arbor {

GenerationDefaults read_generation_defaults(const std::string& model_dir, const ModelConfig& c) {
  GenerationDefaults d;
  for (int64_t e : c.eos_token_ids) d.eos_ids.push_back(int32_t(e));
  const std::string path = model_dir + "/generation_config.json";
  if (!model_dir.empty() && file_exists(path)) {
    json g = read_json_file(path);
    auto num = [&](const char* k, double def) {
      if (!g.contains(k) || g[k].is_null()) return def;
      if (!g[k].is_number()) fail("generation config: {}: '{}' must be a number, got {}", path, k, g[k].dump());
      return g[k].get<double>();
    };
    if (auto it = g.find("eos_token_id"); it != g.end()) {
      if (it->is_number_integer()) d.eos_ids.push_back(it->get<int32_t>());
      if (it->is_array())
        for (const auto& v : *it)
          if (v.is_number_integer()) d.eos_ids.push_back(v.get<int32_t>());
    }
    const bool do_sample = g.value("do_sample", g.contains("temperature"));
    if (do_sample) d.sampling.temperature = float(num("temperature", 1.0));
    d.sampling.top_k = int64_t(num("top_k", 0));
    d.sampling.top_p = float(num("top_p", 1.0));
    d.sampling.min_p = float(num("min_p", 0.0));
  }
  std::sort(d.eos_ids.begin(), d.eos_ids.end());
  d.eos_ids.erase(std::unique(d.eos_ids.begin(), d.eos_ids.end()), d.eos_ids.end());
  return d;
}

}  // namespace arbor
