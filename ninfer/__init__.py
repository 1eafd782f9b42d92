"""NInfer: a single-GPU inference engine for the Qwen3.6 model family.

Gateways use `ninfer.Engine`, the public types below and the Frontend types; nothing else.
`Engine` and `GenerationHandle` are imported on first use, so that `import ninfer` stays light.
"""
from ninfer.config import (Availability, AvailabilityState, EngineConfig, EngineMetrics, EngineRequestError,
                          ErrorKind, FinishReason, GenerationDelta, GenerationError, GenerationEvent,
                          GenerationResult, GenerationStart, HistogramSnapshot, OutputDelta, OutputOptions,
                          PreparedPrompt, Purpose, SamplingParams, SpeculativeConfig, TokenLogprob, ToolCall,
                          ToolCallDelta, Usage)

__version__ = "0.1.0"        # NOTE: the release's version; pyproject.toml's [project] version is the same

__all__ = ["Engine", "GenerationHandle", "Availability", "AvailabilityState", "EngineConfig", "EngineMetrics",
           "EngineRequestError", "ErrorKind", "FinishReason", "GenerationDelta", "GenerationError",
           "GenerationEvent", "GenerationResult", "GenerationStart", "HistogramSnapshot", "OutputDelta",
           "OutputOptions", "PreparedPrompt", "Purpose", "SamplingParams", "SpeculativeConfig", "TokenLogprob",
           "ToolCall", "ToolCallDelta", "Usage"]


def __getattr__(name: str):
    if name == "Engine":
        from ninfer.engine.facade import Engine
        return Engine
    if name == "GenerationHandle":
        from ninfer.engine.handle import GenerationHandle
        return GenerationHandle
    raise AttributeError(f"module 'ninfer' has no attribute {name!r}")
