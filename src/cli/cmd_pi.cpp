// `arbor pi [--host H] [--port P] [--remove]`: writes (or removes) the pi coding agent's provider entry
// for a running arbor server in pi's models.json ($PI_CODING_AGENT_DIR, else ~/.pi/agent), keeping every
// other provider. The entry describes the served model as /v1/models reports it.
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli/args.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/json.h"

namespace arbor::cli {
namespace {

namespace fs = std::filesystem;

// GET http://host:port/path with Connection: close; returns the body of a 200 answer.
std::string http_get(const std::string& host, int port, const std::string& path) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) fail("pi: cannot resolve host '{}'", host);
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) fail("pi: no arbor server answers at http://{}:{} (start one with `arbor serve`)", host, port);
  std::string req = fmt::format("GET {} HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n\r\n", path, host, port);
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string resp;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, size_t(n));
  ::close(fd);
  size_t sp = resp.find(' '), body = resp.find("\r\n\r\n");
  if (sp == std::string::npos || body == std::string::npos) fail("pi: http://{}:{}{} sent a malformed answer", host, port, path);
  int status = std::atoi(resp.c_str() + sp + 1);
  if (status != 200) fail("pi: GET http://{}:{}{} answered {}: {}", host, port, path, status, resp.substr(body + 4, 300));
  return resp.substr(body + 4);
}

fs::path agent_dir() {
  if (const char* d = std::getenv("PI_CODING_AGENT_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  if (!home || !*home) fail("pi: neither PI_CODING_AGENT_DIR nor HOME is set");
  return fs::path(home) / ".pi" / "agent";
}

int cmd_pi(const std::vector<std::string>& args) {
  Args a(args, {"host", "port", "max-tokens"}, {"remove"});
  const std::string host = a.get_or("host", "127.0.0.1");
  const int64_t port = a.get_int("port", 8080);
  if (port <= 0 || port > 65535) fail("arguments: --port must be in 1..65535, got {}", port);
  const fs::path file = agent_dir() / "models.json";

  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (fs::exists(file)) {
    std::string text = read_text_file(file.string());
    if (!text.empty()) {
      doc = nlohmann::ordered_json::parse(text, nullptr, false);
      if (doc.is_discarded() || !doc.is_object()) fail("pi: {} is not a JSON object; fix or move it first", file.string());
    }
  }
  if (!doc.contains("providers")) doc["providers"] = nlohmann::ordered_json::object();
  if (!doc["providers"].is_object()) fail("pi: {}: 'providers' is not an object", file.string());

  if (a.has("remove")) {
    bool had = doc["providers"].erase("arbor") > 0;
    if (had) {
      std::ofstream(file) << doc.dump(2) << "\n";
      std::printf("removed provider 'arbor' from %s\n", file.string().c_str());
    } else {
      std::printf("%s has no provider 'arbor'; nothing to do\n", file.string().c_str());
    }
    return 0;
  }

  json models = json::parse(http_get(host, int(port), "/v1/models"), nullptr, false);
  if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() || models["data"].empty())
    fail("pi: http://{}:{}/v1/models did not list a model", host, port);
  const json& m = models["data"][0];
  const std::string name = m.value("id", std::string("arbor"));
  const int64_t ctx = m.value("context_window", int64_t(4096));
  const bool reasoning = m.value("reasoning", false), vision = m.value("vision", false);
  const int64_t max_tokens = a.get_int("max-tokens", std::min<int64_t>(ctx / 2, 16384));

  nlohmann::ordered_json compat = {{"supportsDeveloperRole", false}};
  if (reasoning) compat["thinkingFormat"] = "qwen-chat-template";
  nlohmann::ordered_json input = nlohmann::ordered_json::array({"text"});
  if (vision) input.push_back("image");  // a text-only template renders nothing for image parts
  nlohmann::ordered_json model = {{"id", "local"},
                                  {"name", name},
                                  {"reasoning", reasoning},
                                  {"input", input},
                                  {"contextWindow", ctx},
                                  {"maxTokens", max_tokens},
                                  {"cost", {{"input", 0}, {"output", 0}, {"cacheRead", 0}, {"cacheWrite", 0}}},
                                  {"compat", compat}};
  doc["providers"]["arbor"] = {{"baseUrl", fmt::format("http://{}:{}/v1", host, port)},
                               {"api", "openai-completions"},
                               {"apiKey", "arbor-local"},
                               {"models", nlohmann::ordered_json::array({model})}};
  fs::create_directories(file.parent_path());
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp);
    out << doc.dump(2) << "\n";
    if (!out) fail("pi: cannot write {}", tmp.string());
  }
  fs::rename(tmp, file);  // atomic: pi never reads a half-written file
  std::printf("wrote provider 'arbor' (model 'local' = %s, context %lld) to %s\nuse it with: pi --model arbor/local\n", name.c_str(),
              (long long)ctx, file.string().c_str());
  return 0;
}

ARBOR_VERB("pi", "write (or --remove) the pi coding agent's provider entry for a running server (--host, --port)", "[flags]",
           "  --host ADDR           the running server's address (default 127.0.0.1)\n"
           "  --port N              its port (default 8080)\n"
           "  --max-tokens N        the entry's longest reply (default: half the served context, at most 16384)\n"
           "  --remove              remove the entry instead (in $PI_CODING_AGENT_DIR or ~/.pi/agent, models.json)\n",
           cmd_pi);

}  // namespace
}  // namespace arbor::cli
