"""Sort GPU ops into the categories the trace diagnosis reports.

::

    from perfsdk.profiling.categories import categorize

    categorize("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_...>", "kernel")  # "gemm"
    categorize("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy")                                  # "memcpy"

Categories: ``gemm``, ``attention``, ``normalization``, ``elementwise`` (activations included),
``communication``, ``memcpy`` (memcpy and memset), ``other``. Kernel names are free text chosen
by library authors, so this is a keyword table checked in a fixed order; the order matters
where names overlap (flash-attention kernels are built on CUTLASS, layer-norm kernels are
"vectorized", NCCL kernels contain "Reduce").
"""

from __future__ import annotations

import functools
import re

__all__ = ["CATEGORIES", "categorize", "categorize_cpu_op"]

CATEGORIES: tuple[str, ...] = ("gemm", "attention", "normalization", "elementwise", "communication", "memcpy", "other")

# (category, pattern) checked top to bottom; first match wins.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # random-number kernels ("normal_kernel") must not read as normalisation
    ("other", re.compile(r"distribution_|normal_kernel|uniform_kernel|philox|randperm", re.I)),
    # NCCL, vLLM/SGLang custom all-reduce, symmetric-memory and NVSHMEM collectives
    (
        "communication",
        re.compile(
            r"nccl|all_?reduce|allgather|all_gather|reduce_?scatter|alltoall|all_to_all|cross_device_reduce"
            r"|one_shot|two_shot|multimem|nvshmem|custom_ar|sendrecv",
            re.I,
        ),
    ),
    # before gemm: FlashAttention/xformers kernels are CUTLASS templates
    (
        "attention",
        re.compile(
            r"flash|fmha|attention|attn|paged_?kv|\bmha|sdpa|mla_|decode_?kernel|prefill_?kernel"
            r"|cutlass_?mla|flashinfer",
            re.I,
        ),
    ),
    # before elementwise: layer-norm kernels are "vectorized_layer_norm_kernel"
    ("normalization", re.compile(r"norm|RowwiseMoments|welford", re.I)),
    # cuBLAS/cuBLASLt (nvjet is Hopper's JIT GEMM family), CUTLASS, Triton and quantised GEMMs
    (
        "gemm",
        re.compile(
            r"gemm|gemv|nvjet|cutlass|cublas|xmma|wgmma|splitk|matmul|_mm_|triton_mm|scaled_mm"
            r"|marlin|machete|awq|gptq|sm\d\d_xmma|ampere_(?:bf16|fp16|sgemm|h\d+)|dot_kernel",
            re.I,
        ),
    ),
    # eager PyTorch pointwise kernels, fused activations, rotary, Triton pointwise (triton_poi_)
    (
        "elementwise",
        re.compile(
            r"elementwise|silu|gelu|relu|swiglu|act_and_mul|sigmoid|tanh|rotary|rope|triton_poi|pointwise"
            r"|direct_copy|copy_kernel|add_kernel|mul_kernel|fill_kernel",
            re.I,
        ),
    ),
)


# Kernel names repeat (a trace of a million kernels has a few hundred distinct ones) and run to
# hundreds of characters of C++ template, so a regex pass costs tens of µs: remember the answers.
@functools.lru_cache(maxsize=16384)
def categorize(name: str, cat: str) -> str:
    """Category of one GPU op from its trace ``name`` and ``cat`` (``kernel``, ``gpu_memcpy`` ...)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy"
    for category, pattern in _RULES:
        if pattern.search(name):
            return category
    return "other"


# CPU-side operator names (aten::*, as a CPU-only torch.profiler trace records them)
_CPU_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"scaled_dot_product|_flash_attention|_efficient_attention|attention|softmax", re.I)),
    ("normalization", re.compile(r"norm", re.I)),
    ("gemm", re.compile(r"^aten::(?:mm|addmm|bmm|baddbmm|matmul|linear|_addmm_activation|dot|mv)$", re.I)),
    ("memcpy", re.compile(r"^aten::(?:copy_|to|_to_copy|cat|index_copy_|index_put_|contiguous|clone)$", re.I)),
    ("communication", re.compile(r"c10d::|all_?reduce|allgather|broadcast", re.I)),
    (
        "elementwise",
        re.compile(
            r"^aten::(?:add|add_|sub|mul|mul_|div|silu|gelu|relu|sigmoid|tanh|exp|pow|rsqrt|sqrt|neg|where"
            r"|mean|sum|argmax|max|cos|sin|embedding|index_select|masked_fill|fill_|zero_)$",
            re.I,
        ),
    ),
)


@functools.lru_cache(maxsize=16384)
def categorize_cpu_op(name: str) -> str:
    """Category of one CPU operator (``aten::mm`` -> ``gemm``) for CPU-only traces."""
    for category, pattern in _CPU_RULES:
        if pattern.search(name):
            return category
    return "other"
