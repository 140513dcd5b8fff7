// HTTP layer over real sockets: keep-alive with pipelined requests, chunked request bodies, body and header
// limits, Expect: 100-continue, chunked streaming responses, disconnect detection, stop().
#include <arpa/inet.h>
#include <gtest/gtest.h>
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
  void SetUp() override {
    ServerOptions o;
    o.port = 0;
    o.max_body_bytes = 1000;
    o.max_header_bytes = 2000;
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
  int connect_fd() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(server_->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
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
  EXPECT_EQ(exchange("POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n").rfind("HTTP/1.1 501", 0), 0u);
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

}  // namespace
}  // namespace arbor::http
