// Tests of Checkpoint: single-file, index-sharded and globbed directories, their consistency checks, and the
// consumed-tensor bookkeeping the weight audit relies on.
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <fstream>

#include "io_test_util.h"

namespace arbor {
namespace {

using test::error_of;
using test::random_bytes;
using test::TempDir;

// Writes a shard holding F32 tensors of shape [n] for the given names (n = 1 + index in the list).
void write_shard(const std::string& path, const std::vector<std::string>& names, uint32_t seed = 1) {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<TensorToWrite> w;
  for (size_t i = 0; i < names.size(); ++i) bufs.push_back(random_bytes(4 * (i + 1), seed + uint32_t(i)));
  for (size_t i = 0; i < names.size(); ++i)
    w.push_back({names[i], DType::F32, {int64_t(i + 1)}, bufs[i].data(), bufs[i].size()});
  write_safetensors(path, w);
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

void write_index(const TempDir& d, const json& weight_map) {
  write_text(d.file("model.safetensors.index.json"), json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TEST(Checkpoint, SingleFileTakeAndAudit) {
  TempDir d;
  write_shard(d.file("model.safetensors"), {"embed", "norm", "head"});
  Checkpoint c = Checkpoint::open(d.path());
  EXPECT_EQ(c.dir(), d.path());
  EXPECT_EQ(c.total_bytes(), 4u + 8 + 12);
  ASSERT_NE(c.find("norm"), nullptr);
  EXPECT_EQ(c.find("norm")->shape, std::vector<int64_t>{2});
  EXPECT_EQ(c.find("nope"), nullptr);

  std::string e = error_of([&] { c.check_all_consumed(); });
  EXPECT_TRUE(contains(e, "3 tensors are not used by the model: 'embed', 'head', 'norm'")) << e;

  EXPECT_EQ(c.take("embed").shape, std::vector<int64_t>{1});
  EXPECT_TRUE(c.consumed("embed"));
  EXPECT_FALSE(c.consumed("norm"));
  EXPECT_EQ(c.take_optional("absent.bias"), nullptr);
  e = error_of([&] { c.take("lm.weight"); });
  EXPECT_EQ(e, "checkpoint: " + d.path() + ": missing tensor 'lm.weight'");
  ASSERT_NE(c.take_optional("head"), nullptr);
  e = error_of([&] { c.check_all_consumed(); });
  EXPECT_TRUE(contains(e, "1 tensor is not used by the model: 'norm'")) << e;
  c.take("norm");
  EXPECT_NO_THROW(c.check_all_consumed());
}

TEST(Checkpoint, AuditListsTwentyThenCounts) {
  TempDir d;
  std::vector<std::string> names;
  for (int i = 0; i < 25; ++i) names.push_back(fmt::format("t{:02}", 24 - i));  // written out of order
  write_shard(d.file("model.safetensors"), names);
  Checkpoint c = Checkpoint::open(d.path());
  c.take("t00");
  std::string e = error_of([&] { c.check_all_consumed(); });
  EXPECT_TRUE(contains(e, "24 tensors are not used by the model: 't01', 't02',")) << e;
  EXPECT_TRUE(contains(e, "'t20' and 4 more")) << e;
  EXPECT_FALSE(contains(e, "'t21'")) << e;
  auto ts = c.tensors();
  ASSERT_EQ(ts.size(), 25u);
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(ts[i]->name, fmt::format("t{:02}", i));
}

TEST(Checkpoint, ShardedThroughIndex) {
  TempDir d;
  write_shard(d.file("model-00001-of-00002.safetensors"), {"a", "b"}, 10);
  write_shard(d.file("model-00002-of-00002.safetensors"), {"c"}, 20);
  // Not in the index (Mistral repos ship consolidated.safetensors beside the shards): must be ignored.
  write_shard(d.file("consolidated.safetensors"), {"a", "b", "c"}, 30);
  write_index(d, {{"a", "model-00001-of-00002.safetensors"},
                  {"b", "model-00001-of-00002.safetensors"},
                  {"c", "model-00002-of-00002.safetensors"}});
  Checkpoint c = Checkpoint::open(d.path());
  EXPECT_EQ(c.files().size(), 2u);
  EXPECT_EQ(c.tensors().size(), 3u);
  EXPECT_TRUE(contains(c.find("c")->file, "model-00002-of-00002.safetensors"));
  auto want = random_bytes(4, 20);
  EXPECT_EQ(std::vector<uint8_t>(c.find("c")->data, c.find("c")->data + 4), want);
  EXPECT_EQ(c.total_bytes(), 4u + 8 + 4);

  uint64_t seen = 0;
  int calls = 0;
  c.prefault([&](uint64_t n) { seen += n, ++calls; });
  EXPECT_EQ(seen, c.total_bytes());
  EXPECT_EQ(calls, 3);

  Checkpoint moved = std::move(c);  // the loader keeps it in a member
  moved.take("a");
  moved.take("b");
  moved.take("c");
  EXPECT_NO_THROW(moved.check_all_consumed());
}

TEST(Checkpoint, IndexNamingMissingShard) {
  TempDir d;
  write_shard(d.file("s1.safetensors"), {"a"});
  write_index(d, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  std::string e = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_TRUE(contains(e, "checkpoint: " + d.path())) << e;
  EXPECT_TRUE(contains(e, "puts tensor 'b' in shard 's2.safetensors', which does not exist")) << e;
}

TEST(Checkpoint, TensorMissingFromItsShard) {
  TempDir d;
  write_shard(d.file("s1.safetensors"), {"a"});
  write_shard(d.file("s2.safetensors"), {"b"});
  write_index(d, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}, {"ghost", "s2.safetensors"}});
  std::string e = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_TRUE(contains(e, "puts tensor 'ghost' in shard 's2.safetensors', which does not contain it")) << e;

  write_index(d, {{"a", "s2.safetensors"}, {"b", "s1.safetensors"}});  // swapped: 'a' lives in s1
  e = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_TRUE(contains(e, "puts tensor 'a' in shard 's2.safetensors', but it is in " + d.file("s1.safetensors"))) << e;
}

TEST(Checkpoint, DuplicateTensorAcrossShards) {
  TempDir d;
  write_shard(d.file("s1.safetensors"), {"a", "dup"});
  write_shard(d.file("s2.safetensors"), {"dup", "b"});
  write_index(d, {{"a", "s1.safetensors"}, {"dup", "s1.safetensors"}, {"b", "s2.safetensors"}});
  std::string e = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_TRUE(contains(e, "tensor 'dup' is in two files: " + d.file("s1.safetensors") + " and " +
                              d.file("s2.safetensors")))
      << e;

  std::filesystem::remove(d.file("model.safetensors.index.json"));  // globbed shards: same check
  e = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_TRUE(contains(e, "tensor 'dup' is in two files")) << e;
}

TEST(Checkpoint, GlobbedShardsWithoutIndex) {
  TempDir d;
  write_shard(d.file("b.safetensors"), {"y"});
  write_shard(d.file("a.safetensors"), {"x"});
  write_text(d.file("config.json"), "{}");
  Checkpoint c = Checkpoint::open(d.path());
  ASSERT_EQ(c.files().size(), 2u);
  EXPECT_EQ(c.files()[0]->path(), d.file("a.safetensors"));
  EXPECT_NE(c.find("x"), nullptr);
  EXPECT_NE(c.find("y"), nullptr);

  write_shard(d.file("model.safetensors"), {"z"});  // model.safetensors wins over the glob
  Checkpoint m = Checkpoint::open(d.path());
  EXPECT_EQ(m.files().size(), 1u);
  EXPECT_EQ(m.tensors().size(), 1u);
}

TEST(Checkpoint, BadDirectoriesAndIndexes) {
  TempDir d;
  EXPECT_TRUE(contains(error_of([&] { Checkpoint::open(d.path()); }), "no model.safetensors.index.json"));
  EXPECT_TRUE(contains(error_of([&] { Checkpoint::open(d.file("nope")); }), "nope: not a directory"));

  write_shard(d.file("s1.safetensors"), {"a"});
  write_text(d.file("model.safetensors.index.json"), "{\"weight_map\": ");
  EXPECT_TRUE(contains(error_of([&] { Checkpoint::open(d.path()); }), "model.safetensors.index.json"));
  write_text(d.file("model.safetensors.index.json"), "{\"metadata\": {}}");
  EXPECT_TRUE(contains(error_of([&] { Checkpoint::open(d.path()); }), "has no 'weight_map' object"));
  write_index(d, json::object());
  EXPECT_TRUE(contains(error_of([&] { Checkpoint::open(d.path()); }), "empty weight_map"));
  write_index(d, {{"a", 5}});
  EXPECT_TRUE(contains(error_of([&] { Checkpoint::open(d.path()); }), "weight_map['a'] is a JSON number"));
  write_index(d, {{"a", "../s1.safetensors"}});
  EXPECT_TRUE(contains(error_of([&] { Checkpoint::open(d.path()); }), "not a file name inside the directory"));
  write_index(d, {{"a", "/etc/passwd"}});
  EXPECT_TRUE(contains(error_of([&] { Checkpoint::open(d.path()); }), "not a file name inside the directory"));

  // A corrupt shard's error names the shard.
  write_index(d, {{"a", "s1.safetensors"}});
  write_text(d.file("s1.safetensors"), "abc");
  std::string e = error_of([&] { Checkpoint::open(d.path()); });
  EXPECT_TRUE(contains(e, "safetensors: " + d.file("s1.safetensors") + ": file is 3 bytes")) << e;
}

}  // namespace
}  // namespace arbor
