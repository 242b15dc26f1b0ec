# Each line below marked "error" must be reported by mypy --strict (tests/test_typing.py).
import subprocess

import tether
from tether import Job

job = Job()
p = job.popen(["x"], stdout=subprocess.PIPE, text=True)
n: bytes = p.communicate()[0]  # error: a text=True Popen reads str
job.popen(["x"], stdot=subprocess.PIPE)  # error: a misspelt keyword
job.run(["x"], timeout="5")  # error: timeout is a number
r: subprocess.CompletedProcess[str] = tether.run(["x"])  # error: bytes without text=True
tether.Popen(["x"], mechanism=3)  # error: a mechanism is named
