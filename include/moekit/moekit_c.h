/* moekit's C API: the one stable boundary that Python (python/moekit) and other languages bind to.
 *
 * C99, no C++ types: opaque handles, DLPack tensors in and out, integer status codes and a
 * thread-local error string that carries the library's message. No call aborts or throws.
 *
 *   moekit_layer_options opt;
 *   moekit_layer_options_init(&opt);                  // bf16, device "auto", backend "auto", ...
 *   opt.device = "cpu";
 *   moekit_layer* layer = NULL;
 *   if (moekit_layer_create("qwen3-30b-a3b", 0, &opt, &layer) != MOEKIT_OK)
 *     fprintf(stderr, "%s\n", moekit_last_error());
 *   moekit_layer_forward(layer, &x, &router_logits, &out, stream);  // x (M, H), logits (M, E)
 *   moekit_layer_destroy(layer);
 *
 * Tensors. Arguments typed `const DLTensor*` are borrowed for the duration of the call (the caller
 * keeps ownership; nothing is retained). Arguments typed `DLManagedTensor*` are taken over: the
 * library calls their deleter when it no longer needs them, also when the call fails. Results
 * typed `DLManagedTensor**` belong to the caller, who calls their deleter. Dtypes: bf16, f16,
 * f32, f64, int8, uint8, int32, int64; devices: kDLCPU and kDLCUDA. Packed and fp8 formats travel
 * as uint8.
 *
 * Streams. `void* stream` is a cudaStream_t. NULL: the layer's own stream, and the call returns
 * when the result is ready. MOEKIT_STREAM_LEGACY names the legacy default stream (what PyTorch's
 * default stream is). Any other stream: the work is queued on it and the call returns at once;
 * with the output preallocated by the caller nothing is allocated, so forwards can be captured in
 * a CUDA graph. Ignored on the CPU.
 *
 * Threads. A moekit_layer serves one call at a time (its routing buffers and workspaces are its
 * own); different layers may be called from different threads at once.
 *
 * Strings. Results typed `char**` are NUL-terminated, allocated by the library and released with
 * moekit_string_free. moekit_last_error's string belongs to the library (valid until the next
 * failing call on the same thread).
 */
#ifndef MOEKIT_MOEKIT_C_H_
#define MOEKIT_MOEKIT_C_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MOEKIT_C_EXPORT __attribute__((visibility("default")))
#else
#define MOEKIT_C_EXPORT
#endif

/* Bumped when a signature or a struct of this header changes incompatibly. */
#define MOEKIT_C_API_VERSION 1

/* The legacy default CUDA stream (cudaStreamLegacy). */
#define MOEKIT_STREAM_LEGACY ((void*)1)

typedef enum moekit_status {
  MOEKIT_OK = 0,
  MOEKIT_ERROR = 1,             /* refused or failed (a bad tensor, name, value or file, a CUDA
                                   error): the message says which */
  MOEKIT_ERROR_UNSUPPORTED = 2, /* no backend serves the deployment (every reason listed) */
  MOEKIT_ERROR_OUT_OF_MEMORY = 3,
  MOEKIT_ERROR_INTERNAL = 4
} moekit_status;

/* ---- the library ------------------------------------------------------------------------- */

MOEKIT_C_EXPORT const char* moekit_version(void);     /* "0.1.0" */
MOEKIT_C_EXPORT int32_t moekit_c_api_version(void);   /* MOEKIT_C_API_VERSION of the build */
MOEKIT_C_EXPORT int32_t moekit_built_with_cuda(void); /* 1 when the CUDA path was built */
MOEKIT_C_EXPORT int32_t moekit_cuda_device_count(void);
/* The message of the last failing call on this thread ("" when none failed). */
MOEKIT_C_EXPORT const char* moekit_last_error(void);
MOEKIT_C_EXPORT void moekit_string_free(char* text);
/* sizeof of a struct of this header by its name ("moekit_layer_options", ...), 0 when unknown:
 * bindings that mirror the structs check their layout with it. */
MOEKIT_C_EXPORT size_t moekit_struct_size(const char* struct_name);

/* ---- options ----------------------------------------------------------------------------- */

/* How a layer is deployed. Strings may be NULL for their default. Fields past struct_size (an
 * older caller's struct) keep their defaults. */
typedef struct moekit_layer_options {
  uint32_t struct_size;    /* sizeof(moekit_layer_options), set by moekit_layer_options_init */
  const char* dtype;       /* activations and unquantized weights: "bf16" (default), "f16", "f32" */
  const char* device;      /* "auto" (the GPU when present, default), "cpu", "cuda", "cuda:N";
                              for moekit_explain also "h200", "h100", "a100", "b200" */
  const char* backend;     /* force an experts backend by name; "auto" (default): the oracle */
  const char* tile_config; /* force the experts' GEMM tile config by name; "auto" (default) */
  int64_t max_num_tokens;  /* tokens per forward at most (sizes the workspaces); 8192 */
  int32_t tp_size;         /* tensor-parallel size (1) */
  int32_t tp_rank;         /* this rank in it (0) */
  int32_t dp_size;         /* data-parallel size (1) */
  int32_t dp_rank;         /* this rank in it (0) */
  int32_t enable_ep;       /* 1: expert parallelism over the tp_size * dp_size ranks (EP size), this
                              rank dp_rank * tp_size + tp_rank (EP rank); 0 (default): none */
  const char* all2all;     /* EP token exchange: "naive" (default), "allgather_reducescatter",
                              "nccl_all2all", "batched_low_latency", "megakernel" */
} moekit_layer_options;

MOEKIT_C_EXPORT void moekit_layer_options_init(moekit_layer_options* options);

/* ---- layers ------------------------------------------------------------------------------ */

typedef struct moekit_layer moekit_layer;

/* A layer with seeded random weights. `model`: a preset name ("qwen3-30b-a3b", "tiny", ...) or a
 * HuggingFace config.json (the file or its directory). `options` may be NULL (defaults). */
MOEKIT_C_EXPORT moekit_status moekit_layer_create(const char* model, uint64_t seed,
                                                  const moekit_layer_options* options,
                                                  moekit_layer** layer);

/* MoE layer `layer_index` of a HuggingFace-layout checkpoint directory (config.json with its
 * quantization_config, *.safetensors): any scheme the library loads. */
MOEKIT_C_EXPORT moekit_status moekit_layer_load(const char* checkpoint_dir, int32_t layer_index,
                                                const moekit_layer_options* options,
                                                moekit_layer** layer);

/* A layer's tensors, given by the caller (unquantized, in options.dtype on options.device;
 * E_local experts, N1 = 2I gated or I). Unused entries are NULL. */
typedef struct moekit_layer_tensors {
  uint32_t struct_size;                     /* sizeof(moekit_layer_tensors) */
  DLManagedTensor* w13;                     /* (E_local, N1, H) */
  DLManagedTensor* w2;                      /* (E_local, H, I) */
  DLManagedTensor* w13_bias;                /* (E_local, N1), models with expert biases */
  DLManagedTensor* w2_bias;                 /* (E_local, H) */
  DLManagedTensor* e_score_correction_bias; /* (E,) f32, DeepSeek-V3 routing */
  DLManagedTensor* shared_w13;              /* (2 I_s, H), models with shared experts */
  DLManagedTensor* shared_w2;               /* (H, I_s) */
  DLManagedTensor* router_weight;           /* (E, H) f32 on the CPU, optional gate */
  DLManagedTensor* shared_gate; /* (1, H), models whose shared experts have a per-token gate */
  DLManagedTensor* router_bias; /* (E,) f32 on the CPU, with router_weight: the gate's bias
                                   (gpt-oss), added by moekit_layer_router_logits */
} moekit_layer_tensors;

/* A layer over caller tensors. The layer takes every non-NULL tensor over (also on failure) and
 * rewrites w13 / w2 (and their biases) IN PLACE into its kernel's weight layout: views the caller
 * kept see that layout afterwards (moekit_layer_expert_reference reads the standard one back).
 * Layers whose shared experts fold into the routed experts copy w13 / w2 and the shared tensors
 * once into tensors with room for the shared chunks instead (and release the given ones). */
MOEKIT_C_EXPORT moekit_status moekit_layer_create_from_tensors(const char* model,
                                                               const moekit_layer_tensors* tensors,
                                                               const moekit_layer_options* options,
                                                               moekit_layer** layer);

MOEKIT_C_EXPORT void moekit_layer_destroy(moekit_layer* layer);

typedef struct moekit_layer_info {
  uint32_t struct_size; /* set by the caller: sizeof(moekit_layer_info) */
  int32_t num_experts;  /* E (global) */
  int32_t num_local_experts;
  int32_t first_local_expert;
  int32_t top_k;
  int64_t hidden_size;       /* H */
  int64_t intermediate_size; /* I per expert (per TP rank) */
  int64_t max_num_tokens;
  DLDataType dtype; /* of hidden_states and output */
  DLDevice device;
  int32_t is_quantized;
  int32_t is_monolithic; /* the experts route internally (no forward_routed) */
  int32_t has_shared_experts;
  int32_t has_router_weight; /* moekit_layer_router_logits works */
  double tolerance_rel_l2;   /* the library's tolerance for this scheme vs a float64 reference */
} moekit_layer_info;

MOEKIT_C_EXPORT moekit_status moekit_layer_get_info(const moekit_layer* layer,
                                                    moekit_layer_info* info);

typedef enum moekit_layer_text {
  MOEKIT_TEXT_EXPLAIN = 0,  /* model, deployment, scheme and the plan: what moekit_explain says */
  MOEKIT_TEXT_PLAN = 1,     /* the plan: experts and prepare/finalize tables, weight layout */
  MOEKIT_TEXT_MODEL = 2,    /* "qwen3-30b-a3b: E=128 top_k=8 H=2048 I=768 silu, ..." */
  MOEKIT_TEXT_SCHEME = 3,   /* "unquantized (bf16)", or the quant keys */
  MOEKIT_TEXT_BACKEND = 4,  /* the chosen experts backend's name, e.g. "sm90_grouped" */
  MOEKIT_TEXT_EXPERTS = 5,  /* the experts class, e.g. "Sm90GroupedExperts" */
  MOEKIT_TEXT_TOLERANCE = 6 /* the tolerance-table entry: "bf16", "fp8_w8a8", ... */
} moekit_layer_text;

MOEKIT_C_EXPORT moekit_status moekit_layer_get_text(const moekit_layer* layer,
                                                    moekit_layer_text what, char** text);

/* hidden_states (M, H) in the layer dtype, router_logits (M, E) f32/bf16/f16 -> output (M, H),
 * all contiguous on the layer's device, M <= max_num_tokens (M = 0 is fine). */
MOEKIT_C_EXPORT moekit_status moekit_layer_forward(moekit_layer* layer,
                                                   const DLTensor* hidden_states,
                                                   const DLTensor* router_logits,
                                                   const DLTensor* output, void* stream);

/* The same with routing done by the caller: topk_ids (M, k) int32/int64 (global expert ids),
 * topk_weights (M, k) f32. Not for layers whose experts route internally (is_monolithic). */
MOEKIT_C_EXPORT moekit_status moekit_layer_forward_routed(moekit_layer* layer,
                                                          const DLTensor* hidden_states,
                                                          const DLTensor* topk_ids,
                                                          const DLTensor* topk_weights,
                                                          const DLTensor* output, void* stream);

/* The layer's router alone: topk_weights (M, k) f32 and topk_ids (M, k) int32, caller-owned. */
MOEKIT_C_EXPORT moekit_status moekit_layer_route(moekit_layer* layer, const DLTensor* hidden_states,
                                                 const DLTensor* router_logits,
                                                 const DLTensor* topk_weights,
                                                 const DLTensor* topk_ids, void* stream);

/* x (M, H) on the CPU -> logits (M, E) f32 on the CPU through the layer's gate weight (checkpoint
 * layers). */
MOEKIT_C_EXPORT moekit_status moekit_layer_router_logits(const moekit_layer* layer,
                                                         const DLTensor* hidden_states,
                                                         DLManagedTensor** router_logits);

/* Local expert `expert` as f32 CPU tensors in the standard layout, dequantized for quantized
 * schemes: w13 (N1, H), w2 (H, I), biases (N1,) / (H,) (NULL when the layer has none). */
typedef struct moekit_expert_tensors {
  uint32_t struct_size; /* set by the caller: sizeof(moekit_expert_tensors) */
  DLManagedTensor* w13;
  DLManagedTensor* w2;
  DLManagedTensor* w13_bias;
  DLManagedTensor* w2_bias;
} moekit_expert_tensors;

MOEKIT_C_EXPORT moekit_status moekit_layer_expert_reference(const moekit_layer* layer,
                                                            int64_t expert,
                                                            moekit_expert_tensors* tensors);

/* Times `iterations` forwards of the layer from C++ (after two warm-up calls): *host_us, the host
 * time per call until the last one is queued; *wall_us, per call until the results are ready. The
 * per-call overhead of a binding is its own time minus these. */
MOEKIT_C_EXPORT moekit_status moekit_layer_benchmark(
    moekit_layer* layer, const DLTensor* hidden_states, const DLTensor* router_logits,
    const DLTensor* output, void* stream, int32_t iterations, double* host_us, double* wall_us);

/* ---- deployments without weights ---------------------------------------------------------- */

/* The plan a layer of `model` (preset name, config.json, or a checkpoint directory) would get under
 * `options`: the oracle's candidates with every reason, the prepare/finalize, the weight layout.
 * `quantization`: NULL or "" (a checkpoint directory's own quantization_config, else unquantized),
 * or a scheme name of `moekit make-fixture` ("fp8_block128", "nvfp4", ...). Returns OK also when
 * nothing can serve the deployment (the text says why). */
MOEKIT_C_EXPORT moekit_status moekit_explain(const char* model, const char* quantization,
                                             const moekit_layer_options* options, char** text);

/* Writes a small quantized checkpoint (moekit make-fixture): `scheme` ("bf16", "fp8_block128",
 * "nvfp4", ...), `model` ("tiny", "tiny-mixtral", "tiny-deepseek"), into directory `dir`. */
MOEKIT_C_EXPORT moekit_status moekit_write_fixture_checkpoint(const char* dir, const char* scheme,
                                                              const char* model, uint64_t seed);

/* ---- the functional form ------------------------------------------------------------------- */

/* vLLM's fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, ...), unquantized. All
 * tensors contiguous on one device; E local experts, N1 = 2I gated or I. */
typedef struct moekit_fused_experts_args {
  uint32_t struct_size;          /* sizeof(moekit_fused_experts_args) */
  const DLTensor* hidden_states; /* (M, H) bf16 / f16 / f32 */
  const DLTensor* w13;           /* (E, N1, H), hidden_states' dtype */
  const DLTensor* w2;            /* (E, H, I) */
  const DLTensor* topk_weights;  /* (M, k) f32 */
  const DLTensor* topk_ids;      /* (M, k) int32 or int64, global expert ids */
  const DLTensor* output;        /* (M, H), hidden_states' dtype, distinct from hidden_states */
  const char* activation;        /* "silu" (NULL), "gelu", "swigluoai", "relu2_no_mul", ... */
  int32_t apply_router_weight_on_input; /* top_k must be 1 */
  int64_t global_num_experts;           /* -1: E */
  const DLTensor* expert_map;           /* (global_num_experts,) int32: global -> local id or
                                           -1; NULL without expert parallelism */
  const DLTensor* w13_bias;             /* (E, N1) or NULL */
  const DLTensor* w2_bias;              /* (E, H) or NULL */
  /* 0: w13 (and w13_bias) in the standard layout ([gate; up] rows, vLLM's); when the chosen
   * backend reads another layout, each call rewrites a copy (synchronizes: not capturable).
   * 1: moekit_fused_experts_prepare_weights already rewrote them into the kernel's layout. */
  int32_t weights_prepared;
  const char* backend; /* force an experts backend by name; NULL / "auto": the oracle */
} moekit_fused_experts_args;

/* output = sum_k topk_weights[m, k] * expert_{topk_ids[m, k]}(hidden_states[m]) on `stream`.
 * Plans once per problem signature (shapes, dtype, device, activation, backend) and keeps that
 * plan's kernel and workspaces in the library's one registry of functional kernels; calls with a
 * larger M than before grow the workspaces (allocation: warm up before a CUDA-graph capture).
 * A NULL stream is rejected on the GPU. */
MOEKIT_C_EXPORT moekit_status moekit_fused_experts(const moekit_fused_experts_args* args,
                                                   void* stream);

/* Rewrites args->w13 (and args->w13_bias) in place into the weight layout of the backend that
 * serves these arguments (like vLLM's process_weights_after_loading); pass weights_prepared = 1
 * afterwards. *layout: the layout's name, "standard" when nothing changed. Waits for completion. */
MOEKIT_C_EXPORT moekit_status moekit_fused_experts_prepare_weights(
    const moekit_fused_experts_args* args, void* stream, char** layout);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOEKIT_MOEKIT_C_H_ */
