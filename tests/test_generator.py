"""The TASO-style rule generator: enumeration, fingerprints, pruning, emitted rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from xflow.generator import generate
from xflow.generator.enumerate import BY_OP, INPUTS
from xflow.generator.fingerprint import Buckets, Entry, candidate_pairs, canonical_text, evaluate, match_outputs
from xflow.generator.run import balanced_parts, format_table
from xflow.generator.walk import WalkStats, enumerate_graphs

from xflow.ir import Attrs
from xflow.ops import OPS
from xflow.rules import parse_rule

IDX = {name: i for i, (name, _, _, _) in enumerate(INPUTS)}
N = len(INPUTS)


def _attrs(op: str, **kw) -> Attrs:
    return OPS[op].normalize_attrs(kw)


@pytest.fixture(scope="module")
def two() -> dict:
    # Its time and memory are measured in benchmarks/resource_bounds.py (a loaded machine is no failure).
    return {"result": generate(max_ops=2, seed=0)}


@pytest.fixture(scope="module")
def pairs_two():
    raw, pairs = candidate_pairs(Buckets().extend(enumerate_graphs(2, seed=0)))
    texts = {(canonical_text(p.a), canonical_text(p.b)) for p in pairs}
    return raw, texts


def test_max_ops_two_prunes_step_by_step(two):
    steps = [s for s, _, _ in two["result"].table]
    assert steps[0] == "graphs enumerated" and steps[-2:] == ["rules emitted (both directions)",
                                                             "after generalized dedupe"]
    counts = [c for _, c, _ in two["result"].table[1:-2]]
    assert counts == sorted(counts, reverse=True)  # each pruning step only removes
    emitted, deduped = (c for _, c, _ in two["result"].table[-2:])
    assert counts[-1] <= emitted <= 2 * counts[-1] and deduped == len(two["result"].rules) <= emitted
    assert "graphs enumerated" in format_table(two["result"].table)


def test_known_identities_are_candidates(pairs_two):
    _, texts = pairs_two
    joined = "\n".join(f"{a} => {b}" for a, b in texts)
    # split(concat(x1, x2)) gives back x1 and x2
    split = "split[axis=0,split=(4, 4)](concat[axis=0](x1,x2))"
    assert f"{split}#0 ; {split}#1 => x1 ; x2" in joined
    # enlarge leaves a SAME conv unchanged
    assert ("conv[act=none,group=1,pads=(1, 1, 1, 1),strides=(1, 1)](i1,enlarge[size=(3, 3)](k13)) => "
            "conv[act=none,group=1,pads=(0, 1, 0, 1),strides=(1, 1)](i1,k13)") in joined
    # conv with Cpool is avgpool
    assert any(a.startswith("conv[act=none,group=4,pads=(0, 0, 0, 0),strides=(1, 1)](i1,const_pool")
               and b.startswith("avgpool[count_include_pad=1,kernel=(3, 3),pads=(0, 0, 0, 0),strides=(1, 1)](i1)")
               for a, b in texts)
    # conv(relu) folds
    assert any(a.startswith("relu[](conv[act=none") and b.startswith("conv[act=relu") for a, b in texts)


def test_commutativity_is_not_a_candidate(pairs_two):
    _, texts = pairs_two
    assert not any(a == b for a, b in texts)
    assert not any(a in ("add[](x1,x2)", "add[](x2,x1)") and b in ("add[](x1,x2)", "add[](x2,x1)") for a, b in texts)


def test_an_op_constant_on_equal_inputs_is_never_applied_to_one_tensor_twice(pairs_two):
    """sub(x, x) is zero whatever x is: a graph computing it would pair with every other zero of its shape
    (42% of the proved <= 3-op rules held one, and none could help a model). add(x, x) is 2x and stays."""
    marked = {e.name for e in OPS.values() if e.constant_on_equal_inputs}
    assert {"sub", "div"} <= marked and "add" not in marked
    graphs = [v.graph for v in enumerate_graphs(2, seed=0)]
    assert not any(op in marked and operands[0] == operands[1] for g in graphs for op, _, operands in g)
    assert any(op == "add" and operands[0] == operands[1] for g in graphs for op, _, operands in g)
    _, texts = pairs_two
    assert not any("sub[](x1,x1)" in a or "sub[](x1,x1)" in b for a, b in texts)


def _entry(graph) -> Entry:
    values = evaluate(graph, [np.zeros(s) for _, _, _, s in INPUTS], integer=False)
    produced = set(range(N, len(values)))
    consumed = {t for _, _, ins in graph for t in ins}
    from xflow.generator.enumerate import IntEvaluator, tensor_fp
    ints = evaluate(graph, IntEvaluator(0).inputs, integer=True)
    outs = tuple(sorted(produced - consumed))
    return Entry(graph, outs, tuple(tensor_fp(ints[t]) for t in outs), frozenset(t for t in consumed if t < N))


def test_fingerprint_tells_relu_of_sum_from_sum_of_relus():
    x1, x2 = IDX["x1"], IDX["x2"]
    add, relu = _attrs("add"), _attrs("relu")
    relu_of_sum = _entry((("add", add, (x1, x2)), ("relu", relu, (N,))))
    sum_of_relus = _entry((("relu", relu, (x1,)), ("relu", relu, (x2,)), ("add", add, (N, N + 1))))
    assert match_outputs(relu_of_sum, sum_of_relus) is None
    # while a true identity matches: relu(concat(a, b)) == concat(relu(a), relu(b))
    cat = _attrs("concat", axis=0)
    lhs = _entry((("concat", cat, (x1, x2)), ("relu", relu, (N,))))
    rhs = _entry((("relu", relu, (x1,)), ("relu", relu, (x2,)), ("concat", cat, (N, N + 1))))
    assert match_outputs(lhs, rhs) is not None


def test_deterministic_and_every_rule_parses(two):
    rules = two["result"].rules
    assert rules
    again = generate(max_ops=2, seed=0).rules
    assert again == rules
    names = [r["name"] for r in rules]
    assert len(set(names)) == len(names)
    for raw in rules:
        rule = parse_rule(raw)
        assert rule.provenance["generator"]["max_ops"] == 2
        assert raw["name"].startswith("g2_")


def test_no_candidate_carries_the_same_variant_twice(two):
    """A pair with nothing to generalize gives one rule as "ranks pinned" and as "literal attributes": the
    verifier would check it twice and split the candidate's z3 budget with its own copy."""
    import json

    rules = two["result"].rules
    assert any(len(r["variants"]) > 1 for r in rules)
    for r in rules:
        texts = [json.dumps(v, sort_keys=True) for v in r["variants"]]
        assert len(set(texts)) == len(texts), r["name"]


def test_rules_generalize_shared_attributes(two):
    rules = two["result"].rules
    assert any(n.get("attrs", {}).get("strides") == "?cs" for r in rules for n in r["src"] if n["op"] == "conv")
    assert any(n.get("attrs", {}).get("axis") == "?axis" for r in rules for n in r["src"])


def test_jobs_give_the_same_rules():
    one = generate(max_ops=1, seed=3)
    two = generate(max_ops=1, seed=3, jobs=2)
    assert two.rules == one.rules
    assert [c for _, c, _ in two.table] == [c for _, c, _ in one.table]


def test_keep_last_yields_exactly_the_kept_widest_graphs():
    """The 4-op run's pruning: widest graphs whose fingerprint is not kept are counted, never built."""
    first = BY_OP["transpose"][0].key  # transpose first: a walk small enough for a test

    def walk(**kw):
        return list(enumerate_graphs(3, seed=0, first_ops=lambda k: k == first, **kw))

    plain = [v for v in walk() if len(v.graph) == 3]
    kept_fps = {v.fingerprint for v in plain[::3]}
    stats = WalkStats()
    filtered = [v for v in walk(stats=stats, keep_last=kept_fps.__contains__) if len(v.graph) == 3]
    assert sorted(v.code for v in filtered) == sorted(v.code for v in plain if v.fingerprint in kept_fps)
    assert 0 < len(filtered) < len(plain)
    assert stats.not_kept == len(plain) - len(filtered)


@pytest.fixture(scope="module")
def wide_two():
    import xflow.generator.run as run

    saved = run.WIDE_FROM
    run.WIDE_FROM = 2
    try:
        return generate(max_ops=2, seed=0)
    finally:
        run.WIDE_FROM = saved


def test_wide_run_pairs_the_widest_graphs_with_smaller_ones(wide_two, two):
    """The run used from 4 ops on, tried at 2: only pairs with a 2-op side and a smaller graph in the bucket,
    each a rule the full run also finds (up to which rule represents a generalized key)."""
    steps = [s for s, _, _ in wide_two.table]
    assert steps[:3] == ["graphs of <= 1 ops enumerated", "graphs of 2 ops walked (with smaller ones)",
                         "  kept: a smaller graph has the fingerprint"]
    walked, kept = (c for _, c, _ in wide_two.table[1:3])
    full_graphs = two["result"].table[0][1]
    # fewer than the full run's: the last op is not even evaluated where it cannot make a kept graph
    assert 0 < kept < walked <= full_graphs and kept < full_graphs // 10
    docs = {r["doc"] for r in wide_two.rules}
    # concat(split(x1)) -> x1: a 2-op graph and a graph of no op
    assert "concat[axis=0](split[axis=0,split=(2, 2)](x1)#0,split[axis=0,split=(2, 2)](x1)#1) -> x1" in docs
    full_fps = {r["provenance"]["fingerprint"] for r in two["result"].rules}
    assert {r["provenance"]["fingerprint"] for r in wide_two.rules} <= full_fps
    assert len(wide_two.rules) < len(two["result"].rules)


def test_common_subgraph_of_any_shape_prunes_a_smaller_identity_in_context():
    """split(concat(a, b)) == a ; b around two unchanged convs (outputs 1x4x3x3, not an input shape) is the
    2-op identity in a context: pruned, as the 4-op run showed it must be (it matched every pair of convs)."""
    from xflow.generator.enumerate import APPLICATIONS, resolve
    from xflow.generator.fingerprint import Pair
    from xflow.generator.prune import CommonSubgraph

    app = next(a for a in APPLICATIONS if a.op == "conv" and a.params == {
        "strides": (2, 2), "padding": "valid", "act": "none", "group": "1"})
    conv = resolve("conv", app.params, ((1, 4, 7, 7), (4, 4, 3, 3)))
    cat = resolve("concat", {"axis": 1}, ((1, 4, 3, 3), (1, 4, 3, 3)))
    split = resolve("split", {"axis": 1}, ((1, 8, 3, 3),))
    convs = (("conv", conv, (IDX["i1"], IDX["k33"])), ("conv", conv, (IDX["i2"], IDX["k33b"])))
    plain = _entry(convs)
    around = _entry((*convs, ("concat", cat, (N, N + 1)), ("split", split, (N + 2,))))
    assert match_outputs(around, plain) is not None
    assert CommonSubgraph(0).reason(Pair(around, plain, 0)) == "common"


def test_a_walk_part_gives_the_same_graphs_after_other_parts_filled_the_fingerprint_cache():
    """A worker keeps the last op's fingerprint cache from one walk part to the next: a part walked after another
    (the cache full of the other's entries, some of them hits) yields the same graphs as on a fresh cache."""
    from xflow.generator.enumerate import FingerprintCache, output_multisets
    from xflow.generator.fingerprint import pack

    small = pack([v for v in enumerate_graphs(2, seed=0) if v.inputs_used])
    kept_fps = set(small[0].tolist())
    multisets = output_multisets(small[2])

    def walk(first: int, cache: FingerprintCache) -> list:
        return list(enumerate_graphs(3, seed=0, first_ops=lambda k: k == first, keep_last=kept_fps.__contains__,
                                     kept_multisets=multisets, last_fingerprints=cache))

    neg, relu = BY_OP["neg"][0].key, BY_OP["relu"][0].key
    shared, fresh = FingerprintCache.of(20), FingerprintCache.of(20)
    walk(neg, shared)
    filled = np.count_nonzero(shared.tags)
    after = walk(relu, shared)
    assert after == walk(relu, fresh)
    assert len([v for v in after if len(v.graph) == 3]) > 10
    # after the first part, the second computed and stored fewer fingerprints: it found some of the first's
    assert 0 < np.count_nonzero(shared.tags) - filled < np.count_nonzero(fresh.tags)


def test_graphs_with_a_part_fewer_ops_compute_are_not_walked():
    """TASO's pruning while enumerating: a widest graph holding a part that fewer ops compute (a smaller rule
    rewrites it into a graph of fewer ops) is left out without being built; every other one is kept."""
    from xflow.generator.enumerate import output_multisets
    from xflow.generator.fingerprint import fps_of, int_values, pack
    from xflow.generator.run import fewest_ops

    first = BY_OP["neg"][0].key  # neg(neg(x)) is x

    def walk(**kw):
        return [v for v in enumerate_graphs(3, seed=0, first_ops=lambda k: k == first, **kw) if len(v.graph) == 3]

    small = pack([v for v in enumerate_graphs(2, seed=0) if v.inputs_used])
    tensors, counts = fewest_ops(*small)
    fewer = dict(zip(tensors.tolist(), counts.tolist(), strict=True))
    kept_fps = set(small[0].tolist())
    plain = walk(keep_last=kept_fps.__contains__)
    stats = WalkStats()
    pruned = walk(keep_last=kept_fps.__contains__, fewer_ops=fewer, stats=stats,
                  kept_multisets=output_multisets(small[2]))
    left_out = {v.code for v in plain} - {v.code for v in pruned}
    assert {v.code for v in pruned} <= {v.code for v in plain} and left_out and stats.reducible > 0
    for v in plain:
        if v.code not in left_out:
            continue
        # the first op's output (a part of one op) equals an input, or the first two ops' output is one op's
        fps = fps_of(int_values(v.graph, 0))
        assert any(fewer.get(f, 9) < 2 for f in fps[N:N + 2]), v.graph
    # a prefix output that no kept graph of several outputs has must be read by the last op: an exact pre-filter
    several = small[2][small[2][:, 1] != 0]
    narrow_stats = WalkStats()
    narrowed = walk(keep_last=kept_fps.__contains__, fewer_ops=fewer, stats=narrow_stats,
                    multi_output_tensors=set(several[several != 0].tolist()))
    assert sorted(v.code for v in narrowed) == sorted(v.code for v in pruned)
    assert narrow_stats.applications < stats.applications


def test_graphs_with_a_part_as_many_ops_compute_in_a_smaller_canonical_graph_are_not_walked():
    """The pruning extended to parts of as many ops: a widest graph holding a part whose tensor the canonical graph
    (the smallest code of as many ops) computes, and that is not that graph, is left out: the smaller rule between
    the two parts and the graph holding the canonical one give its rules. Only such graphs are left out, and
    matmul's associativity (two orders of two matmuls) leaves some out."""
    from xflow.generator.fingerprint import fps_of, int_values, pack
    from xflow.generator.run import fewest_ops, first_codes

    firsts = {a.key for a in BY_OP["matmul"]}

    def walk(**kw):
        return [v for v in enumerate_graphs(3, seed=0, first_ops=firsts.__contains__, **kw) if len(v.graph) == 3]

    small = pack([v for v in enumerate_graphs(2, seed=0) if v.inputs_used])
    tensors, counts = fewest_ops(*small, most=1)
    canonical = first_codes(*small, most=2)
    kw = {"keep_last": set(small[0].tolist()).__contains__,
          "fewer_ops": dict(zip(tensors.tolist(), counts.tolist(), strict=True))}
    before, after = walk(**kw), walk(**kw, first_codes=canonical)
    left_out = {v.code for v in before} - {v.code for v in after}
    assert {v.code for v in after} <= {v.code for v in before} and len(left_out) > 10
    assert any(v.graph[1][0] == "matmul" and N in v.graph[1][2] for v in before if v.code in left_out)
    for v in before:
        if v.code not in left_out:
            continue
        # an op below the last one, with the first op when it reads its output, is a part (the last op reads no
        # other value of it) computing its tensor in a graph of its own that is not the canonical one
        fps = fps_of(int_values(v.graph, 0))
        reducible = []
        for j in (0, 1):
            if OPS[v.graph[j][0]].num_outputs(v.graph[j][1]) != 1 or OPS[v.graph[0][0]].num_outputs(v.graph[0][1]) != 1:
                continue
            cone = [0, 1] if j == 1 and N in v.graph[1][2] else [j]
            twin = canonical.code_of(fps[N + j], len(cone))
            inner_read = any(N + i in v.graph[2][2] for i in cone if i != j)
            if twin is not None and not inner_read and twin < b"".join(v.code[3 * i:3 * i + 3] for i in cone):
                reducible.append(j)
        assert reducible, v.graph


def test_a_widest_graph_whose_last_op_ends_a_part_fewer_ops_compute_beside_other_outputs_is_left_out():
    """A graph of several outputs whose last op, with its ancestors, computes its output alone (nothing else reads
    their values) is that part beside the rest, sharing inputs only: when fewer ops compute the part's output, the
    graph with the smaller part has the same outputs and fewer ops, so the walk leaves the graph out."""
    from xflow.generator.fingerprint import fps_of, int_values, pack
    from xflow.generator.run import fewest_ops

    firsts = {a.key for a in BY_OP["neg"]} | {a.key for a in BY_OP["relu"]}

    def walk(**kw):
        return [v for v in enumerate_graphs(3, seed=0, first_ops=firsts.__contains__, **kw) if len(v.graph) == 3]

    small = pack([v for v in enumerate_graphs(2, seed=0) if v.inputs_used])
    tensors, counts = fewest_ops(*small, most=1)
    fewer = dict(zip(tensors.tolist(), counts.tolist(), strict=True))
    keep = set(small[0].tolist()).__contains__

    def reducible_at_last(v) -> bool:
        *rest, (op, attrs, operands) = v.graph
        if len(v.outputs) < 2 or OPS[op].num_outputs(attrs) != 1:
            return False
        cone, todo = set(), [t for t in operands if t >= N]
        starts = list(itertools.accumulate([N] + [OPS[o].num_outputs(a) for o, a, _ in rest]))
        while todo:
            t = todo.pop()
            j = max(i for i, s in enumerate(starts[:-1]) if s <= t)
            if j not in cone:
                cone.add(j)
                todo += [t for t in rest[j][2] if t >= N]
        inner = {t for j in cone for t in range(starts[j], starts[j + 1])}
        read_outside = any(t in inner for j, (_, _, ins) in enumerate(rest) if j not in cone for t in ins)
        if read_outside or not inner <= {t for j in cone for t in rest[j][2]} | set(operands):
            return False
        return fewer.get(fps_of(int_values(v.graph, 0))[-1], 9) < len(cone) + 1

    plain = [v for v in walk(keep_last=keep) if reducible_at_last(v)]
    pruned = walk(keep_last=keep, fewer_ops=fewer)
    assert len(plain) > 10 and not any(reducible_at_last(v) for v in pruned)


def test_split_sizes_never_name_the_split_tensor_itself():
    """A 2-way split's pieces are each smaller than the tensor split, so a size expression over the split
    tensor's own dim (``(dim(x1, -1), dim(x1, -1))`` for a split of x1) can never be instantiated: it is not
    offered, while the other inputs' dims and a concat's pieces still are."""
    from xflow.generator.generalize import Tensor, _size_choices

    inputs = [Tensor("x1", 2), Tensor("x2", 2), Tensor("x3", 2)]
    found = {"x1": (4, 4), "x2": (4, 2), "x3": (4, 2)}
    choices = _size_choices([("x1", "x2", -1), ("x2", "x3", -1)], inputs, 2, -1, {}, "x1", found, (2, 2))
    assert choices and not any("x1" in c for c in choices)
    assert "(dim(x2, -1), dim(x3, -1))" in choices and "(dim(x2, -1), dim(x2, -1))" in choices


def test_split_sizes_are_only_those_giving_the_found_split():
    """A size expression that does not give the split's own sizes on the shapes the pair was found on (here x3 is
    3 wide, so x2 and x3 do not make the (2, 2) split of a 4-wide x1) makes a variant no instance near those
    shapes satisfies: it is not offered. Nor is a source split variable of other sizes there (a source split of a
    conv's 8 channels into (4, 4) reused for the (2, 2) split of its 4-channel input: the variant can never be
    instantiated, and the generalized dedupe kept it in place of a good one)."""
    from xflow.generator.generalize import Tensor, _size_choices

    inputs = [Tensor("x1", 2), Tensor("x2", 2), Tensor("x3", 2)]
    found = {"x1": (4, 4), "x2": (4, 2), "x3": (4, 3)}
    choices = _size_choices([], inputs, 2, -1, {"sz0": (2, 2), "sz1": (4, 4)}, "x1", found, (2, 2))
    assert choices == ["sz0", "(dim(x2, -1), dim(x2, -1))"]


def test_memoized_evaluation_gives_every_tensor_the_plain_evaluation_does():
    """The pairing's checks evaluate through a memo keyed by canonical text (shared subexpressions computed
    once); a wrong hit would pair or prune the wrong graphs. A small limit makes the memo start over too."""
    from xflow.generator.enumerate import IntEvaluator
    from xflow.generator.fingerprint import FloatChecker, MemoEvaluator, expressions

    graphs = [v.graph for v in enumerate_graphs(2, seed=0)][::29]
    for inputs, integer in ((IntEvaluator(0).inputs, True), (FloatChecker(0).inputs, False)):
        memo = MemoEvaluator(inputs, integer=integer, limit=50)
        for graph in graphs * 2:  # the second pass reads the memo
            found = memo.values(graph)
            assert found is not None
            values, texts = found
            assert texts == expressions(graph)
            plain = evaluate(graph, inputs, integer=integer)
            assert len(values) == len(plain)
            assert all(np.array_equal(a, b, equal_nan=not integer) for a, b in zip(values, plain, strict=True))


def test_memoized_evaluation_with_a_subterm_replaced_gives_the_plain_evaluation():
    """The common-subgraph test evaluates a graph with a subterm replaced by a fresh tensor: the memo serves the ops
    that read nothing replaced, computes the rest, and keeps none of them (a wrong hit, or a replaced value kept
    under its usual text, would prune the wrong pairs)."""
    from xflow.generator.enumerate import IntEvaluator
    from xflow.generator.fingerprint import N_IN, MemoEvaluator, expressions

    inputs = IntEvaluator(0).inputs
    memo, plain = MemoEvaluator(inputs, integer=True), MemoEvaluator(inputs, integer=True, limit=0)
    rng = np.random.default_rng(5)
    graphs = [v.graph for v in enumerate_graphs(2, seed=0) if len(v.graph) == 2][::37]
    replaced = 0
    for graph in graphs:
        memo.values(graph)  # the memo holds every tensor of the graph
        values, texts = plain.values(graph)  # type: ignore[misc]
        for t in range(N_IN, len(texts)):
            fresh = rng.integers(-9, 9, size=values[t].shape)
            found, _ = memo.values(graph, override={texts[t]: fresh})  # type: ignore[misc]
            expected, _ = plain.values(graph, override={texts[t]: fresh})  # type: ignore[misc]
            assert all(np.array_equal(a, b) for a, b in zip(found, expected, strict=True))
            replaced += any(not np.array_equal(a, b) for a, b in zip(found, values, strict=True))
        again, _ = memo.values(graph)  # type: ignore[misc]
        assert all(np.array_equal(a, b) for a, b in zip(again, values, strict=True)) and texts == expressions(graph)
    assert len(graphs) > 20 and replaced > 20


def test_rules_emitted_in_chunks_are_those_one_dedupe_of_every_rule_keeps():
    """An emission chunk does not pack the rules a more general rule before them in the chunk dominates. With the
    rule names made unique first (the reverse of a pair can be another pair's rule: the later one is not emitted),
    the dedupe of the chunks' rules keeps what the dedupe of every rule, the first of each name, keeps, however
    the pairs are cut into chunks."""
    from xflow.generator.fingerprint import Pair, has_ops, unpack_pair
    from xflow.generator.generalize import canonical_key, dedupe
    from xflow.generator.packed import unpack
    from xflow.generator.run import _emissions, _emit, _pair_and_check
    from xflow.generator.to_rules import pair_to_rule, rule_variables

    _, kept = _pair_and_check((0, False, Buckets(0).extend(enumerate_graphs(2, 0)).colliding_arrays(), 0))
    by_key: dict = {}
    for keys, p in kept:
        by_key.setdefault(keys[0], (keys, p))
    keyed = [by_key[k] for k in sorted(by_key)]
    (forward, backward), (fp, code_a, fps_a, code_b, fps_b) = next(k for k in keyed if has_ops(k[1][3]))
    keyed.insert(len(keyed) // 2, ((backward, forward), (fp, code_b, fps_b, code_a, fps_a)))  # a pair's reverse
    names: set[str] = set()
    every = []
    for (f, b), packed in keyed:
        p = unpack_pair(packed)
        variables = rule_variables(p, 0)
        for rule in [pair_to_rule(p, 0, 2, variables, f)] + (
                [pair_to_rule(Pair(p.b, p.a, p.fingerprint), 0, 2, variables, b)] if p.b.graph else []):
            if rule["name"] not in names:
                names.add(rule["name"])
                every.append(rule)
    expected = dedupe(every, key=lambda r: canonical_key(r["variants"][0]))
    emissions = _emissions(keyed, 2)
    assert len(emissions) == len(keyed) - 1 and sum(f + b for _, _, f, b in emissions) == len(every)
    for size in (1, 7, len(emissions)):
        rules = [r for i in range(0, len(emissions), size) for r in _emit((0, 2, emissions[i:i + size]))]
        found = dedupe(rules, key=lambda r: r.key, slots=lambda r: r.consts, name=lambda r: r.name)
        assert [unpack(r.blob) for r in found] == expected
        if size > 1:
            assert len(rules) < len(every)  # rules left out before they are packed


def test_checked_evaluation_has_no_values_where_a_shape_rule_rejects_the_operands():
    from xflow.generator.enumerate import IntEvaluator
    from xflow.generator.fingerprint import MemoEvaluator

    memo = MemoEvaluator(IntEvaluator(0).inputs, integer=True, check_shapes=True)
    assert memo.values((("matmul", Attrs(), (IDX["x1"], IDX["i1"])),)) is None  # (4, 4) @ (1, 4, 7, 7)
    assert memo.values((("matmul", Attrs(), (IDX["x1"], IDX["w1"])),)) is not None


def test_renaming_keys_of_a_pair_and_of_its_reverse():
    from xflow.generator.fingerprint import Pair
    from xflow.generator.prune import renaming_key, renaming_keys

    _, pairs = candidate_pairs(Buckets().extend(enumerate_graphs(2, seed=0)))
    for p in pairs[::50]:
        forward, backward = renaming_keys(p)
        assert forward == renaming_key(p)
        assert backward == renaming_key(Pair(p.b, p.a, p.fingerprint))


def test_the_common_subgraph_test_draws_the_same_fresh_tensor_whatever_came_before():
    """The fresh tensor that replaces a common subterm depends on the seed and the subterm alone: drawn from one
    generator per part, it depended on the pairs checked before in that part, so the ≤ 3-op candidates changed
    with --jobs (the number of parts)."""
    from xflow.generator.fingerprint import N_IN, Buckets, candidate_pairs, expressions
    from xflow.generator.prune import CommonSubgraph
    from xflow.generator.walk import enumerate_graphs

    pairs = candidate_pairs(Buckets(0).extend(enumerate_graphs(2, 0)))[1]
    with_common = [p for p in pairs if set(expressions(p.a.graph)[N_IN:]) & set(expressions(p.b.graph)[N_IN:])]
    drawn: list[list[bytes]] = []

    class Recording(CommonSubgraph):
        def __init__(self) -> None:
            super().__init__(0)
            values = self.evaluator.values

            def recorded(graph, override=None):
                if override:
                    drawn[-1].extend(v.tobytes() for v in override.values())
                return values(graph, override)

            self.evaluator.values = recorded  # type: ignore[method-assign]

    target = next(p for p in with_common if CommonSubgraph(0).reason(p) in (None, "common"))
    reasons, targets = [], []
    for before in ([], with_common[:50]):
        checker = Recording()
        drawn.append([])  # the draws of the pairs checked before
        for p in before:
            checker.reason(p)
        drawn.append([])
        reasons.append(checker.reason(target))
        targets.append(drawn[-1])
    assert targets[0] and targets[0] == targets[1]
    assert reasons[0] == reasons[1]


def test_the_last_op_tried_on_arrays_keeps_the_same_graphs_in_the_same_order(monkeypatch):
    """``kept_multisets`` tries the last op on the operand tuples of many prefixes at once (array operations, a
    multiset hash of the outputs, a cache of fingerprints) and builds a kept graph without applying its last op;
    the graphs it yields (every field), their order and the walk's counts are those of the walk that tries them one
    by one (the widest ones come in batches, after smaller ones the other walk yields between them), a last op of
    two outputs (split) included, with a cache of 8 slots (entries overwritten all the time) and with batches of a
    single prefix or a few."""
    import xflow.generator.walk as walk_module
    from xflow.generator.enumerate import output_multisets
    from xflow.generator.fingerprint import pack
    from xflow.generator.run import fewest_ops

    small = pack([v for v in enumerate_graphs(2, seed=0) if v.inputs_used])
    tensors, counts = fewest_ops(*small)
    several = small[2][small[2][:, 1] != 0]
    kept_fps = set(small[0].tolist())
    filters = {"keep_last": kept_fps.__contains__,
               "fewer_ops": dict(zip(tensors.tolist(), counts.tolist(), strict=True)),
               "multi_output_tensors": set(several[several != 0].tolist())}
    firsts = {BY_OP["neg"][0].key, BY_OP["split"][0].key}

    def walk(**kw):
        stats = WalkStats()
        visits = list(enumerate_graphs(3, seed=0, first_ops=firsts.__contains__, stats=stats, **filters, **kw))
        return visits, stats

    def by_size(visits: list) -> tuple[list, list]:
        return [v for v in visits if len(v.graph) == 3], [v for v in visits if len(v.graph) < 3]

    one_by_one, stats = walk()
    at_once, array_stats = walk(kept_multisets=output_multisets(small[2]))
    assert by_size(at_once) == by_size(one_by_one) and array_stats == stats
    monkeypatch.setattr(walk_module, "LAST_CACHE_BITS", 3)
    for rows in (1, 200):  # a prefix at a time, a few at a time
        monkeypatch.setattr(walk_module, "LAST_BATCH_ROWS", rows)
        visits, batch_stats = walk(kept_multisets=output_multisets(small[2]))
        assert by_size(visits) == by_size(one_by_one) and batch_stats == stats
    widest = [v.code for v in at_once if len(v.graph) == 3]
    split_last = {a.key for a in BY_OP["split"]}
    assert len(widest) > 100 and any(code[6] in split_last for code in widest)
    assert stats.not_kept > 10 * len(widest)


def test_the_widest_walk_deals_its_first_ops_into_parts_of_equal_weight_heaviest_first():
    """Each first op in exactly one part, the parts about equally heavy and handed out heaviest first: dealt
    by key modulo the part count, two conv-first walks fell in each of the last parts started."""
    weights = [50, 1, 1, 30, 30, 2, 0, 8, 8, 20]
    parts = balanced_parts(weights, 4)
    assert sorted(k for p in parts for k in p) == list(range(len(weights)))
    loads = [sum(weights[k] for k in p) for p in parts]
    assert loads == sorted(loads, reverse=True) == [50, 36, 32, 32]
    assert parts[0] == {0}
    assert balanced_parts([3, 2, 1], 8) == [{0}, {1}, {2}]
    assert sum(len(p) for p in balanced_parts([1] * 56, 16)) == 56


def test_a_tensor_fingerprint_depends_on_its_values_and_shape_not_its_layout():
    """The walk hashes contiguous tensors in place: a strided view, its copy and (for a 0-d tensor) its
    one-element vector give the same fingerprint; another shape of the same bytes does not."""
    from xflow.generator.enumerate import tensor_fp

    a = np.arange(24, dtype=np.int64).reshape(4, 6)
    assert tensor_fp(a[:, ::2]) == tensor_fp(np.ascontiguousarray(a[:, ::2]))
    assert tensor_fp(a.T) == tensor_fp(a.T.copy()) != tensor_fp(a.reshape(6, 4))
    assert tensor_fp(np.array(7)) == tensor_fp(np.array([7]))


def test_colliding_rows_come_sorted_by_fingerprint_from_every_chunk():
    """The rows whose fingerprint another row shares, from the workers' chunks and the graphs added one by one,
    sorted by (fingerprint, code): the same rows as joining everything, sorting it and dropping the singletons."""
    visits = [v for v in enumerate_graphs(1, seed=0) if v.inputs_used][:300]
    rng = np.random.default_rng(3)
    chunks = []
    for size in (50, 0, 120, 7):
        fps = rng.integers(0, 40, size).astype(np.uint64)
        if size == 7:  # rows sharing a fingerprint with graphs added one by one
            fps = np.array([v.fingerprint for v in visits[:7]], dtype=np.uint64)
        chunks.append((fps, rng.integers(0, 256, (size, 12), dtype=np.uint8),
                       rng.integers(0, 2**62, (size, 8)).astype(np.uint64)))
    buckets = Buckets(0)
    for arrays in chunks:
        buckets.add_arrays(arrays, len(arrays[0]))
    buckets.extend(visits)
    got = buckets.colliding_arrays()
    fps, codes, outs = (np.concatenate(a) for a in zip(*chunks, Buckets(0).extend(visits).arrays(), strict=True))
    order = np.lexsort((*codes.T[::-1], fps))
    fps, codes, outs = fps[order], codes[order], outs[order]
    counts = dict(zip(*np.unique(fps, return_counts=True), strict=True))
    shared = np.array([counts[f] > 1 for f in fps.tolist()], dtype=bool)
    assert shared.any() and not shared.all() and set(fps[shared].tolist()) & {v.fingerprint for v in visits[:7]}
    np.testing.assert_array_equal(got.fps, fps[shared])
    np.testing.assert_array_equal(got.codes, codes[shared])
    np.testing.assert_array_equal(got.outs, outs[shared])


def test_fingerprint_arrays_answer_membership_as_python_sets_do():
    """The widest walk's workers hold the kept fingerprints and multiset hashes as sorted arrays
    (``SortedFingerprints``, ``MultisetFilter``): every membership answer is a set's, over the whole 64-bit range."""
    from xflow.generator.enumerate import MultisetFilter, SortedFingerprints

    rng = np.random.default_rng(5)
    kept = np.unique(rng.integers(0, 2**64 - 1, 5_000, dtype=np.uint64, endpoint=True))
    as_set = set(kept.tolist())
    probes = np.concatenate([kept[::3], rng.integers(0, 2**64 - 1, 5_000, dtype=np.uint64, endpoint=True),
                             np.array([0, 2**63, 2**64 - 1], dtype=np.uint64)])
    sorted_fps = SortedFingerprints(kept)
    assert [p in sorted_fps for p in probes.tolist()] == [p in as_set for p in probes.tolist()]
    assert -1 not in sorted_fps and 2**64 not in sorted_fps and "x" not in sorted_fps
    assert sorted_fps.members(probes).tolist() == [p in as_set for p in probes.tolist()]
    members = MultisetFilter.of(kept).members(probes)
    assert members.tolist() == [i for i, p in enumerate(probes.tolist()) if p in as_set]
    assert len(members) >= len(kept[::3])
    assert MultisetFilter.of(np.zeros(0, np.uint64)).members(probes).tolist() == []


def test_a_kept_pair_travels_as_codes_and_decodes_to_itself():
    from xflow.generator.fingerprint import Pair, pack_pair, unpack_pair

    _, pairs = candidate_pairs(Buckets().extend(enumerate_graphs(2, seed=0)))
    for p in pairs[::40]:
        assert unpack_pair(pack_pair(p)) == p
    built = Entry(pairs[0].a.graph, pairs[0].a.outputs, pairs[0].a.output_fps, pairs[0].a.inputs_used)
    with pytest.raises(ValueError):
        pack_pair(Pair(built, pairs[0].b, pairs[0].fingerprint))


def test_renaming_keys_are_the_minimum_over_every_renaming_of_the_families():
    """Renamings that differ only on unused inputs are tried once: the keys are those of all renamings."""
    from itertools import permutations, product

    from xflow.generator.fingerprint import Pair
    from xflow.generator.prune import _FAMILIES, _text, renaming_keys

    names = [n for n, _, _, _ in INPUTS]
    families = [m for m in _FAMILIES.values() if len(m) > 1]
    every = []
    for perms in product(*(permutations(m) for m in families)):
        mapping = {n: n for n in names}
        for members, perm in zip(families, perms, strict=True):
            mapping.update(zip(members, perm, strict=True))
        every.append(tuple(mapping[n] for n in names))
    _, pairs = candidate_pairs(Buckets().extend(enumerate_graphs(2, seed=0)))
    for p in pairs[::60]:
        texts = [(_text(p.a, n), _text(p.b, n)) for n in every]
        assert renaming_keys(p) == (min(texts), min((b, a) for a, b in texts))
        assert renaming_keys(Pair(p.b, p.a, p.fingerprint))[0] == min((b, a) for a, b in texts)


def test_fewest_ops_keeps_only_the_tensors_of_small_graphs_when_asked():
    from xflow.generator.fingerprint import pack
    from xflow.generator.run import fewest_ops

    small = pack([v for v in enumerate_graphs(2, seed=0) if v.inputs_used])
    tensors, counts = fewest_ops(*small)
    few_tensors, few_counts = fewest_ops(*small, most=1)
    assert set(counts.tolist()) == {0, 1, 2} and set(few_counts.tolist()) == {0, 1}  # 0: an input itself
    assert dict(zip(few_tensors.tolist(), few_counts.tolist(), strict=True)) == {
        t: c for t, c in zip(tensors.tolist(), counts.tolist(), strict=True) if c <= 1}


def test_a_finished_walk_and_its_memos_are_freed_without_the_cyclic_collector():
    """The walk's memos are fields of a ``GraphWalk`` nothing refers back to: once its graphs are read and the walk
    dropped, it is freed at once, with the collector paused as the generator's workers pause it (a cycle would keep
    millions of memo entries alive until a collection traverses them)."""
    import gc
    import weakref

    from xflow.generator.walk import GraphWalk

    paused = gc.isenabled()
    gc.disable()
    try:
        walk = GraphWalk(2, 0, lambda k: k < 3, WalkStats(), None, None, None, None, None, None)
        visits = list(walk.visits())
        assert walk.evaluated and walk.tuple_cache and walk.stats.graphs == len([v for v in visits if v.graph])
        freed = weakref.ref(walk)
        del walk
        assert freed() is None
    finally:
        if paused:
            gc.enable()
