#!/usr/bin/env python3
"""Writes the LoRA golden fixtures (tests/golden/<case>/): a small random model from
generate.py with PEFT LoRA adapters, trained for 6 steps by transformers + PEFT in fp32.

The base is frozen; only the adapters train, with generate.py's loss, AdamW (decay on every
2-D tensor: every adapter matrix), LR schedule and grad clip (over the adapters' grads). The
adapters start from `adapter_init/` (A drawn as PEFT's Kaiming-uniform bound, B non-zero so
that the step-1 gradients of A are not zero), which loom reads as `train.lora.init.adapter`.

Each case folder holds:
  model/                 the frozen base (HF checkpoint)
  adapter_init/          the adapters before step 1 (PEFT's save_pretrained)
  rows.jsonl, recipe.json, trace.json   as generate.py's (trace: the adapters' grad norm)
  step1.safetensors      logits, nll, num_targets and grad.<PEFT name> of every adapter
  adapter_final/         the adapters after the last step (PEFT's save_pretrained)
  merged.safetensors     the base with the final adapters merged (PEFT's merge_and_unload)

Run: python3 tests/golden/generate_lora.py [--out DIR] [--case NAME]
Needs generate.py's packages plus peft. Deterministic as generate.py (one thread, our own
torch.Generator for every drawn tensor).
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers.utils import logging as transformers_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate  # noqa: E402  (the base cases, data, training loop and writers)
import peft  # noqa: E402

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

CASES = {
    # Every target, alpha / rank scaling, on tiny_untied's model and rows.
    "tiny_lora": {
        "base": "tiny_untied",
        "seed": 8008,
        "clip_grad": 0.7,  # the adapters' grad norm runs 0.57-0.76: steps 2, 4 and 6 clip
        "lora": {"rank": 4, "alpha": 8.0, "targets": ALL_TARGETS, "rslora": False},
    },
    # Some targets (q and v share qkv's input with an untargeted k; down without gate/up),
    # rsLoRA's alpha / sqrt(rank), a tied base.
    "tiny_lora_rslora": {
        "base": "tiny_tied",
        "seed": 9009,
        "clip_grad": 0.45,  # 0.36-0.54: steps 2, 4 and 6 clip
        "lora": {"rank": 2, "alpha": 4.0, "targets": ["q_proj", "v_proj", "down_proj"], "rslora": True},
    },
}

# B starts at B_STD · N(0, 1) instead of PEFT's zeros.
B_STD = 0.05


def peft_name(name):
    """A trainable parameter's name as PEFT saves it (the adapter name "default" dropped)."""
    return name.replace(".default.", ".")


def init_adapters(model, gen):
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform_(a=sqrt(5)) bound), B ~
    B_STD · N(0, 1); drawn in sorted name order from `gen`."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if not p.requires_grad:
                continue
            if ".lora_A." in name:
                bound = 1.0 / math.sqrt(p.shape[1])
                p.copy_((torch.rand(p.shape, generator=gen, dtype=torch.float32) * 2.0 - 1.0) * bound)
            elif ".lora_B." in name:
                p.copy_(B_STD * torch.randn(p.shape, generator=gen, dtype=torch.float32))
            else:
                raise RuntimeError(f"unexpected trainable parameter {name}")


def save_adapter(wrapped, directory):
    """PEFT's save_pretrained, less its model-card README, with target_modules sorted (PEFT
    keeps them as a set, whose order changes from one Python process to the next)."""
    wrapped.save_pretrained(directory)
    os.remove(os.path.join(directory, "README.md"))
    path = os.path.join(directory, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    config["target_modules"] = sorted(config["target_modules"])
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def generate_case(name, case, out_dir):
    base = generate.CASES[case["base"]]
    lora = case["lora"]
    recipe = dict(generate.RECIPE, row_tokens=base["row_tokens"], clip_grad=case["clip_grad"],
                  lora=dict(lora))
    gen = torch.Generator().manual_seed(base["seed"])
    model = generate.build_hf_model(base)
    generate.init_weights(model, gen)
    rows = generate.make_rows(base, gen)
    tokens = torch.tensor([r["tokens"] for r in rows])
    loss_mask = torch.tensor([r["loss_mask"] for r in rows])

    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir)
    try:
        os.chmod(tmp, 0o755)
        generate.save_model(model, os.path.join(tmp, "model"))
        config = peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], target_modules=lora["targets"],
                                 lora_dropout=0.0, use_rslora=lora["rslora"], bias="none",
                                 task_type="CAUSAL_LM")
        wrapped = peft.get_peft_model(model, config)
        init_adapters(wrapped, torch.Generator().manual_seed(case["seed"]))
        save_adapter(wrapped, os.path.join(tmp, "adapter_init"))
        with open(os.path.join(tmp, "rows.jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        generate.write_json(os.path.join(tmp, "recipe.json"), recipe)

        params = {peft_name(n): p for n, p in wrapped.named_parameters() if p.requires_grad}
        # The injected model computes base + B·A; generate.hf_forward calls it as transformers'.
        trace, step1 = generate.train(generate.hf_forward(model), params, tokens, loss_mask, recipe)
        save_file(generate.tensors_to_save(step1), os.path.join(tmp, "step1.safetensors"),
                  metadata={"format": "pt"})
        generate.write_json(os.path.join(tmp, "trace.json"), {"steps": trace})
        save_adapter(wrapped, os.path.join(tmp, "adapter_final"))
        merged = wrapped.merge_and_unload()
        save_file(generate.tensors_to_save(dict(merged.named_parameters())),
                  os.path.join(tmp, "merged.safetensors"), metadata={"format": "pt"})
        final_dir = os.path.join(out_dir, name)
        if os.path.exists(final_dir):
            shutil.rmtree(final_dir)
        os.rename(tmp, final_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"{name}: {len(params)} adapter tensors, step-1 loss {trace[0]['loss']!r}")
    for t in trace:
        print(f"  step {t['step']}: loss {t['loss']:.7f} grad_norm {t['grad_norm']:.6f} "
              f"lr {t['lr']:.6e} clipped {t['clipped']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                        help="folder that receives one subfolder per case (default: this folder)")
    parser.add_argument("--case", action="append", choices=sorted(CASES),
                        help="generate only this case (repeatable; default: all)")
    args = parser.parse_args()
    transformers_logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name in args.case or CASES:
        generate_case(name, CASES[name], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
