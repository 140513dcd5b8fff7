// Tokenizer: loads tokenizer.json and runs the reference pipeline: added tokens (raw) -> normalizer ->
// added tokens (normalized) -> pre-tokenizer -> BPE -> post-processor; decode runs the decoder chain.
#include "text/tokenizer/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "text/tokenizer/bpe.h"
#include "text/tokenizer/decoder.h"
#include "text/tokenizer/json_scan.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/post_processor.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/unicode.h"

namespace arbor {

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<FastPreTokenizer> fast_pre_tokenizer;  // set when pre_tokenizer has the common byte-level shape
  std::unique_ptr<Bpe> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
  std::optional<int32_t> bos, eos;

  void encode_text(std::string_view text, bool at_start, std::vector<int32_t>& ids) const;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

std::unique_ptr<Tokenizer::Impl> build(TokenizerJson parts, const std::string& source) {
  auto impl = std::make_unique<Tokenizer::Impl>();
  const json& j = parts.rest;
  try {
    ARBOR_CHECK(j.contains("model"), "tokenizer: {}: no \"model\"", source);
    const json& model = j.at("model");
    std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") fail("tokenizer: {}: model type '{}' is not supported (supported: BPE)", source, type);
    // "dropout" is ignored: arbor only runs inference, where merges are deterministic.
    ARBOR_CHECK(parts.has_vocab, "tokenizer: {}: model has no \"vocab\" object", source);
    ARBOR_CHECK(parts.has_merges, "tokenizer: {}: model has no \"merges\" array", source);
    impl->model = std::make_unique<Bpe>(model, std::move(parts.vocab), parts.merges);
    impl->normalizer = make_normalizer(j.value("normalizer", json()));
    impl->pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", json()));
    if (impl->pre_tokenizer) impl->fast_pre_tokenizer = FastPreTokenizer::from(*impl->pre_tokenizer);
    impl->post_processor = make_post_processor(j.value("post_processor", json()));
    impl->decoder = make_decoder(j.value("decoder", json()));
    const Bpe& bpe = *impl->model;
    impl->added = AddedVocabulary(
        j.value("added_tokens", json::array()), impl->normalizer.get(), [&](std::string_view t) { return bpe.token_to_id(t); },
        bpe.size());
  } catch (const Error& e) {
    if (std::string_view(e.what()).find(source) != std::string_view::npos) throw;
    fail("{} (in {})", e.what(), source);
  } catch (const json::exception& e) {
    fail("tokenizer: {}: malformed field: {}", source, e.what());
  }
  return impl;
}

}  // namespace

Tokenizer Tokenizer::from_json(const json& j, const std::string& source) {
  return Tokenizer(build(split_tokenizer_json(j, source), source));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (fs::is_directory(p)) p /= "tokenizer.json";
  ARBOR_CHECK(fs::exists(p), "tokenizer: {} not found (expected a tokenizer.json file or a directory holding one)",
              p.string());
  Tokenizer t(build(scan_tokenizer_json(read_text_file(p.string()), p.string()), p.string()));
  fs::path config = p.parent_path() / "tokenizer_config.json";
  if (fs::exists(config)) {
    json c = read_json_file(config.string());
    auto id_of = [&](const char* key) -> std::optional<int32_t> {
      if (!c.contains(key)) return std::nullopt;
      const json& v = c[key];
      std::string s = v.is_string() ? v.get<std::string>() : v.is_object() ? v.value("content", std::string()) : std::string();
      if (s.empty()) return std::nullopt;
      return t.token_to_id(s);
    };
    t.impl_->bos = id_of("bos_token");
    t.impl_->eos = id_of("eos_token");
  }
  return t;
}

void Tokenizer::Impl::encode_text(std::string_view text, bool at_start, std::vector<int32_t>& ids) const {
  if (fast_pre_tokenizer) {
    fast_pre_tokenizer->for_each_piece(text, [&](std::string_view piece) { model->tokenize(piece, ids); });
    return;
  }
  std::vector<PreToken> pieces;
  pieces.push_back({std::string(text), at_start});
  if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
  for (auto& p : pieces) model->tokenize(p.text, ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!unicode::is_valid_utf8(input)) {
    repaired = unicode::to_valid_utf8(input);
    input = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(input.size() / 3 + 4);
  std::vector<Segment> raw, norm;
  m.added.split(input, false, raw);
  for (const Segment& seg : raw) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    std::string s(input.substr(seg.begin, seg.end - seg.begin));
    bool first_kept = true;
    if (m.normalizer) m.normalizer->normalize(s, first_kept);
    if (s.empty()) continue;
    norm.clear();
    m.added.split(s, true, norm);
    for (const Segment& n : norm) {
      if (n.added_id >= 0) ids.push_back(n.added_id);
      else m.encode_text(std::string_view(s).substr(n.begin, n.end - n.begin), seg.begin == 0 && first_kept && n.begin == 0, ids);
    }
  }
  if (m.post_processor) m.post_processor->process(ids, add_special_tokens);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* a = m.added.find_id(id)) {
      if (skip_special_tokens && a->special) continue;
      tokens.push_back(a->piece);
    } else if (const std::string* t = m.model->id_to_token(id)) {
      if (skip_special_tokens) {
        const AddedToken* same = m.added.find_content(*t);
        if (same && same->special) continue;
      }
      tokens.push_back(*t);
    }
  }
  if (!m.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  m.decoder->decode_chain(tokens);
  std::string out;
  for (auto& t : tokens) out += t;
  return out;
}

std::string Tokenizer::id_to_piece(int32_t id) const {
  if (const AddedToken* a = impl_->added.find_id(id)) return a->piece;
  if (const std::string* t = impl_->model->id_to_token(id)) return *t;
  fail("tokenizer: id {} is not in the vocabulary (vocab_size {})", id, vocab_size());
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* a = impl_->added.find_content(token)) return a->id;
  return impl_->model->token_to_id(token);
}

size_t Tokenizer::vocab_size() const {
  int32_t max_id = impl_->model->max_id();
  for (auto& a : impl_->added.tokens()) max_id = std::max(max_id, a.id);
  return static_cast<size_t>(max_id + 1);
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* a = impl_->added.find_id(id);
  return a && a->special;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added.tokens(); }
bool Tokenizer::incremental_decode() const { return !impl_->decoder || impl_->decoder->incremental(); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

}  // namespace arbor
