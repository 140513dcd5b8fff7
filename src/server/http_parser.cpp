// Incremental HTTP/1.1 request parsing with strict framing (see http_parser.h).
#include "server/http_parser.h"

#include <fmt/format.h>

#include <cctype>
#include <vector>

namespace arbor::http {
namespace {

// RFC 9110 5.6.2: the characters of a token (methods, header names).
bool is_tchar(unsigned char c) {
  return std::isalnum(c) || (c != 0 && std::string_view("!#$%&'*+-.^_`|~").find(char(c)) != std::string_view::npos);
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!is_tchar(c)) return false;
  return true;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string_view::npos ? std::string() : std::string(s.substr(a, b - a + 1));
}

// Comma-separated list members, trimmed, empty ones dropped (RFC 9110 5.6.1).
std::vector<std::string> list_members(std::string_view s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t e = s.find(',', pos);
    if (e == std::string_view::npos) e = s.size();
    std::string m = trim(s.substr(pos, e - pos));
    if (!m.empty()) out.push_back(std::move(m));
    pos = e + 1;
  }
  return out;
}

bool parse_size(std::string_view s, int base, uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  out = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : base == 16 && c >= 'a' && c <= 'f' ? c - 'a' + 10 : base == 16 && c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return false;
    out = out * uint64_t(base) + uint64_t(d);
  }
  return true;
}

// A value for an error message: at most 40 bytes, control and non-ASCII bytes escaped.
std::string shown(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 40)) {
    if (c >= 0x20 && c < 0x7f) out += char(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  return s.size() > 40 ? out + "..." : out;
}

}  // namespace

std::string request_line_problem(std::string_view line, bool complete) {
  if (!line.empty() && static_cast<unsigned char>(line[0]) == 0x16)
    return "the connection opened with a TLS handshake; this server speaks plain HTTP (put a TLS proxy in front of it)";
  // Parts: 0 method, 1 target, 2 version.
  size_t part = 0, part_len = 0;
  static constexpr std::string_view kVersion = "HTTP/d.d";
  for (unsigned char c : line) {
    if (c == ' ') {
      if (part_len == 0 || part == 2) return "malformed request line (expected 'METHOD /path HTTP/1.1')";
      ++part;
      part_len = 0;
      continue;
    }
    bool ok = part == 0 ? is_tchar(c) : part == 1 ? (c > 0x20 && c < 0x7f)
                                                  : part_len < kVersion.size() && (kVersion[part_len] == 'd' ? std::isdigit(c) != 0 : c == kVersion[part_len]);
    if (!ok) return part == 1 ? "malformed request target" : "malformed request line (expected 'METHOD /path HTTP/1.1')";
    ++part_len;
  }
  if (complete && (part != 2 || part_len != kVersion.size())) return "malformed request line (expected 'METHOD /path HTTP/1.1')";
  return {};
}

void RequestParser::reset() { *this = RequestParser(max_header_, max_body_); }

RequestParser::Status RequestParser::fail(int status, std::string message) {
  phase_ = Phase::Failed;
  error_status_ = status;
  error_message_ = std::move(message);
  return Status::Error;
}

bool RequestParser::take_continue() {
  if (!expect_continue_ || phase_ == Phase::Head || phase_ == Phase::Failed) return false;
  expect_continue_ = false;
  return true;
}

RequestParser::Status RequestParser::parse(std::string& buf) {
  if (phase_ == Phase::Failed) return Status::Error;
  if (phase_ == Phase::Head) {
    Status s = parse_head(buf);
    if (s != Status::Done) return s;
  }
  if (phase_ == Phase::Length) {
    if (buf.size() < length_) return Status::NeedMore;
    req_.body = buf.substr(0, size_t(length_));
    buf.erase(0, size_t(length_));
    phase_ = Phase::Done;
  }
  if (phase_ == Phase::Chunks) {
    Status s = parse_chunks(buf);
    if (s != Status::Done) return s;
  }
  if (phase_ == Phase::Trailers) {
    Status s = parse_trailers(buf);
    if (s != Status::Done) return s;
  }
  return Status::Done;
}

RequestParser::Status RequestParser::parse_head(std::string& buf) {
  if (buf.empty()) return Status::NeedMore;
  started_ = true;
  const size_t end = buf.find("\r\n\r\n", scanned_ >= 3 ? scanned_ - 3 : 0);
  const size_t upto = end == std::string::npos ? buf.size() : end + 4;
  // Line ends are CRLF only (RFC 9112 2.2: a bare CR must be rejected; a bare LF we reject too, as some
  // proxies read it as a line end and others do not). Control characters other than HTAB are not allowed.
  for (size_t i = scanned_; i < upto; ++i) {
    unsigned char c = static_cast<unsigned char>(buf[i]);
    if (c == '\n' && (i == 0 || buf[i - 1] != '\r')) return fail(400, "a line of the request ends with a bare LF; HTTP/1.1 lines end with CRLF");
    if (c == '\r' && i + 1 < buf.size() && buf[i + 1] != '\n') return fail(400, "a bare CR in the request headers");
    if ((c < 0x20 && c != '\t' && c != '\r' && c != '\n') || c == 0x7f) {
      // The request line's own check names a TLS handshake.
      size_t le = buf.find("\r\n");
      if (i < le) {
        std::string why = request_line_problem(std::string_view(buf).substr(0, std::min(le, buf.size())), false);
        if (!why.empty()) return fail(400, why);
      }
      return fail(400, fmt::format("a control character (0x{:02x}) in the request headers", c));
    }
  }
  scanned_ = upto > 0 && buf[upto - 1] == '\r' ? upto - 1 : upto;  // a trailing CR is checked with the byte after it
  if (!line_checked_) {
    const size_t le = buf.find("\r\n");
    std::string_view line = std::string_view(buf).substr(0, std::min(le, buf.size()));
    if (le == std::string::npos && !line.empty() && line.back() == '\r') line.remove_suffix(1);  // its LF is still to come
    std::string why = request_line_problem(line, le != std::string::npos);
    if (!why.empty()) return fail(400, why);
    line_checked_ = le != std::string::npos;
  }
  // The head, its blank line included, is at most max_header_ bytes; without its end in n bytes it is at
  // least n + 1 long.
  if (end == std::string::npos) {
    if (buf.size() >= max_header_) return fail(431, fmt::format("request headers exceed {} bytes", max_header_));
    return Status::NeedMore;
  }
  if (end + 4 > max_header_) return fail(431, fmt::format("request headers exceed {} bytes", max_header_));

  const std::string head = buf.substr(0, end);
  buf.erase(0, end + 4);
  const size_t line_end = std::min(head.find("\r\n"), head.size());
  const std::string_view line = std::string_view(head).substr(0, line_end);
  const size_t s1 = line.find(' '), s2 = line.rfind(' ');
  req_.method = std::string(line.substr(0, s1));
  req_.target = std::string(line.substr(s1 + 1, s2 - s1 - 1));
  const std::string version(line.substr(s2 + 1));
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return fail(505, fmt::format("HTTP version '{}' is not supported; use HTTP/1.1", version));
  if (req_.target[0] != '/') return fail(400, fmt::format("request target '{}' must be a path starting with '/'", shown(req_.target)));
  const size_t q = req_.target.find('?');
  req_.path = req_.target.substr(0, q);
  if (q != std::string::npos) req_.query = req_.target.substr(q + 1);

  size_t pos = line_end + 2;
  std::vector<std::string> lengths, codings;
  bool has_length = false, has_coding = false;
  std::string connection;
  while (pos < head.size()) {
    size_t e = std::min(head.find("\r\n", pos), head.size());
    std::string_view h = std::string_view(head).substr(pos, e - pos);
    pos = e + 2;
    if (h[0] == ' ' || h[0] == '\t') return fail(400, "a header line starts with whitespace (obsolete line folding is not accepted)");
    const size_t colon = h.find(':');
    if (colon == std::string_view::npos) return fail(400, fmt::format("malformed header line '{}' (no colon)", shown(h)));
    if (!is_token(h.substr(0, colon)))
      return fail(400, fmt::format("malformed header name '{}' (a token, with no whitespace before the colon)", shown(h.substr(0, colon))));
    std::string name = lower(h.substr(0, colon)), value = trim(h.substr(colon + 1));
    if (name == "content-length") {
      has_length = true;
      for (auto& m : list_members(value)) lengths.push_back(m);
      if (value.empty() || lengths.empty()) return fail(400, "malformed Content-Length ''");
    } else if (name == "transfer-encoding") {
      has_coding = true;
      for (auto& m : list_members(value)) codings.push_back(lower(m));
    } else if (name == "connection") {
      connection.push_back(',');
      connection += lower(value);
    } else if (name == "expect") {
      expect_continue_ = lower(value) == "100-continue";
    }
    req_.headers.emplace_back(std::move(name), std::move(value));
  }
  bool close = false, keep = false;
  for (const auto& t : list_members(connection)) {
    close = close || t == "close";
    keep = keep || t == "keep-alive";
  }
  keep_alive_ = version == "HTTP/1.1" ? !close : keep && !close;

  // Framing (RFC 9112 6.1-6.3).
  if (has_coding && has_length)
    return fail(400, "the request has both Content-Length and Transfer-Encoding; send one (RFC 9112 6.3)");
  if (has_coding) {
    if (version == "HTTP/1.0") return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (codings.empty() || codings.back() != "chunked") return fail(400, "the last transfer coding of a request must be 'chunked'");
    if (codings.size() != 1) return fail(501, fmt::format("transfer-encoding '{}' is not supported; only 'chunked'", shown(codings.front())));
    phase_ = Phase::Chunks;
    return Status::Done;
  }
  if (has_length) {
    for (const auto& l : lengths)
      if (l != lengths.front()) return fail(400, fmt::format("conflicting Content-Length values '{}' and '{}'", shown(lengths.front()), shown(l)));
    if (!parse_size(lengths.front(), 10, length_)) return fail(400, fmt::format("malformed Content-Length '{}'", shown(lengths.front())));
    if (length_ > max_body_) return fail(413, fmt::format("request body of {} bytes exceeds the limit of {} bytes", length_, max_body_));
    phase_ = length_ > 0 ? Phase::Length : Phase::Done;
    if (length_ == 0) expect_continue_ = false;
    return Status::Done;
  }
  expect_continue_ = false;
  phase_ = Phase::Done;
  return Status::Done;
}

RequestParser::Status RequestParser::parse_chunks(std::string& buf) {
  size_t pos = 0;
  Status status = Status::NeedMore;
  for (;;) {
    const size_t e = buf.find("\r\n", pos);
    if (e == std::string::npos) {
      if (buf.size() - pos > 1024) return fail(400, "malformed chunk size line");
      break;
    }
    if (e - pos > 1024) return fail(400, "malformed chunk size line");
    std::string_view line = std::string_view(buf).substr(pos, e - pos);
    line = line.substr(0, line.find(';'));  // chunk extensions are ignored
    uint64_t n;
    if (!parse_size(trim(line), 16, n)) return fail(400, fmt::format("malformed chunk size '{}'", shown(line)));
    if (n > max_body_ || req_.body.size() + n > max_body_)
      return fail(413, fmt::format("request body exceeds the limit of {} bytes", max_body_));
    if (n == 0) {
      pos = e + 2;
      phase_ = Phase::Trailers;
      status = Status::Done;
      break;
    }
    if (buf.size() < e + 2 + n + 2) break;
    if (buf.compare(e + 2 + n, 2, "\r\n") != 0) return fail(400, "malformed chunk terminator");
    req_.body.append(buf, e + 2, size_t(n));
    pos = e + 2 + n + 2;
  }
  buf.erase(0, pos);
  return status;
}

RequestParser::Status RequestParser::parse_trailers(std::string& buf) {
  // Trailer fields are read and dropped; the empty line ends the request.
  for (;;) {
    const size_t e = buf.find("\r\n");
    if (e == std::string::npos) {
      if (trailer_bytes_ + buf.size() > max_header_) return fail(431, fmt::format("request trailers exceed {} bytes", max_header_));
      return Status::NeedMore;
    }
    if (buf.find('\n') < e) return fail(400, "a trailer line ends with a bare LF");
    trailer_bytes_ += e + 2;
    if (trailer_bytes_ > max_header_) return fail(431, fmt::format("request trailers exceed {} bytes", max_header_));
    const bool last = e == 0;
    if (!last && std::string_view(buf).substr(0, e).find(':') == std::string_view::npos) return fail(400, "malformed trailer line");
    buf.erase(0, e + 2);
    if (last) {
      phase_ = Phase::Done;
      return Status::Done;
    }
  }
}

}  // namespace arbor::http
