// libFuzzer target for the HTTP request parser and the bounded JSON reader: arbitrary bytes, fed whole and
// in pieces of several sizes, must give the same requests (pipelined ones included) and end the same way
// (more needed, or an error with a status and a message), within the header and body limits; every body
// read as JSON must parse within the depth limit and round-trip, or be refused with a message.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/http_parser.h"
#include "server/json_body.h"

namespace {

[[noreturn]] void broken(const char* what) {
  fprintf(stderr, "fuzz_http_request: invariant broken: %s\n", what);
  abort();
}

constexpr size_t kMaxHeader = 512, kMaxBody = 4096;

struct Outcome {
  std::vector<std::string> requests;  // method, target, headers and body of each request parsed
  bool failed = false;
  bool operator==(const Outcome& o) const { return requests == o.requests && failed == o.failed; }
};

Outcome run(const std::string& bytes, size_t step) {
  using arbor::http::RequestParser;
  Outcome out;
  RequestParser p(kMaxHeader, kMaxBody);
  std::string buf;
  size_t pos = 0;
  for (;;) {
    const size_t n = step == 0 ? bytes.size() - pos : std::min(step, bytes.size() - pos);
    buf.append(bytes, pos, n);
    pos += n;
    RequestParser::Status s = p.parse(buf);
    while (s == RequestParser::Status::Done) {
      arbor::http::Request r = p.take_request();
      if (r.body.size() > kMaxBody) broken("body over the limit");
      std::string rec = r.method + ' ' + r.target + '\n';
      for (const auto& [k, v] : r.headers) rec += k + ": " + v + '\n';
      out.requests.push_back(rec + '\n' + r.body);
      p.reset();
      s = p.parse(buf);
    }
    if (s == RequestParser::Status::Error) {
      const int st = p.error_status();
      if (st != 400 && st != 413 && st != 431 && st != 501 && st != 505) broken("unexpected error status");
      if (p.error_message().empty()) broken("an error without a message");
      out.failed = true;
      return out;
    }
    if (pos == bytes.size()) return out;
  }
}

int depth_of(const arbor::json& j) {  // iterative: the value may be as deep as the limit allows
  int deepest = 0;
  std::vector<std::pair<const arbor::json*, int>> todo = {{&j, 0}};
  while (!todo.empty()) {
    auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    for (const auto& x : *v) todo.push_back({&x, d + 1});
  }
  return deepest;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const Outcome whole = run(bytes, 0);
  for (size_t step : {size_t(1), size_t(3), size_t(64)})
    if (!(run(bytes, step) == whole)) broken("fed in pieces, the bytes parse differently than whole");

  // The bytes (and each body) as client JSON.
  std::vector<std::string> texts = {bytes};
  for (const auto& r : whole.requests) texts.push_back(r.substr(r.find("\n\n") + 2));
  for (const auto& t : texts) {
    arbor::server::JsonReadError err;
    std::optional<arbor::json> j = arbor::server::read_json<arbor::json>(t, &err);
    if (!j) {
      if (err.message.empty()) broken("JSON refused without a message");
      continue;
    }
    if (depth_of(*j) > arbor::server::kMaxJsonDepth) broken("JSON deeper than the limit accepted");
    if (arbor::json::parse(j->dump()) != *j) broken("JSON does not round-trip");
  }
  return 0;
}
