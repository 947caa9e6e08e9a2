"""A real language model with a real KV cache: transformers' Llama layers over a static cache
held as mutable buffers of one module instance, exported as ``prefill``, ``decode`` and ``decode_next``."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT_LEN = 8  # prefill: tokens at positions 0..7
DECODE_STEPS = 4  # the generate sequence: prefill, then 4 greedy decodes (positions 8..11)
MAX_LEN = 16  # static cache length
VOCAB = 256

DESCRIPTION = """
A tiny transformers `LlamaForCausalLM` (hidden 64, 2 layers, 4 query heads / 2 KV heads of
dim 32, vocab 256, random weights from `torch.manual_seed(0)`, eager attention) run layer by
layer through transformers' own decoder layers (attention projections, rotary embedding,
`repeat_kv`, eager attention, MLP, RMSNorm) over a **static KV cache held as buffers of one
module instance** (`core.k_cache_0`, `core.v_cache_0`, `core.k_cache_1`, `core.v_cache_1`,
each 1 x 2 x 16 x 32 float32, zeros at first) and a counter `core.length` (int64: positions held, tokens decoded).
Each method writes its keys and values into the cache at its positions (`index_copy_`) and
attends over the whole cache, masked to the positions at or before its own. `prefill` takes 8
prompt tokens (positions 0..7), `decode` one token and its position (an input), `decode_next`
one token at the counter's position (the counter-driven API; it advances the counter, which
prefill and decode also set). Each returns the logits and the greedy next token (argmax,
int64, compared exactly). All three wrap the one `core`: every weight and every state buffer
is one tensor of the eager program. The sequence `generate` is prefill, then 4 decodes whose
inputs are eager's greedy tokens at positions 8..11; `generate_next` the same with
`decode_next`: the loaded program reproduces eager's tokens only if the decodes read the
cache prefill filled.

Each method alone (a decode from the initial, empty cache) is right under every policy. In
sequence, per policy (every state buffer has one FQN, shape, dtype and zero contents in all
three methods, and so does every weight, so every name of `decode` and `decode_next` hits):
- `name-only`, `refuse-on-mismatch`, `decline-on-mismatch`: all-hit, so each decode shares
  all 27 constants by name, the state included (upstream's `share_kv_cache_across_methods`):
  the tokens are eager's.
- `verify-always`: the all-hit branch re-uploads the decode's blob and compares metadata: all
  equal, so it shares all 27 as well: eager's tokens.
- `blind-share`: the decodes' tensors are re-pointed at `prefill`'s, state included: eager's tokens.
- `fqn-weight-cache`: one storage per FQN key; the state's bytes at export are equal zeros, so
  there is no "Duplicate key" refusal and the decodes bind `prefill`'s storages: eager's tokens.
- `fingerprint`, `content-dedup`: weights by content digest; the state buffers because
  provenance says each is one buffer of the eager program (same storage at build time):
  eager's tokens.
- `no-sharing`: each decode gets its own, empty cache (and `decode_next` its own counter, 0):
  from the first decode on it attends to zeros instead of the prompt; both sequences are wrong
  at every decode step (logits; the greedy tokens differ at some steps). No single buffer
  fixes it: blame swaps them together and names the four cache buffers of `decode` (in
  `generate`) and the four and the counter of `decode_next` (in `generate_next`).
Repeatability: `prefill` and `decode` write at explicit positions, so re-running one with the
same inputs rewrites the same slots and its outputs repeat with or without resets;
`decode_next` moves along the cache each run, so its outputs change unless the state is
reset: state carried in the cache buffers and the counter.

transformers' own `TorchExportableModuleWithStaticCache` is not used: under torch 2.13 its
export lifts the cache tensors as positional constants (`lifted_tensor_N`), separate from the
buffers it registers, and functionalizing it fails.
"""


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # inv_freq then has 16 elements: Inductor keeps it a real constant (see llama_prefill_decode)
        max_position_embeddings=64,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="eager",
    )


def _cache_kwarg() -> str:
    """The name a decoder layer takes its cache under: ``cache`` from transformers 5.2x on,
    ``past_key_values`` before (5.17, the H200 image's); the other name would be swallowed by
    ``**kwargs`` and the cache silently not written."""
    import inspect

    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    params = inspect.signature(LlamaDecoderLayer.forward).parameters
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in params:
            return name
    raise RuntimeError("this transformers' LlamaDecoderLayer.forward takes no cache argument")


_CACHE_KWARG = _cache_kwarg()


class _Cache:
    """What transformers' attention calls ``cache.update`` on: writes this step's keys and
    values into the owner's buffers at ``positions`` and returns the whole static cache."""

    def __init__(self, owner: "StaticCacheLlama", positions: torch.Tensor):
        self.owner, self.positions = owner, positions

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k = getattr(self.owner, f"k_cache_{layer_idx}")
        v = getattr(self.owner, f"v_cache_{layer_idx}")
        k.index_copy_(2, self.positions, key_states)
        v.index_copy_(2, self.positions, value_states)
        return k, v


class StaticCacheLlama(torch.nn.Module):
    """transformers' Llama with a static KV cache registered as this module's buffers."""

    def __init__(self, model: LlamaForCausalLM, max_len: int = MAX_LEN):
        super().__init__()
        self.model = model
        cfg = model.config
        for i in range(cfg.num_hidden_layers):
            shape = (1, cfg.num_key_value_heads, max_len, cfg.head_dim)
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape))
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape))
        # [positions the cache holds (decode_next's next position), tokens decoded since prefill]:
        # state too.  Two elements, not one: AOTInductor (torch 2.13, measured on CPU) compiles
        # reads of a one-element buffer as its initial value even when the graph writes it.
        self.register_buffer("length", torch.zeros(2, dtype=torch.int64))
        self.max_len = max_len

    def step(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``input_ids`` (1, T) at ``positions`` (T,) -> (logits (1, T, vocab), next token (1,))."""
        m = self.model.model
        h = m.embed_tokens(input_ids)
        position_ids = positions.unsqueeze(0)
        cos_sin = m.rotary_emb(h, position_ids=position_ids)
        key_pos = torch.arange(self.max_len, device=positions.device)
        allowed = key_pos.unsqueeze(0) <= positions.unsqueeze(1)  # (T, max_len): causal over the static cache
        mask = torch.zeros(allowed.shape, dtype=h.dtype, device=h.device).masked_fill(
            ~allowed, torch.finfo(h.dtype).min
        )[None, None]
        cache = {_CACHE_KWARG: _Cache(self, positions)}
        for layer in m.layers:
            h = layer(
                h, attention_mask=mask, position_embeddings=cos_sin, position_ids=position_ids, use_cache=True, **cache
            )
        logits = self.model.lm_head(m.norm(h))
        return logits, logits[:, -1].argmax(-1)


class Prefill(torch.nn.Module):
    """``PROMPT_LEN`` prompt tokens at positions 0..n-1: fills the cache."""

    def __init__(self, core: StaticCacheLlama):
        super().__init__()
        self.core = core

    def forward(self, input_ids: torch.Tensor):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        out = self.core.step(input_ids, positions)
        self.core.length[0] = input_ids.shape[1]
        self.core.length[1] = 0
        return out


class Decode(torch.nn.Module):
    """One token (1, 1) at ``position`` (1,): reads the cache, writes its own slot."""

    def __init__(self, core: StaticCacheLlama):
        super().__init__()
        self.core = core

    def forward(self, input_ids: torch.Tensor, position: torch.Tensor):
        out = self.core.step(input_ids, position)
        self.core.length[0:1].copy_(position + 1)
        self.core.length[1:2].add_(1)
        return out


class DecodeNext(torch.nn.Module):
    """One token (1, 1) at the cache's own next position (``core.length``), which it advances:
    the counter-driven API (transformers' StaticCache keeps such a counter too).  Its output
    depends on how often it ran: repeated without a reset, it moves along the cache."""

    def __init__(self, core: StaticCacheLlama):
        super().__init__()
        self.core = core

    def forward(self, input_ids: torch.Tensor):
        position = self.core.length[0:1].clone()
        out = self.core.step(input_ids, position)
        self.core.length.add_(1)
        return out


def core() -> StaticCacheLlama:
    torch.manual_seed(0)
    model = LlamaForCausalLM(config()).eval()
    model.config._attn_implementation = "eager"
    return StaticCacheLlama(model).eval()


def prompt() -> torch.Tensor:
    # seed 11: greedy tokens 62, 183, 112, 246, 45, each ahead of the runner-up by >= 0.025 in
    # logit (measured eager, CPU), far above compiled-kernel differences (~1e-6)
    g = torch.Generator().manual_seed(11)
    return torch.randint(0, VOCAB, (1, PROMPT_LEN), generator=g, dtype=torch.int64)


def methods() -> dict[str, tuple[torch.nn.Module, tuple]]:
    c = core()
    token = torch.tensor([[7]], dtype=torch.int64)
    return {
        "prefill": (Prefill(c), (prompt(),)),
        "decode": (Decode(c), (token, torch.tensor([PROMPT_LEN], dtype=torch.int64))),
        "decode_next": (DecodeNext(c), (token,)),
    }


def greedy(steps: int = DECODE_STEPS, method: str = "decode") -> list[tuple[str, tuple]]:
    """Eager greedy generation on a fresh core: [(method, args)], prefill then ``steps`` decodes
    (``decode``: token and position; ``decode_next``: token only), each decode's input the
    token the step before chose."""
    c = core()
    prefill, decode = Prefill(c), {"decode": Decode, "decode_next": DecodeNext}[method](c)
    out = [("prefill", (prompt(),))]
    with torch.no_grad():
        _, token = prefill(prompt())
        for i in range(steps):
            args = (token.view(1, 1).clone(),)
            if method == "decode":
                args += (torch.tensor([PROMPT_LEN + i], dtype=torch.int64),)
            out.append((method, args))
            _, token = decode(*args)
    return out


def sequences():
    return {"generate": greedy(), "generate_next": greedy(method="decode_next")}


def _expected():
    from toolkit.build.samples import Expected

    # 21 parameters + rotary inv_freq + 4 cache buffers + the counter = 27 constants per method, all
    # one tensor of the eager program: every sharing policy shares all 27 of decode and of
    # decode_next (the state by name, key or provenance) and reproduces the tokens; no-sharing
    # keeps each decode's cache empty.
    shared = {
        p: Expected.of(min_shared=2 * 27, declined=0)
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
    return {"no-sharing": Expected.of(sequence_wrong={"generate", "generate_next"}), **shared}


EXPECTED = _expected()
