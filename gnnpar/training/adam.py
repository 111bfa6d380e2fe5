"""Adam for parameters on the CPU: torch's fused kernel without torch's optimiser class.

``torch.optim.Adam`` imports ``torch._dynamo`` on its first ``add_param_group`` and on every
``step()`` (``torch/optim/optimizer.py``: ``_use_grad_for_differentiable`` and the
``torch._disable_dynamo`` wrappers), nearly two seconds of CPU in every process that trains,
though nothing here compiles. :class:`FusedAdam` calls the same kernel as
``torch.optim.Adam(fused=True)`` does (``torch._fused_adam_``, after the same step-count
increment), on state laid out as torch's, so its updates are torch's bit for bit and its
``state_dict`` is interchangeable with torch's Adam's (a checkpoint written by either loads in
the other). Only what the trainers use is there: one parameter group, no AMSGrad, no
``maximize``, L2 weight decay (Adam's, not AdamW's), no gradient scaler.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

import torch

#: a torch Adam group's settings that this optimiser holds fixed, with their values
FIXED = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
         "differentiable": False, "fused": True, "decoupled_weight_decay": False}


class FusedAdam:
    """Adam (Kingma & Ba) over ``params`` on the CPU with torch's fused kernel (module
    docstring); ``param_groups``, ``state``, ``zero_grad``, ``step``, ``state_dict`` and
    ``load_state_dict`` as ``torch.optim.Adam``'s."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3,
                 weight_decay: float = 0.0, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        params = list(params)
        for p in params:
            if p.device.type != "cpu" or p.dtype != torch.float32:
                raise ValueError(f"FusedAdam takes float32 CPU parameters, got {p.dtype} on "
                                 f"{p.device}")
        self.param_groups: List[dict] = [dict(params=params, lr=lr, betas=tuple(betas),
                                              eps=eps, weight_decay=weight_decay, **FIXED)]
        self.state: Dict[torch.Tensor, dict] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update of every parameter that has a gradient (as torch's: a parameter's
        state is made on its first update)."""
        group = self.param_groups[0]
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Adam does not support sparse gradients")
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=group["lr"],
                           beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                           eps=group["eps"], amsgrad=False, maximize=False, grad_scale=None,
                           found_inf=None)

    def state_dict(self) -> dict:
        """torch's layout: each parameter's state under its index, the group's settings with
        ``params`` as indices (the tensors themselves, not copies, as torch's)."""
        group = self.param_groups[0]
        index = {id(p): i for i, p in enumerate(group["params"])}
        saved = {k: v for k, v in group.items() if k != "params"}
        saved["params"] = list(range(len(group["params"])))
        return {"state": {index[id(p)]: dict(s) for p, s in self.state.items()},
                "param_groups": [saved]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the state and the settings (learning rate, betas, eps, weight decay) of a
        ``state_dict`` of this class or of ``torch.optim.Adam`` (one group, as the trainers
        make); refuses one whose update this class does not compute (non-fused, AMSGrad,
        ``maximize``, AdamW)."""
        groups = state_dict["param_groups"]
        params = self.param_groups[0]["params"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(params):
            raise ValueError("the optimizer state holds other parameter groups than this "
                             "model's")
        saved = groups[0]
        other = {k: saved.get(k, v) for k, v in FIXED.items() if saved.get(k, v) != v}
        if other:
            raise ValueError(f"the optimizer state was saved by an Adam with {other}; this "
                             "optimizer computes torch's fused Adam only")
        group = self.param_groups[0]
        for key in ("lr", "betas", "eps", "weight_decay"):
            group[key] = tuple(saved[key]) if key == "betas" else saved[key]
        self.state = {}
        for i, s in state_dict["state"].items():
            p = params[int(i)]
            self.state[p] = {
                "step": s["step"].to(dtype=torch.float32, device=p.device),
                "exp_avg": s["exp_avg"].to(dtype=p.dtype, device=p.device),
                "exp_avg_sq": s["exp_avg_sq"].to(dtype=p.dtype, device=p.device)}


def takes(device, dtype) -> bool:
    """Whether :class:`FusedAdam` updates a parameter of ``dtype`` on ``device``: float32 on
    the CPU. The one rule of the trainers' optimiser
    (:func:`gnnpar.training.trainer.make_optimizer`) and of what a rank imports for it
    (:func:`optimizer_imports_dynamo`)."""
    return torch.device(device).type == "cpu" and dtype == torch.float32


def optimizer_imports_dynamo(device) -> bool:
    """Whether the trainers' optimiser for a model on ``device`` is torch's: their parameters
    are float32 (bf16 runs autocast, :mod:`gnnpar.nn.precision`), so it is :class:`FusedAdam`
    where :func:`takes` float32 on ``device``. ``torch.optim`` imports ``torch._dynamo``,
    which a rank must then import before it joins its process group
    (:func:`gnnpar.kernels.comm.import_dynamo_first`)."""
    return not takes(device, torch.float32)
