"""The model file ``--save-model`` writes, and :func:`load_model`, which makes the model again.

A model file is a ``torch.save`` of plain containers, tensors and numbers, so
``torch.load(weights_only=True)`` reads it and nothing in it is unpickled as code:

- ``format``: ``"gnnpar-model"`` and ``format_version`` (1);
- ``model``: ``gcn``, ``sage``, ``gat`` or a user's ``package.module:factory``;
- ``f_in``, ``hidden``, ``f_out``, ``layers``, ``dropout``: what the factory was called with;
- ``heads``, ``attn_dropout``: a GAT's, resolved (never ``None``);
- ``model_args``: a user's model or layer's ``--model-arg`` keywords, where it had any;
- ``norm``: the Â the model was trained with (``gcn``, ``mean`` or ``sum``);
- ``state_dict``: the weights, on the CPU;
- a link-prediction model's (``--task link``) also ``task`` (``"link"``), ``decoder``
  (``dot`` or ``mlp``) and ``decoder_state``; :func:`load_model` gives its encoder, the
  decoder as the encoder's ``decoder`` (``model.decoder(z_u, z_v)`` scores pairs).

Files written before ``format`` existed (``state_dict``, ``model``, ``layers``, ``hidden``,
``f_in``, ``f_out`` and a GAT's ``heads``) load too, with the defaults for what they lack.
A file is replaced atomically: written beside its path, then renamed, so a failed save leaves
the previous file whole and never a half-written one under the final name.
"""
from __future__ import annotations

import os
from typing import Dict

import torch
from torch import nn

from gnnpar.datasets import InputError
from gnnpar.datasets.limits import writing_to

from gnnpar.nn.attention import GAT_HEADS
from gnnpar.nn.model_registry import facts
from gnnpar.link.decoders import build_decoder
from gnnpar.nn.models import build_model

FORMAT, FORMAT_VERSION = "gnnpar-model", 1
#: the keys every model file has, old or new
_REQUIRED = ("state_dict", "model", "layers", "hidden", "f_in", "f_out")


def model_payload(model: nn.Module, spec, shapes: Dict[str, int]) -> dict:
    """What :func:`write_model_file` stores for ``model`` trained under ``spec``;
    ``shapes``: its ``f_in`` and ``f_out``. A link run's ``model`` is its encoder and
    decoder (:func:`gnnpar.link.loop.link_modules`)."""
    if isinstance(model, nn.ModuleDict) and "decoder" in model:
        return {**model_payload(model["encoder"], spec, shapes), "task": "link",
                "decoder": spec.link.decoder,
                "decoder_state": {k: v.detach().cpu()
                                  for k, v in model["decoder"].state_dict().items()}}
    m = spec.model
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION,
               "model": m.model, "layers": int(m.layers), "hidden": int(m.hidden),
               "dropout": float(m.dropout), "norm": str(getattr(model, "norm", "gcn")),
               "f_in": int(shapes["f_in"]), "f_out": int(shapes["f_out"]),
               "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}
    if m.model_args:
        payload["model_args"] = dict(m.model_args)
    if facts(m.model).attention:
        payload["heads"] = int(GAT_HEADS if m.heads is None else m.heads)
        payload["attn_dropout"] = float(model.attn_dropout)
    return payload


def write_model_file(path: str, payload: dict) -> None:
    """``payload`` to ``path``, atomically (a device such as ``/dev/null`` is written to)."""
    if os.path.exists(path) and not os.path.isfile(path):
        torch.save(payload, path)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with writing_to(path):
            torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_model_file(path: str) -> dict:
    """The payload of the gnnpar model file ``path``; an InputError (one line) for a missing
    file, one ``torch.load(weights_only=True)`` cannot read, or one that is not gnnpar's."""
    if not os.path.isfile(path):
        raise InputError(f"model file {path}: not found" if not os.path.exists(path)
                         else f"model file {path}: not a file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file: torch.load's errors vary
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = first.split(". ")[0]  # torch's first sentence; the rest is advice on pickles
        raise InputError(f"model file {path}: not a gnnpar model file ({first})") from None
    if not isinstance(payload, dict) or any(k not in payload for k in _REQUIRED) or \
            payload.get("format", FORMAT) != FORMAT:
        raise InputError(f"model file {path}: not a gnnpar model file (what --save-model "
                         "writes)")
    if payload.get("format_version", 1) > FORMAT_VERSION:
        raise InputError(f"model file {path}: format version {payload['format_version']} is "
                         f"newer than this gnnpar reads ({FORMAT_VERSION})")
    return payload


def model_from_payload(payload: dict, source: str = "model file") -> nn.Module:
    """The model ``payload`` describes, with its weights, in evaluation mode."""
    kind = payload["model"]
    gat = facts(kind).attention
    try:
        model = build_model(kind, int(payload["f_in"]), int(payload["hidden"]),
                            int(payload["f_out"]), int(payload["layers"]),
                            float(payload.get("dropout", 0.0)),
                            heads=(payload.get("heads") or GAT_HEADS) if gat else None,
                            attn_dropout=payload.get("attn_dropout") if gat else None,
                            model_args=payload.get("model_args"))
    except ValueError as exc:
        raise InputError(f"{source}: cannot rebuild model {kind!r}: {exc}") from None
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise InputError(f"{source}: its weights do not fit model {kind!r} ({first})") from None
    if payload.get("task") == "link":
        model.decoder = _decoder(payload, source)
    if "norm" in payload and getattr(model, "norm", payload["norm"]) != payload["norm"]:
        raise InputError(f"{source}: model {kind!r} now asks for norm {model.norm!r}, but it "
                         f"was trained with {payload['norm']!r}")
    return model.eval()


def _decoder(payload: dict, source: str) -> nn.Module:
    """A link model's decoder with its weights."""
    decoder = build_decoder(str(payload.get("decoder")), int(payload["f_out"]))
    try:
        decoder.load_state_dict(payload.get("decoder_state", {}))
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise InputError(f"{source}: its decoder weights do not fit ({first})") from None
    return decoder.eval()


def load_model(path: str, device="cpu") -> nn.Module:
    """The model ``--save-model`` wrote to ``path``, weights loaded, in evaluation mode, on
    ``device``. Its ``norm`` attribute names the Â it was trained with; a user's
    ``package.module:factory`` model is rebuilt by importing that factory again."""
    return model_from_payload(read_model_file(path), f"model file {path}").to(device)
