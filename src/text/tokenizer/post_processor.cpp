// Post-processor implementations (single sequence only: arbor never encodes sentence pairs).
#include "text/tokenizer/post_processor.h"

#include "core/error.h"

namespace arbor {
namespace {

// TemplateProcessing "single": a list of {"SpecialToken": {"id": name}} and {"Sequence": {"id": "A"}}.
class Template : public PostProcessor {
 public:
  explicit Template(const json& j) {
    const json& specials = j.value("special_tokens", json::object());
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        parts_.push_back({true, {}});
      } else if (item.contains("SpecialToken")) {
        std::string name = item["SpecialToken"].at("id").get<std::string>();
        ARBOR_CHECK(specials.contains(name), "tokenizer: post_processor TemplateProcessing: special token '{}' is not in special_tokens",
                    name);
        parts_.push_back({false, specials[name].at("ids").get<std::vector<int32_t>>()});
      } else {
        fail("tokenizer: post_processor TemplateProcessing: unknown template piece {}", item.dump());
      }
    }
  }
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (auto& p : parts_) {
      if (p.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), p.ids.begin(), p.ids.end());
    }
    ids.swap(out);
  }

 private:
  struct Part {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  std::vector<Part> parts_;
};

// ByteLevel only trims offsets; ids are unchanged.
class NoIds : public PostProcessor {
 public:
  void process(std::vector<int32_t>&, bool) const override {}
};

// BertProcessing / RobertaProcessing: cls A sep, with "cls": [token, id] and "sep": [token, id].
class ClsSep : public PostProcessor {
 public:
  ClsSep(int32_t cls, int32_t sep) : cls_(cls), sep_(sep) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), cls_);
    ids.push_back(sep_);
  }

 private:
  int32_t cls_, sep_;
};

class Sequence : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> items) : items_(std::move(items)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (auto& p : items_) p->process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> items_;
};

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j) {
  if (j.is_null()) return nullptr;
  ARBOR_CHECK(j.is_object() && j.contains("type"), "tokenizer: post_processor: expected an object with a \"type\", got {}",
              j.dump().substr(0, 200));
  std::string type = j["type"].get<std::string>();
  if (type == "TemplateProcessing") return std::make_unique<Template>(j);
  if (type == "ByteLevel") return std::make_unique<NoIds>();
  if (type == "BertProcessing" || type == "RobertaProcessing")
    return std::make_unique<ClsSep>(j.at("cls").at(1).get<int32_t>(), j.at("sep").at(1).get<int32_t>());
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> items;
    for (auto& p : j.at("processors")) items.push_back(make_post_processor(p));
    return std::make_unique<Sequence>(std::move(items));
  }
  fail("tokenizer: post_processor: unknown type '{}' (supported: TemplateProcessing, ByteLevel, BertProcessing, "
       "RobertaProcessing, Sequence)",
       type);
}

}  // namespace arbor
