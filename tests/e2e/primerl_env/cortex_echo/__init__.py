"""An offline single-turn taskset for the real prime-rl e2e (verifiers a60a606 v1 API).

Loaded by prime-rl's env-server as taskset id ``cortex-echo`` (this folder goes on its
PYTHONPATH); it runs only inside the prime-rl environment, never in this project's own.
Tasks are procedural (no dataset download): echo a number; reward 1 when the reply has it,
else a small reward for the reply's length (see ``echoed``).
"""

import verifiers.v1 as vf

SYSTEM = "Repeat the number you are given, and nothing else."


class EchoData(vf.TaskData):
    answer: str


class EchoTask(vf.Task[EchoData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def echoed(self, trace: vf.Trace) -> float:
        # 1 for the echo; otherwise a small length-shaped reward, so that a random-init model's
        # samples in one group still differ and the advantages (and gradients) are not zero.
        reply = trace.last_reply or ""
        return 1.0 if self.data.answer in reply else 0.1 * min(len(reply), 40) / 40


class EchoConfig(vf.TasksetConfig):
    size: int = 16


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self) -> list[EchoTask]:
        return [
            EchoTask(
                EchoData(idx=i, prompt=str(7 * i + 3), system_prompt=SYSTEM, answer=str(7 * i + 3)),
                self.config.task,
            )
            for i in range(self.config.size)
        ]


__all__ = ["EchoTaskset"]
