"""The sandbox benchmark's simulated models for `amapreduce eval run --benchmark sandbox`.

Offline and keyless: trial k of every instance gets a fresh `SimulatedAtlasModel(sample=k-1)`
(the manager and the sub-agents: deterministic code, not an LLM; `sample` stands for another
sample of an LLM at temperature > 0) and the memory's projection and distillation are answered
by `SimulatedMemoryModel`. The evaluation runner (`amapreduce.bench.evaluate`) never imports
simulated models itself; the command line brings them from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amapreduce.bench.trial import SimulatedModels
    from amapreduce.session.parts import InnerFactory

__all__ = ["sandbox_models"]


def sandbox_models() -> SimulatedModels:
    """The simulated models of one sandbox evaluation."""
    from amapreduce.bench.trial import SimulatedModels
    from amapreduce.demo.memory_model import SimulatedMemoryModel
    from amapreduce.demo.model import SimulatedAtlasModel
    from amapreduce.testing.scripted import SIMULATED_PRICES

    def inner_for(instance_id: str, trial: int) -> InnerFactory:
        model = SimulatedAtlasModel(sample=trial - 1)
        return lambda role: model

    return SimulatedModels(inner_for=inner_for, memory_model=SimulatedMemoryModel(),
                           prices_by_prefix=SIMULATED_PRICES)
