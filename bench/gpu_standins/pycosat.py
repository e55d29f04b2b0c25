"""Import-time stand-in for ``pycosat`` on the GPU machine, used only where no real one exists.

``reasoning_gym`` imports pycosat when it is imported (for its logic-puzzle generators, which
no journey uses), and pycosat is a C extension published only as an sdist, so no wheel can be
carried. ``bench/gpu_check.sh`` puts this directory on ``PYTHONPATH`` only when
``import pycosat`` fails; anything that really calls it gets an error saying so.
"""


def _unavailable(*args, **kwargs):
    raise RuntimeError(
        "pycosat is a stand-in on this machine (bench/gpu_standins): reasoning_gym's "
        "logic-puzzle datasets need the real package"
    )


solve = itersolve = _unavailable
