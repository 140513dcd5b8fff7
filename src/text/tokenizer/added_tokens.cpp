// Added-token extraction: trie matching plus the reference's lstrip/rstrip/single_word rules.
#include "text/tokenizer/added_tokens.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace arbor {

void TokenTrie::insert(std::string_view s, uint32_t value) {
  if (s.empty()) return;
  first_byte_[static_cast<unsigned char>(s[0])] = true;
  uint32_t node = 0;
  for (unsigned char c : s) {
    auto& nx = nodes_[node].next;
    auto it = std::lower_bound(nx.begin(), nx.end(), c, [](const auto& p, unsigned char v) { return p.first < v; });
    if (it != nx.end() && it->first == c) {
      node = it->second;
    } else {
      uint32_t child = static_cast<uint32_t>(nodes_.size());
      nx.insert(it, {c, child});
      nodes_.emplace_back();  // invalidates nx; not used again below
      node = child;
    }
  }
  // The first token with a given content wins (the reference maps content -> one id).
  if (nodes_[node].value < 0) nodes_[node].value = value;
}

void TokenTrie::find_all(std::string_view s, std::vector<Match>& out) const {
  if (empty()) return;
  for (size_t pos = 0; pos < s.size();) {
    if (!first_byte_[static_cast<unsigned char>(s[pos])]) {
      ++pos;
      continue;
    }
    uint32_t node = 0;
    int64_t best_value = -1;
    size_t best_end = 0;
    for (size_t k = pos; k < s.size(); ++k) {
      const auto& nx = nodes_[node].next;
      unsigned char c = static_cast<unsigned char>(s[k]);
      auto it = std::lower_bound(nx.begin(), nx.end(), c, [](const auto& p, unsigned char v) { return p.first < v; });
      if (it == nx.end() || it->first != c) break;
      node = it->second;
      if (nodes_[node].value >= 0) {
        best_value = nodes_[node].value;
        best_end = k + 1;
      }
    }
    if (best_value >= 0) {
      out.push_back({pos, best_end, static_cast<uint32_t>(best_value)});
      pos = best_end;
    } else {
      ++pos;
    }
  }
}

AddedVocabulary::AddedVocabulary(const json& tokens, const Normalizer* normalizer,
                                 const std::function<std::optional<int32_t>(std::string_view)>& model_token_to_id,
                                 size_t model_vocab_size) {
  ARBOR_CHECK(tokens.is_array(), "tokenizer: \"added_tokens\" must be an array");
  std::unordered_map<std::string, int32_t> assigned;  // content -> id, as the reference's added_tokens_map
  int64_t max_assigned = -1;
  for (const json& t : tokens) {
    AddedToken a;
    a.content = t.at("content").get<std::string>();
    if (a.content.empty()) continue;  // the reference ignores empty added tokens
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    if (auto it = assigned.find(a.content); it != assigned.end()) {
      a.id = it->second;
    } else if (auto mid = model_token_to_id(a.content)) {
      a.id = *mid;
    } else {
      const int64_t vs = static_cast<int64_t>(model_vocab_size);
      a.id = static_cast<int32_t>(max_assigned < 0 ? vs : (max_assigned >= vs || vs == 0) ? max_assigned + 1 : vs);
    }
    assigned.emplace(a.content, a.id);
    max_assigned = std::max<int64_t>(max_assigned, a.id);
    tokens_.push_back(std::move(a));
  }
  int32_t max_id = -1;
  for (auto& a : tokens_) max_id = std::max(max_id, a.id);
  by_id_.assign(static_cast<size_t>(max_id + 1), -1);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    AddedToken& a = tokens_[i];
    a.piece = a.content;
    by_id_[a.id] = static_cast<int32_t>(i);
    by_content_.emplace(a.content, static_cast<int32_t>(i));
    if (a.normalized) {
      if (normalizer) normalizer->normalize(a.piece);
      normalized_trie_.insert(a.piece, static_cast<uint32_t>(i));
    } else {
      raw_trie_.insert(a.content, static_cast<uint32_t>(i));
    }
  }
}

const AddedToken* AddedVocabulary::find_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= by_id_.size() || by_id_[id] < 0) return nullptr;
  return &tokens_[by_id_[id]];
}

const AddedToken* AddedVocabulary::find_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

namespace {

// Character before `end` / at `begin`, for the word and whitespace tests below.
char32_t last_char(std::string_view s) {
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return unicode::next_cp(s, k);
}
// A regex word character (\w: Alphabetic, marks, decimal digits, connector punctuation, joiners), which
// the reference's single_word boundaries use (a combining mark after a token continues the word).
bool is_word_char(char32_t c) {
  if (c < 0x80) return (c | 0x20) - 'a' < 26u || c - '0' < 10u || c == '_';
  static const Regex word(R"(^\w$)", "added tokens");
  std::string ch;
  unicode::append_utf8(ch, c);
  std::vector<std::pair<size_t, size_t>> m;
  word.find_all(ch, m);
  return !m.empty();
}

}  // namespace

void AddedVocabulary::split(std::string_view s, bool normalized_set, std::vector<Segment>& out) const {
  const TokenTrie& trie = normalized_set ? normalized_trie_ : raw_trie_;
  std::vector<TokenTrie::Match> m;
  trie.find_all(s, m);
  size_t start_offset = 0;
  for (auto& mt : m) {
    const AddedToken& tok = tokens_[mt.value];
    size_t start = mt.begin, stop = mt.end;
    if (tok.single_word) {
      bool start_space = start == 0 || !is_word_char(last_char(s.substr(0, start)));
      size_t j = stop;
      bool stop_space = stop == s.size() || !is_word_char(unicode::next_cp(s, j));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      // Leftmost start of the whitespace run that ends at `start`, not before the previous match.
      size_t k = start;
      while (k > 0) {
        size_t p = k - 1;
        while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!unicode::is_whitespace(unicode::next_cp(s, q))) break;
        k = p;
      }
      start = std::max(k, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t q = stop;
        if (!unicode::is_whitespace(unicode::next_cp(s, q))) break;
        stop = q;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
}

}  // namespace arbor
