// A model's generation defaults: generation_config.json (sampling settings, end-of-sequence ids)
// merged with config.json's eos ids. Request fields and flags override these.
#pragma once
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "model/config.h"

namespace arbor {

struct GenerationDefaults {
  SamplingParams sampling;        // temperature 0 unless the file asks to sample (do_sample / temperature)
  std::vector<int32_t> eos_ids;   // sorted, unique
};

// model_dir may be empty (dummy weights): then only config.json's eos ids count.
GenerationDefaults read_generation_defaults(const std::string& model_dir, const ModelConfig& c);

}  // namespace arbor
