"""peft DoRA under DDP: ``LoraConfig(task_type="SEQ_CLS", use_dora=True, target_modules=["q_proj",
"v_proj"])`` on a tiny ``LlamaForSequenceClassification`` built from a ``LlamaConfig`` (no download;
``pad_token_id`` set: the score is read at each row's last non-pad token); the classification head is
trained as a ``modules_to_save`` copy, the LoRA A/B matrices and the DoRA magnitude vectors are trained,
the base weights frozen. Rows are left-padded to a common length (the pad lengths drawn for the global
batch) and the attention mask is passed. Two micro-batches per update, the first under ``ddp.no_sync()`` (DDP with
``find_unused_parameters=True``, as the transformers Trainer's ``ddp_find_unused_parameters`` sets it for
adapters), each loss divided by 2; ``clip_grad_norm_`` once per update; AdamW (eps 1e-5: the zero-
initialised B matrices' first steps are ``lr * sign(g)``, which a smaller eps makes roundoff-sensitive)
over the trainable parameters. After every second update a validation pass: ``model.merge_adapter()``,
``eval()``, ``no_grad``, ``unmerge_adapter()``, ``train()``. Every draw is made for the global micro-
batch by a generator seeded per micro-step; each rank keeps its rows.

The one-device reference: the same model on the global micro-batches, the same accumulation, clip,
validation (merge / unmerge) and steps.

Follows huggingface/peft ``examples/sequence_classification/LoRA.ipynb`` / the DoRA docs
(``LoraConfig(use_dora=True)``, ``task_type="SEQ_CLS"`` adds the classifier to ``modules_to_save``),
``src/peft/tuners/lora/layer.py`` (``merge`` / ``unmerge``, ``lora_magnitude_vector``), the PyTorch DDP
docs (``no_sync`` for accumulation) and transformers ``modeling_llama.py``
(``LlamaForSequenceClassification``: the last non-pad token's logits).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

VOCAB, LENGTH, LABELS, GB, ACC, PAD, SEED = 32, 8, 3, 8, 2, 0, 197
LR, MAX_NORM = 2e-2, 0.1
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "clip_each_micro": "clip_grad_norm_ after every micro-batch's backward: the first micro-batch's local (unsynchronised) gradient is clipped",
    "dora_magnitude_not_optimized": "the optimizer takes only the parameters named lora_A / lora_B: DoRA's magnitude vectors and the head are never stepped",
    "no_sync_on_last_micro": "ddp.no_sync() wraps the last micro-batch instead of the first: the last micro-batch's gradient is never all-reduced",
    "lr_scaled_world": "the AdamW lr is multiplied by the world size (linear scaling) although the loss is already averaged over the global batch",
    "adapter_left_merged": "merge_adapter() before validation without unmerge_adapter() after: training goes on with the adapters merged (LoRA/DoRA parameters get no gradient)",
    "attention_mask_dropped": "the attention mask is not passed: the real tokens attend to the left padding",
    "pad_lengths_per_rank": "each rank draws its rows' padding lengths from a rank-seeded generator instead of its rows of the global draw",
}


def make_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForSequenceClassification
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=32, num_labels=LABELS, pad_token_id=PAD)
    torch.manual_seed(SEED)
    base = LlamaForSequenceClassification(cfg)
    lora = LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      use_dora=True)
    return get_peft_model(base, lora)


def micro(i: int, r: int, w: int, bug=None):
    g = gen(SEED + i)
    ids = torch.randint(1, VOCAB, (GB, LENGTH), generator=g)
    y = (ids[:, -3:].sum(1) % LABELS)
    pads = torch.randint(0, LENGTH - 2, (GB,), generator=g)
    lb = GB // w
    rows = slice(r * lb, (r + 1) * lb)
    ids, y, pads = ids[rows], y[rows], pads[rows]
    if bug == "pad_lengths_per_rank":
        pads = torch.randint(0, LENGTH - 2, (lb,), generator=gen(SEED * 31 + i * 7 + r))
    mask = (torch.arange(LENGTH)[None] >= pads[:, None]).long()
    return torch.where(mask.bool(), ids, torch.full_like(ids, PAD)), mask, y


def loss_of(model, ids, mask, y, bug=None):
    out = model(input_ids=ids) if bug == "attention_mask_dropped" else model(input_ids=ids, attention_mask=mask)
    return F.cross_entropy(out.logits, y)


def validate(peft_model, fwd, bug=None):
    peft_model.merge_adapter()
    peft_model.eval()
    with torch.no_grad():
        ids, mask, y = micro(999, 0, 1)
        fwd(input_ids=ids, attention_mask=mask)
    if bug != "adapter_left_merged":
        peft_model.unmerge_adapter()
    peft_model.train()


def run(peft_model, fwd, r, w, bug=None, ddp=None) -> None:
    if bug == "dora_magnitude_not_optimized":
        params = [p for n, p in peft_model.named_parameters() if "lora_A" in n or "lora_B" in n]
    else:
        params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR * (w if bug == "lr_scaled_world" else 1), weight_decay=0.0, eps=1e-5)
    peft_model.train()
    for step in range(STEPS):
        for k in range(ACC):
            first = k == 0
            skip_sync = (not first) if bug == "no_sync_on_last_micro" else first
            ctx = ddp.no_sync() if ddp is not None and skip_sync else contextlib.nullcontext()
            with ctx:
                (loss_of(fwd, *micro(step * ACC + k, r, w, bug), bug=bug) / ACC).backward()
            if bug == "clip_each_micro" and first:
                torch.nn.utils.clip_grad_norm_(peft_model.parameters(), MAX_NORM)
        torch.nn.utils.clip_grad_norm_(peft_model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()
        if step % 2 == 1:
            validate(peft_model, fwd, bug)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the peft model under DDP, its rows of every global micro-batch."""
    model = make_model()
    ddp = DDP(model, find_unused_parameters=True)
    run(model, ddp, rank(), world_size, bug, ddp)


def reference(world_size: int) -> None:
    """One device: the global micro-batches."""
    model = make_model()
    run(model, model, 0, 1)
