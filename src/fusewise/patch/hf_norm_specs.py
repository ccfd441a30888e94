"""Which Hugging Face norm classes fusewise.patch swaps, and what each one computes: data only.

A class is named by its module and class name, so nothing here imports transformers. Every entry
was read in transformers 5.17.0: its forward (and the _norm it calls) is, token for token, one of
the three below (tests/test_patch_hf_norms.py compares the installed source with them). All three
compute x_hat = x * rsqrt(mean(x**2) + eps) in fp32 from x cast to fp32; they differ in where the
weight comes in and where the result is rounded:

* LLAMA: ``weight * x_hat.to(x.dtype)``. x_hat is rounded to x's dtype first, then multiplied;
  the output dtype is promote(weight.dtype, x.dtype) (fp32 weight, bf16 x: fp32 out).
* OLMO2: ``(weight * x_hat).to(x.dtype)``: one rounding at the end, x's dtype out.
* GEMMA: ``(x_hat * (1 + weight.float())).type_as(x)``: the weight is stored as an offset from 1
  (initialised to zeros), added in fp32; one rounding at the end, x's dtype out.

The probe in hf_norms.py checks each swap on the module itself, so an entry that stops matching a
later transformers is left alone and reported, not swapped wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass

# The cast orders (NormSpec.order).
LLAMA_ORDER = "llama"  # weight * x_hat.to(x.dtype)
OLMO2_ORDER = "olmo2"  # (weight * x_hat).to(x.dtype)
GEMMA_ORDER = "gemma"  # (x_hat * (offset + weight.float())).type_as(x)


@dataclass(frozen=True)
class NormSpec:
    eps_attr: str  # the instance attribute forward reads eps from
    offset: int  # the effective weight is offset + weight (Gemma: 1)
    order: str  # one of the *_ORDER above
    calls: tuple[str, ...] = ()  # other methods forward calls: a subclass overriding one is
    # left alone, as one overriding forward is

    def describe(self) -> str:
        w = f"({self.offset} + weight.float())" if self.offset else "weight"
        if self.order == LLAMA_ORDER:
            return f"{w} * x_hat.to(x.dtype)"
        return f"({w} * x_hat).to(x.dtype)"


LLAMA = NormSpec("variance_epsilon", 0, LLAMA_ORDER)
OLMO2 = NormSpec("variance_epsilon", 0, OLMO2_ORDER)
GEMMA = NormSpec("eps", 1, GEMMA_ORDER, calls=("_norm",))

# family (the folder under transformers/models) -> {class name: spec}
_FAMILIES: dict[str, dict[str, NormSpec]] = {
    # LLAMA's order
    "llama": {"LlamaRMSNorm": LLAMA},
    "mistral": {"MistralRMSNorm": LLAMA},
    "mixtral": {"MixtralRMSNorm": LLAMA},
    "qwen2": {"Qwen2RMSNorm": LLAMA},
    "qwen3": {"Qwen3RMSNorm": LLAMA},
    "phi3": {"Phi3RMSNorm": LLAMA},
    "qwen2_moe": {"Qwen2MoeRMSNorm": LLAMA},
    "qwen3_moe": {"Qwen3MoeRMSNorm": LLAMA},
    "qwen2_vl": {"Qwen2VLRMSNorm": LLAMA},
    "qwen2_5_vl": {"Qwen2_5_VLRMSNorm": LLAMA},
    "qwen3_vl": {"Qwen3VLTextRMSNorm": LLAMA},
    "qwen3_vl_moe": {"Qwen3VLMoeTextRMSNorm": LLAMA},
    "ministral": {"MinistralRMSNorm": LLAMA},
    "mistral3": {"Mistral3RMSNorm": LLAMA},
    "granite": {"GraniteRMSNorm": LLAMA},
    "granitemoe": {"GraniteMoeRMSNorm": LLAMA},
    "deepseek_v2": {"DeepseekV2RMSNorm": LLAMA},
    "deepseek_v3": {"DeepseekV3RMSNorm": LLAMA},
    "olmoe": {"OlmoeRMSNorm": LLAMA},
    "smollm3": {"SmolLM3RMSNorm": LLAMA},
    "glm": {"GlmRMSNorm": LLAMA},
    "glm4": {"Glm4RMSNorm": LLAMA},
    # OLMO2's order
    "olmo2": {"Olmo2RMSNorm": OLMO2},
    "olmo3": {"Olmo3RMSNorm": OLMO2},
    "flex_olmo": {"FlexOlmoRMSNorm": OLMO2},
    "gpt_oss": {"GptOssRMSNorm": OLMO2},
    # GEMMA's order
    "gemma": {"GemmaRMSNorm": GEMMA},
    "gemma2": {"Gemma2RMSNorm": GEMMA},
    "gemma3": {"Gemma3RMSNorm": GEMMA},
    "recurrent_gemma": {"RecurrentGemmaRMSNorm": GEMMA},
    "vaultgemma": {"VaultGemmaRMSNorm": GEMMA},
    "t5gemma": {"T5GemmaRMSNorm": GEMMA},
    "qwen3_next": {"Qwen3NextRMSNorm": GEMMA},
    "qwen3_5": {"Qwen3_5RMSNorm": GEMMA},
}

# (module, class name) -> spec
SPECS: dict[tuple[str, str], NormSpec] = {
    (f"transformers.models.{family}.modeling_{family}", name): spec
    for family, classes in _FAMILIES.items()
    for name, spec in classes.items()
}
