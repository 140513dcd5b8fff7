// A small HTTP/1.1 server over POSIX sockets. One thread (the reactor) accepts connections and reads
// requests from all of them without blocking, under deadlines; a request is handed to a thread of its own
// only once it has arrived whole, so idle and slow clients hold a socket, never a thread. Keep-alive,
// pipelining, Content-Length and chunked request bodies with size limits (parsing: http_parser.h),
// chunked streaming responses, and a non-blocking "has the client gone away" probe so a handler can
// cancel work for a closed connection.
// (Debian's cpp-httplib ships as a split library that the build does not link; this keeps the server
// self-contained and gives it the disconnect detection httplib 0.11 lacks.)
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
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
  // nonblocking: writes that would block fail instead of waiting (the reactor's short error answers).
  ResponseWriter(int fd, bool keep_alive, bool nonblocking = false) : fd_(fd), keep_alive_(keep_alive), nonblocking_(nonblocking) {}
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
  bool keep_alive_, nonblocking_;
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
  // Open sockets, idle and half-read ones included (each costs a descriptor and its buffer, no thread).
  // At the cap a new connection replaces the stalest one that has no request being answered; when every
  // one has, it gets 503. Lowered to fit the process's descriptor limit.
  int max_connections = 1024;
  // Open sockets from one client address (beyond: 429 and closed). Loopback clients are not counted: a
  // reverse proxy on the same host is one address for all of its users.
  int max_connections_per_client = 64;
  int max_active_requests = 256;  // requests being answered at once (a thread each); beyond: 503
  int idle_timeout_ms = 5000;     // a connection with no request (clients keep theirs ~4 s)
  int header_timeout_ms = 10000;  // from a request's first byte to the end of its headers; then 408
  int body_timeout_ms = 30000;    // from the end of the headers to the end of the body; then 408
  int send_timeout_ms = 10000;    // one write to a client that stopped reading
};

class Server {
 public:
  Server(ServerOptions opt, Handler handler);
  ~Server();
  // Binds and listens; throws arbor::Error naming the address on failure.
  void listen();
  int port() const { return port_; }
  // Accepts and reads requests until stop(); then waits for the requests being answered to end.
  void run();
  // Thread-safe and async-signal-unsafe: call from a normal thread. Stops accepting; connections without a
  // request being answered close.
  void stop();
  int open_connections() const { return open_.load(); }
  const ServerOptions& options() const { return opt_; }

 private:
  struct Conn;
  void accept_new();
  bool evict_stalest();
  void read_from(Conn& c);
  void advance(Conn& c);  // parses what arrived: answers an error, hands a whole request to a thread, or waits
  void dispatch(Conn& c);
  void answer_error(Conn& c, int status, const std::string& message);
  void close_connection(Conn& c);
  void take_returned();
  void wake();
  ServerOptions opt_;
  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  // Reactor thread only: the connections it reads from, and open sockets per client address.
  std::vector<std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, int> per_client_;
  int64_t accept_paused_until_ms_ = 0;  // after EMFILE: the listening socket is not polled until then
  std::atomic<int> open_{0}, busy_{0};  // open sockets; requests being answered
  std::mutex returned_mu_;
  std::vector<std::pair<Conn*, bool>> returned_;  // answered connections for the reactor (and: close it)
};

// Writes an OpenAI-style error body {"error":{"message","type","param","code"}}.
std::string error_body(const std::string& message, const std::string& type, const std::string& param = "",
                       const std::string& code = "");
const char* status_text(int status);

}  // namespace arbor::http
