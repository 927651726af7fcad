"""Distillation F_ψ: FINCH clusters, contrastive refinement inside clusters, merge keeping scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_memory_fixtures import FAIL, PASS

from amapreduce.errors import ConfigError
from amapreduce.llm.embed import register_encoder
from amapreduce.llm.messages import message_text
from amapreduce.memory import ExperientialMemory, MemoryConfig
from amapreduce.memory.distill import cluster_records
from amapreduce.memory.records import Record
from amapreduce.memory.store import get_hint, hint_provenance, insert_hint, insert_record
from amapreduce.testing.scripted import FunctionModel


class ChainEncoder:
    """Groups of vectors on separate planes; inside a group each point's nearest neighbour is the
    previous one, so FINCH's first partition is exactly the groups."""

    spec = "test:chains"

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return 8

    def add_group(self, name: str, plane: tuple[int, int], n: int) -> list[str]:
        texts, theta = [], 0.0
        for i in range(n):
            v = np.zeros(8, dtype=np.float32)
            v[plane[0]], v[plane[1]] = np.cos(theta), np.sin(theta)
            text = f"{name}{i}"
            self.vectors[text] = v
            texts.append(text)
            theta += 0.01 * (i + 1)
        return texts

    def encode(self, texts):  # type: ignore[no-untyped-def]
        return np.stack([self.vectors[t] for t in texts])


def _store(tmp_path: Path, config: MemoryConfig, model=None):  # type: ignore[no-untyped-def]
    """Group A: a0-a2 positive, a3-a4 negative. Group B: b0-b3 positive. Group C: c0-c2 negative."""
    enc = ChainEncoder()
    register_encoder(enc)
    groups = {"a": enc.add_group("a", (0, 1), 5), "b": enc.add_group("b", (2, 3), 4), "c": enc.add_group("c", (4, 5), 3)}
    mem = ExperientialMemory(tmp_path, encoder=enc, config=config, model=model)
    positive = {"a0", "a1", "a2", "b0", "b1", "b2", "b3"}
    with mem.store.write() as conn:
        for texts in groups.values():
            for t in texts:
                insert_record(conn, Record(id=t, query=f"question {t}", label=t in positive,
                                           metrics=PASS if t in positive else FAIL), enc.vectors[t])
    return mem


def test_finch_level_zero_recovers_the_groups_and_is_deterministic() -> None:
    enc = ChainEncoder()
    for name, plane, n in [("a", (0, 1), 5), ("b", (2, 3), 4), ("c", (4, 5), 3)]:
        enc.add_group(name, plane, n)
    x = np.stack(list(enc.vectors.values()))
    labels = cluster_records(x, MemoryConfig(finch_level=0))
    assert labels.tolist() == [0] * 5 + [1] * 4 + [2] * 3
    assert cluster_records(x, MemoryConfig(finch_level=5)).tolist() == labels.tolist()  # clamped
    assert cluster_records(x[:2], MemoryConfig()).tolist() == [0, 0]  # too few points to cluster


def test_refinement_is_contrastive_inside_each_cluster(tmp_path: Path) -> None:
    prompts: list[str] = []

    def reply(messages, info):  # type: ignore[no-untyped-def]
        text = message_text(messages[1])
        prompts.append(text)
        if "WEAKER decision" in text:
            return "AGREE 1: Fetch each entity separately.\nREMOVE 2: Batch everything together.\nADD: Compare totals."
        return "EDIT 1: Group rows by the page that lists them."

    config = MemoryConfig(finch_level=0, pairs_per_cluster=1)
    mem = _store(tmp_path, config, FunctionModel(reply))
    with mem.store.write() as conn:
        insert_hint(conn, "Fetch each entity separately.", 3, origin="t", provenance=["a0"], hint_id="hX")
        insert_hint(conn, "Batch everything together.", 1, origin="t", provenance=["a4"], hint_id="hY")
        insert_hint(conn, "Group rows by page.", 2, origin="t", provenance=["b1"], hint_id="hZ")
    report = mem.distill(merge=False)
    assert report.clusters == {0: 5, 1: 4, 2: 3}
    # Cluster 0: one (positive, negative) pair, the positive being the negative's nearest positive.
    compare, success = report.calls
    assert compare["step"] == "compare" and compare["cluster"] == 0 and compare["hints"] == ["hX", "hY"]
    assert compare["records"] in (["a2", "a3"], ["a2", "a4"])
    # Cluster 1 has no negative: the success-only prompt with all four positives. Cluster 2: nothing.
    assert success == {"step": "success", "cluster": 1, "records": ["b0", "b1", "b2", "b3"], "hints": ["hZ"]}
    assert len(prompts) == 2 and "question a2" in prompts[0] and "1. Fetch each entity separately." in prompts[0]
    with mem.store.read() as conn:
        hx, hz = get_hint(conn, "hX"), get_hint(conn, "hZ")
        assert hx is not None and hx["w"] == 4
        assert set(hint_provenance(conn, "hX")) == {"a0", *compare["records"]}
        assert get_hint(conn, "hY") is None  # 1 - 1 = 0: pruned
        assert hz is not None and (hz["text"], hz["w"]) == ("Group rows by the page that lists them.", 3)
        assert set(hint_provenance(conn, "hZ")) == {"b0", "b1", "b2", "b3"}
        added = conn.execute("SELECT id, w FROM hints WHERE origin = 'distill'").fetchall()
        assert [(r[1]) for r in added] == [2]
        # A new hint is the cluster's anchor: it inherits every record of cluster 0 (S(h) = I_k).
        assert set(hint_provenance(conn, added[0][0])) == {"a0", "a1", "a2", "a3", "a4"}
        kinds = [r[0] for r in conn.execute("SELECT kind FROM events ORDER BY seq")]
    for kind in ("clustered", "hint_agreed", "hint_downvoted", "hint_pruned", "hint_edited", "hint_added", "distilled"):
        assert kind in kinds
    assert [r["op"] for r in report.applied] == ["REMOVE", "AGREE", "ADD", "EDIT"]


def test_merge_keeps_scores_and_support_and_merges_each_hint_once(tmp_path: Path) -> None:
    asked: list[str] = []

    def reply(messages, info):  # type: ignore[no-untyped-def]
        asked.append(message_text(messages[1]))
        return "1. Fetch entities one per batch and verify totals."

    mem = _store(tmp_path, MemoryConfig(finch_level=0), FunctionModel(reply))
    with mem.store.write() as conn:
        insert_hint(conn, "Fetch entities one per batch.", 5, origin="t", provenance=["a0"], hint_id="m1")
        insert_hint(conn, "Verify totals.", 2, origin="t", provenance=["a1", "b0"], hint_id="m2")
        insert_hint(conn, "One entity per batch.", 4, origin="t", provenance=["a2", "a3", "b1"], hint_id="m3")
        insert_hint(conn, "Lonely hint of cluster B.", 3, origin="t", provenance=["b2", "b3"], hint_id="solo")
    report = mem.distill(refine=False)
    assert len(asked) == 1 and "no more than 1 refined hints" in asked[0]
    assert [(m["cluster"], sorted(m["from"]), m["w"]) for m in report.merged] == [(0, ["m1", "m2", "m3"], 5)]
    with mem.store.read() as conn:
        rows = conn.execute("SELECT id, text, w FROM hints ORDER BY seq").fetchall()
        assert [(r[1], r[2]) for r in rows] == [("Lonely hint of cluster B.", 3),
                                                ("Fetch entities one per batch and verify totals.", 5)]
        # The cluster's records, then every record that supported a merged hint (b0, b1 of cluster B).
        assert hint_provenance(conn, rows[1][0]) == ["a0", "a1", "a2", "a3", "a4", "b0", "b1"]
        merged_events = conn.execute("SELECT count(*) FROM events WHERE kind = 'hint_merged'").fetchone()[0]
    assert merged_events == 3


def test_dry_run_changes_nothing_and_needs_no_model(tmp_path: Path) -> None:
    mem = _store(tmp_path, MemoryConfig(finch_level=0))
    with mem.store.write() as conn:
        insert_hint(conn, "h one.", 2, origin="t", provenance=["a0"])
        insert_hint(conn, "h two.", 2, origin="t", provenance=["a1"])
    with mem.store.read() as conn:
        before = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    report = mem.distill(dry_run=True)
    assert [c["step"] for c in report.calls] == ["compare", "compare", "success", "merge"]
    with mem.store.read() as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == before
        assert conn.execute("SELECT count(*) FROM records WHERE cluster IS NOT NULL").fetchone()[0] == 0
    with pytest.raises(ConfigError, match="memory model"):
        mem.distill()


def test_unparseable_replies_change_nothing_and_are_reported(tmp_path: Path) -> None:
    mem = _store(tmp_path, MemoryConfig(finch_level=0), FunctionModel(lambda m, i: "I think it is fine."))
    with mem.store.write() as conn:
        insert_hint(conn, "h one.", 2, origin="t", provenance=["a0"], hint_id="k1")
        insert_hint(conn, "h two.", 2, origin="t", provenance=["a1"], hint_id="k2")
    report = mem.distill()
    assert report.applied == [] and report.merged == []
    assert report.rejected == [{"line": "merge of cluster 0", "reason": "reply had no numbered list"}]
    with mem.store.read() as conn:
        assert [(r[0], r[1]) for r in conn.execute("SELECT id, w FROM hints ORDER BY seq")] == [("k1", 2), ("k2", 2)]


def test_two_distillations_never_run_at_once(tmp_path: Path) -> None:
    import time

    from amapreduce.errors import RunError
    from amapreduce.memory.store import set_meta

    mem = _store(tmp_path, MemoryConfig(finch_level=0), FunctionModel(lambda m, i: "ADD: Keep rows atomic."))
    with mem.store.write() as conn:
        set_meta(conn, "distilling_since", str(time.time()))
    with pytest.raises(RunError, match="another distillation"):
        mem.distill()
    with mem.store.write() as conn:
        set_meta(conn, "distilling_since", str(time.time() - 7200))  # left behind by a crash
    mem.distill()
    with mem.store.read() as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'distilling_since'").fetchone() is None


def test_refinement_survives_a_hint_removed_while_the_model_answers(tmp_path: Path) -> None:
    """Another writer removes (and edits) listed hints during the model call: those operations are
    rejected one by one, and the rest of the reply still applies (nothing raises, no ADD is lost)."""
    from amapreduce.memory.store import delete_hint, update_hint

    mem: ExperientialMemory

    def reply(messages, info):  # type: ignore[no-untyped-def]
        with mem.store.write() as conn:  # the concurrent writer, between listing and applying
            delete_hint(conn, "hX", kind="removed_by_hand")
            update_hint(conn, "hY", kind="edited_by_hand", text="Batch by source page.")
        return "AGREE 1: Fetch each entity separately.\nEDIT 2: Batch by region.\nADD: Compare totals across sources."

    config = MemoryConfig(finch_level=0, pairs_per_cluster=1)
    mem = _store(tmp_path, config, FunctionModel(reply))
    with mem.store.write() as conn:
        conn.execute("DELETE FROM records WHERE id LIKE 'b%' OR id LIKE 'c%'")  # one cluster, one call
        insert_hint(conn, "Fetch each entity separately.", 3, origin="t", provenance=["a0"], hint_id="hX")
        insert_hint(conn, "Batch everything together.", 2, origin="t", provenance=["a4"], hint_id="hY")
    report = mem.distill(merge=False)
    assert len(report.calls) == 1
    assert report.rejected == [
        {"line": "AGREE 1: Fetch each entity separately.", "reason": "hint no longer exists"},
        {"line": "EDIT 2: Batch by region.",
         "reason": "hint was changed by another writer after it was shown to the model"}]
    assert [(a["op"], a["text"]) for a in report.applied] == [("ADD", "Compare totals across sources.")]
    with mem.store.read() as conn:
        hy = get_hint(conn, "hY")
        assert hy is not None and (hy["text"], hy["w"]) == ("Batch by source page.", 2)  # the human edit stands
        texts = [r[0] for r in conn.execute("SELECT text FROM hints ORDER BY seq")]
    assert texts == ["Batch by source page.", "Compare totals across sources."]


def test_merge_uses_current_scores_and_skips_a_batch_changed_meanwhile(tmp_path: Path) -> None:
    """Credit given while the model merges is kept (w is re-read); a batch one of whose hints was
    removed meanwhile is left unmerged rather than failing or bringing the removed text back."""
    from amapreduce.memory.store import delete_hint, update_hint

    mem: ExperientialMemory
    calls: list[int] = []

    def reply(messages, info):  # type: ignore[no-untyped-def]
        calls.append(info.call_index)
        with mem.store.write() as conn:
            if info.call_index == 0:  # cluster A: m1 is credited from 5 to 9 by a concurrent update
                update_hint(conn, "m1", kind="credited", delta=4)
            else:  # cluster B: n2 is removed by hand
                delete_hint(conn, "n2", kind="removed_by_hand")
        return "1. Merged rule."

    mem = _store(tmp_path, MemoryConfig(finch_level=0), FunctionModel(reply))
    with mem.store.write() as conn:
        insert_hint(conn, "Fetch entities one per batch.", 5, origin="t", provenance=["a0"], hint_id="m1")
        insert_hint(conn, "Verify totals.", 2, origin="t", provenance=["a1"], hint_id="m2")
        insert_hint(conn, "B rule one.", 3, origin="t", provenance=["b0"], hint_id="n1")
        insert_hint(conn, "B rule two.", 3, origin="t", provenance=["b1"], hint_id="n2")
    report = mem.distill(refine=False)
    assert calls == [0, 1]
    assert [(m["cluster"], sorted(m["from"]), m["w"]) for m in report.merged] == [(0, ["m1", "m2"], 9)]
    assert report.rejected == [{"line": "merge of cluster 1", "reason": "hints n2 were removed or changed by "
                                "another writer during the merge; batch left unmerged"}]
    with mem.store.read() as conn:
        rows = [(r[0], r[1], r[2]) for r in conn.execute("SELECT id, text, w FROM hints ORDER BY seq")]
    assert [(i, t, w) for i, t, w in rows if i == "n1"] == [("n1", "B rule one.", 3)]
    assert [(t, w) for i, t, w in rows if i != "n1"] == [("Merged rule.", 9)]


def test_an_add_that_restates_a_hint_of_another_cluster_supports_it(tmp_path: Path) -> None:
    def reply(messages, info):  # type: ignore[no-untyped-def]
        return "ADD: Keep one row per batch."

    mem = _store(tmp_path, MemoryConfig(finch_level=0, pairs_per_cluster=1), FunctionModel(reply))
    with mem.store.write() as conn:
        insert_hint(conn, "Keep one row per batch.", 3, origin="t", provenance=["c0"], hint_id="hC")
    report = mem.distill(merge=False)
    ops = {(a["op"], a["cluster"]) for a in report.applied}
    assert ("SUPPORT", 1) in ops  # cluster 1 (b*) was not shown hC, restated it, and now supports it
    with mem.store.read() as conn:
        assert {"b0", "b1", "b2", "b3"} <= set(hint_provenance(conn, "hC"))
        assert conn.execute("SELECT count(*) FROM hints").fetchone()[0] == 1  # no duplicate was added
        assert get_hint(conn, "hC")["w"] == 3  # support, not credit
