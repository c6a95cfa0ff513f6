"""The ladder's log: for each rung, the hypothesis the previous rung's measurements suggest, a predicted
step time, and whether the prediction held. :func:`explain` fills a :class:`~perfsdk.demo.ladder_rows.RungRow`'s
``hypothesis``, ``predicted_step_ms``, ``prediction_held`` and ``result``::

    explain(row, prev)           # prev: the last rung that ran (None for the first)
    row.hypothesis               # "eager was launch_bound: a profiled decode step kept the GPU busy ..."
    row.result                   # "served decode step 3.22 ms (p50, batch 15.2); verdict ...; predicted ...: held"

The predictions scale what the previous rung's profile measured: for ``graph``, the kernels' busy time and
about 1 µs between two kernels; for ``compile``, the share of small kernels fusion would remove; for
``int8``, the step's bytes at the same bandwidth. A prediction *held* when the measured step is within
:data:`HELD` of it.
"""

from __future__ import annotations

from perfsdk.demo.ladder_rows import LoadRun, Profile, RungRow, SpecInfo

__all__ = ["HELD", "explain"]

# a prediction "held" when the measured step is within this fraction of it
HELD = 0.15


def explain(row: RungRow, prev: RungRow | None) -> None:
    """Fill ``hypothesis``, ``predicted_step_ms`` and ``result`` from the previous rung's measurements."""
    load = row.load or LoadRun()
    step = load.step_ms_p50
    if prev is None:
        predicted: float | None = None
        hyp = (
            "Starting point: measure the engine as it is, under the same load every rung gets, and ask "
            "perfsdk where the time goes."
        )
    else:
        predicted, hyp = _hypothesis(row, prev)
    row.hypothesis = hyp
    row.predicted_step_ms = predicted
    if step is None:
        row.result = "no decode steps measured"
        row.prediction_held = None
        return
    p = row.profile or Profile()
    verdict = p.kind or "no finding"
    batch = load.batch_mean if load.batch_mean is not None else 0
    res = f"served decode step {step:.2f} ms (p50, batch {batch:.1f}); verdict {verdict}"
    if p.share is not None:
        res += f" ({p.share:.0%} of step time)"
    row.prediction_held = None
    if predicted:
        err = step / predicted - 1
        held = abs(err) <= HELD
        row.prediction_held = held
        res += (
            f"; predicted {predicted:.2f} ms: {'held' if held else 'missed'} "
            f"({err:+.0%}{', slower' if err > 0 else ', faster' if err < 0 else ''})"
        )
    row.result = res


def _hypothesis(row: RungRow, prev: RungRow) -> tuple[float | None, str]:
    """The predicted step (None: no prediction) and the hypothesis, from *prev*'s profile and load."""
    name = row.rung
    pp = prev.profile or Profile()
    pstep = (prev.load or LoadRun()).step_ms_p50
    kind = pp.kind
    dec = pp.decode
    kernel_ms = (dec.gpu_busy_us if dec is not None else 0.0) / 1000
    cats = dec.category_shares if dec is not None else {}
    # the step the kernels' busy time is a share of: the unprofiled one where the window knew it
    unprofiled = pp.unprofiled_step_us
    step_us = unprofiled or (dec.gpu_window_us if dec is not None else None)
    if unprofiled and dec is not None:
        of_step = f"the unprofiled {unprofiled / 1000:.2f} ms step ({dec.gpu_window_us / 1000:.2f} ms profiled)"
    else:
        window = dec.gpu_window_us if dec is not None else 0.0
        of_step = f"its {window / 1000:.2f} ms (profiler time included)"
    if name == "graph" and pstep and dec is not None:
        # in a graph the kernels still run one after the other, with ~1 µs between dependent ones
        predicted = kernel_ms + dec.kernels * 0.001
        return predicted, (
            f"{prev.rung} was {kind or 'not diagnosed'}: a profiled decode step kept the GPU busy "
            f"{kernel_ms:.2f} ms of {of_step}, "
            f"over {dec.kernels:.0f} kernels. If the rest is launch gaps, one graph launch per step "
            f"leaves the kernels and about 1 µs between each two: step ≈ {kernel_ms:.2f} + "
            f"{dec.kernels:.0f} × 0.001 = {predicted:.2f} ms."
        )
    if name == "compile" and pstep and cats:
        small = sum(cats.get(c, 0.0) for c in ("elementwise", "normalization", "other"))
        busy = min(kernel_ms / (step_us / 1000), 1.0) if step_us else 1.0
        predicted = pstep * (1 - busy * small)
        return predicted, (
            f"{prev.rung} was {kind or 'not diagnosed'}; {small:.0%} of its decode steps' GPU time is "
            f"elementwise, normalization and other small kernels (GPU busy {busy:.0%}). If fusion made "
            f"them free: step ≈ {pstep:.2f} × (1 − {busy:.2f} × {small:.2f}) = {predicted:.2f} ms."
        )
    if name == "int8" and pstep and prev.spec is not None and row.spec is not None:
        # decode step bytes = weights (an untied input table: a row per sequence) + KV bytes per token × the
        # batch's context (budget.decode_step_bytes)
        load = row.load or LoadRun()
        batch = load.batch_mean or 1
        ctx = (load.context_mean or 0) * batch

        def step_bytes(spec: SpecInfo) -> float:
            weights = spec.step_weight_bytes if spec.step_weight_bytes is not None else spec.weight_bytes
            assert weights is not None
            assert spec.kv_bytes_per_token is not None
            return float(weights + (spec.embedding_row_bytes or 0.0) * batch + spec.kv_bytes_per_token * ctx)

        old, new = step_bytes(prev.spec), step_bytes(row.spec)
        predicted = pstep * new / old
        return predicted, (
            f"{prev.rung} was {kind or 'not diagnosed'}. A memory-bound step is bytes over bandwidth: "
            f"{new / 1e9:.2f} GB instead of {old / 1e9:.2f} GB per step at the same bandwidth gives "
            f"step ≈ {pstep:.2f} × {new / old:.2f} = {predicted:.2f} ms."
        )
    why = _rung_why().get(name, "")
    return None, f"{why} (no prediction: the rung before gave no GPU profile to scale)."


def _rung_why() -> dict[str, str]:
    from perfsdk.demo.rungs import RUNGS

    return {n: r.why[:1].upper() + r.why[1:] for n, r in RUNGS.items()}
