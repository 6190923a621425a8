"""Export real transformers models to ONNX with static shapes, for ``xflow bench FILE.onnx ...``.

Not a test and not a project dependency: it needs torch and transformers in a separate environment::

    python3 -m venv /tmp/exp
    /tmp/exp/bin/pip install torch transformers onnx onnxruntime onnxscript
    /tmp/exp/bin/python benchmarks/export_real.py --out build/real
    xflow bench build/real/*.onnx --seconds 30

Models are built from their default configs (nothing is downloaded), with weights like a trained checkpoint's:
transformers initializes every bias, every norm's shift and Swin's relative-position tables to zeros and every
norm's scale to ones, which a trained model never has and which the constant-folding peers delete (an Add of zeros,
a LayerNorm's unit scale), so each float parameter gets seeded noise of scale 0.02 on top and each BatchNorm running
statistics away from 0 and 1 (``--init-weights`` exports transformers' own initialization instead).
BERT-base and GPT-2 (batch 1, sequence 128), ViT-base, ConvNeXt-tiny, MobileNetV2, EfficientNet-B0 and Swin-tiny
(batch 1, 224x224), exported with the TorchScript exporter at opset 17 with every dim fixed, or with ``--dynamic``
with a dynamic batch (``dim_param`` ``batch``) and, for token inputs, a dynamic sequence length (``seq``) on the
inputs and the output (``dynamic_axes``; the traced sizes stay the export's example)::

    /tmp/exp/bin/python benchmarks/export_real.py --dynamic --out build/real-dyn --only bert_base gpt2
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch


class _FirstOutput(torch.nn.Module):
    """The model's first output tensor (``last_hidden_state`` or logits), so the export has one output; the
    inputs go to the model by name (an encoder-decoder's decoder ids are not its second positional argument)."""

    def __init__(self, model: torch.nn.Module, input_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.input_names, args, strict=True)), return_dict=False)
        return out[0]


def perturb_weights(model: torch.nn.Module, seed: int = 0, scale: float = 0.02) -> None:
    """Move every float parameter off its initial value by seeded noise, and BatchNorm statistics off 0 and 1.

    Trained checkpoints have no all-zero biases or all-one norm scales; the export should not either."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.parameters():
            if tensor.dtype.is_floating_point:
                tensor.add_(scale * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
        for name, buffer in model.named_buffers():
            if name.endswith("running_mean"):
                buffer.add_(scale * torch.randn(buffer.shape, generator=generator, dtype=buffer.dtype))
            elif name.endswith("running_var"):
                buffer.mul_(0.5 + torch.rand(buffer.shape, generator=generator, dtype=buffer.dtype))


Entry = tuple[Callable[[], torch.nn.Module], tuple[torch.Tensor, ...], list[str]]


def _models() -> dict[str, Entry]:
    """Each model's maker (built only when exported), example inputs and input names."""
    import transformers as tf

    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (1, 128))
    mask = torch.ones_like(ids)
    decoder_ids = torch.randint(0, 1000, (1, 32))
    image = torch.rand(1, 3, 224, 224)
    tokens = ["input_ids", "attention_mask"]
    return {
        "bert_base": (lambda: tf.BertModel(tf.BertConfig()), (ids, mask), tokens),
        "gpt2": (lambda: tf.GPT2Model(tf.GPT2Config()), (ids,), ["input_ids"]),
        "vit_base": (lambda: tf.ViTModel(tf.ViTConfig()), (image,), ["pixel_values"]),
        "convnext_tiny": (lambda: tf.ConvNextModel(tf.ConvNextConfig()), (image,), ["pixel_values"]),
        "mobilenet_v2": (lambda: tf.MobileNetV2Model(tf.MobileNetV2Config()), (image,), ["pixel_values"]),
        # the default EfficientNet config is B7 (600x600): B0's coefficients and resolution instead
        "efficientnet_b0": (lambda: tf.EfficientNetModel(tf.EfficientNetConfig(
            width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, image_size=224)),
            (image,), ["pixel_values"]),
        "swin_tiny": (lambda: tf.SwinModel(tf.SwinConfig()), (image,), ["pixel_values"]),
        # the rest of issue 20's sixteen; default configs except where the default is a large checkpoint
        # (ALBERT's is xxlarge, Llama's 7B): their base-sized shapes then
        "albert_base": (lambda: tf.AlbertModel(tf.AlbertConfig(
            hidden_size=768, num_attention_heads=12, intermediate_size=3072)), (ids, mask), tokens),
        "distilbert": (lambda: tf.DistilBertModel(tf.DistilBertConfig()), (ids, mask), tokens),
        "squeezebert": (lambda: tf.SqueezeBertModel(tf.SqueezeBertConfig()), (ids, mask), tokens),
        # grouped-query attention, as Llama's own: eager attention (the TorchScript exporter has no GQA sdpa)
        "llama": (lambda: tf.LlamaModel(tf.LlamaConfig(
            hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
            num_key_value_heads=4, attn_implementation="eager")), (ids,), ["input_ids"]),
        "t5_small": (lambda: tf.T5Model(tf.T5Config()), (ids, mask, decoder_ids),
                     [*tokens, "decoder_input_ids"]),
        "whisper_tiny": (lambda: tf.WhisperModel(tf.WhisperConfig()), (torch.rand(1, 80, 3000), decoder_ids),
                         ["input_features", "decoder_input_ids"]),
        "wav2vec2_base": (lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config()), (torch.rand(1, 16000) - 0.5,),
                          ["input_values"]),
        "resnet50": (lambda: tf.ResNetModel(tf.ResNetConfig()), (image,), ["pixel_values"]),
        "regnet": (lambda: tf.RegNetModel(tf.RegNetConfig()), (image,), ["pixel_values"]),
    }


#: the dynamic axes of ``--dynamic``: batch everywhere, and the sequence where the input is tokens
_TOKEN_AXES = {0: "batch", 1: "seq"}
_IMAGE_AXES = {0: "batch"}  # images, audio: batch only


def dynamic_axes(input_names: list[str]) -> dict[str, dict[int, str]]:
    """The ``dynamic_axes`` of a model with these inputs (its one output follows its inputs' kind; an
    encoder-decoder's output is the decoder's, whose length is its own)."""
    def is_tokens(name: str) -> bool:
        return name.endswith("_ids") or name == "attention_mask"

    axes = {name: dict(_TOKEN_AXES if is_tokens(name) else _IMAGE_AXES) for name in input_names}
    if "decoder_input_ids" in input_names:
        axes["decoder_input_ids"] = axes["output"] = {0: "batch", 1: "decoder_seq"}
    else:
        axes["output"] = dict(_TOKEN_AXES if all(is_tokens(n) for n in input_names) else _IMAGE_AXES)
    return axes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/real", help="folder for the .onnx files")
    parser.add_argument("--only", nargs="*", help="export only these models")
    parser.add_argument("--dynamic", action="store_true", help="dynamic batch (and sequence) axes")
    parser.add_argument("--init-weights", action="store_true",
                        help="keep transformers' initialization (zero biases, unit norm scales)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, (make, inputs, input_names) in _models().items():
        if args.only and name not in args.only:
            continue
        model = make()
        path = os.path.join(args.out, f"{name}.onnx")
        start = time.perf_counter()
        if not args.init_weights:
            perturb_weights(model)
        with torch.no_grad():
            torch.onnx.export(_FirstOutput(model.eval(), input_names), inputs, path, input_names=input_names,
                              output_names=["output"], opset_version=17, dynamo=False,
                              dynamic_axes=dynamic_axes(input_names) if args.dynamic else None)
        print(f"{path}: {os.path.getsize(path) / 2**20:.0f} MiB in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
