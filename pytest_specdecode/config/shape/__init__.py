"""The shape target's data: a model's architecture served with dummy weights, cut to fit.

The interface, for what is built on the shape (the map's per-depth fit, a drafter's pay-off):
- `geometry.Shape`: a config.json (verbatim), where it came from (`source`: "unit",
  "file:PATH" or a named shape; `origin`, in words), and its figures: `architecture`,
  `layers` (the full depth), `hidden`, `heads`, `kv_heads`, `vocab`, `routed_experts`,
  `experts_per_token`, `shared_experts`, `first_dense`, `min_depth`, `mla`, `quantization`.
- `named.NAMED`, `named.named_shape(name)`: llama-3.1-8b, llama-3.2-1b, deepseek-v3, kimi-k2.
- `memory`: `Room` (what the serving host gives: GPUs x --gpu-memory-utilization, or a
  CPU's memory; `shared(n, ...)`: each of n servers' part side by side), `ShapeBytes` (per
  layer: attention, dense MLP, MoE; embeddings; KV per token; `weights(shape, depth)`),
  `fit_depths` → `DepthFit` (the depths chosen: `depths`, ascending, the largest served).
- `served.ServedShape`: the shape as the run serves it: `layers` (the depth), `overrides`
  (--hf-overrides), `env` (the MoE routing), `tokenizer`, `served_name`, `folder` (where its
  config.json is written), `engine`, `fit`, `changed`, `notes`, `where` ("window"), `extras`
  (free for what is built on it); `argv(command)` the server command, `config_text()` the
  file, `at_depth(n)` the same shape at another depth, `statement()` the lines that say what
  is real, random, cut and changed; `to_dict`/`from_dict` (results.json's `shape`).
- `table.ShapeConfig`: what was asked ([shape] source and layers, --spec-shape and
  --spec-shape-layers); `resolve.serve_shape`: a Shape and the host's facts to a ServedShape,
  or `errors.ShapeRefused` before anything is touched.
Read on the host by targets/facts/shape_site.py; resolved by targets/shaped.py →
`resolve_shape(target, config, asked, facts, folder=, beside=)` (called by run/planning.py →
`Planning.resolve_shape`, kept as `Planning.shape`); served by targets/shaped.py →
`shaped_target(config, served, ...)`, a `ShapedTarget` (`.served`, `.inner`: the backend's
own target on the shape's command; a unit's own target, serving the shape through its drop-ins,
`.served.folder` on its host: targets/systemd/shape.py), which run/session.py → `_open_target`
opens once the plan resolved the shape; recorded as `RunRecord.shape`.
"""
