"""The PyTorch + PEFT reference of tb-trainbench.

Usage: python peft_reference.py SPEC.json

SPEC.json (written by tb-trainbench) names a Hugging Face model directory and the run: token ids
of the batch, LoRA rank, alpha, target modules, per-step learning rates, AdamW betas, eps, weight
decay, gradient clipping, threads and whether to take an untimed warm-up step. The script trains
the same LoRA (dropout 0, every block) with AdamW on the same tokens, on the CPU in f32, times
each step (forward, backward, clipping, optimizer step) and prints one JSON line:

  {"step_seconds": [...], "losses": [...], "tokens_per_s": N, "threads": N, "versions": {...}}

`losses` has one entry per optimizer step, the warm-up's first; `step_seconds` only the timed
steps. A missing module exits with status 3 and names what to install.
"""

import json
import sys
import time

INSTALL = "pip install torch transformers peft safetensors"


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    try:
        import torch
        import transformers
        import peft
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        print(
            f"missing Python module {e.name!r}: install the reference with `{INSTALL}`",
            file=sys.stderr,
        )
        sys.exit(3)

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    lora = peft.LoraConfig(
        r=spec["rank"],
        lora_alpha=spec["alpha"],
        target_modules=spec["targets"],
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = peft.get_peft_model(model, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params,
        lr=spec["lrs"][0],
        betas=(spec["beta1"], spec["beta2"]),
        eps=spec["eps"],
        weight_decay=spec["weight_decay"],
    )
    ids = torch.tensor(spec["input_ids"], dtype=torch.long)
    clip = spec["grad_clip"]

    def step(lr):
        for g in opt.param_groups:
            g["lr"] = lr
        # labels = input_ids: the model shifts them and takes the mean over all targets.
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    lrs = list(spec["lrs"])
    losses = []
    if spec["warmup"]:
        losses.append(step(lrs.pop(0)))
    seconds = []
    for lr in lrs:
        t = time.perf_counter()
        losses.append(step(lr))
        seconds.append(time.perf_counter() - t)
    tokens = ids.numel()
    print(
        json.dumps(
            {
                "step_seconds": seconds,
                "losses": losses,
                "tokens_per_s": tokens / min(seconds),
                "threads": torch.get_num_threads(),
                "trainable": sum(p.numel() for p in params),
                "versions": {
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    "peft": peft.__version__,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
