// The decoder stack of a Llama-family model at a few rows, in one native call (kernels/decode_stack_cpu.py).
//
// A decode step at batch 1 does a few microseconds of work per op, and from Python each op cost 30-70 us
// (argument checks, allocations, a ctypes call). Here every layer runs the very same kernels in the same
// order as the Python path (inference/engine/llama.py on the `cpu` kernel set): the RMSNorms, rotary
// embedding, K/V store, SiLU-and-multiply and paged decode attention of kernels/csrc (called through their
// addresses in the library kernels.cpu_native loaded, so the same machine code), and PyTorch's
// `_weight_int4pack_mm_for_cpu` for the four projections below `int4_min_rows` rows and, from there, the C
// library's int4_gemm (its bits at any row count, kernels/int4_gemm_cpu.py), so the hidden states are bit for bit
// the Python path's. Rows are independent query rows: each has its own block table row and sequence length (a
// speculative step's draft rows of one sequence, or batch-invariant mode's prompt rows, each see the keys up to
// their own position; this step's keys are all stored before any row attends).
//
// A model's weights are registered once (`decode_stack_register` -> a handle) so a step passes only its
// activations and metadata.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_weight_int4pack_mm_for_cpu.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace {

using rms_norm_fn = void (*)(const void *, const void *, const void *, void *, void *, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, float, int, int, int);
using rotary_fn = int64_t (*)(const void *, void *, const int64_t *, const float *, int64_t, int64_t, int64_t,
                              int64_t, int64_t, int64_t, int, int);
using act_fn = void (*)(const void *, void *, int64_t, int64_t, int64_t, int64_t, int, int);
using store_fn = int64_t (*)(const void *, const void *, void *, void *, const int64_t *, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t);
using attention_fn = int (*)(const void *, int64_t, int64_t, const void *, const void *, int64_t, int64_t, int64_t,
                             const int32_t *, int64_t, int64_t, const int32_t *, void *, int64_t, int64_t, int64_t,
                             float, int, int64_t, int, int64_t);
using int4_gemm_fn = int (*)(const void *, const void *, const void *, void *, int64_t, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int, int);

constexpr int kBf16 = 1;      // kernels/csrc's dtype code
constexpr int64_t kGroup = 32;  // the int4 groups (inference.engine.packed_linear.GROUP_SIZE)
constexpr int64_t kWeightsPerLayer = 10;

struct Layer {
  at::Tensor in_norm, qkv, qkv_sz, o, o_sz, post_norm, gate_up, gate_up_sz, down, down_sz;
  int64_t window;
};

struct Stack {
  std::vector<Layer> layers;
  at::Tensor final_norm;
  int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate;
  double eps, scale;
  rms_norm_fn rms_norm;
  rotary_fn rotary;
  act_fn silu_and_mul;
  store_fn store_kv;
  attention_fn attention;
  int4_gemm_fn int4_gemm = nullptr;  // null: PyTorch's int4 kernel at every row count
  int int4_variant = 0;
  int64_t int4_min_rows = 0;
};

// x [rows, K] (contiguous) times a packed int4 weight: PyTorch's kernel, or from int4_min_rows rows the C
// library's GEMM with the same bits (as kernels/int4_gemm_cpu.int4_matmul picks).
at::Tensor int4_mm(const Stack &s, const at::Tensor &x, const at::Tensor &w, const at::Tensor &sz) {
  const int64_t rows = x.size(0);
  if (s.int4_gemm == nullptr || rows < s.int4_min_rows) return at::_weight_int4pack_mm_for_cpu(x, w, kGroup, sz);
  const int64_t n = sz.size(1), k = x.size(1);
  at::Tensor out = at::empty({rows, n}, x.options());
  const int status = s.int4_gemm(x.data_ptr(), w.data_ptr(), sz.data_ptr(), out.data_ptr(), rows, n, k, x.stride(0),
                                 n, kGroup, s.int4_variant, at::get_num_threads());
  TORCH_CHECK(status == 0, "decode_stack: int4_gemm failed (", status, ")");
  return out;
}

// Optional per-part timing (benchmarks/cpu_step_profile.py): nanoseconds spent in each part since the last read.
enum Part { kNorms, kQkv, kRotaryStore, kAttention, kOProj, kGateUp, kActivation, kDown, kParts };
std::atomic<bool> profiling{false};
std::array<std::atomic<int64_t>, kParts> part_ns{};

struct PartTimer {
  bool on = profiling.load(std::memory_order_relaxed);
  std::chrono::steady_clock::time_point last = on ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  void lap(Part part) {
    if (!on) return;
    const auto now = std::chrono::steady_clock::now();
    part_ns[part] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count();
    last = now;
  }
};

std::mutex registry_lock;
std::map<int64_t, std::shared_ptr<const Stack>> registry;
int64_t next_handle = 1;

std::shared_ptr<const Stack> find(int64_t handle) {
  std::lock_guard<std::mutex> guard(registry_lock);
  auto it = registry.find(handle);
  TORCH_CHECK(it != registry.end(), "decode_stack: no model registered as ", handle);
  return it->second;
}

void check_bf16_vector(const at::Tensor &t, int64_t n, const char *what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kBFloat16 && t.dim() == 1 && t.size(0) == n &&
                  t.is_contiguous(),
              "decode_stack: ", what, " must be a contiguous bfloat16 CPU vector of ", n);
}

// weights: per layer in_norm, qkv, qkv_sz, o, o_sz, post_norm, gate_up, gate_up_sz, down, down_sz (the packed
// int4 weights and their scales-and-zeros as packed_linear.Linear holds them); kernels: the five kernels'
// addresses (rms_norm_rows, rotary_rows, silu_and_mul_rows, store_kv_rows, paged_decode_attention); int4: empty, or
// int4_gemm's address, its variant and the row count from which it runs.
int64_t decode_stack_register(at::TensorList weights, at::Tensor final_norm, std::vector<int64_t> windows,
                              std::vector<int64_t> shape, double eps, double scale, std::vector<int64_t> kernels,
                              std::vector<int64_t> int4) {
  TORCH_CHECK(shape.size() == 5, "decode_stack: shape is hidden, heads, kv heads, head dim, intermediate");
  TORCH_CHECK(kernels.size() == 5, "decode_stack: five kernel addresses");
  const int64_t layers = static_cast<int64_t>(windows.size());
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(weights.size()) == layers * kWeightsPerLayer,
              "decode_stack: ", kWeightsPerLayer, " weights a layer");
  for (int64_t address : kernels) TORCH_CHECK(address != 0, "decode_stack: a kernel address is null");
  auto stack = std::make_shared<Stack>();
  stack->hidden = shape[0];
  stack->num_heads = shape[1];
  stack->num_kv_heads = shape[2];
  stack->head_dim = shape[3];
  stack->intermediate = shape[4];
  TORCH_CHECK(stack->hidden > 0 && stack->num_kv_heads > 0 && stack->num_heads % stack->num_kv_heads == 0 &&
                  stack->head_dim > 0 && stack->head_dim % 2 == 0 && stack->head_dim <= 1024 &&
                  stack->hidden <= 16384 && stack->intermediate > 0 && stack->intermediate <= 16384,
              "decode_stack: unsupported shape");
  stack->eps = eps;
  stack->scale = scale;
  stack->rms_norm = reinterpret_cast<rms_norm_fn>(kernels[0]);
  stack->rotary = reinterpret_cast<rotary_fn>(kernels[1]);
  stack->silu_and_mul = reinterpret_cast<act_fn>(kernels[2]);
  stack->store_kv = reinterpret_cast<store_fn>(kernels[3]);
  stack->attention = reinterpret_cast<attention_fn>(kernels[4]);
  TORCH_CHECK(int4.empty() || (int4.size() == 3 && int4[0] != 0 && (int4[1] == 0 || int4[1] == 1) && int4[2] >= 1),
              "decode_stack: int4 is empty or the GEMM's address, variant (0, 1) and first row count");
  if (!int4.empty()) {
    stack->int4_gemm = reinterpret_cast<int4_gemm_fn>(int4[0]);
    stack->int4_variant = static_cast<int>(int4[1]);
    stack->int4_min_rows = int4[2];
  }
  check_bf16_vector(final_norm, stack->hidden, "the final norm's weight");
  stack->final_norm = final_norm;
  const int64_t qkv_out = (stack->num_heads + 2 * stack->num_kv_heads) * stack->head_dim;
  for (int64_t i = 0; i < layers; i++) {
    const at::Tensor *w = weights.data() + i * kWeightsPerLayer;
    Layer layer{w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9], windows[i]};
    check_bf16_vector(layer.in_norm, stack->hidden, "an input norm's weight");
    check_bf16_vector(layer.post_norm, stack->hidden, "a post-attention norm's weight");
    TORCH_CHECK(layer.window >= 0, "decode_stack: a negative window");
    // scales-and-zeros are [K / 32, N, 2]: they give each projection's shape
    const std::pair<const at::Tensor *, std::pair<int64_t, int64_t>> projections[] = {
        {&layer.qkv_sz, {stack->hidden, qkv_out}},
        {&layer.o_sz, {stack->num_heads * stack->head_dim, stack->hidden}},
        {&layer.gate_up_sz, {stack->hidden, 2 * stack->intermediate}},
        {&layer.down_sz, {stack->intermediate, stack->hidden}},
    };
    for (const auto &[sz, kn] : projections)
      TORCH_CHECK(sz->dim() == 3 && sz->size(0) * kGroup == kn.first && sz->size(1) == kn.second &&
                      sz->scalar_type() == at::kBFloat16,
                  "decode_stack: a projection's int4 scales do not fit the model's shape");
    stack->layers.push_back(std::move(layer));
  }
  std::lock_guard<std::mutex> guard(registry_lock);
  const int64_t handle = next_handle++;
  registry[handle] = std::move(stack);
  return handle;
}

void decode_stack_unregister(int64_t handle) {
  std::lock_guard<std::mutex> guard(registry_lock);
  registry.erase(handle);
}

// hidden: the embedded input rows [T, H] bfloat16; positions, slot_mapping int64 [T]; block_tables int32 [T, M]
// and seq_lens int32 [T], a row each; cos_sin float32 [P, D]; a K and a V cache a layer
// [num_blocks, block_size, Hkv, D] bfloat16; num_splits: the attention's parts per row (0: the kernel's choice
// from the batch; < 0: parts of -num_splits tiles from each row's first key, batch-invariant mode's,
// kernels/row_attention.py). Writes this step's keys and values into the caches and returns the
// final hidden states [T, H] (after the model's last norm).
at::Tensor decode_stack_run(int64_t handle, const at::Tensor &hidden, const at::Tensor &positions,
                            const at::Tensor &slot_mapping, const at::Tensor &block_tables,
                            const at::Tensor &seq_lens, const at::Tensor &cos_sin, at::TensorList k_caches,
                            at::TensorList v_caches, int64_t num_splits) {
  const std::shared_ptr<const Stack> stack_ptr = find(handle);
  const Stack &s = *stack_ptr;
  const int64_t layers = static_cast<int64_t>(s.layers.size());
  TORCH_CHECK(hidden.device().is_cpu() && hidden.scalar_type() == at::kBFloat16 && hidden.dim() == 2 &&
                  hidden.size(1) == s.hidden && hidden.is_contiguous(),
              "decode_stack: hidden must be contiguous bfloat16 [T, ", s.hidden, "]");
  const int64_t rows = hidden.size(0);
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1 && positions.size(0) == rows &&
                  positions.is_contiguous() && slot_mapping.scalar_type() == at::kLong &&
                  slot_mapping.dim() == 1 && slot_mapping.size(0) == rows && slot_mapping.is_contiguous(),
              "decode_stack: positions and slot_mapping must be contiguous int64 [T]");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 && block_tables.size(0) == rows &&
                  block_tables.stride(1) == 1 && seq_lens.scalar_type() == at::kInt && seq_lens.dim() == 1 &&
                  seq_lens.size(0) == rows && seq_lens.is_contiguous(),
              "decode_stack: block_tables must be int32 [T, M] and seq_lens int32 [T], a row each");
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.dim() == 2 && cos_sin.size(1) == s.head_dim &&
                  cos_sin.is_contiguous(),
              "decode_stack: cos_sin must be contiguous float32 [P, head_dim]");
  TORCH_CHECK(static_cast<int64_t>(k_caches.size()) == layers && static_cast<int64_t>(v_caches.size()) == layers,
              "decode_stack: a K and a V cache a layer");
  // num_splits < 0: parts of -num_splits tiles from each row's first key (batch-invariant mode)
  const int64_t hq = s.num_heads, hkv = s.num_kv_heads, d = s.head_dim, h = s.hidden;
  const int64_t joint = (hq + hkv) * d, qkv_width = (hq + 2 * hkv) * d;
  for (int64_t i = 0; i < layers; i++) {
    const at::Tensor &k = k_caches[i], &v = v_caches[i];
    TORCH_CHECK(k.scalar_type() == at::kBFloat16 && k.dim() == 4 && k.size(2) == hkv && k.size(3) == d &&
                    k.is_contiguous() && v.sizes() == k.sizes() && v.scalar_type() == k.scalar_type() &&
                    v.is_contiguous(),
                "decode_stack: layer ", i, "'s caches must be contiguous bfloat16 [blocks, block_size, ", hkv, ", ",
                d, "]");
  }
  PartTimer timer;
  const int threads = at::get_num_threads();
  const float eps = static_cast<float>(s.eps);
  auto opts = hidden.options();
  at::Tensor residual = hidden;
  at::Tensor x = hidden;
  at::Tensor normed = at::empty({rows, h}, opts);
  at::Tensor joint_qk = at::empty({rows, hq + hkv, d}, opts);
  at::Tensor attn = at::empty({rows, hq * d}, opts);
  at::Tensor act = at::empty({rows, s.intermediate}, opts);
  const int64_t max_pos = cos_sin.size(0);
  for (int64_t i = 0; i < layers; i++) {
    const Layer &l = s.layers[i];
    const at::Tensor &k_cache = k_caches[i], &v_cache = v_caches[i];
    // input norm: the first layer normalises the embeddings, which are the residual stream
    if (i == 0) {
      s.rms_norm(x.data_ptr(), nullptr, l.in_norm.data_ptr(), normed.data_ptr(), nullptr, rows, h, h, 0, h, h, eps,
                 kBf16, 0, threads);
    } else {
      at::Tensor new_residual = at::empty({rows, h}, opts);
      s.rms_norm(x.data_ptr(), residual.data_ptr(), l.in_norm.data_ptr(), normed.data_ptr(),
                 new_residual.data_ptr(), rows, h, h, h, h, h, eps, kBf16, 0, threads);
      residual = new_residual;
    }
    timer.lap(kNorms);
    at::Tensor qkv = int4_mm(s, normed, l.qkv, l.qkv_sz);
    timer.lap(kQkv);
    TORCH_CHECK(qkv.is_contiguous() && qkv.size(1) == qkv_width, "decode_stack: unexpected qkv output");
    char *qkv_ptr = static_cast<char *>(qkv.data_ptr());
    const int64_t bad_pos = s.rotary(qkv_ptr, joint_qk.data_ptr(), positions.data_ptr<int64_t>(),
                                     cos_sin.data_ptr<float>(), rows, hq + hkv, d, qkv_width, d, max_pos, kBf16,
                                     threads);
    TORCH_CHECK(bad_pos == 0, "decode_stack: a rotary position is outside the cos/sin cache of ", max_pos,
                " positions");
    char *k_rot = static_cast<char *>(joint_qk.data_ptr()) + hq * d * 2;
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
    const int64_t bad_slots = s.store_kv(k_rot, qkv_ptr + (hq + hkv) * d * 2, k_cache.data_ptr(), v_cache.data_ptr(),
                                         slot_mapping.data_ptr<int64_t>(), rows, hkv * d, joint, qkv_width, 2,
                                         num_slots);
    TORCH_CHECK(bad_slots == 0, "decode_stack: ", bad_slots, " slot(s) out of range for a cache of ", num_slots,
                " slots");
    timer.lap(kRotaryStore);
    const int status = s.attention(joint_qk.data_ptr(), joint, d, k_cache.data_ptr(), v_cache.data_ptr(),
                                   k_cache.size(0), k_cache.size(1), hkv, block_tables.data_ptr<int32_t>(),
                                   block_tables.stride(0), block_tables.size(1), seq_lens.data_ptr<int32_t>(),
                                   attn.data_ptr(), rows, hq, d, static_cast<float>(s.scale), kBf16, num_splits, threads,
                                   l.window);
    TORCH_CHECK(status == 0, "decode_stack: paged decode attention failed (", status, ")");
    timer.lap(kAttention);
    at::Tensor o = int4_mm(s, attn, l.o, l.o_sz);
    timer.lap(kOProj);
    at::Tensor new_residual = at::empty({rows, h}, opts);
    s.rms_norm(o.data_ptr(), residual.data_ptr(), l.post_norm.data_ptr(), normed.data_ptr(), new_residual.data_ptr(),
               rows, h, h, h, h, h, eps, kBf16, 0, threads);
    residual = new_residual;
    timer.lap(kNorms);
    at::Tensor gate_up = int4_mm(s, normed, l.gate_up, l.gate_up_sz);
    timer.lap(kGateUp);
    s.silu_and_mul(gate_up.data_ptr(), act.data_ptr(), rows, s.intermediate, 2 * s.intermediate, s.intermediate,
                   kBf16, threads);
    timer.lap(kActivation);
    x = int4_mm(s, act, l.down, l.down_sz);
    timer.lap(kDown);
  }
  at::Tensor out = at::empty({rows, h}, opts);
  s.rms_norm(x.data_ptr(), residual.data_ptr(), s.final_norm.data_ptr(), out.data_ptr(), normed.data_ptr(), rows, h,
             h, h, h, h, eps, kBf16, 0, threads);
  timer.lap(kNorms);
  return out;
}

// Turns the per-part timing on or off and returns the nanoseconds of each part since the last call (norms, qkv,
// rotary + K/V store, attention, o_proj, gate_up, activation, down), zeroing them.
std::vector<int64_t> decode_stack_profile(bool enable) {
  profiling = enable;
  std::vector<int64_t> out;
  for (auto &ns : part_ns) out.push_back(ns.exchange(0));
  return out;
}

}  // namespace

TORCH_LIBRARY(llmp_decode_stack, m) {
  m.def("register(Tensor[] weights, Tensor final_norm, int[] windows, int[] shape, float eps, float scale, "
        "int[] kernels, int[] int4) -> int",
        &decode_stack_register);
  m.def("unregister(int handle) -> ()", &decode_stack_unregister);
  m.def("profile(bool enable) -> int[]", &decode_stack_profile);
  m.def("run(int handle, Tensor hidden, Tensor positions, Tensor slot_mapping, Tensor block_tables, "
        "Tensor seq_lens, Tensor cos_sin, Tensor[] k_caches, Tensor[] v_caches, int num_splits) -> Tensor",
        &decode_stack_run);
}
