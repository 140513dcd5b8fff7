// RequestParser: one HTTP/1.1 request read incrementally from the bytes a connection has received so far,
// with strict framing (RFC 9112): CRLF line ends only, a request line checked as its bytes arrive (so TLS
// handshakes and garbage are answered at once), header names that are tokens with no space before the
// colon, no line folding, one Content-Length value, and never both Content-Length and Transfer-Encoding
// (the disagreements between a proxy and a server that request smuggling needs). Limits on header and
// body size. It never blocks and never reads a byte twice except a partial chunk-size line.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "server/http.h"

namespace arbor::http {

class RequestParser {
 public:
  enum class Status { NeedMore, Done, Error };
  RequestParser(size_t max_header_bytes, size_t max_body_bytes) : max_header_(max_header_bytes), max_body_(max_body_bytes) {}

  // Consumes from the front of buf what it has parsed. Done: take_request() is whole and the bytes of a
  // next (pipelined) request stay in buf. Error: error_status() and error_message() say what to answer.
  Status parse(std::string& buf);
  void reset();  // for the next request on the same connection

  bool started() const { return started_; }  // a byte of this request has arrived
  bool headers_done() const { return phase_ != Phase::Head; }
  // True once, when the headers asked for "Expect: 100-continue" and the request has a body.
  bool take_continue();
  bool keep_alive() const { return keep_alive_; }
  Request take_request() { return std::move(req_); }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

 private:
  enum class Phase { Head, Length, Chunks, Trailers, Done, Failed };
  Status fail(int status, std::string message);
  Status parse_head(std::string& buf);
  Status parse_chunks(std::string& buf);
  Status parse_trailers(std::string& buf);

  size_t max_header_, max_body_;
  Phase phase_ = Phase::Head;
  Request req_;
  bool started_ = false, keep_alive_ = true, expect_continue_ = false, line_checked_ = false;
  size_t scanned_ = 0;     // header bytes already checked for stray CR, LF and control characters
  uint64_t length_ = 0;    // Content-Length of the body
  size_t trailer_bytes_ = 0;
  int error_status_ = 0;
  std::string error_message_;
};

// "" when `line` (a request line, whole when `complete`, else the bytes of it received so far) can be or
// is `method SP request-target SP HTTP/d.d`; else what is wrong with it.
std::string request_line_problem(std::string_view line, bool complete);

}  // namespace arbor::http
