import asyncio
import subprocess

import tether
from tether import Job, JobRefused


def main() -> int:
    with Job(name="typed") as job:
        p = job.popen(["echo", "hi"], stdout=subprocess.PIPE, text=True)
        out: str = p.communicate()[0]
        b = job.popen(["echo", "hi"], stdout=subprocess.PIPE)
        raw: bytes = b.communicate()[0]
        r = job.run(["true"], capture_output=True, check=True)
        data: bytes = r.stdout
        print(out, raw, data, job.guarantee.kernel_enforced, job.members())
    t = tether.run(["echo", "x"], capture_output=True, text=True, timeout=5)
    s: str = t.stdout
    with tether.Popen(["sleep", "0"]) as q:
        code: int = q.wait()
    print(s, code, q.job.closed)
    try:
        Job(require="kernel")
    except JobRefused as exc:
        print(exc.reason)
    return 0


async def amain() -> bytes | None:
    with Job() as job:
        proc = await job.create_subprocess_shell("echo hi", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        return out


if __name__ == "__main__":
    main()
