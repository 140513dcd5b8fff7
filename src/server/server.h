// ApiServer: the HTTP routes of `arbor serve` (OpenAI, Anthropic, health, metrics) over a ServerContext.
#pragma once
#include "server/context.h"
#include "server/http.h"

namespace arbor::server {

class ApiServer {
 public:
  ApiServer(ServerContext& ctx, http::ServerOptions opt);
  void listen() { http_.listen(); }  // throws arbor::Error naming the address
  int port() const { return http_.port(); }
  void run() { http_.run(); }   // until stop(); returns when every connection has ended
  void stop() { http_.stop(); }

  // Routes one request (public for tests).
  void handle(const http::Request& req, http::ResponseWriter& w);

 private:
  ServerContext& ctx_;
  http::Server http_;
};

}  // namespace arbor::server
