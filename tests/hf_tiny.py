"""Tiny Hugging Face models of each family fusewise.patch knows, built from config (random init,
no downloads). Shared by the patch tests; transformers is a test dependency."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("transformers")

_COMMON = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# family -> (config class, causal-LM class, extra config)
CAUSAL_LM = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=8)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=8)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=8)),
}


def causal_lm(family: str, **overrides):
    """A tiny *ForCausalLM of `family` (CAUSAL_LM's keys), in fp32 on the CPU, eval mode off."""
    config_name, model_name, extra = CAUSAL_LM[family]
    config = getattr(tf, config_name)(**{**_COMMON, **extra, **overrides})
    config._attn_implementation = "eager"
    return getattr(tf, model_name)(config)


def layer_norm_models():
    """GPT-2, BERT and ViT: their norms are torch.nn.LayerNorm."""
    gpt2 = tf.GPT2LMHeadModel(
        tf.GPT2Config(
            vocab_size=128,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=1,
            eos_token_id=2,
        )
    )
    bert = tf.BertForMaskedLM(
        tf.BertConfig(
            vocab_size=128,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
        )
    )
    vit = tf.ViTModel(
        tf.ViTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
        )
    )
    return {"gpt2": gpt2, "bert": bert, "vit": vit}
