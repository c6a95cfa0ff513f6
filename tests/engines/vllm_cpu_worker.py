"""vLLM's own GPU ``Worker``, run on a CPU: only the model runner (the forward) is a stand-in.

``CpuWorker`` subclasses ``vllm.v1.worker.gpu_worker.Worker``: vLLM constructs it (its ``__init__``),
runs its ``execute_model`` and ``sample_tokens`` bodies (pipeline-parallel groups, profiler annotation,
the V1/V2 dispatch), and drives it from vLLM's own executors and engine core. What a CPU cannot do is
replaced, and only that:

* ``init_device``: CPU instead of CUDA; vLLM's ``init_worker_distributed_environment`` over gloo sets up
  the same groups, then the model runner is :class:`StubRunner`;
* :class:`StubRunner`: a tiny CPU matmul as the forward, and one sampled token for every request whose
  prompt is complete — what the scheduler needs from a step;
* the KV-cache sizing calls vLLM makes before serving (``get_kv_cache_spec`` … ``initialize_from_config``);
* ``compile_or_warm_up_model``: a warm-up step through ``self.execute_model`` / ``self.sample_tokens``,
  as vLLM's ``warmup_kernels`` does, which perfsdk must not record;
* two facts of a machine without a GPU: ``Worker.__init__`` refuses Model Runner V2 without Triton (only
  the real V2 runner, replaced here, needs it), and vLLM's platform placeholder for "no GPU" has no
  ``set_device`` (its async-output thread calls it).

Import this module before vLLM builds a worker (the executors resolve ``worker_cls`` by name).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
from vllm.platforms.interface import UnspecifiedPlatform
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, ModelRunnerOutput
from vllm.v1.worker import gpu_worker
from vllm.v1.worker.worker_base import CompilationTimes

gpu_worker.HAS_TRITON = True  # see the module docstring: the V2 runner itself is never built here
UnspecifiedPlatform.set_device = classmethod(lambda cls, device: None)  # type: ignore[method-assign,assignment]


class StubRunner:
    """The forward pass: a CPU matmul; samples token 7 for each request whose prompt is done."""

    is_pooling_model = False

    def __init__(self) -> None:
        self.prompt_len: dict[str, int] = {}
        self.seen: list[SchedulerOutput] = []  # every SchedulerOutput a forward ran for
        self._pending: SchedulerOutput | None = None
        self._w = torch.ones(64, 64)
        self.fail_next = False
        self.drafts = 0  # > 0: propose this many draft tokens per sampled request (n-gram speculation, sync)
        self._sampled: list[str] = []

    def execute_model(self, so: SchedulerOutput, intermediate_tensors: Any = None) -> ModelRunnerOutput | None:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the model failed")
        for r in so.scheduled_new_reqs:
            self.prompt_len[r.req_id] = len(r.prompt_token_ids or ())  # (0.33 also has .prompt_len; 0.26 not)
        if so.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT  # no forward: vLLM's runner returns its output right away
        self.seen.append(so)
        self._pending = so
        (self._w @ self._w).sum()
        return None

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput:
        so, self._pending = self._pending, None
        assert so is not None, "sample_tokens without execute_model"
        computed = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
        c = so.scheduled_cached_reqs
        computed.update(zip(c.req_ids, c.num_computed_tokens, strict=True))
        ids = list(so.num_scheduled_tokens)
        sampled = [[7] if computed[r] + so.num_scheduled_tokens[r] >= self.prompt_len[r] else [] for r in ids]
        self._sampled = [r for r, s in zip(ids, sampled, strict=True) if s]
        return ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
        )

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafter's proposals after a step (what vLLM's engine core asks for without async scheduling):
        *drafts* tokens for each request that sampled one, all to be rejected (the sampler returns one token)."""
        if not self.drafts or not self._sampled:
            return None
        ids, self._sampled = self._sampled, []
        return DraftTokenIds(req_ids=ids, draft_token_ids=[[7] * self.drafts for _ in ids])

    def shutdown(self) -> None:
        pass


def warmup_output(tokens: int = 16) -> SchedulerOutput:
    """A one-request prefill, as a warm-up pass would run it."""
    so = SchedulerOutput.make_empty()
    so.scheduled_new_reqs = [
        NewRequestData(
            req_id="warmup",
            prompt_token_ids=[1] * tokens,
            mm_features=[],
            sampling_params=None,
            pooling_params=None,
            block_ids=([],),
            num_computed_tokens=0,
            lora_request=None,
        )
    ]
    so.num_scheduled_tokens = {"warmup": tokens}
    so.total_num_scheduled_tokens = tokens
    return so


class CpuWorker(gpu_worker.Worker):  # type: ignore[misc]
    """vLLM's Worker with the GPU-only parts replaced (module docstring)."""

    def init_device(self) -> None:
        self.device = torch.device("cpu")
        gpu_worker.init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank, "gloo"
        )
        self.model_runner = StubRunner()

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get_kv_cache_spec(self) -> dict[str, Any]:
        m, p = self.vllm_config.model_config, self.vllm_config.parallel_config
        return {
            f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
                block_size=self.vllm_config.cache_config.block_size,
                num_kv_heads=m.get_num_kv_heads(p),
                head_size=m.get_head_size(),
                dtype=torch.bfloat16,
            )
            for i in range(m.get_num_layers(p))
        }

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["NHD"]

    def determine_available_memory(self) -> int:
        return 64 * 1024 * 1024

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        self.kv_cache_config = kv_cache_config

    def compile_or_warm_up_model(self) -> CompilationTimes:
        if self.execute_model(warmup_output()) is None:
            self.sample_tokens(None)
        return CompilationTimes(0.0, 0.0)


class ExtensionCpuWorker(CpuWorker):
    """The same, for ``--worker-extension-cls`` (vLLM adds the extension to this class's bases)."""


# ---- one small workload, shared by the in-process tests and vllm_tp_server.py --------------------------
LLAMA = {  # a small Llama: vLLM reads it like any checkpoint's config.json
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_hidden_layers": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
    "head_dim": 64,
}
PROMPTS = (100, 30, 200)  # prompt lengths of the three requests
MAX_TOKENS = 3  # each generates three tokens
BUDGET = 128  # tokens per step (--max-num-batched-tokens): the 200-token prompt is chunked


def engine_config(
    model_dir: Path,
    *,
    worker_cls: str = "vllm_cpu_worker.CpuWorker",
    tp: int = 1,
    backend: str | None = None,
    extension: str | None = None,
    async_scheduling: bool | None = None,
) -> VllmConfig:
    """``vllm serve MODEL_DIR --max-num-batched-tokens 128 --no-enable-prefix-caching`` and otherwise vLLM's
    defaults: async scheduling on, chunked prefill on."""
    (model_dir / "config.json").write_text(json.dumps(LLAMA))
    return VllmConfig(
        model_config=ModelConfig(model=str(model_dir), served_model_name="tiny-llama", skip_tokenizer_init=True),
        device_config=DeviceConfig(device="cpu"),
        scheduler_config=SchedulerConfig(
            max_model_len=4096,
            max_num_batched_tokens=BUDGET,
            max_num_seqs=8,
            is_encoder_decoder=False,
            async_scheduling=async_scheduling,
        ),
        cache_config=CacheConfig(block_size=16, enable_prefix_caching=False),
        parallel_config=ParallelConfig(
            worker_cls=worker_cls,
            tensor_parallel_size=tp,
            distributed_executor_backend=backend,
            worker_extension_cls=extension or "",
        ),
    )


def run_requests(core: Any) -> int:
    """Add the three requests to an ``EngineCore`` and step it (its batch queue) until all are done."""
    for i, n in enumerate(PROMPTS):
        req = EngineCoreRequest(
            request_id=f"r{i}",
            prompt_token_ids=list(range(1, n + 1)),
            mm_features=None,
            sampling_params=SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
            pooling_params=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        core.add_request(*core.preprocess_add_request(req))
    steps = 0
    step = core.step_with_batch_queue if core.batch_queue is not None else core.step
    while core.scheduler.has_requests() or core.batch_queue:
        _, executed = step()
        core.post_step(executed)  # as vLLM's busy loop does after each step (drafts, without async scheduling)
        steps += 1
        assert steps < 100, "the engine did not finish the requests"
    return steps
