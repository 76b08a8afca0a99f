"""Checkpoint tensors -> model parameters, in three steps with one owner each:

1. ``WeightMap.canonical`` (the family's map, declared next to its model): checkpoint names
   become *canonical* names (renames; names that are not weights of the model skipped;
   per-tensor transforms such as Gemma's norm weight + 1).
2. ``split_fused`` (every family): tensors a checkpoint stores fused are split into canonical
   pieces: ``self_attn.qkv_proj`` -> q/k/v_proj, ``mlp.gate_up_proj`` -> gate/up_proj (Phi-3;
   their per-channel FP8 ``weight_scale`` rows too),
   ``mlp.experts.gate_up_proj`` [E, 2I, H] and ``mlp.experts.down_proj`` [E, H, I]
   (transformers 5's in-memory MoE layout) -> ``mlp.experts.{e}.*_proj.weight``.
3. ``PieceTable`` (built from the model): each canonical name is a slice of one parameter.
   Modules that fuse or stack parameters say so in ``weight_pieces()``; any other parameter
   is its own piece. An FP8 parameter's scale ``P_scale`` (one per row) has a piece
   ``name_scale`` for each piece ``name`` of ``P``, over the same rows.

Canonical names are Hugging Face Llama's (``model.layers.{i}.self_attn.q_proj.weight``, ...,
``lm_head.weight``), plus ``mlp.gate.weight`` (a router) and
``mlp.experts.{e}.{gate,up,down}_proj.weight`` (experts). Tensor parallelism slices canonical
tensors (worker.models.loader.rank_shard) between steps 2 and 3, and dummy weights are drawn
as canonical tensors, so neither knows any family.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

if TYPE_CHECKING:
    from worker.models.config import ModelConfig

Transform = Callable[[torch.Tensor, "ModelConfig"], torch.Tensor]
Weights = Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class WeightMap:
    """A family's checkpoint names. ``renames``: (regex, replacement) pairs applied in order
    (``re.sub``); ``skips``: regexes searched in the renamed name, a match is not a weight of
    the model (a vision tower, rotary caches); ``transforms``: (regex, fn) pairs, fn(tensor,
    full config) applied to the canonical tensors whose name matches."""

    renames: tuple[tuple[str, str], ...] = ()
    skips: tuple[str, ...] = ()
    transforms: tuple[tuple[str, Transform], ...] = ()

    def canonical(self, weights: Weights, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
        """Checkpoint (name, tensor) pairs as canonical ones; ``config``: the whole model's."""
        skips = (r"rotary_emb\.inv_freq", *self.skips)
        for name, tensor in weights:
            for pattern, replacement in self.renames:
                name = re.sub(pattern, replacement, name)
            if any(re.search(skip, name) for skip in skips):
                continue
            for piece_name, piece in split_fused(name, tensor, config):
                for pattern, fn in self.transforms:
                    if re.search(pattern, piece_name):
                        piece = fn(piece, config)
                yield piece_name, piece


def split_fused(name: str, tensor: torch.Tensor, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The canonical pieces of one checkpoint tensor (itself when it is not fused)."""
    prefix, _, leaf = name.rpartition(".")
    if re.search(r"\.self_attn\.qkv_proj\.(weight|bias|weight_scale)$", name):
        q, kv = cfg.num_q_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        base = prefix.removesuffix(".qkv_proj")
        for part, piece in zip(("q_proj", "k_proj", "v_proj"), tensor.split([q, kv, kv]), strict=True):
            yield f"{base}.{part}.{leaf}", piece
    elif re.search(r"\.mlp\.gate_up_proj\.(weight|weight_scale)$", name):
        base = prefix.removesuffix(".gate_up_proj")
        gate, up = tensor.chunk(2, dim=0)
        yield f"{base}.gate_proj.{leaf}", gate
        yield f"{base}.up_proj.{leaf}", up
    elif re.search(r"\.experts\.(gate_up_proj|down_proj)$", name) and tensor.dim() == 3:
        yield from _split_experts(prefix, leaf, tensor, cfg)
    else:
        yield name, tensor


def _split_experts(
    prefix: str, leaf: str, tensor: torch.Tensor, cfg: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """[E, 2I, H] gate_up (gate rows first) or [E, H, I] down, per expert; the transposed
    layouts ([E, H, 2I], [E, I, H]) some exports use are recognised by their shape."""
    assert cfg.moe is not None, f"{prefix}.{leaf}: expert weights in a model without experts"
    inter, hidden = cfg.moe.intermediate_size, cfg.hidden_size
    want = (2 * inter, hidden) if leaf == "gate_up_proj" else (hidden, inter)
    if tuple(tensor.shape[1:]) == want[::-1] and want[0] != want[1]:
        tensor = tensor.transpose(1, 2)
    if tuple(tensor.shape[1:]) != want:
        raise ValueError(
            f"checkpoint tensor {prefix}.{leaf} has shape {tuple(tensor.shape)}, expected [E, {want}]"
        )
    for e, expert in enumerate(tensor.unbind(0)):
        if leaf == "gate_up_proj":
            gate, up = expert.chunk(2, dim=0)
            yield f"{prefix}.{e}.gate_proj.weight", gate
            yield f"{prefix}.{e}.up_proj.weight", up
        else:
            yield f"{prefix}.{e}.down_proj.weight", expert


class Piece(NamedTuple):
    """Where a canonical tensor lives: ``param[expert]`` (or the whole ``param`` when expert
    is None), rows ``offset .. offset + rows`` of it (all rows when rows is None)."""

    param: str
    expert: int | None = None
    offset: int = 0
    rows: int | None = None

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """This piece's slice of ``tensor`` (the parameter, or a tensor of its shape)."""
        out = tensor if self.expert is None else tensor[self.expert]
        return out if self.rows is None else out.narrow(0, self.offset, self.rows)


def piece_table(model: nn.Module) -> dict[str, Piece]:
    """Canonical name -> Piece for every weight of ``model``; ordered parameter by parameter
    (a parameter's pieces in the order its module lists them)."""
    claimed: dict[str, dict[str, Piece]] = {}
    for prefix, module in model.named_modules():
        pieces = getattr(module, "weight_pieces", None)
        if pieces is None:
            continue
        at = f"{prefix}." if prefix else ""
        for local, piece in pieces().items():
            full = piece._replace(param=at + piece.param)
            claimed.setdefault(full.param, {})[at + local] = full
    params = dict(model.named_parameters())
    for name in params:  # FP8: a weight's per-row scales [..., N] share its pieces' rows
        base = name.removesuffix("_scale")
        if name.endswith("_scale") and base in params:
            pieces = claimed.get(base, {base: Piece(base)})
            claimed[name] = {f"{c}_scale": p._replace(param=name) for c, p in pieces.items()}
    table: dict[str, Piece] = {}
    for name in params:
        table.update(claimed.get(name, {name: Piece(name)}))
    return table


def load_pieces(model: nn.Module, weights: Weights, ignore: frozenset[str] = frozenset()) -> set[str]:
    """Copy canonical (name, tensor) pairs into the parameters; returns the names written.
    A name of ``ignore`` is skipped (a tied lm_head); any other unknown name raises."""
    table = piece_table(model)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        piece = table.get(name)
        if piece is None:
            if name in ignore:
                continue
            raise KeyError(f"checkpoint tensor {name!r} has no matching model parameter")
        dest = piece.view(params[piece.param].data)
        if dest.dtype == torch.float8_e4m3fn and tensor.dtype != dest.dtype:
            # NOTE: a cast would drop the scale (worker.models.fp8_checkpoint.quantize_strays)
            raise ValueError(f"checkpoint tensor {name!r} is {tensor.dtype}, its parameter FP8")
        if dest.shape != tensor.shape:
            raise ValueError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
            )
        dest.copy_(tensor)
        loaded.add(name)
    return loaded


def dummy_weights(
    model: nn.Module, dtype: torch.dtype, device: torch.device, seed: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Random canonical weights of ``model`` (the whole, unsharded model, typically on the
    meta device) that keep activations finite: N(0, 0.02) matrices, unit norms, zero bias.
    Drawn parameter by parameter in the model's order, so every tensor-parallel size gets the
    same weights; routers are N(0, 0.02) too, so routing is near uniform."""
    by_param: dict[str, list[tuple[str, Piece]]] = {}
    for canonical, piece in piece_table(model).items():
        by_param.setdefault(piece.param, []).append((canonical, piece))
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, meta in model.named_parameters():
        if name.endswith("norm.weight"):
            tensor = torch.ones(meta.shape, dtype=dtype, device=device)
        elif name.endswith(".bias"):
            tensor = torch.zeros(meta.shape, dtype=dtype, device=device)
        else:
            tensor = torch.empty(meta.shape, dtype=dtype, device=device).normal_(0.0, 0.02, generator=gen)
        for canonical, piece in by_param[name]:
            yield canonical, piece.view(tensor)
