"""The embedded demo: a tiny Llama-shaped model served like a real engine, instrumented with perfsdk.

Run it::

    perfsdk demo                      # start, drive with the load generator, print one report, exit
    perfsdk demo --serve --port 8000  # keep serving: curl it, point Prometheus at /metrics
    perfsdk demo --device cuda --model-size 1b

Or use the pieces (each module's docstring is its guide):

- :mod:`perfsdk.demo.tokenizer`: byte-level tokenizer (vocab 256 + specials);
- :mod:`perfsdk.demo.model`: ``ModelArgs`` sizes ("tiny", "small", "1b") and the ``Transformer``
  with a static KV cache indexed by slot;
- :mod:`perfsdk.demo.engine`: the continuous-batching loop on its own thread;
- :mod:`perfsdk.demo.server`: the OpenAI-compatible FastAPI app and ``DemoServer`` (uvicorn on loopback);
- :mod:`perfsdk.demo.report`: histogram quantiles and the text report;
- :mod:`perfsdk.cli.demo`: ``perfsdk demo``.

Importing this package is free: torch, FastAPI and uvicorn load only inside the modules that need them.
"""

from __future__ import annotations

__all__: list[str] = []
