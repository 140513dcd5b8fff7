// CudaBackend: device memory, weight upload through pinned staging, per-batch metadata, and the op
// dispatch to the kernels (kernels.h) and cuBLASLt (gemm.h). Host-side checks mirror the CPU's.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "backend/cuda/affine.h"
#include "backend/cuda/affine_gemm.h"
#include "backend/cuda/attention_kv.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.h"
#include "backend/cuda/trellis.h"
#include "core/error.h"
#include "quant/trellis.h"
#include "core/log.h"

namespace arbor {

using namespace cuda;

namespace {
cudaStream_t st(CUstream_st* s) { return s; }
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt workspace
constexpr size_t kStageBytes = size_t(64) << 20;      // one pinned staging buffer (weights)
constexpr int kStageSlots = 2;                        // double-buffered: fill one while the other copies
constexpr int kMetaSlots = 4;                         // per-batch metadata staging ring
}  // namespace

// One device allocation; freed in the destructor (which never throws).
struct CudaBackend::Alloc {
  void* p = nullptr;
  ~Alloc() {
    if (p) cudaFree(p);
  }
};

// Pinned host buffers with an event each: a buffer is refilled only after its last copy finished.
struct CudaBackend::Staging {
  void* weight[kStageSlots] = {};
  cudaEvent_t weight_done[kStageSlots] = {};
  int next_weight = 0;
  void* meta[kMetaSlots] = {};
  size_t meta_cap = 0;
  cudaEvent_t meta_done[kMetaSlots] = {};
  int next_meta = 0;
  ~Staging() {
    for (int i = 0; i < kStageSlots; ++i) {
      if (weight_done[i]) cudaEventSynchronize(weight_done[i]), cudaEventDestroy(weight_done[i]);
      if (weight[i]) cudaFreeHost(weight[i]);
    }
    for (int i = 0; i < kMetaSlots; ++i) {
      if (meta_done[i]) cudaEventSynchronize(meta_done[i]), cudaEventDestroy(meta_done[i]);
      if (meta[i]) cudaFreeHost(meta[i]);
    }
  }
};

struct CudaBackend::Graphs {
  std::map<uint64_t, cudaGraphExec_t> exec;
  std::set<uint64_t> seen;  // shapes that ran eagerly once (the next step of the shape is recorded)
  void clear() {
    for (auto& [k, e] : exec) cudaGraphExecDestroy(e);
    exec.clear();
  }
  ~Graphs() { clear(); }
};

bool cuda_device_available(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = fmt::format("no usable CUDA driver/device: {} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (n == 0) {
    if (why) *why = "the CUDA driver reports no device";
    return false;
  }
  return true;
}

namespace cuda {
bool pdl_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("ARBOR_CUDA_PDL");
    if (env && std::string(env) == "0") return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int index) { return std::make_unique<CudaBackend>(index); }

void CudaBackend::set_gemv_stream(bool on) { cuda::set_gemv_stream(on); }
void CudaBackend::set_gemv_mma(bool on) { cuda::set_gemv_mma(on); }
bool CudaBackend::gemv_mma_takes(int64_t T, int64_t K, DType w_dtype) { return cuda::gemv_mma_takes(T, K, w_dtype); }
CudaBackend::LinearKernel CudaBackend::pick_linear(const Linear& l, int64_t rows) const {
  const DType t = l.data.dtype;
  if (l.format == WeightFormat::Dense && (t == DType::BF16 || t == DType::F16)) {
    const bool gemv = rows <= gemv_max_rows_ || (gemv_max_rows_ > 0 && cuda::gemv_mma_takes(rows, l.cols(), t));
    if (t == DType::BF16) return gemv ? LinearKernel::GemvBf16 : LinearKernel::LtBf16;
    return gemv ? LinearKernel::GemvF16 : LinearKernel::LtF16;
  }
  const bool affine = l.format == WeightFormat::Affine && (l.bits == 2 || l.bits == 3 || l.bits == 4 || l.bits == 5 || l.bits == 6 ||
                                                           l.bits == 8) && (l.group_size == 32 || l.group_size == 64 || l.group_size == 128);
  // (the device layout, affine.h: scale/bias pairs [rows, groups, 2]; host tensors have no kernel)
  const bool loaded = l.scales.ndim == 3 && (l.scales.dtype == DType::BF16 || l.scales.dtype == DType::F16);
  if (l.format == WeightFormat::Trellis && l.scales.dtype == DType::F32 && l.scales.device == Device::CUDA)
    return rows <= trellis_gemv_max_rows_ ? LinearKernel::GemvTrellis : LinearKernel::DequantTrellisLt;
  if (affine && loaded)
    return rows <= cuda::affine_gemv_max_rows(l.bits) ? LinearKernel::GemvAffine
           : rows < affine_dequant_min_rows_ ? LinearKernel::GemmAffine
                                             : LinearKernel::DequantAffineLt;
  fail("cuda: no linear kernel for {} weights at {} rows; supported: dense BF16 or F16 (on the device) at any rows: GEMV up to {} "
       "rows (and where the tensor-core GEMV takes the shape), cuBLASLt beyond; affine 2/3/4/5/6/8-bit g32/64/128 (loaded by "
       "load_linear): GEMV up to {} rows, a tensor-core GEMM to {}, dequantization + cuBLASLt beyond; trellis k 2/3/4 (loaded by "
       "load_linear): GEMV up to {} rows, decode + cuBLASLt beyond",
       l.describe(), rows, gemv_max_rows_, cuda::affine_gemv_max_rows(l.bits), affine_dequant_min_rows_ - 1, trellis_gemv_max_rows_);
}
void CudaBackend::set_prefill_kernel(const char* name) { cuda::set_prefill_kernel(cuda::parse_prefill_kernel(name)); }
bool CudaBackend::prefill_wgmma_supported(int head_dim) { return cuda::prefill_wgmma_supported(head_dim); }
void CudaBackend::set_sample_cluster(int c) { cuda::set_sample_cluster(c); }
void CudaBackend::set_kv_decode_attention(int mode) { cuda::set_kv_decode_mma(mode); }
const char* CudaBackend::prefill_kernel(int head_dim) {
  if (!cuda::attention_tuned_head_dim(head_dim, false)) return "generic";
  return cuda::prefill_kernel_name(cuda::prefill_kernel_for(head_dim));
}

CudaBackend::CudaBackend(int device)
    : device_(device), staging_(std::make_unique<Staging>()), graphs_(std::make_unique<Graphs>()) {
  std::string why;
  if (!cuda_device_available(&why)) fail("cuda: cannot create the backend on device {}: {}", device, why);
  ARBOR_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  ARBOR_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  n_sms_ = prop.multiProcessorCount;
  if (const char* env = std::getenv("ARBOR_CUDA_GEMV_MAX_ROWS")) set_gemv_max_rows(std::atoi(env));
  if (const char* env = std::getenv("ARBOR_CUDA_FUSED")) fused_ = std::atoi(env) != 0;
  if (const char* env = std::getenv("ARBOR_CUDA_FUSED_PREP")) fused_prep_ = std::atoi(env) != 0;
  if (const char* env = std::getenv("ARBOR_CUDA_GEMV_STREAM")) set_gemv_stream(std::atoi(env) != 0);
  if (const char* env = std::getenv("ARBOR_CUDA_GEMV_MMA")) set_gemv_mma(std::atoi(env) != 0);
  if (const char* env = std::getenv("ARBOR_CUDA_AFFINE_DEQUANT_ROWS")) affine_dequant_min_rows_ = std::max(9, std::atoi(env));
  if (const char* env = std::getenv("ARBOR_CUDA_DQ_STREAMS")) {
    dq_streams_ = std::atoi(env);
    ARBOR_CHECK(dq_streams_ == 1 || dq_streams_ == 2, "ARBOR_CUDA_DQ_STREAMS={}: 1 or 2 decoded slices in flight", env);
  }
  if (const char* env = std::getenv("ARBOR_CUDA_DQ_SLICE_MIB")) {
    const int mib = std::atoi(env);
    ARBOR_CHECK(mib >= 1 && mib <= 4096, "ARBOR_CUDA_DQ_SLICE_MIB={}: 1..4096 MiB per decoded slice", env);
    dq_slice_bytes_ = size_t(mib) << 20;
  }
  trellis_gemv_max_rows_ = cuda::kTrellisGemvMaxRows;
  if (const char* env = std::getenv("ARBOR_CUDA_TRELLIS_GEMV_ROWS"))
    trellis_gemv_max_rows_ = std::clamp<int64_t>(std::atoi(env), 1, cuda::kTrellisGemvMaxRows);
  int cluster_launch = 0;
  ARBOR_CUDA_CHECK(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device));
  cluster_merge_ok_ = cluster_launch != 0;
  if (const char* env = std::getenv("ARBOR_CUDA_ATTN_MERGE")) {
    const std::string m = env;
    ARBOR_CHECK(m == "0" || m == "1" || m == "2", "ARBOR_CUDA_ATTN_MERGE={}: 0 (a second kernel), 1 (the last split block) or 2 (a thread-block cluster)", m);
    attn_merge_ = std::stoi(m);
  }
  if (const char* env = std::getenv("ARBOR_CUDA_ATTN_CLUSTER")) {
    attn_cluster_max_ = std::atoi(env);
    ARBOR_CHECK(attn_cluster_max_ >= 1 && attn_cluster_max_ <= cuda::kDecodeMaxCluster, "ARBOR_CUDA_ATTN_CLUSTER={}: 1..{} blocks", env,
                cuda::kDecodeMaxCluster);
  }
  if (const char* env = std::getenv("ARBOR_CUDA_ATTN_WAVES")) {
    attn_min_waves_ = std::atoi(env);
    ARBOR_CHECK(attn_min_waves_ >= 1 && attn_min_waves_ <= 8, "ARBOR_CUDA_ATTN_WAVES={}: 1..8 waves of split blocks at least", env);
  }
  if (const char* env = std::getenv("ARBOR_CUDA_ATTN_WARPS")) {
    attn_warps_ = std::atoi(env);
    ARBOR_CHECK(attn_warps_ == 4 || attn_warps_ == 8, "ARBOR_CUDA_ATTN_WARPS={}: 4 or 8 warps per decode-attention block", env);
  }
  if (const char* env = std::getenv("ARBOR_CUDA_ATTN_PREFILL")) set_prefill_kernel(env);
  device_name_ = fmt::format("{} (sm_{}{}, {} SMs, {:.0f} GiB)", prop.name, prop.major, prop.minor, n_sms_,
                             double(prop.totalGlobalMem) / double(1 << 30));
  cudaStream_t s;
  ARBOR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  cublasLtHandle_t lt;
  ARBOR_CUBLAS_CHECK(cublasLtCreate(&lt));
  lt_ = lt;
  workspace_ = device_alloc(kWorkspaceBytes);
  workspace_bytes_ = kWorkspaceBytes;
  ARBOR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  dq_side_ = s;
  dq_side_workspace_ = device_alloc(kWorkspaceBytes);
  for (void** e : {&dq_fork_, &dq_join_}) {
    cudaEvent_t ev;
    ARBOR_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *e = ev;
  }
  for (int i = 0; i < kStageSlots; ++i) {
    ARBOR_CUDA_CHECK(cudaMallocHost(&staging_->weight[i], kStageBytes));
    ARBOR_CUDA_CHECK(cudaEventCreateWithFlags(&staging_->weight_done[i], cudaEventDisableTiming));
  }
  for (int i = 0; i < kMetaSlots; ++i) ARBOR_CUDA_CHECK(cudaEventCreateWithFlags(&staging_->meta_done[i], cudaEventDisableTiming));
  for (auto& e : pick_done_) {
    cudaEvent_t ev;
    ARBOR_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e = ev;
  }
}

CudaBackend::~CudaBackend() {
  if (capturing_) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
  }
  if (stream_) cudaStreamSynchronize(stream_);
  graphs_.reset();  // before the memory its recordings use
  staging_.reset();
  if (host_ids_) cudaFreeHost(host_ids_);
  for (auto e : pick_done_)
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  owned_.clear();
  if (lt_) cublasLtDestroy(lt_);
  for (void* e : {dq_fork_, dq_join_})
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (dq_side_) cudaStreamSynchronize(dq_side_), cudaStreamDestroy(dq_side_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const { return fmt::format("cuda {}: {}", device_, device_name_); }

void* CudaBackend::device_alloc(size_t bytes) {
  auto a = std::make_unique<Alloc>();
  cudaError_t e = cudaMalloc(&a->p, std::max<size_t>(bytes, 256));
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("cuda: cudaMalloc of {:.1f} MiB failed: {} ({:.1f} of {:.1f} GiB free)", double(bytes) / (1 << 20), cudaGetErrorString(e),
         double(free_b) / double(1 << 30), double(total_b) / double(1 << 30));
  }
  void* p = a->p;
  owned_.push_back(std::move(a));
  return p;
}

void CudaBackend::set_step_graphs(bool on) {
  not_capturing("set_step_graphs");
  graphs_on_ = on;
}

int64_t CudaBackend::graphs_recorded() const { return int64_t(graphs_->exec.size()); }

void CudaBackend::drop_graphs() {
  graphs_->clear();
  graphs_->seen.clear();
}

void CudaBackend::not_capturing(const char* what) {
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(st(stream_), &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
  fail("cuda: internal error: {} inside a decode-step recording (the step's ops must not upload, allocate or wait)", what);
}

bool CudaBackend::step_graph_begin() {
  not_capturing("step_graph_begin");
  if (!graphs_on_ || graph_key_ == 0) return false;
  auto it = graphs_->exec.find(graph_key_);
  if (it != graphs_->exec.end()) {
    ARBOR_CUDA_CHECK(cudaGraphLaunch(it->second, st(stream_)));
    return true;
  }
  if (graphs_->seen.insert(graph_key_).second) return false;  // first sighting: eager
  ARBOR_CUDA_CHECK(cudaStreamBeginCapture(st(stream_), cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  return false;
}

void CudaBackend::step_graph_end() {
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t g = nullptr;
  ARBOR_CUDA_CHECK(cudaStreamEndCapture(st(stream_), &g));
  struct GraphGuard {
    cudaGraph_t g;
    ~GraphGuard() {
      if (g) cudaGraphDestroy(g);
    }
  } guard{g};
  if (int64_t(graphs_->exec.size()) >= kMaxGraphs) {  // bounded host/device memory: start over (rare)
    ARBOR_CUDA_CHECK(cudaStreamSynchronize(st(stream_)));
    graphs_->clear();
  }
  cudaGraphExec_t e = nullptr;
  ARBOR_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  graphs_->exec.emplace(graph_key_, e);
  ARBOR_CUDA_CHECK(cudaGraphLaunch(e, st(stream_)));
}

// Scratch of `floats` floats for a launch that can do without it (a trellis axis-1 GEMV's staged-x image: without it
// every CTA stages x, correct and only slower), or null: none asked, or a capture in progress would need the buffer
// to grow.
float* CudaBackend::optional_scratch(int64_t floats) {
  if (floats == 0 || (size_t(floats) * 4 > scratch_cap_ && capturing_)) return nullptr;
  ensure(scratch_, scratch_cap_, size_t(floats) * 4);
  return static_cast<float*>(scratch_);
}

void CudaBackend::ensure(void*& buf, size_t& cap, size_t bytes) {
  if (bytes <= cap) return;
  not_capturing("growing a scratch buffer");
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffer may still be in use
  drop_graphs();                                     // recordings point into the old buffer
  for (auto it = owned_.begin(); it != owned_.end(); ++it)
    if ((*it)->p == buf && buf) {
      owned_.erase(it);
      break;
    }
  cap = std::max(bytes, cap * 2);
  buf = device_alloc(cap);
}

Tensor CudaBackend::alloc(DType t, std::initializer_list<int64_t> shape) {
  Tensor x(nullptr, t, shape, Device::CUDA);
  x.data = device_alloc(x.nbytes());
  return x;
}

// Host bytes -> device through the pinned buffers: memcpy (or f32->bf16 conversion) into one buffer
// while the other one's DMA runs.
void CudaBackend::stage_copy(void* dst, const void* src, size_t bytes, bool f32_to_bf16) {
  const size_t in_unit = f32_to_bf16 ? 4 : 1, out_unit = f32_to_bf16 ? 2 : 1;
  const size_t total_in = bytes;  // source bytes
  const size_t step_in = kStageBytes / out_unit * in_unit / 4 * 4;
  for (size_t off = 0; off < total_in; off += step_in) {
    const size_t n_in = std::min(step_in, total_in - off);
    Staging& s = *staging_;
    const int slot = s.next_weight;
    s.next_weight = (slot + 1) % kStageSlots;
    ARBOR_CUDA_CHECK(cudaEventSynchronize(s.weight_done[slot]));
    const char* from = static_cast<const char*>(src) + off;
    size_t n_out = n_in;
    if (f32_to_bf16) {
      const float* f = reinterpret_cast<const float*>(from);
      uint16_t* o = static_cast<uint16_t*>(s.weight[slot]);
      for (size_t i = 0; i < n_in / 4; ++i) o[i] = arbor::f32_to_bf16(f[i]);
      n_out = n_in / 2;
    } else {
      std::memcpy(s.weight[slot], from, n_in);
    }
    char* to = static_cast<char*>(dst) + off / in_unit * out_unit;
    ARBOR_CUDA_CHECK(cudaMemcpyAsync(to, s.weight[slot], n_out, cudaMemcpyHostToDevice, st(stream_)));
    ARBOR_CUDA_CHECK(cudaEventRecord(s.weight_done[slot], st(stream_)));
  }
}

Linear CudaBackend::load_linear(const Linear& host) {
  ARBOR_CHECK(host.format == WeightFormat::Dense || host.format == WeightFormat::Affine || host.format == WeightFormat::Trellis,
              "cuda: cannot load {} weights; supported: dense F32, BF16, F16 (F32 becomes BF16), affine 2/3/4/5/6/8-bit g32/64/128, "
              "trellis k 2/3/4", host.describe());
  Linear l = host;
  if (host.format == WeightFormat::Affine) load_affine(host, l);
  else if (host.format == WeightFormat::Trellis) load_trellis(host, l);
  else l.data = load_weight(host.data);
  if (!host.bias.empty()) l.bias = load_weight(host.bias);
  return l;
}

// affine.h's layout: the codes as they are, each group's scale and bias side by side in one 32-bit word in
// their file dtype (F16 when both are F16, else BF16: BF16 kept, F32 rounded as dense F32 weights are).
void CudaBackend::load_affine(const Linear& host, Linear& l) {
  const int64_t R = host.rows(), C = host.cols();
  const int bits = host.bits, gs = host.group_size;
  ARBOR_CHECK((bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8) && (gs == 32 || gs == 64 || gs == 128),
              "cuda: cannot load {} weights; supported: affine 2/3/4/5/6/8-bit g32/64/128", host.describe());
  ARBOR_CHECK(C % gs == 0, "cuda: {}: {} columns do not divide into groups of {}", host.describe(), C, gs);
  const int64_t W = C * bits / 32, G = C / gs;
  ARBOR_CHECK(host.data.dtype == DType::U32 && host.data.ndim == 2 && host.data.shape[0] == R && host.data.shape[1] == W,
              "cuda: {}: codes must be U32 [{}, {}], got {} {}", host.describe(), R, W, dtype_name(host.data.dtype), host.data.shape_str());
  for (const auto* t : {&host.scales, &host.biases})
    ARBOR_CHECK(float_dtype(t->dtype) && t->ndim == 2 && t->shape[0] == R && t->shape[1] == G,
                "cuda: {}: {} must be F32/F16/BF16 [{}, {}], got {} {}", host.describe(), t == &host.scales ? "scales" : "biases", R, G,
                dtype_name(t->dtype), t->shape_str());
  Tensor codes(nullptr, DType::U32, {R, W}, Device::CUDA);
  codes.data = device_alloc(codes.nbytes());
  stage_copy(codes.data, host.data.data, codes.nbytes(), false);
  const bool f16 = host.scales.dtype == DType::F16 && host.biases.dtype == DType::F16;
  auto half_bits = [&](const Tensor& t, int64_t i) -> uint32_t {
    const uint16_t* h = t.as<uint16_t>();
    if (t.dtype == (f16 ? DType::F16 : DType::BF16)) return h[i];
    const float f = t.dtype == DType::F32 ? t.as<float>()[i] : t.dtype == DType::F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
    return f32_to_bf16(f);
  };
  std::vector<uint32_t> pairs(size_t(R * G));
  for (int64_t i = 0; i < R * G; ++i) pairs[size_t(i)] = half_bits(host.scales, i) | half_bits(host.biases, i) << 16;
  Tensor sb(nullptr, f16 ? DType::F16 : DType::BF16, {R, G, 2}, Device::CUDA);
  sb.data = device_alloc(sb.nbytes());
  stage_copy(sb.data, pairs.data(), sb.nbytes(), false);
  l.data = codes, l.scales = sb, l.biases = Tensor();
}

// trellis.h's layout: the words in the plain layout (the k = 3 axis-0 interleaved file layout de-interleaved
// here), the f16 row scales as f32.
void CudaBackend::load_trellis(const Linear& host, Linear& l) {
  quant::TrellisConfig tc;
  tc.bits = host.bits, tc.group_size = host.group_size, tc.axis = host.axis;
  ARBOR_CHECK((tc.bits == 2 || tc.bits == 3 || tc.bits == 4) && tc.group_size == 256 && (tc.axis == 0 || tc.axis == 1),
              "cuda: cannot load {} weights; supported: trellis k 2/3/4, blocks of 256, axis 0 or 1", host.describe());
  const quant::TrellisGeometry g = quant::trellis_geometry(host.describe(), tc, host.data, host.scales, host.rows(), host.cols());
  const int64_t W = g.words_per_row();
  Tensor words(nullptr, DType::U32, {g.rows, W}, Device::CUDA);
  words.data = device_alloc(words.nbytes());
  if (g.interleaved) {
    const std::vector<uint32_t> plain = quant::trellis_deinterleave_k3(host.data.as<const uint32_t>(), g.rows, g.cols);
    stage_copy(words.data, plain.data(), words.nbytes(), false);
  } else {
    stage_copy(words.data, host.data.data, words.nbytes(), false);
  }
  std::vector<float> sc(size_t(g.rows));
  for (int64_t r = 0; r < g.rows; ++r) sc[size_t(r)] = f16_to_f32(host.scales.as<const uint16_t>()[r]);
  l.data = words, l.scales = upload_table(sc, {g.rows}), l.biases = Tensor();
}

Tensor CudaBackend::load_weight(const Tensor& host) {
  ARBOR_CHECK(host.dtype == DType::F32 || host.dtype == DType::BF16 || host.dtype == DType::F16,
              "cuda: weight {} has dtype {}; supported: F32, BF16, F16", host.shape_str(), dtype_name(host.dtype));
  if (host.ndim <= 1) {  // norm weights and biases: f32, so the ops never convert per element
    std::vector<float> f(size_t(host.numel()));
    for (size_t i = 0; i < f.size(); ++i)
      f[i] = host.dtype == DType::F32    ? host.as<float>()[i]
             : host.dtype == DType::BF16 ? bf16_to_f32(host.as<uint16_t>()[i])
                                         : f16_to_f32(host.as<uint16_t>()[i]);
    return upload_table(f, {host.numel()});
  }
  Tensor out = host;
  out.device = Device::CUDA;
  out.dtype = host.dtype == DType::F16 ? DType::F16 : DType::BF16;
  out.data = device_alloc(out.nbytes());
  stage_copy(out.data, host.data, host.nbytes(), host.dtype == DType::F32);
  return out;
}

void CudaBackend::alloc_kv(const KVLayout& layout) {
  // 32, 64, 96, 128, 256 take the tuned kernels; any other head_dim up to 512 the generic one.
  ARBOR_CHECK(layout.head_dim >= 1 && layout.head_dim <= cuda::kGenericMaxHeadDim,
              "cuda: head_dim {} is not supported by the attention kernels (1..{})", layout.head_dim, cuda::kGenericMaxHeadDim);
  ARBOR_CHECK(layout.codecs.empty() || int64_t(layout.codecs.size()) == layout.n_layers, "cuda: KV layout has {} layer codecs for {} layers",
              layout.codecs.size(), layout.n_layers);
  for (int64_t l = 0; l < layout.n_layers; ++l) {
    const KVCodecPair& c = layout.codec(l);
    if (c.plain()) continue;
    check_kv_codec(c, layout.head_dim);
    // The coded kernels (attention_kv.cu) hold a row 8 dims per lane: head_dim 64, 128 or 256, and
    // both sides coded, affine with affine or TurboQuant keys with TurboQuant values.
    ARBOR_CHECK(layout.head_dim == 64 || layout.head_dim == 128 || layout.head_dim == 256,
                "kv codec {} on cuda needs head_dim 64, 128 or 256 (the model's is {}, layer {}); use --kv-cache bf16", c.name(),
                layout.head_dim, l);
    const bool affine = c.k.kind == KVCodecKind::Affine && c.v.kind == KVCodecKind::Affine;
    const bool turbo = c.k.kind == KVCodecKind::TurboKey && c.v.kind == KVCodecKind::TurboValue;
    ARBOR_CHECK(affine || turbo, "kv codec {} (layer {}) is not supported on cuda: K and V must both be affine or both TurboQuant", c.name(),
                l);
  }
  if (!k_pools_.empty()) {  // a new layout (bench's codec sweep): free the old pools; recordings point at them
    not_capturing("alloc_kv");
    ARBOR_CUDA_CHECK(cudaStreamSynchronize(st(stream_)));
    drop_graphs();
    std::set<void*> old(k_pools_.begin(), k_pools_.end());
    old.insert(v_pools_.begin(), v_pools_.end());
    owned_.erase(std::remove_if(owned_.begin(), owned_.end(), [&](const std::unique_ptr<Alloc>& a) { return old.count(a->p) != 0; }),
                 owned_.end());
    k_pools_.clear(), v_pools_.clear();
  }
  kv_ = layout;
  // One block more than the layout: the spare block that padding tokens of decode graphs write to.
  // Each layer's pools are sized by its codec's row bytes (bf16 rows when plain), plus 16 bytes: the
  // coded kernels read a 3-bit lane's codes as whole words, up to a few bytes past the last row.
  const size_t slots = size_t((layout.n_blocks + 1) * layout.block_size * layout.n_kv_heads);
  k_pools_.clear(), v_pools_.clear();
  for (int64_t l = 0; l < layout.n_layers; ++l) {
    const KVCodecPair& c = layout.codec(l);
    for (int side = 0; side < 2; ++side) {
      const size_t bytes = slots * size_t((side ? c.v : c.k).row_bytes(layout.head_dim, 2)) + 16;
      void* p = device_alloc(bytes);
      ARBOR_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, st(stream_)));
      (side ? v_pools_ : k_pools_).push_back(p);
    }
  }
}

Tensor CudaBackend::k_pool(int64_t layer) const {
  const KVCodec& c = kv_.codec(layer).k;
  if (!c.plain()) return Tensor(k_pools_.at(size_t(layer)), DType::U8, {kv_.n_blocks, kv_.block_size, kv_.n_kv_heads, c.row_bytes(kv_.head_dim, 2)}, Device::CUDA);
  return Tensor(k_pools_.at(size_t(layer)), DType::BF16, {kv_.n_blocks, kv_.block_size, kv_.n_kv_heads, kv_.head_dim}, Device::CUDA);
}
Tensor CudaBackend::v_pool(int64_t layer) const {
  const KVCodec& c = kv_.codec(layer).v;
  if (!c.plain()) return Tensor(v_pools_.at(size_t(layer)), DType::U8, {kv_.n_blocks, kv_.block_size, kv_.n_kv_heads, c.row_bytes(kv_.head_dim, 2)}, Device::CUDA);
  return Tensor(v_pools_.at(size_t(layer)), DType::BF16, {kv_.n_blocks, kv_.block_size, kv_.n_kv_heads, kv_.head_dim}, Device::CUDA);
}

// Host ints -> the device buffer `dev`, through the next pinned metadata slot.
void CudaBackend::upload_meta(const std::vector<int32_t>& host, void*& dev, size_t& cap) {
  const size_t bytes = host.size() * sizeof(int32_t);
  if (bytes == 0) return;
  not_capturing("uploading batch metadata");  // a recorded copy would read the pinned slot at replay time
  ensure(dev, cap, bytes);
  Staging& s = *staging_;
  if (bytes > s.meta_cap) {
    ARBOR_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int i = 0; i < kMetaSlots; ++i) {
      if (s.meta[i]) ARBOR_CUDA_CHECK(cudaFreeHost(s.meta[i]));
      s.meta[i] = nullptr;
    }
    s.meta_cap = std::max(bytes, s.meta_cap * 2);
    for (int i = 0; i < kMetaSlots; ++i) ARBOR_CUDA_CHECK(cudaMallocHost(&s.meta[i], s.meta_cap));
  }
  const int slot = s.next_meta;
  s.next_meta = (slot + 1) % kMetaSlots;
  ARBOR_CUDA_CHECK(cudaEventSynchronize(s.meta_done[slot]));
  std::memcpy(s.meta[slot], host.data(), bytes);
  ARBOR_CUDA_CHECK(cudaMemcpyAsync(dev, s.meta[slot], bytes, cudaMemcpyHostToDevice, st(stream_)));
  ARBOR_CUDA_CHECK(cudaEventRecord(s.meta_done[slot], st(stream_)));
}

const BatchInfo& CudaBackend::batch() const {
  ARBOR_CHECK(batch_, "cuda: an op ran before begin_batch");
  return *batch_;
}

void CudaBackend::begin_batch(const BatchInfo& b) {
  not_capturing("begin_batch");
  batch_ = &b;
  ++batch_serial_;
  const int64_t T = b.n_tokens();
  ARBOR_CHECK(b.pos.size() == size_t(T) && b.seq.size() == size_t(T), "cuda: batch has {} tokens but {} positions, {} seq ids", T,
              b.pos.size(), b.seq.size());
  ARBOR_CHECK(b.block_tables.size() == size_t(b.n_seqs() * b.max_blocks), "cuda: block tables hold {} entries, {} x {} expected",
              b.block_tables.size(), b.n_seqs(), b.max_blocks);
  // Runs of consecutive tokens of one sequence (the prefill kernel tiles each run).
  runs_.clear();
  max_run_ = 0;
  for (int64_t t = 0; t < T;) {
    int64_t e = t + 1;
    while (e < T && b.seq[size_t(e)] == b.seq[size_t(t)]) ++e;
    runs_.insert(runs_.end(), {int32_t(t), int32_t(e - t), b.seq[size_t(t)]});
    max_run_ = std::max(max_run_, e - t);
    t = e;
  }
  const bool rope_rows = !b.rope_rows.empty();
  ARBOR_CHECK(!rope_rows || b.rope_rows.size() == size_t(T), "cuda: batch has {} tokens but {} rope rows", T, b.rope_rows.size());
  // One packed upload: tokens | pos | seq | block_tables | logit_rows [| rope_rows], each padded to 4
  // ints (16 B).
  auto pad = [](size_t n) { return (n + 3) / 4 * 4; };
  const size_t nt = pad(size_t(T)), nb = pad(b.block_tables.size()), nr = pad(b.logit_rows.size());
  std::vector<int32_t> packed(3 * nt + nb + nr + (rope_rows ? nt : 0), 0);
  std::copy(b.tokens.begin(), b.tokens.end(), packed.begin());
  std::copy(b.pos.begin(), b.pos.end(), packed.begin() + int64_t(nt));
  std::copy(b.seq.begin(), b.seq.end(), packed.begin() + int64_t(2 * nt));
  std::copy(b.block_tables.begin(), b.block_tables.end(), packed.begin() + int64_t(3 * nt));
  std::copy(b.logit_rows.begin(), b.logit_rows.end(), packed.begin() + int64_t(3 * nt + nb));
  if (rope_rows) std::copy(b.rope_rows.begin(), b.rope_rows.end(), packed.begin() + int64_t(3 * nt + nb + nr));
  upload_meta(packed, meta_, meta_cap_);
  int32_t* base = static_cast<int32_t*>(meta_);
  d_tokens_ = base, d_pos_ = base + nt, d_seq_ = base + 2 * nt, d_tables_ = base + 3 * nt, d_logit_rows_ = base + 3 * nt + nb;
  d_rope_rows_ = rope_rows ? base + 3 * nt + nb + nr : d_pos_;
  // The attention split reads the longest context rounded up (so that the launch shape, and a
  // recording of it, serve every step until the context crosses the next power of two).
  min_pos_ = INT32_MAX, max_pos_ = -1;
  for (auto p : b.pos) min_pos_ = std::min(min_pos_, p), max_pos_ = std::max(max_pos_, p);
  min_rope_row_ = min_pos_, max_rope_row_ = max_pos_;
  if (rope_rows) {
    min_rope_row_ = INT32_MAX, max_rope_row_ = -1;
    for (auto r : b.rope_rows) min_rope_row_ = std::min(min_rope_row_, r), max_rope_row_ = std::max(max_rope_row_, r);
  }
  span_bucket_ = 64;
  while (span_bucket_ < int64_t(max_pos_) + 1) span_bucket_ *= 2;
  slots_checked_ = false;
  // A decode step (one token per sequence, every row's logits) may run as a recorded graph: its
  // kernels read tokens, positions and tables from meta_, whose layout the key pins down.
  // (with rope_rows the layout has one more segment, and the rope reads it: bit 63 of the key).
  const bool decode_step = T > 0 && T <= kGraphMaxTokens && max_run_ == 1 && b.n_seqs() == T &&
                           int64_t(b.logit_rows.size()) == T && kv_.head_dim != 96;
  graph_key_ = decode_step ? (uint64_t(T) | uint64_t(b.max_blocks) << 16 | uint64_t(__builtin_ctzll(uint64_t(span_bucket_))) << 48 |
                              uint64_t(rope_rows) << 63)
                           : 0;
}

void CudaBackend::embed(const Linear& emb, Tensor out, float scale) {
  const bool affine = emb.format == WeightFormat::Affine;
  ARBOR_CHECK(affine || (emb.format == WeightFormat::Dense && (emb.data.dtype == DType::BF16 || emb.data.dtype == DType::F16)),
              "cuda: embed: no gather for {} tables; supported: dense BF16, F16, affine (loaded by load_linear)", emb.describe());
  ARBOR_CHECK(out.dtype == DType::BF16 && out.cols() == emb.cols(), "cuda: embed: output {} {} for a table of {} columns",
              dtype_name(out.dtype), out.shape_str(), emb.cols());
  const Tensor& table = emb.data;
  const auto& b = batch();
  const int64_t V = emb.rows();
  for (size_t t = 0; t < b.tokens.size(); ++t) {
    const int32_t id = b.tokens[t];
    ARBOR_CHECK(id < V, "embed: token id {} at batch row {} is outside the vocabulary ({})", id, t, V);
    ARBOR_CHECK(id >= 0 || -1 - int64_t(id) < last_pick_rows_, "embed: batch row {} takes the picked id of row {}, the last pick has {} rows",
                t, -1 - int64_t(id), last_pick_rows_);
  }
  if (affine) launch_affine_embed(affine_weights(emb), d_tokens_, d_ids_, b.n_tokens(), scale, out.as<uint16_t>(), stream_);
  else launch_embed(table.data, table.dtype, d_tokens_, d_ids_, b.n_tokens(), emb.cols(), scale, out.as<uint16_t>(), st(stream_));
}

void CudaBackend::norm(NormOp op, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor out) {
  ARBOR_CHECK(w.numel() == x.cols(), "norm: weight has {} elements, rows have {}", w.numel(), x.cols());
  ARBOR_CHECK(x.dtype == DType::BF16 && out.dtype == DType::BF16, "cuda: norm: activations must be BF16 (got {})", dtype_name(x.dtype));
  launch_norm(op, x.as<uint16_t>(), w.as<float>(), b.empty() ? nullptr : b.as<float>(), eps, x.rows(), x.cols(), out.as<uint16_t>(),
              st(stream_));
}

void CudaBackend::head_norm(NormOp op, Tensor x, int64_t head_dim, const Tensor& w, float eps) {
  ARBOR_CHECK(w.numel() == head_dim, "head_norm: weight has {} elements, heads have {}", w.numel(), head_dim);
  launch_norm(op, x.as<uint16_t>(), w.as<float>(), nullptr, eps, x.numel() / head_dim, head_dim, x.as<uint16_t>(), st(stream_));
}

// Many activation rows: W decoded to bf16 a slice of whole 256-row tiles at a time (at most
// dq_slice_bytes_; trellis axis 0 decodes 256 outputs per block), each slice's columns of y from
// cuBLASLt; then the bias. With dq_streams_ == 2 the odd slices go to a second buffer and stream
// (dq_side_, forked from stream_ and joined back before the bias), so two slices are in flight.
void CudaBackend::decoded_lt(const Tensor& x, const Linear& l, Tensor y, const float* bias, LinearKernel kernel) {
  const int64_t T = x.rows(), K = l.cols(), N = l.rows();
  const int64_t slice = std::min<int64_t>(N, std::max<int64_t>(256, int64_t(dq_slice_bytes_ / size_t(K * 2)) / 256 * 256));
  const bool two = dq_streams_ == 2 && slice < N;
  ensure(dq_slice_, dq_slice_cap_, size_t(slice * K) * 2);
  if (two) ensure(dq_slice2_, dq_slice2_cap_, size_t(slice * K) * 2);
  const size_t ysize = dtype_size(y.dtype);
  const bool trellis = kernel == LinearKernel::DequantTrellisLt;
  const TrellisWeights tw = trellis ? trellis_weights(l) : TrellisWeights{};
  const AffineWeights aw = trellis ? AffineWeights{} : affine_weights(l);
  if (two) {
    ARBOR_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(dq_fork_), st(stream_)));
    ARBOR_CUDA_CHECK(cudaStreamWaitEvent(st(dq_side_), static_cast<cudaEvent_t>(dq_fork_), 0));
  }
  int64_t i = 0;
  for (int64_t n0 = 0; n0 < N; n0 += slice, ++i) {
    const int64_t n = std::min(slice, N - n0);
    const bool side = two && (i & 1);
    CUstream_st* s = side ? dq_side_ : stream_;
    uint16_t* dq = static_cast<uint16_t*>(side ? dq_slice2_ : dq_slice_);
    if (trellis) launch_trellis_decode(tw, n0, n, dq, n_sms_, s);
    else launch_affine_dequant(aw, n0, n, dq, n_sms_, st(s));
    lt_gemm(lt_, dq, x.data, DType::BF16, static_cast<char*>(y.data) + size_t(n0) * ysize, y.dtype, T, n, K,
            side ? dq_side_workspace_ : workspace_, workspace_bytes_, st(s), N);
  }
  if (two) {
    ARBOR_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(dq_join_), st(dq_side_)));
    ARBOR_CUDA_CHECK(cudaStreamWaitEvent(st(stream_), static_cast<cudaEvent_t>(dq_join_), 0));
  }
  if (bias) launch_add_bias(y.data, y.dtype, bias, T, N, st(stream_));
}

void CudaBackend::linear(const Tensor& x, const Linear& l, Tensor y) {
  const int64_t T = x.rows(), K = l.cols(), N = l.rows();
  ARBOR_CHECK(x.cols() == K, "linear: input has {} columns, weight {} expects {}", x.cols(), l.describe(), K);
  ARBOR_CHECK(y.cols() == N && y.rows() == T, "linear: output {} for {} rows of weight {}", y.shape_str(), T, l.describe());
  ARBOR_CHECK(x.dtype == DType::BF16, "cuda: linear: activations must be BF16 (got {})", dtype_name(x.dtype));
  ARBOR_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "cuda: linear: output dtype {} (BF16 or F32)", dtype_name(y.dtype));
  const LinearKernel kernel = pick_linear(l, T);
  if (T == 0) return;
  const float* bias = l.bias.empty() ? nullptr : l.bias.as<float>();
  switch (kernel) {
    case LinearKernel::GemvAffine: {
      const AffineGemvOut o{affine_weights(l), bias, y.data};
      launch_affine_gemv_multi(&o, 1, x.as<uint16_t>(), y.dtype == DType::F32, T, n_sms_, stream_,
                               optional_scratch(affine_gemv_scratch_floats(o.w, T)));
      return;
    }
    case LinearKernel::GemmAffine: {
      const AffineWeights w = affine_weights(l);
      const int64_t partials = affine_gemm_scratch_floats(w, T, n_sms_);
      if (partials > 0) ensure(scratch_, scratch_cap_, size_t(partials) * 4);
      launch_affine_gemm(w, x.as<uint16_t>(), bias, y.data, y.dtype, T, partials > 0 ? static_cast<float*>(scratch_) : nullptr, n_sms_,
                         st(stream_));
      return;
    }
    case LinearKernel::DequantAffineLt:
    case LinearKernel::DequantTrellisLt: decoded_lt(x, l, y, bias, kernel); return;
    case LinearKernel::GemvTrellis: {
      const TrellisWeights w = trellis_weights(l);
      // Axis 0's scratch (split partials) is required, axis 1's (the staged-x image) optional.
      const int64_t floats = trellis_gemv_scratch_floats(w, T, n_sms_);
      float* scratch = w.axis == 1 ? optional_scratch(floats) : nullptr;
      if (w.axis == 0 && floats > 0) ensure(scratch_, scratch_cap_, size_t(floats) * 4), scratch = static_cast<float*>(scratch_);
      launch_trellis_gemv(w, x.as<uint16_t>(), bias, y.data, y.dtype == DType::F32, T, scratch, n_sms_, stream_);
      return;
    }
    case LinearKernel::GemvBf16:
    case LinearKernel::GemvF16:
      launch_gemv(l.data.data, l.data.dtype, x.as<uint16_t>(), bias, y.data, y.dtype, T, N, K, n_sms_, st(stream_));
      return;
    case LinearKernel::LtBf16:
      lt_gemm(lt_, l.data.data, x.data, DType::BF16, y.data, y.dtype, T, N, K, workspace_, workspace_bytes_, st(stream_));
      if (bias) launch_add_bias(y.data, y.dtype, bias, T, N, st(stream_));
      return;
    case LinearKernel::LtF16: break;
  }
  // f16 weights: cuBLASLt wants both operands f16 and gives f32 (then bias + conversion to y's dtype).
  ensure(scratch2_, scratch2_cap_, size_t(T * K) * 2);
  launch_bf16_to_f16(x.as<uint16_t>(), T * K, static_cast<uint16_t*>(scratch2_), st(stream_));
  if (y.dtype == DType::F32) {
    lt_gemm(lt_, l.data.data, scratch2_, DType::F16, y.data, DType::F32, T, N, K, workspace_, workspace_bytes_, st(stream_));
    if (bias) launch_add_bias(y.data, y.dtype, bias, T, N, st(stream_));
    return;
  }
  ensure(scratch_, scratch_cap_, size_t(T * N) * 4);
  lt_gemm(lt_, l.data.data, scratch2_, DType::F16, scratch_, DType::F32, T, N, K, workspace_, workspace_bytes_, st(stream_));
  launch_finish_f32(static_cast<float*>(scratch_), bias, T, N, y.data, y.dtype, st(stream_));
}

namespace {
bool is_gemv(CudaBackend::LinearKernel k) {
  return k == CudaBackend::LinearKernel::GemvBf16 || k == CudaBackend::LinearKernel::GemvF16 || k == CudaBackend::LinearKernel::GemvAffine ||
         k == CudaBackend::LinearKernel::GemvTrellis;
}
// Trellis matrices one GEMV launch can take together: axis 1, the same k and columns.
bool trellis_fusable(const Linear& a, const Linear& b) {
  return a.format == WeightFormat::Trellis && b.format == WeightFormat::Trellis && a.axis == 1 && b.axis == 1 && a.bits == b.bits &&
         a.cols() == b.cols();
}
TrellisGemvOut trellis_out(const Linear& l, void* y) { return {trellis_weights(l), l.bias.empty() ? nullptr : l.bias.as<float>(), y}; }
// Affine matrices one GEMV launch can take together: the same columns, bits, group size and scale dtype.
bool affine_fusable(const Linear& a, const Linear& b) {
  return a.format == WeightFormat::Affine && b.format == WeightFormat::Affine && a.cols() == b.cols() && a.bits == b.bits &&
         a.group_size == b.group_size && a.scales.dtype == b.scales.dtype;
}
AffineGemvOut affine_out(const Linear& l, void* y) { return {affine_weights(l), l.bias.empty() ? nullptr : l.bias.as<float>(), y}; }
}  // namespace

void CudaBackend::linear_multi(const Tensor& x, const LinearOut* outs, int n) {
  // One GEMV launch over every matrix's rows when the step is GEMV-sized and the matrices agree on
  // K and kernel; otherwise (prefill: cuBLASLt) one linear() each.
  bool one = fused_ && n >= 1 && n <= kGemvMaxSegments && x.rows() >= 1 && x.dtype == DType::BF16;
  const LinearKernel k0 = one ? pick_linear(*outs[0].l, x.rows()) : LinearKernel::LtBf16;
  one = one && is_gemv(k0);
  for (int i = 0; one && i < n; ++i) {
    const Linear& l = *outs[i].l;
    one = pick_linear(l, x.rows()) == k0 && l.cols() == x.cols() && outs[i].y.dtype == outs[0].y.dtype && outs[i].y.rows() == x.rows() &&
          outs[i].y.cols() == l.rows();
  }
  if (one && k0 == LinearKernel::GemvAffine) {
    for (int i = 1; one && i < n; ++i) one = affine_fusable(*outs[0].l, *outs[i].l);
    if (one) {
      AffineGemvOut a[kAffineGemvMaxSegments];
      for (int i = 0; i < n; ++i) a[i] = affine_out(*outs[i].l, outs[i].y.data);
      launch_affine_gemv_multi(a, n, x.as<uint16_t>(), outs[0].y.dtype == DType::F32, x.rows(), n_sms_, stream_,
                               optional_scratch(affine_gemv_scratch_floats(a[0].w, x.rows())));
      return;
    }
  }
  if (one && k0 == LinearKernel::GemvTrellis) {
    for (int i = 0; one && i < n; ++i) one = trellis_fusable(*outs[0].l, *outs[i].l);
    if (one) {
      TrellisGemvOut t[kTrellisGemvMaxSegments];
      for (int i = 0; i < n; ++i) t[i] = trellis_out(*outs[i].l, outs[i].y.data);
      float* scratch = optional_scratch(trellis_gemv_fused_scratch_floats(t[0].w.cols, x.rows()));
      launch_trellis_gemv_multi(t, n, x.as<uint16_t>(), outs[0].y.dtype == DType::F32, x.rows(), scratch, n_sms_, stream_);
      return;
    }
  }
  if (!one || outs[0].l->format != WeightFormat::Dense) {  // quantized matrices that did not fuse
    Backend::linear_multi(x, outs, n);
    return;
  }
  GemvOut g[kGemvMaxSegments];
  for (int i = 0; i < n; ++i) {
    const Linear& l = *outs[i].l;
    g[i] = {l.data.data, l.bias.empty() ? nullptr : l.bias.as<float>(), outs[i].y.data, l.rows()};
  }
  launch_gemv_multi(g, n, outs[0].l->data.dtype, x.as<uint16_t>(), outs[0].y.dtype, x.rows(), x.cols(), n_sms_, st(stream_));
}

void CudaBackend::add_norm(NormOp op, Tensor x, const Tensor& o, float scale, const Tensor& w, const Tensor& b, float eps, Tensor out) {
  if (!fused_) {
    Backend::add_norm(op, x, o, scale, w, b, eps, out);
    return;
  }
  ARBOR_CHECK(x.numel() == o.numel() && out.numel() == x.numel(), "add_norm: {} += {} into {}", x.shape_str(), o.shape_str(),
              out.shape_str());
  ARBOR_CHECK(w.numel() == x.cols(), "norm: weight has {} elements, rows have {}", w.numel(), x.cols());
  ARBOR_CHECK(x.dtype == DType::BF16 && o.dtype == DType::BF16 && out.dtype == DType::BF16, "cuda: add_norm: activations must be BF16");
  launch_add_norm(op, x.as<uint16_t>(), o.as<uint16_t>(), scale, w.as<float>(), b.empty() ? nullptr : b.as<float>(), eps, x.rows(),
                  x.cols(), out.as<uint16_t>(), st(stream_));
}

void CudaBackend::rope(Tensor x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const Tensor& cos, const Tensor& sin) {
  const auto& b = batch();
  check_rope_positions(cos.shape[0]);
  ARBOR_CHECK(rot_dim % 2 == 0 && rot_dim <= head_dim && cos.cols() == rot_dim / 2, "rope: rot_dim {} for head_dim {}, table {}",
              rot_dim, head_dim, cos.shape_str());
  launch_rope(x.as<uint16_t>(), d_rope_rows_, b.n_tokens(), n_heads, head_dim, rot_dim, cos.as<float>(), sin.as<float>(), st(stream_));
}

void CudaBackend::check_rope_positions(int64_t n_rows) const {
  const auto& b = batch();
  if (b.pos.empty()) return;
  const int32_t bad = min_rope_row_ < 0 ? min_rope_row_ : max_rope_row_;
  ARBOR_CHECK(min_rope_row_ >= 0 && max_rope_row_ < n_rows, "rope: table row {} outside the table ({} rows)", bad, n_rows);
}

void CudaBackend::check_kv_slots(int64_t layer, const Tensor& k, const Tensor& v) {
  const auto& b = batch();
  const int64_t row = kv_.n_kv_heads * kv_.head_dim, bs = kv_.block_size;
  ARBOR_CHECK(layer >= 0 && layer < kv_.n_layers, "kv: layer {} outside the pools ({})", layer, kv_.n_layers);
  ARBOR_CHECK(k.cols() == row && v.cols() == row, "kv: rows of {} / {} values, the cache holds {}", k.cols(), v.cols(), row);
  if (slots_checked_) return;  // the batch's slots are the same for every layer
  for (int64_t t = 0; t < b.n_tokens(); ++t) {
    const int32_t s = b.seq[size_t(t)], p = b.pos[size_t(t)];
    ARBOR_CHECK(s >= 0 && s < b.n_seqs() && p >= 0 && p / bs < b.max_blocks, "kv: token {} (sequence {}, position {}) outside the block tables",
                t, s, p);
    const int32_t block = b.block_tables[size_t(int64_t(s) * b.max_blocks + p / bs)];
    // Block n_blocks is the spare one padding tokens of decode graphs write to (alloc_kv adds it).
    ARBOR_CHECK(block >= 0 && block <= kv_.n_blocks, "kv: sequence {} position {} has no valid block ({})", s, p, block);
  }
  slots_checked_ = true;
}

void CudaBackend::kv_write(int64_t layer, const Tensor& k, const Tensor& v) {
  const auto& b = batch();
  check_kv_slots(layer, k, v);
  const int64_t row = kv_.n_kv_heads * kv_.head_dim;
  const KVCodecPair& c = kv_.codec(layer);
  if (!c.plain()) {
    launch_kv_write_coded(k.as<uint16_t>(), v.as<uint16_t>(), d_pos_, d_seq_, d_tables_, b.max_blocks, b.n_tokens(), int(kv_.n_kv_heads),
                          int(kv_.head_dim), kv_.block_size, kv_codec_dev(c.k, kv_.head_dim), kv_codec_dev(c.v, kv_.head_dim),
                          static_cast<uint8_t*>(k_pools_[size_t(layer)]), static_cast<uint8_t*>(v_pools_[size_t(layer)]), st(stream_));
    return;
  }
  launch_kv_write(k.as<uint16_t>(), v.as<uint16_t>(), d_pos_, d_seq_, d_tables_, b.max_blocks, b.n_tokens(), row, kv_.block_size,
                  static_cast<uint16_t*>(k_pools_[size_t(layer)]), static_cast<uint16_t*>(v_pools_[size_t(layer)]), st(stream_));
}

bool CudaBackend::prep_args(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const QKPrep& p, QKPrepArgs* a) {
  const auto& b = batch();
  const bool fusable = fused_ && p.norm != NormOp::LayerNorm && p.head_dim <= 256 && p.head_dim == kv_.head_dim && p.n_kv_heads == kv_.n_kv_heads &&
                       q.dtype == DType::BF16 && k.dtype == DType::BF16 && v.dtype == DType::BF16 && q.cols() == p.n_heads * p.head_dim;
  if (!fusable) return false;
  check_kv_slots(layer, k, v);
  if (p.q_norm) ARBOR_CHECK(p.q_norm->numel() == p.head_dim && p.k_norm && p.k_norm->numel() == p.head_dim, "head_norm: weights for {} dims", p.head_dim);
  if (p.cos) {
    check_rope_positions(p.cos->shape[0]);
    ARBOR_CHECK(p.rot_dim % 2 == 0 && p.rot_dim <= p.head_dim && p.cos->cols() == p.rot_dim / 2, "rope: rot_dim {} for head_dim {}, table {}",
                p.rot_dim, p.head_dim, p.cos->shape_str());
    a->cos = p.cos->as<float>(), a->sin = p.sin->as<float>(), a->half = int(p.rot_dim / 2);
  }
  a->q = const_cast<uint16_t*>(q.as<uint16_t>()), a->k = const_cast<uint16_t*>(k.as<uint16_t>()), a->v = v.as<uint16_t>();
  a->q_norm = p.q_norm ? p.q_norm->as<float>() : nullptr, a->k_norm = p.k_norm ? p.k_norm->as<float>() : nullptr;
  a->plus_one = p.norm == NormOp::RMSPlusOne, a->eps = p.eps;
  a->pos = d_pos_, a->rope_rows = d_rope_rows_, a->seq = d_seq_, a->tables = d_tables_, a->max_blocks = b.max_blocks,
  a->block_size = int32_t(kv_.block_size);
  a->k_pool = static_cast<uint16_t*>(k_pools_[size_t(layer)]), a->v_pool = static_cast<uint16_t*>(v_pools_[size_t(layer)]);
  a->T = int(b.n_tokens()), a->n_heads = int(p.n_heads), a->n_kv_heads = int(p.n_kv_heads), a->head_dim = int(p.head_dim);
  const KVCodecPair& c = kv_.codec(layer);
  if (!c.plain()) a->kc = kv_codec_dev(c.k, kv_.head_dim), a->vc = kv_codec_dev(c.v, kv_.head_dim);
  return true;
}

void CudaBackend::qk_prep_kv_write(int64_t layer, Tensor q, Tensor k, const Tensor& v, const QKPrep& p) {
  QKPrepArgs a;
  if (!prep_args(layer, q, k, v, p, &a)) {
    Backend::qk_prep_kv_write(layer, q, k, v, p);
    return;
  }
  launch_qk_prep(a, st(stream_));
}

void CudaBackend::prep_attention(int64_t layer, Tensor q, Tensor k, const Tensor& v, const QKPrep& prep, const AttentionParams& p,
                                 Tensor out) {
  // One token per sequence (no token reads a key another token of the launch writes), the decode
  // kernel, whole 8-dim lanes under rope.
  QKPrepArgs a;
  const KVCodecPair& c = kv_.codec(layer);
  const bool codec_fuses = c.plain() || coded_decode_takes_prep(kv_codec_dev(c.k, p.head_dim), kv_codec_dev(c.v, p.head_dim));
  if (fused_prep_ && max_run_ == 1 && codec_fuses && attn_path_ != AttentionPath::Generic && decode_attention_path(p.head_dim) && p.head_dim == prep.head_dim &&
      (!prep.cos || (prep.rot_dim / 2) % 8 == 0) && prep_args(layer, q, k, v, prep, &a)) {
    attention_impl(layer, q, p, out, &a);
    return;
  }
  Backend::prep_attention(layer, q, k, v, prep, p, out);
}

void CudaBackend::gated_up(const Tensor& x, const Linear& wg, const Linear& wu, ActOp op, Tensor gate, Tensor up, Tensor out) {
  bool one = fused_ && x.rows() >= 1 && x.dtype == DType::BF16 && out.dtype == DType::BF16 && wg.cols() == x.cols() &&
             wu.cols() == x.cols() && wg.rows() == wu.rows() && out.cols() == wg.rows() && out.rows() == x.rows();
  if (one) {
    const LinearKernel k = pick_linear(wg, x.rows());
    one = is_gemv(k) && pick_linear(wu, x.rows()) == k;
  }
  if (one && pick_linear(wg, x.rows()) == LinearKernel::GemvAffine && affine_fusable(wg, wu)) {
    const AffineGemvOut g = affine_out(wg, nullptr);
    launch_affine_gemv_gated(g, affine_out(wu, nullptr), int(op), x.as<uint16_t>(), out.as<uint16_t>(), x.rows(), n_sms_, stream_,
                             optional_scratch(affine_gemv_scratch_floats(g.w, x.rows())));
    return;
  }
  if (one && pick_linear(wg, x.rows()) == LinearKernel::GemvTrellis && trellis_fusable(wg, wu)) {
    launch_trellis_gemv_gated(trellis_out(wg, nullptr), trellis_out(wu, nullptr), int(op), x.as<uint16_t>(), out.as<uint16_t>(), x.rows(),
                              optional_scratch(trellis_gemv_fused_scratch_floats(wg.n_cols, x.rows())), n_sms_, stream_);
    return;
  }
  if (!one || wg.format != WeightFormat::Dense) {
    Backend::gated_up(x, wg, wu, op, gate, up, out);
    return;
  }
  const GemvOut g{wg.data.data, wg.bias.empty() ? nullptr : wg.bias.as<float>(), nullptr, wg.rows()};
  const GemvOut u{wu.data.data, wu.bias.empty() ? nullptr : wu.bias.as<float>(), nullptr, wu.rows()};
  launch_gemv_gated(g, u, op, wg.data.dtype, x.as<uint16_t>(), out.as<uint16_t>(), x.rows(), x.cols(), n_sms_, st(stream_));
}

bool CudaBackend::decode_attention_path(int64_t head_dim) const {
  // head_dim 96 (Phi-3-mini) has no decode kernel (96/8 lanes per key do not tile a warp): the
  // prefill kernel serves its decode steps too; the other untuned head_dims run the generic kernel.
  return cuda::attention_tuned_head_dim(int(head_dim), true) &&
         (attn_path_ == AttentionPath::Decode || (attn_path_ == AttentionPath::Auto && max_run_ <= kDecodeMaxRun));
}

void CudaBackend::attention(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out) { attention_impl(layer, q, p, out, nullptr); }

void CudaBackend::attention_impl(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out, const QKPrepArgs* prep) {
  const auto& b = batch();
  const int64_t T = b.n_tokens();
  ARBOR_CHECK(p.n_kv_heads == kv_.n_kv_heads && p.head_dim == kv_.head_dim && p.n_heads % p.n_kv_heads == 0,
              "cuda: attention: {} heads / {} kv heads of {} dims, the cache holds {} x {}", p.n_heads, p.n_kv_heads, p.head_dim,
              kv_.n_kv_heads, kv_.head_dim);
  if (T == 0) return;
  AttnArgs a;
  a.q = q.as<uint16_t>(), a.out = out.as<uint16_t>();
  a.k_pool = static_cast<const uint16_t*>(k_pools_.at(size_t(layer)));
  a.v_pool = static_cast<const uint16_t*>(v_pools_.at(size_t(layer)));
  a.pos = d_pos_, a.seq = d_seq_, a.block_tables = d_tables_, a.max_blocks = b.max_blocks, a.block_size = int32_t(kv_.block_size);
  if ((kv_.block_size & (kv_.block_size - 1)) == 0) a.block_shift = int32_t(__builtin_ctzll(uint64_t(kv_.block_size)));
  a.n_heads = int32_t(p.n_heads), a.n_kv_heads = int32_t(p.n_kv_heads), a.head_dim = int32_t(p.head_dim);
  a.scale = p.scale, a.softcap = p.softcap, a.window = int32_t(p.window);
  const int64_t G = p.n_heads / p.n_kv_heads;
  const KVCodecPair& codec = kv_.codec(layer);
  if (!codec.plain()) {
    if (attn_path_ != AttentionPath::Generic && decode_attention_path(p.head_dim)) {
      // Split-K over the codes (attention_kv.cu): splits as the bf16 kernel's 4-warp blocks take them.
      const int64_t span = p.window > 0 ? std::min<int64_t>(span_bucket_, p.window) : span_bucket_;
      const int64_t blocks = T * p.n_kv_heads * ((G + 7) / 8);
      const int64_t max_splits = (span + 15) / 16;
      const int64_t waves = std::clamp<int64_t>(span / 64 * blocks / n_sms_, attn_min_waves_, 8);
      const int64_t n_splits =
          std::clamp<int64_t>((waves * n_sms_ + blocks - 1) / blocks, 1, std::min<int64_t>(max_splits, kDecodeMaxSplits));
      ensure(scratch_, scratch_cap_, size_t(T * p.n_heads * n_splits * (p.head_dim + 2)) * 4);
      launch_attention_decode_coded_prep(a, kv_codec_dev(codec.k, p.head_dim), kv_codec_dev(codec.v, p.head_dim), T, int(n_splits),
                                         static_cast<float*>(scratch_), st(stream_), prep);
      return;
    }
    ARBOR_CHECK(!prep, "cuda: attention: the q/k prep is fused only into the decode kernels");
    // Prefill (and the generic kernel): the blocks the batch's sequences read, dequantized into bf16
    // scratch pools, then the bf16 kernels over those (a first step: docs/kv-cache.md).
    dequant_coded_blocks(layer, a);
  }
  if (attn_path_ == AttentionPath::Generic || (!decode_attention_path(p.head_dim) && !cuda::attention_tuned_head_dim(int(p.head_dim), false))) {
    ARBOR_CHECK(!prep, "cuda: attention: the q/k prep is fused only into the decode kernel");
    launch_attention_generic(a, T, st(stream_));
    return;
  }
  if (decode_attention_path(p.head_dim)) {
    // Splits from the bucketed context (begin_batch): each token cuts its own key range into
    // n_splits parts in the kernel, so the launch shape depends only on the bucket.
    const int64_t span = p.window > 0 ? std::min<int64_t>(span_bucket_, p.window) : span_bucket_;
    // Enough blocks for about two waves over the SMs, at least 16 keys per block (a batch-1 step at a
    // short context has few (kv head, split) blocks; fewer keys each keeps more SMs streaming). Long
    // spans take up to eight waves, about 64 keys per block: each block's warps have only two key
    // steps of loads in flight, so a few resident blocks per SM cannot cover the memory latency.
    const int64_t blocks = T * p.n_kv_heads * ((G + 7) / 8);
    const int64_t max_splits = (span + 15) / 16;
    const int64_t waves = std::clamp<int64_t>(span / 64 * blocks / n_sms_, attn_min_waves_, 8);
    int64_t n_splits = std::clamp<int64_t>((waves * n_sms_ + blocks - 1) / blocks, 1, std::min<int64_t>(max_splits, kDecodeMaxSplits));
    // 8 warps per block (blocks of <= 4 heads): about 170 registers a thread leave one such block per
    // SM, so half the splits (one wave where two were). Measured on the H200 (docs/cuda-notes.md,
    // session 9): faster for one token with GQA groups of 3-4 at ctx 512 (8B 251.4 -> 254.0 and 254.7
    // -> 257.2 tok/s), slower at ctx 8192, at batch 8-64 and for Qwen3's 2-head groups (cluster merge).
    const bool wide = attn_warps_ == 8 ? G <= 4 : attn_warps_ == 0 && T == 1 && G >= 3 && G <= 4 && span <= 2048;
    if (wide) n_splits = std::max<int64_t>(1, n_splits / 2);
    // The merge of the splits (docs/cuda-notes.md, sessions 3 and 5, H200): for GQA groups of 1-2 heads
    // at spans up to 2048, the splits of a (token, head chunk) form one thread-block cluster that
    // merges in distributed shared memory (at most attn_cluster_max_ splits; Qwen3-0.6B at ctx 512
    // 1042 -> 1172 tok/s); other small groups merge in their last block (1 launch); larger groups (8B:
    // 4 heads per block) in a second kernel, which measured faster for them than the cluster (249 vs
    // 251 tok/s) and than the last block (233 vs 241).
    const bool cluster_default = G <= 2 && span <= 2048;
    const bool merge_in_cluster = cluster_merge_ok_ && (attn_merge_ >= 0 ? attn_merge_ == 2 : cluster_default);
    if (merge_in_cluster) n_splits = std::min<int64_t>(n_splits, attn_cluster_max_);
    const bool merge_in_kernel = !merge_in_cluster && n_splits > 1 && (attn_merge_ >= 0 ? attn_merge_ == 1 : G <= 2);
    if (n_splits > 1 && !merge_in_cluster) ensure(scratch_, scratch_cap_, size_t(T * p.n_heads * n_splits * (p.head_dim + 2)) * 4);
    if (merge_in_kernel) {
      const size_t had = attn_counters_cap_;  // the merge counters start at zero (the kernel leaves them so)
      ensure(attn_counters_, attn_counters_cap_, size_t(T * p.n_heads) * 4);
      if (attn_counters_cap_ != had) ARBOR_CUDA_CHECK(cudaMemsetAsync(attn_counters_, 0, attn_counters_cap_, st(stream_)));
    }
    launch_attention_decode(a, T, int(n_splits), static_cast<float*>(scratch_),
                            merge_in_kernel ? static_cast<unsigned*>(attn_counters_) : nullptr, st(stream_), prep, merge_in_cluster, wide);
    return;
  }
  ARBOR_CHECK(!prep, "cuda: attention: the q/k prep is fused only into the decode kernel");
  if (tiles_serial_ != batch_serial_ || tiles_group_ != G) {
    // Tiles of up to kPrefillRows/G tokens of one run, with each tile's position range (keys it may need).
    const int64_t per_tile = kPrefillRows / G;
    ARBOR_CHECK(per_tile >= 1, "cuda: attention: GQA group of {} exceeds {} rows per tile", G, kPrefillRows);
    std::vector<int32_t> tiles;
    for (size_t r = 0; r < runs_.size(); r += 3) {
      for (int32_t t0 = runs_[r]; t0 < runs_[r] + runs_[r + 1]; t0 += int32_t(per_tile)) {
        const int32_t n = std::min<int32_t>(int32_t(per_tile), runs_[r] + runs_[r + 1] - t0);
        auto [lo, hi] = std::minmax_element(b.pos.begin() + t0, b.pos.begin() + t0 + n);
        tiles.insert(tiles.end(), {t0, n, runs_[r + 2], *lo, *hi, 0, 0, 0});
      }
    }
    upload_meta(tiles, tiles_, tiles_cap_);
    n_tiles_ = int64_t(tiles.size() / 8);
    tiles_serial_ = batch_serial_, tiles_group_ = G;
  }
  launch_attention_prefill(a, static_cast<const int32_t*>(tiles_), n_tiles_, st(stream_));
}

// The blocks each sequence of the batch reads (0 .. its last position's block), listed once per batch with
// a block table remapped onto the list; then this layer's coded blocks dequantized into bf16 scratch
// pools in list order, and `a` pointed at them.
void CudaBackend::dequant_coded_blocks(int64_t layer, AttnArgs& a) {
  const auto& b = batch();
  const int64_t bs = kv_.block_size;
  if (dq_serial_ != batch_serial_) {
    std::vector<int32_t> last(size_t(b.n_seqs()), -1);
    for (int64_t t = 0; t < b.n_tokens(); ++t)
      last[size_t(b.seq[size_t(t)])] = std::max<int32_t>(last[size_t(b.seq[size_t(t)])], int32_t(b.pos[size_t(t)] / bs));
    std::vector<int32_t> list, table(b.block_tables.size(), 0);
    for (int64_t s = 0; s < b.n_seqs(); ++s)
      for (int32_t j = 0; j <= last[size_t(s)]; ++j) {
        table[size_t(s * b.max_blocks + j)] = int32_t(list.size());
        list.push_back(b.block_tables[size_t(s * b.max_blocks + j)]);
      }
    dq_blocks_ = int64_t(list.size());
    const size_t pad = (list.size() + 3) / 4 * 4;
    list.resize(pad, 0);
    list.insert(list.end(), table.begin(), table.end());
    upload_meta(list, dq_meta_, dq_meta_cap_);
    dq_table_off_ = int64_t(pad);
    dq_serial_ = batch_serial_;
  }
  const size_t pool = size_t(dq_blocks_ * bs * kv_.n_kv_heads * kv_.head_dim) * 2;
  ensure(dq_pools_, dq_pools_cap_, 2 * pool + 16);
  uint16_t* ko = static_cast<uint16_t*>(dq_pools_);
  uint16_t* vo = ko + pool / 2;
  const KVCodecPair& c = kv_.codec(layer);
  const int32_t* list = static_cast<const int32_t*>(dq_meta_);
  launch_kv_dequant_blocks(static_cast<const uint8_t*>(k_pools_[size_t(layer)]), static_cast<const uint8_t*>(v_pools_[size_t(layer)]),
                           kv_codec_dev(c.k, kv_.head_dim), kv_codec_dev(c.v, kv_.head_dim), list, dq_blocks_, bs, int(kv_.n_kv_heads),
                           int(kv_.head_dim), ko, vo, st(stream_));
  a.k_pool = ko, a.v_pool = vo, a.block_tables = list + dq_table_off_;
}

void CudaBackend::activation(ActOp op, const Tensor& gate, const Tensor& up, Tensor out) {
  launch_activation(op, gate.empty() ? nullptr : gate.as<uint16_t>(), up.as<uint16_t>(), up.numel(), out.as<uint16_t>(), st(stream_));
}

void CudaBackend::add_scaled(Tensor y, const Tensor& x, float scale) {
  ARBOR_CHECK(y.numel() == x.numel(), "add_scaled: {} += {}", y.shape_str(), x.shape_str());
  launch_add_scaled(y.as<uint16_t>(), x.as<uint16_t>(), y.numel(), scale, st(stream_));
}

void CudaBackend::scale_softcap(Tensor x, float scale, float cap) {
  if (scale == 1.0f && cap <= 0) return;
  launch_scale_softcap(x.data, x.dtype, x.numel(), scale, cap, st(stream_));
}

void CudaBackend::gather_logit_rows(const Tensor& x, Tensor out) {
  const auto& b = batch();
  for (auto r : b.logit_rows) ARBOR_CHECK(r >= 0 && r < x.rows(), "gather_logit_rows: row {} outside {}", r, x.shape_str());
  ARBOR_CHECK(out.dtype == x.dtype && out.cols() == x.cols(), "gather_logit_rows: {} rows into {}", x.shape_str(), out.shape_str());
  launch_gather_rows(x.data, x.cols() * int64_t(dtype_size(x.dtype)), d_logit_rows_, int64_t(b.logit_rows.size()), out.data,
                     st(stream_));
}

Tensor CudaBackend::upload_table(const std::vector<float>& host, std::initializer_list<int64_t> shape) {
  Tensor t = alloc(DType::F32, shape);
  ARBOR_CHECK(size_t(t.numel()) == host.size(), "cuda: table has {} values for shape {}", host.size(), t.shape_str());
  stage_copy(t.data, host.data(), host.size() * sizeof(float), false);
  return t;
}

void CudaBackend::read_logits(const Tensor& logits, float* host) {
  not_capturing(__func__);
  ARBOR_CHECK(logits.dtype == DType::F32, "cuda: read_logits: logits are {} (F32 expected)", dtype_name(logits.dtype));
  ARBOR_CUDA_CHECK(cudaMemcpyAsync(host, logits.data, logits.nbytes(), cudaMemcpyDeviceToHost, st(stream_)));
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(st(stream_)));
}

// Buffers of the ids picked for R rows of V logits: device ids (a later step's embedding may read
// them), two slots of host-mapped ids that the kernels write directly (the host waits for an event,
// with no copy queued behind the kernel; two, so a pick can be queued while the host still reads the
// previous), and the argmax's per-block keys and per-row counters (zero between launches).
void CudaBackend::ensure_ids(int64_t R, int64_t V) {
  const size_t part_bytes = size_t(R * cuda::argmax_blocks(V)) * 8;
  const bool grows = size_t(R) * 4 > ids_cap_ || size_t(R) > host_ids_cap_ || part_bytes > argmax_part_cap_;
  ARBOR_CHECK(!grows || picks_.empty(), "cuda: picked ids for {} rows while {} picks are queued (their ids would be lost)", R,
              picks_.size());
  void* ids = d_ids_;
  ensure(ids, ids_cap_, size_t(R) * 4);
  d_ids_ = static_cast<int32_t*>(ids);
  ensure(argmax_part_, argmax_part_cap_, part_bytes);
  const size_t had = argmax_counters_cap_;
  ensure(argmax_counters_, argmax_counters_cap_, size_t(R) * 4);
  if (argmax_counters_cap_ != had) ARBOR_CUDA_CHECK(cudaMemsetAsync(argmax_counters_, 0, argmax_counters_cap_, st(stream_)));
  if (size_t(R) > host_ids_cap_) {
    ARBOR_CUDA_CHECK(cudaStreamSynchronize(st(stream_)));  // the old buffer may still be written
    if (host_ids_) ARBOR_CUDA_CHECK(cudaFreeHost(host_ids_));
    host_ids_ = nullptr;
    host_ids_cap_ = std::max(size_t(R), 2 * host_ids_cap_);
    ARBOR_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_ids_), 2 * host_ids_cap_ * 4, cudaHostAllocMapped));
    ARBOR_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_ids_dev_), host_ids_, 0));
  }
}

// A pick's two halves around its kernel: begin checks the logits and the queue and readies the
// buffers, returning the host slot the kernel writes; end records the slot's event and queues it.
int CudaBackend::begin_pick(const Tensor& logits) {
  ARBOR_CHECK(logits.dtype == DType::F32 && logits.device == Device::CUDA, "cuda: picking ids: device F32 logits expected");
  not_capturing("picking ids");
  ARBOR_CHECK(picks_.size() < 2, "cuda: picking ids: two picks are already queued (wait for one first)");
  ensure_ids(logits.rows(), logits.cols());
  const int slot = next_pick_slot_;
  next_pick_slot_ ^= 1;
  return slot;
}

void CudaBackend::end_pick(int slot, int64_t rows) {
  ARBOR_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(pick_done_[slot]), st(stream_)));
  picks_.push_back({slot, rows});
  last_pick_rows_ = rows;
}

bool CudaBackend::argmax_rows_start(const Tensor& logits) {
  const int slot = begin_pick(logits);
  launch_argmax(logits.as<float>(), logits.rows(), logits.cols(), static_cast<uint64_t*>(argmax_part_),
                static_cast<unsigned*>(argmax_counters_), d_ids_, host_ids_dev_ + size_t(slot) * host_ids_cap_, st(stream_));
  end_pick(slot, logits.rows());
  return true;
}

// A draw per row: the sample kernel, its parameters uploaded through the step metadata's pinned slots.
bool CudaBackend::sample_rows_start(const Tensor& logits, const std::vector<RowSampling>& rows) {
  const int64_t R = logits.rows();
  ARBOR_CHECK(int64_t(rows.size()) == R, "cuda: sampling: {} rows of parameters for {} logit rows", rows.size(), R);
  // The rows' parameters as int32 words (upload_meta's unit), in a buffer reused across steps.
  static_assert(sizeof(cuda::SampleRow) % 4 == 0, "sampling parameters travel as int32 words");
  constexpr size_t kWords = sizeof(cuda::SampleRow) / 4;
  sample_words_.resize(rows.size() * kWords);
  for (size_t i = 0; i < rows.size(); ++i) {
    const SamplingParams& r = rows[i].params;
    ARBOR_CHECK(r.top_p > 0 && r.top_p <= 1 && r.min_p >= 0 && r.min_p <= 1 && r.top_k >= 0 && r.top_k <= INT32_MAX,
                "cuda: sampling row {}: top_p {} must be in (0, 1], min_p {} in [0, 1], top_k {} in 0..{}", i, r.top_p, r.min_p, r.top_k,
                INT32_MAX);
    const cuda::SampleRow row{r.temperature, int32_t(r.top_k), r.top_p, r.min_p, r.seed, rows[i].counter};
    std::memcpy(sample_words_.data() + i * kWords, &row, sizeof(row));
  }
  const int slot = begin_pick(logits);
  upload_meta(sample_words_, sample_params_, sample_params_cap_);
  launch_sample(logits.as<float>(), R, logits.cols(), static_cast<const cuda::SampleRow*>(sample_params_), d_ids_,
                host_ids_dev_ + size_t(slot) * host_ids_cap_, n_sms_, st(stream_));
  end_pick(slot, R);
  return true;
}

void CudaBackend::wait_pick(int32_t* host_ids) {
  ARBOR_CHECK(!picks_.empty(), "cuda: wait_pick: no pick is queued");
  const Pick p = picks_.front();
  picks_.erase(picks_.begin());
  ARBOR_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(pick_done_[p.slot])));
  std::memcpy(host_ids, host_ids_ + size_t(p.slot) * host_ids_cap_, size_t(p.rows) * 4);
}

void CudaBackend::drop_picks() {
  if (picks_.empty()) return;
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(st(stream_)));
  picks_.clear();
}

void CudaBackend::upload(const void* host, const Tensor& dev) {
  not_capturing(__func__);
  ARBOR_CUDA_CHECK(cudaMemcpyAsync(dev.data, host, dev.nbytes(), cudaMemcpyHostToDevice, st(stream_)));
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(st(stream_)));
}

void CudaBackend::download(const Tensor& dev, void* host) {
  not_capturing(__func__);
  ARBOR_CUDA_CHECK(cudaMemcpyAsync(host, dev.data, dev.nbytes(), cudaMemcpyDeviceToHost, st(stream_)));
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(st(stream_)));
}

void CudaBackend::synchronize() {
  not_capturing(__func__);
  ARBOR_CUDA_CHECK(cudaStreamSynchronize(st(stream_)));
}

}  // namespace arbor
