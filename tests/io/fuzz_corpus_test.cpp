// Replays the libFuzzer seed corpus (and any crash inputs kept there as regressions) through the parser in the
// unit tests, so the ASan+UBSan test build covers them too; and checks error messages stay bounded.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace arbor {
namespace {

TEST(SafetensorsCorpus, EveryInputParsesOrIsRefusedCleanly) {
  const std::filesystem::path dir = std::filesystem::path(ARBOR_SOURCE_DIR) / "fuzz/corpus/safetensors";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  int files = 0, parsed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), {});
    ++files;
    try {
      auto ts = parse_safetensors(b.data(), b.size(), e.path().filename().string());
      ++parsed;
      for (const auto& t : ts) {
        EXPECT_GE(t.data, b.data()) << e.path();
        EXPECT_LE(t.data + t.nbytes, b.data() + b.size()) << e.path();
        EXPECT_EQ(t.nbytes, size_t(t.numel()) * dtype_size(t.dtype)) << e.path();
      }
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(e.path().filename().string()), std::string::npos) << err.what();
    }
  }
  EXPECT_GE(files, 7);
  EXPECT_GE(parsed, 7);  // the hand-made seeds are all valid files
}

TEST(SafetensorsCorpus, MessagesAboutHugeNamesStayShort) {
  // A 100 kB tensor name must not become a 100 kB error message; the cut keeps UTF-8 whole ("é" is 2 bytes).
  std::string name;
  for (int i = 0; i < 50000; ++i) name += "é";
  auto b = test::raw_safetensors("{\"" + name + "\": {\"dtype\": \"Q\", \"shape\": [], \"data_offsets\": [0, 0]}}", 0);
  std::string e = test::error_of([&] { parse_safetensors(b.data(), b.size(), "long.safetensors"); });
  EXPECT_LT(e.size(), 600u) << e.size();
  EXPECT_NE(e.find("... (100000 bytes)"), std::string::npos) << e.substr(0, 300);
  EXPECT_NO_THROW((void)json(e).dump());  // still valid UTF-8
}

}  // namespace
}  // namespace arbor
