"""Prefill and decode of one real third-party architecture (transformers' Llama).

Both methods wrap the *same* ``LlamaForCausalLM`` instance, so every weight has the
same FQN, shape, dtype, strides and data in both methods: genuine sharing.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

DESCRIPTION = """
`prefill` and `decode` are two entry points of one tiny transformers `LlamaForCausalLM`
(hidden 64, 2 layers, 4 query heads / 2 KV heads of dim 32, vocab 256, random weights
from `torch.manual_seed(0)`, eager attention, no KV cache). Both wrappers hold the same
model under the attribute `model`, so all 22 constants, the 21 parameters
(`model.model.embed_tokens.weight`, `model.model.layers.*.self_attn.{q,k,v,o}_proj.weight`,
the MLP and RMSNorm weights, `model.lm_head.weight`) and the rotary buffer
`model.model.rotary_emb.inv_freq`, are genuinely shared: same FQN, shape, dtype, strides
and data, with no positional `_tensor_constant*` among them. `prefill` runs 8 prompt
tokens at positions 0..7 and returns their logits; `decode` runs one token at position 8
(without past keys/values) and returns its logits.
"""

PREFILL_LEN = 8


def _config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        # head_dim 32 (not hidden/heads = 16): rotary inv_freq then has 16 elements, so
        # Inductor keeps it as a real constant instead of inlining it (it inlines 1-D
        # constants of at most 8 elements), as it would for any real Llama.
        head_dim=32,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="eager",
    )


def _build_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(_config())
    model.config._attn_implementation = "eager"
    return model.eval()


class Prefill(torch.nn.Module):
    """Prompt of ``PREFILL_LEN`` tokens at positions 0..n-1 -> logits (1, n, vocab)."""

    def __init__(self, model: LlamaForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, use_cache=False, return_dict=True)
        return out.logits


class Decode(torch.nn.Module):
    """One token at an explicit position -> logits (1, 1, vocab). No past keys/values."""

    def __init__(self, model: LlamaForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, return_dict=True)
        return out.logits


def methods() -> dict[str, tuple[torch.nn.Module, tuple]]:
    model = _build_model()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 256, (1, PREFILL_LEN), generator=g, dtype=torch.int64)
    token = torch.randint(0, 256, (1, 1), generator=g, dtype=torch.int64)
    position = torch.tensor([[PREFILL_LEN]], dtype=torch.int64)
    return {
        "prefill": (Prefill(model), (prompt,)),
        "decode": (Decode(model), (token, position)),
    }


def _expected():
    from toolkit.build.samples import Expected

    # All 22 constants are genuinely shared: every sharing policy shares them all and every
    # method stays correct; no-sharing keeps two copies.
    shared = {
        p: Expected.of(min_shared=22, declined=0)
        for p in (
            "name-only",
            "refuse-on-mismatch",
            "decline-on-mismatch",
            "verify-always",
            "fingerprint",
            "content-dedup",
            "blind-share",
            "fqn-weight-cache",
        )
    }
    return {"no-sharing": Expected.of(), **shared}


EXPECTED = _expected()
