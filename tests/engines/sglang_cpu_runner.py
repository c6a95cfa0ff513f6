"""SGLang's own ``ModelRunner.forward``, run on a CPU: only the model execution is a stand-in.

``CpuModelRunner`` subclasses ``sglang.srt.model_executor.model_runner.ModelRunner``; its ``forward`` is
SGLang's (the step span, the expert-distribution recorder, the capturers, the overlap-schedule check), as
patched by SGLang's ``HookRegistry`` with whatever the plugins registered. What a CPU cannot do is replaced:

* ``__init__``: no GPU, weights or KV cache — the attributes ``forward`` reads, and SGLang's
  ``ModelConfig`` built from the server arguments (the model's ``config.json``);
* ``_forward_raw``: the model execution — a CPU matmul;
* ``torchvision``: a placeholder package. SGLang imports it (multimodal preprocessing) on the way to the
  model runner, and its only build for a CPU torch lives on PyTorch's own index, which the CI machines
  cannot reach. Nothing here calls it.

:func:`scheduler_context` publishes the server arguments as SGLang's ``run_scheduler_process`` does before
it builds the scheduler; :func:`batch` builds real ``ForwardBatch`` objects.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import types
from pathlib import Path
from typing import Any


class _Placeholder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder()

    def __getattr__(self, name: str) -> _Placeholder:
        return _Placeholder()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _PlaceholderModule(types.ModuleType):
    __version__ = "0.0"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _TorchvisionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


if not any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionFinder())

import torch  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerOutput  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

LLAMA = {  # a small Llama: SGLang reads it like any checkpoint's config.json
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


def scheduler_context(model_dir: Path, *, tp_size: int = 1, tp_rank: int = 0) -> ServerArgs:
    """``sglang serve --model-path MODEL_DIR --served-model-name tiny-llama --tp-size N --enable-metrics``,
    published for this process as the scheduler of rank *tp_rank*."""
    (model_dir / "config.json").write_text(json.dumps(LLAMA))
    args = ServerArgs(
        model_path=str(model_dir),
        served_model_name="tiny-llama",
        device="cpu",
        tp_size=tp_size,
        skip_tokenizer_init=True,
        enable_metrics=True,
    )
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=tp_rank, dp_rank=None, gpu_id=tp_rank))
    return args


class CpuModelRunner(ModelRunner):  # type: ignore[misc]
    """SGLang's ModelRunner with the GPU-only parts replaced (module docstring)."""

    def __init__(self, server_args: ServerArgs, *, is_draft_worker: bool = False) -> None:
        self.server_args = server_args
        self.model_config = ModelConfig.from_server_args(server_args)
        self.is_draft_worker = is_draft_worker
        self.gpu_id = 0
        self.forward_pass_id = 0
        self.msprobe_debugger = None
        self.canary_manager = None
        self.enable_elastic_ep = False
        self.eplb_manager = None
        self.decode_cuda_graph_runner = None
        self.seen: list[str] = []
        self.fail_next = False
        self._w = torch.ones(64, 64)

    def _forward_raw(self, forward_batch: ForwardBatch, *args: Any, **kwargs: Any) -> ModelRunnerOutput:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the model failed")
        self.seen.append(forward_batch.forward_mode.name)
        (self._w @ self._w).sum()
        return ModelRunnerOutput(logits_output=None, can_run_graph=False)


def batch(
    mode: str,
    seq_lens: list[int],
    *,
    extend: list[int] | None = None,
    prefix: list[int] | None = None,
    draft_token_num: int | None = None,
) -> ForwardBatch:
    """A ``ForwardBatch`` as ``ForwardBatch.init_new`` leaves it for these sequence lengths."""
    n = len(seq_lens)
    fb = ForwardBatch(
        forward_mode=ForwardMode[mode],
        batch_size=n,
        input_ids=torch.zeros(max(n, 1), dtype=torch.long),
        req_pool_indices=torch.arange(n),
        seq_lens=torch.tensor(seq_lens, dtype=torch.long),
        out_cache_loc=torch.zeros(n, dtype=torch.long),
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.long),
    )
    if extend is not None:
        fb.extend_seq_lens_cpu = extend
        fb.extend_prefix_lens_cpu = prefix if prefix is not None else [0] * n
        fb.extend_num_tokens = sum(extend)
    if draft_token_num is not None:
        from sglang.srt.speculative.ngram_info import NgramVerifyInput

        fb.spec_info = NgramVerifyInput(draft_token_num=draft_token_num, new_seq_lens=fb.seq_lens + draft_token_num)
    return fb


def workload() -> list[ForwardBatch]:
    """The forwards of the test: the shapes of test_vllm.py's EXPECTED, as SGLang batches them, plus a
    speculative verify and a data-parallel idle forward."""
    return [
        batch("EXTEND", [100, 28], extend=[100, 28]),  # two prompts, the second chunked
        # its last 2 tokens (28 cached) and a third prompt's first 125, with the first decoding at 100 + 1
        batch("MIXED", [125, 30, 101], extend=[125, 2, 1], prefix=[0, 28, 100]),
        batch("DECODE", [32, 201]),  # two sequences decoding
        batch("TARGET_VERIFY", [20, 40], draft_token_num=3),  # 3 draft tokens verified each
        batch("IDLE", []),  # data-parallel padding: nothing to cost
    ]
