"""Names the files a server's processes leave behind after its own prefix, so the launcher can remove them.

Python's multiprocessing names its semaphores `/dev/shm/sem.mp-<random>` (vLLM creates them in spawn context,
where they live until the object is freed or, if the process is killed, until its resource tracker cleans up;
a server killed as a whole, e.g. after Triton's exit timeout, leaves them). With TRITON_VLLM_SEM_PREFIX set
(the launcher sets it per server), every process of the server names them `sem.<prefix>-<random>` instead.
Run in the core's stub before vLLM starts and, as a vLLM general plugin, in every process vLLM starts.
"""

from __future__ import annotations

import multiprocessing
import os

SEM_PREFIX_ENV = "TRITON_VLLM_SEM_PREFIX"


def install() -> bool:
    """Apply TRITON_VLLM_SEM_PREFIX to this process's new semaphores; False when unset or not possible."""
    prefix = os.environ.get(SEM_PREFIX_ENV)
    # multiprocessing.synchronize names a semaphore "<semprefix>-<random>"; semprefix ("/mp") lives in the
    # process's private _config, the only place to change it (unchanged since Python 3.4).
    config = getattr(multiprocessing.current_process(), "_config", None)
    if not prefix or not isinstance(config, dict) or "semprefix" not in config:
        return False
    config["semprefix"] = "/" + prefix
    return True
