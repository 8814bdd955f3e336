"""The causation tree without a database: each event under its cause, depth-first
in position order, other tenants' events redacted, trace ids from `traceparent`."""

from __future__ import annotations

from runyard.eventstore.trace import HIDDEN, TraceNode, build_tree, redact, trace_id_of, walk


def node(position: int, cause: str | None, tenant: str | None = "acme") -> TraceNode:
    return TraceNode(
        position=position,
        event_id=f"e{position}",
        stream_id=f"task-{tenant}" if tenant else "pool-p",
        version=1,
        type="T",
        occurred_at="2026-12-01T10:00:00+00:00",
        actor="service:scheduler",
        causation_id=cause,
        correlation_id="req-1",
        trace_id=None,
        tenant=tenant,
    )


def test_events_hang_under_their_cause_in_position_order() -> None:
    nodes = [node(4, "e1"), node(1, "req-1"), node(3, "e2"), node(2, "e1"), node(5, "other")]
    roots = build_tree(nodes)
    assert [r.event_id for r in roots] == ["e1", "e5"]
    flat = [(n.event_id, depth, p.event_id if p else None) for n, depth, p in walk(roots)]
    assert flat == [
        ("e1", 0, None),
        ("e2", 1, "e1"),
        ("e3", 2, "e2"),
        ("e4", 1, "e1"),
        ("e5", 0, None),
    ]


def test_a_deep_chain_is_walked_without_recursion() -> None:
    chain = [node(1, "req-1")] + [node(n, f"e{n - 1}") for n in range(2, 3001)]
    [root] = build_tree(chain)
    assert max(depth for _, depth, _ in walk([root])) == 2999
    assert "children" not in root.as_json(0, None)  # no nesting in the answer
    assert "e2999" not in repr(root)  # nor in its repr


def test_other_tenants_events_keep_their_place_but_not_their_identity() -> None:
    roots = build_tree([node(1, "fault-1", tenant=None), node(2, "e1"), node(3, "e1", "other")])
    redact(roots, lambda tenant: tenant == "acme")
    shown = {n.position: n for n, _, _ in walk(roots)}
    assert not shown[1].redacted and not shown[2].redacted
    hidden = shown[3]
    assert hidden.redacted and hidden.stream_id == hidden.event_id == hidden.actor == HIDDEN
    assert hidden.correlation_id is None and hidden.type == "T"


def test_trace_id_comes_from_traceparent() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert trace_id_of({"traceparent": parent}) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id_of({}) is None
    assert trace_id_of({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}) is None
