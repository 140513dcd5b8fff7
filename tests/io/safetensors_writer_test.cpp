// Tests of the streaming safetensors writers (io/safetensors_writer.h): files byte-identical to the in-memory
// writer's, read back by arbor's reader and Checkpoint (sharded, with the index), and every error naming the
// file and tensor.
#include "io/safetensors_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/checkpoint.h"
#include "io_test_util.h"

namespace arbor {
namespace {

using test::error_of;
using test::random_bytes;
using test::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

struct Fixture {
  std::vector<TensorHeader> plan{{"a.weight", DType::BF16, {3, 5}}, {"b", DType::F32, {7}}, {"empty", DType::F16, {0, 4}},
                                 {"c.scales", DType::U32, {2, 2}}};
  std::vector<std::vector<uint8_t>> data;
  Fixture() {
    for (size_t i = 0; i < plan.size(); ++i) data.push_back(random_bytes(plan[i].nbytes(), uint32_t(i + 1)));
  }
};

TEST(SafetensorsStreamWriter, SameBytesAsTheInMemoryWriterAndReadsBack) {
  TempDir d;
  Fixture fx;
  const json meta{{"format", "mlx"}};
  {
    SafetensorsStreamWriter w(d.file("s.safetensors"), fx.plan, meta);
    for (size_t i = 0; i < fx.plan.size(); ++i) w.write(fx.plan[i].name, fx.data[i].data(), fx.data[i].size());
    w.finish();
  }
  std::vector<TensorToWrite> tw;
  for (size_t i = 0; i < fx.plan.size(); ++i)
    tw.push_back({fx.plan[i].name, fx.plan[i].dtype, fx.plan[i].shape, fx.data[i].data(), fx.data[i].size()});
  EXPECT_EQ(slurp(d.file("s.safetensors")), serialize_safetensors(tw, meta));

  SafetensorsFile f(d.file("s.safetensors"));
  ASSERT_EQ(f.tensors().size(), fx.plan.size());
  for (size_t i = 0; i < fx.plan.size(); ++i) {
    const TensorInfo* t = f.find(fx.plan[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, fx.plan[i].dtype);
    EXPECT_EQ(t->shape, fx.plan[i].shape);
    ASSERT_EQ(t->nbytes, fx.data[i].size());
    if (t->nbytes) {  // an empty tensor has no data to compare (memcmp takes no null pointer)
      EXPECT_EQ(std::memcmp(t->data, fx.data[i].data(), t->nbytes), 0) << fx.plan[i].name;
    }
  }
  EXPECT_EQ(f.metadata(), meta);
  for (const auto& e : std::filesystem::directory_iterator(d.path()))  // no temporary left behind
    EXPECT_EQ(e.path().filename(), "s.safetensors");
}

TEST(SafetensorsStreamWriter, WritesInParts) {
  TempDir d;
  Fixture fx;
  {
    SafetensorsStreamWriter w(d.file("p.safetensors"), fx.plan);
    const auto& a = fx.data[0];
    w.write_part("a.weight", a.data(), 10);
    w.write_part("a.weight", a.data() + 10, 0);
    w.write_part("a.weight", a.data() + 10, a.size() - 10);
    for (size_t i = 1; i < fx.plan.size(); ++i) w.write(fx.plan[i].name, fx.data[i].data(), fx.data[i].size());
    w.finish();
  }
  SafetensorsFile f(d.file("p.safetensors"));
  EXPECT_EQ(std::memcmp(f.find("a.weight")->data, fx.data[0].data(), fx.data[0].size()), 0);
}

TEST(SafetensorsStreamWriter, ErrorsNameTheTensor) {
  TempDir d;
  Fixture fx;
  const std::string path = d.file("e.safetensors");
  auto at = [&](const std::string& rest) { return fmt::format("safetensors: {}: {}", path, rest); };
  auto fresh = [&] { return std::make_unique<SafetensorsStreamWriter>(path, fx.plan); };
  {
    auto w = fresh();
    std::string e = error_of([&] { w->write("a.weight", fx.data[0].data(), 29); });
    EXPECT_EQ(e, at("tensor 'a.weight': shape [3, 5] of BF16 needs 30 bytes, got 29"));
    e = error_of([&] { w->write("b", fx.data[1].data(), fx.data[1].size()); });
    EXPECT_EQ(e, at("tensor 'b' written out of order: it is number 2 of the plan, the next to "
                 "write is 'a.weight' (number 1)"));
    e = error_of([&] { w->write("zz", fx.data[1].data(), 4); });
    EXPECT_EQ(e, at("tensor 'zz' is not in the file's plan (next is 'a.weight')"));
    w->write_part("a.weight", fx.data[0].data(), 4);
    e = error_of([&] { w->write_part("a.weight", fx.data[0].data(), 27); });
    EXPECT_EQ(e, at("tensor 'a.weight': shape [3, 5] of BF16 needs 30 bytes, got 31"));
    e = error_of([&] { w->finish(); });
    EXPECT_EQ(e, at("finished with 0 of 4 tensors written; 'a.weight' is missing (4 of 30 bytes written)"));
    w.reset();  // destroyed unfinished: the temporary goes, nothing is renamed into place
    EXPECT_TRUE(std::filesystem::is_empty(d.path()));
  }
  {
    auto w = fresh();
    for (size_t i = 0; i < fx.plan.size(); ++i) w->write(fx.plan[i].name, fx.data[i].data(), fx.data[i].size());
    std::string e = error_of([&] { w->write("b", fx.data[1].data(), fx.data[1].size()); });
    EXPECT_EQ(e, at("tensor 'b' written twice; every planned tensor is written"));
    w->finish();
    e = error_of([&] { w->write("b", fx.data[1].data(), fx.data[1].size()); });
    EXPECT_EQ(e, at("tensor 'b' written after the file was finished"));
  }
  EXPECT_EQ(error_of([&] { SafetensorsStreamWriter(d.file("x"), {{"t", DType::F32, {2}}, {"t", DType::F32, {1}}}); }),
            "safetensors: write: tensor name 't' is empty, reserved or used twice");
  EXPECT_EQ(error_of([&] { SafetensorsStreamWriter(d.file("x"), {{"t", DType::F32, {2, -1}}}); }),
            "safetensors: write: tensor 't': negative dimension in shape [2, -1]");
  EXPECT_TRUE(contains(error_of([&] { SafetensorsStreamWriter(d.file("no/such/dir/x"), {}); }), "cannot create"));
}

TEST(ShardedSafetensorsWriter, ShardsAndIndexReadBackThroughCheckpoint) {
  TempDir d;
  std::vector<TensorHeader> plan;
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 7; ++i) {
    plan.push_back({fmt::format("t{}", 6 - i), DType::F32, {int64_t(4 + i)}});  // 16..40 bytes, names not sorted
    data.push_back(random_bytes(plan.back().nbytes(), uint32_t(i)));
  }
  // 59-byte shards: [16, 20] [24, 28] [32] [36] [40] -> 5 shards, as mlx-lm's make_shards groups them.
  const auto shards = plan_shards(plan, 59);
  ASSERT_EQ(shards.size(), 5u);
  EXPECT_EQ(shards[0], (std::pair<size_t, size_t>{0, 2}));
  EXPECT_EQ(shards[1], (std::pair<size_t, size_t>{2, 4}));
  EXPECT_EQ(shards[4], (std::pair<size_t, size_t>{6, 7}));
  // A tensor that fills a shard exactly stays in it: at 60, [16, 20, 24] [28, 32] [36] [40].
  const auto exact = plan_shards(plan, 60);
  ASSERT_EQ(exact.size(), 4u);
  EXPECT_EQ(exact[0], (std::pair<size_t, size_t>{0, 3}));
  EXPECT_EQ(exact[1], (std::pair<size_t, size_t>{3, 5}));
  EXPECT_EQ(plan_shards({}, 60).size(), 1u);
  {
    ShardedSafetensorsWriter w(d.path(), plan, 59, json{{"format", "mlx"}}, json{{"total_parameters", 217}});
    for (size_t i = 0; i < plan.size(); ++i) w.write(plan[i].name, data[i].data(), data[i].size());
    w.finish();
    EXPECT_EQ(w.shard_count(), 5u);
    EXPECT_EQ(w.total_bytes(), 16u + 20 + 24 + 28 + 32 + 36 + 40);
  }
  EXPECT_TRUE(std::filesystem::exists(d.file("model-00001-of-00005.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(d.file("model-00005-of-00005.safetensors")));
  const json index = read_json_file(d.file("model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 196);
  EXPECT_EQ(index["metadata"]["total_parameters"], 217);
  EXPECT_EQ(index["weight_map"]["t6"], "model-00001-of-00005.safetensors");
  EXPECT_EQ(index["weight_map"]["t0"], "model-00005-of-00005.safetensors");
  Checkpoint c = Checkpoint::open(d.path());
  for (size_t i = 0; i < plan.size(); ++i) {
    const TensorInfo& t = c.take(plan[i].name);
    ASSERT_EQ(t.nbytes, data[i].size());
    EXPECT_EQ(std::memcmp(t.data, data[i].data(), t.nbytes), 0);
  }
  c.check_all_consumed();
}

TEST(ShardedSafetensorsWriter, OneShardWithAndWithoutIndexAndErrors) {
  Fixture fx;
  for (bool always : {false, true}) {
    TempDir d;
    ShardedSafetensorsWriter w(d.path(), fx.plan, uint64_t(1) << 30, json::object(), json::object(), always);
    for (size_t i = 0; i < fx.plan.size(); ++i) w.write(fx.plan[i].name, fx.data[i].data(), fx.data[i].size());
    w.finish();
    EXPECT_TRUE(std::filesystem::exists(d.file("model.safetensors")));
    EXPECT_EQ(std::filesystem::exists(d.file("model.safetensors.index.json")), always);
    Checkpoint c = Checkpoint::open(d.path());
    EXPECT_EQ(c.tensors().size(), fx.plan.size());
  }
  TempDir d;
  ShardedSafetensorsWriter w(d.path(), fx.plan, 20);  // [a.weight] [b] [empty, c.scales]: b (28) and a zero-size tensor pass 20
  w.write("a.weight", fx.data[0].data(), fx.data[0].size());
  std::string e = error_of([&] { w.write("c.scales", fx.data[3].data(), fx.data[3].size()); });
  EXPECT_TRUE(contains(e, "tensor 'c.scales' is not in the file's plan (next is 'b')")) << e;
  e = error_of([&] { w.finish(); });
  EXPECT_TRUE(contains(e, "model-00002-of-00003.safetensors: finished with 0 of 1 tensors written; 'b' is missing")) << e;
  EXPECT_EQ(error_of([&] { ShardedSafetensorsWriter(d.path(), {{"t", DType::F32, {1}}, {"t", DType::F32, {1}}}, 1); }),
            "safetensors: write: tensor name 't' is used twice");
}

}  // namespace
}  // namespace arbor
