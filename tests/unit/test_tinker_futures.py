"""lean_rl/tinker/futures.py: long-poll, deadline, failure shapes, dedupe, unknown ids."""

import asyncio

from lean_rl.tinker.futures import Done, Failed, FutureTable, Pending, UserError


def run(coro):
    return asyncio.run(coro)


def test_a_poll_waits_for_the_result_and_a_slow_one_is_pending():
    async def main():
        table = FutureTable(deadline_s=10)
        gate = asyncio.Event()

        async def work():
            await gate.wait()
            return {"ok": 1}
        rid = table.submit(work())
        assert isinstance(await table.retrieve(rid, wait_s=0.05), Pending)
        asyncio.get_running_loop().call_later(0.05, gate.set)
        assert await table.retrieve(rid, wait_s=5) == Done({"ok": 1})
        assert await table.retrieve(rid, wait_s=0) == Done({"ok": 1})  # a repeated poll gets it again
    run(main())


def test_work_past_its_deadline_fails_instead_of_hanging():
    async def main():
        table = FutureTable(deadline_s=0.1)
        rid = table.submit(asyncio.sleep(60))
        outcome = await table.retrieve(rid, wait_s=30)
        assert isinstance(outcome, Failed) and outcome.category == "server" and "deadline of 0.1 s" in outcome.message
    run(main())


def test_errors_have_the_client_shape_and_category():
    async def main():
        table = FutureTable(deadline_s=10)

        async def refused():
            raise UserError("loss_fn 'dro' is not supported")

        async def broken():
            raise RuntimeError("rank 0 died")
        user = await table.retrieve(table.submit(refused()), 1)
        server = await table.retrieve(table.submit(broken()), 1)
        assert user.body() == {"error": "loss_fn 'dro' is not supported", "category": "user"}
        assert server.body() == {"error": "RuntimeError: rank 0 died", "category": "server"}
        unknown = await table.retrieve("req-404", 1)
        assert isinstance(unknown, Failed) and "unknown request id 'req-404'" in unknown.message
    run(main())


def test_a_retried_post_gets_the_first_future_and_no_second_run():
    async def main():
        table = FutureTable(deadline_s=10)
        runs = []

        async def work(n):
            runs.append(n)
            return n
        first = table.submit(work(1), ("m", 5))
        assert table.existing(("m", 5)) == first and table.existing(("m", 6)) is None
        assert table.submit(work(2), ("m", 5)) == first
        assert await table.retrieve(first, 1) == Done(1)
        assert runs == [1]
    run(main())
