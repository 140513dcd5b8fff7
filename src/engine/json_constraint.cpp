// Constrained JSON decoding: schema compiler, byte recogniser (JsonPrefixScanner plus schema checks on its
// events), token trie and the per-step mask (a walk of the trie from the current state, pruned at the
// first rejected byte).
#include "engine/json_constraint.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace arbor {
namespace {

uint64_t all_bits(size_t n) { return n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1; }

const char* kinds = "an object, array, string, number, integer, boolean or null";

uint8_t type_bit(const std::string& t) {
  if (t == "object") return JsonSchema::Object;
  if (t == "array") return JsonSchema::Array;
  if (t == "string") return JsonSchema::String;
  if (t == "number") return JsonSchema::Number;
  if (t == "integer") return JsonSchema::Integer;
  if (t == "boolean") return JsonSchema::Boolean;
  if (t == "null") return JsonSchema::Null;
  return 0;
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

// ---------------------------------------------------------------------------------------------------
// JsonSchema

std::shared_ptr<const JsonSchema> JsonSchema::compile(const json& schema) {
  auto s = std::make_shared<JsonSchema>();
  s->add(schema, "", 0);
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::any_of_type(uint8_t types) {
  auto s = std::make_shared<JsonSchema>();
  s->nodes_.emplace_back();
  s->nodes_[0].types = types;
  return s;
}

int JsonSchema::add(const json& s, const std::string& path, int depth) {
  auto sub = [&](const std::string& k) { return path.empty() ? k : path + "." + k; };
  if (depth > kMaxDepth) throw JsonSchemaError(path, fmt::format("nests deeper than {} levels", kMaxDepth));
  const int idx = int(nodes_.size());
  nodes_.emplace_back();
  Node n;
  if (s.is_boolean()) {
    if (!s.get<bool>()) throw JsonSchemaError(path, "is the schema false, which no value satisfies");
    nodes_[size_t(idx)] = std::move(n);
    return idx;
  }
  if (!s.is_object()) throw JsonSchemaError(path, "must be a JSON Schema object");
  if (auto t = s.find("type"); t != s.end()) {
    n.types = 0;
    auto one = [&](const json& v) {
      uint8_t b = v.is_string() ? type_bit(v.get<std::string>()) : 0;
      if (!b) throw JsonSchemaError(sub("type"), fmt::format("must name {} (or be a list of those names)", kinds));
      n.types |= b;
    };
    if (t->is_array()) {
      if (t->empty()) throw JsonSchemaError(sub("type"), "must not be an empty list");
      for (const auto& v : *t) one(v);
    } else {
      one(*t);
    }
  } else if (s.contains("properties")) {
    n.types = Object;
  }
  auto literals = [&](const json& list, const std::string& where) {
    for (const auto& v : list) {
      if (v.is_object() || v.is_array()) throw JsonSchemaError(where, "entries must be strings, numbers, booleans or null");
      n.enum_texts.push_back(v.dump());
    }
  };
  if (auto e = s.find("enum"); e != s.end()) {
    if (!e->is_array() || e->empty() || e->size() > 64) throw JsonSchemaError(sub("enum"), "must be a list of 1 to 64 values");
    literals(*e, sub("enum"));
  }
  if (auto c = s.find("const"); c != s.end()) {
    if (!n.enum_texts.empty()) throw JsonSchemaError(sub("const"), "cannot be combined with enum");
    literals(json::array({*c}), sub("const"));
  }
  if (!n.enum_texts.empty()) n.types = AnyType;  // the literals decide
  if (auto p = s.find("properties"); p != s.end()) {
    if (!p->is_object()) throw JsonSchemaError(sub("properties"), "must be an object mapping names to schemas");
    if (p->size() > size_t(kMaxProperties))
      throw JsonSchemaError(sub("properties"), fmt::format("has {} entries; at most {} are supported", p->size(), kMaxProperties));
    for (auto it = p->begin(); it != p->end(); ++it) {
      std::string quoted = json(it.key()).dump();
      n.keys.push_back(quoted.substr(1, quoted.size() - 2));
      n.key_nodes.push_back(add(it.value(), sub("properties") + "." + it.key(), depth + 1));
    }
  }
  if (auto r = s.find("required"); r != s.end()) {
    if (!r->is_array()) throw JsonSchemaError(sub("required"), "must be a list of property names");
    for (const auto& k : *r) {
      if (!k.is_string()) throw JsonSchemaError(sub("required"), "must be a list of property names");
      std::string quoted = k.dump();
      auto it = std::find(n.keys.begin(), n.keys.end(), quoted.substr(1, quoted.size() - 2));
      if (it == n.keys.end())
        throw JsonSchemaError(sub("required"), fmt::format("names '{}', which is not in properties", k.get<std::string>().substr(0, 60)));
      n.required |= uint64_t(1) << (it - n.keys.begin());
    }
  }
  if (auto a = s.find("additionalProperties"); a != s.end()) {
    if (a->is_boolean()) n.closed = !a->get<bool>();
    else if (a->is_object()) n.extra = add(*a, sub("additionalProperties"), depth + 1);
    else throw JsonSchemaError(sub("additionalProperties"), "must be a boolean or a schema object");
  }
  if (auto i = s.find("items"); i != s.end()) {
    if (!i->is_object() && !i->is_boolean()) throw JsonSchemaError(sub("items"), "must be a schema object");
    n.items = add(*i, sub("items"), depth + 1);
  }
  nodes_[size_t(idx)] = std::move(n);
  return idx;
}

// ---------------------------------------------------------------------------------------------------
// JsonRecognizer

JsonRecognizer::JsonRecognizer(const JsonSchema* schema) : schema_(schema) {}

const std::vector<std::string>& JsonRecognizer::cands() const {
  const JsonSchema::Node& n = schema_->node(track_node_);
  return track_ == Track::Key ? n.keys : n.enum_texts;
}

bool JsonRecognizer::filter(char c) {
  if (track_node_ < 0) return false;
  const auto& v = cands();
  uint64_t keep = 0;
  for (uint64_t m = cand_; m; m &= m - 1) {
    const int i = __builtin_ctzll(m);
    if (tpos_ < v[size_t(i)].size() && v[size_t(i)][tpos_] == c) keep |= uint64_t(1) << i;
  }
  cand_ = keep;
  ++tpos_;
  return keep != 0;
}

bool JsonRecognizer::exact() const {
  if (track_node_ < 0) return false;
  const auto& v = cands();
  for (uint64_t m = cand_; m; m &= m - 1)
    if (v[size_t(__builtin_ctzll(m))].size() == tpos_) return true;
  return false;
}

bool JsonRecognizer::on_value_begin(char c, bool& fed) {
  const int nd = stack_.empty() ? 0 : stack_.back().value_node;
  const JsonSchema::Node* n = nd >= 0 ? &schema_->node(nd) : nullptr;
  const uint8_t t = c == '{' ? JsonSchema::Object : c == '[' ? JsonSchema::Array : c == '"' ? JsonSchema::String
                  : c == 't' || c == 'f' ? JsonSchema::Boolean : c == 'n' ? JsonSchema::Null : JsonSchema::Number;
  if (n) {
    if (!n->enum_texts.empty()) {
      if (t == JsonSchema::Object || t == JsonSchema::Array) return false;
      track_ = Track::Enum, track_node_ = nd, cand_ = all_bits(n->enum_texts.size()), tpos_ = 0;
      fed = true;
      if (!filter(c)) return false;
    } else if (t == JsonSchema::Number) {
      if (!(n->types & (JsonSchema::Number | JsonSchema::Integer))) return false;
      int_only_ = !(n->types & JsonSchema::Number);
    } else if (!(n->types & t)) {
      return false;
    }
  }
  if (t == JsonSchema::Object) stack_.push_back({nd, true, 0, -1});
  if (t == JsonSchema::Array) stack_.push_back({nd, false, 0, n ? n->items : -1});
  return true;
}

int JsonRecognizer::feed_byte(char c, std::vector<JsonPrefixScanner::Event>& ev) {
  const size_t pos = pos_;
  const bool was_str = sc_.in_string();
  const bool ws = !was_str && is_ws(c);
  if (ws && ws_run_ >= kMaxWhitespaceRun) return 0;
  if (int_only_ && (c == '.' || c == 'e' || c == 'E')) return 0;  // int_only_ is set only while a number is open
  ev.clear();
  if (!sc_.step(c, pos, ev)) return 0;
  ++pos_;
  ws_run_ = ws ? ws_run_ + 1 : 0;

  if (track_ == Track::Key) {  // inside an object key
    if (ev.empty()) {
      if (track_node_ >= 0) {
        filter(c);
        if (cand_ == 0 && schema_->node(track_node_).closed) return -1;
      }
      return 1;
    }
    // The closing quote (a Key event).
    track_ = Track::None;
    Frame& f = stack_.back();
    if (track_node_ < 0) {
      f.value_node = -1;
      return 1;
    }
    const JsonSchema::Node& n = schema_->node(track_node_);
    int m = -1;
    for (uint64_t b = cand_; b; b &= b - 1)
      if (n.keys[size_t(__builtin_ctzll(b))].size() == tpos_) m = __builtin_ctzll(b);
    if (m < 0) {
      if (n.closed) return -1;
      f.value_node = n.extra;
      return 1;
    }
    if (f.seen >> m & 1) return -1;  // a listed key appears once
    f.seen |= uint64_t(1) << m;
    f.value_node = n.key_nodes[size_t(m)];
    return 1;
  }
  if (!was_str && sc_.in_string() && ev.empty()) {  // an object key opened (values emit Begin)
    Frame& f = stack_.back();
    track_ = Track::Key, track_node_ = f.node, tpos_ = 0, cand_ = 0;
    if (f.node >= 0) {
      const JsonSchema::Node& n = schema_->node(f.node);
      cand_ = all_bits(n.keys.size());
      if (n.closed) {
        cand_ &= ~f.seen;
        if (cand_ == 0) return -1;
      }
    }
    return 1;
  }
  bool fed = false;  // byte c went into the enum filter
  for (const auto& e : ev) {
    if (e.kind == JsonPrefixScanner::Event::Kind::Begin) {
      if (!on_value_begin(c, fed)) return -1;
    } else if (e.kind == JsonPrefixScanner::Event::Kind::End) {
      if (int(stack_.size()) > e.depth) {  // a container closed
        const Frame& f = stack_.back();
        if (f.object && f.node >= 0 && (schema_->node(f.node).required & ~f.seen)) return -1;
        stack_.pop_back();
      } else {  // a scalar ended (at c, or just before c for a number)
        int_only_ = false;
        if (track_ == Track::Enum) {
          if (e.end == pos + 1) {
            fed = true;
            filter(c);
          }
          if (!exact()) return -1;
          track_ = Track::None;
        }
      }
    }
  }
  if (track_ == Track::Enum && !fed && !filter(c)) return -1;
  // A comma in a closed object needs a listed key still to come.
  if (c == ',' && !was_str && !stack_.empty() && stack_.back().object && stack_.back().node >= 0) {
    const JsonSchema::Node& n = schema_->node(stack_.back().node);
    if (n.closed && (all_bits(n.keys.size()) & ~stack_.back().seen) == 0) return -1;
  }
  return 1;
}

bool JsonRecognizer::feed(std::string_view s) {
  std::vector<JsonPrefixScanner::Event> ev;
  for (char c : s)
    if (!feed(c, ev)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------------
// JsonTokenTable

void JsonTokenTable::Trie::insert(const std::string& b, int32_t id) {
  uint32_t cur = 0;
  for (char ch : b) {
    const auto u = static_cast<uint8_t>(ch);
    uint32_t next = 0;
    for (const auto& [k, child] : nodes[cur].kids)
      if (k == u) {
        next = child;
        break;
      }
    if (next == 0) {
      next = uint32_t(nodes.size());
      nodes.emplace_back();
      nodes[cur].kids.push_back({u, next});
    }
    cur = next;
  }
  nodes[cur].tokens.push_back(id);
}

JsonTokenTable::JsonTokenTable(const std::vector<std::string>& bytes, std::vector<int32_t> eos_ids)
    : n_tokens_(int64_t(bytes.size())), bytes_(bytes), eos_ids_(std::move(eos_ids)), string_safe_(bytes.size(), 0) {
  JsonPrefixScanner in_string;
  std::vector<JsonPrefixScanner::Event> ev;
  in_string.step('"', 0, ev);
  for (size_t id = 0; id < bytes.size(); ++id) {
    const std::string& b = bytes[id];
    if (b.empty()) continue;
    max_len_ = std::max(max_len_, b.size());
    all_.insert(b, int32_t(id));
    JsonPrefixScanner sc = in_string;
    bool safe = true;
    for (size_t k = 0; k < b.size() && safe; ++k) safe = sc.step(b[k], k + 1, ev) && sc.in_string();
    safe = safe && sc.in_plain_string();
    if (safe) string_safe_[id] = 1;
    else special_.insert(b, int32_t(id));
  }
}

// ---------------------------------------------------------------------------------------------------
// JsonConstraint

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonTokenTable> table, std::shared_ptr<const JsonSchema> schema)
    : table_(std::move(table)), schema_(std::move(schema)), rec_(schema_.get()) {
  ARBOR_CHECK(table_ && schema_, "json constraint: a token table and a schema are required");
}

void JsonConstraint::walk(const JsonTokenTable::Trie& t, uint32_t node, size_t d) const {
  JsonRecognizer& r = level_[d + 1];
  r = level_[d];
  for (const auto& [b, kid] : t.nodes[node].kids) {
    const int res = r.feed_byte(char(b), ev_);
    if (res == 0) continue;  // unchanged
    if (res > 0) {
      const auto& k = t.nodes[kid];
      for (int32_t id : k.tokens) allow_[size_t(id)] = 1;
      if (!k.kids.empty()) walk(t, kid, d + 1);
    }
    r = level_[d];
  }
}

const std::vector<uint8_t>& JsonConstraint::allowed_mask() const {
  if (level_.size() < table_->max_len() + 1) level_.assign(table_->max_len() + 1, rec_);
  level_[0] = rec_;
  if (rec_.free_string()) {
    allow_ = table_->string_safe();
    walk(table_->not_string_safe(), 0, 0);
  } else {
    allow_.assign(size_t(table_->size()), 0);
    walk(table_->all(), 0, 0);
  }
  if (rec_.complete())
    for (int32_t e : table_->eos_ids())
      if (e >= 0 && e < table_->size()) allow_[size_t(e)] = 1;
  return allow_;
}

std::vector<int32_t> JsonConstraint::allowed() const {
  const auto& m = allowed_mask();
  std::vector<int32_t> out;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i]) out.push_back(int32_t(i));
  return out;
}

int64_t JsonConstraint::mask(float* logits, int64_t vocab) const {
  const auto& m = allowed_mask();
  const int64_t n = std::min<int64_t>(vocab, int64_t(m.size()));
  const float ninf = -std::numeric_limits<float>::infinity();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (m[size_t(i)]) ++kept;
    else logits[i] = ninf;
  }
  std::fill(logits + n, logits + vocab, ninf);
  return kept;
}

bool JsonConstraint::advance(int32_t id) {
  if (id < 0 || id >= table_->size()) return false;
  if (rec_.complete() && std::find(table_->eos_ids().begin(), table_->eos_ids().end(), id) != table_->eos_ids().end())
    return true;
  const std::string& b = table_->bytes(id);
  if (b.empty()) return false;
  JsonRecognizer next = rec_;
  for (char c : b)
    if (!next.feed(c, ev_)) return false;
  rec_ = std::move(next);
  return true;
}

}  // namespace arbor
