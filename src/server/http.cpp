// HTTP/1.1 over POSIX sockets: the reactor (accepting, reading requests under deadlines and connection
// caps), a thread per request being answered, keep-alive, chunked responses.
#include "server/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/json.h"
#include "server/http_parser.h"

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
    ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL | (nonblocking_ ? MSG_DONTWAIT : 0));
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


namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The client's address as text, and whether it is a loopback one (127.0.0.0/8, ::1, or v4-mapped 127.x).
std::pair<std::string, bool> client_address(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return {host, (ntohl(a->sin_addr.s_addr) >> 24) == 127};
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    const bool mapped_loopback = IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127;
    return {host, IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) || mapped_loopback};
  }
  return {"unknown", false};
}

constexpr int kLingerMs = 2000;                   // after an error answer, a client still sending is drained this long
constexpr size_t kLingerBytes = size_t(256) << 20;  // ... or this much
constexpr size_t kReadSlice = size_t(256) << 10;    // bytes read from one connection per round (fairness)

}  // namespace

// One client connection. The reactor owns it; while its request is answered (Answering) a worker thread
// uses its socket and the reactor leaves it alone.
struct Server::Conn {
  enum class State { Idle, Reading, Lingering, Answering };
  Conn(int fd, std::string client, bool loopback, const ServerOptions& o)
      : fd(fd), client(std::move(client)), loopback(loopback), parser(o.max_header_bytes, o.max_body_bytes) {}
  int fd;
  std::string client;
  bool loopback;
  State state = State::Idle;
  std::string buf;  // received, not yet parsed
  RequestParser parser;
  int64_t since_ms = 0, deadline_ms = 0;  // when the state began (eviction takes the oldest); when it times out
  bool body_deadline_set = false;
  bool peer_closed = false;  // the client shut its side (a request already received is still answered)
  size_t discarded = 0;      // Lingering: bytes read and dropped
};

Server::Server(ServerOptions opt, Handler handler) : opt_(std::move(opt)), handler_(std::move(handler)) {}

Server::~Server() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_pipe_)
    if (fd >= 0) ::close(fd);
  for (auto& c : conns_)
    if (c->fd >= 0 && c->state != Conn::State::Answering) ::close(c->fd);
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
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
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
  // Every open connection is a descriptor: raise the soft limit to what the cap needs (up to the hard
  // limit), or lower the cap to fit, keeping 256 for the model's files and the rest of the process.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const rlim_t want = rlim_t(opt_.max_connections) + 256;
    if (rl.rlim_cur < want) {
      rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
      ::setrlimit(RLIMIT_NOFILE, &rl);
      ::getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < want) opt_.max_connections = std::max(16, int(rl.rlim_cur) - 256);
  }
}

void Server::wake() {
  if (wake_pipe_[1] >= 0) {
    char c = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_pipe_[1], &c, 1);
  }
}

void Server::stop() {
  stopping_.store(true);
  wake();
}

void Server::close_connection(Conn& c) {
  if (c.fd < 0) return;
  ::close(c.fd);
  c.fd = -1;
  open_ -= 1;
  if (!c.loopback)
    if (auto it = per_client_.find(c.client); it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
}

void Server::answer_error(Conn& c, int status, const std::string& message) {
  ResponseWriter w(c.fd, false, /*nonblocking=*/true);
  w.send(status, "application/json", error_body(message, status >= 500 ? "server_error" : "invalid_request_error"));
  // Lingering close: a client still sending (a body over the limit) would otherwise get a reset instead of
  // the answer. What it sends is read and dropped for a bounded time and amount.
  ::shutdown(c.fd, SHUT_WR);
  c.state = Conn::State::Lingering;
  c.deadline_ms = now_ms() + kLingerMs;
  c.discarded = 0;
  if (c.peer_closed) close_connection(c);
}

// The connection to give up for a new one when every socket is taken: one already closing, else the one
// that has held its place longest without a whole request (idle, or still arriving). Never one whose
// request is being answered. A fresh connection is the newest, so a flood of slow ones cannot push out a
// real request between its accept and its first read.
bool Server::evict_stalest() {
  Conn* best = nullptr;
  auto rank = [](const Conn& c) { return c.state == Conn::State::Lingering ? 0 : 1; };
  for (auto& c : conns_) {
    if (c->fd < 0 || c->state == Conn::State::Answering) continue;
    if (!best || rank(*c) < rank(*best) || (rank(*c) == rank(*best) && c->since_ms < best->since_ms)) best = c.get();
  }
  if (!best) return false;
  close_connection(*best);
  return true;
}

void Server::accept_new() {
  for (int k = 0; k < 64; ++k) {  // a bounded batch per round, so reading is not starved by a flood
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: the pending connection keeps the socket readable; look again a little later.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) accept_paused_until_ms_ = now_ms() + 100;
      return;
    }
    auto [client, loopback] = client_address(ss);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{opt_.send_timeout_ms / 1000, (opt_.send_timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // a client that stops reading cannot pin a thread
    auto refuse = [&](int status, const std::string& why) {
      ResponseWriter w(fd, false, /*nonblocking=*/true);
      w.send(status, "application/json", error_body(why, status >= 500 ? "server_error" : "invalid_request_error", "", "too_many_connections"));
      ::close(fd);
    };
    if (!loopback) {
      auto it = per_client_.find(client);
      if (it != per_client_.end() && it->second >= opt_.max_connections_per_client) {
        refuse(429, fmt::format("too many open connections from {} (at most {})", client, opt_.max_connections_per_client));
        continue;
      }
    }
    if (open_.load() >= opt_.max_connections && !evict_stalest()) {
      refuse(503, fmt::format("too many open connections (at most {}, all with a request being answered)", opt_.max_connections));
      continue;
    }
    open_ += 1;
    if (!loopback) per_client_[client] += 1;
    auto c = std::make_unique<Conn>(fd, client, loopback, opt_);
    c->since_ms = now_ms();
    c->deadline_ms = c->since_ms + opt_.idle_timeout_ms;
    conns_.push_back(std::move(c));
  }
}

void Server::read_from(Conn& c) {
  char tmp[65536];
  size_t got = 0;
  while (got < kReadSlice) {
    ssize_t n = ::recv(c.fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n > 0) {
      got += size_t(n);
      if (c.state != Conn::State::Lingering) {
        c.buf.append(tmp, size_t(n));
        // No request is larger than its headers and body limits; stop reading once a pipeline piles up
        // beyond that (the parser reports the limit; the rest waits in the kernel).
        if (c.buf.size() > opt_.max_header_bytes + opt_.max_body_bytes + 65536) break;
      } else if ((c.discarded += size_t(n)) > kLingerBytes) {
        close_connection(c);
        return;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.peer_closed = true;  // 0: the client shut its side; < 0: the socket failed
    return;
  }
}

void Server::advance(Conn& c) {
  if (c.fd < 0 || c.state == Conn::State::Answering) return;
  if (c.state == Conn::State::Lingering) {
    if (c.peer_closed) close_connection(c);
    return;
  }
  const int64_t now = now_ms();
  if (c.state == Conn::State::Idle) {
    if (c.buf.empty()) {
      if (c.peer_closed) close_connection(c);
      return;
    }
    c.state = Conn::State::Reading;
    c.since_ms = now;
    c.deadline_ms = now + opt_.header_timeout_ms;
  }
  RequestParser::Status st = c.parser.parse(c.buf);
  if (st == RequestParser::Status::Error) return answer_error(c, c.parser.error_status(), c.parser.error_message());
  if (c.parser.headers_done() && !c.body_deadline_set) {
    c.body_deadline_set = true;
    c.deadline_ms = now + opt_.body_timeout_ms;
  }
  if (c.parser.take_continue())
    [[maybe_unused]] ssize_t n = ::send(c.fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (st == RequestParser::Status::Done) return dispatch(c);
  if (c.peer_closed) close_connection(c);  // a request cut short: there is nothing to answer
}

void Server::dispatch(Conn& c) {
  if (busy_.load() >= opt_.max_active_requests)
    return answer_error(c, 503, fmt::format("too many requests in progress (at most {}); try again shortly", opt_.max_active_requests));
  c.state = Conn::State::Answering;
  const bool keep_alive = c.parser.keep_alive();
  busy_ += 1;
  try {
    std::thread([this, conn = &c, fd = c.fd, keep_alive, req = c.parser.take_request()] {
      ResponseWriter w(fd, keep_alive && !stopping_.load());
      try {
        handler_(req, w);
      } catch (...) {  // nothing a request does may take the process down
      }
      if (!w.started()) w.send(500, "application/json", error_body("the handler sent no response", "server_error"));
      // A stream the handler did not finish can only be ended by closing.
      const bool close = (w.streaming() && !w.ended()) || w.failed() || !w.keep_alive();
      {
        std::lock_guard<std::mutex> lk(returned_mu_);
        returned_.emplace_back(conn, close);
      }
      wake();
      busy_ -= 1;  // last: once it is 0 the reactor may return from run()
    }).detach();
  } catch (const std::system_error&) {
    busy_ -= 1;
    c.state = Conn::State::Reading;
    answer_error(c, 503, "the server cannot start a thread for the request; try again shortly");
  }
}

void Server::take_returned() {
  std::vector<std::pair<Conn*, bool>> back;
  {
    std::lock_guard<std::mutex> lk(returned_mu_);
    back.swap(returned_);
  }
  const int64_t now = now_ms();
  for (auto [c, close] : back) {
    if (close || stopping_.load()) {
      close_connection(*c);
      continue;
    }
    c->state = Conn::State::Idle;
    c->parser.reset();
    c->body_deadline_set = false;
    c->since_ms = now;
    c->deadline_ms = now + opt_.idle_timeout_ms;
    advance(*c);  // a pipelined request may be waiting in the buffer already (answered even after the client shut its side)
  }
}

void Server::run() {
  ARBOR_CHECK(listen_fd_ >= 0, "server: run() before listen()");
  std::vector<pollfd> fds;
  for (;;) {
    take_returned();
    const bool stopping = stopping_.load();
    if (stopping) {
      if (listen_fd_ >= 0) ::close(listen_fd_);
      listen_fd_ = -1;
      for (auto& c : conns_)
        if (c->state != Conn::State::Answering) close_connection(*c);
    }
    int64_t now = now_ms();
    for (auto& c : conns_) {
      if (c->fd < 0 || c->state == Conn::State::Answering || now < c->deadline_ms) continue;
      if (c->state == Conn::State::Reading)
        answer_error(*c, 408, c->parser.headers_done()
                                  ? fmt::format("the request body did not arrive within {} s", opt_.body_timeout_ms / 1000.0)
                                  : fmt::format("the request headers did not arrive within {} s", opt_.header_timeout_ms / 1000.0));
      else
        close_connection(*c);  // idle, or done lingering
    }
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const auto& c) { return c->fd < 0; }), conns_.end());
    if (stopping && conns_.empty() && busy_.load() == 0) break;

    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    const bool poll_listen = listen_fd_ >= 0 && now >= accept_paused_until_ms_;
    fds.push_back({poll_listen ? listen_fd_ : -1, POLLIN, 0});
    int64_t next = now + (stopping ? 50 : 500);
    if (!poll_listen && listen_fd_ >= 0) next = std::min(next, accept_paused_until_ms_);
    const size_t polled = conns_.size();
    for (auto& c : conns_) {
      const bool watch = c->state != Conn::State::Answering;
      fds.push_back({watch ? c->fd : -1, POLLIN | POLLRDHUP, 0});
      if (watch) next = std::min(next, c->deadline_ms);
    }
    int r = ::poll(fds.data(), fds.size(), int(std::max<int64_t>(0, next - now)));
    if (r < 0 && errno != EINTR) fail("server: poll failed: {}", std::strerror(errno));
    if (r <= 0) continue;
    if (fds[0].revents & POLLIN) {
      char drain[64];
      while (::read(wake_pipe_[0], drain, sizeof drain) > 0) {
      }
    }
    for (size_t i = 0; i < polled; ++i) {
      Conn& c = *conns_[i];
      if (!fds[i + 2].revents || c.fd < 0) continue;
      read_from(c);
      advance(c);
    }
    if (poll_listen && (fds[1].revents & POLLIN)) accept_new();
  }
}

}  // namespace arbor::http
