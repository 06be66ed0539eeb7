"""Errors as real servers word them, for the mock model's fault directives (``overflow=FORM``)."""

from __future__ import annotations

# Context overflows as llama.cpp, OpenAI and vLLM send them: (HTTP status, JSON body).
OVERFLOWS: dict[str, tuple[int, dict]] = {
    "llamacpp": (500, {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}),
    "openai": (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
                "9120 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    ),
    "vllm": (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 2048 tokens. However, you requested 2311 tokens "
            "(2055 in the messages, 256 in the completion). Please reduce the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
}
