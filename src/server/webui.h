// The chat page GET / serves to browsers: src/server/webui/index.html, compiled in by CMakeLists.txt.
#pragma once

namespace arbor::server {
const char* webui_page();
}  // namespace arbor::server
