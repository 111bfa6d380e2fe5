"""The run spec: every setting of one ``gnnpar-train`` run, validated once, then frozen.

A :class:`RunSpec` is eight frozen sections, one per ``--help`` group (a test keeps the two
equal): ``data``, ``model``, ``train``, ``output``, ``link``, ``parallel``, ``batch`` (mini
batch) and ``checkpoint``. A reader names the section it depends on
(``spec.parallel.algo``, ``spec.batch.fanouts``), so what a layer reads is visible in its code.

``RunSpec.from_args(args)`` checks the parsed flags (:func:`gnnpar.cli.options.check_args`: bad
values and flags the run would ignore are refused with the flag's name), resolves the
device and a GAT's ``--heads``/``--attn-dropout`` defaults and parses ``--grid`` and
``--fanouts``. The launcher (:mod:`gnnpar.launcher.launch`) then makes the world-size decisions —
``--algo auto``'s algorithm, grid and variant, the backend — with :meth:`RunSpec.evolve`,
before any rank starts; every layer below reads the spec and none rewrites it
(``dataclasses.FrozenInstanceError`` if one tries).

Field names are the flags' (``--weight-decay`` → ``train.weight_decay``); the defaults are the
parser's (a test keeps them equal), so ``RunSpec.of(algo="1d", nprocs=2)`` (flag names, each
routed to its section) is a valid spec for code that builds runs without a command line.
``kernels/`` takes flags, not sections: :meth:`RunSpec.settings` is its flat view.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from gnnpar.datasets import InputError
from gnnpar.kernels.algorithms import get as algorithm
from gnnpar.kernels.grid import parse_grid

from gnnpar.nn.custom_model import model_args_dict
from gnnpar.cli.options import check_args
from gnnpar.training.resume import attention_settings, check_checkpoint_folder
from gnnpar.sampling.neighbor import parse_fanouts
from gnnpar.sampling.options import pipeline_depth
from gnnpar.training.trainer import default_weight_decay


@dataclass(frozen=True)
class DataSpec:
    """``data``: which graph, and how it is read."""

    dataset: Optional[str] = None
    directed: bool = False
    cache_dir: Optional[str] = None
    reorder: str = "auto"
    max_memory: Optional[str] = None


@dataclass(frozen=True)
class ModelSpec:
    """``model``: the network (``model`` is its name: built-in, or ``module:factory``)."""

    model: str = "gcn"
    model_args: Tuple[Tuple[str, object], ...] = ()  #: ``--model-arg``: a user model's keywords
    layers: int = 2
    hidden: int = 64
    dropout: float = 0.5
    heads: Optional[int] = None  #: a GAT's, resolved by ``from_args`` (None: the default)
    attn_dropout: Optional[float] = None  #: a GAT's, resolved by ``from_args``


@dataclass(frozen=True)
class TrainSpec:
    """``training``: the optimisation and where it runs."""

    epochs: int = 100
    lr: float = 0.01
    weight_decay: Optional[float] = None  #: None: the task's (default_weight_decay)
    seed: int = 0
    device: str = "cpu"  #: resolved: "cpu", "cuda" or "cuda:N", never "auto"
    precision: str = "fp32"
    threads: Optional[int] = None


@dataclass(frozen=True)
class OutputSpec:
    """``output``: what the run writes and shows."""

    log_json: Optional[str] = None
    save_model: Optional[str] = None
    save_predictions: Optional[str] = None
    profile: Optional[int] = None
    profile_dir: str = "."
    quiet: bool = False
    debug: bool = False


@dataclass(frozen=True)
class LinkSpec:
    """``link prediction``: the task (gnnpar/link)."""

    task: str = "node"
    link_split: str = "0.85,0.05,0.1"
    neg_ratio: int = 1
    decoder: str = "dot"


@dataclass(frozen=True)
class ParallelSpec:
    """``distributed full-batch``: the algorithm, its grid and the wire."""

    algo: str = "serial"  #: after the launcher, never "auto"
    nprocs: Optional[int] = None
    grid: Optional[str] = None
    grid_dims: Optional[Tuple[int, ...]] = None  #: ``grid`` parsed (by RunSpec.of/evolve)
    replication: Optional[int] = None
    partitioner: Optional[str] = None
    partition_dir: Optional[str] = None
    backend: str = "auto"
    comm_dtype: str = "fp32"
    block_layout: str = "balanced"
    variant: Optional[str] = None
    mem_cap: Optional[str] = None
    bandwidth: Optional[float] = None
    latency: Optional[float] = None
    calibration: Optional[str] = None
    timeout: float = 300.0


@dataclass(frozen=True)
class BatchSpec:
    """``mini-batch training``: the mode, and the sampler and pipeline of mini batch."""

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


@dataclass(frozen=True)
class CheckpointSpec:
    """``checkpoints``: where and how often the run saves itself, and whether it resumes."""

    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 1
    checkpoint_keep: int = 3
    resume: bool = False


#: section name -> its class, in ``--help`` order
SECTIONS = {"data": DataSpec, "model": ModelSpec, "train": TrainSpec, "output": OutputSpec,
            "link": LinkSpec, "parallel": ParallelSpec, "batch": BatchSpec,
            "checkpoint": CheckpointSpec}

#: flag name (``dest``) -> the section that holds it
SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class RunSpec:
    """One run's settings (module docstring): one frozen section per ``--help`` group."""

    data: DataSpec = field(default_factory=DataSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    link: LinkSpec = field(default_factory=LinkSpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    batch: BatchSpec = field(default_factory=BatchSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)

    @classmethod
    def of(cls, **flags) -> "RunSpec":
        """A spec from flag names (``RunSpec.of(algo="1d", nprocs=2)``), each routed to its
        section; the rest are the parser's defaults, and an unknown name is a TypeError. The
        weight decay left unset is resolved here, by task, once (checkpoints record the value
        used); build specs with this (or :meth:`from_args`), not the bare constructor."""
        sections = {name: SECTIONS[name](**values) for name, values in _by_section(flags).items()}
        train, task = sections.get("train", TrainSpec()), flags.get("task", "node")
        if train.weight_decay is None:
            sections["train"] = dataclasses.replace(train,
                                                    weight_decay=default_weight_decay(task))
        return cls(**sections)

    @classmethod
    def from_args(cls, args) -> "RunSpec":
        """Check the parsed flags and freeze them (the device resolved, grid and fanouts
        parsed, a GAT's heads and attention dropout resolved to what the model uses, so the
        checkpoints and the saved model record the same values whether a default was
        spelled out or left out), then check the checkpoint folder against the run's
        identity."""
        check_args(args)
        values = {name: getattr(args, name) for name in SECTION_OF
                  if hasattr(args, name) and name != "grid_dims"}
        values.update(attention_settings(args))
        values["device"] = str(pick_device(args.device))
        if args.mode == "minibatch":  # every rank resolves them alike
            values["macrobatch"], values["prefetch"] = pipeline_depth(
                args.macrobatch, args.prefetch, args.sampler_workers,
                host_samples=args.sample_on == "host" or values["device"] == "cpu")
        values["model_args"] = tuple(model_args_dict(args.model_args).items())
        if args.fanouts is not None:
            values["fanouts"] = parse_fanouts(args.fanouts)
        spec = cls.of(**values)
        check_checkpoint_folder(spec)  # last: it reads the folder, against the run's identity
        return spec

    def evolve(self, **flags) -> "RunSpec":
        """A new spec with ``flags`` changed (flag names, routed to their sections: the
        launcher's world-size decisions). ``grid_dims`` follows ``grid``."""
        return dataclasses.replace(self, **{
            name: dataclasses.replace(getattr(self, name), **values)
            for name, values in _by_section(flags).items()})

    def grid_shape(self, world: int) -> Dict[str, int]:
        """The named process grid ``algo`` runs on with ``world`` ranks (checked)."""
        par = self.parallel
        shape = algorithm(par.algo).grid(world, par.grid_dims, par.replication or 1)
        ranks = int(np.prod(list(shape.values())))
        if ranks != world:
            raise InputError(f"--grid {par.grid} gives {ranks} ranks but the world size is "
                             f"{world}")
        return shape

    def settings(self) -> SimpleNamespace:
        """Every field as one namespace of flag names, for code that takes parsed flags: the
        ``settings`` the algorithms' options (``Algorithm.options``) and the cost model
        (:func:`gnnpar.cli.plan_cli.plan`) read as they read gnnpar-plan's flags
        (``kernels/`` knows flags, not this module's sections), and the output-path checks
        that gnnpar-predict shares with gnnpar-train."""
        return SimpleNamespace(**{f.name: getattr(getattr(self, s), f.name)
                                  for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)})

    @property
    def minibatch(self) -> bool:
        return self.batch.mode == "minibatch"

    @property
    def distributed(self) -> bool:
        """Whether the run needs ranks (a distributed algorithm, or mini batch on several)."""
        return self.parallel.algo != "serial" or (self.minibatch
                                                  and (self.parallel.nprocs or 1) > 1)


def _by_section(flags: dict) -> Dict[str, dict]:
    """Flag name -> value, as section name -> its flags' values (TypeError naming any name
    that is no flag). ``grid_dims`` is derived here from ``grid``, never given."""
    unknown = sorted(set(flags) - set(SECTION_OF) | set(flags) & {"grid_dims"})
    if unknown:
        raise TypeError(f"RunSpec has no flag {', '.join(unknown)}")
    out: Dict[str, dict] = {}
    for name, value in flags.items():
        out.setdefault(SECTION_OF[name], {})[name] = value
    if "grid" in flags:
        out["parallel"]["grid_dims"] = parse_grid(flags["grid"]) if flags["grid"] else None
    return out


def pick_device(choice: str) -> torch.device:
    """``--device``: ``auto`` = cuda when torch sees a GPU."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but torch sees no CUDA device")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)
