"""The embedded demo: a tiny Llama-shaped model served like a real engine, instrumented with perfsdk.

Run it::

    perfsdk demo                      # start, drive with the load generator, print one report, exit
    perfsdk demo --serve --port 8000  # keep serving: curl it, point Prometheus at /metrics
    perfsdk demo --device cuda --model-size 1b
    perfsdk demo --ladder             # every engine rung under one load, perfsdk's verdict on each

Or use the pieces (each module's docstring is its guide):

- :mod:`perfsdk.demo.tokenizer`: byte-level tokenizer (vocab 256 + specials);
- :mod:`perfsdk.demo.model`: ``ModelArgs`` sizes ("tiny", "small", "1b", "8b") and the ``Transformer``
  with a static KV cache indexed by slot;
- :mod:`perfsdk.demo.engine`: the continuous-batching loop on its own thread (the ``eager`` rung);
- :mod:`perfsdk.demo.graph_engine`: the same scheduling with static buffers, device sampling and CUDA
  graphs (the ``graph``, ``compile`` and ``int8`` rungs); :mod:`perfsdk.demo.rungs` builds each rung;
- :mod:`perfsdk.demo.quant` and :mod:`perfsdk.demo.int8_triton`: weight-only int8 and its fused kernel;
- :mod:`perfsdk.demo.ladder`: ``perfsdk demo --ladder``, the seeds' loop over the rungs;
- :mod:`perfsdk.demo.server`: the OpenAI-compatible FastAPI app and ``DemoServer`` (uvicorn on loopback);
- :mod:`perfsdk.demo.report`: histogram quantiles and the text report;
- :mod:`perfsdk.cli.demo`: ``perfsdk demo``.

Importing this package is free: torch, FastAPI and uvicorn load only inside the modules that need them.
"""

from __future__ import annotations

__all__: list[str] = []
