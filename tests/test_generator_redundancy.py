"""TASO's redundancy pruning: a rule made of smaller rules is dropped, a new one is kept."""

from __future__ import annotations

from xflow.generator.redundancy import drop_compositions, find_compositions

T = "transpose[perm=(1, 0)]"


def rule(name: str, doc: str) -> dict:
    return {"name": name, "doc": doc}


# matmul of transposes is the transpose of the swapped matmul (5 ops in all), a double transpose is the
# identity (2 ops); together they make "transpose of a matmul of transposes is the swapped matmul" (5 ops).
TRANSPOSE_MATMUL = rule("a_tm", f"matmul[]({T}(x1),{T}(x2)) -> {T}(matmul[](x2,x1))")
DOUBLE_TRANSPOSE = rule("b_tt", f"{T}({T}(x1)) -> x1")
COMPOSED = rule("c_composed", f"{T}(matmul[]({T}(x1),{T}(x2))) -> matmul[](x2,x1)")
NEW = rule("d_new", "relu[](relu[](i1)) -> relu[](i1)")


def test_a_composition_of_earlier_rules_is_dropped_and_a_new_rule_kept():
    kept, dropped = drop_compositions([TRANSPOSE_MATMUL, DOUBLE_TRANSPOSE, COMPOSED, NEW])
    assert [r["name"] for r in kept] == ["a_tm", "b_tt", "d_new"]
    assert [r["name"] for r in dropped] == ["c_composed"]
    path = find_compositions([TRANSPOSE_MATMUL, DOUBLE_TRANSPOSE, COMPOSED]).dropped["c_composed"]
    assert path == [f"{T}({T}(matmul[](x2,x1)))", "matmul[](x2,x1)"]


def test_only_smaller_rules_compose():
    # without the double transpose the composed rule is new; a rule never uses itself or a later one
    kept, dropped = drop_compositions([TRANSPOSE_MATMUL, COMPOSED])
    assert dropped == [] and len(kept) == 2
    reversed_order = [rule("z_tm", TRANSPOSE_MATMUL["doc"]), DOUBLE_TRANSPOSE, COMPOSED]
    assert find_compositions(reversed_order).dropped == {}  # same size, later name: not smaller


def test_a_variable_binds_only_a_subterm_of_its_shape_and_kind():
    # matmul associativity stated on weights (w: constants) cannot rewrite activations (x), nor images (i:
    # another shape); an instance of it on weights is dropped
    def assoc(name: str, a: str, b: str, c: str) -> dict:
        return rule(name, f"matmul[](matmul[]({a},{b}),{c}) -> matmul[]({a},matmul[]({b},{c}))")

    rules = [assoc("a_w", "w1", "w2", "w3"), assoc("b_x", "x1", "x2", "x3"), assoc("c_i", "i1", "i1", "i2"),
             assoc("d_w", "w1", "w1", "w2")]
    kept, dropped = drop_compositions(rules)
    assert [r["name"] for r in kept] == ["a_w", "b_x", "c_i"]
    assert [r["name"] for r in dropped] == ["d_w"]


def test_a_match_whose_inner_value_is_read_elsewhere_is_refused():
    # relu(x1) is an inner value of the earlier rule's match; the composed rule also outputs it
    fold = rule("a_fold", "relu[](relu[](x1)) -> relu[](x1)")
    shared = rule("b_shared", "relu[](relu[](x1)) ; relu[](x1) -> relu[](x1) ; relu[](x1)")
    plain = rule("c_plain", "add[](relu[](relu[](x1)),x2) -> add[](relu[](x1),x2)")
    report = find_compositions([fold, shared, plain])
    assert "b_shared" not in report.dropped
    assert "c_plain" in report.dropped


def test_lifted_rules_are_neither_tested_nor_used():
    lifted = rule("a_lift", "bias-lifted: conv[act=none,group=1,pads=(0, 0, 0, 0),strides=(1, 1)](i1,k11) -> x1")
    report = find_compositions([lifted, NEW])
    assert report.untested == ["a_lift"] and report.dropped == {}


def test_the_rule_file_step_leaves_compositions_out_unless_kept():
    from xflow.generator.pipeline import split_compositions

    rules = [TRANSPOSE_MATMUL, DOUBLE_TRANSPOSE, COMPOSED, NEW]
    kept, composed = split_compositions(rules, keep=False)
    assert [r["name"] for r in composed] == ["c_composed"] and len(kept) == 3
    assert split_compositions(rules, keep=True) == (rules, [])


def test_parts_on_workers_give_the_same_report():
    """With an executor of two jobs the rules are tested in two parts on its workers: the same report."""
    from xflow.tasks import make_task_executor

    rules = [TRANSPOSE_MATMUL, DOUBLE_TRANSPOSE, COMPOSED, NEW, rule("e_lift", "bias-lifted: relu[](i1) -> i1")]
    executor = make_task_executor("local", 2)
    try:
        assert find_compositions(rules, executor=executor) == find_compositions(rules)
        assert find_compositions(rules, executor=executor).dropped == {"c_composed": [
            f"{T}({T}(matmul[](x2,x1)))", "matmul[](x2,x1)"]}
    finally:
        executor.close()


def test_the_index_offers_the_rules_of_a_subterm_s_argument_heads_in_either_order_of_a_commutative_op():
    from xflow.generator.redundancy import RuleIndex, parse_side, term_rule

    rules = [term_rule(rule(name, doc)) for name, doc in [
        ("a_relu_first", "add[](relu[](x1),x2) -> add[](x2,relu[](x1))"),
        ("b_any", "add[](x1,x2) -> add[](x2,x1)"),
        ("c_neg_first", "add[](neg[](x1),x2) -> sub[](x2,x1)"),
        ("d_matmul", "matmul[](relu[](x1),x2) -> matmul[](relu[](x1),x2)")]]
    index = RuleIndex(rules)
    subject = parse_side("add[](x2,relu[](x1))")[0]
    assert [r.name for r in index.candidates(subject)] == ["a_relu_first", "b_any"]
    # not commutative: the argument heads must come in the pattern's order
    assert [r.name for r in index.candidates(parse_side("matmul[](x2,relu[](x1))")[0])] == []
    assert [r.name for r in index.candidates(parse_side("matmul[](relu[](x1),x2)")[0])] == ["d_matmul"]


def test_a_reversible_last_step_is_met_backwards_from_the_goal_single_and_multi_output():
    fold = rule("a_fold", "relu[](relu[](x1)) -> relu[](x1)")
    three = rule("b_three", "relu[](relu[](relu[](x1))) -> relu[](x1)")
    assert find_compositions([fold, three]).dropped == {"b_three": ["relu[](relu[](x1))", "relu[](x1)"]}
    # the last step is a two-output rule, the first a single-output one; no smaller rule does it otherwise
    deep = rule("a_deep", "relu[](relu[](relu[](x1))) -> relu[](relu[](x1))")
    pair = rule("b_pair", "relu[](relu[](x1)) ; relu[](relu[](x2)) -> relu[](x1) ; relu[](x2)")
    both = rule("c_both", "relu[](relu[](relu[](x1))) ; relu[](relu[](x2)) -> relu[](x1) ; relu[](x2)")
    assert find_compositions([deep, pair, both]).dropped == {
        "c_both": ["relu[](relu[](x1)) ; relu[](relu[](x2))", "relu[](x1) ; relu[](x2)"]}
    assert find_compositions([deep, both]).dropped == {}


def test_a_step_found_backwards_counts_only_if_it_is_a_forward_rewrite():
    from xflow.generator.redundancy import parse_side, step_reaches, term_rule

    fold = term_rule(rule("a_fold", "relu[](relu[](x1)) -> relu[](x1)"))
    assert step_reaches(fold, parse_side("add[](relu[](relu[](x1)),x2)"), "add[](relu[](x1),x2)")
    # relu(x1) inside the match is also an output: the search's matcher refuses the match
    assert not step_reaches(fold, parse_side("relu[](relu[](x1)) ; relu[](x1)"), "relu[](x1) ; relu[](x1)")


def test_meeting_the_goal_finds_what_trying_every_rule_forwards_finds():
    """On the ≤ 2-op candidates (unverified: only their shapes matter here) the last step taken backwards from the
    goal drops the same rules as two forward levels."""
    from xflow.generator.redundancy import MAX_STATES, CompositionIndexes, _side_text, composition, term_rule
    from xflow.generator.run import generate

    terms = sorted((t for t in map(term_rule, generate(max_ops=2).rules) if t is not None), key=lambda r: r.order)
    indexes = CompositionIndexes.of(terms)

    def forwards(r):  # breadth first, every earlier rule at every level
        goal, frontier, seen = _side_text(r.rhs), {_side_text(r.lhs): r.lhs}, {_side_text(r.lhs)}
        for _ in range(2):
            nxt = {}
            for state in frontier.values():
                for new in indexes.forward.rewrites(state, r.order):
                    if _side_text(new) == goal:
                        return True
                    if _side_text(new) not in seen and len(nxt) < MAX_STATES:
                        seen.add(_side_text(new))
                        nxt[_side_text(new)] = new
            frontier = nxt
        return False

    sample = terms[::3]
    met = [composition(r, indexes) is not None for r in sample]
    assert met == [forwards(r) for r in sample]
    assert sum(met) > 100  # over a hundred compositions among them: not an agreement on "none"


def test_rules_of_one_side_share_its_steps_and_get_the_same_paths():
    """On the ≤ 2-op candidates the first level of a left side and the last step into a right side, computed once for
    all the rules sharing the side (``SideCache``), give every rule the path it gets alone; the cache keeps a side
    only until its last rule is tested; the report does not depend on how the rules are cut into parts."""
    from xflow.generator.redundancy import (
        CompositionIndexes,
        SideCache,
        _side_text,
        composition,
        find_compositions,
        term_rule,
    )
    from xflow.generator.run import generate

    from xflow.tasks import LocalTaskExecutor

    candidates = generate(max_ops=2).rules
    terms = [t for t in map(term_rule, candidates) if t is not None]
    indexes = CompositionIndexes.of(terms)
    cache = SideCache.of(terms)
    shared = sum(n - 1 for n in cache.uses.values())
    assert shared > 500  # rules that read a side another rule computed: not a cache that is never hit

    def text(path):
        return None if path is None else [_side_text(s) for s in path]

    alone = [text(composition(r, indexes)) for r in terms]
    by_name = {}
    for r in sorted(terms, key=lambda r: _side_text(r.lhs)):
        by_name[r.name] = text(composition(r, indexes, cache=cache))
        cache.release(r)
    assert [by_name[r.name] for r in terms] == alone
    assert sum(p is not None for p in alone) > 300
    assert not cache.uses and not cache.steps  # every side read by its last rule and let go
    one = find_compositions(candidates)
    two = find_compositions(candidates, executor=LocalTaskExecutor(2))
    assert (one.kept, one.dropped) == (two.kept, two.dropped)
