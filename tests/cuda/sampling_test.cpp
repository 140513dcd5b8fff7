// GPU sampling: argmax against the CPU's (ties to the lowest id), and seeded temperature / top-k /
// top-p / min-p draws against the exact filtered distribution computed here in double precision
// in transformers' order (the CPU Sampler's semantics). Skipped without a GPU.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/sampler.h"

using namespace arbor;
using namespace arbor::cuda_test;

namespace {

// The distribution the CPU Sampler draws from: probabilities of the kept tokens (others absent).
std::map<int32_t, double> reference_distribution(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> c;
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({logits[i] / p.temperature, int32_t(i)});
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  size_t n = p.top_k > 0 ? std::min(c.size(), size_t(p.top_k)) : c.size();
  std::vector<double> prob(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += (prob[i] = std::exp(double(c[i].first - c[0].first)));
  for (auto& q : prob) q /= total;
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += prob[keep++];
      if (cum >= double(p.top_p)) break;
    }
    n = keep;
  }
  if (p.min_p > 0) {
    size_t keep = 1;
    while (keep < n && prob[keep] >= double(p.min_p) * prob[0]) ++keep;
    n = keep;
  }
  double mass = 0;
  for (size_t i = 0; i < n; ++i) mass += prob[i];
  std::map<int32_t, double> out;
  for (size_t i = 0; i < n; ++i) out[c[i].second] = prob[i] / mass;
  return out;
}

// Logits [R, V] f32 on the device.
Tensor dev_logits(CudaBackend& gpu, const std::vector<float>& l, int64_t R, int64_t V) {
  Tensor t = gpu.alloc(DType::F32, {R, V});
  gpu.upload(l.data(), t);
  return t;
}
// R copies of one row of logits.
std::vector<float> repeat_rows(const std::vector<float>& row, int64_t R) {
  std::vector<float> l;
  l.reserve(row.size() * size_t(R));
  for (int64_t r = 0; r < R; ++r) l.insert(l.end(), row.begin(), row.end());
  return l;
}

// R draws of parameters p at once, row r with counter first + r (each row its own hash of (seed, counter)).
std::vector<int32_t> draw_rows(CudaBackend& gpu, const Tensor& t, const SamplingParams& p, uint64_t first) {
  std::vector<RowSampling> rows(static_cast<size_t>(t.rows()), RowSampling{p, 0});
  for (size_t r = 0; r < rows.size(); ++r) rows[r].counter = first + r;
  EXPECT_TRUE(gpu.sample_rows_start(t, rows));
  std::vector<int32_t> ids(rows.size());
  gpu.wait_pick(ids.data());
  return ids;
}

// The argmax cuts a row over blocks of 4096 logits: vocabularies below, at and across block edges,
// ties inside one block and across blocks (the lower id wins), NaNs (never chosen; a row of NaNs gives
// 0, as the CPU), a row of -inf, and a second launch on the same buffers (the per-row counters reset).
TEST(CudaSampling, ArgmaxMatchesTheCpu) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(21);
  CudaBackend gpu(0);
  for (int64_t V : {1, 1000, 4095, 4096, 4097, 12289, 128256, 151936}) {
    for (int64_t R : {1, 5}) {
      std::vector<float> l = random_bf16(rng, size_t(R * V), 10.0f);
      auto row = [&](int64_t r) { return l.data() + r * V; };
      if (R > 1 && V > 1) row(1)[5] = row(1)[900 % V] = 99.0f;                  // a tie in one block
      if (R > 2 && V > 8192) row(2)[V - 1] = row(2)[4100] = row(2)[8200] = 98.0f;  // a tie across blocks
      if (R > 3) {
        for (int64_t i = 1; i < V; i += 7) row(3)[i] = std::nanf("");
        for (int64_t i = 0; i < V; ++i) row(4)[i] = V > 1 ? std::nanf("") : row(4)[i];
      }
      if (R > 4 && V > 1) std::fill(row(0), row(0) + V, -INFINITY);
      Tensor t = dev_logits(gpu, l, R, V);
      for (int rep = 0; rep < 2; ++rep) {
        std::vector<int32_t> ids(static_cast<size_t>(R), -1);
        gpu.argmax_rows(t, ids.data());
        for (int64_t r = 0; r < R; ++r) EXPECT_EQ(ids[size_t(r)], argmax(row(r), V)) << "V " << V << " R " << R << " row " << r << " rep " << rep;
      }
    }
  }
}

TEST(CudaSampling, SeededDrawsFollowTheFilteredDistribution) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(22);
  CudaBackend gpu(0);
  const int64_t V = 24, R = 8192;  // R draws at once: each row gets its own hash of (seed, counter)
  std::vector<float> row = random_bf16(rng, size_t(V), 3.0f);
  const std::vector<float> l = repeat_rows(row, R);
  Tensor t = dev_logits(gpu, l, R, V);
  for (int cluster : {1, 16}) {  // one block per row, and 16 (most blocks own no logit: V is 24)
    SCOPED_TRACE(::testing::Message() << "at most " << cluster << " blocks per row");
    CudaBackend::set_sample_cluster(cluster);
    // {temperature, top_k, top_p, min_p}; the seed is set per case below.
    const std::vector<SamplingParams> cases = {{1.0f}, {0.7f, 5}, {1.3f, 0, 0.6f}, {1.0f, 0, 1.0f, 0.15f}, {0.9f, 12, 0.9f, 0.05f}};
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      SamplingParams p = cases[ci];
      p.seed = 1234 + ci;
      auto ref = reference_distribution(row, p);
      const std::vector<int32_t> ids = draw_rows(gpu, t, p, 7 * uint64_t(R));
      std::map<int32_t, int64_t> count;
      for (auto id : ids) count[id]++;
      for (auto [id, n] : count) EXPECT_TRUE(ref.count(id)) << "case " << ci << ": token " << id << " drawn " << n << " times is filtered out";
      for (auto [id, pr] : ref) {
        const double f = double(count[id]) / double(R), sigma = std::sqrt(pr * (1 - pr) / double(R));
        EXPECT_NEAR(f, pr, 5 * sigma + 2e-3) << "case " << ci << " token " << id;
      }
      EXPECT_EQ(ids, draw_rows(gpu, t, p, 7 * uint64_t(R))) << "same (seed, counter) must give the same ids";
      EXPECT_NE(ids, draw_rows(gpu, t, p, 8 * uint64_t(R))) << "other counters must draw anew";
    }
    SamplingParams k1;
    k1.temperature = 0.8f, k1.top_k = 1;
    for (auto id : draw_rows(gpu, t, k1, 0)) ASSERT_EQ(id, argmax(row.data(), V));
  }
  CudaBackend::set_sample_cluster(0);
}

// A vocabulary of real size (odd: not a multiple of a warp): 64 live tokens with distinct logits
// spread over the ids, the rest a band of near-ties far below them (where most of the radix select's
// first histogram lands, the case its warp aggregation is for) and some -inf. Every cut falls among
// the live tokens; the kept set must be exact (nothing filtered is ever drawn) and the draws follow it.
TEST(CudaSampling, LargeVocabularyThresholds) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(25);
  CudaBackend gpu(0);
  const int64_t V = 50001, R = 2048;
  std::vector<float> row = random_bf16(rng, size_t(V), 10.0f, -30.0f);
  std::vector<int64_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int j = 0; j < 64; ++j) row[size_t(ids[size_t(j)])] = 0.1f * float(j);
  for (int j = 64; j < 164; ++j) row[size_t(ids[size_t(j)])] = -INFINITY;
  const std::vector<float> l = repeat_rows(row, R);
  Tensor t = dev_logits(gpu, l, R, V);
  // {temperature, top_k, top_p, min_p}; the seed is set per case below.
  const std::vector<SamplingParams> cases = {{1.0f}, {0.7f, 10}, {1.0f, 0, 0.7f}, {0.9f, 40, 0.9f, 0.02f}, {1.3f, 1}};
  for (int cluster : {1, 2, 16}) {
    SCOPED_TRACE(::testing::Message() << "at most " << cluster << " blocks per row");
    CudaBackend::set_sample_cluster(cluster);
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      SamplingParams p = cases[ci];
      p.seed = 77 + ci;
      const auto ref = reference_distribution(row, p);
      const std::vector<int32_t> got = draw_rows(gpu, t, p, 0);
      std::map<int32_t, int64_t> count;
      for (auto id : got) count[id]++;
      for (auto [id, n] : count) EXPECT_TRUE(ref.count(id)) << "case " << ci << ": token " << id << " drawn " << n << " times is filtered out";
      for (auto [id, pr] : ref) {
        if (pr < 1e-4) continue;
        const double f = double(count[id]) / double(R), sigma = std::sqrt(pr * (1 - pr) / double(R));
        EXPECT_NEAR(f, pr, 5 * sigma + 2e-3) << "case " << ci << " token " << id;
      }
      EXPECT_EQ(got, draw_rows(gpu, t, p, 0)) << "case " << ci << ": same (seed, counter), same ids";
    }
  }
  CudaBackend::set_sample_cluster(0);
}

// Batch-1-like launches (3 rows of random logits): the thresholds and the draw sum fixed-point masses,
// so the ids are the same for one block per row as for 2 or 16, under every filter.
// `clusters` lists the cluster sizes compared with the first; `first_set` skips parameter sets (the
// racecheck test keeps only the last, which applies every filter).
void expect_same_ids_at_every_cluster_size(int64_t V, uint64_t counters, uint32_t seed,
                                           std::vector<int> clusters = {1, 2, 16}, size_t first_set = 0) {
  std::mt19937 rng(seed);
  CudaBackend gpu(0);
  const int64_t R = 3;
  std::vector<float> l = random_bf16(rng, size_t(R * V), 6.0f);
  Tensor t = dev_logits(gpu, l, R, V);
  // {temperature, top_k, top_p, min_p}; the seed is set per set below.
  const std::vector<SamplingParams> sets = {{1.0f}, {0.7f, 50}, {0.8f, 0, 0.9f}, {1.1f, 400, 0.5f, 0.01f}};
  for (size_t si = first_set; si < sets.size(); ++si) {
    SamplingParams p = sets[si];
    p.seed = 5 + si;
    std::vector<std::vector<int32_t>> by_cluster;
    for (int cluster : clusters) {
      CudaBackend::set_sample_cluster(cluster);
      std::vector<int32_t> ids;
      for (uint64_t counter = 0; counter < counters; counter += R) {
        const auto got = draw_rows(gpu, t, p, counter);
        ids.insert(ids.end(), got.begin(), got.end());
      }
      by_cluster.push_back(ids);
    }
    CudaBackend::set_sample_cluster(0);
    for (size_t c = 1; c < clusters.size(); ++c)
      EXPECT_EQ(by_cluster[c], by_cluster[0]) << "set " << si << ": " << clusters[c] << " blocks per row vs " << clusters[0];
    std::map<int32_t, int> distinct;
    for (auto id : by_cluster[0]) distinct[id]++;
    EXPECT_GT(distinct.size(), 1u) << "set " << si << ": the draws vary (over the rows, and over counters when there are several)";
  }
}

// Qwen3's vocabulary: every block of a 16-block cluster owns thousands of logits.
TEST(CudaSampling, ClusterSizeDoesNotChangeTheIds) {
  ARBOR_REQUIRE_GPU();
  expect_same_ids_at_every_cluster_size(151936, 48, 26);
}

// An odd small vocabulary (75 logits per block of 16, the last block short).
TEST(CudaSampling, ClusterSizeDoesNotChangeTheIdsSmallVocabulary) {
  ARBOR_REQUIRE_GPU();
  expect_same_ids_at_every_cluster_size(1201, 3, 27);
}

// The least work that still runs both code paths (one block per row, and a 2-block cluster reducing
// through distributed shared memory): one launch each, for compute-sanitizer racecheck, whose
// shared-memory tracking made the tests above run past minutes (bench/cuda/run_device.sh). Outside the
// sanitizer these two repeat part of ClusterSizeDoesNotChangeTheIdsSmallVocabulary.
TEST(CudaSampling, RacecheckOneAndTwoBlocksPerRow) {
  ARBOR_REQUIRE_GPU();
  expect_same_ids_at_every_cluster_size(1201, 3, 27, {1, 2}, 3);
}

// The largest cluster (16 blocks, 75 logits each), for racecheck too: one launch of 3 rows takes it
// over a minute on an H200 (~75 s alone, ~175 s beside other sanitizer runs), so it runs in the
// sanitizer sweep, not in the quick racecheck filter.
TEST(CudaSampling, RacecheckSixteenBlockCluster) {
  ARBOR_REQUIRE_GPU();
  expect_same_ids_at_every_cluster_size(1201, 3, 27, {1, 16}, 3);
}

// Draws queued with a parameter set per row (the scheduler's path): four sets, a greedy one among
// them, interleaved over the rows of one launch; each set's rows follow its own distribution, greedy
// rows give the argmax, and a row's draw depends on (seed, counter) only, not on its place.
TEST(CudaSampling, PerRowDrawsFollowEachRowsDistribution) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(24);
  CudaBackend gpu(0);
  const int64_t V = 30, per_set = 2048, sets = 4, R = per_set * sets;
  std::vector<float> row = random_bf16(rng, size_t(V), 3.0f);
  for (int64_t i = 0; i < V; ++i) row[size_t(i)] += 1e-3f * float(i);  // no ties (the kernel keeps ties at a cut, the reference one)
  const std::vector<float> l = repeat_rows(row, R);
  Tensor t = dev_logits(gpu, l, R, V);
  std::vector<SamplingParams> set(sets);
  set[0].temperature = 1.0f;
  set[1].temperature = 0.0f;  // greedy
  set[2].temperature = 0.8f, set[2].top_k = 6, set[2].top_p = 0.8f;
  set[3].temperature = 1.2f, set[3].min_p = 0.1f;
  std::vector<RowSampling> rows(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    rows[size_t(r)] = {set[size_t(r % sets)], uint64_t(r / sets)};
    rows[size_t(r)].params.seed = 100 + uint64_t(r % sets);
  }
  ASSERT_TRUE(gpu.sample_rows_start(t, rows));
  std::vector<int32_t> ids(static_cast<size_t>(R));
  gpu.wait_pick(ids.data());
  for (int64_t k = 0; k < sets; ++k) {
    std::map<int32_t, int64_t> count;
    for (int64_t r = k; r < R; r += sets) count[ids[size_t(r)]]++;
    if (k == 1) {
      EXPECT_EQ(count.size(), 1u);
      EXPECT_EQ(count.begin()->first, argmax(row.data(), V));
      continue;
    }
    const auto ref = reference_distribution(row, set[size_t(k)]);
    for (auto [id, n] : count) EXPECT_TRUE(ref.count(id)) << "set " << k << ": token " << id << " drawn " << n << " times is filtered out";
    for (auto [id, pr] : ref) {
      const double f = double(count[id]) / double(per_set), sigma = std::sqrt(pr * (1 - pr) / double(per_set));
      EXPECT_NEAR(f, pr, 5 * sigma + 2e-3) << "set " << k << " token " << id;
    }
  }
  // The same (parameters, seed, counter) in reversed row order: the same ids, reversed.
  std::vector<RowSampling> rev(rows.rbegin(), rows.rend());
  ASSERT_TRUE(gpu.sample_rows_start(t, rev));
  std::vector<int32_t> again(static_cast<size_t>(R));
  gpu.wait_pick(again.data());
  EXPECT_EQ(std::vector<int32_t>(again.rbegin(), again.rend()), ids);
  // A bad parameter names its row.
  rows[5].params.top_p = 0.0f;
  try {
    gpu.sample_rows_start(t, rows);
    ADD_FAILURE() << "top_p 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 5"), std::string::npos) << e.what();
  }
}

}  // namespace
