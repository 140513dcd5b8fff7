// A small HTTP/1.1 server over POSIX sockets: one thread per connection (bounded), keep-alive,
// Content-Length and chunked request bodies with a size limit, chunked streaming responses, and a
// non-blocking "has the client gone away" probe so a handler can cancel work for a closed connection.
// (Debian's cpp-httplib ships as a split library that the build does not link; this keeps the server
// self-contained and gives it the disconnect detection httplib 0.11 lacks.)
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace arbor::http {

struct Request {
  std::string method, target, path, query;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::string header(const std::string& lower_name) const;  // "" when absent
};

// Writes one response. Either send() once, or begin_stream() + write_chunk()... + end_stream().
class ResponseWriter {
 public:
  ResponseWriter(int fd, bool keep_alive) : fd_(fd), keep_alive_(keep_alive) {}
  bool send(int status, const std::string& content_type, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& extra_headers = {});
  bool begin_stream(int status, const std::string& content_type);
  bool write_chunk(const std::string& data);  // false once the client is gone
  bool end_stream();
  // True when the peer closed its side or the socket failed (checked without blocking).
  bool client_gone();
  bool started() const { return started_; }
  bool streaming() const { return streaming_; }
  bool ended() const { return ended_; }
  bool failed() const { return failed_; }
  void set_keep_alive(bool k) { keep_alive_ = k; }
  // A header every response of this writer carries (send and begin_stream), e.g. CORS headers.
  void add_header(std::string name, std::string value) { headers_.emplace_back(std::move(name), std::move(value)); }
  bool keep_alive() const { return keep_alive_; }
  int status() const { return status_; }

 private:
  bool write_all(const char* p, size_t n);
  int fd_;
  bool keep_alive_;
  bool started_ = false, failed_ = false, streaming_ = false, ended_ = false;
  int status_ = 0;
  std::vector<std::pair<std::string, std::string>> headers_;
  std::string header_lines(const std::vector<std::pair<std::string, std::string>>& extra = {}) const;
};

using Handler = std::function<void(const Request&, ResponseWriter&)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0 = any free port (see Server::port())
  size_t max_body_bytes = 8u << 20;     // larger bodies get 413
  size_t max_header_bytes = 64u << 10;  // larger headers get 431
  int max_connections = 256;            // beyond this new connections get 503 and are closed
  int idle_timeout_ms = 5000;           // keep-alive connection with no request (clients keep theirs ~4 s)
  int read_timeout_ms = 10000;          // a request that stalls mid-way
};

class Server {
 public:
  Server(ServerOptions opt, Handler handler);
  ~Server();
  // Binds and listens; throws arbor::Error naming the address on failure.
  void listen();
  int port() const { return port_; }
  // Accepts until stop(); then waits for connection threads to end.
  void run();
  // Thread-safe and async-signal-unsafe: call from a normal thread. Stops accepting; idle connections close.
  void stop();
  int active_connections() const { return active_.load(); }

 private:
  void serve_connection(int fd);
  ServerOptions opt_;
  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Writes an OpenAI-style error body {"error":{"message","type","param","code"}}.
std::string error_body(const std::string& message, const std::string& type, const std::string& param = "",
                       const std::string& code = "");
const char* status_text(int status);

}  // namespace arbor::http
