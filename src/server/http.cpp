// HTTP/1.1 over POSIX sockets: accept loop, request parsing with limits, keep-alive, chunked responses.
#include "server/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/json.h"

namespace arbor::http {

const char* status_text(int s) {
  switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
  }
  return "Unknown";
}

std::string error_body(const std::string& message, const std::string& type, const std::string& param, const std::string& code) {
  json e = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string Request::header(const std::string& lower_name) const {
  for (const auto& [k, v] : headers)
    if (k == lower_name) return v;
  return {};
}

bool ResponseWriter::write_all(const char* p, size_t n) {
  if (failed_) return false;
  while (n > 0) {
    ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // send timeout: the client stopped reading
      failed_ = true;
      return false;
    }
    if (w <= 0) {
      failed_ = true;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

std::string ResponseWriter::header_lines(const std::vector<std::pair<std::string, std::string>>& extra) const {
  std::string h;
  for (const auto& [k, v] : headers_) h += k + ": " + v + "\r\n";
  for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
  return h;
}

bool ResponseWriter::send(int status, const std::string& content_type, const std::string& body,
                          const std::vector<std::pair<std::string, std::string>>& extra) {
  started_ = true;
  status_ = status;
  std::string h = fmt::format("HTTP/1.1 {} {}\r\n", status, status_text(status));
  // 204 carries neither a body nor its headers (RFC 9110 8.6).
  if (status != 204) h += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", content_type, body.size());
  h += fmt::format("Connection: {}\r\n", keep_alive_ ? "keep-alive" : "close");
  h += header_lines(extra);
  h += "\r\n";
  if (status != 204) h += body;
  return write_all(h.data(), h.size());
}

bool ResponseWriter::begin_stream(int status, const std::string& content_type) {
  started_ = true;
  streaming_ = true;
  status_ = status;
  std::string h = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: {}\r\n",
      status, status_text(status), content_type, keep_alive_ ? "keep-alive" : "close");
  h += header_lines();
  h += "\r\n";
  return write_all(h.data(), h.size());
}

bool ResponseWriter::write_chunk(const std::string& data) {
  if (data.empty()) return !failed_;
  std::string c = fmt::format("{:x}\r\n", data.size());
  c += data;
  c += "\r\n";
  return write_all(c.data(), c.size());
}

bool ResponseWriter::end_stream() {
  ended_ = true;
  return write_all("0\r\n\r\n", 5);
}

bool ResponseWriter::client_gone() {
  if (failed_) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  int r = ::poll(&p, 1, 0);
  if (r <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

Server::Server(ServerOptions opt, Handler handler) : opt_(std::move(opt)), handler_(std::move(handler)) {}

Server::~Server() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_pipe_)
    if (fd >= 0) ::close(fd);
}

void Server::listen() {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  std::string port = std::to_string(opt_.port);
  int rc = ::getaddrinfo(opt_.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) fail("server: cannot resolve host '{}': {}", opt_.host, gai_strerror(rc));
  std::string last_err = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 512) == 0) {
      listen_fd_ = fd;
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      break;
    }
    last_err = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) fail("server: cannot listen on {}:{}: {}", opt_.host, opt_.port, last_err);
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) fail("server: pipe2 failed: {}", std::strerror(errno));
}

void Server::stop() {
  stopping_.store(true);
  if (wake_pipe_[1] >= 0) {
    char c = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_pipe_[1], &c, 1);
  }
}

void Server::run() {
  ARBOR_CHECK(listen_fd_ >= 0, "server: run() before listen()");
  while (!stopping_.load()) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    int r = ::poll(p, 2, 500);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0 || !(p[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{opt_.read_timeout_ms / 1000, (opt_.read_timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // a client that stops reading cannot pin a thread
    if (active_.load() >= opt_.max_connections) {
      ResponseWriter w(fd, false);
      w.send(503, "application/json", error_body("too many open connections", "server_error", "", "server_overloaded"));
      ::close(fd);
      continue;
    }
    active_ += 1;
    std::thread([this, fd] {
      try {
        serve_connection(fd);
      } catch (...) {  // nothing a connection does may take the process down
      }
      ::close(fd);
      {
        std::lock_guard<std::mutex> lk(mu_);
        active_ -= 1;
      }
      cv_.notify_all();
    }).detach();
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return active_.load() == 0; });
}

namespace {

enum class ReadResult { Ok, Closed, Timeout, Stopping };

// Reads more bytes into buf, waiting at most timeout_ms (in slices, so stop() is noticed).
ReadResult read_more(int fd, std::string& buf, int timeout_ms, const std::atomic<bool>& stopping, bool idle) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (idle && stopping.load()) return ReadResult::Stopping;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, 100);
    if (r < 0 && errno != EINTR) return ReadResult::Closed;
    if (r > 0) {
      char tmp[16384];
      ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) return ReadResult::Closed;
      buf.append(tmp, size_t(n));
      return ReadResult::Ok;
    }
    if (std::chrono::steady_clock::now() >= deadline) return ReadResult::Timeout;
  }
}

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

bool parse_size(const std::string& s, int base, uint64_t& out) {
  if (s.empty() || s.size() > 16) return false;
  out = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : base == 16 && c >= 'a' && c <= 'f' ? c - 'a' + 10 : base == 16 && c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return false;
    out = out * uint64_t(base) + uint64_t(d);
  }
  return true;
}

}  // namespace

void Server::serve_connection(int fd) {
  std::string buf;
  auto reply_error = [&](int status, const std::string& msg) {
    ResponseWriter w(fd, false);
    w.send(status, "application/json",
           error_body(msg, status == 413 ? "invalid_request_error" : status >= 500 ? "server_error" : "invalid_request_error"));
    // Lingering close: a client still sending (a body over the limit) would otherwise get a reset instead of
    // the answer. Discard what it sends for a bounded time and amount.
    ::shutdown(fd, SHUT_WR);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    size_t drained = 0;
    std::string sink;
    while (drained < (size_t(256) << 20) && std::chrono::steady_clock::now() < until) {
      sink.clear();
      if (read_more(fd, sink, 200, stopping_, false) != ReadResult::Ok) break;
      drained += sink.size();
    }
  };
  for (;;) {
    // Headers.
    size_t hdr_end;
    bool first = true;
    while ((hdr_end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (buf.size() > opt_.max_header_bytes) return reply_error(431, fmt::format("request headers exceed {} bytes", opt_.max_header_bytes));
      ReadResult r = read_more(fd, buf, buf.empty() ? opt_.idle_timeout_ms : opt_.read_timeout_ms, stopping_, buf.empty());
      if (r == ReadResult::Timeout && !buf.empty()) return reply_error(408, "timed out reading the request headers");
      if (r != ReadResult::Ok) return;
      first = false;
    }
    (void)first;
    if (hdr_end > opt_.max_header_bytes) return reply_error(431, fmt::format("request headers exceed {} bytes", opt_.max_header_bytes));
    Request req;
    std::string head = buf.substr(0, hdr_end);
    buf.erase(0, hdr_end + 4);
    size_t line_end = head.find("\r\n");
    std::string line = head.substr(0, line_end);
    size_t s1 = line.find(' '), s2 = line.rfind(' ');
    if (s1 == std::string::npos || s2 == s1) return reply_error(400, "malformed request line");
    req.method = line.substr(0, s1);
    req.target = line.substr(s1 + 1, s2 - s1 - 1);
    std::string version = line.substr(s2 + 1);
    if (version != "HTTP/1.1" && version != "HTTP/1.0") return reply_error(version.rfind("HTTP/", 0) == 0 ? 505 : 400, "unsupported HTTP version");
    if (req.method.empty() || req.target.empty() || req.target[0] != '/') return reply_error(400, "malformed request line");
    size_t q = req.target.find('?');
    req.path = req.target.substr(0, q);
    if (q != std::string::npos) req.query = req.target.substr(q + 1);
    size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
      size_t e = head.find("\r\n", pos);
      if (e == std::string::npos) e = head.size();
      std::string h = head.substr(pos, e - pos);
      pos = e + 2;
      size_t colon = h.find(':');
      if (colon == std::string::npos || colon == 0) return reply_error(400, "malformed header line");
      req.headers.emplace_back(lower(h.substr(0, colon)), trim(h.substr(colon + 1)));
    }
    bool keep_alive = version == "HTTP/1.1" ? lower(req.header("connection")) != "close" : lower(req.header("connection")) == "keep-alive";

    // Body.
    std::string te = lower(req.header("transfer-encoding"));
    std::string cl = req.header("content-length");
    bool expect_continue = lower(req.header("expect")) == "100-continue";
    auto send_continue = [&] {
      if (!expect_continue) return;
      expect_continue = false;
      [[maybe_unused]] ssize_t n = ::send(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL);
    };
    auto fill = [&](size_t need) {
      while (buf.size() < need) {
        ReadResult r = read_more(fd, buf, opt_.read_timeout_ms, stopping_, false);
        if (r != ReadResult::Ok) return false;
      }
      return true;
    };
    if (!te.empty()) {
      if (te != "chunked") return reply_error(501, fmt::format("transfer-encoding '{}' is not supported", te));
      send_continue();
      for (;;) {
        size_t e;
        while ((e = buf.find("\r\n")) == std::string::npos) {
          if (buf.size() > 64) return reply_error(400, "malformed chunk size line");
          if (!fill(buf.size() + 1)) return;
        }
        std::string sz = buf.substr(0, e);
        size_t semi = sz.find(';');
        if (semi != std::string::npos) sz.resize(semi);
        uint64_t n;
        if (!parse_size(trim(sz), 16, n)) return reply_error(400, "malformed chunk size");
        if (n > opt_.max_body_bytes || req.body.size() + n > opt_.max_body_bytes)
          return reply_error(413, fmt::format("request body exceeds the limit of {} bytes", opt_.max_body_bytes));
        if (!fill(e + 2 + n + 2)) return;
        if (buf.compare(e + 2 + n, 2, "\r\n") != 0) return reply_error(400, "malformed chunk terminator");
        req.body.append(buf, e + 2, n);
        buf.erase(0, e + 2 + n + 2);
        if (n == 0) break;
      }
    } else if (!cl.empty()) {
      uint64_t n;
      if (!parse_size(cl, 10, n)) return reply_error(400, fmt::format("malformed Content-Length '{}'", cl.substr(0, 32)));
      if (n > opt_.max_body_bytes) return reply_error(413, fmt::format("request body of {} bytes exceeds the limit of {} bytes", n, opt_.max_body_bytes));
      send_continue();
      if (!fill(n)) return;
      req.body = buf.substr(0, n);
      buf.erase(0, n);
    }

    ResponseWriter w(fd, keep_alive && !stopping_.load());
    handler_(req, w);
    if (!w.started()) w.send(500, "application/json", error_body("the handler sent no response", "server_error"));
    if (w.streaming() && !w.ended()) return;  // a stream the handler did not finish: only closing ends it
    if (w.failed() || !w.keep_alive() || stopping_.load()) return;
  }
}

}  // namespace arbor::http
