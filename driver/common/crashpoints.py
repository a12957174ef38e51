"""Named points where a test can kill or pause the plugin process mid-operation.

Crash-safety is a claim about what happens when the process dies between two
steps; the only honest test is to die there for real. A test sets
``GPU_DRA_CRASHPOINT=<name>`` in the plugin's environment and the process
SIGKILLs itself (no cleanup, no flush) when it reaches that point.

``GPU_DRA_PAUSEPOINT=<name>`` stops the process there instead (SIGSTOP: every thread,
holding what it holds, its locks too), until the test sends SIGCONT: how a test puts a
second plugin instance beside a call that is half done, as in a surge upgrade.
"""

import os
import signal

ENV_VAR = "GPU_DRA_CRASHPOINT"
PAUSE_ENV_VAR = "GPU_DRA_PAUSEPOINT"
# Read once: the environment of a running process does not change, and this runs on
# every step of every prepare.
_ARMED = os.environ.get(ENV_VAR)
_PAUSED = os.environ.get(PAUSE_ENV_VAR)


def crashpoint(name: str) -> None:
    if name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
    if name == _PAUSED:
        os.kill(os.getpid(), signal.SIGSTOP)
