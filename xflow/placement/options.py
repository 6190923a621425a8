"""Settings of one placement run, apart from the command line that fills them."""

from __future__ import annotations

from dataclasses import dataclass, field

from xflow.placement.policy import Policy
from xflow.placement.simulator import SimParams
from xflow.placement.train import TrainOptions

TRANSFER_STEPS = 600  # about 90 s for four zoo models on one core of a shared 2-core machine


@dataclass
class PlaceOptions:
    """Settings of one placement run. ``env`` is "sim" or "real". ``time_limit`` (s) bounds the whole
    planning (baselines, training, improvement; 0 = no limit: ``train.steps`` ends training and the
    improvement pass ends when it converges); the improvement pass gets ``improve_share`` of it, at most
    ``improve_sweeps`` passes per descent (0 = no improvement pass). ``policy`` places zero-shot (no
    training): its most likely placement and ``zero_shot_samples`` sampled at ``zero_shot_temperature``,
    the fastest in the environment kept. ``transfer_steps``: how long ``train_across`` trains (no time
    limit). ``runs``: timed runs per placement with the real executor."""

    env: str = "sim"
    train: TrainOptions = field(default_factory=TrainOptions)
    max_groups: int = 128
    time_limit: float = 60.0
    improve_share: float = 0.35
    improve_sweeps: int = 16
    sim_params: SimParams = field(default_factory=SimParams)
    policy: Policy | None = None
    zero_shot_samples: int = 1024
    zero_shot_temperature: float = 0.3
    transfer_steps: int = TRANSFER_STEPS
    runs: int = 10
