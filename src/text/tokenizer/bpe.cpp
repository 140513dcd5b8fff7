// BPE: the merge loop mirrors HF tokenizers' Word::merge_all (lowest rank first, then leftmost), so
// ties and stale queue entries resolve exactly as the reference resolves them.
#include "text/tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "text/tokenizer/unicode.h"

namespace arbor {

Bpe::Bpe(const json& j, std::vector<std::pair<std::string, int32_t>> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges) {
  int32_t max_id = -1;
  for (auto& [tok, id] : vocab) max_id = std::max(max_id, id);
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(id_to_token_.size(), 0);
  for (auto& [tok, id] : vocab) {
    n_tokens_ += !has_id_[id];
    id_to_token_[id] = std::move(tok);
    has_id_[id] = 1;
  }
  vocab_.build(id_to_token_, has_id_);

  if (j.contains("unk_token") && j["unk_token"].is_string()) {
    const std::string unk = j["unk_token"].get<std::string>();
    int32_t id = vocab_.find(unk);
    // HF fails only when an unknown character actually needs the unk token; keep the id if it exists.
    if (id >= 0) unk_id_ = id;
  }
  auto str_or_empty = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(); };
  continuing_subword_prefix_ = str_or_empty("continuing_subword_prefix");
  end_of_word_suffix_ = str_or_empty("end_of_word_suffix");
  fuse_unk_ = j.value("fuse_unk", false);
  byte_fallback_ = j.value("byte_fallback", false);
  ignore_merges_ = j.value("ignore_merges", false);

  for (int b = 0; b < 256; ++b) {
    byte_token_id_[b] = vocab_.find(fmt::format("<0x{:02X}>", b));
  }
  for (int c = 0; c < 128; ++c) {
    ascii_id_[c] = vocab_.find(std::string(1, static_cast<char>(c)));
  }

  merges_.reserve(merges.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    int32_t ia = vocab_.find(a), ib = vocab_.find(b);
    ARBOR_CHECK(ia >= 0 && ib >= 0, "tokenizer: model BPE: merge {} ('{}' '{}') uses a token not in the vocab",
                rank, a, b);
    ARBOR_CHECK(b.size() >= prefix_len, "tokenizer: model BPE: merge {}: '{}' is shorter than the subword prefix", rank, b);
    std::string merged = a;
    merged.append(b, prefix_len);
    int32_t im = vocab_.find(merged);
    ARBOR_CHECK(im >= 0, "tokenizer: model BPE: merge {} produces '{}', which is not in the vocab", rank, merged);
    // Later duplicates overwrite earlier ones, as in the reference's HashMap collect.
    merges_.set(pair_key(ia, ib), Merge{static_cast<uint32_t>(rank), im});
  }
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  int32_t id = vocab_.find(token);
  if (id < 0) return std::nullopt;
  return id;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void Bpe::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t c;
    int32_t prev, next;
    uint32_t len;  // bytes of the word this symbol covers; 0 once merged away
  };
  std::vector<Symbol> sym;
  sym.reserve(w.size());
  auto add = [&](int32_t id, size_t len) {
    int32_t n = static_cast<int32_t>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, static_cast<uint32_t>(len)});
  };

  int32_t unk_id = -1;  // pending unk symbol (id, bytes), fused when fuse_unk
  size_t unk_len = 0;
  std::string buf;
  for (size_t i = 0; i < w.size();) {
    size_t j = i + unicode::seq_len(static_cast<unsigned char>(w[i]));
    if (j > w.size()) j = w.size();
    const bool first = i == 0, last = j == w.size();
    std::string_view ch = w.substr(i, j - i);
    int32_t id = -1;
    if (ch.size() == 1 && static_cast<unsigned char>(ch[0]) < 128 && (first || continuing_subword_prefix_.empty()) &&
        (!last || end_of_word_suffix_.empty())) {
      id = ascii_id_[static_cast<unsigned char>(ch[0])];
    } else {
      buf.clear();
      if (!first) buf += continuing_subword_prefix_;
      buf += ch;
      if (last) buf += end_of_word_suffix_;
      id = vocab_.find(buf);
    }
    if (id >= 0) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(id, ch.size());
    } else {
      bool done = false;
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char b : ch) all = all && byte_token_id_[b] >= 0;
        if (all) {
          // A pending unk is not flushed here: the reference adds it after these bytes, and so do we.
          for (unsigned char b : ch) add(byte_token_id_[b], 1);
          done = true;
        }
      }
      if (!done) {
        if (!unk_id_)
          fail("tokenizer: model BPE: character '{}' is not in the vocab and there is no unk_token", std::string(ch));
        if (unk_id >= 0 && fuse_unk_) {
          unk_len += ch.size();
        } else {
          if (unk_id >= 0) add(unk_id, unk_len);
          unk_id = *unk_id_;
          unk_len = ch.size();
        }
      }
    }
    i = j;
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }  // min-heap
  };
  std::priority_queue<Cand> q;
  auto lookup = [&](int32_t a, int32_t b) -> const Merge* {
    return merges_.find(pair_key(a, b));
  };
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (auto m = lookup(sym[k].c, sym[k + 1].c)) q.push({m->rank, static_cast<int32_t>(k), m->new_id});

  while (!q.empty()) {
    Cand top = q.top();
    q.pop();
    Symbol& s = sym[top.pos];
    if (s.len == 0 || s.next == -1) continue;
    int32_t next_pos = s.next;
    Symbol right = sym[next_pos];
    auto m = lookup(s.c, right.c);
    if (!m || m->new_id != top.new_id) continue;  // stale entry
    s.c = top.new_id;
    s.len += right.len;
    s.next = right.next;
    sym[next_pos].len = 0;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (s.prev >= 0)
      if (auto pm = lookup(sym[s.prev].c, s.c)) q.push({pm->rank, s.prev, pm->new_id});
    if (s.next >= 0)
      if (auto nm = lookup(s.c, sym[s.next].c)) q.push({nm->rank, top.pos, nm->new_id});
  }
  for (auto& s : sym)
    if (s.len) out.push_back(s.c);
}

void Bpe::tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    int32_t id = vocab_.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  merge_word(word, out);
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() > kMaxCachedWordBytes) return tokenize_uncached(word, out);
  const uint64_t h = WordCache::hash(word);
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.get(word, h, out)) return;
  }
  size_t start = out.size();
  tokenize_uncached(word, out);
  std::lock_guard<std::mutex> lock(cache_mu_);
  cache_.put(word, h, out.data() + start, out.size() - start);
}

}  // namespace arbor
