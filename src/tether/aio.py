"""asyncio face of a job's process: what ``Job.create_subprocess_exec`` and
``Job.create_subprocess_shell`` return.

asyncio's own subprocess transport expects to ``waitpid`` its child; a
job's process is the keeper's child, so we wrap the job's ``Popen`` instead:
pipes become asyncio streams, and ``wait()`` watches the process's pidfd
from the event loop (or polls where there is no pidfd).
"""

from __future__ import annotations

import asyncio
import subprocess


class Process:
    """Drop-in for ``asyncio.subprocess.Process`` over a job's Popen."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: asyncio.StreamWriter | None,
                 stdout: asyncio.StreamReader | None, stderr: asyncio.StreamReader | None) -> None:
        self._popen = popen
        self.stdin: asyncio.StreamWriter | None = stdin
        self.stdout: asyncio.StreamReader | None = stdout
        self.stderr: asyncio.StreamReader | None = stderr
        self.pid = popen.pid

    def __repr__(self) -> str:
        return f"<tether.aio.Process {self.pid}>"

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        p = self._popen
        if p.poll() is not None:
            return p.returncode
        loop = asyncio.get_running_loop()
        fd = getattr(p, "_pidfd", None)
        if fd is not None:
            fut = loop.create_future()

            def ready() -> None:
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(fd, ready)
            try:
                await fut
            finally:
                loop.remove_reader(fd)
            return p.wait()
        while p.poll() is None:
            await asyncio.sleep(0.01)
        return p.returncode

    def send_signal(self, sig: int) -> None:
        self._popen.send_signal(sig)

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    async def _feed(self, data: bytes | None) -> None:
        if self.stdin is None:
            return
        try:
            if data:
                self.stdin.write(data)
                await self.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self.stdin.close()

    @staticmethod
    async def _read(stream: asyncio.StreamReader | None) -> bytes | None:
        if stream is None:
            return None
        return await stream.read()

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        _, out, err = await asyncio.gather(self._feed(input), self._read(self.stdout),
                                           self._read(self.stderr))
        await self.wait()
        return out, err


async def create(popen: subprocess.Popen[bytes], limit: int) -> Process:
    loop = asyncio.get_running_loop()
    stdin = stdout = stderr = None
    if popen.stdout is not None:
        stdout = asyncio.StreamReader(limit=limit)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), popen.stdout)
    if popen.stderr is not None:
        stderr = asyncio.StreamReader(limit=limit)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr), popen.stderr)
    if popen.stdin is not None:
        from asyncio.streams import FlowControlMixin

        transport, proto = await loop.connect_write_pipe(FlowControlMixin, popen.stdin)
        stdin = asyncio.StreamWriter(transport, proto, None, loop)
    return Process(popen, stdin, stdout, stderr)
