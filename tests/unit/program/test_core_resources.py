"""CPU unit tests of the physical resource layer: page pool, slots, block tables, ledger."""
from __future__ import annotations

import pytest

from ninfer.program.block_table import BlockTable, pages_for
from ninfer.program.ledger import ResourceLedger
from ninfer.program.page_pool import PagePool
from ninfer.program.slot_pool import SlotPool
from ninfer.contract.program import InvariantError, RefusalKind


def _pool_ok(pool: PagePool) -> None:
    pool.check()
    assert pool.num_free + pool.num_owned == pool.total


def test_page_pool_ids_refcounts_and_reservations():
    pool = PagePool(6)
    _pool_ok(pool)
    r1 = pool.reserve(4)
    assert (pool.num_free, pool.num_reserved, pool.num_available) == (6, 4, 2)
    _pool_ok(pool)
    assert r1.take(2) == [0, 1]
    assert [pool.refcount(p) for p in range(6)] == [1, 1, 0, 0, 0, 0]
    assert (pool.num_free, pool.num_reserved, pool.num_available) == (4, 2, 2)
    _pool_ok(pool)
    r2 = pool.reserve(2)
    assert r2.take(1) == [2]
    _pool_ok(pool)
    with pytest.raises(InvariantError):
        pool.reserve(1)                       # 3 free, 3 reserved: nothing available
    pool.share([1])
    assert pool.refcount(1) == 2
    assert pool.unref([0, 1]) == [0]          # page 1 still has an owner
    assert [pool.refcount(p) for p in range(6)] == [0, 1, 1, 0, 0, 0]
    _pool_ok(pool)
    assert r1.take(2) == [0, 3]               # lowest free id first
    _pool_ok(pool)
    with pytest.raises(InvariantError):
        r1.take(1)                            # reservation exhausted
    assert r2.close() == 1
    assert (pool.num_free, pool.num_reserved) == (2, 0)
    _pool_ok(pool)
    assert sorted(pool.unref([1, 2, 0, 3])) == [0, 1, 2, 3]
    _pool_ok(pool)
    assert pool.num_free == 6
    with pytest.raises(InvariantError):
        pool.unref([0])                       # already free
    with pytest.raises(InvariantError):
        pool.share([5])                       # free page


def test_page_pool_check_detects_corruption():
    pool = PagePool(3)
    pool.reserve(1).take(1)
    pool._refcount[0] = 0                     # an owned page lost its owner without returning to the free list
    with pytest.raises(InvariantError, match="free 2 \\+ owned 0 != total 3"):
        pool.check()


def test_slot_pool():
    slots = SlotPool(3)
    a, b = object(), object()
    assert slots.alloc(a) == 0 and slots.alloc(b) == 1
    slots.check()
    assert (slots.num_free, slots.num_owned) == (1, 2)
    with pytest.raises(InvariantError):
        slots.free(0, b)
    slots.free(0, a)
    assert slots.alloc(b) == 0
    slots.check()
    assert slots.alloc(a) == 2
    with pytest.raises(InvariantError):
        slots.alloc(a)
    assert slots.num_free + slots.num_owned == slots.total


def test_block_table_grows_from_its_reservation():
    pool = PagePool(8)
    t = BlockTable(4, pool.reserve(pages_for(10, 4)))
    assert t.ensure(1) == [0] and t.capacity == 4
    assert t.ensure(4) == []
    assert t.ensure(9) == [1, 2]
    assert t.as_tensor(5).tolist() == [0, 1, 2, 0, 0]
    with pytest.raises(InvariantError):
        t.ensure(13)                          # beyond the 3-page reservation
    _pool_ok(pool)
    assert t.release(pool) == [0, 1, 2]
    assert pool.num_free == 8 and pool.num_reserved == 0
    _pool_ok(pool)


def _ledger_ok(led: ResourceLedger) -> None:
    led.check()
    assert led.pages.num_free + led.pages.num_owned == led.pages.total
    assert led.slots.num_free + led.slots.num_owned == led.slots.total


def test_ledger_refuses_exactly_when_short():
    led = ResourceLedger(num_pages=10, page_size=4, num_slots=2, max_model_len=64)
    assert led.refusal(40) is None                     # 10 pages: fits exactly
    r = led.refusal(41)
    assert r.kind is RefusalKind.INFEASIBLE and "needs 11 pages" in r.reason and "10 in total" in r.reason
    r = led.refusal(65)
    assert r.kind is RefusalKind.INFEASIBLE and "max_model_len 64" in r.reason
    rev = led.revision
    a = led.acquire(1, 24)                             # 6 pages reserved
    assert led.revision == rev + 1
    _ledger_ok(led)
    assert led.refusal(16) is None                     # 4 pages: exactly the rest
    r = led.refusal(17)
    assert r.kind is RefusalKind.SHORT_NOW and "needs 5 pages, 4 available" in r.reason
    assert a.table.ensure(9) == [0, 1, 2]
    assert (led.pages.num_free, led.pages.num_reserved) == (7, 3)
    _ledger_ok(led)
    b = led.acquire(2, 16)
    assert b.slot == 1 and b.table.ensure(16) == [3, 4, 5, 6]
    _ledger_ok(led)
    r = led.refusal(1)
    assert r.kind is RefusalKind.SHORT_NOW and "0 available" in r.reason and "0 free" in r.reason
    with pytest.raises(InvariantError):
        led.acquire(3, 1)
    freed, slot = led.release(1)
    assert freed == [0, 1, 2] and slot == 0
    _ledger_ok(led)
    assert led.refusal(24) is None
    assert led.refusal(25).kind is RefusalKind.SHORT_NOW
    led.release(2)
    _ledger_ok(led)
    assert led.pages.num_free == 10 and led.slots.num_free == 2 and led.pages.num_reserved == 0
    with pytest.raises(InvariantError):
        led.release(2)


def test_ledger_slot_shortage():
    led = ResourceLedger(num_pages=10, page_size=4, num_slots=1, max_model_len=64)
    led.acquire(1, 4)
    r = led.refusal(4)
    assert r.kind is RefusalKind.SHORT_NOW and "needs 1 slot, 0 free" in r.reason
    _ledger_ok(led)


def test_prove_backfill():
    led = ResourceLedger(num_pages=10, page_size=4, num_slots=3, max_model_len=64)
    d1 = led.acquire(1, 16)                 # 4 pages
    d1.table.ensure(8)                      # 2 mapped, 2 still reserved
    led.acquire(2, 16)                      # 4 pages; 2 available now
    _ledger_ok(led)
    # head needs 6 pages: donors {1} free 4 -> 2 + 4 = 6 without a borrower
    assert led.prove_backfill(24, [1], 0) is True
    # a borrower of 1 page holds it until it ends: 2 - 1 + 4 = 5 < 6
    assert led.prove_backfill(24, [1], 4) is False
    # head of 5 pages: 5 <= 5
    assert led.prove_backfill(20, [1], 4) is True
    # donors {1, 2}: 2 - 2 + 8 = 8 pages
    assert led.prove_backfill(32, [1, 2], 8) is True
    assert led.prove_backfill(36, [1, 2], 8) is False
    # the borrower must fit now
    assert led.prove_backfill(4, [1, 2], 12) is False
    # a head infeasible from root never gets a proof
    assert led.prove_backfill(44, [1, 2], 0) is False
    # slots: 1 free; borrower takes it, head needs a donor's slot
    assert led.prove_backfill(4, [], 4) is False
    assert led.prove_backfill(4, [2], 4) is True
    # a page shared with another owner is not freed by the donor finishing
    led.pages.share([d1.table.pages[0]])
    assert led.prove_backfill(20, [1], 4) is False
    led.pages.unref([d1.table.pages[0]])
    with pytest.raises(InvariantError):
        led.prove_backfill(4, [99], 0)
    _ledger_ok(led)


def test_ledger_check_detects_leak():
    led = ResourceLedger(num_pages=4, page_size=4, num_slots=2, max_model_len=64)
    h = led.acquire(1, 8)
    h.table.ensure(8)
    led.pages.share([h.table.pages[0]])     # a reference nobody explains
    with pytest.raises(InvariantError, match="refcount 2, mapped 1"):
        led.check()


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["acquire", "grow", "release", "share"]),
                          st.integers(0, 5), st.integers(1, 40)), max_size=40))
def test_ledger_invariants_under_random_operations(ops):
    led = ResourceLedger(num_pages=16, page_size=4, num_slots=4, max_model_len=64)
    shared: list[int] = []                                   # extra references held by the test
    for op, who, n in ops:
        held = who in led._holdings
        if op == "acquire" and not held:
            why = led.refusal(n)
            if why is None:
                before = led.pages.num_available
                h = led.acquire(who, n)
                assert led.pages.num_available == before - pages_for(n, 4)
                assert h.pages_held == pages_for(n, 4)
            else:
                with pytest.raises(InvariantError):
                    led.acquire(who, n)
        elif op == "grow" and held:
            h = led.holding(who)
            h.table.ensure(min(n, h.reserved_tokens))
        elif op == "share" and held and led.holding(who).table.pages:
            p = led.holding(who).table.pages[0]
            led.pages.share([p])
            shared.append(p)
        elif op == "release" and held:
            mine = set(led.holding(who).table.pages)
            led.pages.unref([p for p in shared if p in mine])   # a checkpoint drops its references first
            shared = [p for p in shared if p not in mine]
            freed, _ = led.release(who)
            assert sorted(freed) == sorted(mine)
        # the ledger's own check counts holdings' mappings; the test's extra references on top
        led.pages.unref(shared)
        led.check()
        led.pages.share(shared)
        assert led.pages.num_free + led.pages.num_owned == led.pages.total
        assert led.slots.num_free + led.slots.num_owned == led.slots.total
    led.pages.unref(shared)
    for who in list(led._holdings):
        led.release(who)
    led.check()
    assert led.pages.num_free == 16 and led.pages.num_reserved == 0 and led.slots.num_free == 4
