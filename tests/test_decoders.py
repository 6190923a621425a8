"""Decode-step decoders with a KV cache (``xflow.zoo.decoder``): they run at decode and prefill sizes, the cache
means what it says, and the old default sizes (every dim not first in an input = 128) fail as issue #60 says."""

import numpy as np
import pytest

from xflow.ort import open_session
from xflow.zoo.decoder import decoder_feeds, gpt2_decoder, llama_decoder

BUILDERS = {"llama": llama_decoder, "gpt2": gpt2_decoder}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def decoder(request):
    model = BUILDERS[request.param]()
    return request.param, model, open_session(model.SerializeToString(), "cpu", 1)


@pytest.mark.parametrize(("batch", "seq", "past"), [(1, 1, 127), (1, 8, 0), (4, 1, 127), (4, 8, 0)])
def test_runs_at_decode_and_prefill_sizes(decoder, batch, seq, past):
    _, model, session = decoder
    logits, *presents = session.run(None, decoder_feeds(model, batch, seq, past))
    assert logits.shape == (batch, seq, 96) and np.isfinite(logits).all()
    assert all(p.shape[0] == batch and p.shape[2] == past + seq for p in presents)


def test_a_decode_step_continues_the_prefill(decoder):
    """Prefill 8 tokens, then decode the 9th over the cache: the logits of a 9-token prefill's last position."""
    _, model, session = decoder
    full = decoder_feeds(model, 2, 9, 0, seed=3)
    first = {**full, "input_ids": full["input_ids"][:, :8], "attention_mask": full["attention_mask"][:, :8]}
    _, *presents = session.run(None, first)
    step = {"input_ids": full["input_ids"][:, 8:], "attention_mask": full["attention_mask"]}
    names = [o.name for o in session.get_outputs()][1:]
    step.update({name.replace("present", "past"): value for name, value in zip(names, presents, strict=True)})
    np.testing.assert_allclose(session.run(None, step)[0][:, 0], session.run(None, full)[0][:, 8], atol=1e-4)


def test_the_old_default_sizes_fail_as_the_issue_says(decoder):
    name, model, session = decoder
    feeds = decoder_feeds(model, 1, 128, 128)
    feeds["attention_mask"] = feeds["attention_mask"][:, :128]  # total_seq = 128, not past + seq
    expected = "indices element out of data bounds, idx=128" if name == "llama" else "broadcast"
    with pytest.raises(Exception, match=expected):
        session.run(None, feeds)
