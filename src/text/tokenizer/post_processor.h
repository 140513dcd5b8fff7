// Post-processors of tokenizer.json: TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing,
// Sequence. They add BOS/EOS-style special tokens around one encoded sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/json.h"

namespace arbor {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Applies the single-sequence template to ids when add_special_tokens is true.
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

// Null json gives nullptr. Throws arbor::Error naming an unknown "type".
std::unique_ptr<PostProcessor> make_post_processor(const json& j);

}  // namespace arbor
