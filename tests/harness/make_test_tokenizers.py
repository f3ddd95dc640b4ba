"""Build the small test tokenizers of ``tests/data/test_tokenizers/<family>/tokenizer.json``
(issue 24 item 2) for the families whose real tokenizer cannot ship: a byte-level BPE whose
vocabulary is the 256 byte-level symbols (ids 0-255 in byte order, no merges), plus the family's
real markers as added special tokens (ids 256.. in the order below), and ``markers.json`` (the
marker list, which ``tests/test_vllm_vectors.py`` checks to be single ids).

Marker ids: no parser of ours depends on a marker's numeric id (every family looks its markers up
by text, ``tok.token_to_id``), so the markers take the ids after the byte symbols; what the test
tokenizers keep of the real ones is that each marker is one added token. Source of each list: the
model's ``tokenizer_config.json`` ``added_tokens_decoder`` as published (repo in ``SOURCES``);
markers the real tokenizer spells as plain text (granite's prose headers, olmo3's
``<function_calls>``, phi4-mini's ``functools``, granite-20b-fc's ``<function_call>``, hunyuan-a13b's
``<think>`` / ``<answer>`` / ``<tool_calls>``: vLLM's hunyuan test feeds their BPE ids) stay text.

Run ``python -m tests.harness.make_test_tokenizers`` to rewrite them (deterministic output).
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from worker.core.tiktoken_vocab import byte_chars

OUT = Path(__file__).resolve().parents[1] / "data" / "test_tokenizers"

#: family -> the published model whose tokenizer_config.json lists the markers
SOURCES: dict[str, str] = {
    "cohere": "CohereLabs/command-a-reasoning-08-2025",
    "ernie45": "baidu/ERNIE-4.5-21B-A3B-Thinking",
    "gemma4": "google/gemma-4 (tokenizer_config.json of the Gemma 4 instruct checkpoints)",
    "glm45": "zai-org/GLM-4.5 (and GLM-4.7: the same markers)",
    "granite": "ibm-granite/granite-3.3-8b-instruct (tool marker <|tool_call|>; reasoning headers are text)",
    "granite4": "ibm-granite/granite-4.0-h-small",
    "plain": "none: every marker as text (granite-20b-fc, hunyuan_a13b, olmo3, phi4_mini_json)",
    "internlm": "internlm/internlm2_5-7b-chat",
    "jamba": "ai21labs/AI21-Jamba-1.5-Mini",
    "kimi_k2": "moonshotai/Kimi-K2-Instruct (and Kimi-K2-Thinking: <think>, </think>)",
    "llama4": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "longcat": "meituan-longcat/LongCat-Flash-Chat",
    "minimax_m2": "MiniMaxAI/MiniMax-M2",
    "nemotron_v3": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "seed_oss": "ByteDance-Seed/Seed-OSS-36B-Instruct",
    "step3": "stepfun-ai/step3",
    "mistral_v11": "mistralai/Magistral-Small-2509 (tekken v13: [TOOL_CALLS], [ARGS], [CALL_ID], [THINK], [/THINK])",
}

MARKERS: dict[str, list[str]] = {
    "cohere": ["<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>",
               "<|START_ACTION|>", "<|END_ACTION|>"],
    "ernie45": ["<think>", "</think>", "<tool_call>", "</tool_call>", "<response>", "</response>"],
    "gemma4": ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|turn>", "<turn|>",
               "<|tool_response>", "<tool_response|>"],
    "glm45": ["<|assistant|>", "<|user|>", "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
              "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
    "granite": ["<|tool_call|>"],
    "granite4": ["<tool_call>", "</tool_call>"],
    "plain": [],
    "internlm": ["<|action_start|>", "<|plugin|>", "<|interpreter|>", "<|action_end|>"],
    "jamba": ["<tool_calls>", "</tool_calls>"],
    "kimi_k2": ["<think>", "</think>", "<|im_assistant|>", "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                "<|tool_call_end|>"],
    "llama4": ["<|python_start|>", "<|python_end|>", "<|eot|>", "<|eom|>"],
    "longcat": ["<longcat_tool_call>", "</longcat_tool_call>"],
    "minimax_m2": ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"],
    "nemotron_v3": ["<think>", "</think>", "<tool_call>", "</tool_call>"],
    "seed_oss": ["<seed:think>", "</seed:think>", "<seed:tool_call>", "</seed:tool_call>"],
    "step3": ["<think>", "</think>", "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>", "<｜tool_call_begin｜>",
              "<｜tool_call_end｜>", "<｜tool_sep｜>"],
    "mistral_v11": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"],
}


def build(markers: list[str]) -> Tokenizer:
    """The byte-level test tokenizer with ``markers`` as added special tokens."""
    vocab = {c: b for b, c in sorted(byte_chars().items())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in markers])
    return tok


def main() -> None:
    for fam, markers in MARKERS.items():
        d = OUT / fam
        d.mkdir(parents=True, exist_ok=True)
        build(markers).save(str(d / "tokenizer.json"), pretty=False)
        (d / "markers.json").write_text(json.dumps({"markers": markers, "source": SOURCES[fam]}, indent=1,
                                                   ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
