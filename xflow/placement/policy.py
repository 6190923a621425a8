"""The placement policy: message passing over the group graph, then a softmax over devices per group.

numpy only, with hand-written backprop (checked against finite differences in the tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xflow.placement.features import DECODER_FEATURES, Schedule, decoder_features

MASKED = -1e9
HINT_FASTEST_BASELINE = "fastest-baseline"
DECODER_SCHEDULE = "schedule"


@dataclass
class GraphInput:
    """What the policy reads for one graph: features, mean-aggregation matrices, allowed devices."""

    x: np.ndarray  # (groups, features)
    pred: np.ndarray  # (groups, groups)
    succ: np.ndarray  # (groups, groups)
    allowed: np.ndarray  # (groups, devices) bool
    schedule: Schedule | None = None  # what the schedule decoder reads (Policy.decoder); None: not available


@dataclass
class Policy:
    """h0 = relu(x W0 + b0); h(k+1) = h(k) + relu(h(k) Ws + P h(k) Wp + S h(k) Wn + b) for each round;
    logits = C tanh((h Wd + mean(h) Wg + bd) / C), masked to allowed devices. The tanh clipping (Bello et
    al., as in ColocRL) keeps every device's probability above exp(-2C)-ish, so training never freezes.
    ``hint`` says what the policy reads in the features' current-device columns: "" nothing (zeros),
    ``HINT_FASTEST_BASELINE`` the fastest baseline's placement of the graph (a policy reads what it was
    trained with, so the hint travels with it).

    ``decoder`` says how a placement is drawn. "": every group independently from its row of ``forward``'s
    distribution (a per-graph policy: free per-group logits tell parallel branches apart). ``DECODER_SCHEDULE``:
    the groups one by one in topological order, each group's logits being ``F (v + h U)`` (plus the free
    per-group logits when fine-tuning), where F (devices x ``DECODER_FEATURES``) says what each device would
    do to the partial schedule of the groups already placed (how much later the group would finish there,
    wait for its inputs or for the device, how much of its input is there, the device's load:
    ``decoder_features``) and h is the group's embedding. No weight belongs to a device (no ``Wd``, ``Wg``,
    ``bd``; ``nd`` only records the device count): the same weights read every device and every graph, so
    what the policy learns about spreading parallel work carries to graphs of other sizes and shapes, and
    it cannot learn "device 3" from one graph and apply it to another (``decode``)."""

    params: dict[str, np.ndarray] = field(default_factory=dict)
    rounds: int = 2
    clip: float = 3.0
    hint: str = ""
    decoder: str = ""

    @classmethod
    def create(cls, features: int, devices: int, hidden: int = 32, rounds: int = 2, seed: int = 0,
               clip: float = 3.0, hint: str = "", decoder: str = "") -> Policy:
        """A freshly initialised policy (He-style scale, zero readout so the first placements are uniform)."""
        if decoder not in ("", DECODER_SCHEDULE):
            raise ValueError(f"unknown policy decoder {decoder!r}")
        rng = np.random.default_rng(seed)
        p = {"W0": rng.normal(0, np.sqrt(2 / features), (features, hidden)), "b0": np.zeros(hidden)}
        for k in range(rounds):
            for name in ("Ws", "Wp", "Wn"):
                p[f"{name}{k}"] = rng.normal(0, np.sqrt(1 / (3 * hidden)), (hidden, hidden))
            p[f"b{k + 1}"] = np.zeros(hidden)
        if decoder:  # device-equivariant: no weight belongs to one device (see the class)
            p["v"] = np.zeros(DECODER_FEATURES)
            p["U"] = np.zeros((hidden, DECODER_FEATURES))
            p["nd"] = np.zeros(devices)  # only the device count: ``devices`` reads it
        else:
            p["Wd"] = np.zeros((hidden, devices))
            p["Wg"] = np.zeros((hidden, devices))
            p["bd"] = np.zeros(devices)
        return cls(p, rounds, clip, hint, decoder)

    @property
    def devices(self) -> int:
        """Number of devices the policy chooses among."""
        return self.params["nd" if self.decoder else "bd"].shape[0]

    def forward(self, inp: GraphInput, bias: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """Log-probabilities (groups x devices) and the cache that ``backward`` needs. ``bias`` (groups x
        devices) is added before clipping: free per-graph logits that break the tie between groups
        with equal features (parallel branches), which a shared network alone cannot."""
        p = self.params
        z0 = inp.x @ p["W0"] + p["b0"]
        h = np.maximum(z0, 0)
        cache: dict = {"z0": z0, "h": [h], "z": []}
        for k in range(self.rounds):
            z = h @ p[f"Ws{k}"] + inp.pred @ h @ p[f"Wp{k}"] + inp.succ @ h @ p[f"Wn{k}"] + p[f"b{k + 1}"]
            h = h + np.maximum(z, 0)
            cache["z"].append(z)
            cache["h"].append(h)
        pooled = h.mean(axis=0)
        if self.decoder:  # the decoder's logits come from the partial schedule, device by device
            raw = np.zeros(inp.allowed.shape)
        else:
            raw = h @ p["Wd"] + pooled @ p["Wg"] + p["bd"]
        cache["raw"] = raw if bias is None else raw + bias
        squashed = np.tanh((raw if bias is None else raw + bias) / self.clip)
        logits = np.where(inp.allowed, self.clip * squashed, MASKED)
        cache["squashed"] = squashed
        logits = logits - logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        cache["pooled"] = pooled
        return logp, cache

    def decode(self, inp: GraphInput, samples: int, rng: np.random.Generator | None = None,
               bias: np.ndarray | None = None, temperature: float = 1.0, greedy: bool = False,
               actions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
        """Draw ``samples`` placements group by group with the schedule decoder (see the class): each group's
        device from its distribution sharpened by ``temperature`` (``greedy``: its most likely device;
        ``actions`` (samples x groups): these devices, teacher forcing). Returns the device choices
        (samples x groups), the log-probabilities each choice was made from at temperature 1 (samples x
        groups x devices) and the cache ``backward_decode`` needs. Needs ``inp.schedule``."""
        if inp.schedule is None:
            raise ValueError("the schedule decoder needs the graph's Schedule (GraphInput.schedule)")
        _, cache = self.forward(inp, bias)
        sched, p = inp.schedule, self.params
        groups, devices = inp.allowed.shape
        h = cache["h"][-1]
        weights = p["v"][None] + h @ p["U"]  # (groups, features)
        rows = np.arange(samples)
        placed = np.zeros((samples, groups), dtype=np.int64)
        finish = np.zeros((samples, groups))
        free = np.zeros((samples, devices))
        busy = np.zeros((samples, devices))
        feats = np.zeros((samples, groups, devices, DECODER_FEATURES))
        squashed = np.zeros((samples, groups, devices))
        logp = np.zeros((samples, groups, devices))
        for g in range(groups):
            ready = np.zeros((samples, devices))
            local = np.zeros((samples, devices))
            for q, seconds, nbytes in sched.preds[g]:
                ready = np.maximum(ready, finish[:, q, None] + seconds[placed[:, q]])
                np.add.at(local, (rows, placed[:, q]), nbytes)
            f = decoder_features(ready, free, busy, local, sched.time[g], inp.allowed[g], sched.scale)
            sq = np.tanh((cache["raw"][g][None] + f @ weights[g]) / self.clip)
            logits = np.where(inp.allowed[g][None], self.clip * sq, MASKED)
            logits = logits - logits.max(axis=1, keepdims=True)
            lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
            if actions is not None:
                choice = np.asarray(actions)[:, g]
            elif greedy:
                choice = lp.argmax(axis=1)
            else:
                scaled = np.exp((lp - lp.max(axis=1, keepdims=True)) / temperature) * inp.allowed[g][None]
                cdf = np.cumsum(scaled / scaled.sum(axis=1, keepdims=True), axis=1)
                choice = np.minimum((rng.random((samples, 1)) > cdf).sum(axis=1), devices - 1)
            end = np.maximum(ready, free)[rows, choice] + sched.time[g, choice]
            placed[:, g], finish[:, g] = choice, end
            free[rows, choice] = end
            busy[rows, choice] += sched.time[g, choice]
            feats[:, g], squashed[:, g], logp[:, g] = f, sq, lp
        cache.update(feats=feats, dsquashed=squashed)
        return placed, logp, cache

    def backward_decode(self, inp: GraphInput, cache: dict, dlogits: np.ndarray) -> dict[str, np.ndarray]:
        """Gradients of the parameters given d(loss)/d(logits) of every decoded sample (samples x groups x
        devices, masked entries 0); the gradient of the per-group ``bias`` is under "bias"."""
        p = self.params
        draw = dlogits * (1 - cache["dsquashed"] ** 2)  # (samples, groups, devices)
        per_group = np.einsum("sgd,sgdk->gk", draw, cache["feats"])
        grads = {"v": per_group.sum(axis=0), "U": cache["h"][-1].T @ per_group}
        return self._backward_raw(inp, cache, draw.sum(axis=0), per_group @ p["U"].T, grads)

    def backward(self, inp: GraphInput, cache: dict, dlogits: np.ndarray) -> dict[str, np.ndarray]:
        """Gradients of the parameters given d(loss)/d(logits) (masked entries must be 0); the
        gradient of ``forward``'s ``bias`` is under the key "bias"."""
        return self._backward_raw(inp, cache, dlogits * (1 - cache["squashed"] ** 2))

    def _backward_raw(self, inp: GraphInput, cache: dict, draw: np.ndarray,
                      dh_extra: np.ndarray | None = None, grads: dict | None = None) -> dict[str, np.ndarray]:
        """Gradients given d(loss)/d(raw logits before clipping) per group, and optionally more gradient on
        the last embedding ``dh_extra`` (the schedule decoder's)."""
        p = self.params
        grads = {} if grads is None else grads
        h = cache["h"][-1]
        g = h.shape[0]
        dlogits = draw
        grads["bias"] = dlogits
        if self.decoder:
            grads["nd"] = np.zeros_like(p["nd"])
            dh = dh_extra if dh_extra is not None else np.zeros_like(h)
        else:
            grads["Wd"] = h.T @ dlogits
            grads["bd"] = dlogits.sum(axis=0)
            dsum = dlogits.sum(axis=0)
            grads["Wg"] = np.outer(cache["pooled"], dsum)
            dh = dlogits @ p["Wd"].T + (p["Wg"] @ dsum) / g
            if dh_extra is not None:
                dh = dh + dh_extra
        for k in reversed(range(self.rounds)):
            h_prev = cache["h"][k]
            dz = dh * (cache["z"][k] > 0)
            grads[f"Ws{k}"] = h_prev.T @ dz
            grads[f"Wp{k}"] = (inp.pred @ h_prev).T @ dz
            grads[f"Wn{k}"] = (inp.succ @ h_prev).T @ dz
            grads[f"b{k + 1}"] = dz.sum(axis=0)
            dh = (dh + dz @ p[f"Ws{k}"].T + inp.pred.T @ (dz @ p[f"Wp{k}"].T)
                  + inp.succ.T @ (dz @ p[f"Wn{k}"].T))
        dz0 = dh * (cache["z0"] > 0)
        grads["W0"] = inp.x.T @ dz0
        grads["b0"] = dz0.sum(axis=0)
        return grads

    def save(self, path: str, meta: dict | None = None) -> None:
        """Write the parameters (and ``meta`` as JSON text) to an .npz file."""
        import json

        np.savez(path, rounds=np.array(self.rounds), clip=np.array(self.clip), meta=np.array(json.dumps(meta or {})),
                 hint=np.array(self.hint), decoder=np.array(self.decoder), **self.params)

    def copy(self) -> Policy:
        """An independent copy (training updates parameters in place)."""
        return Policy({k: v.copy() for k, v in self.params.items()}, self.rounds, self.clip, self.hint, self.decoder)

    @classmethod
    def load(cls, path: str) -> tuple[Policy, dict]:
        """Read a policy written by ``save``; returns it with its metadata."""
        import json

        with np.load(path, allow_pickle=False) as data:
            params = {k: data[k] for k in data.files if k not in ("rounds", "clip", "meta", "hint", "decoder")}
            hint = str(data["hint"]) if "hint" in data.files else ""  # files written before hints read nothing
            decoder = str(data["decoder"]) if "decoder" in data.files else ""  # nor before decoders
            return (cls(params, int(data["rounds"]), float(data["clip"]), hint, decoder),
                    json.loads(str(data["meta"])))


def policy_gradient(logp: np.ndarray, actions: np.ndarray, advantages: np.ndarray, allowed: np.ndarray,
                    entropy_weight: float) -> tuple[float, np.ndarray, float]:
    """REINFORCE loss ``-mean_s A_s sum_g log p(a_sg) - beta * sum_g H_g`` and its gradient with
    respect to the logits. ``actions`` is (samples, groups). Returns (loss, dlogits, mean entropy)."""
    probs = np.exp(logp) * allowed
    samples = actions.shape[0]
    rows = np.arange(logp.shape[0])
    counts = np.zeros_like(logp)
    for s in range(samples):
        np.add.at(counts, (rows, actions[s]), advantages[s])
    weight = advantages.sum()
    chosen = sum(advantages[s] * logp[rows, actions[s]].sum() for s in range(samples))
    safe = np.where(allowed, logp, 0.0)
    ent = -(probs * safe).sum(axis=1)
    loss = -chosen / samples - entropy_weight * ent.sum()
    dlogits = -(counts - weight * probs) / samples
    dlogits += entropy_weight * probs * (safe + ent[:, None])
    return float(loss), dlogits * allowed, float(ent.mean())
