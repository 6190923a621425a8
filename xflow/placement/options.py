"""Settings of one placement run, apart from the command line that fills them."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from xflow.errors import XflowError
from xflow.placement.policy import DECODER_SCHEDULE, Policy
from xflow.placement.simulator import SimParams
from xflow.placement.train import TrainOptions

TRANSFER_STEPS = 600  # about 90 s for four zoo models on one core of a shared 2-core machine
#: Interleaved rounds in which ``xflow place`` times its plan against the fastest baseline (``--confirm``).
CONFIRM_ROUNDS = 10


@dataclass
class PlaceOptions:
    """Settings of one placement run. ``env`` is "sim" or "real". ``time_limit`` (s) bounds the whole
    planning (baselines, training, improvement; 0 = no limit: ``train.steps`` ends training and the
    improvement pass ends when it converges); the improvement pass gets ``improve_share`` of it, at most
    ``improve_sweeps`` passes per descent (0 = no improvement pass). ``policy`` places zero-shot (no
    training): its most likely placement and ``zero_shot_samples`` sampled at ``zero_shot_temperature``
    (0: the policy's own), the fastest in the environment kept. ``transfer_steps``: how long
    ``train_across`` trains (no time limit). ``runs``: timed runs per placement with the real executor.
    With ``warm_start`` the policy first imitates the fastest baseline's placement, then trains by
    REINFORCE: it searches from where the heuristics end rather than from uniform random placements. With
    ``fine_tune`` a given ``policy`` is trained further on the graph within the time limit
    (``fine_tune_options``) instead of placing zero-shot: it starts from the fastest of its own placements
    (the most likely one and ``zero_shot_samples`` sampled) and the baselines'; it spends
    ``fine_tune_improve_share`` of the time limit (not ``improve_share``) on the improvement pass, and that pass
    gives the fastest start ``fine_tune_focus`` of its time (the transferred policy's placement starts far ahead
    of the heuristics', and a long descent from it gains more than more REINFORCE steps or short descents from
    every start: docs/lab-notes/2026-11-25-placement-finetune.md).
    ``transfer_hint``: what a policy trained by ``train_across`` reads besides the graph ("" nothing,
    ``HINT_FASTEST_BASELINE`` the fastest baseline's placement; see ``Policy.hint``); ``transfer_decoder``:
    how it draws a placement (``DECODER_SCHEDULE`` group by group reading the partial schedule, the default;
    "" every group independently, the policies written before; see ``Policy.decoder``). ``confirm_rounds`` > 0,
    planning in the simulator on a topology this machine runs: the plan is timed for real against the fastest
    baseline over that many interleaved rounds and the faster kept (the simulator's few per cent can be a loss)."""

    env: str = "sim"
    train: TrainOptions = field(default_factory=TrainOptions)
    max_groups: int = 128
    time_limit: float = 60.0
    improve_share: float = 0.35
    improve_sweeps: int = 16
    fine_tune_improve_share: float = 0.65
    fine_tune_focus: float = 0.7
    sim_params: SimParams = field(default_factory=SimParams)
    policy: Policy | None = None
    zero_shot_samples: int = 1024
    zero_shot_temperature: float = 0.0  # 0: the policy's own (``learn.zero_shot_temperature``)
    transfer_steps: int = TRANSFER_STEPS
    runs: int = 10
    warm_start: bool = True
    fine_tune: bool = False
    transfer_hint: str = ""
    transfer_decoder: str = DECODER_SCHEDULE
    confirm_rounds: int = 0


def flag(help_text: str, name: str = "", choices: tuple[str, ...] = (), switch: str = "", metavar: str = "") -> dict:
    """Field metadata saying how a ``PlaceSettings`` field appears on the command line: its help text,
    its flag name when not ``--field-name``, its choices, ``--x/--no-x`` for a boolean ``switch``, and the
    ``metavar`` its help shows for the value."""
    return {"help": help_text, "flag": name, "choices": choices, "switch": switch, "metavar": metavar}


@dataclass(frozen=True)
class PlaceSettings:
    """What a user chooses for one ``xflow place`` run, as typed on the command line (the command adds
    its files: the model, topology, cost model and outputs). ``options`` turns them into ``PlaceOptions``,
    reading the calibration and policy files they name."""

    env: str = field(default="sim", metadata=flag(
        "Plan in the simulator or by running placements for real (executor).", choices=("sim", "real")))
    steps: int | None = field(default=None, metadata=flag(
        "REINFORCE steps (batches). Training on IN.onnx: at most this many (default 100000; --time-limit "
        "usually ends it first). With --train-on: exactly this many, no time limit, so a seed gives the same "
        f"policy anywhere (default {TRANSFER_STEPS})."))
    samples: int = field(default=16, metadata=flag("Placements sampled per step."))
    time_limit: float = field(default=PlaceOptions.time_limit, metadata=flag(
        "Planning time limit (s) on IN.onnx: baselines, training and the improvement pass together (not "
        "--train-on; node costs are measured before it). 0 = none."))
    max_groups: int = field(default=PlaceOptions.max_groups, metadata=flag("Cap on co-location groups."))
    improve: bool = field(default=True, metadata=flag(
        "Placeto-style iterative improvement from every candidate (RL's and each baseline's).",
        switch="--improve/--no-improve"))
    warm_start: bool = field(default=True, metadata=flag(
        "Start RL by imitating the fastest baseline's placement (then REINFORCE), or from a fresh policy.",
        switch="--warm-start/--fresh-start"))
    confirm: bool = field(default=False, metadata=flag(
        "On a topology this machine runs (cpu; cpu+cuda where CUDA works), planning in the simulator: time the "
        "plan against the fastest baseline for real (10 interleaved rounds, after --time-limit) and keep the "
        "faster.", switch="--confirm/--trust-simulator"))
    calibration: str | None = field(default=None, metadata=flag(
        "Simulator parameters from `xflow place-calibrate --out`.", metavar="FILE"))
    policy: str | None = field(default=None, metadata=flag(
        "Place IN.onnx zero-shot with this trained policy (.npz; no training).", metavar="FILE"))
    fine_tune: bool = field(default=False, metadata=flag(
        "With --policy: train it further on IN.onnx within --time-limit (from the faster of its own placement "
        "and the fastest baseline's; 35% of the limit training, then the improvement pass, mostly from the "
        "fastest start), or place zero-shot.", switch="--fine-tune/--zero-shot"))
    zero_shot_samples: int = field(default=1024, metadata=flag(
        "Zero-shot: placements sampled from the policy (plus its most likely one); the fastest in the "
        "simulator is kept. No gradient step on IN.onnx."))
    seed: int = field(default=0, metadata=flag("Seed of the policy, sampling and improvement kicks."))

    def options(self, devices: int, topology_name: str) -> PlaceOptions:
        """The run's ``PlaceOptions`` for a topology of ``devices`` devices; XflowError naming the file when
        the calibration or policy file is missing, malformed, or the policy is for another device count."""
        from xflow.placement.calibrate import read_calibration

        for name, value in (("samples", self.samples), ("max-groups", self.max_groups),
                            ("zero-shot-samples", self.zero_shot_samples), ("steps", self.steps or 1)):
            if value < 1:
                raise XflowError(None, f"--{name} must be at least 1 (got {value})")
        if not math.isfinite(self.time_limit) or self.time_limit < 0:
            raise XflowError(None, f"--time-limit must be a finite number of seconds >= 0 (got {self.time_limit})")
        policy = _read_policy(self.policy, devices, topology_name) if self.policy else None
        return PlaceOptions(
            env=self.env, max_groups=self.max_groups, time_limit=self.time_limit, warm_start=self.warm_start,
            improve_sweeps=PlaceOptions.improve_sweeps if self.improve else 0,
            confirm_rounds=CONFIRM_ROUNDS if self.confirm else 0,
            sim_params=read_calibration(self.calibration) if self.calibration else SimParams(),
            policy=policy, fine_tune=self.fine_tune, zero_shot_samples=self.zero_shot_samples,
            transfer_steps=self.steps or TRANSFER_STEPS,
            train=TrainOptions(steps=self.steps or TrainOptions.steps, samples=self.samples,
                               time_limit=self.time_limit, seed=self.seed))


def _read_policy(path: str, devices: int, topology_name: str) -> Policy:
    if not os.path.exists(path):
        raise XflowError(path, "no such policy file")
    try:
        policy, _ = Policy.load(path)
    except Exception as exc:  # numpy raises many types for a file that is not its .npz
        raise XflowError(path, f"malformed policy file: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    if policy.devices != devices:
        raise XflowError(path, f"policy was trained for {policy.devices} devices; {topology_name} has {devices}")
    return policy
