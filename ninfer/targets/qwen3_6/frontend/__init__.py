"""Qwen3.6 Frontend: tokenizer, chat template, PreparedPrompt and OutputSession.

Imports nothing from Engine or Program (architecture.md section 2).
"""
from .frontend import Qwen36Frontend
from .session import OutputSession
from .tokenizer import Qwen36Tokenizer
from ninfer.contract.frontend import (FinalOutput, FinishReason, MediaPlaceholder, OutputDelta, OutputOptions,
                    PreparedPrompt, Preview, PromptError, SessionError, ToolCall, ToolCallDelta)

__all__ = [
    "Qwen36Frontend", "Qwen36Tokenizer", "OutputSession", "FinalOutput", "FinishReason",
    "MediaPlaceholder", "OutputDelta", "OutputOptions", "PreparedPrompt", "Preview", "PromptError",
    "SessionError", "ToolCall", "ToolCallDelta",
]
