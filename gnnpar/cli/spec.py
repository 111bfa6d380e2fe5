"""The run spec: every setting of one ``gnnpar-train`` run, validated once, then frozen.

``RunSpec.from_args(args)`` checks the parsed flags (:func:`gnnpar.cli.options.check_args`: bad
values and flags the run would ignore are refused with the flag's name), resolves the
device and a GAT's ``--heads``/``--attn-dropout`` defaults and parses ``--grid`` and
``--fanouts``. The launcher (:mod:`gnnpar.launcher.launch`) then makes the world-size decisions —
``--algo auto``'s algorithm, grid and variant, the backend — with :meth:`RunSpec.evolve`,
before any rank starts; every layer below reads the spec and none rewrites it
(``dataclasses.FrozenInstanceError`` if one tries).

Field names are the flags' (``--weight-decay`` → ``weight_decay``); the defaults are the
parser's (a test keeps them equal), so ``RunSpec(algo="1d", nprocs=2)`` is a valid spec for
code that builds runs without a command line. ``docs/architecture.md`` lists the layers
that read which fields.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from gnnpar.datasets import InputError
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.grid import parse_grid

from gnnpar.nn.custom_model import model_args_dict
from gnnpar.cli.options import check_args
from gnnpar.training.resume import attention_settings
from gnnpar.sampling.neighbor import parse_fanouts
from gnnpar.sampling.options import pipeline_depth
from gnnpar.training.trainer import default_weight_decay


@dataclass(frozen=True)
class RunSpec:
    """One run's settings (module docstring); each group mirrors a ``--help`` section."""

    # data
    dataset: Optional[str] = None
    directed: bool = False
    cache_dir: Optional[str] = None
    reorder: str = "auto"
    # model
    model: str = "gcn"
    layers: int = 2
    hidden: int = 64
    dropout: float = 0.5
    heads: Optional[int] = None  #: a GAT's, resolved by ``from_args`` (None: the default)
    attn_dropout: Optional[float] = None  #: a GAT's, resolved by ``from_args``
    model_args: Tuple[Tuple[str, object], ...] = ()  #: ``--model-arg``: a user model's keywords
    # task (link: gnnpar/link)
    task: str = "node"
    link_split: str = "0.85,0.05,0.1"
    neg_ratio: int = 1
    decoder: str = "dot"
    # training
    epochs: int = 100
    lr: float = 0.01
    weight_decay: Optional[float] = None  #: None: the task's (default_weight_decay)
    seed: int = 0
    device: str = "cpu"  #: resolved: "cpu", "cuda" or "cuda:N", never "auto"
    threads: Optional[int] = None
    precision: str = "fp32"
    # output
    log_json: Optional[str] = None
    save_model: Optional[str] = None
    save_predictions: Optional[str] = None
    profile: Optional[int] = None
    profile_dir: str = "."
    quiet: bool = False
    debug: bool = False
    max_memory: Optional[str] = None
    # distribution
    algo: str = "serial"  #: after the launcher, never "auto"
    nprocs: Optional[int] = None
    grid: Optional[str] = None
    grid_dims: Optional[Tuple[int, ...]] = None  #: ``grid`` parsed
    replication: Optional[int] = None
    partitioner: Optional[str] = None
    partition_dir: Optional[str] = None
    backend: str = "auto"
    variant: Optional[str] = None
    block_layout: str = "balanced"
    comm_dtype: str = "fp32"
    mem_cap: Optional[str] = None
    bandwidth: Optional[float] = None
    latency: Optional[float] = None
    calibration: Optional[str] = None
    timeout: float = 300.0
    # mini batch
    mode: str = "fullbatch"
    fanouts: Optional[Tuple[int, ...]] = None  #: parsed, input layer first
    batch_size: Optional[int] = None
    macrobatch: Optional[int] = None
    sampler_workers: Optional[int] = None  #: None: 1, or the burst width (sampling.setup)
    sample_in_bursts: Optional[bool] = None  #: None: the rule of sampling.setup
    prefetch: Optional[int] = None
    cache_frac: float = 0.0
    cache_policy: str = "degree"
    replace: bool = False
    replicate_graph: bool = True
    sample_on: str = "auto"
    features_on: str = "auto"
    group_size: Optional[int] = None
    # checkpoints
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 1
    checkpoint_keep: int = 3
    resume: bool = False

    def __post_init__(self):
        if self.weight_decay is None:  # resolved once, so checkpoints record the value used
            object.__setattr__(self, "weight_decay", default_weight_decay(self.task))

    @classmethod
    def from_args(cls, args) -> "RunSpec":
        """Check the parsed flags and freeze them (the device resolved, grid and fanouts
        parsed, a GAT's heads and attention dropout resolved to what the model uses, so the
        checkpoints and the saved model record the same values whether a default was
        spelled out or left out)."""
        check_args(args)
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                  if hasattr(args, f.name)}
        values.update(attention_settings(args))
        values["device"] = str(pick_device(args.device))
        if args.mode == "minibatch":  # every rank resolves them alike
            values["macrobatch"], values["prefetch"] = pipeline_depth(
                args.macrobatch, args.prefetch, args.sampler_workers,
                host_samples=args.sample_on == "host" or values["device"] == "cpu")
        values["model_args"] = tuple(model_args_dict(args.model_args).items())
        values["grid_dims"] = parse_grid(args.grid) if args.grid else None
        if args.fanouts is not None:
            values["fanouts"] = parse_fanouts(args.fanouts)
        return cls(**values)

    def evolve(self, **changes) -> "RunSpec":
        """A new spec with ``changes`` (the launcher's world-size decisions)."""
        if "grid" in changes:
            changes["grid_dims"] = parse_grid(changes["grid"]) if changes["grid"] else None
        return dataclasses.replace(self, **changes)

    def grid_shape(self, world: int) -> Dict[str, int]:
        """The named process grid ``algo`` runs on with ``world`` ranks (checked)."""
        shape = algorithm(self.algo).grid(world, self.grid_dims, self.replication or 1)
        ranks = int(np.prod(list(shape.values())))
        if ranks != world:
            raise InputError(f"--grid {self.grid} gives {ranks} ranks but the world size is "
                             f"{world}")
        return shape

    @property
    def minibatch(self) -> bool:
        return self.mode == "minibatch"

    @property
    def distributed(self) -> bool:
        """Whether the run needs ranks (a distributed algorithm, or mini batch on several)."""
        return self.algo != "serial" or (self.minibatch and (self.nprocs or 1) > 1)


def pick_device(choice: str) -> torch.device:
    """``--device``: ``auto`` = cuda when torch sees a GPU."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but torch sees no CUDA device")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)
