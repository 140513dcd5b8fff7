// Bounded JSON reading (see json_body.h): nlohmann's SAX parser (iterative, so any depth is safe to
// scan) feeding its own DOM builder, with the path to the current value kept alongside.
#include "server/json_body.h"

#include <fmt/format.h>

#include <vector>

namespace arbor::server {
namespace {

template <class J>
class BoundedSax {
 public:
  explicit BoundedSax(J& root) : dom_(root, /*allow_exceptions=*/false) {}

  bool null() { return value() && dom_.null(); }
  bool boolean(bool v) { return value() && dom_.boolean(v); }
  bool number_integer(typename J::number_integer_t v) { return value() && dom_.number_integer(v); }
  bool number_unsigned(typename J::number_unsigned_t v) { return value() && dom_.number_unsigned(v); }
  bool number_float(typename J::number_float_t v, const typename J::string_t& s) { return value() && dom_.number_float(v, s); }
  bool string(typename J::string_t& v) { return value() && dom_.string(v); }
  bool binary(typename J::binary_t& v) { return value() && dom_.binary(v); }
  bool start_object(std::size_t n) { return value() && open(false) && dom_.start_object(n); }
  bool start_array(std::size_t n) { return value() && open(true) && dom_.start_array(n); }
  bool key(typename J::string_t& k) {
    frames_.back().key = k;
    return dom_.key(k);
  }
  bool end_object() {
    frames_.pop_back();
    return dom_.end_object();
  }
  bool end_array() {
    frames_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(std::size_t, const std::string& token, const nlohmann::detail::exception& e) {
    if (error_.message.empty()) {
      if (e.id == 406) {  // out_of_range 406: a number that does not fit a double
        error_.kind = JsonReadError::Kind::NumberOverflow;
        error_.where = path(/*next=*/true);
        error_.message = fmt::format("{} is a number too large for a double: '{}'",
                                     error_.where.empty() ? std::string("the value") : "'" + error_.where + "'", token.substr(0, 40));
      } else {
        // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error ..." without its prefix.
        std::string what = e.what();
        if (size_t p = what.find("] "); p != std::string::npos) what.erase(0, p + 2);
        error_.kind = JsonReadError::Kind::Syntax;
        error_.message = what;
      }
    }
    return false;
  }

  const JsonReadError& error() const { return error_; }

 private:
  struct Frame {
    bool array;
    size_t count = 0;  // arrays: elements begun so far
    std::string key;   // objects: the key of the member being read
  };

  // Each value event: counts it as its array's next element.
  bool value() {
    if (!frames_.empty() && frames_.back().array) frames_.back().count += 1;
    return true;
  }

  bool open(bool array) {
    if (int(frames_.size()) >= kMaxJsonDepth) {
      error_.kind = JsonReadError::Kind::TooDeep;
      error_.where = path(false);
      std::string shown = error_.where.size() > 120 ? error_.where.substr(0, 120) + "..." : error_.where;
      error_.message = fmt::format("nests arrays and objects more than {} levels deep{}", kMaxJsonDepth,
                                   shown.empty() ? std::string() : " (at '" + shown + "')");
      return false;
    }
    frames_.push_back({array, 0, {}});
    return true;
  }

  // "a.b[2].c": the value being read. next: the element an array is about to begin (a parse error comes
  // before its value event).
  std::string path(bool next) const {
    std::string p;
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.array) {
        const bool innermost = i + 1 == frames_.size();
        p += fmt::format("[{}]", innermost && next ? f.count : f.count == 0 ? 0 : f.count - 1);
      } else {
        p += (p.empty() ? "" : ".") + f.key;
      }
    }
    return p;
  }

  nlohmann::detail::json_sax_dom_parser<J> dom_;
  std::vector<Frame> frames_;
  JsonReadError error_;
};

}  // namespace

template <class J>
std::optional<J> read_json(std::string_view text, JsonReadError* err) {
  J root;
  BoundedSax<J> sax(root);
  if (J::sax_parse(text, &sax)) return root;
  if (err) *err = sax.error();
  return std::nullopt;
}

template std::optional<json> read_json<json>(std::string_view, JsonReadError*);
template std::optional<nlohmann::ordered_json> read_json<nlohmann::ordered_json>(std::string_view, JsonReadError*);

}  // namespace arbor::server
