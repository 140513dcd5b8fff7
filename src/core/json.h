// JSON helpers: read a file into nlohmann::json with errors that name the file and position.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace arbor {

using json = nlohmann::json;

json read_json_file(const std::string& path);  // throws arbor::Error "json: <path>: <cause>"
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);

}  // namespace arbor
