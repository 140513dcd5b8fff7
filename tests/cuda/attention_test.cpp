// KV write and attention over the paged cache, CUDA (the tensor-core prefill and split-K decode
// kernels, and the generic kernel for every other head_dim) against the CPU reference: head_dim
// 32/64/96/128/256 and 16..320 on the generic kernel, GQA ratios 1..8, sliding windows, softcap,
// block-boundary context lengths, several sequences per batch. Skipped without a GPU.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "cuda_test_util.h"

using namespace arbor;
using namespace arbor::cuda_test;

namespace {

struct Case {
  int64_t head_dim, n_heads, n_kv_heads;
  int64_t window;
  float softcap;
  std::vector<int32_t> ctx;      // context length of each sequence after the step
  std::vector<int32_t> n_query;  // tokens of each sequence in the step (the last n positions)
  int64_t block_size = 16;
};

std::string describe(const Case& c) {
  std::string s = fmt::format("hd {} heads {}/{} window {} softcap {} ctx", c.head_dim, c.n_heads, c.n_kv_heads, c.window, c.softcap);
  for (size_t i = 0; i < c.ctx.size(); ++i) s += fmt::format(" {}({})", c.ctx[i], c.n_query[i]);
  return s;
}

// Fills both caches with the same random keys/values for every position of every sequence (one
// kv_write batch), checks the pools agree, then runs attention for the case's query tokens.
void run_case(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(describe(c));
  const int64_t hd = c.head_dim, kv_row = c.n_kv_heads * hd, q_row = c.n_heads * hd;
  int64_t n_blocks = 0;
  BatchInfo fill = paged_batch(c.ctx, c.ctx, c.block_size, rng, &n_blocks);  // every position
  std::mt19937 rng_copy = rng;
  BatchInfo query = paged_batch(c.ctx, c.n_query, c.block_size, rng_copy, &n_blocks);
  query.block_tables = fill.block_tables;  // same sequences, same blocks
  KVLayout kv;
  kv.n_layers = 1, kv.n_blocks = n_blocks, kv.block_size = c.block_size, kv.n_kv_heads = c.n_kv_heads, kv.head_dim = hd;

  CudaBackend gpu(0);
  CpuBackend cpu(2, WeightPlacement::Copy);
  gpu.alloc_kv(kv), cpu.alloc_kv(kv);
  const int64_t TF = fill.n_tokens();
  std::vector<float> k = random_bf16(rng, size_t(TF * kv_row)), v = random_bf16(rng, size_t(TF * kv_row));
  gpu.begin_batch(fill), cpu.begin_batch(fill);
  gpu.kv_write(0, dev_bf16(gpu, k, {TF, kv_row}), dev_bf16(gpu, v, {TF, kv_row}));
  cpu.kv_write(0, host_view(k, {TF, kv_row}), host_view(v, {TF, kv_row}));
  {  // the written slots hold the same values (the CPU pools' other slots are uninitialised memory)
    std::vector<float> kp = host_f32(gpu, gpu.k_pool(0)), vp = host_f32(gpu, gpu.v_pool(0));
    std::vector<float> kg, vg, kc, vc;
    for (int64_t t = 0; t < TF; ++t) {
      const int32_t sq = fill.seq[size_t(t)], pos = fill.pos[size_t(t)];
      const int64_t slot = int64_t(fill.block_tables[size_t(sq * fill.max_blocks + pos / c.block_size)]) * c.block_size + pos % c.block_size;
      kg.insert(kg.end(), kp.begin() + slot * kv_row, kp.begin() + (slot + 1) * kv_row);
      vg.insert(vg.end(), vp.begin() + slot * kv_row, vp.begin() + (slot + 1) * kv_row);
      kc.insert(kc.end(), cpu.k_pool(0) + slot * kv_row, cpu.k_pool(0) + (slot + 1) * kv_row);
      vc.insert(vc.end(), cpu.v_pool(0) + slot * kv_row, cpu.v_pool(0) + (slot + 1) * kv_row);
    }
    EXPECT_EQ(max_diff(kg, kc), 0.0f) << "K pools differ";
    EXPECT_EQ(max_diff(vg, vc), 0.0f) << "V pools differ";
  }

  AttentionParams p;
  p.n_heads = c.n_heads, p.n_kv_heads = c.n_kv_heads, p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(float(hd)) * 2.0f;  // sharper than usual: softmax far from uniform
  p.softcap = c.softcap, p.window = c.window;
  const int64_t TQ = query.n_tokens();
  std::vector<float> q = random_bf16(rng, size_t(TQ * q_row), 2.0f), ref(size_t(TQ * q_row));
  cpu.begin_batch(query);
  cpu.attention(0, host_view(q, {TQ, q_row}), p, host_view(ref, {TQ, q_row}));
  gpu.begin_batch(query);
  Tensor qg = dev_bf16(gpu, q, {TQ, q_row});
  // The prefill path with each of its kernels (wgmma where this GPU and head_dim take it; 32 and 16
  // query rows per warp on mma.sync), then decode, then the generic kernel. A head_dim the tuned
  // kernels do not take runs the generic kernel whichever path is asked for.
  using Path = CudaBackend::AttentionPath;
  const bool tuned = hd == 32 || hd == 64 || hd == 96 || hd == 128 || hd == 256;
  EXPECT_EQ(std::string(CudaBackend::prefill_kernel(int(hd))) == "generic", !tuned);
  std::vector<std::pair<Path, const char*>> runs = {{Path::Prefill, "mma16"}, {Path::Prefill, "mma32"}, {Path::Decode, "auto"}};
  if (CudaBackend::prefill_wgmma_supported(int(hd))) runs.push_back({Path::Prefill, "wgmma"});
  if (!tuned) runs = {{Path::Prefill, "auto"}, {Path::Decode, "auto"}};
  runs.push_back({Path::Generic, "auto"});
  for (auto [path, kernel] : runs) {
    if (path == Path::Decode && hd == 96) continue;  // served by the prefill kernel
    SCOPED_TRACE(::testing::Message() << "prefill kernel " << kernel);
    gpu.set_attention_path(path);
    CudaBackend::set_prefill_kernel(kernel);
    Tensor og = gpu.alloc(DType::BF16, {TQ, q_row});
    std::vector<float> poison(size_t(TQ * q_row), NAN);
    gpu.upload(to_bf16(poison).data(), og);  // every element must be written
    gpu.attention(0, qg, p, og);
    // Outputs are convex combinations of values in [-1, 1]: an absolute bound. bf16 probabilities
    // (prefill) and a bf16 output give about 4e-3.
    const std::vector<float> got = host_f32(gpu, og);
    const char* name = path == Path::Prefill ? "prefill" : path == Path::Decode ? "decode" : "generic";
    EXPECT_LE(max_diff(got, ref), 1.5e-2f) << name;
    for (size_t i = 0; i < got.size(); ++i)  // the first bad element, to tell a layout error from a numeric one
      if (!(std::fabs(got[i] - ref[i]) <= 1.5e-2f)) {
        ADD_FAILURE() << name << ": first mismatch at token " << i / size_t(q_row) << " head " << (i % size_t(q_row)) / size_t(hd)
                      << " dim " << i % size_t(hd) << ": " << got[i] << " vs " << ref[i];
        break;
      }
  }
  CudaBackend::set_prefill_kernel("auto");
}

TEST(CudaAttention, HeadDimsAndGqaRatios) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(11);
  for (int64_t hd : {64, 128, 256})
    for (auto [h, kvh] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {4, 2}, {6, 2}, {8, 2}, {7, 1}, {8, 1}})
      run_case({hd, h, kvh, 0, 0.0f, {33, 17}, {33, 1}}, rng);
}

// Prefill over many key tiles (the wgmma kernel's are 128 keys): causal diagonals inside a tile,
// query tiles that are part of a longer context, sliding windows wider and narrower than a tile,
// softcap, GQA groups that do not divide the 128 rows of a block (padding rows), 32-slot blocks.
TEST(CudaAttention, PrefillLongSpans) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(17);
  run_case({128, 32, 8, 0, 0.0f, {517, 130}, {517, 64}}, rng);
  run_case({64, 8, 8, 0, 0.0f, {260}, {260}}, rng);
  run_case({128, 16, 2, 100, 0.0f, {400, 77}, {400, 77}}, rng);
  run_case({64, 6, 2, 200, 30.0f, {333}, {333}}, rng);
  run_case({128, 7, 1, 0, 0.0f, {300}, {150}, 32}, rng);
  run_case({64, 4, 4, 0, 0.0f, {129, 1, 255}, {129, 1, 2}}, rng);
}

// Decode's split merge every way (by the last split block / by a second kernel / in a thread-block
// cluster), whichever the GQA group would pick by default; clusters of 16 (the most) and 5 blocks;
// blocks of up to 4 heads with 4 and 8 warps.
TEST(CudaAttention, DecodeSplitMergeInKernelSeparateAndCluster) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(15);
  for (const char* warps : {"4", "8"})
  for (const char* merge : {"1", "0", "2"}) {
    for (const char* cluster : {"16", "5"}) {
      if (std::string(merge) != "2" && std::string(cluster) != "16") continue;
      SCOPED_TRACE(::testing::Message() << "merge " << merge << " cluster " << cluster << " warps " << warps);
      setenv("ARBOR_CUDA_ATTN_WARPS", warps, 1);
      setenv("ARBOR_CUDA_ATTN_MERGE", merge, 1);
      setenv("ARBOR_CUDA_ATTN_CLUSTER", cluster, 1);
      for (auto [h, kvh] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {8, 2}, {8, 1}, {16, 2}})
        run_case({128, h, kvh, 0, 0.0f, {300, 45}, {1, 1}}, rng);
      run_case({64, 8, 2, 37, 0.0f, {1000, 37, 38}, {1, 1, 1}}, rng);  // window
      run_case({256, 8, 4, 0, 30.0f, {700, 3}, {1, 1}}, rng);          // softcap
      run_case({32, 4, 1, 0, 0.0f, {2, 1, 17}, {1, 1, 1}}, rng);       // fewer keys than splits
    }
  }
  unsetenv("ARBOR_CUDA_ATTN_MERGE");
  unsetenv("ARBOR_CUDA_ATTN_CLUSTER");
  unsetenv("ARBOR_CUDA_ATTN_WARPS");
}

// Small test models (head_dim 32) and Phi-3-mini's 96.
TEST(CudaAttention, HeadDims32And96) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(14);
  for (int64_t hd : {32, 96})
    for (auto [h, kvh] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {8, 1}, {3, 3}}) run_case({hd, h, kvh, 0, 0.0f, {33, 17}, {33, 1}}, rng);
  run_case({32, 4, 2, 9, 30.0f, {40, 600}, {40, 1}}, rng);
}

// head_dims the tuned kernels do not take (the generic kernel): GQA ratios 1..8, sliding windows,
// softcap, odd lengths around block boundaries, prefill chunks beside decode tokens, block sizes that
// are not a power of two, long decode contexts, and head_dims past 128 and 256 (more dims per lane).
TEST(CudaAttention, HeadDimGenericKernel) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(19);
  for (int64_t hd : {16, 24, 40, 48, 80, 112}) {
    run_case({hd, 4, 2, 0, 0.0f, {33, 17}, {33, 1}}, rng);
    run_case({hd, 8, 1, 0, 0.0f, {1, 15, 16, 17, 31, 32, 33}, {1, 15, 1, 17, 2, 32, 1}}, rng);
    run_case({hd, 6, 2, 7, 0.0f, {40, 3, 70}, {40, 3, 1}}, rng);    // sliding window
    run_case({hd, 3, 3, 0, 30.0f, {100, 5}, {37, 5}, 12}, rng);     // softcap, block size 12
  }
  run_case({16, 4, 4, 0, 0.0f, {1500}, {1}}, rng);  // a long decode context
  run_case({112, 8, 2, 100, 0.0f, {700, 45}, {1, 45}}, rng);
  run_case({20, 2, 1, 0, 0.0f, {41}, {41}}, rng);   // not a multiple of 8
  run_case({200, 4, 2, 0, 0.0f, {50}, {50}}, rng);  // 8 dims per lane
  run_case({320, 2, 1, 9, 0.0f, {60, 2}, {60, 1}}, rng);  // 16 dims per lane
}

TEST(CudaAttention, BlockBoundariesAndMixedBatches) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(12);
  // Lengths around block boundaries; prefill of whole prompts, chunks that start mid-sequence, and
  // decode tokens, several sequences in one batch.
  run_case({128, 8, 2, 0, 0.0f, {1, 15, 16, 17, 31, 32, 33}, {1, 15, 16, 17, 31, 32, 33}}, rng);
  run_case({128, 8, 2, 0, 0.0f, {1, 15, 16, 17, 31, 32, 33}, {1, 1, 1, 1, 1, 1, 1}}, rng);
  run_case({64, 4, 1, 0, 0.0f, {64, 65, 100}, {20, 1, 37}}, rng);
  run_case({128, 4, 4, 0, 0.0f, {48}, {48}, 8}, rng);      // block size 8
  run_case({64, 4, 2, 0, 0.0f, {30, 7}, {30, 1}, 12}, rng);  // block size 12: not a power of two
  run_case({128, 16, 2, 0, 0.0f, {40, 9}, {40, 2}}, rng);  // GQA 8, several tiles of 8 tokens
}

TEST(CudaAttention, SlidingWindowSoftcapLongContext) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(13);
  run_case({64, 4, 2, 5, 0.0f, {40, 3}, {40, 3}}, rng);
  run_case({128, 8, 4, 37, 0.0f, {100, 37, 38}, {100, 1, 1}}, rng);
  run_case({256, 8, 4, 16, 50.0f, {70}, {70}}, rng);
  run_case({128, 8, 2, 0, 20.0f, {33}, {33}}, rng);
  // Long contexts: the decode kernel splits the keys over many blocks and merges the partials.
  run_case({128, 32, 8, 0, 0.0f, {1500}, {1}}, rng);
  run_case({64, 8, 1, 0, 0.0f, {900, 1200}, {1, 1}}, rng);
  run_case({128, 8, 2, 300, 0.0f, {1000}, {3}}, rng);
  // Spans long enough for the eight-wave split rule (over 100 splits; merged by a second kernel for
  // 4 heads per block, in the kernel for 2), with a key count no split size divides.
  run_case({128, 32, 8, 0, 0.0f, {5001}, {1}}, rng);
  run_case({128, 16, 8, 0, 0.0f, {4099}, {1}}, rng);
}

}  // namespace
