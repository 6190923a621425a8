"""The placement policy: message passing over the group graph, then a softmax over devices per group.

numpy only, with hand-written backprop (checked against finite differences in the tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MASKED = -1e9
HINT_FASTEST_BASELINE = "fastest-baseline"


@dataclass
class GraphInput:
    """What the policy reads for one graph: features, mean-aggregation matrices, allowed devices."""

    x: np.ndarray  # (groups, features)
    pred: np.ndarray  # (groups, groups)
    succ: np.ndarray  # (groups, groups)
    allowed: np.ndarray  # (groups, devices) bool


@dataclass
class Policy:
    """h0 = relu(x W0 + b0); h(k+1) = h(k) + relu(h(k) Ws + P h(k) Wp + S h(k) Wn + b) for each round;
    logits = C tanh((h Wd + mean(h) Wg + bd) / C), masked to allowed devices. The tanh clipping (Bello et
    al., as in ColocRL) keeps every device's probability above exp(-2C)-ish, so training never freezes.
    ``hint`` says what the policy reads in the features' current-device columns: "" nothing (zeros),
    ``HINT_FASTEST_BASELINE`` the fastest baseline's placement of the graph (a policy reads what it was
    trained with, so the hint travels with it)."""

    params: dict[str, np.ndarray] = field(default_factory=dict)
    rounds: int = 2
    clip: float = 3.0
    hint: str = ""

    @classmethod
    def create(cls, features: int, devices: int, hidden: int = 32, rounds: int = 2, seed: int = 0,
               clip: float = 3.0, hint: str = "") -> Policy:
        """A freshly initialised policy (He-style scale, zero readout so the first placements are uniform)."""
        rng = np.random.default_rng(seed)
        p = {"W0": rng.normal(0, np.sqrt(2 / features), (features, hidden)), "b0": np.zeros(hidden)}
        for k in range(rounds):
            for name in ("Ws", "Wp", "Wn"):
                p[f"{name}{k}"] = rng.normal(0, np.sqrt(1 / (3 * hidden)), (hidden, hidden))
            p[f"b{k + 1}"] = np.zeros(hidden)
        p["Wd"] = np.zeros((hidden, devices))
        p["Wg"] = np.zeros((hidden, devices))
        p["bd"] = np.zeros(devices)
        return cls(p, rounds, clip, hint)

    @property
    def devices(self) -> int:
        """Number of devices the policy chooses among."""
        return self.params["bd"].shape[0]

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
        raw = h @ p["Wd"] + pooled @ p["Wg"] + p["bd"]
        squashed = np.tanh((raw if bias is None else raw + bias) / self.clip)
        logits = np.where(inp.allowed, self.clip * squashed, MASKED)
        cache["squashed"] = squashed
        logits = logits - logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        cache["pooled"] = pooled
        return logp, cache

    def backward(self, inp: GraphInput, cache: dict, dlogits: np.ndarray) -> dict[str, np.ndarray]:
        """Gradients of the parameters given d(loss)/d(logits) (masked entries must be 0); the
        gradient of ``forward``'s ``bias`` is under the key "bias"."""
        p = self.params
        grads: dict[str, np.ndarray] = {}
        h = cache["h"][-1]
        g = h.shape[0]
        dlogits = dlogits * (1 - cache["squashed"] ** 2)
        grads["bias"] = dlogits
        grads["Wd"] = h.T @ dlogits
        grads["bd"] = dlogits.sum(axis=0)
        dsum = dlogits.sum(axis=0)
        grads["Wg"] = np.outer(cache["pooled"], dsum)
        dh = dlogits @ p["Wd"].T + (p["Wg"] @ dsum) / g
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
                 hint=np.array(self.hint), **self.params)

    def copy(self) -> Policy:
        """An independent copy (training updates parameters in place)."""
        return Policy({k: v.copy() for k, v in self.params.items()}, self.rounds, self.clip, self.hint)

    @classmethod
    def load(cls, path: str) -> tuple[Policy, dict]:
        """Read a policy written by ``save``; returns it with its metadata."""
        import json

        with np.load(path, allow_pickle=False) as data:
            params = {k: data[k] for k in data.files if k not in ("rounds", "clip", "meta", "hint")}
            hint = str(data["hint"]) if "hint" in data.files else ""  # files written before hints read nothing
            return cls(params, int(data["rounds"]), float(data["clip"]), hint), json.loads(str(data["meta"]))


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
