// RequestParser: requests fed whole and byte by byte parse alike; malformed request lines, TLS handshakes
// and bare LFs are answered from their first bad byte; strict framing (RFC 9112) rejects what request
// smuggling needs; limits; pipelining and chunked bodies with trailers.
#include "server/http_parser.h"

#include <gtest/gtest.h>

namespace arbor::http {
namespace {

struct Result {
  RequestParser::Status status = RequestParser::Status::NeedMore;
  int error = 0;
  std::string message;
  Request req;
  bool keep_alive = false;
  std::string rest;  // bytes left in the buffer
  size_t fed = 0;    // bytes fed when the status was reached
};

// Feeds bytes `step` at a time (0: all at once) until the parser is done or fails.
Result feed(const std::string& bytes, size_t step = 0, size_t max_header = 4096, size_t max_body = 1000) {
  RequestParser p(max_header, max_body);
  std::string buf;
  Result r;
  size_t pos = 0;
  do {
    const size_t n = step == 0 ? bytes.size() : std::min(step, bytes.size() - pos);
    buf.append(bytes, pos, n);
    pos += n;
    r.status = p.parse(buf);
  } while (r.status == RequestParser::Status::NeedMore && pos < bytes.size());
  r.fed = pos;
  r.error = p.error_status();
  r.message = p.error_message();
  r.keep_alive = p.keep_alive();
  if (r.status == RequestParser::Status::Done) r.req = p.take_request();
  r.rest = buf;
  return r;
}

TEST(HttpParser, WholeAndByteByByteAgree) {
  const std::string req = "POST /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nX-Test:  spaced  \r\nContent-Length: 5\r\n\r\nhello";
  for (size_t step : {0, 1, 3, 7}) {
    Result r = feed(req, step);
    ASSERT_EQ(r.status, RequestParser::Status::Done) << "step " << step << ": " << r.message;
    EXPECT_EQ(r.req.method, "POST");
    EXPECT_EQ(r.req.path, "/v1/x");
    EXPECT_EQ(r.req.query, "a=1");
    EXPECT_EQ(r.req.header("x-test"), "spaced");
    EXPECT_EQ(r.req.body, "hello");
    EXPECT_TRUE(r.keep_alive);
    EXPECT_EQ(r.rest, "");
  }
}

TEST(HttpParser, PipelinedRequestStaysInTheBuffer) {
  Result r = feed("GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n");
  ASSERT_EQ(r.status, RequestParser::Status::Done);
  EXPECT_EQ(r.req.path, "/a");
  EXPECT_EQ(r.rest, "GET /b HTTP/1.1\r\n\r\n");
}

TEST(HttpParser, BadRequestLinesFailAtTheirFirstBadByte) {
  // A TLS ClientHello starts 0x16 0x03: refused from the first byte, naming TLS.
  Result tls = feed(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11), 1);
  EXPECT_EQ(tls.status, RequestParser::Status::Error);
  EXPECT_EQ(tls.error, 400);
  EXPECT_EQ(tls.fed, 1u);
  EXPECT_NE(tls.message.find("TLS"), std::string::npos) << tls.message;
  // A bare LF ends the request line: refused at the LF, without waiting for a blank line.
  Result lf = feed("GET / HTTP/1.1\nHost: x\n\n", 1);
  EXPECT_EQ(lf.status, RequestParser::Status::Error);
  EXPECT_EQ(lf.fed, 15u);
  EXPECT_NE(lf.message.find("bare LF"), std::string::npos) << lf.message;
  Result lf2 = feed("GET / HTTP/1.1\r\nHost: x\n\n", 1);
  EXPECT_EQ(lf2.status, RequestParser::Status::Error);
  EXPECT_EQ(lf2.fed, 24u);
  EXPECT_EQ(feed("GET / HTTP/1.1\rX\r\n\r\n").error, 400);  // bare CR
  // Garbage in the method, the target or the version fails before the line ends.
  for (std::string bad : {"GE(T / HTTP/1.1", "GET /a b HTTP/1.1", "GET  / HTTP/1.1", "GET / HTTX/1.1", "GET / HTTP/1.12", "{\"json\":1}"}) {
    Result r = feed(bad, 1);
    EXPECT_EQ(r.status, RequestParser::Status::Error) << bad;
    EXPECT_EQ(r.error, 400) << bad;
  }
  // A line that could still become valid waits.
  for (std::string ok : {"G", "GET", "GET /", "GET /x HTT", "GET /x HTTP/1.1", "GET /x HTTP/1.1\r\nHost"})
    EXPECT_EQ(feed(ok, 1).status, RequestParser::Status::NeedMore) << ok;
  EXPECT_EQ(feed("garbage\r\n\r\n").error, 400);
  EXPECT_EQ(feed("GET /x HTTP/2.0\r\n\r\n").error, 505);
  EXPECT_EQ(feed("GET x HTTP/1.1\r\n\r\n").error, 400);
  EXPECT_EQ(feed("GET /x HTTP/1.1\r\nX: a\x01z\r\n\r\n").error, 400);  // control character in a value
}

TEST(HttpParser, StrictFraming) {
  auto status = [](const std::string& headers) { return feed("POST /x HTTP/1.1\r\n" + headers + "\r\nhello").error; };
  EXPECT_EQ(status("Content-Length: 5\r\nContent-Length: 6\r\n"), 400);  // two different lengths
  EXPECT_EQ(status("Content-Length: 5, 6\r\n"), 400);
  EXPECT_EQ(status("Content-Length: 5\r\nContent-Length: 5\r\n"), 0);  // the same value twice is one length
  EXPECT_EQ(status("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"), 400);
  EXPECT_EQ(status("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"), 400);
  EXPECT_EQ(status("Content-Length : 5\r\n"), 400);  // whitespace before the colon
  EXPECT_EQ(status("X: a\r\n  folded\r\nContent-Length: 5\r\n"), 400);  // obsolete line folding
  EXPECT_EQ(status("Content-Length: -1\r\n"), 400);
  EXPECT_EQ(status("Content-Length: 0x5\r\n"), 400);
  EXPECT_EQ(status("Transfer-Encoding: chunked, gzip\r\n"), 400);  // chunked must be last
  EXPECT_EQ(status("Transfer-Encoding: gzip, chunked\r\n"), 501);
  EXPECT_EQ(status("Transfer-Encoding: gzip\r\n"), 400);
  EXPECT_EQ(feed("POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").error, 400);
  EXPECT_NE(feed("POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n").message.find("conflicting Content-Length"), std::string::npos);
}

TEST(HttpParser, Limits) {
  EXPECT_EQ(feed("POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n").error, 413);
  EXPECT_EQ(feed("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3E9\r\n").error, 413);
  EXPECT_EQ(feed("GET /x HTTP/1.1\r\nX: " + std::string(5000, 'a') + "\r\n\r\n").error, 431);
  EXPECT_EQ(feed("GET /x HTTP/1.1\r\nX: " + std::string(5000, 'a')).error, 431);  // no end of headers yet
}

TEST(HttpParser, ChunkedBodyWithExtensionsAndTrailers) {
  const std::string req = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Sum: 1\r\n\r\nNEXT";
  for (size_t step : {0, 1, 5}) {
    Result r = feed(req, step);
    ASSERT_EQ(r.status, RequestParser::Status::Done) << r.message;
    EXPECT_EQ(r.req.body, "abc0123456789");
    EXPECT_EQ(r.rest, step == 0 ? "NEXT" : step == 1 ? "" : r.rest);
  }
  EXPECT_EQ(feed("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n").error, 400);
  EXPECT_EQ(feed("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").error, 400);
}

TEST(HttpParser, KeepAliveAndContinue) {
  EXPECT_FALSE(feed("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive);
  EXPECT_FALSE(feed("GET / HTTP/1.0\r\n\r\n").keep_alive);
  EXPECT_TRUE(feed("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
  RequestParser p(4096, 1000);
  std::string buf = "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
  EXPECT_FALSE(p.take_continue());
  EXPECT_EQ(p.parse(buf), RequestParser::Status::NeedMore);
  EXPECT_TRUE(p.take_continue());
  EXPECT_FALSE(p.take_continue());  // once
  buf += "ok";
  EXPECT_EQ(p.parse(buf), RequestParser::Status::Done);
  EXPECT_EQ(p.take_request().body, "ok");
}

}  // namespace
}  // namespace arbor::http
