"""Model families: each module declares its formats and registers parsers under vLLM's names."""
from worker.parsers.families import qwen3  # noqa: F401
from worker.parsers.families import qwen3_coder  # noqa: F401
from worker.parsers.families import deepseek  # noqa: F401
from worker.parsers.families import mistral  # noqa: F401
from worker.parsers.families import llama  # noqa: F401
