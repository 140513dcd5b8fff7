// HTTP layer over real sockets: keep-alive with pipelined requests, chunked request bodies, body and header
// limits, Expect: 100-continue, chunked streaming responses, disconnect detection, stop(); and against slow
// and idle clients: header and body deadlines, malformed request lines answered at once, the connection
// cap replacing stale connections, the per-client cap.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "server/http.h"

namespace arbor::http {
namespace {

class HttpTest : public testing::Test {
 protected:
  void SetUp() override { start(default_options()); }
  static ServerOptions default_options() {
    ServerOptions o;
    o.port = 0;
    o.max_body_bytes = 1000;
    o.max_header_bytes = 2000;
    return o;
  }
  void restart(const ServerOptions& o) {
    TearDown();
    start(o);
  }
  void start(const ServerOptions& o) {
    server_ = std::make_unique<Server>(o, [this](const Request& r, ResponseWriter& w) {
      if (r.path == "/stream") {
        w.begin_stream(200, "text/event-stream");
        for (int i = 0; i < 3; ++i) w.write_chunk("data: " + std::to_string(i) + "\n\n");
        w.end_stream();
        return;
      }
      if (r.path == "/wait") {  // holds the request until the client goes away
        for (int i = 0; i < 200 && !w.client_gone(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        gone_seen_ = w.client_gone();
        w.send(200, "text/plain", "late");
        return;
      }
      w.send(200, "text/plain", r.method + " " + r.path + " q=" + r.query + " body=" + r.body + " h=" + r.header("x-test"));
    });
    server_->listen();
    thread_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }
  int connect_fd(in_addr_t addr = htonl(INADDR_LOOPBACK)) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(server_->port()));
    a.sin_addr.s_addr = addr;
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
  }
  // Sends bytes, half-closes when asked, reads until the server closes (or the 5 s timeout).
  std::string exchange(const std::string& bytes, bool half_close = true) {
    int fd = connect_fd();
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (half_close) ::shutdown(fd, SHUT_WR);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
    ::close(fd);
    return out;
  }
  std::unique_ptr<Server> server_;
  std::thread thread_;
  std::atomic<bool> gone_seen_{false};
};

TEST_F(HttpTest, KeepAlivePipelinedRequests) {
  std::string out = exchange(
      "POST /a?x=1 HTTP/1.1\r\nContent-Length: 3\r\nX-Test: one\r\n\r\nabc"
      "GET /b HTTP/1.1\r\n\r\n"
      "POST /c HTTP/1.1\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi");
  EXPECT_NE(out.find("POST /a q=x=1 body=abc h=one"), std::string::npos) << out;
  EXPECT_NE(out.find("GET /b q= body= h="), std::string::npos) << out;
  EXPECT_NE(out.find("POST /c q= body=hi"), std::string::npos) << out;
  EXPECT_NE(out.find("Connection: close"), std::string::npos);
}

TEST_F(HttpTest, ChunkedRequestBody) {
  std::string out = exchange("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                             "3\r\nabc\r\nA;ext=1\r\n0123456789\r\n0\r\n\r\n");
  EXPECT_NE(out.find("body=abc0123456789"), std::string::npos) << out;
}

TEST_F(HttpTest, LimitsAndMalformedInput) {
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n").rfind("HTTP/1.1 413", 0), 0u);
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3E9\r\n").rfind("HTTP/1.1 413", 0), 0u);
  EXPECT_EQ(exchange("GET /x HTTP/1.1\r\nX: " + std::string(3000, 'a') + "\r\n\r\n").rfind("HTTP/1.1 431", 0), 0u);
  EXPECT_EQ(exchange("GET /x HTTP/1.1\r\nX: " + std::string(3000, 'a')).rfind("HTTP/1.1 431", 0), 0u);  // no terminator yet
  EXPECT_EQ(exchange("garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(exchange("GET /x HTTP/2.0\r\n\r\n").rfind("HTTP/1.1 505", 0), 0u);
  EXPECT_EQ(exchange("GET /x HTTP/1.1\r\nno colon\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nContent-Length: 12x\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);  // not chunked last
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").rfind("HTTP/1.1 501", 0), 0u);
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"), "");  // truncated body: closed, no answer
  std::string err = exchange("garbage\r\n\r\n");
  EXPECT_NE(err.find("{\"error\":{"), std::string::npos) << err;
}

TEST_F(HttpTest, ExpectContinue) {
  std::string out = exchange("POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
  EXPECT_EQ(out.rfind("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200", 0), 0u) << out;
  // Over the limit: no 100, straight to 413.
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n").rfind("HTTP/1.1 413", 0), 0u);
}

TEST_F(HttpTest, ChunkedStreamingResponse) {
  std::string out = exchange("GET /stream HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_NE(out.find("Transfer-Encoding: chunked"), std::string::npos);
  size_t body = out.find("\r\n\r\n") + 4;
  EXPECT_EQ(out.substr(body), "9\r\ndata: 0\n\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n");
}

TEST_F(HttpTest, DetectsAClientThatLeft) {
  int fd = connect_fd();
  std::string req = "GET /wait HTTP/1.1\r\n\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::close(fd);
  for (int i = 0; i < 300 && !gone_seen_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(gone_seen_.load());
}

// Reads what the server sends until it closes or `ms` pass; the socket stays open for writing.
static std::string read_until_close(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
  return out;
}

static double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST_F(HttpTest, MalformedRequestLinesAreAnsweredAtOnce) {
  // Neither a bare-LF request nor a TLS handshake ever completes a CRLF header block: answered from the
  // bad byte, without the client closing its side.
  for (std::string bytes : {std::string("GET / HTTP/1.1\n\n"), std::string("\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", 11)}) {
    auto t0 = std::chrono::steady_clock::now();
    int fd = connect_fd();
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    std::string out = read_until_close(fd, 3000);
    ::close(fd);
    EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
    EXPECT_LT(seconds_since(t0), 1.0);
  }
}

TEST_F(HttpTest, HeaderAndBodyDeadlines) {
  ServerOptions o = default_options();
  o.header_timeout_ms = 400;
  o.body_timeout_ms = 400;
  restart(o);
  // Headers one byte at a time, slower than the deadline allows in total (though each byte is prompt).
  auto t0 = std::chrono::steady_clock::now();
  int fd = connect_fd();
  std::string slow = "GET /x HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa";
  bool closed = false;
  for (size_t i = 0; i < slow.size() && !closed; ++i) {
    char c;
    closed = ::send(fd, &slow[i], 1, MSG_NOSIGNAL) != 1 || ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string out = read_until_close(fd, 3000);
  ::close(fd);
  EXPECT_EQ(out.rfind("HTTP/1.1 408", 0), 0u) << out;
  EXPECT_NE(out.find("headers did not arrive within 0.4 s"), std::string::npos) << out;
  EXPECT_LT(seconds_since(t0), 1.5);
  // A body that stops short.
  fd = connect_fd();
  std::string part = "POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
  ::send(fd, part.data(), part.size(), MSG_NOSIGNAL);
  out = read_until_close(fd, 3000);
  ::close(fd);
  EXPECT_EQ(out.rfind("HTTP/1.1 408", 0), 0u) << out;
  EXPECT_NE(out.find("body did not arrive"), std::string::npos) << out;
}

TEST_F(HttpTest, SlowClientsDoNotStarveTheServer) {
  ServerOptions o = default_options();
  o.max_connections = 40;
  o.header_timeout_ms = 1500;
  restart(o);
  // Far more half-sent requests than the cap, each trickling a byte: they cost no thread, and each new
  // connection replaces the stalest of them.
  std::vector<int> slow;
  for (int i = 0; i < 150; ++i) {
    int fd = connect_fd();
    ::send(fd, "G", 1, MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE(server_->open_connections(), 40);
  for (int round = 0; round < 3; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    std::string out = exchange("GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n", false);
    EXPECT_NE(out.find("GET /ok"), std::string::npos) << out;
    EXPECT_LT(seconds_since(t0), 0.5);
    for (int fd : slow) ::send(fd, "E", 1, MSG_NOSIGNAL);
  }
  // The ones still open when their header deadline passes are answered 408 and closed.
  std::this_thread::sleep_for(std::chrono::milliseconds(1700));
  int timed_out = 0;
  for (int fd : slow) {
    std::string out = read_until_close(fd, 200);
    timed_out += out.rfind("HTTP/1.1 408", 0) == 0;
    ::close(fd);
  }
  EXPECT_GT(timed_out, 0);
  EXPECT_LE(timed_out, 40);
}

TEST_F(HttpTest, PerClientConnectionCap) {
  // Loopback is exempt (a local proxy is one address for everyone), so this needs an address of this host
  // that is not loopback.
  in_addr_t own = 0;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i && !own; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && !(i->ifa_flags & IFF_LOOPBACK) && (i->ifa_flags & IFF_UP))
        own = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    ::freeifaddrs(ifs);
  }
  if (!own) GTEST_SKIP() << "no non-loopback IPv4 address on this host";
  ServerOptions o = default_options();
  o.host = "0.0.0.0";
  o.max_connections_per_client = 3;
  restart(o);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(connect_fd(own));
  int extra = connect_fd(own);
  std::string out = read_until_close(extra, 2000);
  ::close(extra);
  EXPECT_EQ(out.rfind("HTTP/1.1 429", 0), 0u) << out;
  EXPECT_NE(out.find("too many open connections from"), std::string::npos) << out;
  // Loopback clients are not limited by it.
  EXPECT_NE(exchange("GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n").find("GET /ok"), std::string::npos);
  for (int fd : held) ::close(fd);
}

}  // namespace
}  // namespace arbor::http
