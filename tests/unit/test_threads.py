import asyncio
import subprocess
import sys
import textwrap
import time

import pytest

from lean_rl.utils.threads import run_in_daemon_thread


def test_result_and_error_come_back():
    async def main():
        assert await run_in_daemon_thread(lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(ValueError, match="bad"):
            await run_in_daemon_thread(lambda: (_ for _ in ()).throw(ValueError("bad")))
    asyncio.run(main())


def test_a_hung_call_given_up_on_does_not_block_the_exit():
    code = textwrap.dedent("""
        import asyncio, time
        from lean_rl.utils.threads import run_in_daemon_thread
        async def main():
            try:
                await asyncio.wait_for(run_in_daemon_thread(time.sleep, 3600), 0.5)
            except asyncio.TimeoutError:
                print("gave up", flush=True)
        asyncio.run(main())
    """)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "gave up" in out.stdout, out.stderr
    assert time.monotonic() - started < 30  # asyncio.to_thread would wait the hour out at exit
