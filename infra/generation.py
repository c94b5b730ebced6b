"""Generation and scoring on a transformers model: batched sampling that returns token ids with their
log-probs (the `hf` engine, infra/engines/hf.py), and batched log-prob scoring of given responses (the
reference policy, the trainers)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from infra.engines.config import EnginesConfig  # noqa: F401  (re-exported: the run config's `engines` section)
from infra.engines.types import Generation, GenerationRequest  # noqa: F401  (re-exported)


def _device(model) -> torch.device:
    """Where the model's weights are (inputs are built on the CPU and moved there)."""
    return next(model.parameters()).device


def _left_pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, n - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, n - len(s) :] = 1
    return ids, mask


class Sampler(LogitsProcessor):
    """Picks each next token itself and records its log-prob under softmax(logits / T) (greedy: the
    argmax, T = 1), keeping one step's distribution instead of every step's logits (`output_logits`
    holds [B, T, V] floats: 0.4 GB for 16 x 128 tokens of a 49k vocabulary). It samples by inverse CDF,
    one uniform per row (torch.multinomial draws an exponential per vocabulary entry: 5% of a decode
    step here), and returns scores that are -inf but at the picked token, so `generate` runs greedy and
    its argmax takes that token. Last in the processor list, it sees the logits the model's own
    generation-config processors leave."""

    def __init__(self, temperature: float, greedy: bool):
        self.temperature, self.greedy = (1.0 if greedy else temperature), greedy
        self.chosen: list[torch.Tensor] = []  # per step, the picked tokens' log-probs

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if self.greedy:
            token = logp.argmax(-1, keepdim=True)
        else:  # the first token whose cumulative probability exceeds u ~ U(0, total)
            cdf = logp.exp().cumsum(-1)
            if not torch.isfinite(cdf[:, -1]).all():
                raise FloatingPointError(
                    "the model's next-token logits are not finite (NaN or inf weights?): nothing to sample from"
                )
            u = torch.rand(cdf.shape[0], 1, device=cdf.device) * cdf[:, -1:]
            token = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[1] - 1)
        self.chosen.append(logp.gather(-1, token).squeeze(-1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)

    def logprobs(self) -> torch.Tensor:
        """[B, T] log-probs of the generated tokens."""
        return torch.stack(self.chosen, dim=1)


class StopOnText(StoppingCriteria):
    """Ends each row once its generated text (the prompt not included) contains one of `stops`."""

    def __init__(self, tokenizer, stops: Sequence[str], prompt_len: int):
        self.tokenizer, self.stops, self.prompt_len = tokenizer, tuple(stops), prompt_len

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_len :], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stops) for t in texts], device=input_ids.device)


def response_end(tokenizer, toks: list[int], stop_ids: set[int], stop_strings: Sequence[str]) -> int | None:
    """How many tokens the response keeps: through the first stop token or the token that completes a
    stop string, whichever comes first (None: neither, the response was cut at its budget)."""
    end = next((k + 1 for k, t in enumerate(toks) if t in stop_ids), None)
    text = tokenizer.decode(toks[:end], skip_special_tokens=True)
    if not any(s in text for s in stop_strings):
        return end
    return next(
        k
        for k in range(1, len(toks) + 1)
        if any(s in tokenizer.decode(toks[:k], skip_special_tokens=True) for s in stop_strings)
    )


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    greedy: bool = False,
    batch_size: int = 16,
    stop_ids: list[int] | None = None,
    stop_strings: Sequence[str] = (),
) -> list[Generation]:
    """Sample one response per prompt, ending at a stop token (default: end of sequence) or once the
    response's text contains a stop string (kept in the response). Log-probs are of the sampling
    distribution, softmax(logits / T) (greedy: T = 1), so training with the same T is on-policy."""
    stop = set(stop_ids or [tokenizer.eos_token_id])
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch together
    results: dict[int, Generation] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids, mask = _left_pad([prompts[i] for i in idx], tokenizer.pad_token_id)
        ids, mask = ids.to(_device(model)), mask.to(_device(model))
        criteria = StoppingCriteriaList([StopOnText(tokenizer, stop_strings, ids.shape[1])] if stop_strings else [])
        sampler = Sampler(temperature, greedy)
        seqs = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_k=None,
            top_p=None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=sorted(stop),
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=criteria,
        )
        new = seqs[:, ids.shape[1] :]
        chosen = sampler.logprobs()
        for row, i in enumerate(idx):
            toks = new[row].tolist()
            end = response_end(tokenizer, toks, stop, stop_strings)
            resp = toks[: end if end is not None else len(toks)]
            results[i] = Generation(
                prompt_ids=list(prompts[i]),
                response_ids=resp,
                logprobs=chosen[row, : len(resp)].tolist(),
                text=tokenizer.decode(resp, skip_special_tokens=True),
                truncated=end is None,
            )
    return [results[i] for i in range(len(prompts))]


# A packed row's length cap: the attention over a row grows with its length squared, the saving only
# with the prompt tokens not repeated.
PACK_TOKENS = 2048


def response_logits(
    model, prompts: list[list[int]], responses: list[list[int]], pad_id: int, share_prompt: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits [B, R_max, V] of the next-token distribution at each response position, teacher-forced on
    the responses; response ids [B, R_max]; 0/1 mask [B, R_max]).

    Prompts are left-padded and responses right-padded so all responses start in the same column;
    only the response positions' logits are computed. When prompts repeat (a group's G samples), each
    distinct prompt is run once with its responses packed after it (`_packed_logits`; a row longer than
    PACK_TOKENS starts another; `share_prompt=False`: once per response, the benchmarks' baseline).
    Keeps the autograd graph (use no_grad to score).
    """
    r_max = max(1, max(len(r) for r in responses))
    ids_r = torch.full((len(responses), r_max), pad_id, dtype=torch.long)
    mask_r = torch.zeros((len(responses), r_max), dtype=torch.long)
    for i, r in enumerate(responses):
        ids_r[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask_r[i, : len(r)] = 1
    dev = _device(model)
    ids_r, mask_r = ids_r.to(dev), mask_r.to(dev)
    # packed rows: their prompt and length, each response's row, the open row of each prompt
    row_prompts: list[list[int]] = []
    length: list[int] = []
    row_of: list[int] = []
    open_row: dict[tuple[int, ...], int] = {}
    for p, r in zip(prompts, responses):
        k = open_row.get(tuple(p))
        if k is None or length[k] + len(r) > PACK_TOKENS:
            k = open_row[tuple(p)] = len(row_prompts)
            row_prompts.append(list(p))
            length.append(len(p))
        length[k] += len(r)
        row_of.append(k)
    if share_prompt and len(row_prompts) < len(prompts):
        return _packed_logits(model, row_prompts, row_of, responses, r_max, pad_id), ids_r, mask_r
    ids_p, mask_p = _left_pad(prompts, pad_id)
    ids = torch.cat([ids_p.to(dev), ids_r], dim=1)
    mask = torch.cat([mask_p.to(dev), mask_r], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=r_max + 1).logits
    return logits[:, :-1], ids_r, mask_r


def _packed_logits(
    model, row_prompts: list[list[int]], row_of: list[int], responses: list[list[int]], r_max: int, pad_id: int
) -> torch.Tensor:
    """Response logits [B, R_max, V] when response i is packed in row `row_of[i]`, after that row's prompt
    `row_prompts[row_of[i]]`, in one forward pass. Every response's tokens take the positions they would
    have right after the prompt, and a 4D attention mask lets them see the prompt and their own earlier
    tokens only, so the prompt is computed (and back-propagated) once for all the responses in its row."""
    k_rows, dev = len(row_prompts), _device(model)
    length = [len(p) for p in row_prompts]
    for k, r in zip(row_of, responses):
        length[k] += len(r)
    n = max(length)
    ids = torch.full((k_rows, n), pad_id, dtype=torch.long)
    pos = torch.zeros((k_rows, n), dtype=torch.long)
    seg = torch.full((k_rows, n), -1, dtype=torch.long)  # 0: prompt, i + 1: response i, -1: padding
    end = [len(p) for p in row_prompts]
    for k, p in enumerate(row_prompts):
        ids[k, : len(p)], pos[k, : len(p)], seg[k, : len(p)] = (
            torch.tensor(p, dtype=torch.long),
            torch.arange(len(p)),
            0,
        )
    rows = torch.zeros((len(responses), r_max), dtype=torch.long)
    cols = torch.zeros((len(responses), r_max), dtype=torch.long)
    for i, r in enumerate(responses):
        k = row_of[i]
        o, p_len = end[k], len(row_prompts[k])
        ids[k, o : o + len(r)], seg[k, o : o + len(r)] = torch.tensor(r, dtype=torch.long), i + 1
        pos[k, o : o + len(r)] = p_len + torch.arange(len(r))
        rows[i] = k
        cols[i, : len(r)] = torch.tensor([p_len - 1] + list(range(o, o + len(r) - 1)))[: len(r)]  # where predicted
        end[k] += len(r)
    q, kv = seg[:, :, None], seg[:, None, :]
    see = torch.ones(n, n, dtype=torch.bool).tril() & (kv >= 0) & ((kv == 0) | (kv == q))
    see |= torch.eye(n, dtype=torch.bool)  # every token sees itself: no row of the mask is empty (NaN)
    dtype = model.get_input_embeddings().weight.dtype
    mask = torch.zeros(see.shape, dtype=dtype).masked_fill(~see, torch.finfo(dtype).min)[:, None]
    first = min(len(p) for p in row_prompts) - 1  # no logits before the shortest prompt's last token
    logits = model(
        input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), logits_to_keep=n - first
    ).logits
    return logits[rows.to(dev), (cols - first).clamp(min=0).to(dev)]


def response_logprobs(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    temperature: float = 1.0,
    share_prompt: bool = True,
) -> torch.Tensor:
    """Log-probs under softmax(logits / T) of each response token given its prompt, as a [B, R_max]
    tensor (0 past each end). Keeps the autograd graph (use no_grad to score)."""
    logits, ids_r, mask_r = response_logits(model, prompts, responses, pad_id, share_prompt)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    tok = logp.gather(-1, ids_r.unsqueeze(-1)).squeeze(-1)
    return tok * mask_r


@torch.no_grad()
def score_logprobs(
    model,
    prompts: list[list[int]],
    responses: list[list[int]],
    pad_id: int,
    batch_size: int = 16,
    temperature: float = 1.0,
) -> list[list[float]]:
    """Batched, gradient-free response log-probs as ragged lists."""
    out: list[list[float]] = [[] for _ in prompts]
    # prompts of similar length batch together, and the samples of one prompt next to each other (packed)
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), prompts[i], len(responses[i])))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        lp = response_logprobs(model, [prompts[i] for i in idx], [responses[i] for i in idx], pad_id, temperature)
        for row, i in enumerate(idx):
            out[i] = lp[row, : len(responses[i])].tolist()
    return out


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat rendered with the model's template, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def continue_chat(tokenizer, response_ids: list[int], content: str) -> list[int]:
    """Token ids to append after an assistant response so the sequence reads as the same chat plus a
    new user message and the next assistant header (closing the response's turn if it was cut off).

    Multi-turn contexts built this way are prefixes of each other, so every turn's tokens keep their
    position in one trajectory sequence (MARS trains System 2 on that sequence, observations masked)."""
    base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    closed = tokenizer.apply_chat_template(base, tokenize=False)
    longer = tokenizer.apply_chat_template(
        base + [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    if not longer.startswith(closed):
        raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
    close = closed[closed.rindex("y") + 1 :]  # what ends an assistant turn, e.g. "<|im_end|>\n"
    eos = tokenizer.eos_token or ""
    if response_ids and response_ids[-1] == tokenizer.eos_token_id and close.startswith(eos):
        close = close[len(eos) :]  # the response already ends with the end-of-turn token
    return tokenizer(close + longer[len(closed) :], add_special_tokens=False)["input_ids"]
